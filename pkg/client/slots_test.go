package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/pkg/client"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// acquire is c.Acquire in domain api, failing t on an error.
func acquire(t *testing.T, c client.ConcurrencyLimiter, ds ...client.Descriptor) client.Slots {
	t.Helper()
	s, err := c.Acquire(context.Background(), "api", ds...)
	if err != nil {
		t.Fatalf("Acquire(%v): %v", ds, err)
	}
	return s
}

// allFree fails t unless n slots of d can be taken: every slot the work
// before, named by after, held was given back.
func allFree(t *testing.T, c client.ConcurrencyLimiter, d client.Descriptor, n int, after string) {
	t.Helper()
	for i := range n {
		if got := acquire(t, c, d); !got.Allowed {
			t.Fatalf("acquire %d of %v after %s: %+v; a slot was not released", i+1, d, after, got)
		}
	}
}

// TestAcquireHoldsSlotsUntilReleased: a limit of 2 in flight gives 2
// leases, refuses a third until one is released, and tells its slots.
func TestAcquireHoldsSlotsUntilReleased(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	ctx := context.Background()
	export := client.D("export", "acme")
	var ids []string
	for i := range 2 {
		got := acquire(t, c, export)
		r := got.Results[0]
		want := client.Concurrency{InFlight: uint64(i + 1), MaxInFlight: 2, LeaseTTL: 30 * time.Second}
		if !got.Allowed || got.LeaseID == "" || got.TTL != 30*time.Second || r.Outcome != client.OutcomeOK ||
			r.Rule != "api.export" || r.Concurrency == nil || *r.Concurrency != want || r.Remaining != uint64(1-i) {
			t.Fatalf("acquire %d: %+v", i+1, got)
		}
		ids = append(ids, got.LeaseID)
	}
	full := acquire(t, c, export)
	if r := full.Results[0]; full.Allowed || full.LeaseID != "" || full.TTL != 0 || full.RetryAfter != 30*time.Second ||
		r.Outcome != client.OutcomeOverLimit || r.RetryAfter != 30*time.Second || r.Concurrency == nil || r.Concurrency.InFlight != 2 {
		t.Fatalf("acquire of a full limit: %+v", full)
	}
	// Another descriptor has slots of its own.
	if other := acquire(t, c, client.D("export", "globex")); !other.Allowed || other.Results[0].Concurrency.InFlight != 1 {
		t.Fatalf("acquire of another descriptor: %+v", other)
	}
	// Release frees a slot at once, and is harmless twice.
	for i, want := range []bool{true, false} {
		released, err := c.Release(ctx, ids[0])
		if err != nil || released != want {
			t.Fatalf("release %d: %v, %v; want %v", i+1, released, err, want)
		}
	}
	if released, err := c.Release(ctx, ""); released || err != nil {
		t.Fatalf("release of no lease: %v, %v", released, err)
	}
	if again := acquire(t, c, export); !again.Allowed || again.Results[0].Concurrency.InFlight != 2 {
		t.Fatalf("acquire after a release: %+v", again)
	}
	// Check takes no slot and tells none.
	d, err := c.Allow(ctx, "api", export)
	if err != nil || !d.Allowed || d.Results[0].Concurrency != nil || d.Results[0].Outcome != client.OutcomeNoLimit {
		t.Fatalf("Allow of a concurrency limit: %+v, %v", d, err)
	}
}

// TestAcquireWithRateLimit: a rule with a rate limit and a concurrency
// limit tells both, and refuses by either; a refusal takes nothing.
func TestAcquireWithRateLimit(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	report, export := client.D("report", "r"), client.D("export", "e")
	held := acquire(t, c, export)
	acquire(t, c, export) // export is full
	for range 3 {
		if got := acquire(t, c, report, export); got.Allowed || got.LeaseID != "" || got.Results[0].Outcome != client.OutcomeOK || got.Results[1].Outcome != client.OutcomeOverLimit {
			t.Fatalf("acquire with a full descriptor: %+v", got)
		}
	}
	// Nothing of report was taken: its 3 per minute and 2 slots are whole.
	for i := range 2 {
		got := acquire(t, c, report)
		r := got.Results[0]
		if !got.Allowed || r.Limit.Requests != 3 || r.Limit.Window != time.Minute || r.Concurrency.InFlight != uint64(i+1) || got.TTL != 10*time.Second {
			t.Fatalf("acquire %d of report: %+v", i+1, got)
		}
	}
	// Both slots held, and 1 hit left: the slot refuses.
	if got := acquire(t, c, report); got.Allowed || got.RetryAfter != 10*time.Second {
		t.Fatalf("acquire of report's full slots: %+v", got)
	}
	if _, err := c.Release(context.Background(), held.LeaseID); err != nil {
		t.Fatal(err)
	}
	// The rate limit refuses when its hits are spent, with slots to spare.
	s.clock.Advance(11 * time.Second) // report's slots end
	if got := acquire(t, c, report); !got.Allowed {
		t.Fatalf("3rd hit of report: %+v", got)
	}
	if got := acquire(t, c, report); got.Allowed || got.Results[0].Concurrency.InFlight != 1 || got.RetryAfter != 49*time.Second {
		t.Fatalf("4th hit of report: %+v; want refused by its rate limit, until the minute ends", got)
	}
}

