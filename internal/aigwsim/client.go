package aigwsim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// Clock is the time a Client and a Load run on. Tests inject their own;
// RealClock is the wall clock.
type Clock interface {
	Now() time.Time
	// Sleep waits for d, or until ctx is done, when it returns ctx's error.
	Sleep(ctx context.Context, d time.Duration) error
}

// RealClock is the wall clock.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// Sleep waits for d or until ctx is done.
func (RealClock) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Fate is what a stream will do once admitted, as its upstream and its
// downstream client decide.
type Fate int

const (
	// Complete: the upstream answers 2xx and the body ends Duration after
	// admission, having used Cost tokens (0 allowed).
	Complete Fate = iota
	// UpstreamFailure: the upstream answers non-2xx Duration after
	// admission.
	UpstreamFailure
	// ClientReset: the downstream client resets the stream Duration after
	// admission, before its end.
	ClientReset
	// ResetWhileChecking: the downstream client resets the stream Duration
	// after the request-time call was sent, usually before its answer.
	ResetWhileChecking
)

var fateNames = [...]string{"complete", "upstream failure", "client reset", "reset while checking"}

func (f Fate) String() string {
	if f < 0 || int(f) >= len(fateNames) {
		return fmt.Sprintf("Fate(%d)", int(f))
	}
	return fateNames[f]
}

// Stream is one request through AI Gateway: what it will do if admitted.
type Stream struct {
	Fate     Fate
	Cost     uint64        // tokens the response uses, for Complete
	Duration time.Duration // see Fate
}

// Outcome is how a stream ended.
type Outcome int

const (
	// Served: 2xx to the end of the stream; the stream-done call charged
	// its cost.
	Served Outcome = iota
	// UpstreamFailed: the upstream answered non-2xx; nothing charged.
	UpstreamFailed
	// Reset: the downstream reset the stream after admission; nothing
	// charged.
	Reset
	// CancelledInFlight: the downstream reset while the request-time call
	// was in flight; the call was cancelled and nothing charged.
	CancelledInFlight
	// Refused: the request-time call answered OVER_LIMIT, a 429.
	Refused
	// Denied: the request-time call failed and failure_mode_deny is set,
	// a 500.
	Denied
	numOutcomes
)

var outcomeNames = [...]string{"served", "upstream failed", "reset", "cancelled in flight", "refused (429)", "denied on error (500)"}

func (o Outcome) String() string {
	if o < 0 || o >= numOutcomes {
		return fmt.Sprintf("Outcome(%d)", int(o))
	}
	return outcomeNames[o]
}

// Result is what became of one stream.
type Result struct {
	Stream  Stream
	Outcome Outcome
	// FailedOpen: the request-time call failed (CheckErr) and, with
	// failure_mode_deny false, the stream went on as if admitted.
	FailedOpen bool
	CheckErr   error
	Asked      time.Time // the request-time call was sent
	Ended      time.Time // the stream ended: the filter's onDestroy
	// StreamDone: a stream-done call was sent at Ended, charging Charged.
	StreamDone bool
	Charged    uint64
}

// Config is a Client's filter configuration, as AI Gateway writes it.
type Config struct {
	Route Route
	// Timeout bounds each call, as the filter's timeout does
	// (buildQuotaRateLimitFilter in quota_ratelimit.go sets it from
	// quotaRateLimitTimeout); past it the request-time call is an error.
	// 0: no bound.
	Timeout time.Duration
	// FailureModeDeny: a failed request-time call is a 500 rather than an
	// admission (buildQuotaRateLimitFilter: quotaRateLimitFailureModeDeny).
	FailureModeDeny bool
	Clock           Clock // nil: RealClock
}

// Client is Envoy's ratelimit HTTP filter as AI Gateway configures it for a
// QuotaPolicy, in front of the rate limit service's replicas.
type Client struct {
	cfg      Config
	clock    Clock
	replicas []rlsv3.RateLimitServiceClient
	next     atomic.Uint64
	pending  sync.WaitGroup // stream-done calls not yet answered
}

// NewClient returns a filter sending its calls to replicas in turn: AI
// Gateway's cluster for the service (buildQuotaRateLimitCluster in
// quota_ratelimit.go) sets no lb_policy, so Envoy balances each call
// round-robin over its hosts.
func NewClient(cfg Config, replicas ...rlsv3.RateLimitServiceClient) *Client {
	if len(replicas) == 0 {
		panic("aigwsim: a client needs at least one replica")
	}
	c := &Client{cfg: cfg, clock: cfg.Clock, replicas: replicas}
	if c.clock == nil {
		c.clock = RealClock{}
	}
	return c
}

// pick returns the replica of the next call.
func (c *Client) pick() rlsv3.RateLimitServiceClient {
	return c.replicas[(c.next.Add(1)-1)%uint64(len(c.replicas))]
}

// Wait waits until every stream-done call sent has been answered or has
// failed.
func (c *Client) Wait() { c.pending.Wait() }

// errInFlight is the request-time call's outcome when the downstream went
// away before its answer.
var errInFlight = errors.New("reset while the request-time call was in flight")

