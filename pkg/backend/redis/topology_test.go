package redis

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/key"
)

// TestMain quiets go-redis's own logging (a failover client logs every
// master it selects), which is global to the process.
func TestMain(m *testing.M) {
	goredis.SetLogger(Logger{Log: slog.New(slog.DiscardHandler)})
	os.Exit(m.Run())
}

// dial returns a backend dialled as cfg says, closed when t ends.
func dial(t *testing.T, cfg Config, opts Options) *Backend {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := Dial(ctx, cfg, opts)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// clockedOn is a conformance subject on b with the test's clock.
func clockedOn(b *Backend) algotest.Subject {
	b.minTTL = time.Hour
	return clocked{b}
}

// uniquePrefix returns a key prefix no other test run uses.
func uniquePrefix(t *testing.T) string {
	return fmt.Sprintf("%s:%d:", t.Name(), time.Now().UnixNano())
}

// TestConformanceSentinel runs the algorithm vectors through a client that
// finds the master by asking the sentinels.
func TestConformanceSentinel(t *testing.T) {
	s := redistest.StartSentinel(t, 1, 1)
	newSubject := func(t *testing.T) algotest.Subject {
		return clockedOn(dial(t, Config{URL: s.URL, Mode: Sentinel, MasterName: s.MasterName}, Options{Prefix: uniquePrefix(t)}))
	}
	algotest.Run(t, newSubject)
	algotest.RunBatches(t, newSubject)
}

// TestConformanceCluster runs the algorithm vectors against a 3-master
// Cluster. The batch vectors want one batch decided all or nothing, so
// their keys share a slot through the prefix's hash tag.
func TestConformanceCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	cfg := Config{URL: c.URL, Mode: Cluster}
	algotest.Run(t, func(t *testing.T) algotest.Subject {
		return clockedOn(dial(t, cfg, Options{Prefix: uniquePrefix(t)}))
	})
	algotest.RunBatches(t, func(t *testing.T) algotest.Subject {
		return clockedOn(dial(t, cfg, Options{Prefix: "{" + uniquePrefix(t) + "}"}))
	})
}

// descriptorKey returns the key package key encodes for one entry under l.
func descriptorKey(domain, k, v string, l algo.Limit) []byte {
	b := key.AppendDomain(nil, domain)
	b = key.AppendEntry(b, k, v)
	return key.AppendLimit(b, l)
}

// TestClusterHashTags checks where keys land: every limit of a descriptor
// on one slot; with TagDomain, every key of a domain; otherwise spread.
func TestClusterHashTags(t *testing.T) {
	perSecond := algo.Limit{Algorithm: algo.FixedWindow, Requests: 10, Window: time.Second}
	perHour := algo.Limit{Algorithm: algo.TokenBucket, Requests: 1000, Window: time.Hour}
	byDescriptor := New(nil, Options{Prefix: "rl:", HashTag: TagDescriptor})
	byDomain := New(nil, Options{Prefix: "rl:", HashTag: TagDomain})

	a := descriptorKey("api", "user", "alice", perSecond)
	if got, want := byDescriptor.clusterKey(a), "rl:{3:api=4:user5:alice}|fixed_window/1s"; got != want {
		t.Errorf("clusterKey = %q, want %q", got, want)
	}
	if got, want := byDomain.clusterKey(a), "rl:{3:api}=4:user5:alice|fixed_window/1s"; got != want {
		t.Errorf("domain clusterKey = %q, want %q", got, want)
	}
	// A value holding "|" and braces keeps the limit suffix apart.
	odd := descriptorKey("api", "path", "/a|b/{c}", perHour)
	if got, want := byDescriptor.clusterKey(odd), "rl:{3:api=4:path8:/a|b/{c}}|token_bucket/3600s"; got != want {
		t.Errorf("clusterKey = %q, want %q", got, want)
	}

	slots := make(map[int]bool)
	for i := range 200 {
		v := strconv.Itoa(i)
		s1 := slot(byDescriptor.clusterKey(descriptorKey("api", "user", v, perSecond)))
		s2 := slot(byDescriptor.clusterKey(descriptorKey("api", "user", v, perHour)))
		if s1 != s2 {
			t.Fatalf("user %s: its two limits are on slots %d and %d", v, s1, s2)
		}
		slots[s1] = true
		d1 := slot(byDomain.clusterKey(descriptorKey("api", "user", v, perSecond)))
		d2 := slot(byDomain.clusterKey(descriptorKey("api", "path", v+"/x", perHour)))
		if d1 != d2 || d1 != slot("{3:api}") {
			t.Fatalf("domain tag: slots %d and %d, want both %d", d1, d2, slot("{3:api}"))
		}
	}
	if len(slots) < 150 {
		t.Errorf("200 descriptors landed on %d slots; want them spread", len(slots))
	}
	tenant := New(nil, Options{Prefix: "{tenant}:"})
	if slot(tenant.clusterKey(a)) != slot(tenant.clusterKey(odd)) {
		t.Error("a prefix with a hash tag must put every key on its slot")
	}
}

