// The node: kube-scheduler, kube-proxy and the kubelet (against the containerd of
// tests/services/containerd), and CoreDNS when its binary is given, all children of "run".
// Addresses: the node, its kubelet, CoreDNS and the host services pods reach are on one
// host address (--node-ip, on lo); pods are on the bridge asya0 (--pod-cidr), which
// tests/cluster/up sets up with the CNI configuration and keeps isolated from the outside.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// nodeName is fixed: the kubelet's client certificate names it (system:node:NAME).
const nodeName = "asya-test-node"

// nodeTaint keeps pods off the node unless they tolerate it (see the kubelet configuration).
const nodeTaint = "asya.sh/test-node"

// clusterCIDR covers every node's pod CIDR (node I: 10.244.I.0/24, tests/cluster/nodes.sh):
// kube-proxy treats traffic from it as the cluster's own.
const clusterCIDR = "10.244.0.0/16"

type nodeConfig struct {
	ip          string // host address of the node, the kubelet and CoreDNS; "" = no node
	podCIDR     string
	serviceCIDR string
	runtime     string // CRI endpoint
	kubeletRoot string // outside the state dir: it holds tmpfs mounts
	coredns     string // CoreDNS binary; "" = none
	forwards    forwardFlags
}

func (n nodeConfig) enabled() bool { return n.ip != "" }

// nodePKI: the identities the node's components use, issued once by the cluster CA.
var nodePKI = []leafSpec{
	{name: "kubelet", cn: "system:node:" + nodeName, org: "system:nodes", client: true},
	{name: "kube-proxy", cn: "system:kube-proxy", client: true},
	{name: "scheduler", cn: "system:kube-scheduler", client: true},
	// The API server's identity towards kubelets (logs, exec).
	{name: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", org: "system:masters", client: true},
}

// apiserverNodeArgs replaces the loopback-only settings of the API server: pods reach it
// through the kubernetes Service (10.96.0.1 -> node IP), the Node authorizer admits the
// kubelet, and the aggregation layer serves KEDA's external metrics API.
func apiserverNodeArgs(c config, pki func(string) string) []string {
	return []string{
		"--bind-address=0.0.0.0",
		"--advertise-address=" + c.node.ip,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultStorageClass,ResourceQuota,NodeRestriction,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy",
		"--kubelet-client-certificate=" + pki("apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + pki("apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP",
		"--requestheader-client-ca-file=" + pki("front-proxy-ca.crt"),
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + pki("front-proxy-client.crt"),
		"--proxy-client-key-file=" + pki("front-proxy-client.key"),
		// Webhooks and aggregated APIs are dialled at their endpoints (pod or host IP), not
		// through a ClusterIP that only kube-proxy's rules make reachable.
		"--enable-aggregator-routing=true",
	}
}

// controllerManagerNodeArgs: with a node, the node lifecycle (taints of a dead kubelet) and
// TTL controllers run too; the HPA reacts in seconds, not minutes, so scale tests stay short.
func controllerManagerNodeArgs() []string {
	return []string{
		"--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-node-route-controller,-persistentvolume-binder,-attachdetach,-persistentvolume-expander",
		"--node-monitor-grace-period=20s",
		"--horizontal-pod-autoscaler-sync-period=5s",
		"--horizontal-pod-autoscaler-downscale-stabilization=30s",
	}
}

type nodeFiles struct {
	schedulerConfig, proxyConfig, corefile string
}

// writeNodeFiles writes the components' kubeconfigs and configuration files under DIR/node.
func writeNodeFiles(c config) (nodeFiles, error) {
	dir := filepath.Join(c.dir, "node")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nodeFiles{}, err
	}
	p := func(f string) string { return filepath.Join(dir, f) }
	pki := func(f string) string { return filepath.Join(c.dir, "pki", f) }
	server := fmt.Sprintf("https://127.0.0.1:%d", c.port)
	for _, kc := range []struct{ file, cert, user string }{
		{"scheduler.kubeconfig", "scheduler", "system:kube-scheduler"},
		{"kube-proxy.kubeconfig", "kube-proxy", "system:kube-proxy"},
	} {
		if err := writeKubeconfig(p(kc.file), server, pki("ca.crt"), pki(kc.cert+".crt"), pki(kc.cert+".key"), kc.user); err != nil {
			return nodeFiles{}, err
		}
	}
	n := c.node
	files := nodeFiles{
		schedulerConfig: p("scheduler.yaml"),
		proxyConfig:     p("kube-proxy.yaml"),
		corefile:        p("Corefile"),
	}
	write := func(path, content string) error {
		return os.WriteFile(path, []byte(strings.TrimLeft(content, "\n")), 0o644)
	}
	if err := write(files.schedulerConfig, fmt.Sprintf(`
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: %q}
leaderElection: {leaderElect: false}
# With extra nodes (tests/cluster/extra-node) a ReplicaSet's pods go one per node before
# any node gets a second: the HA tests need replicas on both nodes, and the scheduler's
# default spreading (weight 2) loses to resource scoring on nodes this small.
profiles:
- schedulerName: default-scheduler
  plugins:
    score:
      enabled: [{name: PodTopologySpread, weight: 20}]
  pluginConfig:
  - name: PodTopologySpread
    args:
      defaultingType: List
      defaultConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway}
`, p("scheduler.kubeconfig"))); err != nil {
		return files, err
	}
	// The host's conntrack and route_localnet settings are left as they are (kind and k3s
	// do the same): the node is a guest on this machine. One kube-proxy serves every node
	// (extra nodes share this machine's network namespace, where a second one would rewrite
	// the same chains): it names the first node, and every node's pods are "local" to it.
	if err := write(files.proxyConfig, fmt.Sprintf(`
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: %q}
hostnameOverride: %s
clusterCIDR: %s
detectLocalMode: ClusterCIDR
bindAddress: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
iptables: {minSyncPeriod: 1s, localhostNodePorts: false}
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
`, p("kube-proxy.kubeconfig"), nodeName, clusterCIDR, n.ip)); err != nil {
		return files, err
	}
	if err := writeKubelet(c.dir, dir, kubeletSpec{
		name: nodeName, cert: "kubelet", ip: n.ip, dnsIP: n.ip, runtime: n.runtime, port: c.port,
	}); err != nil {
		return files, err
	}
	// CoreDNS: the cluster's names from the API server; every other name is NXDOMAIN (no
	// forwarding: nothing leaves the machine).
	if err := write(files.corefile, fmt.Sprintf(`
cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {
    bind %[1]s
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig %[2]q asya-test
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    cache 5
}
.:53 {
    bind %[1]s
    errors
    health 127.0.0.1:18180
    ready 127.0.0.1:18181
    template ANY ANY {
        rcode NXDOMAIN
    }
}
`, n.ip, filepath.Join(c.dir, "kubeconfig"))); err != nil {
		return files, err
	}
	return files, nil
}

// lockNode takes the machine-wide node lock for as long as this process lives: the kubelet's
// port, the bridge, kube-proxy's rules and CoreDNS's address exist once per machine, so a
// second checkout's cluster must run without a node (ASYA_TEST_NODE=0) while this one does.
func lockNode(stateDir string) (*os.File, error) {
	const path = "/run/asya-test-node.lock"
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("another test cluster runs this machine's node (%s); stop it, or start this one with ASYA_TEST_NODE=0", strings.TrimSpace(string(holder)))
		}
		return nil, err
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(stateDir+"\n"), 0)
	return f, nil
}

