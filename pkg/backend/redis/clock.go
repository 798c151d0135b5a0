package redis

import (
	"context"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// A decision call carries an instant on the Redis clock after which the
// script decides and stores nothing (its not-after instant): a call that
// waited in the socket of a stalled Redis (SIGSTOP, a long fork, a slow
// disk) whose caller was answered by the failure mode meanwhile is not
// counted. The instant must come before the caller gives up by more than
// can pass between the script reading the Redis clock and this machine
// holding the answer, or Redis counts a decision whose caller the failure
// mode answered. The margin (lateBound) is the sum of:
//
//   - the offset's uncertainty: the caller's deadline is on this
//     machine's clock, the script's on Redis's, and the offset between
//     them is measured with TIME: half the round trip of that measure,
//     plus what the clocks may have drifted apart since (clockDrift);
//   - the answer's way back as measured: half that round trip again;
//   - what the measure does not see (returnMargin): the rest of the
//     script, Redis writing the answer after the other clients of its
//     event loop, Redis or this process waiting for a CPU on a loaded
//     machine.
//
// The caller gives up at its deadline, or sooner when the client's read
// timeout ends the call (giveUp). An answer that reached this machine
// before the deadline was acted upon is still read (lateread.go), and a
// coalesced caller waits for its call (coalesce.go), so that the margin
// need not cover this process's own scheduling.
const (
	// clockEvery is how often the offset is measured again.
	clockEvery = time.Second
	// clockTimeout bounds a measure.
	clockTimeout = time.Second
	// clockDrift bounds how fast the two clocks may drift apart between
	// measures, in parts per million: 500, the fastest the Linux kernel
	// slews a clock NTP corrects (adjtimex). A measure's uncertainty grows
	// by it with the measure's age, up to 0.5 ms at clockEvery. On one
	// machine (loopback) the two clocks are one and drift not at all.
	clockDrift = 500
	// returnMargin is the allowance for what the measure of the clock
	// does not see of the answer's way back. It is at most 1/returnShare
	// of the call's time: 12.5 ms of the default 50 ms deadline. On a 2-core machine saturated by 50 callers on 2
	// connections beside two busy loops, the way back (the Go runtime's
	// part included) took more than 10 ms for about 1 answer in 10,000,
	// more than 20 ms for about 1 in 100,000
	// (TestStalledRedisCountsNoRefusedCall logs what the margin costs;
	// docs/failure-modes.md).
	returnMargin = 20 * time.Millisecond
	// returnShare bounds returnMargin to a share of a call's time, so
	// that a short deadline (-backend-timeout) is not all margin.
	returnShare = 4
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
	// slack bounds how wrong offset was when measured: Redis read its
	// clock between the sending of TIME and the arrival of its answer, so
	// within half their interval of its middle (and TIME has a resolution
	// of 1 us).
	slack time.Duration
	at    time.Time // when measured
}

// uncertainty bounds how wrong the sample's offset is at now: its slack
// and what the clocks may have drifted apart since.
func (s *clockSample) uncertainty(now time.Time) time.Duration {
	return s.slack + now.Sub(s.at)*clockDrift/1e6
}

// get returns the last measure, nil when unknown; it starts a measure
// with c, in the background, when the last is older than clockEvery.
func (o *clockOffset) get(c goredis.UniversalClient) *clockSample {
	last := o.last.Load()
	if (last == nil || time.Since(last.at) >= clockEvery) && o.busy.CompareAndSwap(false, true) {
		go func() {
			defer o.busy.Store(false)
			ctx, cancel := context.WithTimeout(context.Background(), clockTimeout)
			defer cancel()
			_ = o.measure(ctx, c) // the next call tries again
		}()
	}
	return last
}

// measure reads the Redis clock with c and keeps the offset it gives,
// unless the one known is still more precise, its drift since counted.
func (o *clockOffset) measure(ctx context.Context, c goredis.UniversalClient) error {
	sent, redisNow, recv, err := readClock(ctx, c)
	if err != nil {
		return err
	}
	rtt := recv.Sub(sent) // monotonic
	s := &clockSample{offset: redisNow.Sub(sent.Add(rtt / 2)), slack: rtt/2 + time.Microsecond, at: recv}
	if last := o.last.Load(); last != nil && s.slack > last.uncertainty(recv) {
		return nil
	}
	o.last.Store(s)
	return nil
}

// readClock reads the Redis clock with TIME, returning when it sent it
// and when the answer came. With a client of one server the connection is
// taken from the pool first (PING), so that the round trip timed is
// TIME's alone, not also the wait for a free connection of a busy pool,
// which would only widen the offset's uncertainty.
func readClock(ctx context.Context, c goredis.UniversalClient) (sent, redisNow, recv time.Time, err error) {
	var cmd goredis.Cmdable = c
	if one, ok := c.(*goredis.Client); ok {
		cn := one.Conn()
		defer cn.Close()
		if err := cn.Ping(ctx).Err(); err != nil {
			return sent, redisNow, recv, err
		}
		cmd = cn
	}
	sent = time.Now()
	redisNow, err = cmd.Time(ctx).Result()
	return sent, redisNow, time.Now(), err
}

// forget drops the offset: a call was refused as late sooner than the
// offset allows (Redis failed over to a server whose clock is elsewhere,
// say). Calls carry no not-after instant until the next measure.
func (o *clockOffset) forget() { o.last.Store(nil) }

// lateBound is the not-after instant of a call, and what a refusal as
// late tells of the offset.
type lateBound struct {
	// notAfter is the instant on the Redis clock after which the call
	// decides nothing; zero for none.
	notAfter time.Time
	// wrongBefore is the instant on this machine's clock before which a
	// refusal as late cannot come if the offset is right: the script read
	// the Redis clock past notAfter, which even at the offset's widest is
	// no earlier than this.
	wrongBefore time.Time
	// clock is the offset the bound was computed with.
	clock *clockOffset
}

// lateBound returns the bound of a call made at start whose caller gives
// up at giveUp (zero: never): giveUp moved onto the Redis clock by the
// offset, less the margin: the offset's uncertainty, half the measure's
// round trip, and returnMargin (at most 1/returnShare of the call's time,
// giveUp less start). It is zero while the offset is unknown, and when
// the script decides by Options.Now: that is for services that forbid
// TIME in scripts, which the script would need to tell a late call.
func (b *Backend) lateBound(start, giveUp time.Time) lateBound {
	return b.lateBoundOn(&b.clock, b.client, start, giveUp)
}

// lateBoundOn is lateBound with the offset o of the server c reaches: in
// a Cluster, of the primary the call goes to. While o is unknown, the
// backend's own offset stands in.
func (b *Backend) lateBoundOn(o *clockOffset, c goredis.UniversalClient, start, giveUp time.Time) lateBound {
	if giveUp.IsZero() || b.opts.Now != nil {
		return lateBound{}
	}
	s := o.get(c)
	if s == nil && o != &b.clock {
		o = &b.clock
		s = o.get(b.client)
	}
	if s == nil {
		return lateBound{}
	}
	u := s.uncertainty(time.Now())
	margin := u + s.slack + max(0, min(returnMargin, giveUp.Sub(start)/returnShare))
	return lateBound{notAfter: giveUp.Add(s.offset - margin), wrongBefore: giveUp.Add(-margin - u), clock: o}
}

// giveUp returns the instant a call under ctx made at now gives up
// waiting for Redis: ctx's deadline, or sooner the client's read timeout,
// which go-redis counts from its socket read (so no sooner than from
// now). A call whose read timed out before ctx's deadline may be sent
// again by go-redis (maxRetries): the repeat carries the same instant,
// and so decides nothing, rather than a second time, once the first has
// given up. It is zero (no not-after instant) for a ctx without a
// deadline, which ratelimitd never gives a backend (the circuit breaker
// sets one), and whose callers (tests, tools) may make calls of several
// steps (the library loaded again, then the call repeated).
func (b *Backend) giveUp(ctx context.Context, now time.Time) time.Time {
	deadline, ok := ctx.Deadline()
	if !ok {
		return time.Time{}
	}
	if read := now.Add(b.readTimeout); b.readTimeout > 0 && read.Before(deadline) {
		return read
	}
	return deadline
}

// endAtGiveUp returns ctx ended at giveUp, for a call that carries no
// not-after instant (-redis-clock local, or before the offset's first
// measure): go-redis sends a call again when its read times out
// (maxRetries), and a stalled Redis, once resumed, still runs the first
// from the abandoned connection's socket, so that without an instant the
// repeat would decide the same hits a second time (TestStalledCallIsDecidedOnce).
// Once ctx has ended, go-redis sends nothing more: the call gives up at
// giveUp, and is decided at most once. A call that carries an instant
// keeps its ctx: its repeat decides nothing after the instant. The
// returned cancel must be called.
func endAtGiveUp(ctx context.Context, bound lateBound, giveUp time.Time) (context.Context, context.CancelFunc) {
	if !bound.notAfter.IsZero() || giveUp.IsZero() {
		return ctx, func() {}
	}
	if d, ok := ctx.Deadline(); ok && !giveUp.Before(d) {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, giveUp)
}

// checkLate forgets the clocks' offset when err says a call of bound was
// refused as late sooner than the offset allows: the offset was wrong.
func (b *Backend) checkLate(bound lateBound, err error) {
	if algo.IsLate(err) && bound.clock != nil && time.Now().Before(bound.wrongBefore) {
		bound.clock.forget()
	}
}

// primaryBound is lateBound on the clock of the Cluster primary serving
// key: the primaries are machines of their own, whose clocks may
// disagree by more than the margin, and one offset measured on any node
// would move the instant of the calls to the others by as much.
func (b *Backend) primaryBound(ctx context.Context, key string, start, giveUp time.Time) lateBound {
	if giveUp.IsZero() || b.opts.Now != nil {
		return lateBound{}
	}
	c, err := b.cluster.MasterForKey(ctx, key)
	if err != nil {
		return b.lateBound(start, giveUp)
	}
	return b.lateBoundOn(b.nodeClock(c.Options().Addr), c, start, giveUp)
}

// nodeClock returns the offset of the clock of the Cluster node at addr.
// Nodes are few; one replaced keeps its entry.
func (b *Backend) nodeClock(addr string) *clockOffset {
	if o, ok := b.nodeClocks.Load(addr); ok {
		return o.(*clockOffset)
	}
	o, _ := b.nodeClocks.LoadOrStore(addr, &clockOffset{})
	return o.(*clockOffset)
}

// readTimeoutOf returns the read timeout of client, or 0 when it has
// none (or is not a go-redis client whose options are known).
func readTimeoutOf(client goredis.UniversalClient) time.Duration {
	var d time.Duration
	switch c := client.(type) {
	case *goredis.Client:
		d = c.Options().ReadTimeout
	case *goredis.ClusterClient:
		d = c.Options().ReadTimeout
	}
	return max(d, 0)
}
