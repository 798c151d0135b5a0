package service

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

// slotRules has a concurrency limit alone (export), one beside a rate
// limit (report), and a shadow one (probe).
const slotRules = `
domain: jobs
descriptors:
  - key: export
    concurrency: {max_in_flight: 2, lease_ttl: 30s}
  - key: report
    rate_limit: {unit: minute, requests_per_unit: 3}
    concurrency: {max_in_flight: 5, lease_ttl: 10s}
  - key: probe
    shadow_mode: true
    concurrency: {max_in_flight: 1, lease_ttl: 30s}
`

// slotEvents counts what a SlotObserver is told, by rule and event.
type slotEvents struct {
	mu sync.Mutex
	n  map[string]uint64
}

func (o *slotEvents) Decided(string, *config.Rule, *rlv3.RateLimitDescriptor, Outcome, uint64) {}
func (o *slotEvents) BackendCall(time.Duration, error)                                         {}
func (o *slotEvents) FailureMode(string, config.FailureMode)                                   {}
func (o *slotEvents) Slots(r *SlotReport) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n[r.Rule+" acquired"] += r.Acquired
	o.n[r.Rule+" refused"] += r.Refused
	o.n[r.Rule+" released"] += r.Released
	o.n[r.Rule+" expired"] += r.Expired
	o.n[r.Rule+" in flight"] = r.InFlight
}

func (o *slotEvents) get(key string) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[key]
}

type slotFixture struct {
	*fixture
	c      ratelimitdv1.RateLimiterClient
	events *slotEvents
}

func newSlotFixture(t *testing.T) *slotFixture {
	clk := clocktest.New(start)
	be := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { be.Close() })
	ev := &slotEvents{n: map[string]uint64{}}
	f := newFixtureOpts(t, slotRules, be, clk, Options{Observer: ev})
	return &slotFixture{fixture: f, c: ratelimitdv1.NewRateLimiterClient(f.conn), events: ev}
}

func (f *slotFixture) acquire(t *testing.T, ds ...*ratelimitdv1.Descriptor) *ratelimitdv1.AcquireResponse {
	t.Helper()
	resp, err := f.c.Acquire(context.Background(), &ratelimitdv1.AcquireRequest{Domain: "jobs", Descriptors: ds})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return resp
}

func (f *slotFixture) release(t *testing.T, id string) bool {
	t.Helper()
	resp, err := f.c.Release(context.Background(), &ratelimitdv1.ReleaseRequest{LeaseId: id})
	if err != nil {
		t.Fatalf("Release: %v", err)
	}
	return resp.Released
}

func (f *slotFixture) renew(t *testing.T, id string) *ratelimitdv1.RenewResponse {
	t.Helper()
	resp, err := f.c.Renew(context.Background(), &ratelimitdv1.RenewRequest{LeaseId: id})
	if err != nil {
		t.Fatalf("Renew: %v", err)
	}
	return resp
}

func TestAcquireHoldsSlotsUntilReleased(t *testing.T) {
	f := newSlotFixture(t)
	export := ownDesc("export", "e")
	a, b := f.acquire(t, export), f.acquire(t, export)
	for i, r := range []*ratelimitdv1.AcquireResponse{a, b} {
		res := r.Results[0]
		if !r.Allowed || r.LeaseId == "" || r.Ttl.AsDuration() != 30*time.Second || res.Outcome != ratelimitdv1.Outcome_OUTCOME_OK ||
			res.Rule != "jobs.export" || res.Concurrency.GetInFlight() != uint64(i+1) || res.Concurrency.GetMaxInFlight() != 2 ||
			res.Remaining != uint64(1-i) || res.Limit != nil {
			t.Fatalf("acquire %d: %v", i+1, r)
		}
	}
	if a.LeaseId == b.LeaseId {
		t.Fatal("two acquires got one lease id")
	}
	full := f.acquire(t, export)
	res := full.Results[0]
	if full.Allowed || full.LeaseId != "" || full.Ttl != nil || res.Outcome != ratelimitdv1.Outcome_OUTCOME_OVER_LIMIT ||
		res.Concurrency.GetInFlight() != 2 || res.RetryAfter.AsDuration() != 30*time.Second || res.RetryNever {
		t.Fatalf("acquire of a full limit: %v", full)
	}
	// Release frees a slot at once, and is idempotent.
	if !f.release(t, a.LeaseId) {
		t.Fatal("first release: released false")
	}
	if f.release(t, a.LeaseId) {
		t.Fatal("second release of one lease: released true")
	}
	if f.release(t, "") {
		t.Fatal("release of an empty lease id (an acquire without slots): released true")
	}
	c := f.acquire(t, export)
	if !c.Allowed || c.Results[0].Concurrency.GetInFlight() != 2 {
		t.Fatalf("acquire after a release: %v", c)
	}
	for key, want := range map[string]uint64{"jobs.export acquired": 3, "jobs.export refused": 1, "jobs.export released": 1, "jobs.export expired": 0, "jobs.export in flight": 2} {
		if got := f.events.get(key); got != want {
			t.Errorf("%s: %d, want %d", key, got, want)
		}
	}
}

