// Command coredns is CoreDNS v1.14 with only the plugins the local node's cluster DNS needs, on
// the Kubernetes family's client-go 0.36 (../tools.go).
//
// It is built from this wrapper module by hack/install-tools (the documented way to choose
// CoreDNS plugins at compile time: an external main that imports them and sets the directive
// order). There is deliberately no `forward`, `grpc` or other upstream plugin: the local
// cluster's DNS answers `cluster.local` and never sends a query off this machine.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The subset of CoreDNS's own directive order (core/dnsserver/zdirectives.go) for the plugins
// imported above; a Corefile naming any other plugin is rejected at start-up.
var directives = []string{
	"bind",
	"ready",
	"health",
	"errors",
	"log",
	"loadbalance",
	"cache",
	"kubernetes",
}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
