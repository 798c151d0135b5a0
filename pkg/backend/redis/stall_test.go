package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
)

// stallProbe is the load of the held-out fault probe's stall case (issue
// 32): 50 callers on 2 connections, Redis stopped with SIGSTOP for 2 s of
// a 7 s run, each caller waiting 1 ms between calls.
const (
	stallCallers = 50
	stallPool    = 2
	stallRun     = 7 * time.Second
	stallAt      = 2 * time.Second // the load runs this long before Redis stops
	stallFor     = 2 * time.Second
	stallLimit   = 1_000_000_000 // never reached: every decision Redis makes admits
	// stallSeen is how long a call answered by the failure mode must have
	// taken for the test to see that the machine stalled it past the
	// not-after margin: the breaker's deadline plus the margin's fixed
	// share at that deadline (min(20 ms, deadline ÷ 4), docs/failure-modes.md).
	stallSeen = breaker.DefaultTimeout + breaker.DefaultTimeout/4
)

// stallCounts are the outcomes of a caller's calls, as the service would
// answer them in failure mode closed: admitted by Redis, or refused by the
// failure mode because the backend call failed, by why it failed.
type stallCounts struct {
	ok, refusedByRedis            int64 // decided by Redis
	open, timeout, late, otherErr int64 // failed: answered OVER_LIMIT by the failure mode
	// reached are the calls answered by the failure mode that reached
	// Redis (not refused by the open circuit), for the log of a failure.
	reached []stallCall
}

// stallCall is one call answered by the failure mode that reached Redis.
type stallCall struct {
	start, end time.Time
	err        error
}

func (c *stallCounts) add(o stallCounts) {
	c.ok += o.ok
	c.refusedByRedis += o.refusedByRedis
	c.open += o.open
	c.timeout += o.timeout
	c.late += o.late
	c.otherErr += o.otherErr
}

func (c *stallCounts) failed() int64 { return c.open + c.timeout + c.late + c.otherErr }

// TestStalledRedisCountsNoRefusedCall is the fault probe's stall case,
// in process: a Redis backend on a real redis-server (2 pooled
// connections, the production client settings of Dial) behind a circuit
// breaker with the server's defaults (50 ms deadline, 5 failures, 1 s
// cooldown), 50 callers each deciding its own key in a loop, the server
// stopped with SIGSTOP for 2 s of a 7 s run and resumed with SIGCONT,
// with one call per decision and with decisions coalesced by 4 workers.
// A call whose breaker call fails is one the service answers by the
// failure mode (OVER_LIMIT in closed); a call that succeeds was decided
// by Redis, and its limit is never reached. Afterwards each caller's key
// must hold exactly the hits of its calls Redis admitted: none of a call
// answered by the failure mode may have been counted, unless the machine
// stalled that caller past the margin: Redis ran a decision before its
// not-after instant and the answer reached the caller only after it gave
// up, which no instant can prevent. The test sees such a stall as a call
// of that caller answered by the failure mode more than the margin after
// its deadline (stallSeen), and allows one counted hit per such call;
// with two busy loops beside it, 4 runs of 56 at coalesce 0 needed it (a
// 50 ms call returning after 60-260 ms each time).
//
// The load pauses for the instant Redis stops, waiting for the calls in
// flight: a decision Redis ran just before it stopped, whose answer it had
// not written yet, is counted though its caller is refused, and no
// not-after instant can help (docs/failure-modes.md). It does not pause
// for the instant Redis resumes, nor at any other.
//
// The test also logs what the not-after margin costs: calls Redis refused
// as late while their caller still waited (it ran them within the margin
// before the caller's deadline), which could have passed.
//
// Shown failing against the not-after instant before issue 32 (the
// caller's deadline plus the offset's slack plus 1 ms, coalesced callers
// giving up on their own timers, c27f0c3): with two busy loops beside it,
// 4 runs of 5 counted hits for refused calls (3, 1 and 1 at coalesce 0; 2
// and 46 at coalesce 4). On a quiet machine it did not.
func TestStalledRedisCountsNoRefusedCall(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIPPED under -short: the fault probe's stall case runs 2 × 7 s of 50 callers against a SIGSTOPped redis-server")
	}
	for _, coalesce := range []int{0, 4} {
		t.Run(fmt.Sprintf("coalesce=%d", coalesce), func(t *testing.T) {
			stallProbe(t, coalesce)
		})
	}
}

