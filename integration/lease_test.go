package integration

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
)

// leasedLimit is N of the leased rules: N per hour, large enough that
// leases of several hits are taken, small enough that 60 callers pass it
// within a second or two.
const leasedLimit = 3000

var leasedAlgorithms = []string{"fixed_window", "sliding_window_counter", "token_bucket", "gcra"}

// writeLeasedRules writes domain "leased": descriptor (algorithm, <name>),
// N per hour, consistency: leased, for each leasable algorithm; and
// domain "hot": (user, *) a million per hour, leased.
func writeLeasedRules(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("domain: leased\ndescriptors:\n")
	for _, a := range leasedAlgorithms {
		fmt.Fprintf(&b, "  - key: algorithm\n    value: %s\n    rate_limit: {requests_per_unit: %d, unit: hour, algorithm: %s, consistency: leased}\n", a, leasedLimit, a)
	}
	dir := t.TempDir()
	hot := "domain: hot\ndescriptors:\n  - key: user\n    rate_limit: {requests_per_unit: 1000000, unit: hour, consistency: leased}\n"
	for name, text := range map[string]string{"leased.yaml": b.String(), "hot.yaml": hot} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// metric returns the value of the sample of name (with its labels, as
// written, such as `x_total{path="local"}`) that server s exports.
func metric(t *testing.T, s *server, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + s.httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return f
		}
	}
	t.Fatalf("%s exports no %s", s.httpAddr, name)
	return 0
}

// TestLeasedAcrossReplicas starts three ratelimitd processes on one Redis
// (standalone, a 3-master Cluster, and Sentinel) and, for every leasable
// algorithm on each, has 60 concurrent callers send 2N requests for one
// descriptor of a leased rule through all three: at most N are admitted (a bucket may add what it refills
// meanwhile, as exact mode would), at least 98% of N are, and most
// decisions are made in process.
func TestLeasedAcrossReplicas(t *testing.T) {
	rules := writeLeasedRules(t)
	topologies := []struct {
		name       string
		mode       string
		algorithms []string
		start      func(t *testing.T) (url string, admin goredis.UniversalClient, extra []string)
	}{
		{"standalone", "standalone", leasedAlgorithms, func(t *testing.T) (string, goredis.UniversalClient, []string) {
			s := redistest.Start(t)
			return s.URL, goredis.NewClient(&goredis.Options{Addr: s.Addr}), nil
		}},
		{"cluster", "cluster", leasedAlgorithms, func(t *testing.T) (string, goredis.UniversalClient, []string) {
			c := redistest.StartCluster(t, 3)
			return c.URL, goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: c.Seeds}), nil
		}},
		{"sentinel", "sentinel", leasedAlgorithms, func(t *testing.T) (string, goredis.UniversalClient, []string) {
			s := redistest.StartSentinel(t, 1, 1)
			admin := goredis.NewClient(&goredis.Options{Addr: s.Master.Addr})
			return s.URL, admin, []string{"-redis-master", s.MasterName}
		}},
	}
	for _, topo := range topologies {
		t.Run(topo.name, func(t *testing.T) {
			url, admin, extra := topo.start(t)
			defer admin.Close()
			// A slow answer on a loaded machine is no failure here: these
			// tests are about what is admitted, not how fast.
			args := append(redisArgs(t, url, topo.mode, "-config", rules), extra...)
			servers := make([]*server, 3)
			clients := make([]rlsv3.RateLimitServiceClient, 3)
			for i := range servers {
				servers[i] = startServer(t, args...)
				clients[i] = rlsv3.NewRateLimitServiceClient(servers[i].dial(t))
			}
			for _, a := range topo.algorithms {
				t.Run(a, func(t *testing.T) {
					redistest.AwayFromHourEnd(t, admin, 30*time.Second)
					local := func() (n float64) {
						for _, s := range servers {
							n += metric(t, s, `ratelimitd_lease_decisions_total{path="local"}`)
						}
						return n
					}
					before := local()
					start := time.Now()
					ok, over := hammer(t, clients, 60, 2*leasedLimit, descriptorRequest("leased", "algorithm", a))
					most := leasedLimit
					if a == "token_bucket" || a == "gcra" {
						// B + r·t: what the bucket refills during the run.
						most += int(time.Since(start).Seconds()*leasedLimit/3600) + 1
					}
					if ok > most || ok < leasedLimit*98/100 {
						t.Errorf("3 replicas admitted %d of %d calls (refused %d); want at most %d and at least 98%% of %d", ok, 2*leasedLimit, over, most, leasedLimit)
					}
					decided := local() - before
					if decided == 0 {
						t.Errorf("no decision was made in process: the rule is not leased")
					}
					t.Logf("%s: admitted %d of %d, %.0f of %d decisions in process", a, ok, leasedLimit, decided, 2*leasedLimit)
				})
			}
		})
	}
}

