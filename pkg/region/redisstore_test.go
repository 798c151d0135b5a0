package region

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
)

// TestRedisStore appends pushes to a real Redis, standalone and a 3-master
// Cluster, and reads them back from cursors: all of them from scratch, in
// order and whole; then only the ones after a cursor, in batches; and old
// ones are trimmed away once past the store's keep.
func TestRedisStore(t *testing.T) {
	rs := redistest.Start(t)
	standalone := goredis.NewClient(&goredis.Options{Addr: rs.Addr})
	t.Cleanup(func() { standalone.Close() })
	cl := redistest.StartCluster(t, 3)
	cluster := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Seeds})
	t.Cleanup(func() { cluster.Close() })
	for name, rdb := range map[string]goredis.UniversalClient{"standalone": standalone, "cluster": cluster} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s := NewRedisStore(rdb, "test:"+name+":", 10*time.Second)
			now := time.Now().Truncate(time.Millisecond)
			w := windowOf(now, time.Minute)
			push := func(region string, at time.Time, counts ...Count) Push {
				for i := range counts {
					counts[i].Region = region
				}
				p := Push{Region: region, Weight: 2, At: at, Counts: counts}
				if err := s.Append(ctx, p); err != nil {
					t.Fatal(err)
				}
				return p
			}
			// Far in the past, so that the next appends trim it.
			push("ap", now.Add(-time.Hour), Count{Key: []byte("old"), Window: w, Count: 1})
			var want []Push
			for i := range 25 {
				want = append(want, push("us", now.Add(time.Duration(i)*time.Millisecond),
					Count{Key: []byte("a"), Window: w, Count: uint64(i)}, Count{Key: []byte("b\x00x"), Window: Window{Length: w.Length, Start: w.Start - w.Length}, Count: 7}))
			}
			// XADD MINID ~ trims whole nodes of the stream: the old push may
			// stay until a node fills. What is read is every push kept.
			var got []Push
			cursor := ""
			for {
				ps, next, err := s.Read(ctx, cursor, 10)
				if err != nil {
					t.Fatal(err)
				}
				got, cursor = append(got, ps...), next
				if len(ps) < 10 {
					break
				}
			}
			if len(got) > 0 && got[0].Region == "ap" {
				got = got[1:] // not trimmed yet: allowed
			}
			if len(got) != len(want) {
				t.Fatalf("read %d pushes, want %d", len(got), len(want))
			}
			for i := range want {
				g, w := got[i], want[i]
				if g.Region != w.Region || g.Weight != w.Weight || !g.At.Equal(w.At) || len(g.Counts) != 2 ||
					string(g.Counts[0].Key) != "a" || g.Counts[0].Count != w.Counts[0].Count || g.Counts[0].Window != w.Counts[0].Window ||
					string(g.Counts[1].Key) != "b\x00x" || g.Counts[1].Window != w.Counts[1].Window || g.Counts[1].Region != "us" {
					t.Fatalf("push %d read as %+v, want %+v", i, g, w)
				}
			}
			// From the cursor, only what comes next.
			next := push("eu", now.Add(time.Second), Count{Key: []byte("c"), Window: w, Count: 3})
			ps, _, err := s.Read(ctx, cursor, 10)
			if err != nil || len(ps) != 1 || ps[0].Region != next.Region || ps[0].Counts[0].Count != 3 {
				t.Fatalf("after the cursor: %+v (%v), want the one push appended since", ps, err)
			}
		})
	}
}
