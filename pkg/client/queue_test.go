package client_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/client"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// queued tells a test about the requests of a queueing middleware: those
// waiting, and those answered.
type queued struct {
	mu       sync.Mutex
	settled  map[int]chan struct{} // closed when the request waits or is answered
	waited   map[int]bool          // the requests that waited
	served   []int                 // the handler's requests, in order
	servedAt []time.Time
}

func newQueued() *queued { return &queued{settled: map[int]chan struct{}{}, waited: map[int]bool{}} }

// seq is the number of request r, its X-Seq header.
func seq(r *http.Request) int {
	n, err := strconv.Atoi(r.Header.Get("X-Seq"))
	if err != nil {
		return -1
	}
	return n
}

// settle closes the channel of request n, once.
func (q *queued) settle(n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	ch := q.ch(n)
	select {
	case <-ch:
	default:
		close(ch)
	}
}

func (q *queued) ch(n int) chan struct{} {
	ch, ok := q.settled[n]
	if !ok {
		ch = make(chan struct{})
		q.settled[n] = ch
	}
	return ch
}

// wait returns once request n waits or is answered.
func (q *queued) wait(n int) {
	q.mu.Lock()
	ch := q.ch(n)
	q.mu.Unlock()
	<-ch
}

// ServeHTTP is the handler behind the middleware.
func (q *queued) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q.mu.Lock()
	q.served = append(q.served, seq(r))
	q.servedAt = append(q.servedAt, time.Now())
	q.mu.Unlock()
	w.Write([]byte("hello\n"))
}

// OnWait is the middleware's OnWait.
func (q *queued) OnWait(r *http.Request, d client.Decision) {
	q.mu.Lock()
	q.waited[seq(r)] = true
	q.mu.Unlock()
	q.settle(seq(r))
}

// send sends request n of user to h, answered by the time it returns.
func (q *queued) send(ctx context.Context, h http.Handler, user string, n int) *httptest.ResponseRecorder {
	r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/hello", nil)
	r.Header.Set("X-User", user)
	r.Header.Set("X-Seq", strconv.Itoa(n))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	q.settle(n)
	return w
}

// byPace limits requests by their X-User header on the pace rule, 4 per
// second.
func byPace(r *http.Request) []client.Descriptor {
	return []client.Descriptor{client.D("pace", r.Header.Get("X-User"))}
}

// TestQueueAdmitsInOrder, in real time: refused requests wait, and are
// admitted in the order they arrived, each once a token is back.
func TestQueueAdmitsInOrder(t *testing.T) {
	s := startRealTimeServer(t)
	c := newClient(t, s.addr)
	q := newQueued()
	h := client.Middleware(c, client.MiddlewareOptions{
		Domain:      "api",
		Descriptors: byPace,
		Headers:     client.HeadersRateLimit,
		MaxWait:     time.Minute,
		MaxWaiting:  100,
		OnWait:      q.OnWait,
	})(q)
	ctx := context.Background()
	began := time.Now()
	if d, err := c.Allow(ctx, "api", client.D("pace", "alice").Hits(4)); err != nil || !d.Allowed {
		t.Fatalf("4 hits of 4: %+v, %v", d, err)
	}
	// Each request is sent once the one before waits (or, on a machine
	// slow enough for a token to be back, is served).
	const n = 6
	answers := make([]*httptest.ResponseRecorder, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { answers[i] = q.send(ctx, h, "alice", i) })
		q.wait(i)
	}
	wg.Wait()
	for i, w := range answers {
		if w.Code != http.StatusOK || w.Header().Get(client.HeaderLimit) != "4" {
			t.Errorf("request %d: %d %v, want 200 with the rate-limit headers", i, w.Code, w.Header())
		}
	}
	for i := range n {
		if i >= len(q.served) || q.served[i] != i {
			t.Fatalf("served %v, want the order of arrival", q.served)
		}
		// A token is back every 250ms after the bucket was emptied: the
		// ith is served after i+1 of them, never sooner.
		if at, want := q.servedAt[i].Sub(began), time.Duration(i+1)*250*time.Millisecond; at < want-5*time.Millisecond {
			t.Errorf("request %d served %v after the bucket was emptied, want %v or later", i, at, want)
		}
	}
}

// callAllowance is how long TestQueueMaxWait lets a request be answered
// past MaxWait: the middleware may have a call to ratelimitd in flight
// when MaxWait ends.
const callAllowance = 300 * time.Millisecond

