package breaker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
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

func setup(t *testing.T) (*Breaker, *faulty, *clocktest.Clock, *[]string) {
	clk := clocktest.New(time.Unix(1_800_000_000, 0))
	f := &faulty{inner: memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})}
	var changes []string
	b := New(f, Options{Timeout: 20 * time.Millisecond, Failures: 3, Cooldown: time.Second, Now: clk.Now,
		OnStateChange: func(_ string, from, to State, err error) { changes = append(changes, from.String()+">"+to.String()) }})
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
	clk.Advance(time.Second)
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
	clk.Advance(time.Second)
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
	clk.Advance(time.Second)
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

// TestAReplyIsNotATimeout: an error the backend answered is reported as
// it was given, even when it arrived after the deadline (a loaded
// machine), and only a deadline that passed is reported as a timeout.
func TestAReplyIsNotATimeout(t *testing.T) {
	oom := errors.New("OOM command not allowed when used memory > 'maxmemory'.")
	late := &replying{err: oom, after: 40 * time.Millisecond}
	b := New(late, Options{Timeout: 20 * time.Millisecond})
	err := b.Decide(context.Background(), req, make([]algo.Decision, 1))
	if !errors.Is(err, oom) || strings.Contains(err.Error(), "did not answer") {
		t.Errorf("a late OOM reply: %v; want it as Redis gave it", err)
	}
	if st := b.Stats(); st.Timeouts != 0 || st.Errors != 1 {
		t.Errorf("stats %+v, want 1 error and no timeout", st)
	}
	late.err = fmt.Errorf("read tcp 127.0.0.1:1->127.0.0.1:2: %w", os.ErrDeadlineExceeded)
	err = b.Decide(context.Background(), req, make([]algo.Decision, 1))
	if !strings.Contains(err.Error(), "did not answer within 20ms") {
		t.Errorf("a socket deadline: %v; want it reported as a timeout", err)
	}
}

// replying answers err after a delay that ignores the context.
type replying struct {
	err   error
	after time.Duration
}

func (r *replying) Decide(ctx context.Context, reqs []algo.Request, out []algo.Decision) error {
	time.Sleep(r.after)
	return r.err
}

// nodes is a backend of nodes: a request's node is its key up to the
// first ':'. Each node can be made to fail; healthy nodes decide with a
// real memory backend.
type nodes struct {
	inner   algo.Backend
	failing map[string]bool
	sent    map[string]int // calls that reached each node
}

func (n *nodes) Decide(ctx context.Context, reqs []algo.Request, out []algo.Decision) error {
	return errors.New("nodes: Decide called instead of DecideVia")
}

