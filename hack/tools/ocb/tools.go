//go:build tools

// Package tools pins the OpenTelemetry Collector Builder (ocb), which generates the sources of
// the minimal collector distribution described in hack/tools/otelcol/manifest.yaml.
package tools

import _ "go.opentelemetry.io/collector/cmd/builder"
