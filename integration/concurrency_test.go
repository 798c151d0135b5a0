package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

// The concurrency rules of domain "slots": (pool, shared) for the replicas
// test, (pool, crash) for the crash test, a short TTL so the test can wait
// it out.
const (
	sharedMax = 10
	sharedTTL = 30 * time.Second
	crashMax  = 5
	crashTTL  = 3 * time.Second
)

// writeSlotRules writes domain "slots" with the concurrency limits above.
func writeSlotRules(t *testing.T) string {
	t.Helper()
	rules := fmt.Sprintf(`domain: slots
descriptors:
  - key: pool
    value: shared
    concurrency: {max_in_flight: %d, lease_ttl: %s}
  - key: pool
    value: crash
    concurrency: {max_in_flight: %d, lease_ttl: %s}
`, sharedMax, sharedTTL, crashMax, crashTTL)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "slots.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// poolAcquire asks for a slot of (pool, value) in domain slots.
func poolAcquire(value string) *ratelimitdv1.AcquireRequest {
	return &ratelimitdv1.AcquireRequest{Domain: "slots", Descriptors: []*ratelimitdv1.Descriptor{
		{Entries: []*ratelimitdv1.Entry{{Key: "pool", Value: value}}},
	}}
}

// prefixOf returns the -redis-prefix of a server's arguments.
func prefixOf(t *testing.T, args []string) string {
	t.Helper()
	i := slices.Index(args, "-redis-prefix")
	if i < 0 || i+1 >= len(args) {
		t.Fatalf("no -redis-prefix in %q", args)
	}
	return args[i+1]
}

// keysUnder lists the keys under prefix on every master of admin.
func keysUnder(t *testing.T, admin goredis.UniversalClient, prefix string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var mu sync.Mutex
	var keys []string
	scan := func(ctx context.Context, c *goredis.Client) error {
		found, err := c.Keys(ctx, prefix+"*").Result()
		mu.Lock()
		keys = append(keys, found...)
		mu.Unlock()
		return err
	}
	var err error
	switch c := admin.(type) {
	case *goredis.ClusterClient:
		err = c.ForEachMaster(ctx, scan)
	case *goredis.Client:
		err = scan(ctx, c)
	default:
		t.Fatalf("keysUnder: a %T", admin)
	}
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// slotsMetric sums ratelimitd_concurrency_slots_total of rule and event
// over servers.
func slotsMetric(t *testing.T, servers []*server, rule, event string) (n float64) {
	t.Helper()
	for _, s := range servers {
		n += metric(t, s, fmt.Sprintf(`ratelimitd_concurrency_slots_total{domain="slots",event=%q,rule=%q}`, event, rule))
	}
	return n
}

// TestConcurrencyAcrossReplicas starts three ratelimitd processes on one
// Redis (standalone, a 3-master Cluster, Sentinel) and has 100 workers
// take and give back slots of one concurrency limit of max_in_flight 10
// through all three: Acquire via a random replica, hold 0–20 ms, Release
// via another; on a refusal back off (retry_after, capped at a few ms,
// with jitter) and try again.
//
// Safety. The workers keep a count of the slots they hold, raised only
// after an Acquire has answered allowed and lowered before its Release is
// sent. A counted slot is therefore in Redis (added by the Acquire's
// script, not yet removed by the Release's, and not ended: every hold
// lasts far less than the 30 s TTL, which the test checks), so the count
// is never above the true holders, and the count above max_in_flight
// would be a real violation, never a measurement artefact. It is checked
// at every raise and by a sampler every millisecond. The sampler also
// reads the sorted set itself (ZCARD, which counts ended members too, of
// which there are none) and its PTTL (set, and at most two lease TTLs: the
// key outlives its last slot by one); and every Acquire's own in_flight
// must be at most max_in_flight, exactly max_in_flight when refused. The
// standalone and Sentinel replicas coalesce calls into batches (the
// default -redis-coalesce); on Cluster each call is its own.
//
// Liveness. Every worker completes its rounds within a time bound. At the
// end no slot is held (one Acquire sees in_flight 1), the last Release
// deletes the key, and no key of the test is left without a TTL. The
// replicas' metrics count what the workers saw.
func TestConcurrencyAcrossReplicas(t *testing.T) {
	rules := writeSlotRules(t)
	topologies := []struct {
		name  string
		start func(t *testing.T) (url string, admin goredis.UniversalClient, extra []string)
	}{
		{"standalone", func(t *testing.T) (string, goredis.UniversalClient, []string) {
			s := redistest.Start(t)
			return s.URL, goredis.NewClient(&goredis.Options{Addr: s.Addr}), nil
		}},
		{"cluster", func(t *testing.T) (string, goredis.UniversalClient, []string) {
			c := redistest.StartCluster(t, 3)
			return c.URL, goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: c.Seeds}), nil
		}},
		{"sentinel", func(t *testing.T) (string, goredis.UniversalClient, []string) {
			s := redistest.StartSentinel(t, 1, 1)
			return s.URL, goredis.NewClient(&goredis.Options{Addr: s.Master.Addr}), []string{"-redis-master", s.MasterName}
		}},
	}
	for _, topo := range topologies {
		t.Run(topo.name, func(t *testing.T) {
			url, admin, extra := topo.start(t)
			defer admin.Close()
			// A slow answer on a loaded machine is no failure here: these
			// tests are about what is admitted, not how fast.
			args := append(redisArgs(t, url, topo.name, "-config", rules), extra...)
			servers := make([]*server, 3)
			clients := make([]ratelimitdv1.RateLimiterClient, 3)
			for i := range servers {
				servers[i] = startServer(t, args...)
				clients[i] = ratelimitdv1.NewRateLimiterClient(servers[i].dial(t))
			}
			slotsAcrossReplicas(t, servers, clients, admin, prefixOf(t, args))
		})
	}
}

