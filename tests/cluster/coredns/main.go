// Command coredns is the test node's cluster DNS: CoreDNS (github.com/coredns/coredns) with
// only the plugins the test cluster's Corefile uses (tests/cluster/node.go writes it), so the
// build does not pull every cloud provider's SDK that the full CoreDNS links.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/template"
)

// The directives' order is CoreDNS's own (core/dnsserver/zdirectives.go); unused ones are
// simply never set up.
var _ = dnsserver.Directives

func main() {
	coremain.Run()
}
