// Package testcluster runs a real, minimal Kubernetes control plane — one
// etcd and one kube-apiserver, both listening only on 127.0.0.1 — for
// end-to-end tests.
//
// There is no kube-controller-manager, scheduler or kubelet: objects are
// stored and served, admission, authentication, RBAC and aggregation are
// real, but nothing reconciles. In particular namespaces stay Terminating
// after deletion, ServiceAccounts get no token controller and no "default"
// ServiceAccount is created (so creating Pods fails in the ServiceAccount
// admission plugin unless the test creates it), and Services get no
// EndpointSlices.
//
// The binaries are built from source by hack/install-kube.sh into
// hack/tools/bin; set EVERCERT_KUBE_BIN to use another directory.
//
// Typical use:
//
//	c := testcluster.Start(t, testcluster.WithUsers(testcluster.User{Name: "alice"}))
//	admin := kubernetes.NewForConfigOrDie(c.Config())
//	alice := kubernetes.NewForConfigOrDie(c.UserConfig("alice"))
//
// # Registering an aggregated API server
//
// EndpointSlices may not hold loopback addresses, so an aggregated server on
// 127.0.0.1 cannot be reached through endpoint routing. Start the cluster
// with WithAPIServerFlags("--enable-aggregator-routing=false") (the default
// here is true) and register the APIService against a Service of type
// ExternalName pointing at "localhost", with spec.service.port set to the
// port the aggregated server listens on: the aggregator then dials
// localhost:PORT and verifies the serving certificate for
// <service>.<namespace>.svc. test/e2e/aggregation_test.go does exactly this.
// Use [Cluster.FrontProxy] to configure the aggregated server's
// request-header authentication, or let it read the
// kube-system/extension-apiserver-authentication ConfigMap.
package testcluster

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// EnvKubeBin names the environment variable that points at a directory
// containing the kube-apiserver and etcd binaries. When it is unset, Start
// looks for hack/tools/bin in the working directory and its parents.
const EnvKubeBin = "EVERCERT_KUBE_BIN"

// FrontProxyClientName is the common name of the front-proxy client
// certificate returned by [Cluster.FrontProxy]; it is the only name the
// kube-apiserver's --requestheader-allowed-names accepts.
const FrontProxyClientName = "front-proxy-client"

// AdminUser is the user name of the identity used by [Cluster.Config]. It is
// a member of the system:masters group.
const AdminUser = "testcluster-admin"

const (
	logTailLines        = 50
	defaultStartTimeout = 60 * time.Second
	// serviceClusterIPRange is only an allocation range for Service
	// ClusterIPs; nothing ever connects to it.
	serviceClusterIPRange = "10.0.0.0/24"
)

// User is a non-admin identity whose bearer token is written to the
// kube-apiserver's token file at start; see [WithUsers].
type User struct {
	// Name is the user name. It must be non-empty and must not contain ',',
	// '"' or a newline.
	Name string
	// Groups lists the groups the user belongs to (besides
	// system:authenticated, which every authenticated user gets). A group
	// must not contain ',', '"' or a newline.
	Groups []string
}

// Option configures [Start].
type Option func(*options)

type options struct {
	users          []User
	apiServerFlags []string
	startTimeout   time.Duration
}

// WithUsers pre-provisions bearer tokens for users, so that
// [Cluster.UserConfig] authenticates them with a token. It may be given more
// than once; the lists are concatenated.
func WithUsers(users ...User) Option {
	return func(o *options) { o.users = append(o.users, users...) }
}

// WithAPIServerFlags appends flags (each in "--name=value" form) to the
// kube-apiserver command line. They come after the defaults, so for
// single-valued flags they win.
func WithAPIServerFlags(flags ...string) Option {
	return func(o *options) { o.apiServerFlags = append(o.apiServerFlags, flags...) }
}

// WithStartTimeout bounds how long Start, StartAPIServer and
// RestartAPIServer wait for etcd and kube-apiserver to become ready. The
// default is one minute.
func WithStartTimeout(d time.Duration) Option {
	return func(o *options) { o.startTimeout = d }
}

