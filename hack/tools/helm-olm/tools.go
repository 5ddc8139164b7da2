//go:build tools

// Package tools pins the packaging tools that share Kubernetes 1.36 client libraries: Helm 3,
// opm (operator-registry) and OLM v0's olm and catalog operators (run as local processes for the
// Subscription test). One module means one dependency graph, so the shared packages (client-go,
// apimachinery, ...) are compiled once for all four binaries.
package tools

import (
	_ "github.com/operator-framework/operator-lifecycle-manager/cmd/catalog"
	_ "github.com/operator-framework/operator-lifecycle-manager/cmd/olm"
	_ "github.com/operator-framework/operator-registry/cmd/opm"
	_ "helm.sh/helm/v3/cmd/helm"
)
