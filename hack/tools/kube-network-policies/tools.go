//go:build tools

// Package tools pins SIG Network's kube-network-policies, the NetworkPolicy enforcer (nftables
// and an nfqueue) the node tier runs on its real node to test the chart's NetworkPolicies.
package tools

import _ "sigs.k8s.io/kube-network-policies/cmd"
