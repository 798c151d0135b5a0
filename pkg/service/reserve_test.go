package service

import (
	"context"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// reserveRules is a token budget of 1,000 per window for each user, in
// the shape of Envoy AI Gateway's (domain ai-gateway-quota), reserving
// reserve at each request-time call.
func reserveRules(unit, reserve string) string {
	return `domain: ai-gateway-quota
descriptors:
  - key: user
    rate_limit: {requests_per_unit: 1000, unit: ` + unit + `, reserve: ` + reserve + `}
  - key: tenant
    rate_limit: {requests_per_unit: 5, unit: hour}
  - key: bucket
    rate_limit: {requests_per_unit: 1000, unit: hour, algorithm: token_bucket}
`
}

// requestTime is the call Envoy's ratelimit filter makes as a request
// starts (Filter::initiateCall): descriptors without a hits_addend of
// their own.
func (f *fixture) requestTime(t *testing.T, ds ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	return f.call(t, request("ai-gateway-quota", ds...))
}

// streamDone is the call Envoy makes once the stream has ended
// (Filter::onDestroy, OnStreamDoneCallBack): the descriptor with the cost
// as its hits_addend.
func (f *fixture) streamDone(t *testing.T, cost uint64, kv ...string) *rlsv3.RateLimitResponse {
	t.Helper()
	d := desc(kv...)
	d.HitsAddend = wrapperspb.UInt64(cost)
	return f.call(t, request("ai-gateway-quota", d))
}

// expect checks a one-descriptor answer's code and limit_remaining.
func expect(t *testing.T, what string, resp *rlsv3.RateLimitResponse, code rlsv3.RateLimitResponse_Code, remaining uint32) {
	t.Helper()
	st := resp.Statuses[0]
	if resp.OverallCode != code || st.Code != code || st.LimitRemaining != remaining {
		t.Errorf("%s: %v (descriptor %v), %d remaining; want %v, %d", what, resp.OverallCode, st.Code, st.LimitRemaining, code, remaining)
	}
}

// TestReservationsHoldUntilSettled: a request-time call holds its
// reservation and is refused when it does not fit what is charged and
// held; a stream-done call charges its cost and releases one; a settle
// with none outstanding is charged and releases nothing; every answer's
// remaining is limit − charged − held. A server counting only after the
// fact admits the fourth stream (and any number more).
func TestReservationsHoldUntilSettled(t *testing.T) {
	f := newFixture(t, reserveRules("minute", "300"))
	alice := desc("user", "alice")
	for i, want := range []uint32{700, 400, 100} {
		expect(t, "stream "+string(rune('1'+i)), f.requestTime(t, alice), rlsv3.RateLimitResponse_OK, want)
	}
	expect(t, "a fourth stream: 300 do not fit in 100", f.requestTime(t, alice), rlsv3.RateLimitResponse_OVER_LIMIT, 100)
	expect(t, "the first stream's 250", f.streamDone(t, 250, "user", "alice"), rlsv3.RateLimitResponse_OK, 150)
	expect(t, "a stream after it", f.requestTime(t, alice), rlsv3.RateLimitResponse_OVER_LIMIT, 150)
	expect(t, "the second's 300", f.streamDone(t, 300, "user", "alice"), rlsv3.RateLimitResponse_OK, 150)
	expect(t, "the third's 300", f.streamDone(t, 300, "user", "alice"), rlsv3.RateLimitResponse_OK, 150)
	// No reservation outstanding: charged all the same, nothing released.
	expect(t, "a cost with no reservation", f.streamDone(t, 100, "user", "alice"), rlsv3.RateLimitResponse_OK, 50)
	expect(t, "a cost of 0", f.streamDone(t, 0, "user", "alice"), rlsv3.RateLimitResponse_OK, 50)
	f.clock.Advance(time.Minute)
	expect(t, "the next window", f.requestTime(t, alice), rlsv3.RateLimitResponse_OK, 700)
	// Bob's counter is his own.
	expect(t, "another user", f.requestTime(t, desc("user", "bob")), rlsv3.RateLimitResponse_OK, 700)
}

// TestReservationsEndOnTheirOwn: reservations never settled (a failed
// upstream, a client gone) stop holding budget after their lifetime, a
// 30 s before anything is learnt.
func TestReservationsEndOnTheirOwn(t *testing.T) {
	f := newFixture(t, reserveRules("hour", "300"))
	alice := desc("user", "alice")
	for range 3 {
		f.requestTime(t, alice)
	}
	expect(t, "while held", f.requestTime(t, alice), rlsv3.RateLimitResponse_OVER_LIMIT, 100)
	f.clock.Advance(reserveColdTTL + reserveColdTTL/16 + time.Millisecond)
	expect(t, "once they ended", f.requestTime(t, alice), rlsv3.RateLimitResponse_OK, 700)
}

// TestSettleCountsInARefusedRequest: a stream-done call whose request
// another descriptor refuses is charged all the same: the cost was spent.
func TestSettleCountsInARefusedRequest(t *testing.T) {
	f := newFixture(t, reserveRules("hour", "300"))
	f.requestTime(t, desc("user", "alice"))
	over := desc("tenant", "t1")
	over.HitsAddend = wrapperspb.UInt64(6) // 6 of 5: refused, nothing counted (drop)
	done := desc("user", "alice")
	done.HitsAddend = wrapperspb.UInt64(200)
	resp := f.call(t, request("ai-gateway-quota", done, over))
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("overall %v, want OVER_LIMIT from the tenant's limit", resp.OverallCode)
	}
	expect(t, "after the refused request", f.requestTime(t, desc("user", "alice")), rlsv3.RateLimitResponse_OK, 500)
}