// TestRenewKeepsSlots: Renew keeps a lease's slots another TTL; a lease
// whose TTL ended is not renewed, and its slot is free.
func TestRenewKeepsSlots(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	ctx := context.Background()
	export := client.D("export", "e")
	a, b := acquire(t, c, export), acquire(t, c, export)
	s.clock.Advance(20 * time.Second)
	if renewed, ttl, err := c.Renew(ctx, b.LeaseID); !renewed || ttl != 30*time.Second || err != nil {
		t.Fatalf("renew of a held lease: %v, %v, %v", renewed, ttl, err)
	}
	s.clock.Advance(15 * time.Second) // a ended 5s ago; b holds for 15s more
	if renewed, ttl, err := c.Renew(ctx, a.LeaseID); renewed || ttl != 0 || err != nil {
		t.Fatalf("renew of an ended lease: %v, %v, %v", renewed, ttl, err)
	}
	if got := acquire(t, c, export); !got.Allowed {
		t.Fatalf("acquire of the ended lease's slot: %+v", got)
	}
	if got := acquire(t, c, export); got.Allowed || got.RetryAfter != 15*time.Second {
		t.Fatalf("acquire while the renewed lease holds: %+v", got)
	}
	if _, _, err := c.Renew(ctx, ""); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("renew of no lease: %v, want InvalidArgument", err)
	}
}

// TestSlotsOnDeadServer: calls to a server that is down fail Unavailable,
// but the release of no lease, which calls nothing.
func TestSlotsOnDeadServer(t *testing.T) {
	c := newClient(t, closedAddr(t), client.WithTimeout(time.Second))
	ctx := context.Background()
	if _, err := c.Acquire(ctx, "api", client.D("export", "e")); status.Code(err) != codes.Unavailable {
		t.Errorf("Acquire: %v, want Unavailable", err)
	}
	if _, err := c.Release(ctx, "rl1.x"); status.Code(err) != codes.Unavailable {
		t.Errorf("Release: %v, want Unavailable", err)
	}
	if _, _, err := c.Renew(ctx, "rl1.x"); status.Code(err) != codes.Unavailable {
		t.Errorf("Renew: %v, want Unavailable", err)
	}
	if released, err := c.Release(ctx, ""); released || err != nil {
		t.Errorf("Release of no lease: %v, %v", released, err)
	}
}

// gate is a handler that holds each request until it is opened, counting
// the requests in it.
type gate struct {
	entered chan struct{} // a message per request that enters
	open    chan struct{}
	in      atomic.Int64 // in the handler now
	most    atomic.Int64 // the most in it at once
	calls   atomic.Int64
}

func newGate() *gate {
	return &gate{entered: make(chan struct{}, 100), open: make(chan struct{})}
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.enter()
	defer g.in.Add(-1)
	select {
	case <-g.open:
	case <-time.After(10 * time.Second): // a test that failed
	}
	io.WriteString(w, "done\n")
}

func (g *gate) enter() {
	g.calls.Add(1)
	n := g.in.Add(1)
	for m := g.most.Load(); n > m && !g.most.CompareAndSwap(m, n); m = g.most.Load() {
	}
	g.entered <- struct{}{}
}

// waitEntered waits until n more requests entered g.
func (g *gate) waitEntered(t *testing.T, n int) {
	t.Helper()
	for i := range n {
		select {
		case <-g.entered:
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of %d requests entered the handler", i, n)
		}
	}
}

// errorLog collects what OnError is told.
type errorLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorLog) add(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, err)
}

func (l *errorLog) get() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]error(nil), l.errs...)
}

