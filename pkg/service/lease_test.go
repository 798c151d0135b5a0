package service

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/lease"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

const leaseRules = `
domain: api
descriptors:
  - key: user
    rate_limits:
      - {name: per_second, unit: second, requests_per_unit: 1000, consistency: leased}
      - {name: per_day, unit: day, requests_per_unit: 100000}
`

// TestLeasedLimitsShowTheirLeases decides a leased limit through a lease
// engine over the memory backend: Check and Peek report the limit as
// leased with what this replica holds of it, and POST /explain says the
// same, while the exact limit of the rule reports none.
func TestLeasedLimitsShowTheirLeases(t *testing.T) {
	clk := clocktest.New(start)
	store := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	eng, err := lease.New(store, lease.Options{Now: clk.Now, Manual: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close(context.Background()) })
	f := newFixtureOpts(t, leaseRules, eng, clk, Options{Leases: eng})
	c := ratelimitdv1.NewRateLimiterClient(f.conn)
	ctx := context.Background()
	check := &ratelimitdv1.CheckRequest{Domain: "api", Descriptors: []*ratelimitdv1.Descriptor{ownDesc("user", "u1")}}
	for range 40 {
		clk.Advance(5 * time.Millisecond)
		if resp, err := c.Check(ctx, check); err != nil || !resp.Allowed {
			t.Fatalf("Check: %v, %v", resp, err)
		}
		eng.Flush(ctx)
	}
	held := uint64(eng.Stats().Held)
	if held == 0 {
		t.Fatal("the engine holds nothing after 40 checks in 200 ms")
	}
	peek, err := c.Peek(ctx, &ratelimitdv1.PeekRequest{Domain: "api", Descriptors: check.Descriptors})
	if err != nil {
		t.Fatal(err)
	}
	r := peek.Results[0]
	// The most restrictive limit is per_second: 1000 − 40, less the
	// peek's own hit, as a peek reports.
	if r.Limit.Name != "per_second" || r.Limit.Consistency != ratelimitdv1.Consistency_CONSISTENCY_LEASED {
		t.Fatalf("Peek reports limit %v, want per_second, leased", r.Limit)
	}
	if r.Lease == nil || r.Lease.Held != held || r.Lease.Rate <= 0 || r.Lease.Ends.AsDuration() <= 0 {
		t.Errorf("Peek reports lease %v, want %d held, a rate and an end", r.Lease, held)
	}
	if r.Remaining != 1000-40-1 {
		t.Errorf("Peek reports %d remaining, want %d: the store's and the leases' together", r.Remaining, 1000-40-1)
	}

	code, _, body := postExplain(t, f.svc, `{"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": "u1"}]}]}`)
	if code != 200 {
		t.Fatalf("explain: %d %s", code, body)
	}
	var x ExplainResponse
	if err := json.Unmarshal([]byte(body), &x); err != nil {
		t.Fatal(err)
	}
	d := x.Descriptors[0]
	if len(d.Leases) != 2 || d.Leases[0] == nil || d.Leases[0].Held != held || d.Leases[1] != nil {
		t.Fatalf("explain leases %+v, want the per_second key's and none for per_day", d.Leases)
	}
	if l := d.Rule.Limits; l[0].Consistency != "leased" || l[1].Consistency != "exact" {
		t.Errorf("explain limits %+v", l)
	}
	if why := strings.Join(d.Why, "\n"); !strings.Contains(why, "limit 0 is leased: this replica holds") {
		t.Errorf("why does not tell the lease:\n%s", why)
	}
}