// The load of TestConcurrencyAcrossReplicas.
const (
	slotWorkers = 100
	slotRounds  = 10 // acquire–hold–release rounds of each worker
	maxHold     = 20 * time.Millisecond
	// slotBound bounds a topology's run; well under sharedTTL, so no
	// slot can end by its TTL while the test runs.
	slotBound = 20 * time.Second
	// maxBackoff caps a refused worker's sleep: retry_after is the time
	// until the oldest slot's TTL ends, far longer than a release takes.
	maxBackoff = 8 * time.Millisecond
)

func slotsAcrossReplicas(t *testing.T, servers []*server, clients []ratelimitdv1.RateLimiterClient, admin goredis.UniversalClient, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), slotBound+10*time.Second)
	defer cancel()
	req := poolAcquire("shared")

	// The key: the first Acquire creates it, its Release deletes it.
	first, err := clients[0].Acquire(ctx, req)
	if err != nil || !first.Allowed || first.LeaseId == "" || first.Results[0].GetConcurrency().GetInFlight() != 1 {
		t.Fatalf("first Acquire: %v, %v", first, err)
	}
	rule := first.Results[0].Rule
	keys := keysUnder(t, admin, prefix)
	if len(keys) != 1 {
		t.Fatalf("keys under %q after one Acquire: %q, want one", prefix, keys)
	}
	key := keys[0]
	if rel, err := clients[1].Release(ctx, &ratelimitdv1.ReleaseRequest{LeaseId: first.LeaseId}); err != nil || !rel.Released {
		t.Fatalf("first Release: %v, %v", rel, err)
	}

	var (
		held, peak          atomic.Int64 // slots counted held, and the most ever
		acquired, refused   atomic.Int64
		released            atomic.Int64
		samples, keySamples atomic.Int64
		longestHold         atomic.Int64 // ns, from the allowed answer to the Release sent
		mu                  sync.Mutex
		problems            []string
		rounds              [slotWorkers]int
		attempts            [slotWorkers]int
	)
	problem := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	raise := func() {
		n := held.Add(1)
		storeMax(&peak, n)
		if n > sharedMax {
			problem("%d slots counted held, more than max_in_flight %d", n, sharedMax)
		}
	}

	// The samplers: the workers' count, and the sorted set in Redis.
	stop := make(chan struct{})
	var samplers sync.WaitGroup
	samplers.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			samples.Add(1)
			if n := held.Load(); n > sharedMax {
				problem("sampled %d slots held, more than max_in_flight %d", n, sharedMax)
			}
		}
	})
	samplers.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			var card *goredis.IntCmd
			var pttl *goredis.DurationCmd
			_, err := admin.TxPipelined(ctx, func(p goredis.Pipeliner) error {
				card, pttl = p.ZCard(ctx, key), p.PTTL(ctx, key)
				return nil
			})
			if err != nil {
				if ctx.Err() == nil {
					problem("sampling the key: %v", err)
				}
				return
			}
			keySamples.Add(1)
			// PTTL: -2 ns when the key is gone, -1 ns when it has no TTL.
			// The key outlives its last slot's end by a lease TTL, so that
			// a later call finds holders that never released.
			if n, d := card.Val(), pttl.Val(); n > sharedMax || (n > 0 && (d <= 0 || d > 2*sharedTTL+time.Millisecond)) {
				problem("the sorted set holds %d members with a TTL of %v; want at most %d members, and a TTL of at most 2×%v", n, d, sharedMax, sharedTTL)
			}
		}
	})

	start := time.Now()
	deadline := start.Add(slotBound)
	var wg sync.WaitGroup
	for w := range slotWorkers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			refusedInARow := 0
			for rounds[w] < slotRounds && time.Now().Before(deadline) {
				attempts[w]++
				i := rng.IntN(len(clients))
				resp, err := clients[i].Acquire(ctx, req)
				if err != nil {
					problem("worker %d: Acquire: %v", w, err)
					return
				}
				if len(resp.Results) != 1 || resp.Results[0].Concurrency == nil {
					problem("worker %d: Acquire answered %v, without the slots' state", w, resp)
					return
				}
				c := resp.Results[0].Concurrency
				if c.InFlight > sharedMax || c.MaxInFlight != sharedMax || c.LeaseTtl.AsDuration() != sharedTTL {
					problem("worker %d: Acquire answered %v: more in flight than max_in_flight, or not the rule's limit", w, c)
				}
				if !resp.Allowed {
					refused.Add(1)
					if c.InFlight != sharedMax || resp.LeaseId != "" {
						problem("worker %d: refused with in_flight %d of %d and lease id %q: a refusal must find every slot held, and give no lease", w, c.InFlight, sharedMax, resp.LeaseId)
					}
					// Full jitter up to retry_after, capped, growing with
					// the refusals in a row.
					refusedInARow++
					wait := min(resp.Results[0].RetryAfter.AsDuration(), maxBackoff, time.Millisecond<<min(refusedInARow, 10))
					time.Sleep(time.Duration(rng.Int64N(int64(wait) + 1)))
					continue
				}
				refusedInARow = 0
				got := time.Now()
				acquired.Add(1)
				raise()
				if resp.LeaseId == "" || resp.Ttl.AsDuration() != sharedTTL || c.InFlight < 1 {
					problem("worker %d: admitted with lease id %q, ttl %v, in_flight %d", w, resp.LeaseId, resp.Ttl.AsDuration(), c.InFlight)
				}
				time.Sleep(time.Duration(rng.Int64N(int64(maxHold) + 1)))
				held.Add(-1) // before the Release is sent: the count stays at most the holders
				storeMax(&longestHold, int64(time.Since(got)))
				j := (i + 1 + rng.IntN(len(clients)-1)) % len(clients) // another replica
				rel, err := clients[j].Release(ctx, &ratelimitdv1.ReleaseRequest{LeaseId: resp.LeaseId})
				if err != nil {
					problem("worker %d: Release: %v", w, err)
					return
				}
				if !rel.Released {
					problem("worker %d: Release of a slot held %v answered released false", w, time.Since(got))
				}
				released.Add(1)
				rounds[w]++
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(stop)
	samplers.Wait()

	for _, p := range problems {
		t.Error(p)
	}
	starved := 0
	for w := range slotWorkers {
		if rounds[w] < slotRounds {
			starved++
			if starved <= 5 {
				t.Errorf("worker %d completed %d of %d rounds in %v (%d attempts)", w, rounds[w], slotRounds, slotBound, attempts[w])
			}
		}
	}
	if starved > 0 {
		t.Errorf("%d of %d workers did not complete their rounds within %v", starved, slotWorkers, slotBound)
	}
	if p := peak.Load(); p < 2 {
		t.Errorf("at most %d slot counted held at once: the load did not overlap", p)
	}
	if samples.Load() == 0 || keySamples.Load() == 0 {
		t.Errorf("%d samples of the count, %d of the key: the samplers did not run", samples.Load(), keySamples.Load())
	}
	if h := time.Duration(longestHold.Load()); h >= sharedTTL/2 {
		t.Errorf("a slot was held %v, too close to the TTL of %v for the count to be a lower bound", h, sharedTTL)
	}
	t.Logf("%d pairs in %v (%.0f/s); %d refusals; most slots counted held at once %d of %d; %d samples of the count, %d of the key; longest hold %v",
		acquired.Load(), elapsed.Round(time.Millisecond), float64(acquired.Load())/elapsed.Seconds(), refused.Load(), peak.Load(), sharedMax,
		samples.Load(), keySamples.Load(), time.Duration(longestHold.Load()).Round(time.Millisecond))

	// Nothing held: an Acquire sees its own slot alone; its Release, the
	// last, deletes the key.
	last, err := clients[2].Acquire(ctx, req)
	if err != nil || !last.Allowed || last.Results[0].GetConcurrency().GetInFlight() != 1 {
		t.Errorf("Acquire after the workers: %v, %v; want allowed with in_flight 1", last, err)
	}
	if rel, err := clients[0].Release(ctx, &ratelimitdv1.ReleaseRequest{LeaseId: last.GetLeaseId()}); err != nil || !rel.Released {
		t.Errorf("its Release: %v, %v", rel, err)
	}
	if n, err := admin.Exists(ctx, key).Result(); err != nil || n != 0 {
		t.Errorf("the key %s after the last Release: exists %d, %v; want gone", key, n, err)
	}
	for _, k := range keysUnder(t, admin, prefix) {
		if d, err := admin.PTTL(ctx, k).Result(); err != nil || d == -1 {
			t.Errorf("key %s is left without a TTL (%v, %v)", k, d, err)
		}
	}

	// The replicas' metrics count what the workers saw: the first and
	// last pairs too. Each replica's gauge is what the latest call it
	// served found: never above the limit.
	for i, s := range servers {
		if got := metric(t, s, fmt.Sprintf(`ratelimitd_concurrency_in_flight{domain="slots",rule=%q}`, rule)); got > sharedMax {
			t.Errorf("replica %d's gauge of slots in flight: %v, more than max_in_flight %d", i, got, sharedMax)
		}
	}
	for event, want := range map[string]int64{
		"acquired": acquired.Load() + 2,
		"refused":  refused.Load(),
		"released": released.Load() + 2,
		"expired":  0,
	} {
		if got := slotsMetric(t, servers, rule, event); got != float64(want) {
			t.Errorf("ratelimitd_concurrency_slots_total{event=%q} summed over the replicas: %v, want %d", event, got, want)
		}
	}
}

