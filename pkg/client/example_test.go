package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/pkg/client"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// ratelimitd starts a ratelimitd engine on a free port of 127.0.0.1 and
// returns its address and how to stop it. It decides the domain "api" of
// testRules, where user_id is limited to 3 per minute by a token bucket
// (a token back every 20s), and its clock stands still, so that every
// figure below is the same on every run.
func ratelimitd() (addr string, stop func()) {
	s, err := serve(service.Options{})
	if err != nil {
		panic(err)
	}
	return s.addr, s.stop
}

// ratelimitdRealTime is ratelimitd with the real clock, for the examples
// that wait: "pace" is limited to 4 per second there, a token back every
// 250ms.
func ratelimitdRealTime() (addr string, stop func()) {
	s, err := serveOn(service.Options{}, true)
	if err != nil {
		panic(err)
	}
	return s.addr, s.stop
}

func ExampleClient_Allow() {
	addr, stop := ratelimitd()
	defer stop()

	// A second for each call, for a loaded test machine; the default of
	// 100ms suits a request path better.
	c, err := client.New(addr, client.WithTimeout(time.Second))
	if err != nil {
		panic(err)
	}
	defer c.Close()

	for range 4 {
		d, err := c.Allow(context.Background(), "api", client.D("user_id", "alice"))
		if err != nil {
			fmt.Println("no decision:", err) // fail open or closed
			return
		}
		fmt.Printf("allowed=%v remaining=%d retry-after=%v\n", d.Allowed, d.Results[0].Remaining, d.RetryAfter)
	}
	// Output:
	// allowed=true remaining=2 retry-after=0s
	// allowed=true remaining=1 retry-after=0s
	// allowed=true remaining=0 retry-after=0s
	// allowed=false remaining=0 retry-after=20s
}

func ExampleClient_Peek() {
	addr, stop := ratelimitd()
	defer stop()
	c, err := client.New(addr, client.WithTimeout(time.Second))
	if err != nil {
		panic(err)
	}
	defer c.Close()

	// Would 2 hits pass? Peeking twice counts nothing.
	for range 2 {
		resp, err := c.Peek(context.Background(), "api", client.D("user_id", "bob").Hits(2))
		if err != nil {
			panic(err)
		}
		d := client.NewDecision(resp.Allowed, resp.Results)
		r := d.Results[0]
		fmt.Printf("allowed=%v remaining=%d rule=%s limit=%d per %v (%s)\n",
			d.Allowed, r.Remaining, r.Rule, r.Limit.Requests, r.Limit.Window, r.Limit.Algorithm)
	}
	// Output:
	// allowed=true remaining=1 rule=api.user_id limit=3 per 1m0s (token_bucket)
	// allowed=true remaining=1 rule=api.user_id limit=3 per 1m0s (token_bucket)
}

func ExampleMiddleware() {
	addr, stop := ratelimitd()
	defer stop()
	c, err := client.New(addr, client.WithTimeout(time.Second))
	if err != nil {
		panic(err)
	}
	defer c.Close()

	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello\n")
	})
	limit := client.Middleware(c, client.MiddlewareOptions{
		Domain: "api",
		// One limit per user, named by a header here; by their
		// credentials in earnest.
		Descriptors: func(r *http.Request) []client.Descriptor {
			return []client.Descriptor{client.D("user_id", r.Header.Get("X-User"))}
		},
		FailOpen: true, // serve requests when ratelimitd is down
		Headers:  client.HeadersRateLimit,
	})
	srv := httptest.NewServer(limit(hello))
	defer srv.Close()

	for range 4 {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header.Set("X-User", "alice")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%s: RateLimit-Remaining=%s RateLimit-Reset=%s Retry-After=%q: %s",
			resp.Status, resp.Header.Get("RateLimit-Remaining"), resp.Header.Get("RateLimit-Reset"),
			resp.Header.Get("Retry-After"), body)
	}
	// Output:
	// 200 OK: RateLimit-Remaining=2 RateLimit-Reset=20 Retry-After="": hello
	// 200 OK: RateLimit-Remaining=1 RateLimit-Reset=40 Retry-After="": hello
	// 200 OK: RateLimit-Remaining=0 RateLimit-Reset=60 Retry-After="": hello
	// 429 Too Many Requests: RateLimit-Remaining=0 RateLimit-Reset=20 Retry-After="20": rate limit exceeded
}

