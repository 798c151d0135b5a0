package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
)

// exactLimit is N of the exactness rules: N per hour, so that no bucket
// refills a whole hit within a test (one per 36 s).
const exactLimit = 100

// exactAlgorithms are the algorithms whose rule admits exactly N from a
// fresh key within one window. sliding_window_counter is exact too while
// its previous window is empty, as it is for a fresh key.
var exactAlgorithms = []string{
	"fixed_window", "sliding_window_log", "sliding_window_counter",
	"token_bucket", "leaky_bucket", "gcra", "burst_fill",
}

// writeExactRules writes a rule file of domain "exact" with one rule per
// algorithm: descriptor (algorithm, <name>), N per hour.
func writeExactRules(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("domain: exact\ndescriptors:\n")
	for _, a := range exactAlgorithms {
		fmt.Fprintf(&b, "  - key: algorithm\n    value: %s\n    rate_limit:\n      name: %s\n      requests_per_unit: %d\n      unit: hour\n      algorithm: %s\n", a, a, exactLimit, a)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "exact.yaml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// redisArgs are the flags of a ratelimitd on Redis at url, with keys under a
// prefix of the test's own. A failed backend call is an error the test
// sees (failure mode error), never a decision by a failure mode that would
// pass for Redis's, and the deadline is long enough for a loaded machine:
// the backend's and the Redis client's alike, since a call gives up at the
// sooner of the two (the read timeout's 100 ms by default), and a
// decision Redis runs within the not-after margin of that is refused as
// late (docs/failure-modes.md); with the read timeout at its default, 248
// of 23,082 calls of one test failed so in a CI run beside other builds.
func redisArgs(t *testing.T, url, mode string, extra ...string) []string {
	return append([]string{
		"-backend", "redis", "-redis-url", url, "-redis-mode", mode,
		"-redis-prefix", fmt.Sprintf("%s:%d:", t.Name(), time.Now().UnixNano()),
		"-failure-mode", "error", "-backend-timeout", "2s",
		"-redis-read-timeout", "2s", "-redis-write-timeout", "2s",
	}, extra...)
}

// descriptorRequest asks for one hit of (key, value) in domain.
func descriptorRequest(domain, key, value string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}},
	}}
}

// hammer sends total requests from clients concurrent callers, spread
// round-robin over the servers' connections, and counts the answers. Any
// call error fails the test.
func hammer(t *testing.T, clients []rlsv3.RateLimitServiceClient, callers, total int, req *rlsv3.RateLimitRequest) (ok, over int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var sent, nOK, nOver, nErr atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; ; i += callers {
				if sent.Add(1) > int64(total) {
					return
				}
				resp, err := clients[i%len(clients)].ShouldRateLimit(ctx, req)
				switch {
				case err != nil:
					nErr.Add(1)
					firstErr.CompareAndSwap(nil, err)
				case resp.OverallCode == rlsv3.RateLimitResponse_OK:
					nOK.Add(1)
				default:
					nOver.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := nErr.Load(); n > 0 {
		t.Fatalf("%d of %d calls failed; the first: %v", n, total, firstErr.Load())
	}
	return int(nOK.Load()), int(nOver.Load())
}

// startReplicas starts n ratelimitd processes with args and returns a
// client of each.
func startReplicas(t *testing.T, argsOf func(i int) []string, n int) []rlsv3.RateLimitServiceClient {
	t.Helper()
	clients := make([]rlsv3.RateLimitServiceClient, n)
	for i := range n {
		s := startServer(t, argsOf(i)...)
		clients[i] = rlsv3.NewRateLimitServiceClient(s.dial(t))
	}
	return clients
}

// TestExactAcrossReplicas starts three ratelimitd processes on one Redis
// (standalone, then a 3-master Cluster) and has 60 concurrent callers
// send 3N requests for one descriptor through all three: exactly N are
// admitted, for every algorithm.
func TestExactAcrossReplicas(t *testing.T) {
	rules := writeExactRules(t)
	topologies := []struct {
		name  string
		start func(t *testing.T) (url string, admin goredis.UniversalClient)
	}{
		{"standalone", func(t *testing.T) (string, goredis.UniversalClient) {
			s := redistest.Start(t)
			return s.URL, goredis.NewClient(&goredis.Options{Addr: s.Addr})
		}},
		{"cluster", func(t *testing.T) (string, goredis.UniversalClient) {
			c := redistest.StartCluster(t, 3)
			return c.URL, goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: c.Seeds})
		}},
	}
	for _, topo := range topologies {
		t.Run(topo.name, func(t *testing.T) {
			url, admin := topo.start(t)
			defer admin.Close()
			args := redisArgs(t, url, topo.name, "-config", rules)
			clients := startReplicas(t, func(int) []string { return args }, 3)
			for _, a := range exactAlgorithms {
				t.Run(a, func(t *testing.T) {
					redistest.AwayFromHourEnd(t, admin, 30*time.Second)
					ok, over := hammer(t, clients, 60, 3*exactLimit, descriptorRequest("exact", "algorithm", a))
					if ok != exactLimit || over != 2*exactLimit {
						t.Errorf("3 replicas admitted %d of %d calls and refused %d; want exactly %d admitted", ok, 3*exactLimit, over, exactLimit)
					}
				})
			}
		})
	}
}

