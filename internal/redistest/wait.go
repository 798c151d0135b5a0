package redistest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// topologyTimeout bounds each wait for a cluster or a sentinel set-up to
// settle.
const topologyTimeout = 20 * time.Second

// waitUntil calls cond every 100ms until it returns nil or timeout
// passes; then it returns cond's last error, saying what was awaited.
func waitUntil(timeout time.Duration, what string, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not so after %v: %w", what, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// query runs fn with a one-connection client of addr, bounded to a
// second, without retries: the callers poll.
func query(addr string, fn func(ctx context.Context, c *redis.Client) error) error {
	c := redis.NewClient(&redis.Options{
		Addr: addr, Protocol: 2, DisableIdentity: true,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
		MaxRetries: -1, PoolSize: 1,
	})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return fn(ctx, c)
}

// roleOf returns the first element of ROLE at addr: master, slave or
// sentinel.
func roleOf(addr string) (string, error) {
	var role string
	err := query(addr, func(ctx context.Context, c *redis.Client) error {
		v, err := c.Do(ctx, "ROLE").Slice()
		if err != nil {
			return err
		}
		if len(v) == 0 {
			return fmt.Errorf("ROLE answered nothing")
		}
		role, _ = v[0].(string)
		return nil
	})
	return role, err
}

// infoField returns the value of field in the text of INFO or CLUSTER
// INFO ("field:value" lines), or "" when it is absent.
func infoField(info, field string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), field+":"); ok {
			return v
		}
	}
	return ""
}

// AwayFromHourEnd waits, when the clock of the Redis behind c is within
// margin of a full hour, until that hour has begun. A test that counts
// hits in fixed windows of an hour, and reads back what was counted,
// would otherwise see the window roll over under it: the hits before the
// hour counted in one window, the read in the next. margin is the most
// the test's counting takes.
func AwayFromHourEnd(t testing.TB, c redis.UniversalClient, margin time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatalf("redistest: reading the Redis clock: %v", err)
	}
	if wait := hourEndWait(now, margin); wait > 0 {
		t.Logf("Redis clock %v is %v before the hour; waiting for it", now, wait-time.Second)
		time.Sleep(wait)
	}
}

// hourEndWait returns how long to wait at now so that margin fits before
// the end of the hour: nothing when it fits, else until a second into the
// next hour.
func hourEndWait(now time.Time, margin time.Duration) time.Duration {
	if left := now.Truncate(time.Hour).Add(time.Hour).Sub(now); left < margin {
		return left + time.Second
	}
	return 0
}

// AwayFromHourEnd is [AwayFromHourEnd] on the clock of n.
func (n *Node) AwayFromHourEnd(t testing.TB, margin time.Duration) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: n.Addr})
	defer c.Close()
	AwayFromHourEnd(t, c, margin)
}
