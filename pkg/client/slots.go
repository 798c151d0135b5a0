package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

// Slots is ratelimitd's answer to [Client.Acquire]: its decision and,
// when it took concurrency slots, the lease that holds them.
type Slots struct {
	// Decision is the request's decision, its rate limits and its slots
	// together; each descriptor's slots are in its Result's Concurrency.
	// A refusal by a full concurrency limit has a RetryAfter of the time
	// until the first holder's lease TTL ends: a release may free a slot
	// sooner, and a renewal keep it longer.
	Decision
	// LeaseID names the slots taken, for [Client.Release] and
	// [Client.Renew]. It is empty when the request was refused, and when
	// it was admitted without taking a slot: no rule of its descriptors
	// has a concurrency limit (or only full shadow_mode ones), or the
	// server decided by its failure mode open.
	LeaseID string
	// TTL is how long the slots are held unless released or renewed: the
	// shortest lease_ttl of their rules. Zero without a lease.
	TTL time.Duration
}

// Acquire takes a slot of every concurrency limit the descriptors' rules
// of domain have, and decides their rate limits as [Client.Allow] does,
// all or nothing: when the request is refused, no slot is taken and no
// hit counted. ratelimitd counts the request in flight until
// [Client.Release] gives its slots back, or until their TTL ends; work
// that may outlive the TTL keeps them with [Client.Renew].
//
// Release every lease Acquire answers with, however the work ends, with
// a context that has not ended then:
//
//	s, err := c.Acquire(ctx, "jobs", client.D("export", tenant))
//	// err: fail open or closed; !s.Allowed: come back later.
//	defer c.Release(context.WithoutCancel(ctx), s.LeaseID)
//
// [ConcurrencyMiddleware] and [ConcurrencyUnaryServerInterceptor] do
// this, renewals included, around every request of a handler.
//
// An error means no decision was made and no slot taken.
func (c *Client) Acquire(ctx context.Context, domain string, descriptors ...Descriptor) (Slots, error) {
	ctx, cancel := c.withDeadline(ctx)
	defer cancel()
	resp, err := c.own.Acquire(ctx, &ratelimitdv1.AcquireRequest{Domain: domain, Descriptors: protos(descriptors)})
	if err != nil {
		return Slots{}, err
	}
	return Slots{
		Decision: NewDecision(resp.GetAllowed(), resp.GetResults()),
		LeaseID:  resp.GetLeaseId(),
		TTL:      resp.GetTtl().AsDuration(),
	}, nil
}

// Release gives back the slots of lease leaseID, as [Client.Acquire]
// answered it. It reports whether a slot was given back: false when the
// lease held none any more (released before, or its TTL ended), which is
// no error, so that releasing twice is harmless. An empty leaseID, that
// of an Acquire that took no slot, releases nothing and calls no server.
//
// When Release fails, the slots stay held until their TTL ends.
func (c *Client) Release(ctx context.Context, leaseID string) (bool, error) {
	if leaseID == "" {
		return false, nil
	}
	ctx, cancel := c.withDeadline(ctx)
	defer cancel()
	resp, err := c.own.Release(ctx, &ratelimitdv1.ReleaseRequest{LeaseId: leaseID})
	if err != nil {
		return false, err
	}
	return resp.GetReleased(), nil
}

// Renew keeps the slots of lease leaseID for another TTL, which it
// returns, for work that outlives the TTL: renew every third of it or so,
// so that a failed renewal can be retried in time. renewed is false when
// a slot had been lost already (its TTL ended first): ratelimitd no longer
// counts the work in flight there, and another caller may hold that slot
// now; Acquire again to be counted. An empty leaseID is InvalidArgument.
func (c *Client) Renew(ctx context.Context, leaseID string) (renewed bool, ttl time.Duration, err error) {
	ctx, cancel := c.withDeadline(ctx)
	defer cancel()
	resp, err := c.own.Renew(ctx, &ratelimitdv1.RenewRequest{LeaseId: leaseID})
	if err != nil {
		return false, 0, err
	}
	return resp.GetRenewed(), resp.GetTtl().AsDuration(), nil
}

// ConcurrencyLimiter takes, gives back and keeps concurrency slots: a
// [*Client], or a fake in tests. Its methods are those of [*Client].
type ConcurrencyLimiter interface {
	Acquire(ctx context.Context, domain string, descriptors ...Descriptor) (Slots, error)
	Release(ctx context.Context, leaseID string) (bool, error)
	Renew(ctx context.Context, leaseID string) (renewed bool, ttl time.Duration, err error)
}

var _ ConcurrencyLimiter = (*Client)(nil)

