//go:build tools

// Package tools pins the Kubernetes node binaries built by hack/install-tools: kubelet and
// kube-proxy from the same k8s.io/kubernetes version as hack/tools/kubernetes (the control
// plane), in a module of their own so that adding them does not change the control plane's
// go.mod and invalidate its cached build. Like that module, it replaces every staging module
// with its published v0.36.x twin.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