// Run runs one stream through the filter, as Envoy does; ctx is the
// downstream's connection: done, the client has reset. It returns when
// the stream has ended; its stream-done call, if any, may still be in
// flight (see Wait).
func (c *Client) Run(ctx context.Context, s Stream) Result {
	res := Result{Stream: s, Asked: c.clock.Now()}
	overLimit, err := c.requestTime(ctx, s)
	admitted := false
	switch {
	case errors.Is(err, errInFlight):
		// Filter::onDestroy (source/extensions/filters/http/ratelimit/
		// ratelimit.cc): with state_ == State::Calling the call is
		// cancelled and nothing else is done: no stream-done call.
		res.Outcome, res.Ended = CancelledInFlight, c.clock.Now()
		return res
	case err != nil:
		// Filter::complete with LimitStatus::Error: failure_mode_deny
		// sends a local reply (status_on_error, 500); otherwise the
		// request goes on (failure_mode_allowed).
		res.CheckErr = err
		if c.cfg.FailureModeDeny {
			res.Outcome = Denied
		} else {
			res.FailedOpen, admitted = true, true
		}
	case overLimit:
		// Filter::complete with LimitStatus::OverLimit: a local 429.
		res.Outcome = Refused
	default:
		admitted = true
	}
	var md metadata
	if admitted {
		md, res.Outcome = c.upstream(ctx, s, res.Asked)
	}
	c.onDestroy(ctx, md, &res)
	return res
}

// requestTime makes the request-time call, as Filter::initiateCall does:
// the route's request-time descriptors (those without
// apply_on_stream_done; RateLimitConfig::populateDescriptors in
// ratelimit_config.cc keeps them apart) and the request's hits_addend from
// filter state envoy.ratelimit.hits_addend, unset here: 0, which a server
// reads as 1 (getHitAddend). It reports whether the answer is OVER_LIMIT,
// or an error: errInFlight when the downstream reset before the answer.
func (c *Client) requestTime(ctx context.Context, s Stream) (overLimit bool, err error) {
	down, reset := context.WithCancelCause(ctx)
	defer reset(nil)
	if s.Fate == ResetWhileChecking {
		go func() {
			if c.clock.Sleep(down, s.Duration) == nil {
				reset(errInFlight)
			}
		}()
	}
	call := down
	if c.cfg.Timeout > 0 {
		var cancel context.CancelFunc
		call, cancel = context.WithTimeout(down, c.cfg.Timeout)
		defer cancel()
	}
	resp, err := c.pick().ShouldRateLimit(call, &rlsv3.RateLimitRequest{
		Domain:      Domain,
		Descriptors: c.cfg.Route.RequestTimeDescriptors(),
		HitsAddend:  0,
	})
	if err != nil {
		if down.Err() != nil {
			return false, errInFlight
		}
		return false, err
	}
	// GrpcClientImpl::onSuccess (ratelimit_impl.cc): OVER_LIMIT is
	// LimitStatus::OverLimit, any other code OK.
	return resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT, nil
}

// upstream runs an admitted stream to its end and returns the dynamic
// metadata it leaves: AI Gateway's upstreamProcessor.ProcessResponseBody
// (internal/extproc/processor_impl.go) calls buildDynamicMetadata only at
// body.EndOfStream of a 2xx response; a non-2xx response goes through
// ResponseError and writes none; a stream cut before its end never reaches
// EndOfStream.
func (c *Client) upstream(ctx context.Context, s Stream, asked time.Time) (metadata, Outcome) {
	wait := s.Duration
	if s.Fate == ResetWhileChecking {
		// Answered before the reset: the reset comes during the stream.
		wait = max(0, s.Duration-c.clock.Now().Sub(asked))
	}
	if c.clock.Sleep(ctx, wait) != nil {
		return metadata{}, Reset // the downstream went away mid-stream
	}
	switch s.Fate {
	case Complete:
		return c.cfg.Route.endOfStream2xx(s.Cost), Served
	case UpstreamFailure:
		return metadata{}, UpstreamFailed
	default:
		return metadata{}, Reset
	}
}

// onDestroy is Filter::onDestroy once the request-time call is no longer
// in flight: the request headers were seen, so it populates the
// stream-done descriptors (apply_on_stream_done) from the metadata the
// stream left (streamDoneDescriptors: none when it left none, as after a
// 429, a 500, a failed upstream or a reset) and, if any, sends them
// through an OnStreamDoneCallBack that outlives the filter and whose
// complete() deletes itself: the answer, and any error, are ignored. The
// call goes out with the request's hits_addend (0, getHitAddend) and is not
// tied to the downstream, which is gone.
func (c *Client) onDestroy(ctx context.Context, md metadata, res *Result) {
	res.Ended = c.clock.Now()
	descs := streamDoneDescriptors(md)
	if len(descs) == 0 {
		return
	}
	res.StreamDone, res.Charged = true, descs[0].GetHitsAddend().GetValue()
	req := &rlsv3.RateLimitRequest{Domain: Domain, Descriptors: descs}
	rls := c.pick()
	c.pending.Add(1)
	go func() {
		defer c.pending.Done()
		call, cancel := context.WithoutCancel(ctx), context.CancelFunc(func() {})
		if c.cfg.Timeout > 0 {
			call, cancel = context.WithTimeout(call, c.cfg.Timeout)
		}
		defer cancel()
		_, _ = rls.ShouldRateLimit(call, req) // OnStreamDoneCallBack::complete: ignored
	}()
}