// storeMax raises a to v when v is more.
func storeMax(a *atomic.Int64, v int64) {
	for old := a.Load(); v > old && !a.CompareAndSwap(old, v); old = a.Load() {
	}
}

// TestSlotsOfACrashedHolder fills every slot of a limit (max_in_flight 5,
// lease_ttl 3 s) through replica A, then SIGKILLs A and drops the lease
// ids: the holder that crashed is the client, which never releases, and
// the replica that served it is gone too. Through replica B, Acquire is
// refused until the TTL has passed since the first slot was taken, no
// sooner, and admitted within a margin after; then all 5 slots come back,
// and the crashed holder's lease frees and keeps nothing. B's metrics
// count the refusals, and the 5 slots as expired.
func TestSlotsOfACrashedHolder(t *testing.T) {
	rules := writeSlotRules(t)
	redis := redistest.Start(t)
	args := redisArgs(t, redis.URL, "standalone", "-config", rules)
	a, b := startServer(t, args...), startServer(t, args...)
	connA, connB := a.dial(t), b.dial(t)
	viaA, viaB := ratelimitdv1.NewRateLimiterClient(connA), ratelimitdv1.NewRateLimiterClient(connB)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req := poolAcquire("crash")
	// Connected before the clock starts: the first Acquire's bracket is
	// its round trip alone.
	for _, conn := range []*grpc.ClientConn{connA, connB} {
		if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}

	// firstStart and firstEnd bracket the instant the first slot was
	// taken, by the Redis clock (same host): its TTL ends between
	// firstStart+TTL and firstEnd+TTL, the others' later.
	var firstStart, firstEnd, lastEnd time.Time
	var rule, stale string
	for i := range crashMax {
		sent := time.Now()
		resp, err := viaA.Acquire(ctx, req)
		if err != nil || !resp.Allowed || resp.LeaseId == "" {
			t.Fatalf("Acquire %d via A: %v, %v", i+1, resp, err)
		}
		if got := resp.Results[0].GetConcurrency().GetInFlight(); got != uint64(i+1) {
			t.Fatalf("Acquire %d via A: in_flight %d, want %d", i+1, got, i+1)
		}
		if i == 0 {
			firstStart, firstEnd, rule = sent, time.Now(), resp.Results[0].Rule
		}
		lastEnd = time.Now()
		// The lease id is dropped: never released, never renewed. The
		// last is kept to show, once its TTL has ended, that it frees
		// nothing.
		stale = resp.LeaseId
	}
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.exited
	expiredBefore := metric(t, b, fmt.Sprintf(`ratelimitd_concurrency_slots_total{domain="slots",event="expired",rule=%q}`, rule))

	// Poll via B. A poll answered before firstStart+TTL ran its script
	// before any slot could end: it must be refused. clockSlack allows for
	// the Redis clock (wall time) and Go's monotonic clock drifting apart
	// over the few seconds.
	const (
		pollEvery  = 50 * time.Millisecond
		clockSlack = 20 * time.Millisecond
		admitBy    = 2 * time.Second // after firstEnd+TTL, on a loaded machine
	)
	noSooner := firstStart.Add(crashTTL - clockSlack)
	var refusedPolls, refusedLate int
	var lastRefusal time.Time
	var admitted *ratelimitdv1.AcquireResponse
	for admitted == nil {
		sent := time.Now()
		if sent.After(firstEnd.Add(crashTTL + admitBy)) {
			t.Fatalf("still refused %v after the TTL of the first slot had ended (%d polls refused)", time.Since(firstEnd.Add(crashTTL)), refusedPolls)
		}
		resp, err := viaB.Acquire(ctx, req)
		answered := time.Now()
		if err != nil {
			t.Fatalf("Acquire via B: %v", err)
		}
		switch {
		case resp.Allowed:
			admitted = resp
			if answered.Before(noSooner) {
				t.Errorf("admitted %v after the first slot was taken, sooner than its TTL of %v", answered.Sub(firstStart), crashTTL)
			}
			t.Logf("admitted: sent %v and answered %v after the first slot was taken (TTL %v); the last of %d refusals answered at %v",
				sent.Sub(firstStart).Round(time.Millisecond), answered.Sub(firstStart).Round(time.Millisecond), crashTTL,
				refusedPolls, lastRefusal.Sub(firstStart).Round(time.Millisecond))
		default:
			refusedPolls++
			lastRefusal = answered
			if sent.After(firstEnd.Add(crashTTL + clockSlack)) {
				refusedLate++
			}
			if c := resp.Results[0].GetConcurrency(); c.GetInFlight() != crashMax {
				t.Errorf("refused with in_flight %d, want %d", c.GetInFlight(), crashMax)
			}
			// retry_after is the time until the first slot's TTL ends,
			// should no holder release sooner: it was computed between
			// sent and answered.
			retry := resp.Results[0].GetRetryAfter().AsDuration()
			if at := sent.Add(retry); at.Before(firstStart.Add(crashTTL-clockSlack)) || answered.Add(retry).After(firstEnd.Add(crashTTL+clockSlack)) {
				t.Errorf("refused %v after the first slot was taken with retry_after %v: want the time until its TTL ends, %v to %v after it was taken",
					sent.Sub(firstStart), retry, crashTTL, firstEnd.Sub(firstStart)+crashTTL)
			}
			time.Sleep(pollEvery)
		}
	}
	if lastRefusal.Before(noSooner.Add(-300 * time.Millisecond)) {
		t.Errorf("the last refusal was answered %v after the first slot was taken: polling stopped well before its TTL of %v", lastRefusal.Sub(firstStart), crashTTL)
	}
	if refusedLate > 0 {
		t.Errorf("%d polls sent after the first slot's TTL had ended were refused", refusedLate)
	}

	// Once every TTL has ended, all 5 slots are back: B takes 4 more, and
	// no sixth.
	time.Sleep(time.Until(lastEnd.Add(crashTTL + 100*time.Millisecond)))
	leases := []string{admitted.LeaseId}
	for i := 1; i < crashMax; i++ {
		resp, err := viaB.Acquire(ctx, req)
		if err != nil || !resp.Allowed {
			t.Fatalf("Acquire %d via B after the TTL: %v, %v; want every slot back", i+1, resp, err)
		}
		if got := resp.Results[0].GetConcurrency().GetInFlight(); got != uint64(i+1) {
			t.Errorf("Acquire %d via B after the TTL: in_flight %d, want %d: the crashed holder's slots still count", i+1, got, i+1)
		}
		leases = append(leases, resp.LeaseId)
	}
	// The crashed holder's lease is lost: releasing or renewing it now
	// frees nothing and keeps nothing.
	if rel, err := viaB.Release(ctx, &ratelimitdv1.ReleaseRequest{LeaseId: stale}); err != nil || rel.Released {
		t.Errorf("Release of the crashed holder's lease after its TTL: %v, %v; want released false", rel, err)
	}
	if ren, err := viaB.Renew(ctx, &ratelimitdv1.RenewRequest{LeaseId: stale}); err != nil || ren.Renewed {
		t.Errorf("Renew of the crashed holder's lease after its TTL: %v, %v; want renewed false", ren, err)
	}
	if resp, err := viaB.Acquire(ctx, req); err != nil || resp.Allowed {
		t.Errorf("a sixth Acquire via B: %v, %v; want refused", resp, err)
	}
	for _, id := range leases {
		if rel, err := viaB.Release(ctx, &ratelimitdv1.ReleaseRequest{LeaseId: id}); err != nil || !rel.Released {
			t.Errorf("Release via B: %v, %v", rel, err)
		}
	}

	// B's metrics: every refusal it gave, and the crashed holder's 5
	// slots as expired (holders whose TTL ended without a release).
	single := []*server{b}
	if got := slotsMetric(t, single, rule, "refused"); got != float64(refusedPolls+1) {
		t.Errorf("B counts %v refusals, want %d", got, refusedPolls+1)
	}
	if got := metric(t, b, fmt.Sprintf(`ratelimitd_concurrency_in_flight{domain="slots",rule=%q}`, rule)); got != 0 {
		t.Errorf("B's gauge of slots in flight after every slot was released: %v, want 0", got)
	}
	for _, event := range []string{"acquired", "released"} {
		if got := slotsMetric(t, single, rule, event); got != crashMax {
			t.Errorf("B counts %v %s, want %d", got, event, crashMax)
		}
	}
	if got := slotsMetric(t, single, rule, "expired") - expiredBefore; got != crashMax {
		t.Errorf("B counts %v slots expired without release, want the crashed holder's %d", got, crashMax)
	}
	if logs := strings.Join(b.logLines(), "\n"); strings.Contains(logs, `"level":"ERROR"`) {
		t.Errorf("B logged errors:\n%s", logs)
	}
}