// TestSlotIsRedisSlot compares slot with CLUSTER KEYSLOT for random keys.
func TestSlotIsRedisSlot(t *testing.T) {
	if got := crc16("123456789"); got != 0x31c3 {
		t.Fatalf(`crc16("123456789") = %#x, want 0x31c3 (CRC-16/XMODEM check value)`, got)
	}
	c := redistest.StartCluster(t, 3)
	rc := goredis.NewClient(&goredis.Options{Addr: c.Seeds[0]})
	defer rc.Close()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := "ab{}|=:x0"
	for range 300 {
		var s strings.Builder
		for range rng.IntN(12) {
			s.WriteByte(alphabet[rng.IntN(len(alphabet))])
		}
		k := s.String()
		want, err := rc.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := slot(k); int64(got) != want {
			t.Fatalf("slot(%q) = %d, CLUSTER KEYSLOT says %d", k, got, want)
		}
	}
}

// TestClusterAtomicity shows what a Cluster decides together: with the
// default tag a request's descriptors on different slots are decided
// each on its own, so one that fits is consumed even when another is over;
// with TagDomain they are all or nothing, as on one server.
func TestClusterAtomicity(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	ctx := context.Background()
	one := algo.Limit{Algorithm: algo.FixedWindow, Requests: 1, Window: time.Hour}
	ten := algo.Limit{Algorithm: algo.FixedWindow, Requests: 10, Window: time.Hour}
	for _, tc := range []struct {
		tag           HashTag
		wantRemaining uint64 // of the roomy descriptor after a refused batch
	}{
		{TagDescriptor, 9},
		{TagDomain, 10},
	} {
		t.Run(tc.tag.String(), func(t *testing.T) {
			b := dial(t, Config{URL: c.URL, Mode: Cluster}, Options{Prefix: uniquePrefix(t), HashTag: tc.tag})
			tight := descriptorKey("api", "user", "alice", one)
			roomy := descriptorKey("api", "tenant", "acme", ten)
			if tc.tag == TagDescriptor && slot(b.clusterKey(tight)) == slot(b.clusterKey(roomy)) {
				t.Fatal("test keys share a slot; pick others")
			}
			out := make([]algo.Decision, 2)
			// Use up the tight limit alone.
			if err := b.Decide(ctx, []algo.Request{{Key: tight, Limit: one, Hits: 1}}, out); err != nil || !out[0].Allowed {
				t.Fatalf("first hit: %+v, %v", out[0], err)
			}
			batch := []algo.Request{{Key: tight, Limit: one, Hits: 1}, {Key: roomy, Limit: ten, Hits: 1}}
			if err := b.Decide(ctx, batch, out); err != nil {
				t.Fatal(err)
			}
			if out[0].Allowed {
				t.Fatalf("tight descriptor admitted past its limit: %+v", out[0])
			}
			peek := []algo.Request{{Key: roomy, Limit: ten}}
			if err := b.Decide(ctx, peek, out); err != nil {
				t.Fatal(err)
			}
			if out[0].Remaining != tc.wantRemaining {
				t.Errorf("roomy descriptor has %d remaining after the refused batch, want %d", out[0].Remaining, tc.wantRemaining)
			}
		})
	}
}

