//go:build tools

// Package tools pins kube-state-metrics, which the Helm chart deploys when
// `kubeStateMetrics.install` is on (issue 17): hack/install-tools builds its main package, the
// module root, and hack/build-images puts the binary into the kube-state-metrics image.
package tools

import (
	_ "k8s.io/kube-state-metrics/v2"
)