// byExport holds a slot of export by the request's X-Tenant header;
// without one, a request has no descriptor.
func byExport(r *http.Request) []client.Descriptor {
	if t := r.Header.Get("X-Tenant"); t != "" {
		return []client.Descriptor{client.D("export", t)}
	}
	return nil
}

// serveAsync serves a request of tenant through h in a goroutine, and
// returns its response when it is done.
func serveAsync(h http.Handler, tenant string) <-chan *httptest.ResponseRecorder {
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "/export", nil)
		if tenant != "" {
			r.Header.Set("X-Tenant", tenant)
		}
		h.ServeHTTP(w, r)
		done <- w
	}()
	return done
}

func receive(t *testing.T, c <-chan *httptest.ResponseRecorder) *httptest.ResponseRecorder {
	t.Helper()
	select {
	case w := <-c:
		return w
	case <-time.After(5 * time.Second):
		t.Fatal("no response in 5s")
		return nil
	}
}

// TestConcurrencyMiddleware: requests hold a slot while their handler
// runs; a request finding every slot held is answered 429 with
// Retry-After, and a slot is free again when its request is done.
func TestConcurrencyMiddleware(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	var errs errorLog
	g := newGate()
	h := client.ConcurrencyMiddleware(c, client.ConcurrencyOptions{
		Domain:      "api",
		Descriptors: byExport,
		OnError:     func(r *http.Request, err error) { errs.add(err) },
	})(g)

	first, second := serveAsync(h, "acme"), serveAsync(h, "acme")
	g.waitEntered(t, 2)
	w := receive(t, serveAsync(h, "acme"))
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "30" || w.Body.String() != "rate limit exceeded\n" {
		t.Fatalf("third request: %d %v %q; want 429 with Retry-After: 30", w.Code, w.Header(), w.Body)
	}
	if g.calls.Load() != 2 {
		t.Fatalf("the handler was called %d times, want 2", g.calls.Load())
	}
	// Another tenant, and a request without descriptors, are not held
	// back.
	other, none := serveAsync(h, "globex"), serveAsync(h, "")
	g.waitEntered(t, 2)
	close(g.open)
	for i, ch := range []<-chan *httptest.ResponseRecorder{first, second, other, none} {
		if w := receive(t, ch); w.Code != http.StatusOK || w.Body.String() != "done\n" {
			t.Fatalf("request %d: %d %q", i+1, w.Code, w.Body)
		}
	}
	// Every slot was released: 2 are free.
	allFree(t, c, client.D("export", "acme"), 2, "the requests")
	if e := errs.get(); len(e) != 0 {
		t.Fatalf("OnError told %v", e)
	}
}

// TestConcurrencyMiddlewareOnLimited: OnLimited answers refusals, with
// Retry-After set.
func TestConcurrencyMiddlewareOnLimited(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	acquire(t, c, client.D("export", "acme"))
	acquire(t, c, client.D("export", "acme"))
	s.clock.Advance(20500 * time.Millisecond)
	var told client.Decision
	h := client.ConcurrencyMiddleware(c, client.ConcurrencyOptions{
		Domain:      "api",
		Descriptors: byExport,
		OnLimited: func(w http.ResponseWriter, r *http.Request, d client.Decision) {
			told = d
			w.WriteHeader(http.StatusServiceUnavailable)
		},
	})(http.NotFoundHandler())
	w := receive(t, serveAsync(h, "acme"))
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "10" || told.Allowed || told.RetryAfter != 9500*time.Millisecond {
		t.Fatalf("refused: %d %v, told %+v", w.Code, w.Header(), told)
	}
}

// TestConcurrencyMiddlewareReleasesOnPanic: a handler that panics gives
// its slot back, and the panic goes on.
func TestConcurrencyMiddlewareReleasesOnPanic(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	var calls atomic.Int64
	boom := errors.New("boom")
	h := client.ConcurrencyMiddleware(c, client.ConcurrencyOptions{Domain: "api", Descriptors: byExport})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			panic(boom)
		}))
	// More panics than slots: each would keep one unless released.
	for i := range 3 {
		func() {
			defer func() {
				if p := recover(); p != boom {
					t.Fatalf("request %d: recovered %v, want the handler's panic", i+1, p)
				}
			}()
			r := httptest.NewRequest(http.MethodGet, "/export", nil)
			r.Header.Set("X-Tenant", "acme")
			h.ServeHTTP(httptest.NewRecorder(), r)
		}()
	}
	if calls.Load() != 3 {
		t.Fatalf("handler called %d times, want 3", calls.Load())
	}
	if got := acquire(t, c, client.D("export", "acme")); !got.Allowed || got.Results[0].Concurrency.InFlight != 1 {
		t.Fatalf("acquire after the panics: %+v; their slots were not released", got)
	}
}

