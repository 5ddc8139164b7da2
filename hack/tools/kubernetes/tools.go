//go:build tools

// Package tools pins the Kubernetes control-plane binaries built by hack/install-tools.
// k8s.io/kubernetes requires its staging modules at v0.0.0 with local replaces, so this wrapper
// replaces every staging module with its published v0.36.x twin.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
