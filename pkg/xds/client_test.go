package xds_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/internal/xdstest"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/xds"
)

// wait bounds every wait of these tests.
const wait = 10 * time.Second

// sink records what OnRules and OnReject receive.
type sink struct {
	mu       sync.Mutex
	rules    *config.Rules
	version  string
	versions []string
	rejected []error
}

func (s *sink) reject(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rejected = append(s.rejected, err)
}

// rejections returns the errors OnReject received.
func (s *sink) rejections() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.rejected)
}

func (s *sink) on(r *config.Rules, v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rules, s.version = r, v
	s.versions = append(s.versions, v)
}

func (s *sink) get() (*config.Rules, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rules, s.version
}

// waitVersion waits until OnRules received version.
func (s *sink) waitVersion(t *testing.T, version string) *config.Rules {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		if r, v := s.get(); v == version {
			return r
		}
		if time.Now().After(deadline) {
			_, v := s.get()
			t.Fatalf("rules of version %q not delivered within %v; last %q", version, wait, v)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// run starts a client with opts (Server and OnRules filled in) and stops
// it when t ends.
func run(t *testing.T, srv *xdstest.Server, opts xds.Options) (*xds.Client, *sink) {
	t.Helper()
	s := &sink{}
	opts.Server, opts.OnRules, opts.OnReject = srv.Addr, s.on, s.reject
	if opts.BackoffInitial == 0 {
		opts.BackoffInitial, opts.BackoffMax = 20*time.Millisecond, 200*time.Millisecond
	}
	c, err := xds.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(wait):
			t.Errorf("Run did not return within %v of its context's end", wait)
		}
	})
	return c, s
}

func limitOf(t *testing.T, r *config.Rules, domain string) uint32 {
	t.Helper()
	d := r.Domain(domain)
	if d == nil || len(d.Rules()) != 1 {
		t.Fatalf("domain %q missing or not one rule: %v", domain, d)
	}
	return d.Rules()[0].RequestsPerUnit
}

