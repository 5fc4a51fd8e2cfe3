// The kubelet of a node, and "node": an extra node (tests/cluster/extra-node) as one process
// tree of its own, its containerd and kubelet as children, outside the cluster's "run".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// kubeletSpec: what differs between the nodes of one machine. Two kubelets on one machine
// must not share a runtime (each garbage-collects every container its runtime knows), a
// cgroup root (each removes the pod cgroups it did not make), a pod log directory (each
// removes the logs of pods it does not know), or an address and port.
type kubeletSpec struct {
	name       string // node name
	cert       string // PKI leaf NAME.crt/NAME.key, CN system:node:<name>
	ip         string // node address: kubelet's API and healthz
	dnsIP      string // cluster DNS (CoreDNS, on the first node's address)
	runtime    string // CRI endpoint
	port       int    // API server port on 127.0.0.1
	cgroupRoot string // "" = the machine's root (the first node)
	podLogsDir string // "" = /var/log/pods (the first node)
}

// writeKubelet writes DIR/kubelet.kubeconfig, DIR/kubelet.yaml and DIR/resolv.conf.
func writeKubelet(stateDir, dir string, k kubeletSpec) error {
	pki := func(f string) string { return filepath.Join(stateDir, "pki", f) }
	p := func(f string) string { return filepath.Join(dir, f) }
	server := fmt.Sprintf("https://127.0.0.1:%d", k.port)
	if err := writeKubeconfig(p("kubelet.kubeconfig"), server, pki("ca.crt"), pki(k.cert+".crt"), pki(k.cert+".key"), "system:node:"+k.name); err != nil {
		return err
	}
	write := func(path, content string) error {
		return os.WriteFile(path, []byte(strings.TrimLeft(content, "\n")), 0o644)
	}
	// Pods resolve through CoreDNS only: nothing asks a resolver outside.
	resolv := p("resolv.conf")
	if err := write(resolv, fmt.Sprintf("nameserver %s\noptions ndots:5\n", k.dnsIP)); err != nil {
		return err
	}
	extra := ""
	if k.cgroupRoot != "" {
		extra += fmt.Sprintf("cgroupRoot: %s\n", k.cgroupRoot)
	}
	if k.podLogsDir != "" {
		extra += fmt.Sprintf("podLogsDir: %s\n", k.podLogsDir)
	}
	healthz := "127.0.0.1"
	if k.cert != "kubelet" {
		healthz = k.ip // one port per address: the first node's kubelet has 127.0.0.1's
	}
	// failCgroupV1: this machine mounts cgroup v1 (1.35 refuses it unless told).
	// cgroupfs: containerd 1.6 cannot report its driver. No image GC or disk eviction: the
	// images were imported here and no registry could give them back.
	return write(p("kubelet.yaml"), fmt.Sprintf(`
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: %[1]s
failSwapOn: false
address: %[2]s
port: 10250
readOnlyPort: 0
healthzBindAddress: %[8]s
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[3]q}
authorization: {mode: Webhook}
rotateCertificates: false
serverTLSBootstrap: false
clusterDomain: cluster.local
clusterDNS: [%[4]s]
resolvConf: %[5]q
staticPodPath: ""
registerNode: true
# A dedicated node: only pods that tolerate the taint run here (the node tests' actors, the
# chart, KEDA). Every other test's pods stay Pending, as they were before the node existed,
# and never ask a registry for their images.
registerWithTaints: [{key: %[6]s, value: "true", effect: NoSchedule}]
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {nodefs.available: "0%%", nodefs.inodesFree: "0%%", imagefs.available: "0%%"}
serializeImagePulls: false
maxPods: 110
nodeStatusUpdateFrequency: 10s
syncFrequency: 10s
%[7]s`, k.runtime, k.ip, pki("ca.crt"), k.dnsIP, resolv, nodeTaint, extra, healthz))
}

func kubeletArgs(dir, root string, k kubeletSpec) []string {
	return []string{
		"--config=" + filepath.Join(dir, "kubelet.yaml"),
		"--kubeconfig=" + filepath.Join(dir, "kubelet.kubeconfig"),
		"--hostname-override=" + k.name,
		"--node-ip=" + k.ip,
		"--root-dir=" + root,
		"--cert-dir=" + filepath.Join(root, "pki"),
		"--v=1",
	}
}

