package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
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

// Settings of TestClusterPrimaryLost.
const (
	// failoverLimit is N of the exact and leased rules, per hour and key:
	// not reached during the load, so that the decisions made around the
	// kill are admissions, whose loss a replication tail could show.
	failoverLimit = 200
	// failoverKeys is the number of keys of each kind, spread over the
	// three primaries by their hash tags.
	failoverKeys = 24
	// recoveryBound is how soon after the replica's promotion the lost
	// primary's keys must be decided by Redis again. Derived in the test's
	// comment; the issue asks for about 2 s.
	recoveryBound = 2 * time.Second
	// tailWindow is how long before the kill a decision must have been
	// answered for its write to be at risk; see the test's comment.
	tailWindow = 100 * time.Millisecond
	// leaseShare is -lease-share of the servers: a lease is at most
	// 1/leaseShare of what a limit has left.
	leaseShare = 8
)

// writeFailoverRules writes domain "failover": (user, *) and (pair, *)
// exact, (leased, *) leased, each failoverLimit per hour; (team, *) a
// million per hour, for requests of two descriptors.
func writeFailoverRules(t *testing.T) string {
	t.Helper()
	rules := fmt.Sprintf(`domain: failover
descriptors:
  - key: user
    rate_limit: {requests_per_unit: %d, unit: hour}
  - key: leased
    rate_limit: {requests_per_unit: %d, unit: hour, consistency: leased}
  - key: team
    rate_limit: {requests_per_unit: 1000000, unit: hour}
`, failoverLimit, failoverLimit)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "failover.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// failoverCall is one call of the load: which request, when, and what
// it was answered.
type failoverCall struct {
	kind       string // user, leased or pair
	i          int    // key (user, leased) or pair index
	start, end time.Time
	failed     bool
	byMode     bool   // decided by the failure mode (open: OK, 0 remaining, no reset)
	admitted   bool   // OK and decided by Redis (or a lease)
	remaining  uint32 // of the first status
}

// byFailureMode reports whether every status of resp is what failure mode
// open answers: OK with nothing remaining and no reset, figures a
// decision by Redis (or from a lease) never gives for a limit of an hour
// whose key was counted.
func byFailureMode(resp *rlsv3.RateLimitResponse) bool {
	for _, s := range resp.Statuses {
		if s.Code != rlsv3.RateLimitResponse_OK || s.LimitRemaining != 0 || s.DurationUntilReset.AsDuration() != 0 {
			return false
		}
	}
	return true
}

// TestClusterPrimaryLost SIGKILLs one primary of a Redis Cluster (3
// primaries, 3 replicas, cluster-require-full-coverage no) under load from
// two ratelimitd replicas in failure mode open, and checks what issue 25
// asks:
//
//   - no call fails;
//   - every decision of a key on another primary is Redis's (or a lease's),
//     before, during and after the failover: exact keys, leased keys, and
//     requests of two descriptors both on other primaries;
//   - the lost primary's keys are decided by Redis again within
//     recoveryBound of the replica's promotion. The bound: after the
//     promotion, the next call for such a key that the open circuit of
//     the dead primary refuses asks go-redis for a slot map reload;
//     reloads run back to back at most 200 ms apart, each one CLUSTER
//     SLOTS to a node (after a refused dial, at once on loopback, when it
//     picks the dead one), and the promoted replica tells the other nodes
//     of its new epoch at once. So the map is right within about 0.5 s of
//     the promotion on each replica of ratelimitd, and the next call goes
//     to the new primary, whose circuit is closed. 2 s leaves room for a
//     loaded 2-core machine;
//   - nothing is admitted over the limit beyond what the lost primary's
//     replication tail explains. An exact key's admissions each leave a
//     distinct remaining count while no write is lost; a write the
//     replica never received makes the promoted replica count from less,
//     and the counts it then gives repeat ones given before. So the
//     repeats of a key are its over-admission. Redis sends a write's
//     reply and its replication stream in the same pass of its event
//     loop, and on loopback a sent byte is in the peer's receive buffer,
//     which a SIGKILL of the sender does not empty: only writes answered
//     within the last moments before the kill can be lost. The test
//     bounds a key's repeats by its admissions answered within tailWindow
//     (100 ms) before the kill, and keys on other primaries by N exactly.
//     A leased key's over-admission is bounded by the leases the lost
//     writes can have held: two per replica, each at most N/leaseShare.
func TestClusterPrimaryLost(t *testing.T) {
	cl := redistest.StartClusterWith(t, redistest.ClusterOptions{Masters: 3, Replicas: 1,
		Args: []string{"--cluster-require-full-coverage", "no"}})
	rules := writeFailoverRules(t)
	prefix := fmt.Sprintf("failover:%d:", time.Now().UnixNano())
	args := []string{"-backend", "redis", "-redis-url", cl.URL, "-redis-mode", "cluster", "-redis-prefix", prefix,
		"-config", rules, "-failure-mode", "open", "-lease-share", fmt.Sprint(leaseShare),
		// A slow answer on a loaded machine is no failure here: this test
		// is about which keys the lost primary takes down, not latency.
		"-backend-timeout", "1s", "-redis-read-timeout", "1s", "-redis-write-timeout", "1s"}
	servers := []*server{startServer(t, args...), startServer(t, args...)}
	clients := make([]rlsv3.RateLimitServiceClient, len(servers))
	for i, s := range servers {
		clients[i] = rlsv3.NewRateLimitServiceClient(s.dial(t))
	}
	admin := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Seeds})
	defer admin.Close()
	redistest.AwayFromHourEnd(t, admin, time.Minute)

	// Every key is decided once, then found on its primary.
	users, leased, teams := make([]string, failoverKeys), make([]string, failoverKeys), make([]string, failoverKeys)
	for i := range failoverKeys {
		users[i], leased[i], teams[i] = fmt.Sprintf("u%d", i), fmt.Sprintf("l%d", i), fmt.Sprintf("t%d", i)
		for _, r := range []*rlsv3.RateLimitRequest{
			descriptorRequest("failover", "user", users[i]),
			descriptorRequest("failover", "leased", leased[i]),
			descriptorRequest("failover", "team", teams[i]),
		} {
			if resp := decide(t, clients[0], r); resp.OverallCode != rlsv3.RateLimitResponse_OK || byFailureMode(resp) {
				t.Fatalf("first decision of %v: %v", r.Descriptors, resp)
			}
		}
	}
	const dead = 0 // the primary to kill: cl.Nodes[dead]
	onDead := map[string]bool{}
	found := 0
	for m, n := range cl.Nodes {
		c := goredis.NewClient(&goredis.Options{Addr: n.Addr})
		keys, err := c.Keys(context.Background(), prefix+"*").Result()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			for _, v := range [][]string{users, leased, teams} {
				for _, val := range v {
					if strings.Contains(k, fmt.Sprintf("%d:%s}", len(val), val)) {
						found++
						if m == dead {
							onDead[val] = true
						}
					}
				}
			}
		}
	}
	if found != 3*failoverKeys {
		t.Fatalf("found %d keys on the primaries, want %d", found, 3*failoverKeys)
	}
	count := func(vals []string) (n int) {
		for _, v := range vals {
			if onDead[v] {
				n++
			}
		}
		return n
	}
	for _, vals := range [][]string{users, leased, teams} {
		if n := count(vals); n == 0 || n == len(vals) {
			t.Fatalf("%d of %v are on the primary to kill: want some on it and some elsewhere", n, vals)
		}
	}
	// Pairs of team descriptors: mixed ones with one on the lost primary,
	// healthy ones with neither.
	type pair struct {
		a, b  string
		mixed bool
	}
	var pairs []pair
	for i := 0; i+1 < failoverKeys; i += 2 {
		a, b := teams[i], teams[i+1]
		pairs = append(pairs, pair{a, b, onDead[a] || onDead[b]})
	}
	pairRequest := func(p pair) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "failover", Descriptors: []*rlv3.RateLimitDescriptor{
			{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "team", Value: p.a}}},
			{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "team", Value: p.b}}},
		}}
	}

	// The load: 6 callers, each calling a random request through a random
	// server, 3 ms apart.
	var mu sync.Mutex
	var calls []failoverCall
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var sent atomic.Int64
	for c := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 25))
			for {
				select {
				case <-stop:
					return
				default:
				}
				var fc failoverCall
				var req *rlsv3.RateLimitRequest
				switch k := rng.IntN(3); k {
				case 0:
					fc.kind, fc.i = "user", rng.IntN(failoverKeys)
					req = descriptorRequest("failover", "user", users[fc.i])
				case 1:
					fc.kind, fc.i = "leased", rng.IntN(failoverKeys)
					req = descriptorRequest("failover", "leased", leased[fc.i])
				default:
					fc.kind, fc.i = "pair", rng.IntN(len(pairs))
					req = pairRequest(pairs[fc.i])
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				fc.start = time.Now()
				resp, err := clients[rng.IntN(len(clients))].ShouldRateLimit(ctx, req)
				fc.end = time.Now()
				cancel()
				sent.Add(1)
				if err != nil {
					fc.failed = true
				} else {
					fc.byMode = byFailureMode(resp)
					fc.admitted = !fc.byMode && resp.OverallCode == rlsv3.RateLimitResponse_OK
					fc.remaining = resp.Statuses[0].LimitRemaining
				}
				mu.Lock()
				calls = append(calls, fc)
				mu.Unlock()
				time.Sleep(3 * time.Millisecond)
			}
		}()
	}
	time.Sleep(2 * time.Second)
	deadAddr := cl.Nodes[dead].Addr
	cl.Nodes[dead].Kill(t)
	killed := time.Now()
	promoted, at := cl.WaitForPromotion(t, dead, 30*time.Second)
	time.Sleep(recoveryBound + 2*time.Second)
	close(stop)
	wg.Wait()
	t.Logf("primary %s killed; replica %s promoted %v later; %d calls", deadAddr, promoted.Addr, at.Sub(killed).Round(time.Millisecond), sent.Load())

	deadKey := func(fc failoverCall) bool {
		switch fc.kind {
		case "user":
			return onDead[users[fc.i]]
		case "leased":
			return onDead[leased[fc.i]]
		}
		return pairs[fc.i].mixed
	}
	failed, healthyByMode, deadByMode, mixedByMode := 0, 0, 0, 0
	var lastDeadByMode, firstDeadByMode time.Time
	for _, fc := range calls {
		switch {
		case fc.failed:
			failed++
		case !fc.byMode:
		case deadKey(fc):
			deadByMode++
			if fc.kind == "pair" {
				mixedByMode++
			}
			if firstDeadByMode.IsZero() || fc.start.Before(firstDeadByMode) {
				firstDeadByMode = fc.start
			}
			if fc.end.After(lastDeadByMode) {
				lastDeadByMode = fc.end
			}
		default:
			healthyByMode++
			if healthyByMode <= 5 {
				t.Errorf("a %s call for a key on a live primary, %v after the kill, was decided by the failure mode", fc.kind, fc.start.Sub(killed).Round(time.Millisecond))
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d calls failed; in failure mode open none may", failed)
	}
	if healthyByMode > 0 {
		t.Errorf("%d calls for keys on live primaries were decided by the failure mode, want 0", healthyByMode)
	}
	if deadByMode == 0 {
		t.Fatalf("no call for the lost primary's keys was decided by the failure mode: was it killed?")
	}
	recovery := lastDeadByMode.Sub(at)
	t.Logf("lost primary's keys: %d calls decided by the failure mode (%d of them requests of two descriptors, one on a live primary), from %v to %v after the kill; decided by Redis again %v after the promotion",
		deadByMode, mixedByMode, firstDeadByMode.Sub(killed).Round(time.Millisecond), lastDeadByMode.Sub(killed).Round(time.Millisecond), recovery.Round(time.Millisecond))
	if recovery > recoveryBound {
		t.Errorf("the lost primary's keys were decided by the failure mode until %v after the promotion, want within %v", recovery.Round(time.Millisecond), recoveryBound)
	}

	// The logs and metrics name the lost primary (before the breakers
	// forget it, 10 s after the last call for it).
	opened := false
	for _, s := range servers {
		for _, line := range s.logLines() {
			if strings.Contains(line, "backend circuit of node "+deadAddr+" open") {
				opened = true
			}
		}
	}
	if !opened {
		t.Errorf("no server logged the circuit of node %s opening", deadAddr)
	}
	opens := 0.0
	for _, s := range servers {
		opens += metric(t, s, `ratelimitd_backend_node_circuit_opens_total{node="`+deadAddr+`"}`)
	}
	if opens == 0 {
		t.Errorf("ratelimitd_backend_node_circuit_opens_total{node=%q} is 0 on both servers", deadAddr)
	}

	// Exactness: consume every key to its limit through one server, then
	// count what Redis admitted in all.
	repeatsAll, tailAll := 0, 0
	for i, u := range users {
		// The first decision, before the load, admitted one.
		admitted, tail := 1, 0
		seen := map[uint32]int{failoverLimit - 1: 1}
		for _, fc := range calls {
			if fc.kind != "user" || fc.i != i || !fc.admitted {
				continue
			}
			admitted++
			seen[fc.remaining]++
			if fc.start.Before(killed) && fc.end.After(killed.Add(-tailWindow)) {
				tail++
			}
		}
		req := descriptorRequest("failover", "user", u)
		for {
			resp := decide(t, clients[0], req)
			if byFailureMode(resp) {
				t.Fatalf("user %s: decided by the failure mode after the failover", u)
			}
			if resp.OverallCode != rlsv3.RateLimitResponse_OK {
				break
			}
			admitted++
			seen[resp.Statuses[0].LimitRemaining]++
			if admitted > 2*failoverLimit {
				t.Fatalf("user %s: still admitted after %d", u, admitted)
			}
		}
		repeats := admitted - len(seen)
		repeatsAll += repeats
		if onDead[u] {
			tailAll += tail
		}
		switch {
		case !onDead[u] && admitted != failoverLimit:
			t.Errorf("user %s on a live primary: %d admitted in all, want exactly %d", u, admitted, failoverLimit)
		case onDead[u] && (admitted > failoverLimit+repeats || repeats > tail):
			t.Errorf("user %s on the lost primary: %d admitted, %d counts repeated; want at most %d + repeats, and repeats at most the %d admissions answered within %v before the kill",
				u, admitted, repeats, failoverLimit, tail, tailWindow)
		}
	}
	t.Logf("exact keys: %d admissions repeated a count (lost with the primary), of %d answered within %v before the kill on its keys", repeatsAll, tailAll, tailWindow)

	// Leased keys: what both servers admit, each to its refusal.
	leaseBound := 2 * len(servers) * ((failoverLimit + leaseShare - 1) / leaseShare)
	mostLeased := map[bool]int{}
	for i, l := range leased {
		admitted := 1 // before the load
		for _, fc := range calls {
			if fc.kind == "leased" && fc.i == i && fc.admitted {
				admitted++
			}
		}
		req := descriptorRequest("failover", "leased", l)
		for _, c := range clients {
			for {
				resp := decide(t, c, req)
				if byFailureMode(resp) {
					t.Fatalf("leased %s: decided by the failure mode after the failover", l)
				}
				if resp.OverallCode != rlsv3.RateLimitResponse_OK {
					break
				}
				if admitted++; admitted > 2*failoverLimit {
					t.Fatalf("leased %s: still admitted after %d", l, admitted)
				}
			}
		}
		most := failoverLimit
		if onDead[l] {
			most += leaseBound
		}
		mostLeased[onDead[l]] = max(mostLeased[onDead[l]], admitted)
		if admitted > most {
			t.Errorf("leased %s (on the lost primary: %v): %d admitted, want at most %d", l, onDead[l], admitted, most)
		}
	}

	t.Logf("leased keys: at most %d admitted on a live primary, %d on the lost one (bound %d + %d)", mostLeased[false], mostLeased[true], failoverLimit, leaseBound)
}