// TestConcurrencyMiddlewareReleasesWhenCancelled: a request cancelled
// while its handler runs, as when its client goes away, still gives its
// slot back.
func TestConcurrencyMiddlewareReleasesWhenCancelled(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	var errs errorLog
	h := client.ConcurrencyMiddleware(c, client.ConcurrencyOptions{
		Domain:      "api",
		Descriptors: byExport,
		OnError:     func(r *http.Request, err error) { errs.add(err) },
	})
	for i := range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/export", nil)
		r.Header.Set("X-Tenant", "acme")
		w := httptest.NewRecorder()
		h(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { cancel() })).ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			t.Fatalf("request %d: %d", i+1, w.Code)
		}
	}
	if got := acquire(t, c, client.D("export", "acme")); !got.Allowed || got.Results[0].Concurrency.InFlight != 1 {
		t.Fatalf("acquire after the cancelled requests: %+v; their slots were not released", got)
	}
	if e := errs.get(); len(e) != 0 {
		t.Fatalf("OnError told %v", e)
	}
}

// TestConcurrencyMiddlewareRenews: a handler that outlives the lease TTL
// keeps its slot, renewed, until it returns. In real time: "long" holds
// 1 in flight, for 1s unless renewed.
func TestConcurrencyMiddlewareRenews(t *testing.T) {
	s := startRealTimeServer(t)
	c := newClient(t, s.addr)
	var errs errorLog
	g := newGate()
	h := client.ConcurrencyMiddleware(c, client.ConcurrencyOptions{
		Domain:      "api",
		Descriptors: func(r *http.Request) []client.Descriptor { return []client.Descriptor{client.D("long", "job")} },
		OnError:     func(r *http.Request, err error) { errs.add(err) },
	})(g)
	done := serveAsync(h, "")
	g.waitEntered(t, 1)
	time.Sleep(1500 * time.Millisecond) // the TTL ended half a second ago, but for renewals
	if got := acquire(t, c, client.D("long", "job")); got.Allowed || got.Results[0].Concurrency.InFlight != 1 {
		close(g.open)
		t.Fatalf("acquire while a handler runs past its TTL: %+v; want refused, its slot renewed", got)
	}
	close(g.open)
	if w := receive(t, done); w.Code != http.StatusOK {
		t.Fatalf("long request: %d", w.Code)
	}
	if got := acquire(t, c, client.D("long", "job")); !got.Allowed {
		t.Fatalf("acquire after the long request: %+v; its slot was not released", got)
	}
	if e := errs.get(); len(e) != 0 {
		t.Fatalf("OnError told %v", e)
	}
}

// losing is a client whose leases are lost before each renewal, as when
// renewals fail until the TTL ends: it releases the lease first.
type losing struct{ *client.Client }

func (l losing) Renew(ctx context.Context, id string) (bool, time.Duration, error) {
	if _, err := l.Client.Release(ctx, id); err != nil {
		return false, 0, err
	}
	return l.Client.Renew(ctx, id)
}

// TestConcurrencyMiddlewareReportsLostSlots: when a renewal finds the
// slot lost, OnError is told ErrSlotsLost once, and the handler goes on.
func TestConcurrencyMiddlewareReportsLostSlots(t *testing.T) {
	s := startRealTimeServer(t)
	c := newClient(t, s.addr)
	var errs errorLog
	lost := make(chan struct{}, 10)
	h := client.ConcurrencyMiddleware(losing{c}, client.ConcurrencyOptions{
		Domain:      "api",
		Descriptors: func(r *http.Request) []client.Descriptor { return []client.Descriptor{client.D("long", "lost")} },
		OnError: func(r *http.Request, err error) {
			errs.add(err)
			lost <- struct{}{}
		},
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-lost: // the first renewal comes after a third of the TTL
			io.WriteString(w, "told while running\n")
		case <-time.After(2 * time.Second):
			io.WriteString(w, "not told\n")
		}
	}))
	w := receive(t, serveAsync(h, ""))
	if w.Code != http.StatusOK || w.Body.String() != "told while running\n" {
		t.Fatalf("request: %d %q; want the handler told of the loss while it runs, and let finish", w.Code, w.Body)
	}
	if e := errs.get(); len(e) != 1 || !errors.Is(e[0], client.ErrSlotsLost) {
		t.Fatalf("OnError told %v, want ErrSlotsLost once", e)
	}
}

