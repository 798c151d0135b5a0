package breaker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
)

// faulty is the real memory backend behind a switch the test flips: while
// failing, calls return errBackend; while hanging, they wait for their
// context.
type faulty struct {
	inner   algo.Backend
	mode    atomic.Int32 // 0 healthy, 1 failing, 2 hanging
	calls   atomic.Int32
	release chan struct{} // when set, healthy calls wait for it
}

var errBackend = errors.New("connection refused")

func (f *faulty) Decide(ctx context.Context, reqs []algo.Request, out []algo.Decision) error {
	f.calls.Add(1)
	switch f.mode.Load() {
	case 1:
		return errBackend
	case 2:
		<-ctx.Done()
		return ctx.Err()
	}
	if f.release != nil {
		<-f.release
	}
	return f.inner.Decide(ctx, reqs, out)
}

// clock is a settable clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func setup(t *testing.T) (*Breaker, *faulty, *clock, *[]string) {
	clk := &clock{now: time.Unix(1_800_000_000, 0)}
	f := &faulty{inner: memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})}
	var changes []string
	b := New(f, Options{Timeout: 20 * time.Millisecond, Failures: 3, Cooldown: time.Second, Now: clk.Now,
		OnStateChange: func(from, to State, err error) { changes = append(changes, from.String()+">"+to.String()) }})
	return b, f, clk, &changes
}

var req = []algo.Request{{Key: []byte("k"), Limit: algo.Limit{Algorithm: algo.FixedWindow, Requests: 1000, Window: time.Hour}, Hits: 1}}

func decide(b *Breaker) error {
	return b.Decide(context.Background(), req, make([]algo.Decision, 1))
}

// TestOpensAfterConsecutiveFailures walks the circuit through its states.
func TestOpensAfterConsecutiveFailures(t *testing.T) {
	b, f, clk, changes := setup(t)
	if err := decide(b); err != nil {
		t.Fatal(err)
	}
	f.mode.Store(1)
	for i := range 3 {
		if err := decide(b); !errors.Is(err, errBackend) {
			t.Fatalf("failure %d: %v, want the backend's error", i+1, err)
		}
	}
	if b.State() != Open {
		t.Fatalf("after 3 failures the circuit is %v, want open", b.State())
	}
	calls := f.calls.Load()
	for range 100 {
		if err := decide(b); !errors.Is(err, ErrOpen) {
			t.Fatalf("open circuit: %v, want ErrOpen", err)
		}
	}
	if f.calls.Load() != calls {
		t.Fatalf("an open circuit called the backend %d times", f.calls.Load()-calls)
	}

	// After the cooldown one probe goes through; it fails: open again.
	clk.Add(time.Second)
	if err := decide(b); !errors.Is(err, errBackend) {
		t.Fatalf("probe: %v, want the backend's error", err)
	}
	if b.State() != Open || f.calls.Load() != calls+1 {
		t.Fatalf("after a failed probe: %v, %d calls; want open, 1 call", b.State(), f.calls.Load()-calls)
	}
	if err := decide(b); !errors.Is(err, ErrOpen) {
		t.Fatalf("after a failed probe: %v, want ErrOpen for another cooldown", err)
	}

	// The backend recovers; the next probe closes the circuit.
	f.mode.Store(0)
	clk.Add(time.Second)
	if err := decide(b); err != nil {
		t.Fatalf("probe of a healthy backend: %v", err)
	}
	if b.State() != Closed {
		t.Fatalf("after a good probe the circuit is %v, want closed", b.State())
	}
	want := []string{"closed>open", "open>half-open", "half-open>open", "open>half-open", "half-open>closed"}
	if len(*changes) != len(want) {
		t.Fatalf("state changes %v, want %v", *changes, want)
	}
	for i := range want {
		if (*changes)[i] != want[i] {
			t.Fatalf("state changes %v, want %v", *changes, want)
		}
	}
	st := b.Stats()
	if st.Opens != 2 || st.Errors != 4 || st.Rejected != 101 {
		t.Errorf("stats %+v, want 2 opens, 4 errors, 101 rejected", st)
	}
}

// TestSuccessResetsTheCount: failures must be consecutive to open it.
func TestSuccessResetsTheCount(t *testing.T) {
	b, f, _, _ := setup(t)
	for range 5 {
		f.mode.Store(1)
		decide(b)
		decide(b)
		f.mode.Store(0)
		if err := decide(b); err != nil {
			t.Fatal(err)
		}
	}
	if b.State() != Closed {
		t.Fatalf("two failures between successes opened the circuit")
	}
}

// TestOneProbeAtATime: while the probe is out, other calls fail at once.
func TestOneProbeAtATime(t *testing.T) {
	b, f, clk, _ := setup(t)
	f.mode.Store(1)
	for range 3 {
		decide(b)
	}
	f.mode.Store(0)
	f.release = make(chan struct{})
	clk.Add(time.Second)
	probeDone := make(chan error)
	go func() { probeDone <- decide(b) }()
	for f.calls.Load() != 4 {
		time.Sleep(time.Millisecond) // until the probe is inside the backend
	}
	if b.State() != HalfOpen {
		t.Fatalf("with the probe out the circuit is %v, want half-open", b.State())
	}
	for range 10 {
		if err := decide(b); !errors.Is(err, ErrOpen) {
			t.Fatalf("call during the probe: %v, want ErrOpen", err)
		}
	}
	close(f.release)
	if err := <-probeDone; err != nil {
		t.Fatal(err)
	}
	if b.State() != Closed {
		t.Fatalf("after the probe: %v", b.State())
	}
}

// TestTimeout: a hanging backend is cut off at the timeout, counted as a
// failure and a timeout.
func TestTimeout(t *testing.T) {
	b, f, _, _ := setup(t)
	f.mode.Store(2)
	err := decide(b)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hanging backend: %v, want a deadline error", err)
	}
	if st := b.Stats(); st.Timeouts != 1 || st.Errors != 1 {
		t.Errorf("stats %+v, want 1 timeout counted as an error", st)
	}
}

// TestCallerCancelIsNotAFailure: the caller giving up says nothing about
// the backend.
func TestCallerCancelIsNotAFailure(t *testing.T) {
	b, f, _, _ := setup(t)
	f.mode.Store(2)
	for range 10 {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := b.Decide(ctx, req, make([]algo.Decision, 1)); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled call: %v", err)
		}
	}
	if b.State() != Closed || b.Stats().Errors != 0 {
		t.Fatalf("cancelled calls changed the circuit: %v, %+v", b.State(), b.Stats())
	}
}
