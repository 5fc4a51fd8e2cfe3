// Command asya-test-cluster is the project's test Kubernetes control plane: an embedded etcd,
// a real kube-apiserver and kube-controller-manager, and kubectl, all from the Go module
// k8s.io/kubernetes, in one multi-call binary (the old "hyperkube" pattern).
//
//	asya-test-cluster run --dir DIR [--port 16443] [--etcd-port 12379]
//	asya-test-cluster kube-apiserver FLAGS...        (also when invoked as "kube-apiserver")
//	asya-test-cluster kube-controller-manager FLAGS...
//	asya-test-cluster kubectl ARGS...                (also when invoked as "kubectl")
//	asya-test-cluster node --dir DIR --index I ...   (an extra node: tests/cluster/extra-node)
//
// "run" generates the certificates and keys it needs under DIR/pki (once), starts etcd in
// process, then the API server and the controller manager as child processes of this same
// binary, writes DIR/kubeconfig (admin, system:masters) and stays in the foreground until it
// gets SIGTERM/SIGINT or a child exits. tests/cluster/up runs it in the background.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	cmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxyapp "k8s.io/kubernetes/cmd/kube-proxy/app"
	schedapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubeletapp "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if name == "asya-test-cluster" || strings.HasPrefix(name, "asya-test-cluster") {
		if len(args) == 0 {
			fmt.Fprintln(os.Stderr, "usage: asya-test-cluster run|kube-apiserver|kube-controller-manager|kube-scheduler|kube-proxy|kubelet|kubectl ...")
			os.Exit(2)
		}
		name, args = args[0], args[1:]
	}
	// Each component parses its own flags from os.Args[1:].
	os.Args = append([]string{name}, args...)
	switch name {
	case "kube-apiserver":
		os.Exit(cli.Run(apiserverapp.NewAPIServerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(cmapp.NewControllerManagerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(schedapp.NewSchedulerCommand()))
	case "kube-proxy":
		os.Exit(cli.Run(proxyapp.NewProxyCommand()))
	case "kubelet":
		os.Exit(cli.Run(kubeletapp.NewKubeletCommand(context.Background())))
	case "kubectl":
		cmd := kubectlcmd.NewDefaultKubectlCommand()
		if err := cli.RunNoErrOutput(cmd); err != nil {
			// kubectl prints its own errors through cmdutil.CheckErr; keep its exit code.
			os.Exit(1)
		}
		os.Exit(0)
	case "node":
		if err := runNode(args); err != nil {
			log.Printf("asya-test-cluster node: %v", err)
			os.Exit(1)
		}
	case "run":
		if err := run(args); err != nil {
			log.Printf("asya-test-cluster: %v", err)
			os.Exit(1)
		}
	default:
		fmt.Fprintf(os.Stderr, "asya-test-cluster: unknown command %q\n", name)
		os.Exit(2)
	}
}

type config struct {
	dir      string
	port     int
	etcdPort int
	node     nodeConfig
}

func run(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	var c config
	fs.StringVar(&c.dir, "dir", "", "state directory (pki, etcd data, kubeconfig, logs)")
	fs.IntVar(&c.port, "port", 16443, "API server secure port on 127.0.0.1")
	fs.IntVar(&c.etcdPort, "etcd-port", 12379, "etcd client port on 127.0.0.1 (peer port is +1)")
	fs.StringVar(&c.node.ip, "node-ip", "", "host address of the node (kubelet, CoreDNS); empty: no node, the control plane only")
	fs.StringVar(&c.node.podCIDR, "pod-cidr", "10.244.0.0/24", "pod addresses (the CNI bridge's subnet)")
	fs.StringVar(&c.node.runtime, "container-runtime-endpoint", "unix:///run/asya-containerd/containerd.sock", "CRI endpoint of the node")
	fs.StringVar(&c.node.kubeletRoot, "kubelet-root-dir", "/var/lib/asya-test-kubelet", "the kubelet's root directory")
	fs.StringVar(&c.node.coredns, "coredns", "", "CoreDNS binary to serve cluster DNS on the node IP")
	fs.Var(&c.node.forwards, "forward", "LISTEN=TARGET: serve a host server (on loopback) to pods at LISTEN (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.dir == "" {
		return errors.New("--dir is required")
	}
	var err error
	if c.dir, err = filepath.Abs(c.dir); err != nil {
		return err
	}
	log.SetPrefix("[test-cluster] ")
	if c.node.enabled() {
		lock, err := lockNode(c.dir)
		if err != nil {
			return err
		}
		defer lock.Close()
	}
	for _, d := range []string{"pki", "etcd", "logs"} {
		if err := os.MkdirAll(filepath.Join(c.dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := ensurePKI(c); err != nil {
		return fmt.Errorf("pki: %w", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	etcd, err := startEtcd(c)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer func() {
		etcd.Close()
		log.Printf("etcd stopped")
	}()

	self, err := os.Executable()
	if err != nil {
		return err
	}
	pki := func(f string) string { return filepath.Join(c.dir, "pki", f) }
	apiserverArgs := []string{
		"--etcd-servers=" + fmt.Sprintf("http://127.0.0.1:%d", c.etcdPort),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(c.port),
		"--tls-cert-file=" + pki("apiserver.crt"),
		"--tls-private-key-file=" + pki("apiserver.key"),
		"--client-ca-file=" + pki("ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + pki("sa.pub"),
		"--service-account-signing-key-file=" + pki("sa.key"),
		"--api-audiences=https://kubernetes.default.svc.cluster.local",
		"--authorization-mode=RBAC",
		"--enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultStorageClass,ResourceQuota,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy",
		"--service-cluster-ip-range=10.96.0.0/16",
		"--allow-privileged=true",
		"--profiling=false",
		"--enable-priority-and-fairness=false",
		"--endpoint-reconciler-type=none",
		"--v=1",
	}
	if c.node.enabled() {
		// Pods reach the API server through the kubernetes Service: its endpoint is kept.
		apiserverArgs = withFlags(dropFlag(apiserverArgs, "--endpoint-reconciler-type"), apiserverNodeArgs(c, pki))
	}
	apiserver, err := startChild(ctx, c, self, "kube-apiserver", apiserverArgs)
	if err != nil {
		return err
	}
	if err := waitReady(ctx, c, apiserver, 120*time.Second); err != nil {
		return err
	}
	log.Printf("kube-apiserver ready on https://127.0.0.1:%d", c.port)

	cmArgs := []string{
		"--kubeconfig=" + filepath.Join(c.dir, "controller-manager.kubeconfig"),
		"--authentication-kubeconfig=" + filepath.Join(c.dir, "controller-manager.kubeconfig"),
		"--authorization-kubeconfig=" + filepath.Join(c.dir, "controller-manager.kubeconfig"),
		"--bind-address=127.0.0.1",
		"--secure-port=0",
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + pki("sa.key"),
		"--root-ca-file=" + pki("ca.crt"),
		"--cluster-signing-cert-file=" + pki("ca.crt"),
		"--cluster-signing-key-file=" + pki("ca.key"),
		// No nodes and no cloud: the controllers that manage them only log noise.
		"--controllers=*,-nodeipam,-nodelifecycle,-cloud-node-lifecycle,-service-lb-controller,-node-route-controller,-persistentvolume-binder,-attachdetach,-persistentvolume-expander,-ttl",
		"--v=1",
	}
	if c.node.enabled() {
		cmArgs = withFlags(cmArgs, controllerManagerNodeArgs())
	}
	// Children in start order; stopped in reverse.
	children := []*child{apiserver}
	stopAll := func() {
		for i := len(children) - 1; i >= 0; i-- {
			stopChild(children[i])
		}
	}
	start := func(name string, args []string) error {
		ch, err := startChild(ctx, c, self, name, args)
		if err != nil {
			stopAll()
			return err
		}
		children = append(children, ch)
		return nil
	}
	if err := start("kube-controller-manager", cmArgs); err != nil {
		return err
	}
	if c.node.enabled() {
		for _, f := range c.node.forwards {
			parts := strings.SplitN(f, "=", 2)
			if err := forward(ctx, parts[0], parts[1]); err != nil {
				stopAll()
				return fmt.Errorf("--forward %s: %w", f, err)
			}
		}
		files, err := writeNodeFiles(c)
		if err != nil {
			stopAll()
			return fmt.Errorf("node configuration: %w", err)
		}
		if err := start("kube-scheduler", []string{"--config=" + files.schedulerConfig, "--secure-port=0", "--v=1"}); err != nil {
			return err
		}
		if c.node.coredns != "" {
			ch, err := startProgram(ctx, c, "coredns", c.node.coredns, []string{"-conf", files.corefile})
			if err != nil {
				stopAll()
				return err
			}
			children = append(children, ch)
		}
		if err := start("kube-proxy", []string{"--config=" + files.proxyConfig, "--v=1"}); err != nil {
			return err
		}
		k := kubeletSpec{name: nodeName, cert: "kubelet", ip: c.node.ip, dnsIP: c.node.ip, runtime: c.node.runtime, port: c.port}
		if err := start("kubelet", kubeletArgs(filepath.Join(c.dir, "node"), c.node.kubeletRoot, k)); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(c.dir, "ready"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		stopAll()
		return err
	}

	// Any child exiting takes the whole cluster down: tests/cluster/up then says which. SIGUSR1
	// restarts the API server alone (tests/cluster/restart-apiserver): a clean stop (SIGTERM)
	// and a start with the same flags; etcd, in this process, keeps the data. SIGUSR2 kills it
	// instead (restart-apiserver --kill).
	exited := make(chan *child, len(children)+1)
	watch := func(ch *child) { go func() { ch.err = <-ch.done; exited <- ch }() }
	for _, ch := range children {
		watch(ch)
	}
	// SIGUSR2: the same, but killed (SIGKILL) as a crash would.
	restart := make(chan os.Signal, 1)
	signal.Notify(restart, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(restart)
	writeAPIServerPid := func(ch *child) {
		_ = os.WriteFile(filepath.Join(c.dir, "apiserver.pid"), []byte(strconv.Itoa(ch.cmd.Process.Pid)+"\n"), 0o644)
	}
	writeAPIServerPid(apiserver)
	var failure error
loop:
	for {
		select {
		case <-ctx.Done():
			log.Printf("stopping")
			break loop
		case ch := <-exited:
			if ch.replaced {
				continue
			}
			failure = fmt.Errorf("%s exited: %v (log: %s)", ch.name, ch.err, ch.logPath)
			break loop
		case sig := <-restart:
			log.Printf("restarting kube-apiserver (%v)", sig)
			old := children[0]
			old.replaced = true
			if sig == syscall.SIGUSR2 {
				_ = old.cmd.Process.Kill()
				<-old.done
			} else {
				stopChild(old)
			}
			next, err := startChild(ctx, c, self, "kube-apiserver", apiserverArgs)
			if err != nil {
				failure = err
				break loop
			}
			children[0] = next
			watch(next)
			if err := waitReady(ctx, c, next, 120*time.Second); err != nil {
				failure = err
				break loop
			}
			writeAPIServerPid(next)
			log.Printf("kube-apiserver restarted, ready")
		}
	}
	os.Remove(filepath.Join(c.dir, "ready"))
	stopAll()
	return failure
}

// withFlags sets each --name=value of `over` in `args`, replacing a flag of the same name.
func withFlags(args, over []string) []string {
	for _, o := range over {
		name := strings.SplitN(o, "=", 2)[0]
		args = append(dropFlag(args, name), o)
	}
	return args
}

func dropFlag(args []string, name string) []string {
	out := args[:0:0]
	for _, a := range args {
		if a != name && !strings.HasPrefix(a, name+"=") {
			out = append(out, a)
		}
	}
	return out
}

type child struct {
	name    string
	cmd     *exec.Cmd
	done    chan error
	err     error
	logPath string
	// Stopped on purpose to be started anew (the API server's restart): its exit is expected.
	replaced bool
}

func startChild(ctx context.Context, c config, self, name string, args []string) (*child, error) {
	return startProgram(ctx, c, name, self, append([]string{name}, args...))
}

// startProgram runs PATH ARGS as the child NAME, its output in DIR/logs/NAME.log.
func startProgram(ctx context.Context, c config, name, path string, args []string) (*child, error) {
	logPath := filepath.Join(c.dir, "logs", name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = f, f
	// Die with us even if we are killed with SIGKILL.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	ch := &child{name: name, cmd: cmd, done: make(chan error, 1), logPath: logPath}
	go func() {
		err := cmd.Wait()
		f.Close()
		ch.done <- err
		close(ch.done)
	}()
	log.Printf("%s started (pid %d, log %s)", name, cmd.Process.Pid, logPath)
	return ch, nil
}

func stopChild(ch *child) {
	if ch == nil || ch.cmd.ProcessState != nil {
		return
	}
	_ = ch.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-ch.done:
	case <-time.After(20 * time.Second):
		_ = ch.cmd.Process.Kill()
		<-ch.done
	}
	log.Printf("%s stopped", ch.name)
}

func waitReady(ctx context.Context, c config, apiserver *child, timeout time.Duration) error {
	caPEM, err := os.ReadFile(filepath.Join(c.dir, "pki", "ca.crt"))
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	deadline := time.Now().Add(timeout)
	u := fmt.Sprintf("https://127.0.0.1:%d/readyz", c.port)
	last := ""
	for {
		resp, err := client.Get(u)
		if err == nil {
			body := make([]byte, 4096)
			n, _ := resp.Body.Read(body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			last = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(body[:n])))
		} else {
			last = err.Error()
		}
		select {
		case err := <-apiserver.done:
			return fmt.Errorf("kube-apiserver exited before ready: %v (log: %s)", err, apiserver.logPath)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver not ready after %s: %s (log: %s)", timeout, last, apiserver.logPath)
		}
	}
}

func startEtcd(c config) (*embed.Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Name = "test-cluster"
	cfg.Dir = filepath.Join(c.dir, "etcd")
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(c.dir, "logs", "etcd.log")}
	clientURL, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", c.etcdPort))
	peerURL, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", c.etcdPort+1))
	cfg.ListenClientUrls = []url.URL{*clientURL}
	cfg.AdvertiseClientUrls = []url.URL{*clientURL}
	cfg.ListenPeerUrls = []url.URL{*peerURL}
	cfg.AdvertisePeerUrls = []url.URL{*peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	// A test cluster: fsync costs more than it protects here.
	cfg.UnsafeNoFsync = true
	cfg.QuotaBackendBytes = 2 << 30
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
		log.Printf("etcd ready on %s", clientURL)
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, err
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, errors.New("etcd not ready after 60s")
	}
}

// ---- PKI ---------------------------------------------------------------------------------

// leafSpec is a certificate the cluster CA (or the front-proxy CA) issues.
type leafSpec struct {
	name    string // files NAME.crt, NAME.key
	cn, org string
	client  bool // client auth; else server auth
	dns     []string
	ips     []net.IP
}

// ensurePKI creates what is missing, file by file, so a state directory made before a
// component existed gets that component's identity without losing the others.
func ensurePKI(c config) error {
	dir := filepath.Join(c.dir, "pki")
	p := func(f string) string { return filepath.Join(dir, f) }
	ca, caKey, err := ensureCA(dir, "ca", "asya-test-cluster-ca")
	if err != nil {
		return err
	}
	leaves := []leafSpec{
		{name: "apiserver", cn: "kube-apiserver",
			dns: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
			ips: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1"), net.ParseIP("10.96.0.1")}},
		{name: "admin", cn: "asya-test-admin", org: "system:masters", client: true},
		{name: "controller-manager", cn: "system:kube-controller-manager", client: true},
	}
	if c.node.enabled() {
		leaves = append(leaves, nodePKI...)
	}
	for _, l := range leaves {
		if err := ensureLeaf(dir, ca, caKey, l); err != nil {
			return err
		}
	}
	if c.node.enabled() {
		// The aggregation layer's request-header CA is its own (the client CA must not be
		// able to assert X-Remote-User).
		fpCA, fpKey, err := ensureCA(dir, "front-proxy-ca", "asya-test-front-proxy-ca")
		if err != nil {
			return err
		}
		if err := ensureLeaf(dir, fpCA, fpKey, leafSpec{name: "front-proxy-client", cn: "front-proxy-client", client: true}); err != nil {
			return err
		}
	}
	if _, err := os.Stat(p("sa.pub")); errors.Is(err, os.ErrNotExist) {
		saKey, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			return err
		}
		if err := writePEM(p("sa.key"), "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey), 0o600); err != nil {
			return err
		}
		pub, _ := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
		if err := writePEM(p("sa.pub"), "PUBLIC KEY", pub, 0o644); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", c.port)
	if err := writeKubeconfig(filepath.Join(c.dir, "kubeconfig"), server, p("ca.crt"), p("admin.crt"), p("admin.key"), "asya-test-admin"); err != nil {
		return err
	}
	return writeKubeconfig(filepath.Join(c.dir, "controller-manager.kubeconfig"), server, p("ca.crt"), p("controller-manager.crt"), p("controller-manager.key"), "system:kube-controller-manager")
}

// ensureCA loads NAME.crt/NAME.key, or makes them (the key first: the certificate's presence
// marks the pair complete).
func ensureCA(dir, name, cn string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	crtPath, keyPath := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if _, err := os.Stat(crtPath); err == nil {
		return loadPair(crtPath, keyPath)
	}
	log.Printf("generating %s in %s", name, dir)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	if err := writePEM(keyPath, "EC PRIVATE KEY", kb, 0o600); err != nil {
		return nil, nil, err
	}
	if err := writePEM(crtPath, "CERTIFICATE", der, 0o644); err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

func loadPair(crtPath, keyPath string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	crtPEM, err := os.ReadFile(crtPath)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, nil, err
	}
	cb, _ := pem.Decode(crtPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, fmt.Errorf("%s or %s is not PEM", crtPath, keyPath)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", crtPath, err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", keyPath, err)
	}
	return cert, key, nil
}

func ensureLeaf(dir string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, l leafSpec) error {
	crtPath, keyPath := filepath.Join(dir, l.name+".crt"), filepath.Join(dir, l.name+".key")
	if _, err := os.Stat(crtPath); err == nil {
		return nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	usage := x509.ExtKeyUsageServerAuth
	if l.client {
		usage = x509.ExtKeyUsageClientAuth
	}
	subj := pkix.Name{CommonName: l.cn}
	if l.org != "" {
		subj.Organization = []string{l.org}
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: subj,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().AddDate(10, 0, 0),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{usage}, DNSNames: l.dns, IPAddresses: l.ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	if err := writePEM(keyPath, "EC PRIVATE KEY", kb, 0o600); err != nil {
		return err
	}
	return writePEM(crtPath, "CERTIFICATE", der, 0o644)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	return n
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode)
}

// writeKubeconfig embeds the certificate data so the file can be copied anywhere.
func writeKubeconfig(path, server, caFile, certFile, keyFile, user string) error {
	read := func(f string) (string, error) {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		return b64(b), nil
	}
	ca, err := read(caFile)
	if err != nil {
		return err
	}
	cert, err := read(certFile)
	if err != nil {
		return err
	}
	key, err := read(keyFile)
	if err != nil {
		return err
	}
	content := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: asya-test
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: asya-test
  context:
    cluster: asya-test
    user: %s
current-context: asya-test
`, server, ca, user, cert, key, user)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
