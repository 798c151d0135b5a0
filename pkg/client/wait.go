package client

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrNever is the error of [Waiter.Wait] for a request that no amount of
// waiting admits (its decision's RetryAfter is [Never]): it asks for more
// hits than its limit ever holds. Wait returns it at once, with the
// refusal; test for it with errors.Is.
var ErrNever = errors.New("client: the request asks for more hits than its limit ever holds, so no wait admits it: ask for fewer hits, or raise the limit")

// ErrWouldExceedDeadline is the error of [Waiter.Wait] when the limit
// admits the request only after the context's deadline, as the retry-after
// of a refusal says: Wait returns it at once rather than sleep in vain,
// with the refusal, whose RetryAfter tells the caller when to come back.
// With [WaitOptions.WaitQueued], it is also the error of an admitted
// request whose place in a leaky bucket's queue comes after the deadline.
// Test for it with errors.Is.
var ErrWouldExceedDeadline = errors.New("client: the limit admits the request only after the context's deadline")

// The defaults of [WaitOptions.BackoffBase] and [WaitOptions.BackoffMax].
const (
	DefaultBackoffBase = 10 * time.Millisecond
	DefaultBackoffMax  = time.Second
)

// RetryForever as [WaitOptions.Retries] retries failed calls until the
// context ends.
const RetryForever = -1

// WaitOptions configure a [Waiter]. The zero value waits out refusals and
// fails at the first error: Wait returns it, admitting nothing it did not
// decide (fail closed).
//
// The failure policy is two fields: Retries says how many failed calls in
// a row are retried, after a backoff, before Wait gives up; FailOpen says
// what giving up is, admitting the request or returning the error. So
//
//	WaitOptions{}                             // fail closed: the first error is returned
//	WaitOptions{FailOpen: true}               // fail open: the first error admits
//	WaitOptions{Retries: 3, FailOpen: true}   // 3 retries with backoff, then admit
//	WaitOptions{Retries: client.RetryForever} // retry with backoff until ctx ends
//
// Wait also gives up, without sleeping, when the next backoff would pass
// ctx's deadline.
//
// Only transient failures are retried: codes.Unavailable (the server
// cannot be reached, or its backend failed) and codes.DeadlineExceeded
// (it did not answer in time) while ctx has not ended. Any other error
// (InvalidArgument for a request out of bounds, an error of a
// [LimiterFunc] that is no gRPC status) would fail again the same way, so
// Wait gives up on it at once.
type WaitOptions struct {
	// Retries is how many failed calls in a row Wait retries, each after a
	// backoff, before it gives up; the count restarts with every decision.
	// 0, the default, gives up at the first error; [RetryForever] (any
	// negative number) retries until ctx ends.
	Retries int
	// FailOpen makes giving up on errors admit the request: Wait returns
	// Decision{Allowed: true}, with no results, and a nil error. Otherwise
	// it returns the last error. A context that ends is never taken for an
	// admission: Wait returns ctx.Err() then.
	FailOpen bool
	// BackoffBase and BackoffMax bound the backoff before a retry, with
	// full jitter: before the nth retry in a row Wait sleeps a uniformly
	// random time between 0 and min(BackoffMax, BackoffBase × 2^(n-1)), so
	// that clients that failed together do not retry together. Defaults
	// [DefaultBackoffBase] (10ms) and [DefaultBackoffMax] (1s); a
	// BackoffMax below BackoffBase is BackoffBase.
	BackoffBase, BackoffMax time.Duration
	// AttemptTimeout, when positive, bounds each call to the limiter
	// within ctx, so that a server that does not answer costs a retry
	// rather than the whole wait: a [*Client] applies its own timeout
	// ([WithTimeout]) only to a context without a deadline.
	AttemptTimeout time.Duration
	// WaitQueued makes Wait, once the request is admitted, also sleep the
	// time its hits wait in a leaky bucket's queue ([Decision.QueueWait]),
	// so that requests go on at the pace the bucket drains: the steady flow
	// leaky_bucket is for. The hits are counted when admitted: when that
	// sleep would pass ctx's deadline, Wait returns the admitting decision
	// with [ErrWouldExceedDeadline] at once, and the hits stay spent.
	WaitQueued bool
	// OnError, when set, is told of every failed call, retried or not;
	// for logs and metrics.
	OnError func(err error)
	// Sleep, when set, replaces the wait between calls: it sleeps d, or
	// until ctx ends and returns ctx.Err(). For tests, which make time
	// pass without waiting for it.
	Sleep func(ctx context.Context, d time.Duration) error
	// Rand, when set, replaces the source of jitter: it returns a
	// uniformly random number in [0, n), n > 0. For tests. Default
	// math/rand/v2's Int64N.
	Rand func(n int64) int64
}

