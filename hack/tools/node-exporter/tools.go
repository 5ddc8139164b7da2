//go:build tools

// Package tools pins node-exporter, which runs in the cluster agent's pod when cluster metrics
// are on (issue 29): hack/install-tools builds its main package, the module root, and
// hack/build-images puts the binary into the node-exporter image.
package tools

import (
	_ "github.com/prometheus/node_exporter"
)
