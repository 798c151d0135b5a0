package rlqs_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/rlqssim"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/rlqs"
)

// TestStats: the counts follow streams, buckets, reports, the assignments
// sent by kind, pushes, the streams ended by bad input, and each rule's
// reported usage, which ends with the streams reporting it.
func TestStats(t *testing.T) {
	var rules reloadable
	rules.set(t, rulesYAML)
	f := start(t, rlqs.Options{Rules: rules.get})
	st := f.rawStream(t)
	if _, err := exchange(t, st, "quota",
		usage(10, 5, "name", "acme", "route", "/pay"), usage(1, 0, "name", "bigcorp"),
		usage(3, 0, "unlimited", "x"), usage(7, 0, "nomatch", "y")); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(time.Second)
	if _, err := exchange(t, st, "quota", usage(20, 0, "name", "acme", "route", "/pay"), usage(2, 0, "name", "bigcorp"),
		usage(3, 0, "unlimited", "x"), usage(7, 0, "nomatch", "y"), usage(0, 0, "closed", "z")); err != nil {
		t.Fatal(err)
	}
	s := f.srv.Stats()
	if s.Streams != 1 || s.Buckets != 5 || s.Pools != 2 || s.Reports != 2 {
		t.Errorf("streams %d buckets %d pools %d reports %d, want 1 5 2 2", s.Streams, s.Buckets, s.Pools, s.Reports)
	}
	if want := (rlqs.Assignments{TokenBucket: 4, AllowAll: 4, DenyAll: 1}); s.Assignments != want {
		t.Errorf("assignments %+v, want %+v", s.Assignments, want)
	}
	var usages []string
	for _, u := range s.Usage {
		usages = append(usages, fmt.Sprintf("%s/%s:%d:%g", u.Domain, u.Rule, u.Buckets, u.Allowed))
	}
	if got, want := strings.Join(usages, " "), "quota/quota.closed:1:0 quota/quota.name_acme.route:1:20 quota/quota.name_big*:1:2 quota/quota.unlimited:1:3"; got != want {
		t.Errorf("usage %s, want %s (latest reports; no rule, no usage)", got, want)
	}

	// A reload that changes acme's limit pushes one response.
	rules.set(t, strings.Replace(rulesYAML, "requests_per_unit: 100, unit: second", "requests_per_unit: 50, unit: second", 1))
	f.srv.Reload()
	if recvWithin(t, st, 5*time.Second) == nil {
		t.Fatal("no push")
	}
	if s := f.srv.Stats(); s.Pushes != 1 || s.Assignments.TokenBucket != 5 {
		t.Errorf("after the push: pushes %d, token bucket assignments %d, want 1 and 5", s.Pushes, s.Assignments.TokenBucket)
	}

	// Bad input ends a stream, counted by code.
	bad := f.rawStream(t)
	if _, err := exchange(t, bad, ""); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("report without a domain: %v, want InvalidArgument", err)
	}
	st.CloseSend()
	deadline := time.Now().Add(5 * time.Second)
	for f.srv.Streams() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the streams did not end")
		}
		time.Sleep(time.Millisecond)
	}
	s = f.srv.Stats()
	if s.Buckets != 0 || s.Pools != 0 || len(s.Usage) != 0 {
		t.Errorf("after the streams ended: buckets %d pools %d usage %v, want none", s.Buckets, s.Pools, s.Usage)
	}
	if s.StreamErrors[codes.InvalidArgument] != 1 || len(s.StreamErrors) != 1 {
		t.Errorf("stream errors %v, want InvalidArgument: 1 alone (a client's end is no error)", s.StreamErrors)
	}
}

// TestStatsBudget: with a budget store, each rule's usage carries the
// budget this replica holds for it and what its streams are assigned,
// the store's operations are counted by kind, and a stream that ends
// gives its pools' leases back.
func TestStatsBudget(t *testing.T) {
	clk := clocktest.New(time.Unix(1_700_000_000, 0))
	store := memory.New(memory.Options{Now: clk.Now})
	t.Cleanup(func() { store.Close() })
	f := startOn(t, rlqs.Options{Budget: store}, clk)
	a, b := f.sim(t), f.sim(t)
	for range 6 {
		drive(t, f, []*rlqssim.Client{a, b}, []float64{80, 80})
	}
	// A renewal behind an answer may still be on its way: the lease is
	// held again once it settles.
	s := f.srv.Stats()
	for deadline := time.Now().Add(5 * time.Second); len(s.Usage) == 1 && s.Usage[0].Held == 0 && time.Now().Before(deadline); s = f.srv.Stats() {
		time.Sleep(time.Millisecond)
	}
	settled(t, a, b)
	if len(s.Usage) != 1 {
		t.Fatalf("usage %+v, want acme's rule alone", s.Usage)
	}
	u := s.Usage[0]
	if u.Rule != "quota.name_acme.route" || u.Held < 900 || u.Held > 1000 || u.Assigned > u.Held || math.Abs(float64(u.Assigned)-10*(share(a)+share(b))) > 1e-6 {
		t.Errorf("usage %+v: want acme holding 900 to 1,000 units (per 10 s), assigned %v+%v per second within it", u, share(a), share(b))
	}
	if ops := s.Budget; ops.Takes == 0 || ops.Reads == 0 || ops.Failed != 0 {
		t.Errorf("budget operations %+v: want takes and reads (demand over the limit makes it contended), no failure", ops)
	}
	gives := f.srv.Stats().Budget.Gives
	a.Close()
	b.Close()
	// The leases go back as the streams end, or as a renewal still on its
	// way settles.
	var e *rlqs.Explanation
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		s := f.srv.Stats()
		var err error
		if e, err = f.srv.Explain(context.Background(), "quota", acmeBucket); err != nil {
			t.Fatal(err)
		}
		if s.Streams == 0 && s.Budget.Gives > gives && len(s.Usage) == 0 && e.Budget.Held == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5s after the streams ended: streams %d, gives %d (was %d), usage %+v, the store holds %+v for acme; want the leases given back",
				s.Streams, s.Budget.Gives, gives, s.Usage, e.Budget)
		}
	}
}