func ExampleMiddleware_maxWait() {
	addr, stop := ratelimitdRealTime()
	defer stop()
	c, err := client.New(addr, client.WithTimeout(time.Second))
	if err != nil {
		panic(err)
	}
	defer c.Close()

	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello\n")
	})
	limit := client.Middleware(c, client.MiddlewareOptions{
		Domain: "api",
		Descriptors: func(r *http.Request) []client.Descriptor {
			return []client.Descriptor{client.D("pace", r.Header.Get("X-User"))} // 4 per second
		},
		// Hold refused requests until they are admitted, up to 2s each and
		// 100 at once, rather than answer 429 at once.
		MaxWait:    2 * time.Second,
		MaxWaiting: 100,
	})
	srv := httptest.NewServer(limit(hello))
	defer srv.Close()

	// 6 requests at once: 4 are served at once, and the others as tokens
	// come back, 250ms apart.
	began := time.Now()
	statuses := make([]string, 6)
	var wg sync.WaitGroup
	for i := range statuses {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
			req.Header.Set("X-User", "alice")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				panic(err)
			}
			resp.Body.Close()
			statuses[i] = resp.Status
		})
	}
	wg.Wait()
	fmt.Println(statuses)
	fmt.Println("took half a second:", time.Since(began) >= 490*time.Millisecond)
	// Output:
	// [200 OK 200 OK 200 OK 200 OK 200 OK 200 OK]
	// took half a second: true
}

func ExampleClient_Wait() {
	addr, stop := ratelimitdRealTime()
	defer stop()
	c, err := client.New(addr, client.WithTimeout(time.Second))
	if err != nil {
		panic(err)
	}
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// 4 per second: the 5th request waits for a token, a quarter of a
	// second.
	began := time.Now()
	for range 5 {
		d, err := c.Wait(ctx, "api", client.D("pace", "alice"))
		if err != nil {
			fmt.Println("not admitted:", err)
			return
		}
		fmt.Println("admitted:", d.Allowed)
	}
	fmt.Println("waited a quarter of a second:", time.Since(began) >= 240*time.Millisecond)

	// More hits than the limit ever holds: no wait admits them, and Wait
	// says so at once.
	_, err = c.Wait(ctx, "api", client.D("pace", "alice").Hits(5))
	fmt.Println(errors.Is(err, client.ErrNever))
	// Output:
	// admitted: true
	// admitted: true
	// admitted: true
	// admitted: true
	// admitted: true
	// waited a quarter of a second: true
	// true
}

func ExampleNewWaiter() {
	// An address nothing listens on: ratelimitd is down.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	c, err := client.New(addr)
	if err != nil {
		panic(err)
	}
	defer c.Close()

	// Retry 3 times, after 10ms, 20ms and 40ms at most, then admit (fail
	// open).
	w := client.NewWaiter(c, client.WaitOptions{
		Retries:  3,
		FailOpen: true,
		OnError:  func(err error) { fmt.Println("no decision:", status.Code(err)) },
	})
	d, err := w.Wait(context.Background(), "api", client.D("user_id", "alice"))
	fmt.Println("allowed:", d.Allowed, err)
	// Output:
	// no decision: Unavailable
	// no decision: Unavailable
	// no decision: Unavailable
	// no decision: Unavailable
	// allowed: true <nil>
}