// TestSlotsEndWithTheirTTL: a holder that never releases loses its slot
// when its TTL ends, not sooner; Renew keeps it another TTL.
func TestSlotsEndWithTheirTTL(t *testing.T) {
	f := newSlotFixture(t)
	export := ownDesc("export", "e")
	a := f.acquire(t, export)
	f.clock.Advance(10 * time.Second)
	b := f.acquire(t, export)
	f.clock.Advance(15 * time.Second) // a: 25s old, b: 15s
	if r := f.renew(t, b.LeaseId); !r.Renewed || r.Ttl.AsDuration() != 30*time.Second {
		t.Fatalf("renew of a held lease: %v", r)
	}
	f.clock.Advance(5*time.Second - time.Microsecond) // a: 1µs before its end
	if r := f.acquire(t, export); r.Allowed || r.Results[0].RetryAfter.AsDuration() != time.Microsecond {
		t.Fatalf("acquire 1µs before a slot ends: %v", r)
	}
	f.clock.Advance(time.Microsecond) // a ends
	if r := f.acquire(t, export); !r.Allowed {
		t.Fatalf("acquire when a slot's TTL ended: %v", r)
	}
	if got := f.events.get("jobs.export expired"); got != 1 {
		t.Errorf("expired: %d, want 1 (a's slot)", got)
	}
	// a lost its slot: renewing it says so, and releasing it frees nothing.
	if r := f.renew(t, a.LeaseId); r.Renewed || r.Ttl != nil {
		t.Fatalf("renew of an ended lease: %v", r)
	}
	if f.release(t, a.LeaseId) {
		t.Fatal("release of an ended lease: released true")
	}
	// b was renewed 5s ago: it holds for 25s more.
	f.clock.Advance(25*time.Second - time.Microsecond)
	if r := f.acquire(t, export); r.Allowed {
		t.Fatalf("acquire while the renewed slot holds: %v", r)
	}
}

// TestAcquireIsAllOrNothing: when one descriptor is refused, the others
// take no slot and count no hit.
func TestAcquireIsAllOrNothing(t *testing.T) {
	f := newSlotFixture(t)
	export, report := ownDesc("export", "e"), ownDesc("report", "r")
	f.acquire(t, export)
	f.acquire(t, export)
	for range 3 {
		r := f.acquire(t, report, export)
		if r.Allowed || r.LeaseId != "" || r.Results[0].Outcome != ratelimitdv1.Outcome_OUTCOME_OK || r.Results[1].Outcome != ratelimitdv1.Outcome_OUTCOME_OVER_LIMIT {
			t.Fatalf("acquire with a full descriptor: %v", r)
		}
	}
	// report's rate limit and slots are untouched: 3 acquires fit.
	var ids []string
	for i := range 3 {
		r := f.acquire(t, report)
		res := r.Results[0]
		if !r.Allowed || res.Concurrency.GetInFlight() != uint64(i+1) || res.Limit.GetRequests() != 3 || res.Remaining != uint64(2-i) {
			t.Fatalf("acquire %d of report: %v", i+1, r)
		}
		ids = append(ids, r.LeaseId)
	}
	// The fourth is refused by the rate limit, with slots to spare.
	r := f.acquire(t, report)
	if res := r.Results[0]; r.Allowed || res.Outcome != ratelimitdv1.Outcome_OUTCOME_OVER_LIMIT || res.Concurrency.GetInFlight() != 3 || res.Limit.GetRequests() != 3 {
		t.Fatalf("acquire over report's rate limit: %v", r)
	}
	if got := f.events.get("jobs.report refused"); got != 0 {
		t.Errorf("a refusal by a rate limit counted as %d slot refusals", got)
	}
	for _, id := range ids {
		if !f.release(t, id) {
			t.Errorf("release of %s: released false", id)
		}
	}
}

