package authority

import (
	"context"
	"crypto/x509"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

// flappingObserver confirms and withdraws at random, notifying each time.
type flappingObserver struct {
	listeners
	ok atomic.Bool
}

func (o *flappingObserver) Name() string                    { return "flapping" }
func (o *flappingObserver) Observed(*x509.Certificate) bool { return o.ok.Load() }
func (o *flappingObserver) flip() {
	o.ok.Store(!o.ok.Load())
	o.notify()
}

// hammer calls every read method of p, RunOnce and AddObserver from
// several goroutines until stop is closed.
func hammer(t *testing.T, p interface {
	Status() RotationStatus
	Leaf() *x509.Certificate
	CurrentCertKeyContent() ([]byte, []byte)
	CurrentCABundleContent() []byte
	VerifyOptions() (x509.VerifyOptions, bool)
	RenewAt() time.Time
	LastError() error
	RunOnce(context.Context) error
	AddObserver(Observer)
}, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				st := p.Status()
				if st.Successor != nil {
					_ = append(st.Successor.Pending, "mutating the copy is mine")
				}
				_ = p.Leaf()
				cert, key := p.CurrentCertKeyContent()
				if cert != nil && key == nil {
					t.Error("a certificate without its key")
				}
				_ = p.CurrentCABundleContent()
				_, _ = p.VerifyOptions()
				_ = p.RenewAt()
				_ = p.LastError()
				_ = RotationCheck(p.(RotationReporter)).Check(nil)
				if g == 0 && i%50 == 0 {
					_ = p.RunOnce(context.Background())
				}
				if g == 1 && i == 10 {
					p.AddObserver(&testObserver{}) // pending until the end: never confirms
				}
				runtime.Gosched()
			}
		})
	}
	return &wg
}

// TestAttackConcurrentReadersAndOrder runs SelfSigned and a two-replica
// Authority through several CA lifetimes on real Run loops while other
// goroutines read everything, call RunOnce and add observers, and an
// observer flaps. With -race, nothing may race; Run must return after its
// context ends and leave no goroutine behind.
func TestAttackConcurrentReadersAndOrder(t *testing.T) {
	runtime.GC()
	baseline := runtime.NumGoroutine()
	func() {
		clk := clocktesting.NewFakeClock(testNow)
		flap := &flappingObserver{}
		ss, err := NewSelfSigned(SelfSignedConfig{Name: "attack-concurrent-ss", Lifetime: time.Hour, Clock: clk, Observers: []Observer{flap}})
		require.NoError(t, err)
		client := fake.NewClientset()
		optimistic(client)
		mk := func(id string) *Authority {
			a, err := New(Config{
				Name: "attack-concurrent-" + id, Namespace: "ns", SecretName: "ca", Client: client, ReplicaID: id,
				Hosts: []string{"localhost"}, Lifetime: time.Hour, Clock: clk, LeaseDuration: 15 * time.Second,
				Observers: []Observer{flap},
			})
			require.NoError(t, err)
			return a
		}
		a, b := mk("a"), mk("b")
		// Status and RunOnce before Run: the order is part of the attack.
		assert.Zero(t, a.Status().Signing.Serial)
		require.NoError(t, RotationCheck(a).Check(nil))
		require.NoError(t, a.RunOnce(context.Background()))

		ctx, cancel := context.WithCancel(context.Background())
		var runs sync.WaitGroup
		for _, run := range []func(context.Context, int){ss.Run, a.Run, b.Run, b.Run} { // b twice
			runs.Go(func() { run(ctx, 1) })
		}
		stop := make(chan struct{})
		readers := []*sync.WaitGroup{hammer(t, ss, stop), hammer(t, a, stop), hammer(t, b, stop)}
		var flapper sync.WaitGroup
		flapper.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					flap.flip()
					time.Sleep(100 * time.Microsecond)
				}
			}
		})
		end := testNow.Add(3 * 8 * time.Hour) // three CA lifetimes
		for clk.Now().Before(end) {
			clk.Step(5 * time.Minute)
			time.Sleep(200 * time.Microsecond) // let the loops and readers interleave; nothing is asserted on it
		}
		close(stop)
		flapper.Wait()
		for _, r := range readers {
			r.Wait()
		}
		for _, p := range []interface {
			Leaf() *x509.Certificate
			CurrentCABundleContent() []byte
		}{ss, a, b} {
			// A loop may be backing off after a conflict: let time pass.
			waitFor(t, "a valid leaf at the end", func() bool {
				l := p.Leaf()
				if l != nil && verifiesAt(t, l, p.CurrentCABundleContent(), clk.Now()) == nil {
					return true
				}
				clk.Step(time.Second)
				time.Sleep(time.Millisecond)
				return false
			})
		}
		cancel()
		waitFor(t, "every Run to return", func() bool {
			done := make(chan struct{})
			go func() { runs.Wait(); close(done) }()
			select {
			case <-done:
				return true
			case <-time.After(time.Second):
				return false
			}
		})
	}()
	deadline := time.Now().Add(guard)
	for runtime.NumGoroutine() > baseline && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > baseline {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines: baseline %d, now %d:\n%s", baseline, n, buf[:runtime.Stack(buf, true)])
	}
}