// TestConcurrencyMiddlewareReleaseFails: a release that fails is told to
// OnError, not to the client.
func TestConcurrencyMiddlewareReleaseFails(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	var errs errorLog
	h := client.ConcurrencyMiddleware(c, client.ConcurrencyOptions{
		Domain:         "api",
		Descriptors:    byExport,
		OnError:        func(r *http.Request, err error) { errs.add(err) },
		ReleaseTimeout: 2 * time.Second,
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.stop() // ratelimitd goes down while the handler runs
		io.WriteString(w, "done\n")
	}))
	w := receive(t, serveAsync(h, "acme"))
	if w.Code != http.StatusOK || w.Body.String() != "done\n" {
		t.Fatalf("request: %d %q", w.Code, w.Body)
	}
	e := errs.get()
	if len(e) != 1 || status.Code(e[0]) != codes.Unavailable || errors.Is(e[0], client.ErrSlotsLost) {
		t.Fatalf("OnError told %v, want the Release's Unavailable", e)
	}
}

// TestConcurrencyMiddlewareFailurePolicy: when Acquire fails, FailOpen
// runs the handler without a slot; otherwise the request is answered 503.
// Both tell OnError.
func TestConcurrencyMiddlewareFailurePolicy(t *testing.T) {
	c := newClient(t, closedAddr(t), client.WithTimeout(time.Second))
	for _, failOpen := range []bool{true, false} {
		var errs errorLog
		var calls atomic.Int64
		h := client.ConcurrencyMiddleware(c, client.ConcurrencyOptions{
			Domain:      "api",
			Descriptors: byExport,
			FailOpen:    failOpen,
			OnError:     func(r *http.Request, err error) { errs.add(err) },
		})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			io.WriteString(w, "done\n")
		}))
		w := receive(t, serveAsync(h, "acme"))
		wantCode, wantCalls := http.StatusServiceUnavailable, int64(0)
		if failOpen {
			wantCode, wantCalls = http.StatusOK, 1
		}
		if w.Code != wantCode || calls.Load() != wantCalls {
			t.Errorf("FailOpen %v: %d with %d handler calls, want %d with %d", failOpen, w.Code, calls.Load(), wantCode, wantCalls)
		}
		if e := errs.get(); len(e) != 1 || status.Code(e[0]) != codes.Unavailable {
			t.Errorf("FailOpen %v: OnError told %v, want Unavailable once", failOpen, e)
		}
	}
}

// TestConcurrencyMiddlewareManyRequests: 50 requests at once through a
// limit of 5 in flight. Each gets its handler or a 429, and the handler
// never has more than 5 in it: first while 5 are held in it, then while
// they come and go.
func TestConcurrencyMiddlewareManyRequests(t *testing.T) {
	s := startServer(t, service.Options{}) // the clock stands still: no slot ends with its TTL
	c := newClient(t, s.addr)
	var errs errorLog
	g := newGate()
	limit := client.ConcurrencyMiddleware(c, client.ConcurrencyOptions{
		Domain:      "api",
		Descriptors: func(r *http.Request) []client.Descriptor { return []client.Descriptor{client.D("pool", "p")} },
		OnError:     func(r *http.Request, err error) { errs.add(err) },
	})
	var churn atomic.Bool // the handler returns at once, rather than wait for g
	srv := httptest.NewServer(limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if churn.Load() {
			g.enter()
			<-g.entered
			time.Sleep(time.Millisecond)
			g.in.Add(-1)
			io.WriteString(w, "done\n")
			return
		}
		g.ServeHTTP(w, r)
	})))
	defer srv.Close()
	hc := srv.Client()

	// run sends 50 requests at once, and returns how many were answered
	// 200 and 429; limited is told of each 429 as it comes.
	run := func(limited chan<- struct{}) (ok, refused int) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range 50 {
			wg.Go(func() {
				resp, err := hc.Get(srv.URL)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				defer mu.Unlock()
				switch resp.StatusCode {
				case http.StatusOK:
					ok++
				case http.StatusTooManyRequests:
					refused++
					if limited != nil {
						limited <- struct{}{}
					}
				default:
					t.Errorf("status %d", resp.StatusCode)
				}
			})
		}
		wg.Wait()
		return ok, refused
	}

	// 5 are held in the handler: the other 45 are answered 429.
	limited := make(chan struct{}, 50)
	go func() {
		defer close(g.open)
		timeout := time.After(5 * time.Second)
		for range 45 {
			select {
			case <-limited:
			case <-timeout:
				return
			}
		}
	}()
	ok, refused := run(limited)
	if ok != 5 || refused != 45 || g.calls.Load() != 5 || g.most.Load() != 5 {
		t.Fatalf("held: %d answered 200 and %d 429, %d handler calls, at most %d in it; want 5, 45, 5, 5",
			ok, refused, g.calls.Load(), g.most.Load())
	}

	// They come and go.
	churn.Store(true)
	g.calls.Store(0)
	ok, refused = run(nil)
	if ok+refused != 50 || int64(ok) != g.calls.Load() || ok < 5 || g.most.Load() > 5 {
		t.Fatalf("churning: %d answered 200 and %d 429, %d handler calls, at most %d in it", ok, refused, g.calls.Load(), g.most.Load())
	}
	t.Logf("churning: %d answered 200, %d 429", ok, refused)
	// Every slot was released.
	allFree(t, c, client.D("pool", "p"), 5, "the requests")
	if e := errs.get(); len(e) != 0 {
		t.Fatalf("OnError told %v", e)
	}
}