// forward serves LISTEN and copies each connection to TARGET: the host's test servers listen
// on loopback only, and pods reach them at the node's address through this (their peer
// there is loopback, as for every other client of those servers).
func forward(ctx context.Context, listen, target string) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	go func() { <-ctx.Done(); ln.Close() }()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				if ctx.Err() == nil {
					log.Printf("forward %s: %v", listen, err)
				}
				return
			}
			go func() {
				defer conn.Close()
				up, err := net.DialTimeout("tcp", target, 10*time.Second)
				if err != nil {
					log.Printf("forward %s -> %s: %v", listen, target, err)
					return
				}
				defer up.Close()
				done := make(chan struct{}, 2)
				pipe := func(dst, src net.Conn) {
					_, _ = io.Copy(dst, src)
					if tc, ok := dst.(*net.TCPConn); ok {
						_ = tc.CloseWrite()
					}
					done <- struct{}{}
				}
				go pipe(up, conn)
				go pipe(conn, up)
				<-done
				<-done
			}()
		}
	}()
	log.Printf("forwarding %s -> %s", listen, target)
	return nil
}

// forwardFlags collects repeated --forward LISTEN=TARGET flags.
type forwardFlags []string

func (f *forwardFlags) String() string { return strings.Join(*f, ",") }
func (f *forwardFlags) Set(v string) error {
	if !strings.Contains(v, "=") {
		return fmt.Errorf("--forward wants LISTEN=TARGET, got %q", v)
	}
	*f = append(*f, v)
	return nil
}