// Cluster is a running etcd + kube-apiserver pair started by [Start]. Its
// methods are safe for concurrent use.
type Cluster struct {
	t    testing.TB
	opts options
	dir  string // temporary directory holding data, certificates and logs

	kubeAPIServerBin, etcdBin string

	etcdURL   string
	etcdArgs  []string
	apiPort   int
	host      string
	apiArgs   []string
	etcdLog   string
	apiLog    string
	caPEM     []byte // serving CA of the kube-apiserver
	clientCA  *keyPair
	frontCA   *keyPair
	frontCert *keyPair

	adminToken string
	userTokens map[string]userToken // by user name

	mu        sync.Mutex
	etcd      *process
	apiserver *process
	stopped   bool
}

type userToken struct {
	token  string
	groups []string
}

// Start starts etcd and kube-apiserver on 127.0.0.1 with free ports and
// returns once the kube-apiserver's /readyz reports ok. The cluster is
// stopped by a t.Cleanup (see [Cluster.Stop]); if the test failed, the last
// lines of both logs are written with t.Log first.
//
// Start fails the test (t.Fatalf) if the binaries cannot be found — run
// hack/install-kube.sh — or if the control plane does not become ready.
func Start(t testing.TB, opts ...Option) *Cluster {
	t.Helper()
	o := options{startTimeout: defaultStartTimeout}
	for _, opt := range opts {
		opt(&o)
	}

	binDir, err := findBinDir()
	if err != nil {
		t.Fatalf("testcluster: %v", err)
	}
	dir, err := os.MkdirTemp("", "testcluster-")
	if err != nil {
		t.Fatalf("testcluster: create temporary directory: %v", err)
	}
	c := &Cluster{
		t:                t,
		opts:             o,
		dir:              dir,
		kubeAPIServerBin: filepath.Join(binDir, "kube-apiserver"),
		etcdBin:          filepath.Join(binDir, "etcd"),
		etcdLog:          filepath.Join(dir, "etcd.log"),
		apiLog:           filepath.Join(dir, "kube-apiserver.log"),
	}
	// On failure (including a failure to start, or a failure reported by
	// a subtest, which fails its parent too) the log tails are printed here,
	// before Stop removes the logs.
	t.Cleanup(func() {
		if t.Failed() {
			c.logTails(t)
		}
		c.Stop()
	})

	if err := c.writeConfig(); err != nil {
		t.Fatalf("testcluster: %v", err)
	}
	begin := time.Now()
	if err := c.startEtcd(); err != nil {
		t.Fatalf("testcluster: %v", err)
	}
	etcdReady := time.Since(begin)
	if err := c.startAPIServerFreshPort(); err != nil {
		t.Fatalf("testcluster: %v", err)
	}
	t.Logf("testcluster: etcd ready after %s, kube-apiserver %s ready after %s (dir %s)",
		etcdReady.Round(time.Millisecond), c.host, time.Since(begin).Round(time.Millisecond), c.dir)
	return c
}

// Host returns the kube-apiserver URL, https://127.0.0.1:<port>. The port
// stays the same across RestartAPIServer.
func (c *Cluster) Host() string { return c.host }

// EtcdURL returns the client URL of the cluster's etcd,
// http://127.0.0.1:<port> (plain HTTP, no authentication). An aggregated API
// server under test may store its own resources there, under a key prefix
// of its own; the kube-apiserver uses /registry.
func (c *Cluster) EtcdURL() string { return c.etcdURL }

// Config returns a new rest.Config for the admin user (AdminUser, group
// system:masters) authenticating with a bearer token; the server certificate
// is verified against the kube-apiserver's serving CA. Client-side rate
// limiting is relaxed (QPS 100, burst 200) so tests are not throttled.
func (c *Cluster) Config() *rest.Config {
	return c.tokenConfig(c.adminToken)
}

// UserConfig returns a new rest.Config that authenticates as user with the
// given groups (system:authenticated is always added by the server).
//
// If user was provisioned with [WithUsers] and groups is empty or equal (as a
// set) to the provisioned groups, the config carries that user's bearer token
// from the token file. Otherwise it carries a freshly issued client
// certificate (CN=user, O=groups) signed by the cluster's client CA, which
// the kube-apiserver authenticates just as well; so any user/groups
// combination works without restarting the server.
func (c *Cluster) UserConfig(user string, groups ...string) *rest.Config {
	if tok, ok := c.userTokens[user]; ok && (len(groups) == 0 || sameSet(groups, tok.groups)) {
		return c.tokenConfig(tok.token)
	}
	kp, err := issue(certSpec{commonName: user, organization: groups, client: true}, c.clientCA)
	if err != nil {
		// Generating an ECDSA key and certificate does not fail in practice.
		panic(fmt.Sprintf("testcluster: issue client certificate for %q: %v", user, err))
	}
	cfg := c.baseConfig()
	cfg.CertData = kp.certPEM
	cfg.KeyData = kp.keyPEM
	return cfg
}

