package client_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/pkg/client"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// sleeper is a WaitOptions.Sleep that sleeps no time: it records each
// sleep and moves clk (a server's clock, or nil) by it, as if it had
// slept.
type sleeper struct {
	clk   *clocktest.Clock
	slept []time.Duration
}

func (s *sleeper) Sleep(ctx context.Context, d time.Duration) error {
	s.slept = append(s.slept, d)
	if s.clk != nil {
		s.clk.Advance(d)
	}
	return ctx.Err()
}

// noSleep is a WaitOptions.Sleep for a wait that must not sleep.
func noSleep(t *testing.T) func(context.Context, time.Duration) error {
	return func(ctx context.Context, d time.Duration) error {
		t.Errorf("slept %v, want no sleep", d)
		return nil
	}
}

// The Rand of jitter at its least and at its most.
func randLeast(n int64) int64 { return 0 }
func randMost(n int64) int64  { return n - 1 }

// TestWaitAdmitsAfterRetryAfter, in real time: a request over a limit of 4
// per second is admitted once a token is back, and not asked again before.
func TestWaitAdmitsAfterRetryAfter(t *testing.T) {
	s := startRealTimeServer(t)
	c := newClient(t, s.addr)
	ctx := context.Background()
	pace := client.D("pace", "wait")
	began := time.Now()
	d, err := c.Allow(ctx, "api", pace.Hits(4))
	if err != nil || !d.Allowed {
		t.Fatalf("4 hits of 4: %+v, %v", d, err)
	}
	var calls atomic.Int64
	counting := client.LimiterFunc(func(ctx context.Context, domain string, ds ...client.Descriptor) (client.Decision, error) {
		calls.Add(1)
		return c.Allow(ctx, domain, ds...)
	})
	d, err = client.Wait(ctx, counting, "api", pace)
	took := time.Since(began)
	if err != nil || !d.Allowed {
		t.Fatalf("Wait: %+v, %v", d, err)
	}
	// A token is back 250ms after the bucket was emptied; a loaded
	// machine may take much longer, never less.
	if took < 250*time.Millisecond-5*time.Millisecond || took > 10*time.Second {
		t.Errorf("admitted %v after the bucket was emptied, want 250ms or a little more", took)
	}
	// Refused (unless the machine was slow enough for a token to be back
	// already), then admitted: Wait asks again only once it can pass.
	if n := calls.Load(); n > 2 {
		t.Errorf("Wait asked %d times, want 2 at most", n)
	}
	// client.Wait and Client.Wait are the same wait.
	if d, err := c.Wait(ctx, "api", pace); err != nil || !d.Allowed {
		t.Errorf("Client.Wait: %+v, %v", d, err)
	}
}

// TestWaitJitter: Wait sleeps the retry-after plus up to a tenth more,
// and then it is admitted.
func TestWaitJitter(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	ctx := context.Background()
	alice := client.D("user_id", "alice")
	if d, err := c.Allow(ctx, "api", alice.Hits(3)); err != nil || !d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
	for _, tc := range []struct {
		name string
		rand func(int64) int64
	}{{"least", randLeast}, {"most", randMost}, {"default", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := c.Peek(ctx, "api", alice)
			if err != nil {
				t.Fatal(err)
			}
			retry := client.NewDecision(p.Allowed, p.Results).RetryAfter
			if retry <= 0 {
				t.Fatalf("alice is not over her limit: %v", p)
			}
			sl := &sleeper{clk: s.clock}
			d, err := client.NewWaiter(c, client.WaitOptions{Sleep: sl.Sleep, Rand: tc.rand}).Wait(ctx, "api", alice)
			if err != nil || !d.Allowed || d.Results[0].Remaining != 0 {
				t.Fatalf("Wait: %+v, %v", d, err)
			}
			if len(sl.slept) != 1 {
				t.Fatalf("slept %v, want one sleep", sl.slept)
			}
			least, most := retry, retry+retry/10
			switch got := sl.slept[0]; {
			case tc.name == "least" && got != least, tc.name == "most" && got != most, got < least || got > most:
				t.Errorf("slept %v for a retry after %v, want from %v to %v", got, retry, least, most)
			}
		})
	}
}

