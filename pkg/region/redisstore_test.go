package region

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
)

// TestRedisStore merges counts into a real Redis, standalone and a
// 3-master Cluster: each kept at its largest, windows apart, the last
// hearing of each region with its weight, and every window's hash set to
// expire after the window ends.
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
			s := NewRedisStore(rdb, "test:"+name+":")
			now := time.Now()
			w := windowOf(now, time.Minute)
			prev := Window{Length: w.Length, Start: w.Start - w.Length}
			merge := func(region string, weight float64, at time.Time, counts ...Count) {
				t.Helper()
				if err := s.Merge(ctx, region, counts, &Heard{At: at, Weight: weight}); err != nil {
					t.Fatal(err)
				}
			}
			merge("us", 2, now, Count{Key: []byte("a"), Window: w, Count: 5}, Count{Key: []byte("b\x00x"), Window: w, Count: 7}, Count{Key: []byte("a"), Window: prev, Count: 90})
			merge("us", 2, now.Add(-time.Second), Count{Key: []byte("a"), Window: w, Count: 3}) // older and smaller: kept 5
			merge("ap", 0.5, now, Count{Key: []byte("a"), Window: w, Count: 11})
			merge("us", 3, now.Add(time.Second), Count{Key: []byte("b\x00x"), Window: w, Count: 8})
			counts, heard, err := s.Load(ctx, []Window{w, prev})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]uint64{}
			for _, c := range counts {
				got[c.Region+"/"+string(c.Key)+"/"+map[bool]string{true: "now", false: "prev"}[c.Window == w]] = c.Count
			}
			want := map[string]uint64{"us/a/now": 5, "us/b\x00x/now": 8, "us/a/prev": 90, "ap/a/now": 11}
			if len(got) != len(want) {
				t.Fatalf("loaded %v, want %v", got, want)
			}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%q: %d, want %d", k, got[k], v)
				}
			}
			if h := heard["us"]; h.At.UnixMilli() != now.Add(time.Second).UnixMilli() || h.Weight != 3 {
				t.Errorf("us heard %+v, want the last hearing, weight 3", h)
			}
			if h := heard["ap"]; h.At.UnixMilli() != now.UnixMilli() || h.Weight != 0.5 {
				t.Errorf("ap heard %+v", h)
			}
			merge("us", 1, now.Add(-time.Minute)) // an older hearing changes nothing
			if _, heard, _ = s.Load(ctx, nil); heard["us"].Weight != 3 {
				t.Errorf("an older hearing replaced a later one: %+v", heard["us"])
			}
			// A replica's own region's counts are merged, without a hearing.
			if err := s.Merge(ctx, "eu", []Count{{Key: []byte("a"), Window: w, Count: 4}}, nil); err != nil {
				t.Fatal(err)
			}
			if counts, heard, _ = s.Load(ctx, []Window{w}); len(counts) != 4 || heard["eu"] != (Heard{}) {
				t.Errorf("after eu's own count: %d counts, eu heard %+v; want 4 counts, eu never heard", len(counts), heard["eu"])
			}
			ttl, err := rdb.PTTL(ctx, s.windowKey(w)).Result()
			if err != nil || ttl <= 0 || ttl > time.Duration(w.End()-now.UnixMilli())*time.Millisecond+keep(w) {
				t.Errorf("window hash TTL %v (%v): want it to expire %v after the window ends", ttl, err, keep(w))
			}
		})
	}
}
