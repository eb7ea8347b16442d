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
	"syscall"
	"testing"
	"time"
)

// replica is one operator process. Its output goes to a file in the test's
// temporary directory, printed when the test fails.
type replica struct {
	*backend
	bin                                 string
	args                                []string
	webhookPort, metricsPort, probePort int
	logPath                             string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan error // receives the exit once, then is closed
	starts int

	// notReady is the last failed probe (a /readyz body, or the probe's
	// error) and when, for failure messages.
	notReadyMu sync.Mutex
	notReady   string
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func newReplica(t *testing.T, bin, id string, args ...string) *replica {
	r := &replica{
		bin: bin, webhookPort: freePort(t), metricsPort: freePort(t), probePort: freePort(t),
		logPath: t.TempDir() + "/" + id + ".log",
	}
	r.backend = &backend{name: id, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(r.webhookPort))}
	r.args = append([]string{
		"--replica-id=" + id,
		"--webhook-host=127.0.0.1", "--webhook-port=" + strconv.Itoa(r.webhookPort),
		"--metrics-bind-address=127.0.0.1:" + strconv.Itoa(r.metricsPort),
		"--health-probe-bind-address=127.0.0.1:" + strconv.Itoa(r.probePort),
	}, args...)
	t.Cleanup(func() {
		r.stop(t)
		if t.Failed() {
			t.Logf("replica %s log (last 60 lines):\n%s", id, tailFile(r.logPath, 60))
		}
	})
	return r
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
	fmt.Fprintf(out, "=== start %d\n", r.starts)
	cmd := exec.Command(r.bin, r.args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		t.Fatalf("starting replica %s: %v", r.name, err)
	}
	exited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		out.Close()
		exited <- err
		close(exited)
	}()
	r.cmd, r.exited = cmd, exited
	r.starts++
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
		body, ok := r.get(ctx, r.probePort, "/readyz")
		switch {
		case ok:
			failures = 0
			r.routable.Store(true)
		case ctx.Err() != nil:
		default:
			failures++
			r.notReadyMu.Lock()
			r.notReady = time.Now().Format("15:04:05.000") + " " + strings.TrimSpace(body)
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
	for attempt := range 5 {
		if body, ok = r.get(ctx, r.metricsPort, "/metrics"); ok || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Duration(attempt+1) * time.Second)
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
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