// TestWaitNever: a request that no wait admits returns at once.
func TestWaitNever(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	ctx := context.Background()
	tooMany := client.D("user_id", "bob").Hits(4) // of 3 at most
	d, err := client.NewWaiter(c, client.WaitOptions{Sleep: noSleep(t)}).Wait(ctx, "api", tooMany)
	if !errors.Is(err, client.ErrNever) || d.Allowed || d.RetryAfter != client.Never {
		t.Errorf("Wait of 4 hits of 3: %+v, %v; want the refusal and ErrNever", d, err)
	}
	// Without a deadline, the default sleep: it would wait forever.
	if _, err := c.Wait(ctx, "api", tooMany); !errors.Is(err, client.ErrNever) {
		t.Errorf("Client.Wait of 4 hits of 3: %v, want ErrNever", err)
	}
}

// TestWaitDeadline: a retry-after past the context's deadline returns at
// once; jitter alone is cut short at the deadline.
func TestWaitDeadline(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	carol := client.D("user_id", "carol")
	if d, err := c.Allow(context.Background(), "api", carol.Hits(3)); err != nil || !d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
	// A token is back in 20s; the deadline is in 5s.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := client.NewWaiter(c, client.WaitOptions{Sleep: noSleep(t)}).Wait(ctx, "api", carol)
	if !errors.Is(err, client.ErrWouldExceedDeadline) || d.Allowed || d.RetryAfter != 20*time.Second {
		t.Errorf("Wait: %+v, %v; want the refusal and ErrWouldExceedDeadline", d, err)
	}
	d, err = c.Wait(ctx, "api", carol)
	if !errors.Is(err, client.ErrWouldExceedDeadline) || d.RetryAfter != 20*time.Second {
		t.Errorf("Client.Wait: %+v, %v; want the refusal and ErrWouldExceedDeadline", d, err)
	}
	if ctx.Err() != nil {
		t.Error("Wait returned at the deadline, not at once")
	}

	// The deadline comes after the retry-after (20s), before the most
	// jitter could add (2s): the sleep ends at the deadline, and the
	// request is admitted then.
	ctx, cancel = context.WithTimeout(context.Background(), 21*time.Second)
	defer cancel()
	sl := &sleeper{clk: s.clock}
	d, err = client.NewWaiter(c, client.WaitOptions{Sleep: sl.Sleep, Rand: randMost}).Wait(ctx, "api", carol)
	if err != nil || !d.Allowed {
		t.Fatalf("Wait with a deadline within the jitter: %+v, %v", d, err)
	}
	if len(sl.slept) != 1 || sl.slept[0] < 20*time.Second || sl.slept[0] > 21*time.Second {
		t.Errorf("slept %v, want from the retry-after to the deadline", sl.slept)
	}

	// A context that ends while Wait sleeps ends the wait, with the last
	// refusal.
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	d, err = c.Wait(ctx, "api", carol)
	if !errors.Is(err, context.Canceled) || d.Allowed || d.RetryAfter <= 0 {
		t.Errorf("Wait cancelled: %+v, %v; want the refusal and context.Canceled", d, err)
	}
}

// flaky is a limiter whose calls fail as errs say, in turn, then admit.
type flaky struct {
	errs  []error // nil for a refusal after 5ms
	calls int
}

func (f *flaky) Allow(ctx context.Context, domain string, ds ...client.Descriptor) (client.Decision, error) {
	f.calls++
	if f.calls > len(f.errs) {
		return client.Decision{Allowed: true}, nil
	}
	if err := f.errs[f.calls-1]; err != nil {
		return client.Decision{}, err
	}
	return client.Decision{RetryAfter: 5 * time.Millisecond}, nil
}

func unavailable(n int) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = status.Error(codes.Unavailable, "ratelimitd is down")
	}
	return errs
}

