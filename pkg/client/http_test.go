package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/pkg/client"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// hello is the handler behind the middleware; it counts its calls.
type hello struct{ calls atomic.Int64 }

func (h *hello) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.calls.Add(1)
	io.WriteString(w, "hello\n")
}

// byUser limits requests by their X-User header; without one, a request
// has no descriptor.
func byUser(r *http.Request) []client.Descriptor {
	u := r.Header.Get("X-User")
	if u == "" {
		return nil
	}
	return []client.Descriptor{client.D("user_id", u)}
}

func get(h http.Handler, user string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, "/hello", nil)
	if user != "" {
		r.Header.Set("X-User", user)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// rateLimitHeaders returns the rate-limit headers of h, Retry-After
// included.
func rateLimitHeaders(h http.Header) http.Header {
	out := http.Header{}
	for _, k := range []string{client.HeaderRetryAfter, client.HeaderLimit, client.HeaderRemaining, client.HeaderReset,
		client.HeaderXLimit, client.HeaderXRemaining, client.HeaderXRetryAfter} {
		if v := h.Get(k); v != "" {
			out.Set(k, v)
		}
	}
	return out
}

func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

// TestMiddleware: admitted requests reach the handler with the
// RateLimit-* headers; refused ones are answered 429 with Retry-After.
func TestMiddleware(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	var asked atomic.Int64
	counting := client.LimiterFunc(func(ctx context.Context, domain string, ds ...client.Descriptor) (client.Decision, error) {
		asked.Add(1)
		return c.Allow(ctx, domain, ds...)
	})
	next := &hello{}
	h := client.Middleware(counting, client.MiddlewareOptions{Domain: "api", Descriptors: byUser, Headers: client.HeadersRateLimit})(next)

	for i, want := range []http.Header{
		header("RateLimit-Limit", "3", "RateLimit-Remaining", "2", "RateLimit-Reset", "20"),
		header("RateLimit-Limit", "3", "RateLimit-Remaining", "1", "RateLimit-Reset", "40"),
		header("RateLimit-Limit", "3", "RateLimit-Remaining", "0", "RateLimit-Reset", "60"),
	} {
		w := get(h, "alice")
		if w.Code != http.StatusOK || w.Body.String() != "hello\n" {
			t.Fatalf("request %d: %d %q", i+1, w.Code, w.Body)
		}
		if got := rateLimitHeaders(w.Header()); !reflect.DeepEqual(got, want) {
			t.Errorf("request %d: headers %v, want %v", i+1, got, want)
		}
	}
	w := get(h, "alice")
	want := header("Retry-After", "20", "RateLimit-Limit", "3", "RateLimit-Remaining", "0", "RateLimit-Reset", "20")
	if w.Code != http.StatusTooManyRequests || w.Body.String() != "rate limit exceeded\n" || w.Header().Get("Content-Type") != "text/plain; charset=utf-8" {
		t.Fatalf("the 4th request: %d %q %v", w.Code, w.Body, w.Header())
	}
	if got := rateLimitHeaders(w.Header()); !reflect.DeepEqual(got, want) {
		t.Errorf("the 4th request: headers %v, want %v", got, want)
	}
	if n := next.calls.Load(); n != 3 {
		t.Errorf("the handler served %d requests, want 3", n)
	}
	// The extraction function tells users apart.
	if w := get(h, "bob"); w.Code != http.StatusOK || w.Header().Get("RateLimit-Remaining") != "2" {
		t.Errorf("bob: %d %v", w.Code, w.Header())
	}
	// A request without descriptors is not decided.
	before := asked.Load()
	if w := get(h, ""); w.Code != http.StatusOK || len(rateLimitHeaders(w.Header())) != 0 {
		t.Errorf("an anonymous request: %d %v", w.Code, w.Header())
	}
	if asked.Load() != before {
		t.Error("the limiter was asked about a request without descriptors")
	}
	// Once a token is back, alice is admitted again.
	s.clock.Advance(20 * time.Second)
	if w := get(h, "alice"); w.Code != http.StatusOK {
		t.Errorf("after the retry-after: %d", w.Code)
	}
}

// TestMiddlewareXRateLimit: the X-RateLimit-* style, a request's
// descriptors from its path too, and a custom refusal.
func TestMiddlewareXRateLimit(t *testing.T) {
	s := startServer(t, service.Options{})
	c := newClient(t, s.addr)
	s.clock.Advance(50 * time.Second) // the path window ends in 10s
	var limited client.Decision
	h := client.Middleware(c, client.MiddlewareOptions{
		Domain: "api",
		Descriptors: func(r *http.Request) []client.Descriptor {
			return append(byUser(r), client.D("path", r.URL.Path))
		},
		Headers: client.HeadersXRateLimit,
		OnLimited: func(w http.ResponseWriter, r *http.Request, d client.Decision) {
			limited = d
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":"slow down"}`)
		},
	})(&hello{})

	// The path's 5 per minute has the least remaining from the 4th
	// request; at the 3rd, the tie goes to the user, which comes first.
	want := []http.Header{
		header("X-RateLimit-Limit", "3", "X-RateLimit-Remaining", "2"),
		header("X-RateLimit-Limit", "3", "X-RateLimit-Remaining", "1"),
		header("X-RateLimit-Limit", "3", "X-RateLimit-Remaining", "2"),
		header("X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "1"),
		header("X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "0"),
	}
	for i, user := range []string{"alice", "alice", "bob", "carol", "dave"} {
		w := get(h, user)
		if got := rateLimitHeaders(w.Header()); w.Code != http.StatusOK || !reflect.DeepEqual(got, want[i]) {
			t.Errorf("request %d: %d %v, want 200 %v", i+1, w.Code, got, want[i])
		}
	}
	w := get(h, "erin")
	wantRefused := header("Retry-After", "10", "X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "0", "X-RateLimit-Retry-After", "10")
	if got := rateLimitHeaders(w.Header()); w.Code != http.StatusServiceUnavailable || w.Body.String() != `{"error":"slow down"}` || !reflect.DeepEqual(got, wantRefused) {
		t.Errorf("refused: %d %q %v, want OnLimited's answer with %v", w.Code, w.Body, got, wantRefused)
	}
	if limited.Allowed || limited.RetryAfter != 10*time.Second || len(limited.Results) != 2 {
		t.Errorf("OnLimited was given %+v", limited)
	}
}

// TestMiddlewareFailure: when ratelimitd cannot be reached, FailOpen
// passes requests through, and otherwise they are answered 503.
func TestMiddlewareFailure(t *testing.T) {
	c := newClient(t, closedAddr(t))
	for _, failOpen := range []bool{true, false} {
		var errs []error
		next := &hello{}
		h := client.Middleware(c, client.MiddlewareOptions{
			Domain:      "api",
			Descriptors: byUser,
			FailOpen:    failOpen,
			Headers:     client.HeadersRateLimit,
			OnError:     func(r *http.Request, err error) { errs = append(errs, err) },
		})(next)
		w := get(h, "alice")
		wantCode, wantBody := http.StatusOK, "hello\n"
		if !failOpen {
			wantCode, wantBody = http.StatusServiceUnavailable, "rate limit service unavailable\n"
		}
		if w.Code != wantCode || w.Body.String() != wantBody || len(rateLimitHeaders(w.Header())) != 0 {
			t.Errorf("FailOpen %v: %d %q %v, want %d %q", failOpen, w.Code, w.Body, w.Header(), wantCode, wantBody)
		}
		if len(errs) != 1 || status.Code(errs[0]) != codes.Unavailable {
			t.Errorf("FailOpen %v: OnError told of %v, want one Unavailable", failOpen, errs)
		}
	}
	// So does an error of any Limiter.
	failing := client.LimiterFunc(func(context.Context, string, ...client.Descriptor) (client.Decision, error) {
		return client.Decision{}, errors.New("no")
	})
	if w := get(client.Middleware(failing, client.MiddlewareOptions{Descriptors: byUser})(&hello{}), "alice"); w.Code != http.StatusServiceUnavailable {
		t.Errorf("a failing limiter, fail closed: %d", w.Code)
	}
}

func TestMiddlewarePanics(t *testing.T) {
	for name, opts := range map[string]client.MiddlewareOptions{
		"no Descriptors": {Domain: "api"},
		"unknown style":  {Descriptors: byUser, Headers: 7},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			client.Middleware(client.LimiterFunc(nil), opts)
		}()
	}
}

// TestHeadersMirrorServer: the middleware's headers for a decision are
// those ratelimitd asks Envoy to add for the same request, in each style.
func TestHeadersMirrorServer(t *testing.T) {
	requests := [][]client.Descriptor{
		{client.D("user_id", "a")},
		{client.D("user_id", "a"), client.D("path", "/m")},
		{client.D("path", "/m").Hits(3), client.D("user_id", "a")},
		{client.D("user_id", "a")},                                   // over: a token back in 20s
		{client.D("user_id", "a"), client.D("path", "/m").Hits(2)},   // both over: the window ends in 60s
		{client.D("trial", "t")},                                     // shadow: no headers
		{client.D("trial", "t"), client.D("internal", "x")},          // shadow over, unlimited
		{client.D("internal", "x"), client.D("unknown", "u")},        // nothing counted
		{client.D("user_id", "b").Hits(4), client.D("user_id", "c")}, // never
		{client.D("path", "/n"), client.D("user_id", "d").Hits(3), client.D("path", "/o")},
	}
	for _, style := range []struct {
		client client.HeaderStyle
		server service.HeaderStyle
	}{
		{client.HeadersNone, service.HeadersNone},
		{client.HeadersRateLimit, service.HeadersRateLimit},
		{client.HeadersXRateLimit, service.HeadersXRateLimit},
	} {
		t.Run(style.client.String(), func(t *testing.T) {
			s := startServer(t, service.Options{ResponseHeaders: style.server})
			c := newClient(t, s.addr)
			ctx := context.Background()
			var withHeaders, withRetry int
			for step, advance := range []time.Duration{0, 7500 * time.Millisecond} {
				s.clock.Advance(advance)
				for i, ds := range requests {
					// Peek answers as the call that follows decides.
					p, err := c.Peek(ctx, "api", ds...)
					if err != nil {
						t.Fatal(err)
					}
					d := client.NewDecision(p.Allowed, p.Results)
					got := http.Header{}
					client.SetHeaders(got, style.client, d)

					resp, err := c.ShouldRateLimit(ctx, rlsRequest(ds))
					if err != nil {
						t.Fatal(err)
					}
					if (resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT) == d.Allowed {
						t.Fatalf("step %d, request %d: peek %+v, then %v", step, i, d, resp)
					}
					want := http.Header{}
					for _, hv := range resp.ResponseHeadersToAdd {
						want.Set(hv.Key, hv.Value)
					}
					if !d.Allowed && style.server == service.HeadersNone && d.RetryAfter != client.Never {
						// The server adds no headers at all in style none;
						// the middleware still tells Retry-After.
						want.Set("Retry-After", got.Get("Retry-After"))
					}
					if !reflect.DeepEqual(got, want) {
						t.Errorf("step %d, request %d %v: headers %v, the server's %v", step, i, ds, got, want)
					}
					if len(want) > 0 {
						withHeaders++
					}
					if want.Get("Retry-After") != "" {
						withRetry++
					}
				}
			}
			// The comparison is of something.
			if (style.client != client.HeadersNone && withHeaders < 10) || withRetry < 3 {
				t.Errorf("%d answers with headers, %d with Retry-After", withHeaders, withRetry)
			}
		})
	}
}

// rlsRequest is Envoy's request of ds.
func rlsRequest(ds []client.Descriptor) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: "api"}
	for _, d := range ds {
		rd := &rlv3.RateLimitDescriptor{}
		for _, e := range d.Entries {
			rd.Entries = append(rd.Entries, &rlv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
		}
		if d.HitsAddend > 0 {
			rd.HitsAddend = wrapperspb.UInt64(d.HitsAddend)
		}
		req.Descriptors = append(req.Descriptors, rd)
	}
	return req
}

func TestHeaderStyleString(t *testing.T) {
	for h, want := range map[client.HeaderStyle]string{
		client.HeadersNone: "none", client.HeadersRateLimit: "ratelimit", client.HeadersXRateLimit: "x-ratelimit", 5: "HeaderStyle(5)",
	} {
		if got := h.String(); got != want {
			t.Errorf("%d: %q, want %q", h, got, want)
		}
	}
}