// Waiter waits until a [Limiter] admits requests, as
// golang.org/x/time/rate's Limiter.Wait waits for tokens: see
// [Waiter.Wait]. Create it with [NewWaiter]; it is safe for concurrent use.
type Waiter struct {
	l    Limiter
	opts WaitOptions
}

// NewWaiter returns a waiter asking l, with opts.
func NewWaiter(l Limiter, opts WaitOptions) *Waiter {
	if opts.BackoffBase <= 0 {
		opts.BackoffBase = DefaultBackoffBase
	}
	if opts.BackoffMax <= 0 {
		opts.BackoffMax = DefaultBackoffMax
	}
	opts.BackoffMax = max(opts.BackoffMax, opts.BackoffBase)
	if opts.Sleep == nil {
		opts.Sleep = sleep
	}
	if opts.Rand == nil {
		opts.Rand = rand.Int64N
	}
	return &Waiter{l: l, opts: opts}
}

// Wait blocks until the limiter admits a request of domain for the
// descriptors, or ctx ends, and returns the admitting decision.
//
// A refused request is asked again after its decision's RetryAfter, plus
// a random extra of up to a tenth of it (jitter), so that callers refused
// together do not all come back at the same instant and all but one be
// refused again; never before it, which would be refused for certain. A
// refusal that tells no retry-after (Envoy's API may not) is asked again
// after BackoffBase. Wait does not sleep in vain:
//
//   - a request that waiting never admits (RetryAfter is [Never]) returns
//     the refusal and [ErrNever] at once;
//   - when the retry-after passes ctx's deadline, it returns the refusal
//     and [ErrWouldExceedDeadline] at once; jitter alone never makes it
//     miss the deadline, it is cut short there;
//   - when ctx ends while it sleeps, it returns the last refusal and
//     ctx.Err().
//
// Failed calls are retried or not, and giving up on them admits or not,
// as [WaitOptions] say; by default the first error is returned with a zero
// Decision. With WaitQueued, an admitted request also waits its place in a
// leaky bucket's queue.
//
// Through Envoy's API ([Client.AllowRLS]) a request is never known to be
// [Never]: its refusals say only when the limit is full again, and Wait
// waits that long, and again, until ctx ends, for a request of more hits
// than the limit holds.
func (w *Waiter) Wait(ctx context.Context, domain string, descriptors ...Descriptor) (Decision, error) {
	failures := 0
	for {
		d, err := w.allow(ctx, domain, descriptors)
		if err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				return Decision{}, ctxErr
			}
			if w.opts.OnError != nil {
				w.opts.OnError(err)
			}
			failures++
			if !transient(err) || (w.opts.Retries >= 0 && failures > w.opts.Retries) {
				return w.giveUp(err)
			}
			pause := w.backoff(failures)
			if left, ok := untilDeadline(ctx); ok && pause > left {
				return w.giveUp(err)
			}
			if err := w.opts.Sleep(ctx, pause); err != nil {
				return Decision{}, err
			}
			continue
		}
		failures = 0
		if d.Allowed {
			return w.queued(ctx, d)
		}
		if d.RetryAfter == Never {
			return d, ErrNever
		}
		pause := d.RetryAfter
		if pause <= 0 {
			pause = w.opts.BackoffBase
		}
		left, hasDeadline := untilDeadline(ctx)
		if hasDeadline && pause > left {
			return d, fmt.Errorf("%w: retry after %v, the deadline in %v: answer the request refused (the decision's RetryAfter says when to come back), or wait with a later deadline",
				ErrWouldExceedDeadline, d.RetryAfter, left.Round(time.Millisecond))
		}
		pause += jitter(pause, w.opts.Rand)
		if hasDeadline {
			pause = min(pause, left)
		}
		if err := w.opts.Sleep(ctx, pause); err != nil {
			return d, err
		}
	}
}

// allow asks the limiter once, within AttemptTimeout.
func (w *Waiter) allow(ctx context.Context, domain string, descriptors []Descriptor) (Decision, error) {
	if w.opts.AttemptTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, w.opts.AttemptTimeout)
		defer cancel()
	}
	return w.l.Allow(ctx, domain, descriptors...)
}

