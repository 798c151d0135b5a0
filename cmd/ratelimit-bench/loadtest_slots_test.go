package main

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

// TestSlotsRules loads the slots group's rule with the project's config
// package beside the load test's other rules: a concurrency limit on any
// value of the key, with room for the callers.
func TestSlotsRules(t *testing.T) {
	dir := t.TempDir()
	if err := writeRules(dir, "user_id"); err != nil {
		t.Fatal(err)
	}
	if err := checkSlotsRules(dir, "user_id", 50); err == nil || !strings.Contains(err.Error(), "no domain slots") {
		t.Errorf("rules without the slots domain: %v", err)
	}
	if err := writeSlotsRules(dir, "user_id"); err != nil {
		t.Fatal(err)
	}
	if err := checkSlotsRules(dir, "user_id", 50); err != nil {
		t.Errorf("the load test's own rules: %v", err)
	}
	if err := checkSlotsRules(dir, "user_id", slotsMaxInFlight+1); err == nil || !strings.Contains(err.Error(), "fewer than the 1001 callers") {
		t.Errorf("more callers than slots: %v", err)
	}
	if err := checkSlotsRules(dir, "account", 50); err == nil || !strings.Contains(err.Error(), "no concurrency limit for (account, user-0)") {
		t.Errorf("another key: %v", err)
	}
	if g, err := parseScenarios("slots"); err != nil || len(g) != 1 || !g[groupSlots] {
		t.Errorf("-scenarios slots: %v, %v", g, err)
	}
}

func TestSlotsRuns(t *testing.T) {
	lt := &loadtest{cfg: &loadtestConfig{Workers: 50, Conns: 4, Keys: 10_000}}
	runs := lt.slotsRuns("ratelimitd, Redis (FCALL)")
	want := []struct{ workers, keys int }{{50, 10_000}, {50, 1}, {1, 10_000}}
	if len(runs) != len(want) {
		t.Fatalf("%d runs, want %d", len(runs), len(want))
	}
	for i, g := range runs {
		if g.workers != want[i].workers || g.keys != want[i].keys || g.conns > g.workers || g.conns < 1 {
			t.Errorf("run %d: %+v, want %d callers over %d keys", i, g, want[i].workers, want[i].keys)
		}
		if !strings.HasPrefix(g.name, "ratelimitd, Redis (FCALL): Acquire+Release pairs, ") {
			t.Errorf("run %d: name %q", i, g.name)
		}
	}
	if !strings.Contains(runs[1].name, "one key (up to 50 slots held)") {
		t.Errorf("the hot key's run: %q", runs[1].name)
	}
}

// TestSlotsCodec encodes what the server sends with the generated types
// and reads it back with the generator's parsers, and the other way for
// the Release the generator sends.
func TestSlotsCodec(t *testing.T) {
	marshal := func(m proto.Message) mem.BufferSlice {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}
	}
	results := []*ratelimitdv1.DescriptorResult{{
		Outcome: ratelimitdv1.Outcome_OUTCOME_OK, Rule: "slots.user_id", Remaining: 999,
		Concurrency: &ratelimitdv1.ConcurrencyState{InFlight: 1, MaxInFlight: 1000, LeaseTtl: durationpb.New(30 * time.Second)},
	}}
	var acq acquireReply
	if err := (slotsCodec{}).Unmarshal(marshal(&ratelimitdv1.AcquireResponse{Allowed: true, LeaseId: "rl1.AAAA-_x", Ttl: durationpb.New(30 * time.Second), Results: results}), &acq); err != nil {
		t.Fatal(err)
	}
	if !acq.allowed || string(acq.lease) != "rl1.AAAA-_x" {
		t.Errorf("admitted: %+v", acq)
	}
	// The same reply, reused for a refusal: nothing of the last stays.
	refused := marshal(&ratelimitdv1.AcquireResponse{Results: results})
	// Split over two buffers, as a large message may be.
	b := refused.Materialize()
	split := mem.BufferSlice{mem.SliceBuffer(b[:3]), mem.SliceBuffer(b[3:])}
	if err := (slotsCodec{}).Unmarshal(split, &acq); err != nil {
		t.Fatal(err)
	}
	if acq.allowed || len(acq.lease) != 0 {
		t.Errorf("refused: %+v", acq)
	}
	if err := acq.parse([]byte{0x12, 0x05, 'a'}); err == nil {
		t.Error("a truncated lease id parsed")
	}

	var rel releaseReply
	for _, released := range []bool{true, false} {
		if err := (slotsCodec{}).Unmarshal(marshal(&ratelimitdv1.ReleaseResponse{Released: released}), &rel); err != nil || rel.released != released {
			t.Errorf("released %v: read %+v, %v", released, rel, err)
		}
	}

	var req ratelimitdv1.ReleaseRequest
	lease := strings.Repeat("rl1.x", 40) // longer than one length byte
	if err := proto.Unmarshal(appendReleaseRequest([]byte("junk")[:0], []byte(lease)), &req); err != nil || req.LeaseId != lease {
		t.Errorf("the Release sent: %v, %v", &req, err)
	}
	if err := (slotsCodec{}).Unmarshal(nil, &reply{}); err == nil {
		t.Error("the slots codec read into a reply of ShouldRateLimit")
	}
}