// TestClockSkewDoesNotMatter runs three replicas whose clocks are 40
// minutes apart on one token bucket of N per hour. Deciding by the Redis
// clock they admit exactly N; deciding by their own clocks (-redis-clock
// local), the replica ahead sees the bucket refilled by the others' 40 or
// 80 minutes and admits more: the test can see skew.
func TestClockSkewDoesNotMatter(t *testing.T) {
	srv := redistest.Start(t)
	admin := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer admin.Close()
	rules := writeExactRules(t)
	offsets := []string{"-40m", "0s", "40m"}
	for _, tc := range []struct {
		clock string
		exact bool
	}{{"redis", true}, {"local", false}} {
		t.Run(tc.clock, func(t *testing.T) {
			args := redisArgs(t, srv.URL, "standalone", "-config", rules, "-redis-clock", tc.clock)
			clients := startReplicas(t, func(i int) []string {
				return append(args, "-clock-offset", offsets[i])
			}, 3)
			ok, _ := hammer(t, clients, 60, 3*exactLimit, descriptorRequest("exact", "algorithm", "token_bucket"))
			if tc.exact && ok != exactLimit {
				t.Errorf("skewed replicas on the Redis clock admitted %d, want exactly %d", ok, exactLimit)
			}
			if !tc.exact && ok <= exactLimit {
				t.Errorf("skewed replicas on their own clocks admitted %d, want more than %d (else this test cannot see skew)", ok, exactLimit)
			}
			t.Logf("-redis-clock %s with clocks %v: %d of %d admitted", tc.clock, offsets, ok, 3*exactLimit)
		})
	}
}