func ms(ns ...int) []time.Duration {
	out := make([]time.Duration, len(ns))
	for i, n := range ns {
		out[i] = time.Duration(n) * time.Millisecond
	}
	return out
}

// TestWaitBackoff: transient errors are retried after a backoff doubling
// from BackoffBase up to BackoffMax, drawn below it (full jitter); a
// decision restarts it.
func TestWaitBackoff(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		errs     []error
		opts     client.WaitOptions
		ceilings []time.Duration
	}{
		{"defaults", unavailable(10), client.WaitOptions{},
			ms(10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000)},
		{"options", unavailable(6), client.WaitOptions{BackoffBase: 3 * time.Millisecond, BackoffMax: 50 * time.Millisecond},
			ms(3, 6, 12, 24, 48, 50)},
		{"max below base", unavailable(3), client.WaitOptions{BackoffBase: 30 * time.Millisecond, BackoffMax: time.Millisecond},
			ms(30, 30, 30)},
		{"deadline exceeded", []error{status.Error(codes.DeadlineExceeded, "slow"), status.Error(codes.DeadlineExceeded, "slow")}, client.WaitOptions{},
			ms(10, 20)},
		{"a decision restarts it", append(unavailable(2), nil, status.Error(codes.Unavailable, "down")), client.WaitOptions{},
			[]time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 5500 * time.Microsecond, 10 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ns []int64
			f := &flaky{errs: tc.errs}
			opts := tc.opts
			opts.Retries = client.RetryForever
			var errs int
			opts.OnError = func(error) { errs++ }
			// Half the range: a sleep drawn below the ceiling.
			opts.Rand = func(n int64) int64 { ns = append(ns, n); return n / 2 }
			sl := &sleeper{}
			opts.Sleep = sl.Sleep
			d, err := client.NewWaiter(f, opts).Wait(ctx, "api", client.D("user_id", "dan"))
			if err != nil || !d.Allowed {
				t.Fatalf("%+v, %v", d, err)
			}
			if f.calls != len(tc.errs)+1 {
				t.Errorf("%d calls, want %d", f.calls, len(tc.errs)+1)
			}
			var ceilings, want []time.Duration
			for i, n := range ns {
				ceilings = append(ceilings, time.Duration(n-1))
				want = append(want, time.Duration(n/2))
				if tc.errs[i] == nil { // the refusal: its retry-after and up to a tenth
					ceilings[i] = 5*time.Millisecond + ceilings[i]
					want[i] = 5*time.Millisecond + want[i]
				}
			}
			if !slices.Equal(ceilings, tc.ceilings) || !slices.Equal(sl.slept, want) {
				t.Errorf("backoff ceilings %v, want %v; slept %v, want %v", ceilings, tc.ceilings, sl.slept, want)
			}
			if errs != countErrs(tc.errs) {
				t.Errorf("OnError told of %d errors, want %d", errs, countErrs(tc.errs))
			}
		})
	}
}

func countErrs(errs []error) int {
	n := 0
	for _, err := range errs {
		if err != nil {
			n++
		}
	}
	return n
}