// ErrSlotsLost is told to the OnError of [ConcurrencyMiddleware] and
// [ConcurrencyUnaryServerInterceptor], once per request, when its lease
// lost slots while its handler ran: the renewals failed until the lease
// TTL ended, or the handler outlived a TTL that nothing renewed. The
// handler goes on, but ratelimitd no longer counts it in flight and may
// admit another request in its place. Test for it with errors.Is.
var ErrSlotsLost = errors.New("client: the request's concurrency slots were lost while its handler ran (their lease TTL ended before a renewal): ratelimitd no longer counts it in flight")

// DefaultReleaseTimeout bounds each Release and Renew call of
// [ConcurrencyMiddleware] (unless ConcurrencyOptions.ReleaseTimeout says
// otherwise) and [ConcurrencyUnaryServerInterceptor]. They are made with
// a context of their own, since the request's may be cancelled; a release
// that fails leaves the slots held until their TTL ends.
const DefaultReleaseTimeout = time.Second

// ConcurrencyOptions configure [ConcurrencyMiddleware].
type ConcurrencyOptions struct {
	// Domain is the rules' domain the requests acquire slots in.
	Domain string
	// Descriptors returns the descriptors of a request, such as
	// D("export", tenant). Required. A request with no descriptor is
	// passed through, holding nothing.
	Descriptors func(*http.Request) []Descriptor
	// FailOpen passes requests through, holding no slot, when Acquire
	// fails (the service is unreachable, too slow, or errs); otherwise
	// they are answered 503 Service Unavailable.
	FailOpen bool
	// OnLimited, when set, answers refused requests instead of the default
	// 429 Too Many Requests with a short text body. Retry-After is already
	// set; it writes the status and the body.
	OnLimited func(w http.ResponseWriter, r *http.Request, d Decision)
	// OnError, when set, is told of every failed Acquire, before the
	// request is passed through or refused as FailOpen says; of every
	// failed Renew and Release; and of lost slots ([ErrSlotsLost]). For
	// logs and metrics: it is called from other goroutines than the
	// handler's, while the handler runs, and must be safe for that.
	OnError func(r *http.Request, err error)
	// ReleaseTimeout bounds each Release and Renew call. Default
	// [DefaultReleaseTimeout].
	ReleaseTimeout time.Duration
}

// ConcurrencyMiddleware returns middleware that holds concurrency slots
// for every request while its handler runs: it acquires them with l in
// opts.Domain, for the descriptors opts.Descriptors extracts, before the
// handler, and releases them after it. The descriptors' rate limits are
// decided with the slots, all or nothing (see [Client.Acquire]). It panics
// when opts.Descriptors is nil.
//
// A refused request is answered 429 Too Many Requests, with Retry-After:
// the time until the first holder's lease TTL ends, in whole seconds, for
// a full concurrency limit (a slot may be free sooner). When Acquire
// fails, the request is passed through without a slot or answered 503, as
// opts.FailOpen says.
//
// The slots are released when the handler returns, and when it panics
// (the panic goes on after the release), with a context of their own
// bounded by opts.ReleaseTimeout: the request's may be cancelled. A
// failed release is told to opts.OnError, never to the client: the slots
// end with their TTL. The response is complete once the release is done.
//
// While the handler runs, the lease is renewed every third of its TTL,
// so that a handler slower than the TTL keeps its slots, and a failed
// renewal is retried in time. When a renewal finds a slot lost, the
// handler is not stopped: opts.OnError is told [ErrSlotsLost].
func ConcurrencyMiddleware(l ConcurrencyLimiter, opts ConcurrencyOptions) func(http.Handler) http.Handler {
	if opts.Descriptors == nil {
		panic("client.ConcurrencyMiddleware: ConcurrencyOptions.Descriptors is nil")
	}
	if opts.ReleaseTimeout <= 0 {
		opts.ReleaseTimeout = DefaultReleaseTimeout
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ds := opts.Descriptors(r)
			if len(ds) == 0 {
				next.ServeHTTP(w, r)
				return
			}
			report := func(err error) {
				if opts.OnError != nil {
					opts.OnError(r, err)
				}
			}
			s, err := l.Acquire(r.Context(), opts.Domain, ds...)
			if err != nil {
				report(err)
				if opts.FailOpen {
					next.ServeHTTP(w, r)
					return
				}
				writeText(w, http.StatusServiceUnavailable, unavailableBody)
				return
			}
			if !s.Allowed {
				SetHeaders(w.Header(), HeadersNone, s.Decision)
				if opts.OnLimited != nil {
					opts.OnLimited(w, r, s.Decision)
					return
				}
				writeText(w, http.StatusTooManyRequests, limitedBody)
				return
			}
			hold(r.Context(), l, s, opts.ReleaseTimeout, report, func() { next.ServeHTTP(w, r) })
		})
	}
}