// FrontProxy returns the request-header ("front proxy") material of the
// cluster: a client certificate and key with CN=front-proxy-client, which the
// kube-apiserver presents when proxying to aggregated API servers, and the
// PEM of the CA that signed it (--requestheader-client-ca-file). An
// aggregated API server under test trusts requests carrying X-Remote-User,
// X-Remote-Group and X-Remote-Extra-* headers from a client presenting a
// certificate signed by caPEM with that name; a test may also present the
// client certificate itself to talk to such a server directly. The returned
// slices are copies.
func (c *Cluster) FrontProxy() (clientCertPEM, clientKeyPEM, caPEM []byte) {
	return slices.Clone(c.frontCert.certPEM), slices.Clone(c.frontCert.keyPEM), slices.Clone(c.frontCA.certPEM)
}

// Stop stops kube-apiserver and then etcd (SIGTERM to each process group,
// SIGKILL after 10 s) and removes the cluster's temporary directory. It is
// idempotent and is also registered with t.Cleanup by Start. Failing to stop
// a process is reported with t.Errorf.
func (c *Cluster) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	c.stopped = true
	for _, p := range []*process{c.apiserver, c.etcd} {
		if p == nil {
			continue
		}
		if err := p.stop(); err != nil {
			c.t.Errorf("testcluster: %v", err)
		}
	}
	c.apiserver, c.etcd = nil, nil
	if err := os.RemoveAll(c.dir); err != nil {
		c.t.Errorf("testcluster: remove %s: %v", c.dir, err)
	}
}

// StopAPIServer stops kube-apiserver only (etcd keeps running), so a test
// can observe the API server being unreachable. It does nothing if the API
// server is not running.
func (c *Cluster) StopAPIServer(t testing.TB) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		t.Fatalf("testcluster: StopAPIServer called on a stopped cluster")
	}
	if c.apiserver == nil {
		return
	}
	err := c.apiserver.stop()
	c.apiserver = nil
	if err != nil {
		t.Fatalf("testcluster: %v", err)
	}
}

// StartAPIServer starts kube-apiserver again on the same port and with the
// same etcd, and waits for /readyz. If it is already running, it only waits
// for readiness.
func (c *Cluster) StartAPIServer(t testing.TB) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		t.Fatalf("testcluster: StartAPIServer called on a stopped cluster")
	}
	begin := time.Now()
	if c.apiserver == nil {
		p, err := startProcess("kube-apiserver", c.kubeAPIServerBin, c.apiArgs, c.apiLog)
		if err != nil {
			t.Fatalf("testcluster: %v", err)
		}
		c.apiserver = p
	}
	if err := c.waitAPIServerReady(c.apiserver); err != nil {
		t.Fatalf("testcluster: %v", err)
	}
	t.Logf("testcluster: kube-apiserver ready after %s", time.Since(begin).Round(time.Millisecond))
}

// RestartAPIServer stops kube-apiserver (as StopAPIServer) and starts it
// again on the same port with the same etcd (as StartAPIServer), returning
// once /readyz is ok. Data stored before the restart is still there.
func (c *Cluster) RestartAPIServer(t testing.TB) {
	t.Helper()
	c.StopAPIServer(t)
	c.StartAPIServer(t)
}

// tokenConfig returns a config authenticating with a bearer token.
func (c *Cluster) tokenConfig(token string) *rest.Config {
	cfg := c.baseConfig()
	cfg.BearerToken = token
	return cfg
}

// baseConfig returns a config for the server without credentials.
func (c *Cluster) baseConfig() *rest.Config {
	return &rest.Config{
		Host:            c.host,
		TLSClientConfig: rest.TLSClientConfig{CAData: slices.Clone(c.caPEM)},
		QPS:             100,
		Burst:           200,
	}
}