// untilDecided calls ShouldRateLimit until a call succeeds or timeout
// passes, and returns the answer and the number of failed calls.
func untilDecided(t *testing.T, c rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest, timeout time.Duration) (*rlsv3.RateLimitResponse, int) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	failed := 0
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := c.ShouldRateLimit(ctx, req)
		cancel()
		if err == nil {
			return resp, failed
		}
		failed++
		if time.Now().After(deadline) {
			t.Fatalf("no decision within %v of the fault (%d failed calls); last error: %v", timeout, failed, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// decide calls ShouldRateLimit once, failing the test on an error.
func decide(t *testing.T, c rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// consumeUntilOver calls until the answer is OVER_LIMIT and returns how
// many calls were admitted before.
func consumeUntilOver(t *testing.T, c rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) int {
	t.Helper()
	for n := 0; n <= 2*exactLimit; n++ {
		if decide(t, c, req).OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			return n
		}
	}
	t.Fatalf("still admitted after %d calls", 2*exactLimit)
	return 0
}

// TestSentinelFailover kills the master under a ratelimitd in sentinel
// mode: once the sentinels have promoted the replica, the service answers
// again, the script is reloaded on the new master (NOSCRIPT), and counting
// resumes where it stood.
func TestSentinelFailover(t *testing.T) {
	s := redistest.StartSentinel(t, 1, 3)
	rules := writeExactRules(t)
	srv := startServer(t, redisArgs(t, s.URL, "sentinel", "-config", rules, "-redis-master", s.MasterName)...)
	c := rlsv3.NewRateLimitServiceClient(srv.dial(t))
	req := descriptorRequest("exact", "algorithm", "gcra")

	const before = 40
	for i := range before {
		if resp := decide(t, c, req); resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d refused: %v", i, resp)
		}
	}
	// Let the replica catch up, so the failover loses nothing: this test is
	// about the service, not about asynchronous replication.
	master := goredis.NewClient(&goredis.Options{Addr: s.Master.Addr})
	if n, err := master.Wait(context.Background(), 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT for the replica: %d, %v", n, err)
	}
	master.Close()

	old := s.Master.Addr
	s.Master.Kill(t)
	start := time.Now()
	resp, failed := untilDecided(t, c, req, 60*time.Second)
	newMaster := s.WaitForFailover(t, old, 30*time.Second)
	t.Logf("master %s killed; decisions resumed after %v and %d failed calls; new master %s",
		old, time.Since(start).Round(time.Millisecond), failed, newMaster)
	if resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first decision after the failover: %v", resp)
	}
	// Functions are replicated: the promoted replica holds the decision
	// library (its one FUNCTION LOAD is the master's, replicated) and
	// decides with it.
	promoted := goredis.NewClient(&goredis.Options{Addr: newMaster})
	defer promoted.Close()
	libs, err := promoted.FunctionList(context.Background(), goredis.FunctionListQuery{LibraryNamePattern: "ratelimitd_*"}).Result()
	if err != nil || len(libs) != 1 {
		t.Errorf("the new master's decision libraries: %v, %v; want the one replicated", libs, err)
	}
	if n, loads := redistest.CommandCalls(t, promoted, "fcall"), redistest.CommandCalls(t, promoted, "function|load"); n == 0 || loads > 1 {
		t.Errorf("the new master ran FCALL %d times and FUNCTION LOAD %d times; want decisions by the replicated library", n, loads)
	}
	if got, want := resp.Statuses[0].LimitRemaining, uint32(exactLimit-before-1); got != want {
		t.Errorf("after the failover %d remain, want %d: counting must resume where it stood", got, want)
	}
	if n := consumeUntilOver(t, c, req); n != exactLimit-before-1 {
		t.Errorf("after the failover %d more admitted, want %d", n, exactLimit-before-1)
	}
}

// TestClusterResharding moves the slot of a counted key to another master
// while a caller keeps deciding: the service keeps answering (go-redis
// follows ASK and MOVED), the count moves with the key, and exactly N are
// admitted in all.
func TestClusterResharding(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	rules := writeExactRules(t)
	prefix := fmt.Sprintf("reshard:%d:", time.Now().UnixNano())
	srv := startServer(t, "-backend", "redis", "-redis-url", cl.URL, "-redis-mode", "cluster", "-redis-prefix", prefix, "-config", rules,
		"-failure-mode", "error", "-backend-timeout", "2s")
	c := rlsv3.NewRateLimitServiceClient(srv.dial(t))
	req := descriptorRequest("exact", "algorithm", "fixed_window")
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Seeds})
	defer cc.Close()
	redistest.AwayFromHourEnd(t, cc, time.Minute)

	admitted := 0
	for range 30 {
		if decide(t, c, req).OverallCode == rlsv3.RateLimitResponse_OK {
			admitted++
		}
	}
	key, from, to := findKeyAndNodes(t, cl, prefix)

	// A caller keeps deciding while the slot moves.
	var during, failedDuring atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			resp, err := c.ShouldRateLimit(ctx, req)
			cancel()
			if err != nil {
				failedDuring.Add(1)
			} else if resp.OverallCode == rlsv3.RateLimitResponse_OK {
				during.Add(1)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	migrateSlot(t, key, from, to)
	time.Sleep(200 * time.Millisecond)
	close(stop)
	<-done

	for _, n := range []clusterNode{from, to} {
		got, err := n.client.Exists(context.Background(), key).Result()
		if err != nil && !strings.HasPrefix(err.Error(), "MOVED") {
			t.Fatal(err)
		}
		if want := map[string]int64{from.addr: 0, to.addr: 1}[n.addr]; got != want {
			t.Fatalf("after the move, %s holds %d of the key %s, want %d", n.addr, got, key, want)
		}
	}
	admitted += int(during.Load())
	admitted += consumeUntilOver(t, c, req)
	t.Logf("slot moved from %s to %s under load: %d decided during the move, %d calls failed", from.addr, to.addr, during.Load(), failedDuring.Load())
	if admitted != exactLimit {
		t.Errorf("admitted %d in all across the resharding, want exactly %d", admitted, exactLimit)
	}
}

