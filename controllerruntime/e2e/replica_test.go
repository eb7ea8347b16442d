//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	evercert "github.com/evercert/evercert/controllerruntime"
	"github.com/evercert/evercert/internal/backoff"
)

// replica is one operator process. Its output goes to a file in the test's
// temporary directory, printed when the test fails.
type replica struct {
	*backend
	bin     string
	args    []string // without the ports (portArgs)
	logPath string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan error // receives the exit once, then is closed
	last   *run       // the last start
	// running is last, for the probe, which must not wait on mu (stop
	// holds it for up to 30 s).
	running atomic.Pointer[run]
	starts  int
	// portRetries counts the starts on new ports after a lost race for
	// one (see retryLostPort).
	portRetries int

	// The ports, chosen free (freePorts) and changed only by retryLostPort.
	portMu                              sync.Mutex
	webhookPort, metricsPort, probePort int

	// refusals counts the probes the replica answered with a failed
	// check (not timeouts), which TestE2EOperatorSteadyState asserts
	// none of during its measurement whatever the failure threshold.
	refusals atomic.Int64

	// notReady is the last failed probe (a /readyz body, or the probe's
	// error) and when, for failure messages.
	notReadyMu sync.Mutex
	notReady   string
}

// freePorts returns n distinct TCP ports that were free on 127.0.0.1 a
// moment ago: the listeners are held until all n are chosen, so they
// differ (closed one by one, 9 ports chosen this way were two the same in
// 0.5% of tries here). Another process may still take one before the
// operator binds it: see retryLostPort.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("free port: %v", err)
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// newReplica returns replica id of bin, not started, on ports (its
// webhook, metrics and probe ports, from freePorts: the caller picks those
// of all its replicas in one call, so that no two are the same).
func newReplica(t *testing.T, bin, id string, ports []int, args ...string) *replica {
	r := &replica{bin: bin, logPath: t.TempDir() + "/" + id + ".log"}
	r.backend = &backend{name: id}
	r.setPorts(ports)
	r.args = append([]string{"--replica-id=" + id, "--webhook-host=127.0.0.1"}, args...)
	t.Cleanup(func() {
		r.stop(t)
		if t.Failed() {
			t.Logf("replica %s log (last 60 lines):\n%s", id, tailFile(r.logPath, 60))
		}
	})
	return r
}

// run is one start of the replica's process.
type run struct {
	// gone is closed when the process has exited; err is its exit, set
	// before.
	gone chan struct{}
	err  error
	// logFrom is where this start's output begins in the log.
	logFrom int64
}

// pickPorts chooses the replica's three ports (freePorts) and points its
// backend at the webhook port.
func (r *replica) pickPorts(t *testing.T) {
	t.Helper()
	r.setPorts(freePorts(t, 3))
}

// setPorts sets the replica's webhook, metrics and probe ports to p and
// points its backend at the webhook port.
func (r *replica) setPorts(p []int) {
	webhook, metrics, probe := p[0], p[1], p[2]
	r.portMu.Lock()
	r.webhookPort, r.metricsPort, r.probePort = webhook, metrics, probe
	r.portMu.Unlock()
	r.backend.setAddr(net.JoinHostPort("127.0.0.1", strconv.Itoa(webhook)))
}

// ports returns the replica's webhook, metrics and probe ports.
func (r *replica) ports() (webhook, metrics, probe int) {
	r.portMu.Lock()
	defer r.portMu.Unlock()
	return r.webhookPort, r.metricsPort, r.probePort
}

// portArgs are the operator's flags for the replica's ports.
func (r *replica) portArgs() []string {
	webhook, metrics, probe := r.ports()
	return []string{
		"--webhook-port=" + strconv.Itoa(webhook),
		"--metrics-bind-address=127.0.0.1:" + strconv.Itoa(metrics),
		"--health-probe-bind-address=127.0.0.1:" + strconv.Itoa(probe),
	}
}