// TestLeaseIDMustBeOurs: a lease id this server did not write is invalid;
// one whose holder was altered names slots nobody holds, and frees nothing.
func TestLeaseIDMustBeOurs(t *testing.T) {
	f := newSlotFixture(t)
	export := ownDesc("export", "e")
	a := f.acquire(t, export)
	f.acquire(t, export)
	for _, id := range []string{"x", "rl1.", "rl1.!!", "rl1.AAAA", a.LeaseId[:len(a.LeaseId)-3], a.LeaseId + "AA", "rl2" + a.LeaseId[3:], strings.Repeat("A", 20<<10)} {
		_, err := f.c.Release(context.Background(), &ratelimitdv1.ReleaseRequest{LeaseId: id})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "lease_id") {
			t.Errorf("Release(%.20q): %v, want InvalidArgument naming lease_id", id, err)
		}
		_, err = f.c.Renew(context.Background(), &ratelimitdv1.RenewRequest{LeaseId: id})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("Renew(%.20q): %v, want InvalidArgument", id, err)
		}
	}
	if _, err := f.c.Renew(context.Background(), &ratelimitdv1.RenewRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Renew of an empty lease id: %v, want InvalidArgument", err)
	}
	l, err := parseLease(a.LeaseId)
	if err != nil {
		t.Fatal(err)
	}
	l.holder[1]++
	if f.release(t, l.String()) {
		t.Error("a lease id with another holder released a slot")
	}
	if r := f.acquire(t, export); r.Allowed {
		t.Fatalf("a forged release freed a slot: %v", r)
	}
}

// TestLeaseIDRoundTrip: every field of a lease survives its id.
func TestLeaseIDRoundTrip(t *testing.T) {
	f := newSlotFixture(t)
	r := f.acquire(t, ownDesc("report", "r"), ownDesc("export", "e"))
	l, err := parseLease(r.LeaseId)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.slots) != 2 || l.slots[0].rule != "jobs.report" || l.slots[1].rule != "jobs.export" ||
		l.slots[0].limit.Requests != 5 || l.slots[0].limit.Window != 10*time.Second || l.slots[1].limit.Window != 30*time.Second ||
		l.slots[0].domain != "jobs" || string(l.slots[1].key) != "4:jobs=6:export1:e|concurrency" {
		t.Fatalf("lease %+v", l)
	}
	if r.Ttl.AsDuration() != 10*time.Second {
		t.Errorf("ttl %v, want the shortest of the slots' (10s)", r.Ttl.AsDuration())
	}
	if l.String() != r.LeaseId {
		t.Errorf("re-encoded lease id differs:\n%s\n%s", l.String(), r.LeaseId)
	}
}

// TestShadowSlotsNeverRefuse: a shadow rule's full limit is reported and
// counted as refused, but admits, and takes no slot.
func TestShadowSlotsNeverRefuse(t *testing.T) {
	f := newSlotFixture(t)
	probe := ownDesc("probe", "p")
	if r := f.acquire(t, probe); !r.Allowed || r.LeaseId == "" {
		t.Fatalf("first acquire: %v", r)
	}
	r := f.acquire(t, probe)
	if !r.Allowed || r.LeaseId != "" || !r.Results[0].Shadow || r.Results[0].Outcome != ratelimitdv1.Outcome_OUTCOME_OVER_LIMIT {
		t.Fatalf("acquire of a full shadow limit: %v", r)
	}
	if got := f.events.get("jobs.probe refused"); got != 1 {
		t.Errorf("refused: %d, want 1", got)
	}
}

