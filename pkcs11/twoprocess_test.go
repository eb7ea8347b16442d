package pkcs11_test

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/proctest"
	"github.com/evercert/evercert/pkcs11"
)

// The test binary re-executed with childEnv set runs a child process for
// TestKeySourceFindsKeyMadeByAnotherProcess instead of the tests (see
// TestMain): it opens and closes the token named by childTokenEnv (PIN file
// in childPINEnv) over and over until the file named by childGoEnv exists,
// then makes a key, prints "made key REF" and waits for SIGTERM. It uses the
// SoftHSM2 configuration of its parent (SOFTHSM2_CONF, inherited).
const (
	childEnv      = "EVERCERT_PKCS11_TEST_CHILD"
	childTokenEnv = "EVERCERT_PKCS11_TEST_TOKEN"
	childPINEnv   = "EVERCERT_PKCS11_TEST_PIN"
	childGoEnv    = "EVERCERT_PKCS11_TEST_GO"
)

// childMain is the child process: another replica starting on the token.
func childMain(mode string) int {
	if mode != "newkey" {
		fmt.Fprintf(os.Stderr, "%s=%q: unknown child mode\n", childEnv, mode)
		return 2
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	ks, err := pkcs11.New(pkcs11.Config{TokenLabel: os.Getenv(childTokenEnv), PINFile: os.Getenv(childPINEnv)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer ks.Close()
	// Until the parent says go, restart over and over: every start logs in,
	// and every login rewrites the token's token.object, which B's process
	// reads whenever one of its sources opens the token. Then make a key.
	fmt.Println("restarting until " + os.Getenv(childGoEnv))
	for {
		select {
		case <-term:
			return 0
		default:
		}
		if _, err := os.Stat(os.Getenv(childGoEnv)); err == nil {
			break
		}
		_, _ = ks.FindKey(context.Background(), "evercert-ca-restarting") // opens the token and logs in
		_ = ks.Close()
	}
	// A start that meets B's can fail (its read of the token's flags met
	// B's login, which rewrites them): the Authority retries, with backoff,
	// and so does the child, for as long as the KeySource's backoff may
	// make it wait.
	var ref string
	for deadline := time.Now().Add(time.Minute); ; {
		if _, ref, err = ks.NewKey(context.Background(), dynamiccert.ECDSAP256); err == nil {
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintln(os.Stderr, "making a key:", err)
			return 1
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Println("made key " + ref)
	<-term
	return 0
}

// TestKeySourceFindsKeyMadeByAnotherProcess: two replicas in separate
// processes share one token. Replica B runs, its sessions open and busy,
// while replica A restarts over and over in a process of its own and then
// makes a key; B then finds A's key.
//
// Every login rewrites the token's token.object, and SoftHSM2 2.6.1 lets
// the file go (unlocks it) before its buffered write reaches the file: a
// process that reads it then reads it empty, and if it re-reads the
// token's object list before it reads token.object again, it marks the
// token invalid and never re-reads the list: its sessions never see a new
// key (a new process does) until the library is initialized again. B's
// process reads token.object whenever a session of it opens the token
// (here a second source of B's opens it over and over: a second Authority
// in the process, or a source reopening the token after an error). The
// race does not show in every round: each round is a fresh B and a fresh
// A.
func TestKeySourceFindsKeyMadeByAnotherProcess(t *testing.T) {
	label, pin := newToken(t)
	t.Setenv(childEnv, "newkey")
	t.Setenv(childTokenEnv, label)
	t.Setenv(childPINEnv, pin)
	const rounds = 16
	var missed []string
	for round := range rounds {
		if err := findKeyOfAnotherProcess(t, label, pin); err != nil {
			missed = append(missed, fmt.Sprintf("round %d: %v", round, err))
		}
	}
	if len(missed) > 0 {
		t.Fatalf("replica B did not find the key replica A made in %d of %d rounds:\n%s", len(missed), rounds, strings.Join(missed, "\n"))
	}
}

// reopens is how often B's other sources open the token in a round while
// A restarts.
const reopens = 100

// findKeyOfAnotherProcess is one round: A starts in a child process and
// restarts over and over; B starts, makes its key and keeps its sessions
// busy; A makes a key; once both are quiet, B looks A's key up.
func findKeyOfAnotherProcess(t *testing.T, label, pin string) error {
	t.Helper()
	ctx := context.Background()
	goFile := filepath.Join(t.TempDir(), "go")
	t.Setenv(childGoEnv, goFile)
	a, _ := proctest.Start(t, os.Args[0], regexp.MustCompile(`^restarting until `))
	defer a.Terminate(t)
	// B's reopenings back off on clk, which the round steps past the
	// backoff before each attempt that matters.
	clk := clocktesting.NewFakeClock(testNow)
	b, err := pkcs11.New(pkcs11.Config{TokenLabel: label, PINFile: pin, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	// Closed at the end of the round: the next round's B is a fresh start,
	// as if its process had restarted.
	defer b.Close()
	// B's start meets A's restarts and may fail: like A, it retries (the
	// Authority does, with backoff).
	var own string
	for try := 0; ; try++ {
		clk.Step(time.Minute)
		if _, own, err = b.NewKey(ctx, dynamiccert.ECDSAP256); err == nil {
			break
		}
		if try == 20 {
			t.Fatalf("replica B making its key: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// B's checks and signatures: they fail at times, the checks retry.
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = b.FindKey(ctx, own)
		}
	})
	// More sources in B's process open the token over and over.
	var reopened atomic.Int64
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				b2, err := pkcs11.New(pkcs11.Config{TokenLabel: label, PINFile: pin})
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = b2.FindKey(ctx, own)
				_ = b2.Close()
				reopened.Add(1)
			}
		})
	}
	// B ran for a while as A restarted: now A makes its key.
	waitFor(t, "replica B's process to open the token again and again", nil, func() bool { return reopened.Load() >= reopens })
	if err := os.WriteFile(goFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	made := regexp.MustCompile(`(?m)^made key (\S+)$`)
	var ref string
	waitFor(t, "replica A's key", nil, func() bool {
		m := made.FindStringSubmatch(a.Output())
		if m != nil {
			ref = m[1]
		}
		return m != nil
	})
	// Both are quiet now; B's backoff allows a reopening.
	close(stop)
	wg.Wait()
	clk.Step(time.Minute)
	_, err = b.FindKey(ctx, ref)
	return err
}
