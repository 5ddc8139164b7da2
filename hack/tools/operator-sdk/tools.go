//go:build tools

// Package tools pins operator-sdk (bundle validate) and the scorecard-test binary, which is the
// code the scorecard's built-in test image runs; we run it directly because scorecard pods need
// a real kubelet.
package tools

import (
	_ "github.com/operator-framework/operator-sdk/cmd/operator-sdk"
	_ "github.com/operator-framework/operator-sdk/images/scorecard-test"
)
