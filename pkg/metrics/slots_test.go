package metrics

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/service"
	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

const slotRules = `
domain: jobs
descriptors:
  - key: export
    concurrency: {max_in_flight: 2, lease_ttl: 30s}
  - key: idle
    concurrency: {max_in_flight: 1, lease_ttl: 1m}
`

// slotService serves the own API of a service on the memory backend under
// slotRules, observed by m, all on clk; it returns its client.
func slotService(t *testing.T, m *Metrics, clk *clocktest.Clock) ratelimitdv1.RateLimiterClient {
	t.Helper()
	rules, err := config.Parse(config.File{Name: "jobs.yaml", Data: []byte(slotRules)})
	if err != nil {
		t.Fatal(err)
	}
	m.Rules(rules)
	mem := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { mem.Close() })
	svc, err := service.New(mem, rules, service.Options{Observer: m, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	svc.RegisterGRPC(gs)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return ratelimitdv1.NewRateLimiterClient(conn)
}

var (
	slotsHeader    = header("ratelimitd_concurrency_slots_total", helpSlots, "counter")
	inFlightHeader = header("ratelimitd_concurrency_in_flight", helpInFlight, "gauge")
)

// TestSlots: acquires, refusals, releases and expiries are counted by
// rule, and the in-flight gauge follows the slots held, each key's count
// dropping to zero when its last slot ends.
func TestSlots(t *testing.T) {
	clk := clocktest.New(time.Unix(1_700_000_040, 0))
	m, reg := newMetrics(t, Options{Now: clk.Now})
	c := slotService(t, m, clk)
	ctx := context.Background()
	acquire := func(user string) string {
		resp, err := c.Acquire(ctx, &ratelimitdv1.AcquireRequest{Domain: "jobs", Descriptors: []*ratelimitdv1.Descriptor{
			{Entries: []*ratelimitdv1.Entry{{Key: "export", Value: user}}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.LeaseId
	}
	// Before anything: every series at zero.
	gatherAndCompare(t, reg, inFlightHeader+`
ratelimitd_concurrency_in_flight{domain="jobs",rule="jobs.export"} 0
ratelimitd_concurrency_in_flight{domain="jobs",rule="jobs.idle"} 0
`, "ratelimitd_concurrency_in_flight")

	a := acquire("u1")
	acquire("u1")
	acquire("u1") // refused
	acquire("u2")
	if _, err := c.Release(ctx, &ratelimitdv1.ReleaseRequest{LeaseId: a}); err != nil {
		t.Fatal(err)
	}
	// u1 holds 1, u2 holds 1: 2 in flight over two keys.
	gatherAndCompare(t, reg, inFlightHeader+`
ratelimitd_concurrency_in_flight{domain="jobs",rule="jobs.export"} 2
ratelimitd_concurrency_in_flight{domain="jobs",rule="jobs.idle"} 0
`, "ratelimitd_concurrency_in_flight")

	// Nobody releases: past the TTL, the gauge drops the ended slots by
	// itself, and the next acquire of u1 finds its holder expired.
	clk.Advance(30 * time.Second)
	gatherAndCompare(t, reg, inFlightHeader+`
ratelimitd_concurrency_in_flight{domain="jobs",rule="jobs.export"} 0
ratelimitd_concurrency_in_flight{domain="jobs",rule="jobs.idle"} 0
`, "ratelimitd_concurrency_in_flight")
	acquire("u1")
	gatherAndCompare(t, reg, slotsHeader+`
ratelimitd_concurrency_slots_total{domain="jobs",event="acquired",rule="jobs.export"} 4
ratelimitd_concurrency_slots_total{domain="jobs",event="expired",rule="jobs.export"} 1
ratelimitd_concurrency_slots_total{domain="jobs",event="refused",rule="jobs.export"} 1
ratelimitd_concurrency_slots_total{domain="jobs",event="released",rule="jobs.export"} 1
ratelimitd_concurrency_slots_total{domain="jobs",event="acquired",rule="jobs.idle"} 0
ratelimitd_concurrency_slots_total{domain="jobs",event="expired",rule="jobs.idle"} 0
ratelimitd_concurrency_slots_total{domain="jobs",event="refused",rule="jobs.idle"} 0
ratelimitd_concurrency_slots_total{domain="jobs",event="released",rule="jobs.idle"} 0
`+inFlightHeader+`
ratelimitd_concurrency_in_flight{domain="jobs",rule="jobs.export"} 1
ratelimitd_concurrency_in_flight{domain="jobs",rule="jobs.idle"} 0
`, "ratelimitd_concurrency_slots_total", "ratelimitd_concurrency_in_flight")
}

// TestSlotKeysAreBounded: past MaxSlotKeys keys, new keys are left out
// of the gauge until followed ones end; none is left out after.
func TestSlotKeysAreBounded(t *testing.T) {
	clk := clocktest.New(time.Unix(0, 0))
	m, reg := newMetrics(t, Options{Now: clk.Now})
	report := func(key string, until time.Duration) {
		m.Slots(&service.SlotReport{Domain: "d", Rule: "d.k", Key: []byte(key), Acquired: 1, InFlight: 1, Until: until})
	}
	for i := range MaxSlotKeys + 5 {
		report(string(rune('a'+i%26))+string(rune(i)), time.Second)
	}
	if n := len(m.slots.keys); n != MaxSlotKeys {
		t.Fatalf("%d keys followed, want the bound %d", n, MaxSlotKeys)
	}
	clk.Advance(time.Second)
	report("late", time.Minute)
	gatherAndCompare(t, reg, inFlightHeader+`
ratelimitd_concurrency_in_flight{domain="d",rule="d.k"} 1
`, "ratelimitd_concurrency_in_flight")
}