// TestQueueMaxWait, in real time: requests that cannot be admitted within
// MaxWait are answered 429, with Retry-After, no later than MaxWait; each
// request gets its handler or a 429.
func TestQueueMaxWait(t *testing.T) {
	s := startRealTimeServer(t)
	c := newClient(t, s.addr)
	q := newQueued()
	const maxWait = 600 * time.Millisecond
	var limited atomic.Int64
	h := client.Middleware(c, client.MiddlewareOptions{
		Domain:      "api",
		Descriptors: byPace,
		MaxWait:     maxWait,
		MaxWaiting:  100,
		OnWait:      q.OnWait,
		OnLimited: func(w http.ResponseWriter, r *http.Request, d client.Decision) {
			limited.Add(1)
			w.WriteHeader(http.StatusTooManyRequests)
		},
	})(q)
	// 20 requests at once, of two users, 4 per second each: serving them
	// all would take 2s, and the queues hold none past 600ms.
	const n = 20
	answers := make([]*httptest.ResponseRecorder, n)
	took := make([]time.Duration, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			began := time.Now()
			answers[i] = q.send(context.Background(), h, []string{"bob", "carol"}[i%2], i)
			took[i] = time.Since(began)
		})
	}
	wg.Wait()
	var ok, refused int
	for i, w := range answers {
		switch w.Code {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
			refused++
			if w.Header().Get(client.HeaderRetryAfter) == "" {
				t.Errorf("request %d: 429 without Retry-After", i)
			}
		default:
			t.Errorf("request %d: %d, want 200 or 429", i, w.Code)
		}
		// MaxWait, and the call to ratelimitd that may be in flight then
		// (a loopback call; the allowance is for a loaded machine). With
		// MaxWait ignored, the last would be answered after about 1.5s,
		// once 12 more tokens are back.
		if took[i] > maxWait+callAllowance {
			t.Errorf("request %d answered after %v, want MaxWait (%v) and a call (%v) at most", i, took[i], maxWait, callAllowance)
		}
	}
	if ok+refused != n || ok != len(q.served) || refused != int(limited.Load()) {
		t.Errorf("%d served (the handler saw %d), %d refused (OnLimited saw %d), want %d in all",
			ok, len(q.served), refused, limited.Load(), n)
	}
	// At least the buckets' 8 tokens, and some waited for more; not all.
	if ok < 8 || refused == 0 {
		t.Errorf("%d served, %d refused", ok, refused)
	}
}

// TestQueueBeyondMaxWait: a retry-after longer than MaxWait is answered
// at once, as without a queue.
func TestQueueBeyondMaxWait(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	q := newQueued()
	h := client.Middleware(c, client.MiddlewareOptions{
		Domain:      "api",
		Descriptors: byUser,
		MaxWait:     10 * time.Second,
		MaxWaiting:  100,
		OnWait:      func(r *http.Request, d client.Decision) { t.Errorf("request %d waits", seq(r)) },
	})(q)
	if d, err := c.Allow(context.Background(), "api", client.D("user_id", "alice").Hits(3)); err != nil || !d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
	// A token is back in 20s.
	began := time.Now()
	w := q.send(context.Background(), h, "alice", 1)
	if w.Code != http.StatusTooManyRequests || w.Header().Get(client.HeaderRetryAfter) != "20" || len(q.served) != 0 {
		t.Errorf("%d %v, want 429 with Retry-After: 20", w.Code, w.Header())
	}
	if took := time.Since(began); took >= 10*time.Second {
		t.Errorf("answered after %v, want at once", took)
	}
}

// TestQueueFull: when MaxWaiting requests wait, the next refused one is
// answered 429 at once; other descriptors are not held up by a queue; a
// request cancelled while it waits is answered 429.
func TestQueueFull(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	q := newQueued()
	h := client.Middleware(c, client.MiddlewareOptions{
		Domain:      "api",
		Descriptors: byUser,
		Headers:     client.HeadersRateLimit,
		MaxWait:     time.Minute,
		MaxWaiting:  2,
		OnWait:      q.OnWait,
	})(q)
	if d, err := c.Allow(context.Background(), "api", client.D("user_id", "alice").Hits(3)); err != nil || !d.Allowed {
		t.Fatalf("%+v, %v", d, err)
	}
	// The server's clock stands still: alice's requests wait (a token is
	// back in 20s) until cancelled.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiting := make([]*httptest.ResponseRecorder, 2)
	var wg sync.WaitGroup
	for i := range waiting {
		wg.Go(func() { waiting[i] = q.send(ctx, h, "alice", i) })
		q.wait(i)
	}
	w := q.send(context.Background(), h, "alice", 2)
	if w.Code != http.StatusTooManyRequests || w.Header().Get(client.HeaderRetryAfter) != "20" || w.Header().Get(client.HeaderRemaining) != "0" {
		t.Errorf("a third waiter: %d %v, want 429 with Retry-After: 20", w.Code, w.Header())
	}
	// bob asks, and is served, whatever alice's queue.
	if w := q.send(context.Background(), h, "bob", 3); w.Code != http.StatusOK {
		t.Errorf("bob: %d", w.Code)
	}
	cancel()
	wg.Wait()
	for i, w := range waiting {
		if w.Code != http.StatusTooManyRequests || w.Header().Get(client.HeaderRetryAfter) == "" {
			t.Errorf("waiter %d cancelled: %d %v, want 429 with Retry-After", i, w.Code, w.Header())
		}
	}
	if len(q.served) != 1 || q.served[0] != 3 {
		t.Errorf("served %v, want bob's only", q.served)
	}
	// The queue is empty again: the next of alice's requests waits.
	ctx, cancel = context.WithCancel(context.Background())
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- q.send(ctx, h, "alice", 4) }()
	q.wait(4)
	cancel()
	if w := <-done; w.Code != http.StatusTooManyRequests || !q.waited[4] {
		t.Errorf("a request after the queue emptied: %d, waited %v; want it to wait until cancelled", w.Code, q.waited[4])
	}
}

func TestMiddlewareMaxWaitWithoutMaxWaiting(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("MaxWait without MaxWaiting: no panic")
		}
	}()
	client.Middleware(client.LimiterFunc(nil), client.MiddlewareOptions{Descriptors: byUser, MaxWait: time.Second})
}
