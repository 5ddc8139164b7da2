//go:build tools

// Package tools pins cosign, which signs the release images and attaches their SBOMs
// (hack/release); only the release path builds it.
package tools

import _ "github.com/sigstore/cosign/v2/cmd/cosign"
