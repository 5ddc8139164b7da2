//go:build tools

// Package tools pins kube-router, whose network policy controller the node tier runs on its real
// node to enforce the chart's NetworkPolicies in a test.
package tools

import _ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
