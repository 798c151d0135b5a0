// Package client calls ratelimitd from Go, waits for its admissions, and
// enforces its decisions in net/http servers and gRPC servers.
//
// A [Client] speaks both of ratelimitd's gRPC APIs on one connection: its
// own ratelimitd.v1.RateLimiter ([Client.Allow], [Client.Check],
// [Client.Peek], [Client.Reset]) and Envoy's RateLimitService v3
// ([Client.ShouldRateLimit], [Client.AllowRLS]). Both are decided by the
// same engine under the same rules and counters.
//
//	c, err := client.New("ratelimitd:8081") // plaintext unless told otherwise
//	if err != nil {
//		return err
//	}
//	defer c.Close()
//
//	d, err := c.Allow(ctx, "api", client.D("user_id", "alice"))
//	switch {
//	case err != nil:
//		// ratelimitd is unreachable or refused the call: fail open or closed.
//	case !d.Allowed:
//		// Over the limit: come back after d.RetryAfter (unless it is client.Never).
//	}
//
// [Middleware] and [UnaryServerInterceptor] do that for every request of
// an HTTP handler or a gRPC server, with descriptors a function of yours
// extracts from each request:
//
//	limited := client.Middleware(c, client.MiddlewareOptions{
//		Domain: "api",
//		Descriptors: func(r *http.Request) []client.Descriptor {
//			return []client.Descriptor{client.D("user_id", r.Header.Get("X-User"))}
//		},
//		FailOpen: true,
//		Headers:  client.HeadersRateLimit,
//	})
//	http.ListenAndServe(":8080", limited(handler))
//
// Both take a [Limiter], which a *Client is; [LimiterFunc] adapts any
// function, such as [Client.AllowRLS] to enforce through the Envoy API, or
// a fake in tests.
//
// With MiddlewareOptions.MaxWait, [Middleware] holds refused requests
// instead of answering 429 at once: each waits in a bounded queue of the
// requests with its descriptors, first in, first out, until the limit
// admits it, and is answered 429 only when it could not be admitted within
// MaxWait or MaxWaiting requests wait already.
//
// Callers that would rather wait than be refused, such as batch jobs and
// outbound calls to a limited API, use [Client.Wait], as they would
// golang.org/x/time/rate's Limiter.Wait: it sleeps each refusal's
// retry-after, with jitter, and asks again, until the request is admitted
// or ctx ends; it returns at once when no wait admits the request
// ([ErrNever]) or the context's deadline comes first
// ([ErrWouldExceedDeadline]). [NewWaiter] chooses what failed calls do:
// fail closed (the default), fail open, or retry with capped exponential
// backoff; [Wait] waits on any Limiter.
//
//	w := client.NewWaiter(c, client.WaitOptions{Retries: client.RetryForever})
//	if _, err := w.Wait(ctx, "partner-api", client.D("partner", "acme")); err != nil {
//		return err // ctx ended, or the request asks for more than its limit holds
//	}
//	// Admitted: call the partner's API.
//
// Concurrency limits cap the requests in flight at once rather than per
// unit of time: [Client.Acquire] takes a slot and answers a lease id,
// [Client.Release] gives it back and [Client.Renew] keeps it past its
// lease TTL. [ConcurrencyMiddleware] and
// [ConcurrencyUnaryServerInterceptor] hold a slot around every request of
// a handler, released however it ends and renewed while it runs.
//
// The package imports nothing of ratelimitd but its generated API
// (package ratelimitdv1), so that linking it into an application is
// cheap.
package client