// start runs the operator binary; it dies with the test process
// (Pdeathsig).
func (r *replica) start(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	out, err := os.OpenFile(r.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatalf("replica %s: %v", r.name, err)
	}
	from, err := out.Seek(0, io.SeekEnd)
	if err != nil {
		out.Close()
		t.Fatalf("replica %s: %v", r.name, err)
	}
	fmt.Fprintf(out, "=== start %d\n", r.starts)
	cmd := exec.Command(r.bin, append(r.portArgs(), r.args...)...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		t.Fatalf("starting replica %s: %v", r.name, err)
	}
	exited, this := make(chan error, 1), &run{gone: make(chan struct{}), logFrom: from}
	go func() {
		err := cmd.Wait()
		out.Close()
		this.err = err
		close(this.gone)
		exited <- err
		close(exited)
	}()
	r.cmd, r.exited, r.last = cmd, exited, this
	r.running.Store(this)
	r.starts++
}

// maxPortRetries bounds the starts on new ports (retryLostPort), as
// testcluster bounds its own for etcd and kube-apiserver.
const maxPortRetries = 3

// retryLostPort checks the process of the replica's last start: still
// running, it does nothing. Gone because a port it was given was taken
// between freePorts choosing it and the operator binding it (another test's
// process, the sibling test's cluster or replicas, any listener on the
// machine: "address already in use" in that start's log), it is started
// again on new ports, at most maxPortRetries times. Gone for any other
// reason (or too often), the test fails at once with the start's log,
// rather than waiting for a readiness that cannot come.
func (r *replica) retryLostPort(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	last, stopped, retries, starts := r.last, r.cmd == nil, r.portRetries, r.starts
	r.mu.Unlock()
	if last == nil || stopped {
		return // not started, or killed or stopped by the test
	}
	select {
	case <-last.gone:
	default:
		return
	}
	log := logSince(r.logPath, last.logFrom)
	if !strings.Contains(log, "address already in use") || retries >= maxPortRetries {
		t.Fatalf("replica %s exited (%v) at its start %d, before the test stopped it; its log from that start:\n%s", r.name, last.err, starts-1, tailLines(log, 60))
	}
	webhook, metrics, probe := r.ports()
	r.pickPorts(t)
	r.mu.Lock()
	r.portRetries++
	r.cmd = nil
	r.mu.Unlock()
	t.Logf("replica %s lost a port to another process before binding it (webhook %d, metrics %d, probe %d: address already in use); starting it again on new ports", r.name, webhook, metrics, probe)
	r.start(t)
}

// kill sends SIGKILL and waits for the process to be gone.
func (r *replica) kill(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL to replica %s: %v", r.name, err)
	}
	<-r.exited
	r.cmd = nil
}

// stop sends SIGTERM and expects a clean exit (status 0) within 30 s, the
// kubelet's default terminationGracePeriodSeconds.
func (r *replica) stop(t *testing.T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-r.exited:
		if err != nil {
			t.Errorf("replica %s did not exit cleanly on SIGTERM: %v", r.name, err)
		}
	case <-time.After(30 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.exited
		t.Errorf("replica %s did not exit within 30s of SIGTERM", r.name)
	}
	r.cmd = nil
}

var probeClient = &http.Client{Timeout: 2 * time.Second}

// get returns the body of an HTTP GET on one of the replica's plain-HTTP
// ports, and whether it answered 200.
func (r *replica) get(ctx context.Context, port int, path string) (string, bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(port)+path, nil)
	if err != nil {
		return err.Error(), false
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return err.Error(), false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body), resp.StatusCode == http.StatusOK
}

