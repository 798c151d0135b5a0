package rlqs_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/rlqs"
)

// reloadable is a rule set the test replaces, as cmd's reloads do.
type reloadable struct{ p atomic.Pointer[config.Rules] }

func (r *reloadable) set(t *testing.T, yaml string) {
	t.Helper()
	rules, err := config.Parse(config.File{Name: "quota.yaml", Data: []byte(yaml)})
	if err != nil {
		t.Fatal(err)
	}
	r.p.Store(rules)
}

func (r *reloadable) get() *config.Rules { return r.p.Load() }

// recvWithin returns the next response of st, or nil when none comes
// within d.
func recvWithin(t *testing.T, st interface {
	Recv() (*rlqsv3.RateLimitQuotaResponse, error)
}, d time.Duration) *rlqsv3.RateLimitQuotaResponse {
	t.Helper()
	got := make(chan *rlqsv3.RateLimitQuotaResponse, 1)
	go func() {
		resp, err := st.Recv()
		if err != nil {
			resp = nil
		}
		got <- resp
	}()
	select {
	case resp := <-got:
		return resp
	case <-time.After(d):
		return nil
	}
}

// TestReloadPushesChangedAssignments: after a reload that lowers acme's
// limit, the stream is sent acme's new assignment at once, without a
// report, and nothing for bigcorp, whose rule did not change; a reload
// that changes nothing sends nothing.
func TestReloadPushesChangedAssignments(t *testing.T) {
	var rules reloadable
	rules.set(t, rulesYAML)
	f := start(t, rlqs.Options{Rules: rules.get, Headroom: wholeShare})
	st := f.rawStream(t)
	resp, err := exchange(t, st, "quota", usage(10, 0, "name", "acme", "route", "/pay"), usage(1, 0, "name", "bigcorp"))
	if err != nil || len(resp.BucketAction) != 2 {
		t.Fatalf("first report: %v, %v", resp, err)
	}

	rules.set(t, strings.Replace(rulesYAML, "requests_per_unit: 100, unit: second", "requests_per_unit: 50, unit: second", 1))
	f.srv.Reload()
	push := recvWithin(t, st, 5*time.Second)
	if push == nil {
		t.Fatal("no assignment pushed within 5s of the reload")
	}
	if len(push.BucketAction) != 1 {
		t.Fatalf("pushed %d bucket actions, want 1 (acme only): %v", len(push.BucketAction), push)
	}
	a := push.BucketAction[0]
	if a.GetBucketId().GetBucket()["name"] != "acme" {
		t.Fatalf("pushed %v, want acme's bucket", a.GetBucketId())
	}
	if got := describe(a.GetQuotaAssignmentAction().GetRateLimitStrategy()); got != "1000/20s max 50" {
		t.Fatalf("pushed %s, want 1000/20s max 50 (50/s)", got)
	}
	if a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration() <= 0 {
		t.Fatal("pushed assignment has no TTL")
	}

	// The same rules again: nothing changed, nothing is sent.
	rules.set(t, strings.Replace(rulesYAML, "requests_per_unit: 100, unit: second", "requests_per_unit: 50, unit: second", 1))
	f.srv.Reload()
	if extra := recvWithin(t, st, 300*time.Millisecond); extra != nil {
		t.Fatalf("a reload changing nothing pushed %v", extra)
	}
}

// TestReloadMovesBucketsBetweenRules: a bucket whose rule turns unlimited,
// and back, is pushed ALLOW_ALL, then a share of the limit.
func TestReloadMovesBucketsBetweenRules(t *testing.T) {
	var rules reloadable
	rules.set(t, rulesYAML)
	f := start(t, rlqs.Options{Rules: rules.get, Headroom: wholeShare})
	st := f.rawStream(t)
	if _, err := exchange(t, st, "quota", usage(10, 0, "name", "acme", "route", "/pay")); err != nil {
		t.Fatal(err)
	}
	rules.set(t, strings.Replace(rulesYAML, "rate_limit: {requests_per_unit: 100, unit: second}", "rate_limit: {unlimited: true}", 1))
	f.srv.Reload()
	if push := recvWithin(t, st, 5*time.Second); push == nil || describe(push.BucketAction[0].GetQuotaAssignmentAction().GetRateLimitStrategy()) != "ALLOW_ALL" {
		t.Fatalf("after the rule turned unlimited: pushed %v, want ALLOW_ALL", push)
	}
	if n := f.srv.Pools(); n != 0 {
		t.Fatalf("%d pools after the only pooled bucket turned unlimited, want 0", n)
	}
	rules.set(t, rulesYAML)
	f.srv.Reload()
	if push := recvWithin(t, st, 5*time.Second); push == nil || describe(push.BucketAction[0].GetQuotaAssignmentAction().GetRateLimitStrategy()) != "1000/10s max 100" {
		t.Fatalf("after the limit came back: pushed %v, want 1000/10s max 100", push)
	}
}