// stallProbe runs one case of TestStalledRedisCountsNoRefusedCall.
func stallProbe(t *testing.T, coalesce int) {
	node := redistest.StartNode(t)
	b := dial(t, Config{URL: "redis://" + node.Addr, PoolSize: stallPool}, Options{Prefix: uniquePrefix(t), Coalesce: coalesce})
	br := breaker.New(b, breaker.Options{})
	l := algo.Limit{Algorithm: algo.FixedWindow, Requests: stallLimit, Window: algo.MaxRefill}
	keyOf := func(i int) []byte { return descriptorKey("stall", "caller", fmt.Sprint(i), l) }

	counts := make([]stallCounts, stallCallers)
	var gate sync.RWMutex // held by callers around each call, by the test to stop Redis
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i := range stallCallers {
		wg.Go(func() {
			c := &counts[i]
			reqs := []algo.Request{{Key: keyOf(i), Limit: l, Hits: 1}}
			out := make([]algo.Decision, 1)
			for !stop.Load() {
				gate.RLock()
				start := time.Now()
				err := br.Decide(context.Background(), reqs, out)
				end := time.Now()
				gate.RUnlock()
				if err != nil && !errors.Is(err, breaker.ErrOpen) {
					c.reached = append(c.reached, stallCall{start, end, err})
				}
				switch {
				case err == nil && out[0].Allowed:
					c.ok++
				case err == nil:
					c.refusedByRedis++
				case errors.Is(err, breaker.ErrOpen):
					c.open++
				case algo.IsLate(err):
					c.late++
				case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
					c.timeout++
				default:
					c.otherErr++
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	start := time.Now()
	time.Sleep(stallAt)
	gate.Lock()
	node.Freeze(t)
	frozen := time.Now()
	gate.Unlock()
	time.Sleep(stallFor)
	thawed := time.Now()
	node.Thaw(t)
	time.Sleep(stallRun - time.Since(start))
	stop.Store(true)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the callers did not end within 10 s of the run's end")
	}

	// Redis has run every call sent to it before it answers this PING.
	admin := goredis.NewClient(&goredis.Options{Addr: node.Addr})
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := admin.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	var total stallCounts
	var counted, excess int64
	out := make([]algo.Decision, 1)
	for i := range stallCallers {
		c := &counts[i]
		total.add(*c)
		// A peek (no hits) tells what the key holds.
		if err := b.Decide(ctx, []algo.Request{{Key: keyOf(i), Limit: l}}, out); err != nil {
			t.Fatalf("reading caller %d's count: %v", i, err)
		}
		n := int64(stallLimit - out[0].Remaining)
		counted += n
		switch {
		case n > c.ok:
			excess += n - c.ok
			if stalled := c.stalled(); n-c.ok > stalled {
				t.Errorf("caller %d: Redis holds %d hits for %d calls admitted, and the machine stalled %d of its calls past the margin: hits counted for calls answered by the failure mode",
					i, n, c.ok, stalled)
			}
			for _, call := range c.reached {
				t.Logf("caller %d (%d counted for %d admitted): a call from %v to %v after the stop (%v after the resume): %v",
					i, n, c.ok, call.start.Sub(frozen), call.end.Sub(frozen), call.end.Sub(thawed), call.err)
			}
		case n < c.ok:
			t.Errorf("caller %d: Redis holds %d hits for %d calls admitted: admitted hits lost", i, n, c.ok)
		}
	}
	calls := total.ok + total.refusedByRedis + total.failed()
	t.Logf("coalesce %d: %d calls: %d admitted by Redis, %d answered by the failure mode (%d circuit open, %d timed out, %d refused as late, %d other); Redis counted %d hits, %d of them for calls answered by the failure mode",
		coalesce, calls, total.ok, total.failed(), total.open, total.timeout, total.late, total.otherErr, counted, excess)
	t.Logf("coalesce %d: cost of the not-after margin: %d calls refused as late while their caller waited, %.4f%% of the %d Redis answered",
		coalesce, total.late, 100*float64(total.late)/float64(max(1, total.ok+total.late)), total.ok+total.late)
	switch {
	case total.refusedByRedis != 0:
		t.Errorf("Redis refused %d calls under a limit of %d", total.refusedByRedis, stallLimit)
	case total.open == 0 || total.ok == 0:
		t.Fatalf("the stall was not seen (%d refused with the circuit open) or nothing was admitted (%d)", total.open, total.ok)
	}
	if excess != 0 {
		t.Logf("Redis counted %d hits for calls answered by the failure mode (of %d such calls); each must be on a caller the machine stalled past the margin", excess, total.failed())
	}
}

// stalled is how many of c's calls answered by the failure mode returned
// more than the not-after margin after their deadline.
func (c *stallCounts) stalled() int64 {
	var n int64
	for _, call := range c.reached {
		if call.end.Sub(call.start) > stallSeen {
			n++
		}
	}
	return n
}

// isTimeout reports whether err says a socket deadline passed.
func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}