// logTails writes the last lines of both logs to t.Log. Few: they come
// after the test's own failure message, and CI shows only the end of a
// failed test's output (a failure in stop 42 lost its message behind 100
// lines of etcd and kube-apiserver start-up).
func (c *Cluster) logTails(t testing.TB) {
	t.Helper()
	for _, l := range []struct {
		name, path string
		lines      int
	}{{"etcd", c.etcdLog, 5}, {"kube-apiserver", c.apiLog, 15}} {
		t.Logf("testcluster: last %d lines of %s log (%s):\n%s", l.lines, l.name, l.path, tail(l.path, l.lines))
	}
}

// writeConfig generates the certificates, keys and token file in c.dir.
func (c *Cluster) writeConfig() error {
	for _, u := range c.opts.users {
		if err := validateUser(u); err != nil {
			return err
		}
	}

	servingCA, err := issue(certSpec{commonName: "testcluster-serving-ca", isCA: true}, nil)
	if err != nil {
		return err
	}
	serving, err := issue(certSpec{commonName: "kube-apiserver", server: true}, servingCA)
	if err != nil {
		return err
	}
	if c.clientCA, err = issue(certSpec{commonName: "testcluster-client-ca", isCA: true}, nil); err != nil {
		return err
	}
	if c.frontCA, err = issue(certSpec{commonName: "testcluster-front-proxy-ca", isCA: true}, nil); err != nil {
		return err
	}
	if c.frontCert, err = issue(certSpec{commonName: FrontProxyClientName, client: true}, c.frontCA); err != nil {
		return err
	}
	saKey, err := newKey()
	if err != nil {
		return err
	}
	saKeyPEM, err := encodeKey(saKey)
	if err != nil {
		return err
	}
	c.caPEM = servingCA.certPEM

	if c.adminToken, err = randomToken(); err != nil {
		return err
	}
	var tokens strings.Builder
	fmt.Fprintf(&tokens, "%s,%s,%s,\"system:masters\"\n", c.adminToken, AdminUser, AdminUser)
	c.userTokens = make(map[string]userToken)
	for _, u := range c.opts.users {
		if _, dup := c.userTokens[u.Name]; dup || u.Name == AdminUser {
			return fmt.Errorf("WithUsers: user %q given twice", u.Name)
		}
		tok, err := randomToken()
		if err != nil {
			return err
		}
		c.userTokens[u.Name] = userToken{token: tok, groups: slices.Clone(u.Groups)}
		fmt.Fprintf(&tokens, "%s,%s,%s,\"%s\"\n", tok, u.Name, u.Name, strings.Join(u.Groups, ","))
	}

	files := map[string][]byte{
		"serving-ca.crt":         servingCA.certPEM,
		"serving.crt":            serving.certPEM,
		"serving.key":            serving.keyPEM,
		"client-ca.crt":          c.clientCA.certPEM,
		"front-proxy-ca.crt":     c.frontCA.certPEM,
		"front-proxy-client.crt": c.frontCert.certPEM,
		"front-proxy-client.key": c.frontCert.keyPEM,
		"service-account.key":    saKeyPEM,
		"tokens.csv":             []byte(tokens.String()),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(c.dir, name), data, 0o600); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return nil
}

// startEtcd starts etcd on free ports and waits for /health, retrying with
// new ports if a port was taken between choosing and binding it.
func (c *Cluster) startEtcd() error {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		ports, err := freePorts(2)
		if err != nil {
			return err
		}
		clientURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
		peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
		// A name of its own: readiness asks etcd for it, so an etcd of
		// another cluster that took the port first (ours then fails to
		// bind and has not exited yet) is never taken for ours.
		name := "testcluster-" + strings.ToLower(rand.Text()[:12])
		args := []string{
			"--name=" + name,
			"--data-dir=" + filepath.Join(c.dir, "etcd-data"),
			"--listen-client-urls=" + clientURL,
			"--advertise-client-urls=" + clientURL,
			"--listen-peer-urls=" + peerURL,
			"--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=" + name + "=" + peerURL,
			"--initial-cluster-state=new",
		}
		if etcdSupportsNoFsync(c.etcdBin) {
			// Durability is irrelevant for a throw-away test cluster.
			args = append(args, "--unsafe-no-fsync")
		}
		p, err := startProcess("etcd", c.etcdBin, args, c.etcdLog)
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.etcd = p
		c.mu.Unlock()
		if lastErr = c.waitEtcdReady(p, clientURL, name); lastErr == nil {
			c.etcdURL, c.etcdArgs = clientURL, args
			return nil
		}
		if !p.exited() || !strings.Contains(tail(c.etcdLog, logTailLines), "address already in use") {
			return lastErr
		}
		// Lost a race for a port: the data dir is still empty of a
		// running member, start over with new ports.
		_ = os.RemoveAll(filepath.Join(c.dir, "etcd-data"))
	}
	return lastErr
}

