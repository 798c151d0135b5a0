package redistest

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// CommandCalls returns how many times the server of c has run cmd (in
// lower case, such as "evalsha") since it started or since CONFIG
// RESETSTAT, from INFO commandstats. Commands a script runs are counted
// under their own names, not under the script's call.
func CommandCalls(t testing.TB, c *redis.Client, cmd string) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("redistest: INFO commandstats: %v", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			n, err := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
			if err != nil {
				t.Fatalf("redistest: INFO commandstats line %q: %v", line, err)
			}
			return n
		}
	}
	return 0
}