// giveUp is Wait's answer when it stops retrying after err.
func (w *Waiter) giveUp(err error) (Decision, error) {
	if w.opts.FailOpen {
		return Decision{Allowed: true}, nil
	}
	return Decision{}, err
}

// backoff returns the pause before the nth retry in a row: full jitter
// below min(BackoffMax, BackoffBase × 2^(n-1)).
func (w *Waiter) backoff(n int) time.Duration {
	ceiling := w.opts.BackoffBase
	for i := 1; i < n; i++ {
		if ceiling > w.opts.BackoffMax/2 {
			ceiling = w.opts.BackoffMax
			break
		}
		ceiling *= 2
	}
	ceiling = min(ceiling, w.opts.BackoffMax)
	return time.Duration(w.opts.Rand(upTo(ceiling)))
}

// queued is Wait's answer for the admitting decision d: with WaitQueued,
// after d's queue wait.
func (w *Waiter) queued(ctx context.Context, d Decision) (Decision, error) {
	q := d.QueueWait()
	if !w.opts.WaitQueued || q <= 0 {
		return d, nil
	}
	if left, ok := untilDeadline(ctx); ok && q > left {
		return d, fmt.Errorf("%w: admitted and counted, but its place in the leaky bucket's queue comes in %v, the deadline in %v: its hits are spent; go on now, out of pace, or drop the request",
			ErrWouldExceedDeadline, q, left.Round(time.Millisecond))
	}
	if err := w.opts.Sleep(ctx, q); err != nil {
		return d, err
	}
	return d, nil
}

// Wait waits until l admits a request of domain for the descriptors, or
// ctx ends: [Waiter.Wait] with the default [WaitOptions], which fail at
// the first error. Use [NewWaiter] for another failure policy.
func Wait(ctx context.Context, l Limiter, domain string, descriptors ...Descriptor) (Decision, error) {
	return NewWaiter(l, WaitOptions{}).Wait(ctx, domain, descriptors...)
}

// Wait waits until ratelimitd admits a request of domain for the
// descriptors, or ctx ends, with the default [WaitOptions]: see
// [Waiter.Wait]. NewWaiter(c, opts).Wait waits with other options, such
// as retries.
//
// Each call has ctx's deadline, when it has one, rather than the client's
// timeout ([WithTimeout]); [WaitOptions.AttemptTimeout] bounds each call
// within it.
func (c *Client) Wait(ctx context.Context, domain string, descriptors ...Descriptor) (Decision, error) {
	return Wait(ctx, c, domain, descriptors...)
}

// QueueWait returns how long an admitted request's hits wait in a leaky
// bucket's queue before their turn: the longest Wait of its results (of
// rules not in shadow mode). A caller that delays the request that long
// sends the protected side the steady flow the bucket drains at, as
// rate.Reservation.Delay does; [WaitOptions.WaitQueued] makes Wait do it.
// It is zero for other algorithms, for refusals, and through Envoy's API,
// which does not tell.
func (d Decision) QueueWait() time.Duration {
	var q time.Duration
	if !d.Allowed {
		return 0
	}
	for _, r := range d.Results {
		if r.Outcome == OutcomeOK && !r.Shadow {
			q = max(q, r.Wait)
		}
	}
	return q
}

// transient reports whether err is a failure that the same call may not
// meet again: the server unreachable or too slow (a gRPC status, or the
// deadline of AttemptTimeout for a [LimiterFunc] that returns the
// context's error).
func transient(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return errors.Is(err, context.DeadlineExceeded)
}

// jitter returns a random extra for a sleep of d: up to a tenth of it.
func jitter(d time.Duration, rand func(n int64) int64) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(rand(upTo(d / 10)))
}

// upTo is the n of Rand(n) for a random duration from 0 to d, d included.
func upTo(d time.Duration) int64 {
	if d == math.MaxInt64 {
		return int64(d)
	}
	return int64(d) + 1
}

// untilDeadline returns the time left before ctx's deadline, and whether
// it has one.
func untilDeadline(ctx context.Context) (time.Duration, bool) {
	dl, ok := ctx.Deadline()
	if !ok {
		return 0, false
	}
	return time.Until(dl), true
}

// sleep sleeps d, or until ctx ends and returns ctx.Err().
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