func (n *nodes) DecideVia(ctx context.Context, g Gate, reqs []algo.Request, out []algo.Decision) error {
	var names []string
	for _, r := range reqs {
		name, _, _ := strings.Cut(string(r.Key), ":")
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	if err := g.Admit(names); err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		n.sent[name]++
		if n.failing[name] {
			err := fmt.Errorf("node %s: connection refused", name)
			g.Done(name, err)
			errs = append(errs, err)
			continue
		}
		g.Done(name, nil)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return n.inner.Decide(ctx, reqs, out)
}

func nodeReq(keys ...string) []algo.Request {
	reqs := make([]algo.Request, len(keys))
	for i, k := range keys {
		reqs[i] = req[0]
		reqs[i].Key = []byte(k)
	}
	return reqs
}

// TestACircuitPerNode: a node that keeps failing opens its own circuit
// only; calls for other nodes go on; a call that needs an open node is
// refused whole, sending nothing to any node; the probe, the log of state
// changes and the counters name the node; a node no call asks for is
// forgotten.
func TestACircuitPerNode(t *testing.T) {
	clk := clocktest.New(time.Unix(1_800_000_000, 0))
	n := &nodes{inner: memory.New(memory.Options{Now: clk.Now, SweepInterval: -1}), failing: map[string]bool{"a": true}, sent: map[string]int{}}
	var changes []string
	b := New(n, Options{Failures: 3, Cooldown: time.Second, Now: clk.Now,
		OnStateChange: func(node string, from, to State, err error) {
			changes = append(changes, node+":"+from.String()+">"+to.String())
		}})
	call := func(keys ...string) error {
		reqs := nodeReq(keys...)
		return b.Decide(context.Background(), reqs, make([]algo.Decision, len(reqs)))
	}
	for range 3 {
		if err := call("a:k"); err == nil {
			t.Fatal("a failing node's call succeeded")
		}
		if err := call("b:k"); err != nil {
			t.Fatalf("a healthy node's call: %v", err)
		}
	}
	if b.State() != Open {
		t.Fatalf("after node a failed 3 times the breaker's state is %v, want open", b.State())
	}
	for range 10 {
		if err := call("b:k", "c:k"); err != nil {
			t.Fatalf("with node a open, a call for nodes b and c: %v", err)
		}
	}
	sent := maps.Clone(n.sent)
	err := call("b:k", "a:k")
	var open *OpenError
	if !errors.Is(err, ErrOpen) || !errors.As(err, &open) || open.Node != "a" {
		t.Fatalf("a call needing node a, open: %v; want an OpenError for a", err)
	}
	if !maps.Equal(sent, n.sent) {
		t.Fatalf("a refused call reached nodes: %v, then %v", sent, n.sent)
	}
	want := []NodeStats{
		{Node: "a", State: Open, Errors: 3, Rejected: 1, Opens: 1},
		{Node: "b", State: Closed},
		{Node: "c", State: Closed},
	}
	if got := b.Nodes(); !slices.Equal(got, want) {
		t.Fatalf("Nodes() = %+v, want %+v", got, want)
	}

	// The probe of a, mixed with b: a recovered, so the call succeeds and
	// closes a's circuit.
	clk.Advance(time.Second)
	n.failing["a"] = false
	if err := call("a:k", "b:k"); err != nil {
		t.Fatalf("the probe of node a: %v", err)
	}
	if b.State() != Closed {
		t.Fatalf("after a's good probe the state is %v", b.State())
	}
	if w := []string{"a:closed>open", "a:open>half-open", "a:half-open>closed"}; !slices.Equal(changes, w) {
		t.Errorf("state changes %v, want %v", changes, w)
	}

	// Node a dies again and is replaced: nothing asks for it any more.
	n.failing["a"] = true
	for range 3 {
		call("a:k")
	}
	if b.State() != Open {
		t.Fatal("node a did not open again")
	}
	clk.Advance(b.staleAfter())
	call("b:k")
	if got := b.Nodes(); len(got) != 1 || got[0].Node != "b" || b.State() != Closed {
		t.Errorf("a stale period after the last call for a: %+v, state %v; want only b, closed", got, b.State())
	}
	if st := b.Stats(); st.Opens != 2 || st.Rejected != 1 {
		t.Errorf("stats %+v, want 2 opens and 1 rejected call", st)
	}
}

// TestNodeProbeOfAGoneCaller: a node's probe whose caller gave up opens
// the circuit again rather than leaving it half-open.
func TestNodeProbeOfAGoneCaller(t *testing.T) {
	clk := clocktest.New(time.Unix(1_800_000_000, 0))
	n := &nodes{inner: memory.New(memory.Options{Now: clk.Now, SweepInterval: -1}), failing: map[string]bool{"a": true}, sent: map[string]int{}}
	b := New(n, Options{Failures: 1, Cooldown: time.Second, Now: clk.Now})
	reqs := nodeReq("a:k")
	b.Decide(context.Background(), reqs, make([]algo.Decision, 1))
	clk.Advance(time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b.Decide(ctx, reqs, make([]algo.Decision, 1))
	if got := b.Nodes(); len(got) != 1 || got[0].State != Open {
		t.Fatalf("after a cancelled probe: %+v, want node a open", got)
	}
}