// TestReserveAutoLearns: with reserve: auto a limit reserves a sixteenth
// of itself until it has seen 10 costs, then the 97th percentile of the
// last 256; how long reservations last follows the check-to-settle times,
// from 30 s down to six times their median: 12 s for streams of 2 s.
func TestReserveAutoLearns(t *testing.T) {
	f := newFixture(t, `domain: ai-gateway-quota
descriptors:
  - key: user
    rate_limit: {requests_per_unit: 1600000, unit: day, reserve: auto}
`)
	alice := desc("user", "alice")
	first := f.requestTime(t, alice).Statuses[0].LimitRemaining
	if first != 1500000 {
		t.Fatalf("cold: %d remaining, want 1,500,000 (a sixteenth reserved)", first)
	}
	f.streamDone(t, 10, "user", "alice")
	for i := range 320 {
		f.requestTime(t, alice)
		f.clock.Advance(2 * time.Second)
		f.streamDone(t, uint64(100+i), "user", "alice") // costs 100 to 419
	}
	st := f.svc.Reservations()
	if len(st) != 1 {
		t.Fatalf("%d learnt limits, want 1: %+v", len(st), st)
	}
	// Learnt at the 320th settle: the last 256 costs are 163 to 418, whose
	// 97th percentile (the 249th) is 411.
	if s := st[0]; !s.Auto || s.Hits != 411 || s.Settles != 321 || s.Released != 321 || s.TTL != 12*time.Second {
		t.Fatalf("learnt %+v; want a reservation of 411, 321 settles all releasing one, a lifetime of 12 s", s)
	}
	a := f.requestTime(t, alice).Statuses[0].LimitRemaining
	b := f.requestTime(t, alice).Statuses[0].LimitRemaining
	if a-b != 411 {
		t.Fatalf("a request-time call held %d, want the learnt 411", a-b)
	}
}

// TestServerDefaultReserve: Options.Reserve applies to the fixed windows
// whose rule does not set reserve, not to other algorithms, and not to a
// rule that sets reserve: off.
func TestServerDefaultReserve(t *testing.T) {
	clk := clocktest.New(start)
	be := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { be.Close() })
	f := newFixtureOpts(t, reserveRules("hour", "off")+`  - key: plain
    rate_limit: {requests_per_unit: 1000, unit: hour}
`, be, clk, Options{Reserve: config.Reserve{Mode: config.ReserveFixed, Hits: 100}, Now: clk.Now})
	expect(t, "a fixed window without reserve", f.requestTime(t, desc("plain", "x")), rlsv3.RateLimitResponse_OK, 900)
	expect(t, "a token bucket", f.requestTime(t, desc("bucket", "x")), rlsv3.RateLimitResponse_OK, 999)
	expect(t, "reserve: off", f.requestTime(t, desc("user", "x")), rlsv3.RateLimitResponse_OK, 999)
}

// TestReserveExplained: POST /explain names each limit's reservation and
// what this replica learnt (cold: a sixteenth of 1,000); GET /rlconfig
// names the reservation.
func TestReserveExplained(t *testing.T) {
	f := newFixture(t, reserveRules("hour", "auto"))
	f.requestTime(t, desc("user", "alice"))
	f.streamDone(t, 80, "user", "alice")
	code, _, body := f.http(t, "POST", "/explain", `{"domain": "ai-gateway-quota", "descriptors": [{"entries": [{"key": "user", "value": "alice"}]}]}`)
	for _, want := range []string{`"reserve":"auto"`, `"reserveHits":63`, `"reserveTtl":"30s"`, `"settles":1`, `"settlesReleased":1`} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("explain lacks %s: %d %s", want, code, body)
		}
	}
	if _, _, rc := f.http(t, "GET", "/rlconfig", ""); !strings.Contains(rc, "ai-gateway-quota.user: unit=HOUR requests_per_unit=1000, shadow_mode: false, algorithm: fixed_window, reserve: auto") {
		t.Errorf("/rlconfig lacks the reservation:\n%s", rc)
	}
}