// probe keeps routable equal to the replica's readiness (/readyz), every
// 200 ms, until ctx is done: the kubelet's readiness probe and the
// EndpointSlice controller in one. As the kubelet does with its default
// failureThreshold, one success makes the replica routable and three
// failures in a row take it out: a probe that times out once on a
// loaded machine is not an outage of the replica.
func (r *replica) probe(ctx context.Context) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	failures := 0
	for {
		_, _, probePort := r.ports()
		if last := r.running.Load(); last != nil && last.exited() {
			// A container that exits makes its pod NotReady at once, with
			// no probe: its ports may meanwhile answer for another
			// process (one that took a port it lost, see retryLostPort).
			failures = probeFailureThreshold
			r.routable.Store(false)
			r.notReadyMu.Lock()
			r.notReady = time.Now().Format("15:04:05.000") + " process exited: " + fmt.Sprint(last.err)
			r.notReadyMu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			continue
		}
		body, ok := r.get(ctx, probePort, "/readyz")
		if !ok && ctx.Err() == nil && strings.Contains(body, "[-]") {
			// An answer that names a failed check (not a timeout or a
			// refused connection, which a loaded machine makes): the
			// replica itself said it is not ready.
			r.refusals.Add(1)
		}
		switch {
		case ok:
			failures = 0
			r.routable.Store(true)
		case ctx.Err() != nil:
		default:
			failures++
			reason := strings.TrimSpace(body)
			if strings.Contains(body, "reason withheld") {
				// controller-runtime's /readyz names a failed check but
				// withholds its error; the check's own path gives it.
				detail, _ := r.get(ctx, probePort, "/readyz/"+evercert.CheckName)
				reason += " (/readyz/" + evercert.CheckName + ": " + strings.TrimSpace(detail) + ")"
			}
			r.notReadyMu.Lock()
			r.notReady = time.Now().Format("15:04:05.000") + " " + reason
			r.notReadyMu.Unlock()
			if failures >= probeFailureThreshold {
				r.routable.Store(false)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// exited reports whether the process of this start has exited.
func (s *run) exited() bool {
	select {
	case <-s.gone:
		return true
	default:
		return false
	}
}

// scrapeAttempts bounds the tries of one /metrics scrape.
const scrapeAttempts = 4

// probeFailureThreshold is the kubelet's default failureThreshold.
const probeFailureThreshold = 3

// lastNotReady returns the last failed probe and when, or "".
func (r *replica) lastNotReady() string {
	r.notReadyMu.Lock()
	defer r.notReadyMu.Unlock()
	return r.notReady
}

// restRequests returns the replica's rest_client_requests_total (every
// request its Kubernetes clients sent, as controller-runtime's metrics
// endpoint exposes client-go's counter), in total and by method.
func (r *replica) restRequests(ctx context.Context) (float64, map[string]float64, error) {
	// A scrape that times out on a loaded machine is tried again, as
	// Prometheus would at its next interval; the counters lose nothing.
	var body string
	var ok bool
	retry := backoff.New(500*time.Millisecond, 4*time.Second)
	for attempt := 1; ; attempt++ {
		_, metricsPort, _ := r.ports()
		if body, ok = r.get(ctx, metricsPort, "/metrics"); ok || attempt == scrapeAttempts {
			break
		}
		select {
		case <-ctx.Done():
			return 0, nil, fmt.Errorf("replica %s /metrics: %w (last answer: %s)", r.name, ctx.Err(), body)
		case <-time.After(retry.Next(nil)):
		}
	}
	if !ok {
		return 0, nil, fmt.Errorf("replica %s /metrics: %s", r.name, body)
	}
	var total float64
	byMethod := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "rest_client_requests_total{") {
			continue
		}
		labels, value, ok := strings.Cut(line[len("rest_client_requests_total{"):], "} ")
		if !ok {
			return 0, nil, fmt.Errorf("replica %s /metrics: cannot parse %q", r.name, line)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return 0, nil, fmt.Errorf("replica %s /metrics: %q: %w", r.name, line, err)
		}
		total += v
		for l := range strings.SplitSeq(labels, ",") {
			if m, ok := strings.CutPrefix(l, `method="`); ok {
				byMethod[strings.TrimSuffix(m, `"`)] += v
			}
		}
	}
	return total, byMethod, nil
}

func tailFile(path string, n int) string {
	return tailLines(logSince(path, 0), n)
}

// logSince returns the file at path from offset from on (its error's text
// if it cannot be read).
func logSince(path string, from int64) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return string(b[min(from, int64(len(b))):])
}

// tailLines returns the last n lines of s.
func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