func ExampleUnaryServerInterceptor() {
	addr, stop := ratelimitd()
	defer stop()
	c, err := client.New(addr, client.WithTimeout(time.Second))
	if err != nil {
		panic(err)
	}
	defer c.Close()

	// A gRPC server limiting each caller, named by its x-user metadata.
	byUser := func(ctx context.Context, fullMethod string, req any) []client.Descriptor {
		md, _ := metadata.FromIncomingContext(ctx)
		if u := md.Get("x-user"); len(u) > 0 {
			return []client.Descriptor{client.D("user_id", u[0])}
		}
		return nil // anonymous calls are not limited
	}
	gs := grpc.NewServer(grpc.UnaryInterceptor(client.UnaryServerInterceptor(c, "api", byUser, true)))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go gs.Serve(lis)
	defer gs.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-user", "alice")
	for range 4 {
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		st := status.Convert(err)
		fmt.Print(st.Code())
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				fmt.Print(": retry in ", ri.GetRetryDelay().AsDuration())
			}
		}
		fmt.Println()
	}
	// Output:
	// OK
	// OK
	// OK
	// ResourceExhausted: retry in 20s
}

func ExampleD() {
	fmt.Println(client.D("user_id", "alice"))
	fmt.Println(client.D("user_id", "alice", "path", "/upload").Hits(3))
	// Output:
	// user_id=alice
	// user_id=alice,path=/upload hits=3
}

func ExampleClient_Acquire() {
	addr, stop := ratelimitd() // "export": 2 in flight, lease_ttl 30s
	defer stop()
	c, err := client.New(addr, client.WithTimeout(time.Second))
	if err != nil {
		panic(err)
	}
	defer c.Close()
	ctx := context.Background()

	var leases []string
	for range 3 {
		s, err := c.Acquire(ctx, "api", client.D("export", "alice"))
		if err != nil {
			panic(err) // fail open or closed, as the work demands
		}
		r := s.Results[0]
		fmt.Printf("allowed %v: %d of %d in flight, lease TTL %v, retry after %v\n",
			s.Allowed, r.Concurrency.InFlight, r.Concurrency.MaxInFlight, s.TTL, r.RetryAfter)
		if s.Allowed {
			leases = append(leases, s.LeaseID)
		}
	}
	// The work is done: give a slot back (with a context that has not
	// ended, in earnest context.WithoutCancel of the request's).
	released, err := c.Release(ctx, leases[0])
	fmt.Println("released:", released, err)
	released, err = c.Release(ctx, leases[0])
	fmt.Println("released again:", released, err)
	s, err := c.Acquire(ctx, "api", client.D("export", "alice"))
	fmt.Println("allowed after the release:", s.Allowed, err)
	// Output:
	// allowed true: 1 of 2 in flight, lease TTL 30s, retry after 0s
	// allowed true: 2 of 2 in flight, lease TTL 30s, retry after 0s
	// allowed false: 2 of 2 in flight, lease TTL 0s, retry after 30s
	// released: true <nil>
	// released again: false <nil>
	// allowed after the release: true <nil>
}

func ExampleConcurrencyMiddleware() {
	addr, stop := ratelimitd() // "export": 2 in flight, lease_ttl 30s
	defer stop()
	c, err := client.New(addr, client.WithTimeout(time.Second))
	if err != nil {
		panic(err)
	}
	defer c.Close()

	started, finish := make(chan struct{}), make(chan struct{})
	export := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-finish // a long export
		io.WriteString(w, "exported\n")
	})
	limit := client.ConcurrencyMiddleware(c, client.ConcurrencyOptions{
		Domain: "api",
		Descriptors: func(r *http.Request) []client.Descriptor {
			return []client.Descriptor{client.D("export", r.Header.Get("X-User"))}
		},
	})
	srv := httptest.NewServer(limit(export))
	defer srv.Close()
	get := func() string {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header.Set("X-User", "alice")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("%s, Retry-After=%q: %s", resp.Status, resp.Header.Get("Retry-After"), body)
	}

	// Two exports run; a third is refused while they do.
	answers := make(chan string, 2)
	for range 2 {
		go func() { answers <- get() }()
		<-started
	}
	fmt.Print(get())
	close(finish)
	fmt.Print(<-answers)
	fmt.Print(<-answers)
	// Their slots are back: the next export runs.
	go func() { <-started }()
	fmt.Print(get())
	// Output:
	// 429 Too Many Requests, Retry-After="30": rate limit exceeded
	// 200 OK, Retry-After="": exported
	// 200 OK, Retry-After="": exported
	// 200 OK, Retry-After="": exported
}