// TestRLSIgnoresSlots: Envoy's API has no release, so a rule with a
// concurrency limit alone answers OK as a descriptor without a limit, and
// one beside a rate limit is decided by its rate limit only. Check and
// Peek answer the same way.
func TestRLSIgnoresSlots(t *testing.T) {
	f := newSlotFixture(t)
	for range 3 {
		resp := f.call(t, request("jobs", desc("export", "e"), desc("report", "r")))
		if resp.OverallCode != ok || resp.Statuses[0].CurrentLimit != nil {
			t.Fatalf("RLS: %v", resp)
		}
	}
	if st := f.call(t, request("jobs", desc("report", "r"))).Statuses[0]; st.Code != over || st.CurrentLimit.GetRequestsPerUnit() != 3 {
		t.Fatalf("report after 3 RLS hits: %v", st)
	}
	chk, err := f.c.Check(context.Background(), &ratelimitdv1.CheckRequest{Domain: "jobs", Descriptors: []*ratelimitdv1.Descriptor{ownDesc("export", "e")}})
	if err != nil {
		t.Fatal(err)
	}
	if r := chk.Results[0]; !chk.Allowed || r.Outcome != ratelimitdv1.Outcome_OUTCOME_NO_LIMIT || r.Rule != "jobs.export" {
		t.Fatalf("Check of a concurrency limit: %v", chk)
	}
	// None of it took a slot.
	if r := f.acquire(t, ownDesc("export", "e")); r.Results[0].Concurrency.GetInFlight() != 1 {
		t.Fatalf("acquire after RLS and Check calls: %v", r)
	}
}

// TestAcquireFailureModes: with the backend down, open admits without a
// lease, closed refuses, error answers Unavailable; Release and Renew
// answer Unavailable (the slot then ends with its TTL).
func TestAcquireFailureModes(t *testing.T) {
	held := func() string {
		f := newSlotFixture(t)
		return f.acquire(t, ownDesc("export", "e")).LeaseId
	}()
	for _, tc := range []struct {
		mode    config.FailureMode
		allowed bool
		code    codes.Code
	}{
		{config.FailOpen, true, codes.OK},
		{config.FailClosed, false, codes.OK},
		{config.FailError, false, codes.Unavailable},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			f := newFixtureOpts(t, slotRules, failingBackend{}, new(clocktest.Clock), Options{FailureMode: tc.mode})
			c := ratelimitdv1.NewRateLimiterClient(f.conn)
			ctx := context.Background()
			resp, err := c.Acquire(ctx, &ratelimitdv1.AcquireRequest{Domain: "jobs", Descriptors: []*ratelimitdv1.Descriptor{ownDesc("export", "e")}})
			if status.Code(err) != tc.code {
				t.Fatalf("Acquire: %v, want %v", err, tc.code)
			}
			if err == nil && (resp.Allowed != tc.allowed || resp.LeaseId != "") {
				t.Fatalf("Acquire: %v, want allowed %v without a lease", resp, tc.allowed)
			}
			_, err = c.Release(ctx, &ratelimitdv1.ReleaseRequest{LeaseId: held})
			if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "TTL") {
				t.Errorf("Release: %v, want Unavailable telling the slot ends with its TTL", err)
			}
			if _, err := c.Renew(ctx, &ratelimitdv1.RenewRequest{LeaseId: held}); status.Code(err) != codes.Unavailable {
				t.Errorf("Renew: %v, want Unavailable", err)
			}
		})
	}
}

// TestFailureModeLocalHoldsSlots: with the backend down, failure mode
// local holds slots in the fallback, cut to the replica's share.
func TestFailureModeLocalHoldsSlots(t *testing.T) {
	clk := clocktest.New(start)
	fallback := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
	f := newFixtureOpts(t, slotRules, failingBackend{}, clk, Options{FailureMode: config.FailLocal, Fallback: fallback, LocalShare: 0.5})
	c := ratelimitdv1.NewRateLimiterClient(f.conn)
	admitted := 0
	for range 6 {
		resp, err := c.Acquire(context.Background(), &ratelimitdv1.AcquireRequest{Domain: "jobs", Descriptors: []*ratelimitdv1.Descriptor{ownDesc("export", "e")}})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Allowed {
			admitted++
			if resp.LeaseId == "" {
				t.Fatalf("admitted by the fallback without a lease: %v", resp)
			}
		}
	}
	// export: 2 in flight, halved.
	if admitted != 1 {
		t.Errorf("local fallback with a share of 0.5 admitted %d, want 1 (2 in flight, halved)", admitted)
	}
}

