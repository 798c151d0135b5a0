package rlqs_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/rlqssim"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/rlqs"
)

// TestExplain: an explanation names the rule a bucket id matches and the
// Envoy rate of its limit, this replica's streams and lease, and the
// budget all replicas hold in the store, and reading it changes nothing.
func TestExplain(t *testing.T) {
	clk := clocktest.New(time.Unix(1_700_000_000, 0))
	store := memory.New(memory.Options{Now: clk.Now})
	t.Cleanup(func() { store.Close() })
	r1 := startOn(t, rlqs.Options{Budget: store}, clk)
	r2 := startOn(t, rlqs.Options{Budget: store}, clk)
	clients := []*rlqssim.Client{r1.sim(t), r1.sim(t), r2.sim(t)}
	for range 4 {
		drive(t, r1, clients, []float64{60, 60, 60})
	}
	ctx := context.Background()
	// A renewal behind the last answer may still be on its way: its
	// lease holds nothing until it settles.
	var e *rlqs.Explanation
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		var err error
		if e, err = r1.srv.Explain(ctx, "quota", acmeBucket); err != nil {
			t.Fatal(err)
		}
		if (e.Replica != nil && e.Replica.Lease != nil && e.Replica.Lease.Held > 0) || time.Now().After(deadline) {
			break
		}
	}
	if e.Decision != "rule" || e.Rule == nil || e.Rule.ID != "quota.name_acme.route" || e.Limit == nil || e.Limit.Units != 1000 || e.Limit.Period != "10s" {
		t.Fatalf("explanation %+v: want rule quota.name_acme.route shared as 1,000 units per 10s", e)
	}
	if tb := e.Limit.TokenBucket; tb.TokensPerFill != 1000 || tb.FillInterval != "10s" || tb.MaxTokens != 100 || tb.PerSecond != 100 {
		t.Fatalf("the whole limit as a token bucket: %+v, want 1000 per 10s, max 100 (1 s of 100/s)", tb)
	}
	if got := e.Descriptor; len(got) != 2 || got[0] != [2]string{"name", "acme"} || got[1] != [2]string{"route", "/pay"} {
		t.Errorf("descriptor %v, want the entries sorted by key", got)
	}
	rep := e.Replica
	if rep == nil || rep.Streams != 2 || len(rep.Members) != 2 || rep.Lease == nil {
		t.Fatalf("replica %+v: want two streams and a lease", rep)
	}
	var assigned uint64
	for _, m := range rep.Members {
		assigned += m.Assigned
		// Each member's token bucket is its assignment, as sent.
		if tb := m.TokenBucket; tb == nil || uint64(tb.TokensPerFill) != m.Assigned || tb.FillInterval != "10s" {
			t.Errorf("member %+v: its token bucket should be its assignment per 10s", m)
		}
	}
	if rep.Assigned != assigned || rep.Assigned > rep.Lease.Held {
		t.Errorf("replica: assigned %d, members' %d, lease %d: the assignments must be the members' and within the lease", rep.Assigned, assigned, rep.Lease.Held)
	}
	b := e.Budget
	if b == nil || b.Error != "" || b.Limit != 1000 || b.Held+b.Free != 1000 || b.Held < rep.Lease.Held {
		t.Fatalf("budget %+v: want the limit 1000 split into held (at least replica 1's %d) and free", b, rep.Lease.Held)
	}
	if b.Held < 900 || b.Streams != 3 {
		t.Errorf("3 streams offering 180/s of 100/s: held %d, announced streams %v; want nearly all the limit held, and 3", b.Held, b.Streams)
	}
	again, err := r1.srv.Explain(ctx, "quota", acmeBucket)
	if err != nil || again.Budget.Free != b.Free || again.Budget.Held != b.Held {
		t.Errorf("a second explanation reads %+v (%v), want the same budget %+v: explaining must change nothing", again.Budget, err, b)
	}
	t.Logf("acme: replica 1 holds %d for its 2 streams (assigned %d), all replicas hold %d of %d; why: %q",
		rep.Lease.Held, rep.Assigned, b.Held, b.Limit, e.Why)

	pools := r2.srv.Pools()
	for _, c := range []struct {
		domain   string
		id       map[string]string
		decision string
		why      string
	}{
		{"quota", map[string]string{"name": "nobody"}, "default", "matched nothing"},
		{"elsewhere", map[string]string{"name": "acme"}, "default", "not defined by any rule file"},
		{"quota", map[string]string{"unlimited": "x"}, "allow_all", "ALLOW_ALL"},
		{"quota", map[string]string{"closed": "x"}, "deny_all", "DENY_ALL"},
		{"quota", map[string]string{"name": "bigcorp"}, "rule", "1020 units per 17m0s"},
	} {
		e, err := r2.srv.Explain(ctx, c.domain, c.id)
		if err != nil {
			t.Fatal(err)
		}
		if e.Decision != c.decision || !strings.Contains(strings.Join(e.Why, "\n"), c.why) {
			t.Errorf("%s %v: decision %q, why %q; want %q and %q", c.domain, c.id, e.Decision, e.Why, c.decision, c.why)
		}
		if c.decision == "rule" && (e.Replica != nil || e.Budget == nil || e.Budget.Held != 0) {
			t.Errorf("%v, reported by no stream: replica %+v, budget %+v; want no share and nothing held", c.id, e.Replica, e.Budget)
		}
	}
	if r2.srv.Pools() != pools {
		t.Errorf("explaining made pools: %d, was %d", r2.srv.Pools(), pools)
	}
	for _, bad := range []struct {
		domain string
		id     map[string]string
	}{{"", acmeBucket}, {"quota", nil}, {"quota", map[string]string{"": "x"}}, {strings.Repeat("d", 256), acmeBucket}} {
		if _, err := r1.srv.Explain(ctx, bad.domain, bad.id); !errors.Is(err, rlqs.ErrBadExplainRequest) {
			t.Errorf("explain %q %v: %v, want a bad request", bad.domain, bad.id, err)
		}
	}
}

// TestExplainHandler: POST /explain/rlqs answers 200 with the explanation
// as JSON, 400 with the reason for bad JSON or a bad bucket id, and 413
// for a body too large.
func TestExplainHandler(t *testing.T) {
	f := start(t, rlqs.Options{})
	h := f.srv.ExplainHandler()
	post := func(body string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/explain/rlqs", strings.NewReader(body)))
		return w
	}
	w := post(`{"domain": "quota", "bucketId": {"route": "/pay", "name": "acme"}}`)
	var e rlqs.Explanation
	if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &e) != nil || e.Rule == nil || e.Rule.ID != "quota.name_acme.route" {
		t.Fatalf("explain acme: %d %s", w.Code, w.Body)
	}
	for _, c := range []struct {
		body string
		code int
		want string
	}{
		{`{"domain": "quota"`, http.StatusBadRequest, `the body must be {"domain"`},
		{`{"domain": "quota", "bucket": {"a": "b"}}`, http.StatusBadRequest, `unknown field "bucket"`},
		{`{"domain": "quota", "bucketId": {}}`, http.StatusBadRequest, "bucket_id is empty"},
		{`{"domain": "quota", "bucketId": {"k": "` + strings.Repeat("v", 70_000) + `"}}`, http.StatusRequestEntityTooLarge, "body over"},
	} {
		w := post(c.body)
		var got struct{ Error string }
		if w.Code != c.code || json.Unmarshal(w.Body.Bytes(), &got) != nil || !strings.Contains(got.Error, c.want) {
			t.Errorf("%.60s: %d %s, want %d and an error holding %q", c.body, w.Code, w.Body, c.code, c.want)
		}
	}
}
