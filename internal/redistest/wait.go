package redistest

import (
	"context"
	"fmt"
	"strings"
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
