package client

import (
	"net/http"
	"strconv"
	"time"
)

// HeaderStyle selects the rate-limit headers [Middleware] adds to
// responses, as ratelimitd's -response-headers asks Envoy to:
// the figures of one descriptor of the request, the most restrictive one.
//
//   - When the request is refused, the refused descriptor with the longest
//     RetryAfter ([Never] being the longest of all);
//   - otherwise the descriptor with the least remaining;
//   - ties go to the descriptor that comes first in the request.
//
// Only descriptors that were counted take part (OutcomeOK and
// OutcomeOverLimit), and not those of shadow_mode rules. A request with no
// descriptor taking part gets no headers.
//
// Whatever the style, a refused request's response carries Retry-After:
// the decision's RetryAfter in seconds, rounded up and at least 1, left out
// when it is [Never].
//
// ratelimitd's structured style (RateLimit-Policy and RateLimit) is not
// offered: its policy names need the rule files.
type HeaderStyle uint8

const (
	// HeadersNone adds no rate-limit headers (Retry-After aside).
	HeadersNone HeaderStyle = iota
	// HeadersRateLimit adds RateLimit-Limit (the limit's requests),
	// RateLimit-Remaining and RateLimit-Reset (the seconds, rounded up,
	// until the limit is fully restored, or the Retry-After value when
	// there is one), as in draft-ietf-httpapi-ratelimit-headers-06.
	HeadersRateLimit
	// HeadersXRateLimit adds X-RateLimit-Limit, X-RateLimit-Remaining and,
	// when refused, X-RateLimit-Retry-After with the Retry-After value.
	HeadersXRateLimit
)

var headerStyleNames = [...]string{"none", "ratelimit", "x-ratelimit"}

// String returns the style's name: none, ratelimit or x-ratelimit, the
// names ratelimitd's -response-headers takes.
func (h HeaderStyle) String() string {
	if int(h) < len(headerStyleNames) {
		return headerStyleNames[h]
	}
	return "HeaderStyle(" + strconv.Itoa(int(h)) + ")"
}

// The names of the headers the styles add.
const (
	HeaderRetryAfter  = "Retry-After"
	HeaderLimit       = "RateLimit-Limit"
	HeaderRemaining   = "RateLimit-Remaining"
	HeaderReset       = "RateLimit-Reset"
	HeaderXLimit      = "X-RateLimit-Limit"
	HeaderXRemaining  = "X-RateLimit-Remaining"
	HeaderXRetryAfter = "X-RateLimit-Retry-After"
)

// The bodies of the answers Middleware writes itself.
const (
	limitedBody     = "rate limit exceeded\n"
	unavailableBody = "rate limit service unavailable\n"
)

// MiddlewareOptions configure [Middleware].
type MiddlewareOptions struct {
	// Domain is the rules' domain the requests are decided in.
	Domain string
	// Descriptors returns the descriptors of a request, such as
	// D("user_id", user) from its credentials. Required. A request with no
	// descriptor is passed through undecided.
	Descriptors func(*http.Request) []Descriptor
	// FailOpen passes requests through when no decision can be made (the
	// service is unreachable, too slow, or errs); otherwise they are
	// answered 503 Service Unavailable.
	FailOpen bool
	// Headers is the style of the rate-limit headers added to responses,
	// admitted and refused. Default HeadersNone.
	Headers HeaderStyle
	// OnLimited, when set, answers refused requests instead of the default
	// 429 Too Many Requests with a short text body. The rate-limit headers
	// and Retry-After are already set; it writes the status and the body.
	OnLimited func(w http.ResponseWriter, r *http.Request, d Decision)
	// OnError, when set, is told of every failed decision, before the
	// request is passed through or refused as FailOpen says; for logs and
	// metrics.
	OnError func(r *http.Request, err error)

	// MaxWait, when positive, makes refused requests wait for admission,
	// up to MaxWait from their arrival, instead of being answered 429 at
	// once: each waits its refusal's retry-after (with jitter) and is
	// asked again, in a queue of the requests with the same descriptors
	// (see [Middleware] for the order). A request is answered 429, with
	// Retry-After, only when waiting cannot admit it within MaxWait (its
	// retry-after, or the retry-after of those ahead of it, comes later;
	// or it is [Never]), when MaxWaiting requests are waiting already, or
	// when it is cancelled while it waits. Every request gets its handler
	// or an answer: failed decisions are answered as FailOpen says,
	// whether the request waited or not. The default, 0, waits for
	// nothing.
	MaxWait time.Duration
	// MaxWaiting is how many requests may wait at once, in all queues;
	// required with MaxWait. Each holds its goroutine and connection while
	// it waits.
	MaxWaiting int
	// OnWait, when set, is told when a refused request starts waiting,
	// with the refusal it waits out (RetryAfter from now); for logs and
	// metrics.
	OnWait func(r *http.Request, d Decision)
}

