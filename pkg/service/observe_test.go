package service

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// recorder is an Observer that remembers what it was told.
type recorder struct {
	mu       sync.Mutex
	outcomes []string // "rule outcome hits"
	calls    int
	errs     int
}

func (r *recorder) Decided(domain string, rule *config.Rule, d *rlv3.RateLimitDescriptor, o Outcome, hits uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id := "override"
	if rule != nil {
		id = rule.ID
	}
	r.outcomes = append(r.outcomes, id+" "+o.String()+" "+itoa(hits))
}

func (r *recorder) BackendCall(took time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if err != nil {
		r.errs++
	}
}

func (r *recorder) FailureMode(domain string, m config.FailureMode) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.outcomes = append(r.outcomes, domain+" failure_mode "+string(m))
}

func itoa(n uint64) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

// TestObserver checks every outcome the observer is told of, and that one
// backend call is reported per request.
func TestObserver(t *testing.T) {
	rules := testRules
	clk := clocktest.New(start)
	rec := &recorder{}
	be := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
	f := newFixtureOpts(t, rules, be, clk, Options{Observer: rec, NearLimitRatio: 0.5})
	call := func(d ...*rlv3.RateLimitDescriptor) { f.call(t, request("messaging", d...)) }

	// messaging.message_type_marketing.to_number: 5 per day.
	marketing := desc("message_type", "marketing", "to_number", "1")
	call(marketing) // 4 left of 5: ok
	call(marketing) // 3 left: ok (used 2 is not past 2.5)
	call(marketing) // 2 left: near
	call(marketing, marketing, marketing)
	call(desc("sender", "s"), desc("sender", "s"), desc("sender", "s")) // shadow, 2 per minute
	call(desc("internal", "x"), desc("color", "red"))                   // unlimited; no match is not reported
	want := []string{
		"messaging.message_type_marketing.to_number ok 1",
		"messaging.message_type_marketing.to_number ok 1",
		"messaging.message_type_marketing.to_number near_limit 1",
		// 3 more in one request: the first two fit (each descriptor is
		// reported by its own decision), the third does not, and so the
		// request is refused whole.
		"messaging.message_type_marketing.to_number near_limit 1",
		"messaging.message_type_marketing.to_number near_limit 1",
		"messaging.message_type_marketing.to_number over_limit 1",
		"messaging.sender ok 1",
		"messaging.sender near_limit 1",
		"messaging.sender shadow_mode 1",
		"messaging.internal unlimited 1",
	}
	if len(rec.outcomes) != len(want) {
		t.Fatalf("outcomes:\n%q\nwant:\n%q", rec.outcomes, want)
	}
	for i := range want {
		if rec.outcomes[i] != want[i] {
			t.Errorf("outcome %d: %q, want %q", i, rec.outcomes[i], want[i])
		}
	}
	if rec.calls != 5 || rec.errs != 0 {
		t.Errorf("backend calls %d (%d failed), want 5 (the last request needs none)", rec.calls, rec.errs)
	}

	// A failing backend is reported, and the failure mode that decided;
	// decisions by failure mode open carry no figures and are not.
	rec2 := &recorder{}
	f2 := newFixtureOpts(t, testRules, failingBackend{}, clk, Options{Observer: rec2})
	if _, err := f2.svc.ShouldRateLimit(context.Background(), request("messaging", desc("to_number", "1"))); err != nil {
		t.Fatal(err)
	}
	if rec2.calls != 1 || rec2.errs != 1 || len(rec2.outcomes) != 1 || rec2.outcomes[0] != "messaging failure_mode open" {
		t.Errorf("failing backend: %d calls, %d errors, outcomes %q; want 1, 1, only the failure mode", rec2.calls, rec2.errs, rec2.outcomes)
	}
}

// reporter is a recorder that is a ReportObserver too.
type reporter struct {
	recorder
	reports []string // "rule outcome hits used/limit"
	unknown []string
}

func (r *reporter) Report(rep Report) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reports = append(r.reports, rep.Rule.ID+" "+rep.Outcome.String()+" "+itoa(rep.Hits)+" "+itoa(rep.Used)+"/"+itoa(rep.Limit))
}

func (r *reporter) UnknownDomain(domain string, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unknown = append(r.unknown, domain+" "+itoa(uint64(n)))
}

// TestTeeReports checks that Tee tells every observer of decisions and a
// ReportObserver of each counted decision's figures: how much of the
// limit was used before its hits, taken or not.
func TestTeeReports(t *testing.T) {
	if Tee(nil, nil) != nil {
		t.Error("Tee of nil observers is not nil")
	}
	clk := clocktest.New(start)
	plain, rep := &recorder{}, &reporter{}
	if Tee(rep, nil) != Observer(rep) {
		t.Error("Tee of one observer is not that observer")
	}
	be := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
	f := newFixtureOpts(t, testRules, be, clk, Options{Observer: Tee(plain, nil, rep)})
	marketing := desc("message_type", "marketing", "to_number", "1") // 5 per day
	for range 3 {
		f.call(t, request("messaging", marketing))
	}
	f.call(t, request("messaging", marketing, marketing, marketing)) // 3 more: refused whole
	f.call(t, request("messaging", desc("internal", "x")))           // unlimited: no report
	f.call(t, request("nowhere", desc("a", "b"), desc("c", "d")))
	id := "messaging.message_type_marketing.to_number"
	want := []string{
		id + " ok 1 0/5", id + " ok 1 1/5", id + " ok 1 2/5",
		// Refused whole: nothing taken, each decision tells what stands.
		id + " ok 1 3/5", id + " ok 1 3/5", id + " over_limit 1 3/5",
	}
	if !slices.Equal(rep.reports, want) {
		t.Errorf("reports:\n%q\nwant:\n%q", rep.reports, want)
	}
	if !slices.Equal(rep.unknown, []string{"nowhere 2"}) {
		t.Errorf("unknown domains %q, want [nowhere 2]", rep.unknown)
	}
	if !slices.Equal(plain.outcomes, rep.outcomes) || len(plain.outcomes) != 7 || plain.calls != rep.calls {
		t.Errorf("observers told differently: %q (%d calls) and %q (%d calls)", plain.outcomes, plain.calls, rep.outcomes, rep.calls)
	}
}