// TestConcurrencyUnaryServerInterceptor: calls hold a slot while their
// handler runs, a call finding every slot held fails ResourceExhausted
// with a RetryInfo, a panicking handler gives its slot back, and a failed
// Acquire is handled as failOpen says.
func TestConcurrencyUnaryServerInterceptor(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	byMethod := func(ctx context.Context, fullMethod string, req any) []client.Descriptor {
		if fullMethod == "/open" {
			return nil
		}
		return []client.Descriptor{client.D("export", fullMethod)}
	}
	var errs errorLog
	intercept := client.ConcurrencyUnaryServerInterceptor(c, "api", byMethod, false, func(ctx context.Context, err error) { errs.add(err) })
	g := newGate()
	wait := func(ctx context.Context, req any) (any, error) {
		g.enter()
		defer g.in.Add(-1)
		<-g.open
		return "done", nil
	}
	call := func(method string, handler grpc.UnaryHandler) <-chan error {
		done := make(chan error, 1)
		go func() {
			resp, err := intercept(context.Background(), "req", &grpc.UnaryServerInfo{FullMethod: method}, handler)
			if err == nil && resp != "done" {
				err = errors.New("response lost")
			}
			done <- err
		}()
		return done
	}
	first, second := call("/m", wait), call("/m", wait)
	g.waitEntered(t, 2)
	err := <-call("/m", wait)
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted || len(st.Details()) != 1 || st.Details()[0].(*errdetails.RetryInfo).GetRetryDelay().AsDuration() != 30*time.Second {
		t.Fatalf("third call: %v; want ResourceExhausted, retry in 30s", err)
	}
	open := call("/open", wait)
	g.waitEntered(t, 1)
	close(g.open)
	for _, ch := range []<-chan error{first, second, open} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	// A panic gives the slot back, 3 times over 2 slots.
	for range 3 {
		func() {
			defer func() {
				if p := recover(); p != "boom" {
					t.Fatalf("recovered %v", p)
				}
			}()
			intercept(context.Background(), "req", &grpc.UnaryServerInfo{FullMethod: "/panic"}, func(context.Context, any) (any, error) { panic("boom") })
		}()
	}
	allFree(t, c, client.D("export", "/m"), 2, "the calls")
	allFree(t, c, client.D("export", "/panic"), 2, "the panics")
	if e := errs.get(); len(e) != 0 {
		t.Fatalf("onError told %v", e)
	}

	// ratelimitd down: fail closed, then open.
	dead := newClient(t, closedAddr(t), client.WithTimeout(time.Second))
	handled := func(context.Context, any) (any, error) { return "done", nil }
	for _, failOpen := range []bool{false, true} {
		var errs errorLog
		intercept := client.ConcurrencyUnaryServerInterceptor(dead, "api", byMethod, failOpen, func(ctx context.Context, err error) { errs.add(err) })
		resp, err := intercept(context.Background(), "req", &grpc.UnaryServerInfo{FullMethod: "/m"}, handled)
		if failOpen && (err != nil || resp != "done") || !failOpen && status.Code(err) != codes.Unavailable {
			t.Errorf("failOpen %v: %v, %v", failOpen, resp, err)
		}
		if e := errs.get(); len(e) != 1 || status.Code(e[0]) != codes.Unavailable {
			t.Errorf("failOpen %v: onError told %v", failOpen, e)
		}
	}
}