// Middleware returns middleware deciding every request with l in
// opts.Domain, for the descriptors opts.Descriptors extracts. A refused
// request is answered 429 Too Many Requests, with Retry-After and the
// headers of opts.Headers; an admitted one reaches the handler with those
// headers set. It panics when opts.Descriptors is nil, opts.Headers is
// unknown, or opts.MaxWait is set without opts.MaxWaiting.
//
// With opts.MaxWait, refused requests wait in queues instead, one per
// domain and descriptors (the hits they ask for aside), first in, first
// out. Only the first request of a queue asks ratelimitd again, when the
// last refusal says the limit may admit it: after its retry-after plus a
// random extra of up to a tenth of it, so that queues waiting for one
// limit do not all ask at the same instant. A request that arrives while
// others with its descriptors wait joins the end of their queue without
// asking, so that it takes nothing they wait for; when the first is
// admitted, the next asks at once. So requests with the same descriptors
// are admitted in the order they joined their queue: the order of arrival,
// but that two requests refused at the same moment join in either order.
// Queues of different descriptors wait independently: when they share a
// limit (a path's limit for several users), the order among them is that
// of their retry-afters, give or take the jitter. When a refusal tells the
// first request of a queue that it will not be admitted before some
// instant, the requests behind it whose MaxWait ends before then are
// answered 429 at once rather than held in vain.
//
// No request waits past MaxWait, but for the call to ratelimitd it may
// have in flight then.
func Middleware(l Limiter, opts MiddlewareOptions) func(http.Handler) http.Handler {
	if opts.Descriptors == nil {
		panic("client.Middleware: MiddlewareOptions.Descriptors is nil")
	}
	if opts.Headers > HeadersXRateLimit {
		panic("client.Middleware: unknown header style " + opts.Headers.String())
	}
	var queues *waitQueues
	if opts.MaxWait > 0 {
		if opts.MaxWaiting <= 0 {
			panic("client.Middleware: MaxWait without MaxWaiting: say how many requests may wait at once")
		}
		queues = &waitQueues{max: opts.MaxWaiting, queues: map[string]*waitQueue{}}
	}
	return func(next http.Handler) http.Handler {
		e := &enforcer{l: l, opts: &opts, next: next}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ds := opts.Descriptors(r)
			if len(ds) == 0 {
				next.ServeHTTP(w, r)
				return
			}
			if queues != nil {
				queues.serve(e, w, r, ds)
				return
			}
			d, err := l.Allow(r.Context(), opts.Domain, ds...)
			e.answer(w, r, d, err)
		})
	}
}

// enforcer answers requests as a middleware's options say, in front of
// next.
type enforcer struct {
	l    Limiter
	opts *MiddlewareOptions
	next http.Handler
}

// answer answers r as decision d, or as the failure err says.
func (e *enforcer) answer(w http.ResponseWriter, r *http.Request, d Decision, err error) {
	if err != nil {
		if e.opts.OnError != nil {
			e.opts.OnError(r, err)
		}
		if e.opts.FailOpen {
			e.next.ServeHTTP(w, r)
			return
		}
		writeText(w, http.StatusServiceUnavailable, unavailableBody)
		return
	}
	SetHeaders(w.Header(), e.opts.Headers, d)
	if d.Allowed {
		e.next.ServeHTTP(w, r)
		return
	}
	if e.opts.OnLimited != nil {
		e.opts.OnLimited(w, r, d)
		return
	}
	writeText(w, http.StatusTooManyRequests, limitedBody)
}

// writeText answers status with a plain-text body.
func writeText(w http.ResponseWriter, status int, body string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}

// SetHeaders sets in h the headers of style s for decision d, as
// [Middleware] does: those of the style (see [HeaderStyle]) and, when d is
// refused, Retry-After.
func SetHeaders(h http.Header, s HeaderStyle, d Decision) {
	var retry uint64 // Retry-After in seconds; 0 for none
	if !d.Allowed && d.RetryAfter != Never {
		retry = max(ceilSeconds(d.RetryAfter), 1)
	}
	if p := mostRestrictive(d.Results); p != nil {
		reset := ceilSeconds(p.ResetAfter)
		if retry != 0 {
			reset = retry
		}
		switch s {
		case HeadersRateLimit:
			h.Set(HeaderLimit, strconv.FormatUint(p.Limit.Requests, 10))
			h.Set(HeaderRemaining, strconv.FormatUint(p.Remaining, 10))
			h.Set(HeaderReset, strconv.FormatUint(reset, 10))
		case HeadersXRateLimit:
			h.Set(HeaderXLimit, strconv.FormatUint(p.Limit.Requests, 10))
			h.Set(HeaderXRemaining, strconv.FormatUint(p.Remaining, 10))
			if retry != 0 {
				h.Set(HeaderXRetryAfter, strconv.FormatUint(retry, 10))
			}
		}
	}
	if retry != 0 {
		h.Set(HeaderRetryAfter, strconv.FormatUint(retry, 10))
	}
}

// mostRestrictive returns the result whose figures the headers tell, nil
// when none takes part; see [HeaderStyle].
func mostRestrictive(results []Result) *Result {
	var best *Result
	for i := range results {
		r := &results[i]
		if r.Shadow || (r.Outcome != OutcomeOK && r.Outcome != OutcomeOverLimit) {
			continue
		}
		if b := best; b != nil {
			refused, bRefused := r.Outcome == OutcomeOverLimit, b.Outcome == OutcomeOverLimit
			switch {
			case refused != bRefused:
				if !refused {
					continue
				}
			case refused:
				if r.RetryAfter <= b.RetryAfter {
					continue
				}
			default:
				if r.Remaining >= b.Remaining {
					continue
				}
			}
		}
		best = r
	}
	return best
}

// ceilSeconds is d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64((d-1)/time.Second) + 1
}