// clusterNode is a master of the test cluster.
type clusterNode struct {
	id, addr string
	client   *goredis.Client
}

// findKeyAndNodes finds the one key under prefix, the master holding it
// and another master.
func findKeyAndNodes(t *testing.T, cl *redistest.Cluster, prefix string) (string, clusterNode, clusterNode) {
	t.Helper()
	ctx := context.Background()
	var key string
	var from clusterNode
	var others []clusterNode
	for _, n := range cl.Nodes {
		c := goredis.NewClient(&goredis.Options{Addr: n.Addr})
		t.Cleanup(func() { c.Close() })
		id, err := c.ClusterMyID(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		node := clusterNode{id: id, addr: n.Addr, client: c}
		keys, err := c.Keys(ctx, prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 1 {
			key, from = keys[0], node
		} else {
			others = append(others, node)
		}
	}
	if key == "" || len(others) == 0 {
		t.Fatalf("no master holds exactly the one key under %q", prefix)
	}
	return key, from, others[0]
}

// migrateSlot moves key's slot from one master to another, the way
// redis-cli --cluster reshard does: mark it importing and migrating,
// MIGRATE its keys, then assign it on every master.
func migrateSlot(t *testing.T, key string, from, to clusterNode) {
	t.Helper()
	ctx := context.Background()
	slot, err := from.client.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	must := func(what string, err error) {
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("SETSLOT IMPORTING", to.client.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", from.id).Err())
	must("SETSLOT MIGRATING", from.client.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", to.id).Err())
	host, port, _ := strings.Cut(to.addr, ":")
	for {
		keys, err := from.client.ClusterGetKeysInSlot(ctx, int(slot), 100).Result()
		must("GETKEYSINSLOT", err)
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		must("MIGRATE", from.client.Do(ctx, args...).Err())
	}
	must("SETSLOT NODE (target)", to.client.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", to.id).Err())
	must("SETSLOT NODE (source)", from.client.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", to.id).Err())
}

// TestOneRoundTripPerRequest counts on the Redis server what requests of
// three descriptors (four limits: the api rule has two) cost: one EVALSHA
// each. With the local over-limit cache on, a descriptor refused until a
// known instant costs nothing more until then.
func TestOneRoundTripPerRequest(t *testing.T) {
	srv := redistest.Start(t)
	admin := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer admin.Close()
	rules := writeExactRules(t)
	s := startServer(t, redisArgs(t, srv.URL, "standalone", "-config", "../examples", "-local-cache-keys", "1000")...)
	c := rlsv3.NewRateLimitServiceClient(s.dial(t))

	three := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user_id", Value: "alice"}}},
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user_id", Value: "bob"}}},
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user_id", Value: "carol"}}},
	}}
	if err := admin.ConfigResetStat(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if resp := decide(t, c, three); len(resp.Statuses) != 3 {
			t.Fatalf("answer %v", resp)
		}
	}
	if n := redistest.CommandCalls(t, admin, "fcall"); n != 5 {
		t.Errorf("5 requests of 3 descriptors cost %d FCALL, want 5", n)
	}

	// The local cache: once refused, a token bucket key of N per hour is
	// answered locally until a token is back (36 s away).
	s2 := startServer(t, redisArgs(t, srv.URL, "standalone", "-config", rules, "-local-cache-keys", "1000")...)
	c2 := rlsv3.NewRateLimitServiceClient(s2.dial(t))
	req := descriptorRequest("exact", "algorithm", "token_bucket")
	if n := consumeUntilOver(t, c2, req); n != exactLimit {
		t.Fatalf("admitted %d, want %d", n, exactLimit)
	}
	before := redistest.CommandCalls(t, admin, "fcall")
	for range 50 {
		resp := decide(t, c2, req)
		if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].CurrentLimit.GetName() != "token_bucket" {
			t.Fatalf("a refused key answered %v", resp)
		}
	}
	if n := redistest.CommandCalls(t, admin, "fcall") - before; n != 0 {
		t.Errorf("50 refusals of a cached over-limit key cost %d FCALL, want 0", n)
	}
	metrics := httpGet(t, "http://"+s2.httpAddr+"/metrics")
	for _, want := range []string{"ratelimitd_local_cache_hits_total 50\n", "ratelimitd_local_cache_keys 1\n"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, metrics)
		}
	}
}

// httpGet returns the body of a 200 answer to GET url.
func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(body)
}
