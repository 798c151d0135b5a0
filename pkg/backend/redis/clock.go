package redis

import (
	"context"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// A decision call carries the instant its caller gives up, on the Redis
// clock, and the script decides nothing when it runs later: a call that
// waited in the socket of a stalled Redis (SIGSTOP, a long fork, a slow
// disk) whose caller was answered by the failure mode meanwhile is not
// counted. The caller's deadline is on this machine's clock; the offset
// between the two clocks is measured with TIME, so that replicas whose
// clocks disagree with Redis's still agree, as for every decision.
const (
	// clockEvery is how often the offset is measured again.
	clockEvery = 10 * time.Second
	// clockMaxAge is how long a measure is kept against a later one of a
	// longer round trip (less precise): a sample taken while Redis is slow
	// replaces it only once it is this old.
	clockMaxAge = time.Minute
	// clockTimeout bounds a measure.
	clockTimeout = time.Second
	// lateMargin is added to every not-after instant, for what the
	// measure does not see.
	lateMargin = time.Millisecond
)

// clockOffset is the offset of the Redis clock from this machine's, as
// last measured. It is safe for concurrent use; every decision call reads
// it, so a measure is an immutable sample swapped in whole.
type clockOffset struct {
	last atomic.Pointer[clockSample] // nil: unknown
	busy atomic.Bool                 // a measure is under way
}

// clockSample is one measure of the offset.
type clockSample struct {
	offset time.Duration // Redis's clock minus this machine's
	slack  time.Duration // half the round trip of the measure: how wrong offset may be
	at     time.Time     // when measured
}

// get returns the offset and its slack, and whether it is known; it
// starts a measure with c, in the background, when the last is older
// than clockEvery.
func (o *clockOffset) get(c goredis.UniversalClient) (offset, slack time.Duration, known bool) {
	last := o.last.Load()
	if (last == nil || time.Since(last.at) >= clockEvery) && o.busy.CompareAndSwap(false, true) {
		go func() {
			defer o.busy.Store(false)
			ctx, cancel := context.WithTimeout(context.Background(), clockTimeout)
			defer cancel()
			_ = o.measure(ctx, c) // the next call tries again
		}()
	}
	if last == nil {
		return 0, 0, false
	}
	return last.offset, last.slack, true
}

// measure reads the Redis clock with c and keeps the offset it gives,
// unless the one known is more precise and not yet clockMaxAge old.
// Measures run one at a time (busy).
func (o *clockOffset) measure(ctx context.Context, c goredis.UniversalClient) error {
	sent := time.Now()
	redisNow, err := c.Time(ctx).Result()
	if err != nil {
		return err
	}
	rtt := time.Since(sent) // monotonic
	if last := o.last.Load(); last != nil && rtt/2 > last.slack+lateMargin && time.Since(last.at) < clockMaxAge {
		return nil
	}
	o.last.Store(&clockSample{offset: redisNow.Sub(sent.Add(rtt / 2)), slack: rtt / 2, at: time.Now()})
	return nil
}

// forget drops the offset: a call its caller still waited for was refused
// as late, so the offset no longer holds (Redis failed over to a server
// whose clock is elsewhere, say). Calls carry no not-after instant until
// the next measure.
func (o *clockOffset) forget() { o.last.Store(nil) }

// notAfter returns the instant, on the Redis clock, after which a decision
// call under ctx must decide nothing: ctx's deadline moved by the offset
// of the clocks, plus its slack and lateMargin. It is zero (no limit)
// when ctx has no deadline, while the offset is unknown, and when the
// script decides by Options.Now: that is for services that forbid TIME in
// scripts, which the script would need to tell a late call.
func (b *Backend) notAfter(ctx context.Context) time.Time {
	deadline, ok := ctx.Deadline()
	if !ok {
		return time.Time{}
	}
	return b.notAfterOf(deadline)
}

// notAfterOf is notAfter of a caller whose deadline is deadline.
func (b *Backend) notAfterOf(deadline time.Time) time.Time {
	if b.opts.Now != nil {
		return time.Time{}
	}
	offset, slack, known := b.clock.get(b.client)
	if !known {
		return time.Time{}
	}
	return deadline.Add(offset + slack + lateMargin)
}

// checkLate forgets the clocks' offset when err says a call ran too late
// while its caller, under ctx, was still waiting: the offset was wrong.
func (b *Backend) checkLate(ctx context.Context, err error) {
	if algo.IsLate(err) && ctx.Err() == nil {
		b.clock.forget()
	}
}