// TestSnapshotsAckAndNack follows one stream: the first snapshot is
// delivered and ACKed, a new one takes effect, an invalid one is NACKed
// with the parser's error while the last good rules stay, and a fixed one
// is taken again.
func TestSnapshotsAckAndNack(t *testing.T) {
	t.Parallel()
	srv := xdstest.Start(t, nil)
	srv.Set(t, "rl-1", "v1", xdstest.Limit("api", "api", "path", "/login", 5, rlsconfv3.RateLimitUnit_MINUTE))
	c, s := run(t, srv, xds.Options{NodeID: "rl-1", NodeMetadata: map[string]string{"region": "eu", "pod": "rl-1-abc"},
		Headers: map[string]string{"authorization": "Bearer t0ken"}})

	select {
	case <-c.Ready():
	case <-time.After(wait):
		t.Fatal("not ready within the wait")
	}
	r := s.waitVersion(t, "v1")
	if n := limitOf(t, r, "api"); n != 5 {
		t.Fatalf("limit %d, want 5", n)
	}
	if f := r.Files(); len(f) != 1 || f[0] != "xds:api" {
		t.Fatalf("files %v", f)
	}
	srv.WaitRequest(t, wait, "ACK of v1", xdstest.ACK("v1"))
	node := srv.Node()
	if node.GetId() != "rl-1" || node.GetMetadata().GetFields()["region"].GetStringValue() != "eu" ||
		node.GetMetadata().GetFields()["pod"].GetStringValue() != "rl-1-abc" {
		t.Fatalf("node %v", node)
	}
	if h := srv.Header("authorization"); len(h) != 1 || h[0] != "Bearer t0ken" {
		t.Fatalf("authorization metadata %q", h)
	}
	if st := c.Status(); st.Version != "v1" || !st.Connected || st.Updates != 1 || st.LastError != "" || st.LastUpdate.IsZero() {
		t.Fatalf("status %+v", st)
	}

	// A new snapshot takes effect.
	srv.Set(t, "rl-1", "v2", xdstest.Limit("api", "api", "path", "/login", 7, rlsconfv3.RateLimitUnit_MINUTE),
		xdstest.Limit("mail", "mail", "to", "", 1, rlsconfv3.RateLimitUnit_HOUR))
	r = s.waitVersion(t, "v2")
	if n := limitOf(t, r, "api"); n != 7 || r.Domain("mail") == nil {
		t.Fatalf("v2: api limit %d, mail %v", n, r.Domain("mail"))
	}
	srv.WaitRequest(t, wait, "ACK of v2", xdstest.ACK("v2"))

	// An invalid one: a unit the enum does not know ("fortnight" has no
	// number) and a replaces naming nothing. NACKed with the parser's
	// text, naming the resource; v2 stays.
	bad := xdstest.Limit("api", "api", "path", "/login", 9, 99)
	bad.Descriptors[0].RateLimit.Replaces = []*rlsconfv3.RateLimitReplace{{Name: "ghost"}}
	srv.Set(t, "rl-1", "v3", bad)
	nack := srv.WaitRequest(t, wait, "NACK of v3", xdstest.NACK("v2", `unknown unit "99"`))
	if msg := nack.GetErrorDetail().GetMessage(); !strings.Contains(msg, "xds:api:") || !strings.Contains(msg, "descriptors[0].rate_limit.unit") {
		t.Fatalf("NACK text %q does not name the resource and field", msg)
	}
	st := c.Status()
	if st.Version != "v2" || st.Rejections == 0 || !strings.Contains(st.LastError, `unknown unit "99"`) {
		t.Fatalf("status after the NACK %+v", st)
	}
	if r, v := s.get(); v != "v2" || limitOf(t, r, "api") != 7 {
		t.Fatalf("rules in force %q, want v2's", v)
	}
	if rej := s.rejections(); len(rej) == 0 || !strings.Contains(rej[0].Error(), `unknown unit "99"`) {
		t.Fatalf("OnReject received %v, want the NACK's error", rej)
	}

	// The snapshot cache sends v3 again at once after each NACK; the
	// client answers repeats after a growing wait, so they stay few.
	time.Sleep(500 * time.Millisecond)
	nacks := 0
	for _, r := range srv.Requests() {
		if r.GetErrorDetail() != nil {
			nacks++
		}
	}
	if nacks > 20 { // spinning, it would be hundreds; spaced, about 8
		t.Fatalf("%d NACKs in half a second: the client and the cache spin", nacks)
	}

	// Fixed: taken again, the error cleared.
	srv.Set(t, "rl-1", "v4", xdstest.Limit("api", "api", "path", "/login", 11, rlsconfv3.RateLimitUnit_SECOND))
	r = s.waitVersion(t, "v4")
	if n := limitOf(t, r, "api"); n != 11 {
		t.Fatalf("v4 limit %d", n)
	}
	srv.WaitRequest(t, wait, "ACK of v4", xdstest.ACK("v4"))
	if st := c.Status(); st.LastError != "" || st.Version != "v4" {
		t.Fatalf("status after the fix %+v", st)
	}
}

// TestEmptySnapshotRemovesRules: each response is the whole state.
func TestEmptySnapshotRemovesRules(t *testing.T) {
	t.Parallel()
	srv := xdstest.Start(t, nil)
	srv.Set(t, "default", "1", xdstest.Limit("a", "a", "k", "", 1, rlsconfv3.RateLimitUnit_SECOND))
	_, s := run(t, srv, xds.Options{})
	s.waitVersion(t, "1")
	srv.Set(t, "default", "2")
	if r := s.waitVersion(t, "2"); len(r.Domains()) != 0 {
		t.Fatalf("domains %v after an empty snapshot", r.Domains())
	}
}

