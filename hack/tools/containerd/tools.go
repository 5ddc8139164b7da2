//go:build tools

// Package tools pins the node's container runtime built by hack/install-tools: containerd 2
// (image volumes, KEP-4639, with subPath mounts since 2.2), its runc shim and ctr. Debian's
// containerd 1.6 cannot mount an image as a volume.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