func TestPairsRow(t *testing.T) {
	stats := []*pairStats{{errors: map[string]uint64{}}, {errors: map[string]uint64{"Release Unavailable": 2}}}
	for i := range 1000 {
		stats[i%2].latency.record(time.Duration(100+i) * time.Microsecond)
		stats[i%2].pairs++
	}
	stats[1].refused, stats[0].notReleased = 3, 1
	cpu := map[string]time.Duration{"ratelimitd": 40 * time.Millisecond, "redis": 20 * time.Millisecond, "ratelimit-bench": 10 * time.Millisecond}
	row := pairsRow("pairs", "ratelimitd", stats, 2*time.Second, cpu, 2000)
	if row.DecisionsPerS != 500 || row.ServerCPU != 40 || row.RedisCPU != 20 || row.BenchCPU != 10 || row.DecisionsPerCall != 0.5 {
		t.Errorf("row %+v: want 500 pairs/s, 40, 20 and 10 CPU-µs per pair, 0.5 pairs per Redis call", row)
	}
	if p50 := row.P50; p50 < 595 || p50 > 605 { // the histogram is within 1/128
		t.Errorf("p50 %vµs, want about 600µs", p50)
	}
	notes := strings.Join(row.Notes, "\n")
	for _, want := range []string{"per Acquire+Release pair", "Redis ran 2.00 script calls per pair", "3 Acquires refused", "1 of 1000 Releases answered released false", "errors: Release Unavailable 2"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes\n%s\nwant %q", notes, want)
		}
	}

	none := pairsRow("none", "ratelimitd", []*pairStats{{errors: map[string]uint64{}}}, time.Second, cpu, 0)
	if none.DecisionsPerS != 0 || none.P50 != -1 || none.ServerCPU != -1 || !math.IsInf(none.DecisionsPerCall, 1) {
		t.Errorf("no pair: %+v", none)
	}
	if uncounted := pairsRow("x", "floor-server", stats, time.Second, cpu, -1); uncounted.DecisionsPerCall != -1 || uncounted.ServerCPU != -1 {
		t.Errorf("calls not counted, server not measured: %+v", uncounted)
	}
}

func TestComparePairs(t *testing.T) {
	pairs := scenario{DecisionsPerS: 10_000, P50: 4000, ServerCPU: 60, RedisCPU: 30}
	decision := scenario{DecisionsPerS: 20_000, P50: 2000, ServerCPU: 40, RedisCPU: 12}
	notes := comparePairs(pairs, decision, 50)
	for _, want := range []string{
		"Redis CPU-µs per pair 2.50× one exact decision's (30.0 against 12.0 at 50 callers)",
		"ratelimitd CPU-µs per pair 1.50× one exact decision's (60.0 against 40.0 at 50 callers)",
		"p50 per pair 2.00× one exact decision's (4.00ms against 2.00ms at 50 callers)",
		"pairs/s 0.50× the decisions/s (10,000 against 20,000 at 50 callers)",
	} {
		if !slices.Contains(notes, want) {
			t.Errorf("notes %q, want %q", notes, want)
		}
	}
	if notes := comparePairs(pairs, scenario{RedisCPU: -1, ServerCPU: -1, P50: -1}, 50); len(notes) != 0 {
		t.Errorf("nothing to compare with: %q", notes)
	}
}