// TestWaitFailurePolicy: Retries and FailOpen choose between failing at
// the first error, retrying some, admitting and retrying until ctx ends.
func TestWaitFailurePolicy(t *testing.T) {
	down := status.Error(codes.Unavailable, "ratelimitd is down")
	for _, tc := range []struct {
		name    string
		errs    []error
		opts    client.WaitOptions
		calls   int
		allowed bool
		code    codes.Code
	}{
		{"fail closed", unavailable(9), client.WaitOptions{}, 1, false, codes.Unavailable},
		{"fail open", unavailable(9), client.WaitOptions{FailOpen: true}, 1, true, codes.OK},
		{"3 retries", unavailable(9), client.WaitOptions{Retries: 3}, 4, false, codes.Unavailable},
		{"3 retries, then open", unavailable(9), client.WaitOptions{Retries: 3, FailOpen: true}, 4, true, codes.OK},
		{"3 retries suffice", unavailable(3), client.WaitOptions{Retries: 3}, 4, true, codes.OK},
		{"forever", unavailable(30), client.WaitOptions{Retries: client.RetryForever}, 31, true, codes.OK},
		{"not transient", []error{status.Error(codes.InvalidArgument, "too many descriptors")}, client.WaitOptions{Retries: client.RetryForever}, 1, false, codes.InvalidArgument},
		{"not a status", []error{errors.New("no")}, client.WaitOptions{Retries: client.RetryForever}, 1, false, codes.Unknown},
		{"not transient, open", []error{errors.New("no")}, client.WaitOptions{Retries: client.RetryForever, FailOpen: true}, 1, true, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &flaky{errs: tc.errs}
			opts := tc.opts
			var told []error
			opts.OnError = func(err error) { told = append(told, err) }
			opts.Sleep = (&sleeper{}).Sleep
			d, err := client.NewWaiter(f, opts).Wait(context.Background(), "api", client.D("user_id", "eve"))
			if f.calls != tc.calls || d.Allowed != tc.allowed || status.Code(err) != tc.code {
				t.Errorf("%d calls, %+v, %v; want %d calls, allowed %v, %v", f.calls, d, err, tc.calls, tc.allowed, tc.code)
			}
			if len(told) != min(tc.calls, len(tc.errs)) {
				t.Errorf("OnError told of %v", told)
			}
		})
	}

	// A backoff past the deadline gives up at once.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	f := &flaky{errs: []error{down, down}}
	w := client.NewWaiter(f, client.WaitOptions{Retries: client.RetryForever, BackoffBase: time.Minute, Rand: randMost, Sleep: noSleep(t)})
	if _, err := w.Wait(ctx, "api", client.D("user_id", "eve")); status.Code(err) != codes.Unavailable || f.calls != 1 {
		t.Errorf("a backoff past the deadline: %d calls, %v; want 1, Unavailable", f.calls, err)
	}
	// A context that ends is no failure to admit on.
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	failing := client.LimiterFunc(func(ctx context.Context, _ string, _ ...client.Descriptor) (client.Decision, error) {
		return client.Decision{}, status.FromContextError(ctx.Err()).Err()
	})
	if d, err := client.NewWaiter(failing, client.WaitOptions{FailOpen: true}).Wait(ctx, "api"); d.Allowed || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled, fail open: %+v, %v; want context.Canceled", d, err)
	}
}

// TestWaitUnreachable: retries of a real client whose server cannot be
// reached, with real sleeps.
func TestWaitUnreachable(t *testing.T) {
	c := newClient(t, closedAddr(t))
	var told []error
	w := client.NewWaiter(c, client.WaitOptions{Retries: 3, BackoffBase: time.Millisecond, OnError: func(err error) { told = append(told, err) }})
	_, err := w.Wait(context.Background(), "api", client.D("user_id", "frank"))
	if status.Code(err) != codes.Unavailable || len(told) != 4 {
		t.Fatalf("%v after %d errors, want Unavailable after 4", err, len(told))
	}
	for _, err := range told {
		if status.Code(err) != codes.Unavailable {
			t.Errorf("OnError told of %v, want Unavailable", err)
		}
	}
	w = client.NewWaiter(c, client.WaitOptions{Retries: 2, BackoffBase: time.Millisecond, FailOpen: true})
	if d, err := w.Wait(context.Background(), "api", client.D("user_id", "frank")); err != nil || !d.Allowed {
		t.Errorf("fail open: %+v, %v", d, err)
	}
}