// ConcurrencyUnaryServerInterceptor returns a gRPC server interceptor
// that holds concurrency slots for every unary call while its handler
// runs, as [ConcurrencyMiddleware] does for HTTP: acquired with l in
// domain, for the descriptors descriptors extracts from the call (its
// full method and its request message), and released when the handler
// returns or panics, with a context of their own bounded by
// [DefaultReleaseTimeout]; renewed every third of their TTL meanwhile. A
// call with no descriptor is handled holding nothing.
//
// A refused call fails as [UnaryServerInterceptor] fails it: with
// [LimitedStatus], codes.ResourceExhausted and a RetryInfo. When Acquire
// fails, the call is handled without a slot with failOpen, and fails with
// codes.Unavailable otherwise (or with the caller's own cancellation or
// deadline, when that is what ended it).
//
// onError, when not nil, is told of every failed Acquire, Renew and
// Release, and of lost slots ([ErrSlotsLost]), with the call's context;
// it is called from other goroutines than the handler's, and must be
// safe for that. A failed Release fails no call: its slots end with their
// TTL.
//
// It panics when descriptors is nil.
func ConcurrencyUnaryServerInterceptor(l ConcurrencyLimiter, domain string, descriptors func(ctx context.Context, fullMethod string, req any) []Descriptor, failOpen bool, onError func(ctx context.Context, err error)) grpc.UnaryServerInterceptor {
	if descriptors == nil {
		panic("client.ConcurrencyUnaryServerInterceptor: nil descriptors function")
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		ds := descriptors(ctx, info.FullMethod, req)
		if len(ds) == 0 {
			return handler(ctx, req)
		}
		report := func(err error) {
			if onError != nil {
				onError(ctx, err)
			}
		}
		s, err := l.Acquire(ctx, domain, ds...)
		if err != nil {
			report(err)
			if ctxErr := ctx.Err(); ctxErr != nil {
				return nil, status.FromContextError(ctxErr).Err()
			}
			if failOpen {
				return handler(ctx, req)
			}
			return nil, status.Errorf(codes.Unavailable, "rate limit service unavailable: %v", status.Convert(err).Message())
		}
		if !s.Allowed {
			return nil, LimitedStatus(s.Decision).Err()
		}
		hold(ctx, l, s, DefaultReleaseTimeout, report, func() { resp, err = handler(ctx, req) })
		return resp, err
	}
}

// hold runs work holding the slots of s, acquired with l for a request
// whose context is ctx: it renews them every third of their TTL while
// work runs, and releases them when work returns or panics, each call
// within timeout and outside ctx's cancellation. Failures and lost slots
// are told to report. Without a lease, work just runs.
func hold(ctx context.Context, l ConcurrencyLimiter, s Slots, timeout time.Duration, report func(error), work func()) {
	if s.LeaseID == "" {
		work()
		return
	}
	detached := context.WithoutCancel(ctx)
	renewing, stopRenewing := context.WithCancel(detached)
	var lost atomic.Bool // ErrSlotsLost was reported
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		renew(renewing, l, s, timeout, report, &lost)
	}()
	defer func() {
		// A renewal in flight is cancelled, and done with, before the
		// release: it would find the slots released, and take it for a
		// loss.
		stopRenewing()
		<-renewed
		rctx, cancel := context.WithTimeout(detached, timeout)
		defer cancel()
		released, err := l.Release(rctx, s.LeaseID)
		switch {
		case err != nil:
			report(fmt.Errorf("client: Release: %w (the slots are held until their lease TTL ends)", err))
		case !released && lost.CompareAndSwap(false, true):
			report(ErrSlotsLost)
		}
	}()
	work()
}

// renew renews the lease of s with l every third of its TTL, until ctx
// ends, each call within timeout. Failures are told to report, and so is
// the first lost slot, when lost was not set; it goes on renewing the
// slots still held.
func renew(ctx context.Context, l ConcurrencyLimiter, s Slots, timeout time.Duration, report func(error), lost *atomic.Bool) {
	if s.TTL <= 0 {
		return
	}
	every := max(s.TTL/3, time.Millisecond)
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, timeout)
		renewed, ttl, err := l.Renew(rctx, s.LeaseID)
		cancel()
		switch {
		case ctx.Err() != nil:
			return // the work is done: the release follows
		case err != nil:
			report(fmt.Errorf("client: Renew: %w", err))
		case !renewed:
			if lost.CompareAndSwap(false, true) {
				report(ErrSlotsLost)
			}
		case ttl > 0:
			every = max(ttl/3, time.Millisecond)
		}
		t.Reset(every)
	}
}