// TestOneCallPerBatch counts, on the server, the calls a batch costs: one
// FCALL (one EVALSHA with scripts) for a batch of three descriptors (the
// GETs, SETs and TIME the decision runs inside it are counted apart, as
// such); and what a lost function or script costs once: after FUNCTION
// FLUSH one FCALL answered "not found", a FUNCTION LOAD and the FCALL
// again; after SCRIPT FLUSH one EVALSHA answered NOSCRIPT and one EVAL.
func TestOneCallPerBatch(t *testing.T) {
	srv := redistest.Start(t)
	admin := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer admin.Close()
	ctx := context.Background()
	l := algo.Limit{Algorithm: algo.GCRA, Requests: 100, Window: time.Minute}
	batch := []algo.Request{
		{Key: descriptorKey("api", "user", "a", l), Limit: l, Hits: 1},
		{Key: descriptorKey("api", "user", "b", l), Limit: l, Hits: 1},
		{Key: descriptorKey("api", "user", "c", l), Limit: l, Hits: 1},
	}
	out := make([]algo.Decision, len(batch))
	calls := func(cmds ...string) []int {
		n := make([]int, len(cmds))
		for i, c := range cmds {
			n[i] = redistest.CommandCalls(t, admin, c)
		}
		return n
	}
	for _, tc := range []struct {
		name    string
		scripts bool
		flush   func() error
		cmds    []string
		steady  []int // per 10 batches
		flushed []int // per 3 batches after the flush
	}{
		{"functions", false, func() error { return admin.FunctionFlush(ctx).Err() },
			[]string{"fcall", "function|load", "evalsha", "eval"}, []int{10, 0, 0, 0}, []int{4, 1, 0, 0}},
		{"scripts", true, func() error { return admin.ScriptFlush(ctx).Err() },
			[]string{"evalsha", "eval", "fcall"}, []int{10, 0, 0}, []int{3, 1, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := dial(t, Config{URL: srv.URL}, Options{Prefix: uniquePrefix(t), Scripts: tc.scripts})
			if b.Functions() == tc.scripts {
				t.Fatalf("Functions() = %v on Redis 7 with Scripts %v", b.Functions(), tc.scripts)
			}
			decide := func(n int) []int {
				if err := admin.ConfigResetStat(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				for range n {
					if err := b.Decide(ctx, batch, out); err != nil {
						t.Fatal(err)
					}
				}
				return calls(tc.cmds...)
			}
			if got := decide(10); !slices.Equal(got, tc.steady) {
				t.Errorf("10 batches cost %v of %v, want %v", got, tc.cmds, tc.steady)
			}
			if err := tc.flush(); err != nil {
				t.Fatal(err)
			}
			if got := decide(3); !slices.Equal(got, tc.flushed) {
				t.Errorf("after the flush 3 batches cost %v of %v, want %v", got, tc.cmds, tc.flushed)
			}
		})
	}
}

// TestClusterOneCallPerSlot checks that a batch over several slots costs one
// call per slot group, and that a lost function or script (every master's
// flushed) is recovered within the same decision.
func TestClusterOneCallPerSlot(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	ctx := context.Background()
	l := algo.Limit{Algorithm: algo.FixedWindow, Requests: 5, Window: time.Hour}
	admins := make([]*goredis.Client, len(c.Seeds))
	for i, a := range c.Seeds {
		admins[i] = goredis.NewClient(&goredis.Options{Addr: a})
		defer admins[i].Close()
	}
	for _, tc := range []struct {
		name    string
		scripts bool
		cmds    []string
		want    []int
	}{
		// Round 1: every group answers "not found"; the first reloads the
		// library on the 3 masters and calls again, the others call again.
		{"functions", false, []string{"fcall", "function|load", "evalsha"}, []int{9, 3, 0}},
		// Round 1: every group answers NOSCRIPT and is run by EVAL.
		{"scripts", true, []string{"evalsha", "eval", "fcall"}, []int{6, 3, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := dial(t, Config{URL: c.URL, Mode: Cluster}, Options{Prefix: uniquePrefix(t), Scripts: tc.scripts})
			var batch []algo.Request
			groups := make(map[int]bool)
			for i := 0; len(groups) < 3; i++ {
				k := descriptorKey("api", "user", strconv.Itoa(i), l)
				s := slot(b.clusterKey(k))
				if groups[s] {
					continue
				}
				groups[s] = true
				batch = append(batch, algo.Request{Key: k, Limit: l, Hits: 1})
			}
			for _, a := range admins {
				if err := a.ScriptFlush(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				if err := a.FunctionFlush(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				if err := a.ConfigResetStat(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}
			out := make([]algo.Decision, len(batch))
			for round := range 2 {
				if err := b.Decide(ctx, batch, out); err != nil {
					t.Fatal(err)
				}
				for i, d := range out {
					if !d.Allowed || d.Remaining != uint64(4-round) {
						t.Fatalf("round %d, request %d: %+v, want allowed with %d remaining", round, i, d, 4-round)
					}
				}
			}
			got := make([]int, len(tc.cmds))
			for _, a := range admins {
				for i, cmd := range tc.cmds {
					got[i] += redistest.CommandCalls(t, a, cmd)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("2 batches of 3 slots, after a flush, cost %v of %v, want %v", got, tc.cmds, tc.want)
			}
		})
	}
}

// TestACL connects as a user the server requires.
func TestACL(t *testing.T) {
	srv := redistest.StartWith(t, redistest.Options{User: "limiter", Password: "s3cret-pw"})
	b := dial(t, Config{URL: srv.URL}, Options{Prefix: uniquePrefix(t)})
	l := algo.Limit{Algorithm: algo.FixedWindow, Requests: 1, Window: time.Hour}
	out := make([]algo.Decision, 1)
	if err := b.Decide(context.Background(), []algo.Request{{Key: []byte("k"), Limit: l, Hits: 1}}, out); err != nil || !out[0].Allowed {
		t.Fatalf("Decide as limiter: %+v, %v", out[0], err)
	}
	wrong := strings.Replace(srv.URL, "s3cret-pw", "wrong", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := Dial(ctx, Config{URL: wrong}, Options{})
	if err == nil {
		t.Fatal("Dial with a wrong password succeeded")
	}
	if strings.Contains(err.Error(), "wrong") || strings.Contains(err.Error(), "s3cret-pw") {
		t.Errorf("the error shows the password: %v", err)
	}
}

// TestTLS connects over TLS, trusting the test CA, and fails without it.
func TestTLS(t *testing.T) {
	srv := redistest.StartWith(t, redistest.Options{TLS: true})
	if !strings.HasPrefix(srv.URL, "rediss://") {
		t.Fatalf("TLS server URL %q", srv.URL)
	}
	// Timeouts a loaded machine's TLS handshake meets: with the defaults
	// (250 ms to dial, handshake included) this failed with "context
	// deadline exceeded" while go test ./... kept both cores busy.
	slow := Config{URL: srv.URL, TLSCAFile: srv.CAFile, DialTimeout: 3 * time.Second, ReadTimeout: 3 * time.Second, WriteTimeout: 3 * time.Second}
	b := dial(t, slow, Options{Prefix: uniquePrefix(t)})
	l := algo.Limit{Algorithm: algo.TokenBucket, Requests: 2, Window: time.Hour}
	out := make([]algo.Decision, 1)
	if err := b.Decide(context.Background(), []algo.Request{{Key: []byte("k"), Limit: l, Hits: 1}}, out); err != nil || !out[0].Allowed || out[0].Remaining != 1 {
		t.Fatalf("Decide over TLS: %+v, %v", out[0], err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Timeouts long enough that a loaded machine's slow handshake fails on
	// the certificate, not on a deadline.
	_, err := Dial(ctx, Config{URL: srv.URL, DialTimeout: 3 * time.Second, ReadTimeout: 3 * time.Second, WriteTimeout: 3 * time.Second}, Options{})
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("Dial without the CA: %v, want an error saying the certificate is not trusted", err)
	}
}

// TestNewClientRefusesBadConfig checks that each bad configuration is
// refused before connecting, with a message saying what to fix.
func TestNewClientRefusesBadConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "no URL"},
		{Config{URL: "http://localhost:6379"}, "address 1 of the URL"},
		{Config{URL: "redis://a:1,redis://b:2"}, "standalone mode takes one address, the URL has 2"},
		{Config{URL: "redis://a:1", Mode: Sentinel}, "needs the master's name"},
		{Config{URL: "redis://a:1/3", Mode: Cluster}, "only database 0"},
		{Config{URL: "redis://a:1,rediss://b:2", Mode: Cluster}, "mixes redis:// and rediss://"},
		{Config{URL: "redis://a:1", TLSCAFile: "ca.pem"}, "use rediss://"},
		{Config{URL: "rediss://a:1", TLSCertFile: "c.pem"}, "both the certificate and the key"},
		{Config{URL: "rediss://a:1", TLSCAFile: "/nonexistent/ca.pem"}, "TLS CA file"},
		{Config{URL: "redis://a:1", Mode: "ring"}, `unknown mode "ring"`},
	} {
		_, err := NewClient(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewClient(%+v) = %v, want an error containing %q", tc.cfg, err, tc.want)
		}
	}
	for _, ok := range []Config{
		{URL: "redis://localhost:6379/2"},
		{URL: "localhost:6379"},
		{URL: "redis://:pw@s1:26379,s2:26379,s3:26379", Mode: Sentinel, MasterName: "mymaster"},
		{URL: "n1:7000,n2:7001,n3:7002", Mode: Cluster},
	} {
		c, err := NewClient(ok)
		if err != nil {
			t.Errorf("NewClient(%+v): %v", ok, err)
			continue
		}
		c.Close()
	}
}

// TestRedactURL hides passwords, also in lists of URLs.
func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"redis://localhost:6379":                        "redis://localhost:6379",
		"redis://user:hunter2@h:1/0":                    "redis://user:xxxxx@h:1/0",
		"rediss://:hunter2@a:1,rediss://:hunter2@b:2":   "rediss://:xxxxx@a:1,rediss://:xxxxx@b:2",
		"redis://us er:hunter2@h:1":                     "<unparsable URL hidden: it may hold a password>",
		"redis://h:6379/0?password=hunter2":             "redis://h:6379/0?password=xxxxx",
		"redis://h:1/0?db=0&Auth_Token=hunter2":         "redis://h:1/0?Auth_Token=xxxxx&db=0",
		"redis://h:1,redis://h:2?sentinel_pass=hunter2": "redis://h:1,redis://h:2?sentinel_pass=xxxxx",
		"redis://h:1/0?dial_timeout=1s":                 "redis://h:1/0?dial_timeout=1s",
		"redis://h:1/0?password=%zz":                    "redis://h:1/0?<unparsable query hidden>",
		"redis://h:1 /0?password=hunter2":               "<unparsable URL hidden: it may hold a password>",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestErrorsHideThePassword: no error of NewClient or Dial shows a
// password given in the URL, as user info or as a query parameter, in any
// mode, whatever is wrong with the URL or the server.
func TestErrorsHideThePassword(t *testing.T) {
	dead := redistest.StartNode(t)
	dead.Kill(t)
	urls := []string{
		"redis://h:6379/0?password=hunter2",
		"redis://h:6379/0?password=hunter2&db=x",
		"redis://:hunter2@h:6379/0?unknown=1",
		"redis://u:hunter2@h:6379/99999999999999999999",
		"rediss://u:hunter2@h:6379/0?skip_verify=maybe",
		"redis://u:hunter2@h:notaport/0",
		"redis://u:hunter2@ho st:6379/0",
		"redis://h:1,redis://u:hunter2@h:2?dial_timeout=x",
		"redis://h:1,rediss://u:hunter2@h:2",
		"redis://u:hunter2@" + dead.Addr,
		"redis://" + dead.Addr + "?password=hunter2",
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, u := range urls {
		for _, mode := range []Mode{Standalone, Sentinel, Cluster} {
			_, err := Dial(ctx, Config{URL: u, Mode: mode, MasterName: "m", DialTimeout: 100 * time.Millisecond}, Options{})
			if err == nil {
				t.Errorf("Dial(%s) in %s mode succeeded", RedactURL(u), mode)
				continue
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("Dial in %s mode: %v", mode, err)
			}
			if strings.Contains(u, "?password=") && !strings.Contains(u, dead.Addr) && !strings.Contains(err.Error(), "user info") {
				t.Errorf("Dial in %s mode: %v; want a hint to give the password as user info", mode, err)
			}
		}
	}
}

// BenchmarkDecide measures a decision on a real redis-server on loopback:
// one request, and a batch of three, each one call of the decision; serial
// (latency) and from parallel goroutines (throughput of one client), the
// latter also from 25 goroutines per core through 4 coalescing workers, as
// ratelimitd runs by default.
func BenchmarkDecide(b *testing.B) {
	srv := redistest.Start(b)
	ctx := context.Background()
	be, err := Dial(ctx, Config{URL: srv.URL}, Options{Prefix: "bench:"})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	co, err := Dial(ctx, Config{URL: srv.URL}, Options{Prefix: "bench:", Coalesce: 4})
	if err != nil {
		b.Fatal(err)
	}
	defer co.Close()
	l := algo.Limit{Algorithm: algo.FixedWindow, Requests: 1 << 20, Window: time.Hour}
	for _, n := range []int{1, 3} {
		batch := make([]algo.Request, n)
		for i := range batch {
			batch[i] = algo.Request{Key: descriptorKey("bench", "user", strconv.Itoa(i), l), Limit: l, Hits: 1}
		}
		b.Run(fmt.Sprintf("batch=%d/serial", n), func(b *testing.B) {
			b.ReportAllocs()
			out := make([]algo.Decision, n)
			for b.Loop() {
				if err := be.Decide(ctx, batch, out); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("batch=%d/parallel", n), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				out := make([]algo.Decision, n)
				for pb.Next() {
					if err := be.Decide(ctx, batch, out); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
		b.Run(fmt.Sprintf("batch=%d/coalesce=4/parallel", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(25) // 50 callers on 2 cores, as make loadtest
			b.RunParallel(func(pb *testing.PB) {
				out := make([]algo.Decision, n)
				for pb.Next() {
					if err := co.Decide(ctx, batch, out); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// leastPrivilege is the ACL docs/redis.md recommends for ratelimitd's
// Redis user: the script and what it runs, on the prefix's keys only, and
// the Cluster's slot map.
const leastPrivilege = "on >rl-secret ~ratelimitd:* +fcall +function|load +evalsha +eval +script|load +ping +hello +auth " +
	"+mget +set +del +pexpire +time +zadd +zrem +zcount +zrangebyscore +zrevrangebyscore +zremrangebyscore " +
	"+cluster|slots"

// TestLeastPrivilegeACL decides every algorithm as a user holding only the
// documented ACL, on one server and on a Cluster (the user is added to each
// node), and checks the user can do nothing else.
func TestLeastPrivilegeACL(t *testing.T) {
	srv := redistest.Start(t)
	cl := redistest.StartCluster(t, 3)
	for _, tc := range []struct {
		mode  Mode
		addrs []string
	}{
		{Standalone, []string{srv.Addr}},
		{Cluster, cl.Seeds},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			ctx := context.Background()
			for _, a := range tc.addrs {
				admin := goredis.NewClient(&goredis.Options{Addr: a})
				err := admin.Do(ctx, append([]any{"ACL", "SETUSER", "ratelimitd"}, anySlice(strings.Fields(leastPrivilege))...)...).Err()
				admin.Close()
				if err != nil {
					t.Fatalf("ACL SETUSER on %s: %v", a, err)
				}
			}
			urls := make([]string, len(tc.addrs))
			for i, a := range tc.addrs {
				urls[i] = "redis://ratelimitd:rl-secret@" + a
			}
			b := dial(t, Config{URL: strings.Join(urls, ","), Mode: tc.mode}, Options{Prefix: "ratelimitd:", HashTag: TagDomain})
			if !b.Functions() {
				t.Error("the least-privileged user cannot use the decision functions")
			}
			out := make([]algo.Decision, 1)
			for _, a := range algo.Algorithms() {
				l := algo.Limit{Algorithm: a, Requests: 2, Window: time.Hour}
				k := descriptorKey("acl", "t", fmt.Sprint(time.Now().UnixNano()), l)
				for i := range 3 {
					if err := b.Decide(ctx, []algo.Request{{Key: k, Limit: l, Hits: 1}}, out); err != nil {
						t.Fatalf("%v as the least-privileged user: %v", a, err)
					}
					if out[0].Allowed != (i < 2) {
						t.Fatalf("%v hit %d: %+v", a, i+1, out[0])
					}
				}
				// Hits counted past the limit (over_limit_hits: count).
				if err := b.Decide(ctx, []algo.Request{{Key: k, Limit: l, Hits: 5, Count: true}}, out); err != nil || out[0].Allowed {
					t.Fatalf("%v, a cost counted past the limit as the least-privileged user: %+v, %v", a, out[0], err)
				}
			}
			// Concurrency slots: taken, refused, given back, kept.
			slots := algo.Limit{Algorithm: algo.Concurrency, Requests: 2, Window: time.Hour}
			k := descriptorKey("acl", "t", fmt.Sprint(time.Now().UnixNano()), slots)
			for i, op := range []struct {
				op      algo.Op
				holder  uint64
				allowed bool
			}{{algo.OpAcquire, 1, true}, {algo.OpAcquire, 2, true}, {algo.OpAcquire, 3, false}, {algo.OpRelease, 1, true}, {algo.OpAcquire, 3, true}, {algo.OpRenew, 2, true}} {
				r := algo.Request{Key: k, Limit: slots, Hits: 1, Op: op.op, Holder: algo.Holder{op.holder, op.holder}}
				if err := b.Decide(ctx, []algo.Request{r}, out); err != nil {
					t.Fatalf("slot op %d as the least-privileged user: %v", i, err)
				}
				if out[0].Allowed != op.allowed {
					t.Fatalf("slot op %d: %+v", i, out[0])
				}
			}
			// The reference layout (-redis-key-format reference) needs
			// INCRBY and EXPIRE too, as docs/redis.md says: refused
			// without them, decided with them.
			fixed := algo.Limit{Algorithm: algo.FixedWindow, Requests: 2, Window: time.Minute}
			ref := []algo.Request{{Key: []byte(fmt.Sprint("native-", time.Now().UnixNano())), RefKey: refKey("acl", "user", fmt.Sprint(time.Now().UnixNano())), Limit: fixed, Hits: 1}}
			if err := b.Decide(ctx, ref, out); err == nil || !strings.Contains(err.Error(), "can't run this command") {
				t.Errorf("a reference key without +incrby +expire: %v, want the ACL to refuse it", err)
			}
			for _, a := range tc.addrs {
				admin := goredis.NewClient(&goredis.Options{Addr: a})
				err := admin.Do(ctx, "ACL", "SETUSER", "ratelimitd", "+incrby", "+expire").Err()
				admin.Close()
				if err != nil {
					t.Fatalf("ACL SETUSER +incrby +expire on %s: %v", a, err)
				}
			}
			for i := range 3 {
				if err := b.Decide(ctx, ref, out); err != nil {
					t.Fatalf("a reference key with +incrby +expire, hit %d: %v", i+1, err)
				}
				if out[0].Allowed != (i < 2) {
					t.Fatalf("reference key, hit %d: %+v", i+1, out[0])
				}
			}
			if err := b.Client().Do(ctx, "FLUSHALL").Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
				t.Errorf("FLUSHALL as the least-privileged user: %v, want NOPERM", err)
			}
			if err := b.Client().Set(ctx, "other:key", "x", 0).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
				t.Errorf("SET outside the prefix: %v, want NOPERM", err)
			}
		})
	}
}

func anySlice(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// TestDialRefusesTheWrongMode connects in the wrong mode both ways and
// wants errors that name the fix, not MOVED errors on every other call.
func TestDialRefusesTheWrongMode(t *testing.T) {
	srv := redistest.Start(t)
	cl := redistest.StartCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{URL: "redis://" + cl.Seeds[0]}, "the server is a Cluster node; use -redis-mode cluster"},
		{Config{URL: srv.URL, Mode: Cluster}, "cluster mode at " + srv.URL + ": ERR This instance has cluster support disabled"},
	} {
		b, err := Dial(ctx, tc.cfg, Options{})
		if err == nil {
			b.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Dial(%+v) = %v, want an error containing %q", tc.cfg, err, tc.want)
		}
	}
}

// TestUnreachable tells a Redis that cannot be reached from one that
// answers with an error, so that the server can start on the first and
// must refuse to start on the second.
func TestUnreachable(t *testing.T) {
	srv := redistest.StartWith(t, redistest.Options{Password: "pw"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dead := redistest.StartNode(t)
	dead.Kill(t)
	for _, tc := range []struct {
		url         string
		unreachable bool
	}{
		{"redis://" + dead.Addr, true},
		{"redis://:wrong@" + srv.Addr, false},
	} {
		_, err := Dial(ctx, Config{URL: tc.url}, Options{})
		if err == nil || Unreachable(err) != tc.unreachable {
			t.Errorf("Dial(%s): %v; Unreachable = %v, want %v", tc.url, err, err != nil && Unreachable(err), tc.unreachable)
		}
	}
}

// TestReset forgets keys on one server and on a Cluster: the next decision
// starts afresh, and other keys keep their counts.
func TestReset(t *testing.T) {
	srv := redistest.Start(t)
	cl := redistest.StartCluster(t, 3)
	ctx := context.Background()
	l := algo.Limit{Algorithm: algo.FixedWindow, Requests: 2, Window: time.Hour}
	for _, cfg := range []Config{{URL: srv.URL}, {URL: cl.URL, Mode: Cluster}} {
		t.Run(string(modeName(cfg.Mode)), func(t *testing.T) {
			b := dial(t, cfg, Options{Prefix: uniquePrefix(t)})
			keys := [][]byte{descriptorKey("api", "user", "a", l), descriptorKey("api", "user", "b", l), descriptorKey("api", "user", "c", l)}
			out := make([]algo.Decision, 1)
			for _, k := range keys {
				for range 2 {
					if err := b.Decide(ctx, []algo.Request{{Key: k, Limit: l, Hits: 1}}, out); err != nil || !out[0].Allowed {
						t.Fatalf("%s: %+v, %v", k, out[0], err)
					}
				}
			}
			if err := b.Reset(ctx, []algo.Request{{Key: keys[0]}, {Key: keys[1]}}); err != nil {
				t.Fatal(err)
			}
			for i, k := range keys {
				if err := b.Decide(ctx, []algo.Request{{Key: k, Limit: l}}, out); err != nil {
					t.Fatal(err)
				}
				if want := uint64(map[bool]int{true: 2, false: 0}[i < 2]); out[0].Remaining != want {
					t.Errorf("%s after the reset: %d remaining, want %d", k, out[0].Remaining, want)
				}
			}
		})
	}
}