// TestWaitAttemptTimeout: a server that never answers costs each attempt
// its AttemptTimeout, and is retried, within the caller's deadline.
func TestWaitAttemptTimeout(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			held = append(held, conn)
		}
	}()
	c := newClient(t, lis.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var told []error
	w := client.NewWaiter(c, client.WaitOptions{
		Retries: 2, AttemptTimeout: 50 * time.Millisecond, BackoffBase: time.Millisecond,
		OnError: func(err error) { told = append(told, err) },
	})
	_, err = w.Wait(ctx, "api", client.D("user_id", "grace"))
	if status.Code(err) != codes.DeadlineExceeded || len(told) != 3 || ctx.Err() != nil {
		t.Errorf("%v after %d errors (context: %v), want DeadlineExceeded after 3, the context alive", err, len(told), ctx.Err())
	}
	// The context's error of a LimiterFunc at the attempt's deadline is
	// retried as well.
	var calls int
	hanging := client.LimiterFunc(func(ctx context.Context, _ string, _ ...client.Descriptor) (client.Decision, error) {
		if calls++; calls > 2 {
			return client.Decision{Allowed: true}, nil
		}
		<-ctx.Done()
		return client.Decision{}, ctx.Err()
	})
	w = client.NewWaiter(hanging, client.WaitOptions{Retries: client.RetryForever, AttemptTimeout: 10 * time.Millisecond, BackoffBase: time.Millisecond})
	if d, err := w.Wait(ctx, "api"); err != nil || !d.Allowed || calls != 3 {
		t.Errorf("%d calls, %+v, %v; want admitted at the 3rd", calls, d, err)
	}
}

// TestWaitQueued: with WaitQueued, an admitted request also waits its
// place in a leaky bucket's queue.
func TestWaitQueued(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	ctx := context.Background()
	q := client.D("queue", "q") // 1 per second, a queue of 3
	sl := &sleeper{}
	w := client.NewWaiter(c, client.WaitOptions{WaitQueued: true, Sleep: sl.Sleep})
	for i := range 3 {
		d, err := w.Wait(ctx, "api", q)
		want := time.Duration(i) * time.Second
		if err != nil || !d.Allowed || d.QueueWait() != want || d.Results[0].Wait != want {
			t.Fatalf("hit %d: %+v, %v; want a queue wait of %v", i+1, d, err, want)
		}
	}
	if !slices.Equal(sl.slept, []time.Duration{time.Second, 2 * time.Second}) {
		t.Errorf("slept %v, want the queue waits 1s and 2s", sl.slept)
	}
	// Without WaitQueued, Wait returns at admission.
	s.clock.Advance(3 * time.Second) // the queue has drained
	if d, err := client.NewWaiter(c, client.WaitOptions{Sleep: noSleep(t)}).Wait(ctx, "api", q.Hits(2)); err != nil || d.QueueWait() != 0 {
		t.Fatalf("%+v, %v", d, err)
	}
	// A queue wait past the deadline returns at once: admitted, counted.
	ctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	d, err := client.NewWaiter(c, client.WaitOptions{WaitQueued: true, Sleep: noSleep(t)}).Wait(ctx, "api", q)
	if !errors.Is(err, client.ErrWouldExceedDeadline) || !d.Allowed || d.QueueWait() != 2*time.Second {
		t.Errorf("queued past the deadline: %+v, %v; want admitted with ErrWouldExceedDeadline", d, err)
	}
	// A refusal waits in no queue.
	if d, err := c.Allow(context.Background(), "api", q); err != nil || d.Allowed || d.QueueWait() != 0 {
		t.Errorf("refused: %+v, %v", d, err)
	}
}

// TestWaitRLS: through Envoy's API, Wait waits until the limit is full
// again, all that API tells.
func TestWaitRLS(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	ctx := context.Background()
	henry := client.D("user_id", "henry")
	if d, err := c.Allow(ctx, "api", henry.Hits(3)); err != nil || !d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
	sl := &sleeper{clk: s.clock}
	d, err := client.NewWaiter(client.LimiterFunc(c.AllowRLS), client.WaitOptions{Sleep: sl.Sleep, Rand: randLeast}).Wait(ctx, "api", henry)
	if err != nil || !d.Allowed || !slices.Equal(sl.slept, []time.Duration{time.Minute}) {
		t.Errorf("%+v, %v after sleeping %v; want admitted after 1m", d, err, sl.slept)
	}
}