// TestReloadPushWithBudget: with a budget store, a pushed assignment is
// taken from the store under the new limit, as a report's is: a simulated
// Envoy that never reports again sees its assignment follow the limit
// down and up.
func TestReloadPushWithBudget(t *testing.T) {
	var rules reloadable
	rules.set(t, rulesYAML)
	clk := clocktest.New(time.Unix(1_700_000_000, 0))
	store := memory.New(memory.Options{Now: clk.Now})
	t.Cleanup(func() { store.Close() })
	f := startOn(t, rlqs.Options{Rules: rules.get, Budget: store, Headroom: wholeShare}, clk)
	c := f.sim(t)
	c.Allow(acmeBucket)
	if err := c.Report(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if got := share(c); got != 100 {
		t.Fatalf("share %v before the reload, want 100", got)
	}
	waitShare := func(want float64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for share(c) != want {
			if time.Now().After(deadline) {
				t.Fatalf("share %v 5s after the reload, want %v pushed", share(c), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	for _, limit := range []uint64{40, 200} {
		rules.set(t, strings.Replace(rulesYAML, "requests_per_unit: 100, unit: second", "requests_per_unit: "+itoa(limit)+", unit: second", 1))
		f.srv.Reload()
		waitShare(float64(limit))
	}
}

// once runs a function armed in it the first time it is called after.
type once struct{ f atomic.Pointer[func()] }

func (o *once) arm(f func()) { o.f.Store(&f) }

func (o *once) fire() {
	if f := o.f.Swap(nil); f != nil {
		(*f)()
	}
}

// hookedStore is a budget store that calls its hook as each call starts.
type hookedStore struct {
	algo.Backend
	hook *once
}

func (h hookedStore) Decide(ctx context.Context, reqs []algo.Request, out []algo.Decision) error {
	h.hook.fire()
	return h.Backend.Decide(ctx, reqs, out)
}

// TestReloadDuringPushIsPushed: a second reload (40/s) that comes at any
// point of the push of a first (50/s), or of a report, is pushed too: the
// stream's last assignment is 40/s, without a report. Reloads arrive
// before the push starts, as it reads the rules (a hook in Options.Rules
// reloads right after the read), while it waits for the budget store,
// after it was sent, and while a report is decided. Fails against a
// build whose reassess reads the rules before it takes the stream's
// reload flag (as before this test): the push computed with the rules
// read just before the second reload took that reload's flag, and the
// second reload was never pushed.
func TestReloadDuringPushIsPushed(t *testing.T) {
	limit := func(n string) string {
		return strings.Replace(rulesYAML, "requests_per_unit: 100, unit: second", "requests_per_unit: "+n+", unit: second", 1)
	}
	for _, c := range []struct {
		name string
		// run makes the first reload (or a report) happen, with second
		// (the reload to 40/s) at its point.
		run func(f *fixture, atRules, atStore *once, st quotaStream, second func())
	}{
		{"before the push starts", func(f *fixture, _, _ *once, _ quotaStream, second func()) {
			f.srv.Reload()
			second()
		}},
		{"as the push reads the rules", func(f *fixture, atRules, _ *once, _ quotaStream, second func()) {
			atRules.arm(second)
			f.srv.Reload()
		}},
		{"while the push waits for the store", func(f *fixture, _, atStore *once, _ quotaStream, second func()) {
			atStore.arm(second)
			f.srv.Reload()
		}},
		{"after the push was sent", func(f *fixture, _, _ *once, st quotaStream, second func()) {
			f.srv.Reload()
			awaitRate(t, st, 50)
			second()
		}},
		{"while a report is decided", func(f *fixture, atRules, _ *once, st quotaStream, second func()) {
			atRules.arm(second)
			if err := st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "quota", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(1, 0, "name", "acme", "route", "/pay")}}); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var rules reloadable
			var atRules, atStore once
			rules.set(t, rulesYAML)
			get := func() *config.Rules {
				r := rules.get()
				atRules.fire() // a reload right after the read
				return r
			}
			clk := clocktest.New(time.Unix(1_700_000_000, 0))
			store := memory.New(memory.Options{Now: clk.Now})
			t.Cleanup(func() { store.Close() })
			f := startOn(t, rlqs.Options{Rules: get, Budget: hookedStore{store, &atStore}, Headroom: wholeShare}, clk)
			st := f.rawStream(t)
			if _, err := exchange(t, st, "quota", usage(1, 0, "name", "acme", "route", "/pay")); err != nil {
				t.Fatal(err)
			}
			rules.set(t, limit("50"))
			c.run(f, &atRules, &atStore, st, func() {
				rules.set(t, limit("40"))
				f.srv.Reload()
			})
			awaitRate(t, st, 40)
		})
	}
}

// quotaStream is a stream the test writes reports on itself.
type quotaStream = grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]

// awaitRate reads st until acme is assigned want requests a second; it
// fails t when that does not come within 5s.
func awaitRate(t *testing.T, st quotaStream, want float64) {
	t.Helper()
	var got []string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		resp := recvWithin(t, st, time.Until(deadline))
		for _, a := range resp.GetBucketAction() {
			s := a.GetQuotaAssignmentAction().GetRateLimitStrategy()
			got = append(got, describe(s))
			if a.GetBucketId().GetBucket()["name"] == "acme" && rate(s) == want {
				return
			}
		}
	}
	t.Fatalf("acme not assigned %v/s within 5s; assigned %v", want, got)
}