// BenchmarkReservations compares, on the memory backend, an exact
// decision with the two calls of a stream that reserves: the request-time
// call (a reservation) and the stream-done call (a settle); per call.
func BenchmarkReservations(b *testing.B) {
	rules, err := config.Parse(config.File{Name: "r.yaml", Data: []byte(`domain: ai-gateway-quota
descriptors:
  - key: exact
    rate_limit: {requests_per_unit: 4294967295, unit: hour}
  - key: user
    rate_limit: {requests_per_unit: 4294967295, unit: hour, reserve: 700}
`)})
	if err != nil {
		b.Fatal(err)
	}
	be := memory.New(memory.Options{})
	defer be.Close()
	svc, err := New(be, rules, Options{})
	if err != nil {
		b.Fatal(err)
	}
	done := desc("user", "alice")
	done.HitsAddend = wrapperspb.UInt64(650)
	for _, c := range []struct {
		name  string
		calls []*rlsv3.RateLimitRequest
	}{
		{"exact", []*rlsv3.RateLimitRequest{request("ai-gateway-quota", desc("exact", "alice"))}},
		{"request_time+stream_done", []*rlsv3.RateLimitRequest{request("ai-gateway-quota", desc("user", "alice")), request("ai-gateway-quota", done)}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				for _, req := range c.calls {
					if _, err := svc.ShouldRateLimit(context.Background(), req); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(c.calls)), "ns/call")
		})
	}
}

// TestReserveLifetimeGrowsWhileSettlesAreLate: settles that find no
// reservation (theirs ended first) make the lifetime grow by half at the
// end of each run of 64 settles in which they are more than 5%, and only
// then; the times of the reservations released set it otherwise. Without
// the rule a lifetime shorter than the streams never grows: the
// reservations released are the younger ones. Judged over the whole
// history instead of each run, one late burst made it grow at every
// update, to 15 minutes.
func TestReserveLifetimeGrowsWhileSettlesAreLate(t *testing.T) {
	lr := newLearner(&config.Limit{RequestsPerUnit: 1000}, config.Reserve{Mode: config.ReserveAuto})
	settle := func(n int, d algo.Decision) {
		for range n {
			lr.settled(100, &d)
		}
	}
	held := algo.Decision{Taken: 100, Valid: time.Second}
	settle(64, held)
	if ttl := lr.state().TTL; ttl != 6*time.Second {
		t.Fatalf("lifetime %v after times of 1 s, want 6 s", ttl)
	}
	settle(61, held)
	settle(3, algo.Decision{}) // 3 late of 64: not more than 5%
	if ttl := lr.state().TTL; ttl != 6*time.Second {
		t.Fatalf("lifetime %v after 3 late settles of 64, want 6 s still", ttl)
	}
	settle(56, held)
	settle(8, algo.Decision{}) // 8 of 64
	if ttl := lr.state().TTL; ttl != 9*time.Second {
		t.Fatalf("lifetime %v after 8 late settles of 64, want 9 s", ttl)
	}
	settle(64, held)
	if ttl := lr.state().TTL; ttl != 6*time.Second {
		t.Fatalf("lifetime %v after a run without late settles, want 6 s again", ttl)
	}
}

// TestReserveLifetimeIgnoresOrphans: settles release the oldest
// reservation, often one whose stream failed, held as long as the
// lifetime let it; the lifetime, six times the median time, does not
// follow them while they are fewer than half. Learnt from a high
// percentile, it followed them: 20% of times at the lifetime made it
// double at every update (seen: 48 s against streams of 2 s).
func TestReserveLifetimeIgnoresOrphans(t *testing.T) {
	lr := newLearner(&config.Limit{RequestsPerUnit: 1000}, config.Reserve{Mode: config.ReserveAuto})
	for range 10 {
		ttl := lr.state().TTL
		for i := range 64 {
			held := time.Second
			if i%5 == 0 {
				held = ttl // an orphan, released when it was about to end
			}
			lr.settled(100, &algo.Decision{Taken: 100, Valid: held})
		}
	}
	if ttl := lr.state().TTL; ttl != 6*time.Second {
		t.Fatalf("lifetime %v with a fifth of the times at the lifetime, want 6 s: six times the median of 1 s", ttl)
	}
}