// runNode runs an extra node: its containerd (the configuration tests/services/containerd
// prepared) and its kubelet, until SIGTERM, a child's exit, or the cluster's "run" process
// going away (an extra node never outlives its control plane: whoever stops the cluster,
// even with an older tests/cluster/down, stops it too).
func runNode(args []string) error {
	fs := flag.NewFlagSet("node", flag.ExitOnError)
	var (
		dir, name, containerdConfig, socket, kubeletRoot, kubeletAfter string
		k                                                              kubeletSpec
		index, clusterPid                                              int
	)
	fs.StringVar(&dir, "dir", "", "the cluster's state directory (pki, logs)")
	fs.IntVar(&index, "index", 1, "the node's index (0 is the cluster's own node)")
	fs.StringVar(&name, "name", "", "node name")
	fs.StringVar(&k.ip, "node-ip", "", "node address (on lo)")
	fs.StringVar(&k.dnsIP, "dns-ip", "", "cluster DNS address")
	fs.IntVar(&k.port, "port", 16443, "API server port on 127.0.0.1")
	fs.StringVar(&containerdConfig, "containerd-config", "", "this node's containerd configuration")
	fs.StringVar(&socket, "containerd-socket", "", "its socket (from the configuration)")
	fs.StringVar(&kubeletRoot, "kubelet-root-dir", "", "the kubelet's root directory")
	fs.StringVar(&k.cgroupRoot, "cgroup-root", "", "the kubelet's cgroup root (made beforehand)")
	fs.StringVar(&k.podLogsDir, "pod-logs-dir", "", "where the kubelet keeps its pods' logs")
	fs.StringVar(&kubeletAfter, "kubelet-after", "", "start the kubelet once this file exists (the images are loaded into containerd)")
	fs.IntVar(&clusterPid, "cluster-pid", 0, "the cluster's run process: the node stops when it is gone")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if dir == "" || name == "" || k.ip == "" || k.dnsIP == "" || containerdConfig == "" || socket == "" || kubeletRoot == "" || clusterPid == 0 {
		return errors.New("--dir, --name, --node-ip, --dns-ip, --containerd-config, --containerd-socket, --kubelet-root-dir and --cluster-pid are required")
	}
	k.name, k.cert, k.runtime = name, "kubelet-"+strconv.Itoa(index), "unix://"+socket
	log.SetPrefix(fmt.Sprintf("[%s] ", name))
	pkiDir := filepath.Join(dir, "pki")
	ca, caKey, err := loadPair(filepath.Join(pkiDir, "ca.crt"), filepath.Join(pkiDir, "ca.key"))
	if err != nil {
		return fmt.Errorf("the cluster's CA: %w", err)
	}
	if err := ensureLeaf(pkiDir, ca, caKey, leafSpec{name: k.cert, cn: "system:node:" + name, org: "system:nodes", client: true}); err != nil {
		return err
	}
	nodeDir := filepath.Join(dir, "nodes", strconv.Itoa(index))
	if err := os.MkdirAll(nodeDir, 0o755); err != nil {
		return err
	}
	if err := writeKubelet(dir, nodeDir, k); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	c := config{dir: dir}
	suffix := "-" + strconv.Itoa(index)
	containerd, err := startProgram(ctx, c, "containerd"+suffix, "containerd", []string{"--config", containerdConfig})
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if _, err := os.Stat(socket); err == nil {
			break
		}
		if containerd.cmd.ProcessState != nil || time.Now().After(deadline) {
			stopChild(containerd)
			return fmt.Errorf("containerd did not open %s (log %s)", socket, containerd.logPath)
		}
	}
	for kubeletAfter != "" {
		if _, err := os.Stat(kubeletAfter); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			stopChild(containerd)
			return nil
		case err := <-containerd.done:
			return fmt.Errorf("containerd exited: %v (log %s)", err, containerd.logPath)
		case <-time.After(200 * time.Millisecond):
		}
	}
	self, err := os.Executable()
	if err != nil {
		stopChild(containerd)
		return err
	}
	kubelet, err := startProgram(ctx, c, "kubelet"+suffix, self, append([]string{"kubelet"}, kubeletArgs(nodeDir, kubeletRoot, k)...))
	if err != nil {
		stopChild(containerd)
		return err
	}
	exited := make(chan *child, 2)
	for _, ch := range []*child{containerd, kubelet} {
		go func(ch *child) { ch.err = <-ch.done; exited <- ch }(ch)
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var failure error
loop:
	for {
		select {
		case <-ctx.Done():
			log.Printf("stopping")
			break loop
		case ch := <-exited:
			failure = fmt.Errorf("%s exited: %v (log: %s)", ch.name, ch.err, ch.logPath)
			break loop
		case <-tick.C:
			if syscall.Kill(clusterPid, 0) != nil {
				failure = fmt.Errorf("the cluster (pid %d) is gone", clusterPid)
				break loop
			}
		}
	}
	stopChild(kubelet)
	stopChild(containerd)
	if k.cgroupRoot != "" && failure != nil {
		// Orphaned (or a part died): the pods' containers and their shims outlive
		// containerd; end every process of the node but this one.
		killCgroup(filepath.Join("/sys/fs/cgroup/pids", k.cgroupRoot))
	}
	return failure
}

// killCgroup sends SIGKILL to every process in the cgroup tree DIR except this one.
func killCgroup(dir string) {
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, _ := os.ReadFile(path)
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		return nil
	})
}
