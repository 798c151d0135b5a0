package region

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// RedisStore is a [Store] in the region's Redis (standalone, Sentinel or
// Cluster), shared by every replica of the region:
//
//   - PREFIX "rg|" LENGTH_MS "|" START_MS, a hash per window: field
//     REGION "\x00" KEY, the count of key in the window that region
//     reported (a peer), or that a replica saw (this region); merged by
//     maximum, in one script call per window, and expired a window and
//     10 s after the window ends;
//   - PREFIX "rg|heard", a hash: field REGION, "MS WEIGHT", when the region
//     was last heard (ms since the Unix epoch, the receiver's clock) and
//     its weight.
//
// Each key is read and written on its own, so a Cluster serves them from
// any slot.
type RedisStore struct {
	rdb    goredis.UniversalClient
	prefix string
}

// NewRedisStore returns a store in rdb under prefix (ratelimitd's
// -redis-prefix).
func NewRedisStore(rdb goredis.UniversalClient, prefix string) *RedisStore {
	return &RedisStore{rdb: rdb, prefix: prefix}
}

// mergeScript keeps each count of ARGV (field, count pairs from ARGV[2])
// in the hash KEYS[1] if larger than the one there, and has the hash
// expire at ARGV[1] (ms since the Unix epoch).
const mergeScript = `
for i = 2, #ARGV, 2 do
  local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  if tonumber(ARGV[i + 1]) > cur then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
redis.call('PEXPIREAT', KEYS[1], ARGV[1])
return 1
`

// heardScript records in the hash KEYS[1] that region ARGV[1] was heard at
// ARGV[2] (ms) with weight ARGV[3], unless a later hearing is recorded.
const heardScript = `
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local at = tonumber(string.match(cur, '^(%d+)'))
  if at and at > tonumber(ARGV[2]) then
    return 0
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. ARGV[3])
return 1
`

func (s *RedisStore) windowKey(w Window) string {
	return s.prefix + "rg|" + strconv.FormatInt(w.Length, 10) + "|" + strconv.FormatInt(w.Start, 10)
}

func (s *RedisStore) heardKey() string { return s.prefix + "rg|heard" }

// Merge implements [Store].
func (s *RedisStore) Merge(ctx context.Context, region string, counts []Count, heard *Heard) error {
	byWindow := make(map[Window][]any)
	for _, c := range counts {
		args := byWindow[c.Window]
		if args == nil {
			args = []any{c.Window.End() + keep(c.Window).Milliseconds()}
		}
		byWindow[c.Window] = append(args, region+"\x00"+string(c.Key), c.Count)
	}
	// EVAL, not EVALSHA: a pipeline cannot fall back from a script Redis
	// has not loaded, and these are a few hundred bytes.
	pipe := s.rdb.Pipeline()
	for w, args := range byWindow {
		pipe.Eval(ctx, mergeScript, []string{s.windowKey(w)}, args...)
	}
	if heard != nil {
		pipe.Eval(ctx, heardScript, []string{s.heardKey()}, region, heard.At.UnixMilli(), strconv.FormatFloat(heard.Weight, 'g', -1, 64))
	}
	if pipe.Len() == 0 {
		return nil
	}
	_, err := pipe.Exec(ctx)
	return err
}

// Load implements [Store].
func (s *RedisStore) Load(ctx context.Context, windows []Window) ([]Count, map[string]Heard, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*goredis.MapStringStringCmd, len(windows))
	for i, w := range windows {
		cmds[i] = pipe.HGetAll(ctx, s.windowKey(w))
	}
	heard := pipe.HGetAll(ctx, s.heardKey())
	if _, err := pipe.Exec(ctx); err != nil && err != goredis.Nil {
		return nil, nil, err
	}
	var out []Count
	for i, cmd := range cmds {
		for field, v := range cmd.Val() {
			region, key, ok := strings.Cut(field, "\x00")
			n, err := strconv.ParseUint(v, 10, 64)
			if !ok || err != nil {
				return nil, nil, fmt.Errorf("region store: malformed count %q = %q in %s", field, v, s.windowKey(windows[i]))
			}
			out = append(out, Count{Region: region, Key: []byte(key), Window: windows[i], Count: n})
		}
	}
	hs := make(map[string]Heard)
	for region, v := range heard.Val() {
		ms, w, ok := strings.Cut(v, " ")
		at, err1 := strconv.ParseInt(ms, 10, 64)
		weight, err2 := strconv.ParseFloat(w, 64)
		if !ok || err1 != nil || err2 != nil {
			return nil, nil, fmt.Errorf("region store: malformed hearing %q = %q in %s", region, v, s.heardKey())
		}
		hs[region] = Heard{At: time.UnixMilli(at), Weight: weight}
	}
	return out, hs, nil
}