// startAPIServerFreshPort picks a port, starts kube-apiserver and waits for
// readiness, retrying with another port if it was taken meanwhile.
func (c *Cluster) startAPIServerFreshPort() error {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		ports, err := freePorts(1)
		if err != nil {
			return err
		}
		c.apiPort = ports[0]
		c.host = "https://127.0.0.1:" + strconv.Itoa(c.apiPort)
		c.apiArgs = c.apiServerArgs()
		p, err := startProcess("kube-apiserver", c.kubeAPIServerBin, c.apiArgs, c.apiLog)
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.apiserver = p
		c.mu.Unlock()
		if lastErr = c.waitAPIServerReady(p); lastErr == nil {
			return nil
		}
		if !p.exited() || !strings.Contains(tail(c.apiLog, logTailLines), "address already in use") {
			return lastErr
		}
	}
	return lastErr
}

// apiServerArgs returns the kube-apiserver command line.
func (c *Cluster) apiServerArgs() []string {
	f := func(name string) string { return filepath.Join(c.dir, name) }
	args := []string{
		"--bind-address=127.0.0.1",
		// Without an explicit advertise address the server looks for the
		// host's default route, which a sandbox may not have.
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(c.apiPort),
		"--etcd-servers=" + c.etcdURL,
		"--cert-dir=" + f("apiserver-certs"),
		"--tls-cert-file=" + f("serving.crt"),
		"--tls-private-key-file=" + f("serving.key"),
		"--client-ca-file=" + f("client-ca.crt"),
		"--token-auth-file=" + f("tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + f("service-account.key"),
		"--service-account-signing-key-file=" + f("service-account.key"),
		"--service-cluster-ip-range=" + serviceClusterIPRange,
		// The "kubernetes" Service would get an Endpoints object with the
		// advertise address, and loopback addresses are invalid there.
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		// Watches (informers of the code under test) would otherwise hold
		// a graceful stop open for 60 s, past the harness's stop timeout.
		"--shutdown-watch-termination-grace-period=2s",
		// Aggregation (front proxy).
		"--requestheader-client-ca-file=" + f("front-proxy-ca.crt"),
		"--requestheader-allowed-names=" + FrontProxyClientName,
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-username-headers=X-Remote-User",
		"--proxy-client-cert-file=" + f("front-proxy-client.crt"),
		"--proxy-client-key-file=" + f("front-proxy-client.key"),
		// Proxy to the Service's endpoints rather than its ClusterIP, which
		// is unreachable here; see the package documentation.
		"--enable-aggregator-routing=true",
	}
	return append(args, c.opts.apiServerFlags...)
}

// waitEtcdReady polls etcd's /health until it reports healthy, then asks
// the member list (etcd's gRPC gateway) for name: the etcd that answers on
// clientURL must be the one this cluster started.
func (c *Cluster) waitEtcdReady(p *process, clientURL, name string) error {
	client := &http.Client{Timeout: 2 * time.Second}
	return poll(c.opts.startTimeout, p, func(ctx context.Context) error {
		body, err := get(ctx, client, clientURL+"/health")
		if err != nil {
			return err
		}
		if !strings.Contains(body, `"health":"true"`) {
			return fmt.Errorf("etcd /health: %s", body)
		}
		members, err := post(ctx, client, clientURL+"/v3/cluster/member/list", "{}")
		if err != nil {
			return err
		}
		if !strings.Contains(members, `"name":"`+name+`"`) {
			return fmt.Errorf("the etcd on %s is not this cluster's (no member %q): %s", clientURL, name, members)
		}
		return nil
	})
}

// waitAPIServerReady polls /readyz with the admin credentials until it
// returns 200 "ok".
func (c *Cluster) waitAPIServerReady(p *process) error {
	client, err := rest.HTTPClientFor(c.Config())
	if err != nil {
		return fmt.Errorf("build admin HTTP client: %w", err)
	}
	client.Timeout = 2 * time.Second
	defer client.CloseIdleConnections()
	return poll(c.opts.startTimeout, p, func(ctx context.Context) error {
		_, err := get(ctx, client, c.host+"/readyz")
		return err
	})
}

// poll calls check every 100 ms until it succeeds, the process exits, or
// timeout passes.
func poll(timeout time.Duration, p *process, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		// A check cut short by the timeout says less than the one before.
		if ctx.Err() == nil || lastErr == nil {
			lastErr = err
		}
		select {
		case <-p.done:
			return fmt.Errorf("waiting for %s to become ready: %w", p.name, p.exitError())
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %w", p.name, timeout, lastErr)
		case <-tick.C:
		}
	}
}