// TestReconnect: the server goes away and comes back; the client
// reconnects with backoff, subscribes again with the version it has, and
// takes what the server now serves.
func TestReconnect(t *testing.T) {
	t.Parallel()
	srv := xdstest.Start(t, nil)
	srv.Set(t, "default", "1", xdstest.Limit("a", "a", "k", "", 1, rlsconfv3.RateLimitUnit_SECOND))
	var mu sync.Mutex
	var waits []time.Duration
	c, s := run(t, srv, xds.Options{
		BackoffInitial: 40 * time.Millisecond, BackoffMax: 160 * time.Millisecond,
		After: func(d time.Duration) <-chan time.Time {
			mu.Lock()
			waits = append(waits, d)
			mu.Unlock()
			return time.After(d)
		},
	})
	s.waitVersion(t, "1")
	srv.WaitRequest(t, wait, "ACK of 1", xdstest.ACK("1"))

	srv.Stop()
	deadline := time.Now().Add(wait)
	for c.Status().StreamErrors < 4 { // several attempts against nothing
		if time.Now().After(deadline) {
			t.Fatalf("status %+v: no reconnect attempts", c.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := c.Status(); st.Connected || st.StreamError == "" || st.Version != "1" {
		t.Fatalf("status while down %+v", st)
	}
	srv.Set(t, "default", "2", xdstest.Limit("a", "a", "k", "", 2, rlsconfv3.RateLimitUnit_SECOND))
	opens := srv.Opens()
	srv.Restart(t)
	if r := s.waitVersion(t, "2"); limitOf(t, r, "a") != 2 {
		t.Fatal("rules of 2 not in force after the restart")
	}
	if srv.Opens() <= opens {
		t.Fatalf("streams opened %d, before the restart %d", srv.Opens(), opens)
	}
	// The first request of the new stream carried the version in force.
	srv.WaitRequest(t, wait, "a subscription with version 1", func(r *discoveryv3.DiscoveryRequest) bool {
		return r.GetVersionInfo() == "1" && r.GetResponseNonce() == ""
	})
	if !c.Status().Connected {
		t.Fatal("not connected after the restart")
	}

	// The waits doubled from 40ms towards 160ms, each between half and
	// all of its step.
	mu.Lock()
	defer mu.Unlock()
	if len(waits) < 3 {
		t.Fatalf("waits %v", waits)
	}
	steps := []time.Duration{40 * time.Millisecond, 80 * time.Millisecond, 160 * time.Millisecond, 160 * time.Millisecond}
	for i, w := range waits[:min(len(waits), len(steps))] {
		if w < steps[i]/2 || w > steps[i] {
			t.Errorf("wait %d: %v, want within [%v, %v]", i, w, steps[i]/2, steps[i])
		}
	}
}

// TestMutualTLS: a control plane that requires client certificates serves
// a client with one, and refuses a client without.
func TestMutualTLS(t *testing.T) {
	t.Parallel()
	certs := redistest.WriteCerts(t)
	srv := xdstest.Start(t, certs.MutualServer())
	srv.Set(t, "default", "1", xdstest.Limit("a", "a", "k", "", 3, rlsconfv3.RateLimitUnit_SECOND))

	// The certificate names localhost and 127.0.0.1; ServerName checks
	// the name given, not the address dialed.
	c, s := run(t, srv, xds.Options{TLS: xds.TLS{CA: certs.CA, Cert: certs.Cert, Key: certs.Key, ServerName: "localhost"}})
	if r := s.waitVersion(t, "1"); limitOf(t, r, "a") != 3 {
		t.Fatal("wrong rules over mTLS")
	}
	srv.WaitRequest(t, wait, "ACK over mTLS", xdstest.ACK("1"))
	if !c.Status().Connected {
		t.Fatal("not connected")
	}

	noCert, s2 := run(t, srv, xds.Options{TLS: xds.TLS{CA: certs.CA}})
	deadline := time.Now().Add(wait)
	for noCert.Status().StreamErrors < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("a client without a certificate: status %+v", noCert.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r, _ := s2.get(); r != nil {
		t.Fatal("a client without a certificate got rules")
	}

	wrongName, s3 := run(t, srv, xds.Options{TLS: xds.TLS{CA: certs.CA, Cert: certs.Cert, Key: certs.Key, ServerName: "not-the-server"}})
	for wrongName.Status().StreamErrors < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("a wrong server name: status %+v", wrongName.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r, _ := s3.get(); r != nil || !strings.Contains(wrongName.Status().StreamError, "not-the-server") {
		t.Fatalf("a wrong server name: %+v", wrongName.Status())
	}
}

func TestNewChecks(t *testing.T) {
	on := func(*config.Rules, string) {}
	for name, opts := range map[string]xds.Options{
		"no server":          {OnRules: on},
		"no OnRules":         {Server: "x:1"},
		"backoff max < init": {Server: "x:1", OnRules: on, BackoffInitial: time.Second, BackoffMax: time.Millisecond},
		"cert without key":   {Server: "x:1", OnRules: on, TLS: xds.TLS{Cert: "c.pem"}},
		"missing CA file":    {Server: "x:1", OnRules: on, TLS: xds.TLS{CA: "/nonexistent/ca.pem"}},
	} {
		if _, err := xds.New(opts); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
}