// TestAttackFlappingObserverCostsNoAPICalls: an observer that notifies
// over and over (a contested caBundle target flipping back and forth) while
// no successor waits for it. Its word matters only to a waiting successor;
// each notification cost the Authority a Secret GET (994 GETs for 1000
// flips, with the clock stopped).
func TestAttackFlappingObserverCostsNoAPICalls(t *testing.T) {
	client := fake.NewClientset()
	gets := interceptSecrets(client, "get", nil)
	clk := clocktesting.NewFakeClock(testNow)
	flap := &flappingObserver{}
	a := attackAuthority(t, client, clk, "attack-flap", func(c *Config) { c.Observers = []Observer{flap} })
	runInBackground(t, a.Run)
	waitFor(t, "the first leaf", func() bool { return a.Leaf() != nil })
	waitBlocked(t, clk)
	before := gets.n.Load()
	for range 1000 {
		flap.flip()
		time.Sleep(20 * time.Microsecond) // let the loop take kicks; not a timing assertion
	}
	kickAndWait(t, a.issuer)
	assert.LessOrEqual(t, gets.n.Load()-before, int64(2), "Secret GETs for notifications nobody waits for")

	// While a successor waits, a confirmation still promotes at once.
	flap.ok.Store(false)
	succ := runToSuccessor(t, a, clk)
	clk.Step(succ.SignsNoEarlierThan.Sub(clk.Now()))
	waitBlocked(t, clk)
	require.NotNil(t, a.Status().Successor)
	flap.flip()
	waitFor(t, "promotion on the observer's word", func() bool { return a.Status().Successor == nil })
}

// TestAttackAddObserverAfterPublication: an observer added while a
// successor already waits (a caBundle publisher started late) is waited
// for from then on; the successor does not sign on the strength of the
// observers that were there before.
func TestAttackAddObserverAfterPublication(t *testing.T) {
	clk := clocktesting.NewFakeClock(testNow)
	s, err := NewSelfSigned(SelfSignedConfig{Name: "attack-late-observer", Lifetime: time.Hour, Clock: clk})
	require.NoError(t, err)
	runInBackground(t, s.Run)
	waitBlocked(t, clk)
	for s.Status().Successor == nil {
		clk.Step(time.Minute)
		waitBlocked(t, clk)
	}
	succ := s.Status().Successor
	late := &testObserver{}
	s.AddObserver(late)
	waitBlocked(t, clk)
	for clk.Now().Before(succ.SignsNoEarlierThan.Add(10 * time.Minute)) {
		clk.Step(time.Minute)
		waitBlocked(t, clk)
		require.NotNil(t, s.Status().Successor, "signed without the observer added after publication")
	}
	assert.Equal(t, []string{"test-observer"}, s.Status().Successor.Pending)
	late.set(true)
	waitFor(t, "promotion", func() bool { return s.Status().Successor == nil })
	assert.Equal(t, succ.Serial, s.Status().Signing.Serial)
}
