//go:build tools

// Package tools pins every tool hack/install-tools builds on the Kubernetes 1.36 libraries: the
// control plane and the node (k8s.io/kubernetes), etcd, kwok, helm, opm and OLM,
// kube-state-metrics, metrics-server, CoreDNS (./coredns), containerd and cosign.
//
// One module, so that Go selects one version of every shared dependency and the build cache
// compiles each package once for all of them. k8s.io/kubernetes requires its staging modules at
// v0.0.0 with local replaces, so go.mod replaces every staging module with its published v0.36.x
// twin (k8s.io/sample-controller excepted: the module proxy does not serve v0.36.5, and only
// kube-state-metrics' tests use it). After changing a version here or in go.mod, run
// `hack/install-tools --tidy kubernetes` and commit the refreshed go.mod/go.sum.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
	_ "github.com/operator-framework/operator-lifecycle-manager/cmd/catalog"
	_ "github.com/operator-framework/operator-lifecycle-manager/cmd/olm"
	_ "github.com/operator-framework/operator-registry/cmd/opm"
	_ "github.com/sigstore/cosign/v2/cmd/cosign"
	_ "go.etcd.io/etcd/server/v3"
	_ "helm.sh/helm/v3/cmd/helm"
	_ "k8s.io/kube-state-metrics/v2"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "sigs.k8s.io/kwok/cmd/kwok"
	_ "sigs.k8s.io/metrics-server/cmd/metrics-server"
)
