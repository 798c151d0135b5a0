package rlqs_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
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
