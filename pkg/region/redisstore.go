package region

import (
	"context"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

// RedisStore is a [Store] in the region's Redis (standalone, Sentinel or
// Cluster), shared by every replica of the region: one stream, PREFIX
// "rg|pushes", of the pushes received, each entry "a" (when it was
// received, ms since the Unix epoch) and "p" (the push, protobuf
// ratelimitd.v1.PushRequest), trimmed to those of the last Keep as it
// grows (XADD MINID, Redis 6.2 or later). A Cluster serves it from one
// slot.
type RedisStore struct {
	rdb    goredis.UniversalClient
	key    string
	keep   time.Duration
	decode proto.UnmarshalOptions
}

// NewRedisStore returns a store in rdb under prefix (ratelimitd's
// -redis-prefix), keeping the pushes of the last keep ([KeepFor]).
func NewRedisStore(rdb goredis.UniversalClient, prefix string, keep time.Duration) *RedisStore {
	return &RedisStore{rdb: rdb, key: prefix + "rg|pushes", keep: keep}
}

// Append implements [Store].
func (s *RedisStore) Append(ctx context.Context, push Push) error {
	req := &ratelimitdv1.PushRequest{Region: push.Region, Weight: push.Weight, Counts: make([]*ratelimitdv1.RegionCount, len(push.Counts))}
	for i, c := range push.Counts {
		req.Counts[i] = &ratelimitdv1.RegionCount{Key: c.Key, WindowStartMs: c.Window.Start, WindowMs: c.Window.Length, Count: c.Count}
	}
	b, err := proto.Marshal(req)
	if err != nil {
		return err
	}
	at := push.At.UnixMilli()
	return s.rdb.XAdd(ctx, &goredis.XAddArgs{
		Stream: s.key, MinID: strconv.FormatInt(at-s.keep.Milliseconds(), 10), Approx: true,
		Values: []any{"a", at, "p", b},
	}).Err()
}

// Read implements [Store].
func (s *RedisStore) Read(ctx context.Context, cursor string, limit int) ([]Push, string, error) {
	if cursor == "" {
		cursor = "0-0"
	}
	res, err := s.rdb.XRead(ctx, &goredis.XReadArgs{Streams: []string{s.key, cursor}, Count: int64(limit), Block: -1}).Result()
	if err == goredis.Nil {
		return nil, cursor, nil
	}
	if err != nil {
		return nil, cursor, err
	}
	var out []Push
	for _, st := range res {
		for _, m := range st.Messages {
			cursor = m.ID
			p, err := s.push(m)
			if err != nil {
				return out, cursor, fmt.Errorf("region store: entry %s of %s: %w", m.ID, s.key, err)
			}
			out = append(out, p)
		}
	}
	return out, cursor, nil
}

// push decodes a stream entry.
func (s *RedisStore) push(m goredis.XMessage) (Push, error) {
	a, _ := m.Values["a"].(string)
	p, _ := m.Values["p"].(string)
	at, err := strconv.ParseInt(a, 10, 64)
	if err != nil {
		return Push{}, fmt.Errorf("no time: %v", m.Values["a"])
	}
	var req ratelimitdv1.PushRequest
	if err := s.decode.Unmarshal([]byte(p), &req); err != nil {
		return Push{}, err
	}
	out := Push{Region: req.GetRegion(), Weight: req.GetWeight(), At: time.UnixMilli(at), Counts: make([]Count, len(req.GetCounts()))}
	for i, c := range req.GetCounts() {
		out.Counts[i] = Count{Region: out.Region, Key: c.GetKey(), Window: Window{Length: c.GetWindowMs(), Start: c.GetWindowStartMs()}, Count: c.GetCount()}
	}
	return out, nil
}