// FuzzParseLease: no lease id, however malformed, panics the parser, and
// every one it accepts encodes back to itself, so one lease has one id.
func FuzzParseLease(f *testing.F) {
	l := &slotLease{holder: [2]uint64{1, 2}, slots: []leaseSlot{{domain: "d", rule: "d.k", key: []byte("1:d=1:k0:|concurrency"), limit: slotLimit(&config.Concurrency{MaxInFlight: 3, LeaseTTL: time.Second})}}}
	f.Add(l.String())
	f.Add("rl1.")
	f.Add("rl1.AAAAAAAAAAAAAAAAAAAAAAEBAQEBAQ")
	f.Fuzz(func(t *testing.T, id string) {
		l, err := parseLease(id)
		if err != nil {
			return
		}
		if again := l.String(); again != id {
			t.Fatalf("%q parsed, and encodes back as %q", id, again)
		}
	})
}

// TestExplainShowsHolders: explain tells a concurrency limit's rule, key
// and holders, read from the backend without taking a slot.
func TestExplainShowsHolders(t *testing.T) {
	f := newSlotFixture(t)
	f.acquire(t, ownDesc("export", "e"))
	f.acquire(t, ownDesc("report", "r"), ownDesc("export", "e"))
	req := request("jobs", desc("export", "e"), desc("report", "r"), desc("report", "other"))
	for range 2 { // reading changes nothing
		x := explainOK(t, f.svc, req)
		ex, rep, other := x.Descriptors[0], x.Descriptors[1], x.Descriptors[2]
		if ex.Result != ExplainConcurrency || holders(ex.Slots) != 2 || ex.Slots.Key != "4:jobs=6:export1:e|concurrency" || len(ex.Keys) != 0 ||
			ex.Rule.Concurrency == nil || ex.Rule.Concurrency.MaxInFlight != 2 || ex.Rule.Concurrency.LeaseTTL != "30s" {
			t.Fatalf("export: %+v", ex)
		}
		if !strings.Contains(strings.Join(ex.Why, "\n"), "at most 2 in flight, each slot held until Release or for 30s unless renewed; 2 held now") {
			t.Errorf("export why: %q", ex.Why)
		}
		if rep.Result != ExplainMatched || holders(rep.Slots) != 1 || len(rep.Keys) != 1 || holders(other.Slots) != 0 {
			t.Fatalf("report: %+v; other: %+v", rep, other)
		}
	}
	if r := f.acquire(t, ownDesc("export", "e")); r.Allowed {
		t.Fatalf("explain freed or took a slot: %v", r)
	}
	// A backend that cannot be read leaves the count unknown, and says why.
	svc, err := New(failingBackend{}, f.svc.Rules(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	ex := explainOK(t, svc, req).Descriptors[0]
	if ex.Slots == nil || ex.Slots.Holders != nil || !strings.Contains(ex.Slots.Error, "connection refused") {
		t.Fatalf("explain with the backend down: %+v", ex.Slots)
	}
}

// holders returns the holders explain found, 0 when unknown or none.
func holders(es *ExplainSlots) uint64 {
	if es == nil || es.Holders == nil {
		return 0
	}
	return *es.Holders
}

func TestRLConfigShowsConcurrency(t *testing.T) {
	f := newSlotFixture(t)
	_, _, body := f.http(t, "GET", "/rlconfig", "")
	for _, want := range []string{
		"jobs.export: shadow_mode: false, concurrency: max_in_flight=2 lease_ttl=30s (rules.yaml:4)\n",
		"jobs.report: unit=MINUTE requests_per_unit=3, shadow_mode: false, algorithm: fixed_window, concurrency: max_in_flight=5 lease_ttl=10s (rules.yaml:6)\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/rlconfig lacks %q\n%s", want, body)
		}
	}
}
