package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// TestStalledCallIsDecidedOnce: a decision whose read times out while
// Redis is stalled (SIGSTOP) before the backend's deadline, the read
// timeout (300 ms) shorter than the deadline (2 s), as the integration
// tests' servers on Redis had them (100 ms and 2 s). go-redis gives the connection up and
// would send the call again (maxRetries); Redis, resumed, runs what waited
// in the abandoned connection's socket too. A call that carries no
// not-after instant (-redis-clock local) then decided its hits twice: the
// caller was answered once, and its region counted 2 (TestRegions/faults,
// issue 32, counted 203 where the load saw 201 admitted). Each call must
// count its hits at most once, whether its caller was answered or not.
func TestStalledCallIsDecidedOnce(t *testing.T) {
	for _, clock := range []string{"local", "redis"} {
		for _, coalesce := range []int{0, 4} {
			t.Run(fmt.Sprintf("clock=%s/coalesce=%d", clock, coalesce), func(t *testing.T) {
				const readTimeout = 300 * time.Millisecond
				opts := Options{Prefix: uniquePrefix(t), Coalesce: coalesce}
				if clock == "local" {
					opts.Now = time.Now
				}
				node := redistest.StartNode(t)
				b := dial(t, Config{URL: "redis://" + node.Addr, ReadTimeout: readTimeout}, opts)
				// The hits are read back from the hour's window: not
				// across the hour's end.
				node.AwayFromHourEnd(t, 15*time.Second)
				l := algo.Limit{Algorithm: algo.FixedWindow, Requests: 1_000_000, Window: time.Hour}
				key := descriptorKey("repeat", "caller", "c", l)
				decide := func(hits uint64) (algo.Decision, error) {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					defer cancel()
					out := make([]algo.Decision, 1)
					err := b.Decide(ctx, []algo.Request{{Key: key, Limit: l, Hits: hits}}, out)
					return out[0], err
				}
				// The pool warm and, on the Redis clock, the offset measured.
				if _, err := decide(1); err != nil {
					t.Fatal(err)
				}
				time.Sleep(1500 * time.Millisecond)
				answered := 1

				node.Freeze(t)
				done := make(chan error, 1)
				var took time.Duration
				go func() {
					start := time.Now()
					_, err := decide(1)
					took = time.Since(start)
					done <- err
				}()
				// Redis resumes between the read timeout and its repeat's
				// (go-redis waits 8 to 24 ms before repeating): the repeat, if
				// any, would be answered.
				time.Sleep(readTimeout * 3 / 2)
				node.Thaw(t)
				err := <-done
				if err == nil {
					answered++
				}

				peek, perr := decide(0)
				if perr != nil {
					t.Fatal(perr)
				}
				counted := l.Requests - peek.Remaining
				t.Logf("the stalled call took %v (%v); Redis counted %d hits for 2 calls, %d answered", took.Round(time.Millisecond), err, counted, answered)
				if counted > 2 {
					t.Errorf("Redis counted %d hits for 2 calls of one hit each: a call was decided twice", counted)
				}
				if counted < uint64(answered) {
					t.Errorf("Redis counted %d hits, fewer than the %d calls answered", counted, answered)
				}
			})
		}
	}
}