// get fetches url and returns its body, or an error for a non-200 status.
func get(ctx context.Context, client *http.Client, url string) (string, error) {
	return do(ctx, client, http.MethodGet, url, "")
}

// post sends body (JSON) to url and returns the answer's body, or an error
// for a non-200 status.
func post(ctx context.Context, client *http.Client, url, body string) (string, error) {
	return do(ctx, client, http.MethodPost, url, body)
}

// do sends one request and returns the body of a 200 answer.
func do(ctx context.Context, client *http.Client, method, url, reqBody string) (string, error) {
	var rb io.Reader
	if reqBody != "" {
		rb = strings.NewReader(reqBody)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rb)
	if err != nil {
		return "", fmt.Errorf("build request for %s: %w", url, err)
	}
	if reqBody != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return "", fmt.Errorf("%s %s: read body: %w", method, url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s %s: %s: %s", method, url, resp.Status, strings.TrimSpace(string(body)))
	}
	return string(body), nil
}

// freePorts returns n distinct TCP ports that were free on 127.0.0.1 a moment
// ago. The listeners are held open until all n are chosen so they differ.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

var noFsync sync.Map // etcd binary path -> bool

// etcdSupportsNoFsync reports whether the etcd binary knows --unsafe-no-fsync
// (etcd >= 3.5), by looking at its --help output once per binary.
func etcdSupportsNoFsync(bin string) bool {
	if v, ok := noFsync.Load(bin); ok {
		return v.(bool)
	}
	out, _ := exec.Command(bin, "--help").CombinedOutput()
	ok := strings.Contains(string(out), "--unsafe-no-fsync")
	noFsync.Store(bin, ok)
	return ok
}

// findBinDir returns the directory holding kube-apiserver and etcd: $EVERCERT_KUBE_BIN,
// or the first hack/tools/bin found walking up from the working directory.
func findBinDir() (string, error) {
	const hint = "run hack/install-kube.sh from the repository root to build them, or set " +
		EnvKubeBin + " to a directory containing kube-apiserver and etcd"
	if dir := os.Getenv(EnvKubeBin); dir != "" {
		if err := hasBinaries(dir); err != nil {
			return "", fmt.Errorf("%s=%s: %w; %s", EnvKubeBin, dir, err, hint)
		}
		return dir, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("get working directory: %w", err)
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "hack", "tools")); err == nil {
			bin := filepath.Join(d, "hack", "tools", "bin")
			if err := hasBinaries(bin); err != nil {
				return "", fmt.Errorf("control-plane binaries missing: %w; %s", err, hint)
			}
			return bin, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no hack/tools/bin found above %s and %s is unset; %s", wd, EnvKubeBin, hint)
		}
	}
}

// hasBinaries checks that dir holds executable kube-apiserver and etcd files.
func hasBinaries(dir string) error {
	for _, name := range []string{"kube-apiserver", "etcd"} {
		p := filepath.Join(dir, name)
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
			return fmt.Errorf("%s is not an executable file", p)
		}
	}
	return nil
}

// validateUser rejects names the token CSV file cannot represent.
func validateUser(u User) error {
	bad := func(s string) bool { return strings.ContainsAny(s, ",\"\n\r") }
	if u.Name == "" || bad(u.Name) {
		return fmt.Errorf("WithUsers: invalid user name %q", u.Name)
	}
	for _, g := range u.Groups {
		if g == "" || bad(g) {
			return fmt.Errorf("WithUsers: user %q: invalid group %q", u.Name, g)
		}
	}
	return nil
}

// sameSet reports whether a and b contain the same strings, ignoring order
// and duplicates.
func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}