// TestLeasesOutliveRedis SIGKILLs Redis under steady load on a leased rule
// (failure mode closed): no call fails, admissions continue from the
// leases held, and no more is admitted while Redis is down than the
// replica held when it went away (and took by calls already at Redis);
// once Redis is back, leases are taken again.
func TestLeasesOutliveRedis(t *testing.T) {
	rules := writeLeasedRules(t)
	node := redistest.StartNode(t)
	// A fixed window's leases end with it: an hour's end while Redis is
	// down would leave nothing held to admit.
	node.AwayFromHourEnd(t, 30*time.Second)
	srv := startServer(t, "-config", rules, "-backend", "redis", "-redis-url", "redis://"+node.Addr,
		"-failure-mode", "closed", "-backend-timeout", chaosTimeout.String(),
		"-circuit-failures", "3", "-circuit-cooldown", chaosCooldown.String(),
		"-lease-ttl", "10s", "-lease-period", "5s")
	client := rlsv3.NewRateLimitServiceClient(srv.dial(t))

	type call struct {
		end time.Time
		ok  bool
		err error
	}
	var (
		mu    sync.Mutex
		calls []call
		wg    sync.WaitGroup
		stop  = make(chan struct{})
	)
	req := descriptorRequest("hot", "user", "u1")
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := client.ShouldRateLimit(ctx, req)
				cancel()
				c := call{end: time.Now(), err: err}
				c.ok = err == nil && resp.OverallCode == rlsv3.RateLimitResponse_OK
				mu.Lock()
				calls = append(calls, c)
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	time.Sleep(1500 * time.Millisecond) // leases grow with the key's rate
	held := metric(t, srv, "ratelimitd_lease_held_hits")
	taken := metric(t, srv, "ratelimitd_lease_taken_hits_total")
	node.Kill(t)
	down := time.Now()
	time.Sleep(chaosOutage)
	// Leases granted by calls that reached Redis before it died count too.
	late := metric(t, srv, "ratelimitd_lease_taken_hits_total") - taken
	node.Restart(t)
	back := time.Now()
	time.Sleep(maxResume)
	close(stop)
	wg.Wait()

	var failed, during, after int
	for _, c := range calls {
		switch {
		case c.err != nil:
			failed++
			if failed == 1 {
				t.Errorf("a call failed: %v (code %v)", c.err, status.Code(c.err))
			}
		case !c.ok:
		case c.end.After(down) && c.end.Before(back):
			during++
		case c.end.After(back.Add(time.Second)):
			after++
		}
	}
	if held < 10 {
		t.Fatalf("the replica held %v hits before Redis went away: leasing did not warm up", held)
	}
	if during == 0 {
		t.Errorf("nothing was admitted while Redis was down, with %v hits held", held)
	}
	if bound := held + late; float64(during) > bound {
		t.Errorf("admitted %d while Redis was down, more than the %v held and %v taken by calls in flight", during, held, late)
	}
	if after == 0 {
		t.Errorf("nothing was admitted after Redis came back")
	}
	t.Logf("%d calls, %d failed; held %v when Redis went away (+%v in flight); admitted %d while it was down, %d after it came back",
		len(calls), failed, held, late, during, after)
}
