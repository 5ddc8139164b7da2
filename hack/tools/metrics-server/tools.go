//go:build tools

// Package tools pins metrics-server, which the real-node tier runs behind the APIService
// v1beta1.metrics.k8s.io to prove the watchdog's resource-usage gauges (issue 29):
// hack/install-tools builds its cmd/metrics-server.
package tools

import (
	_ "sigs.k8s.io/metrics-server/cmd/metrics-server"
)
