package algo

import (
	"math/rand/v2"
	"testing"
	"time"
)

// step is Step by value: the new state when allowed, else s.
func step(s State, now time.Time, l Limit, hits uint64) (State, Decision) {
	d := Step(&s, now, l, hits)
	return s, d
}

// epoch is an arbitrary instant on a whole minute, so aligned windows of a
// second or a minute start exactly there.
var epoch = time.Unix(1_700_000_040, 0)

// TestFixedWindowNeverExceedsLimit drives random sequences and checks the
// algorithm's guarantee: at most N hits admitted per aligned window, and a
// decision's Remaining always equals N minus what the window has admitted.
func TestFixedWindowNeverExceedsLimit(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for run := range 200 {
		l := Limit{Requests: rng.Uint64N(20), Window: time.Duration(1+rng.IntN(5)) * time.Second}
		var s State
		admitted := map[int64]uint64{} // window start (µs) -> hits admitted
		at := epoch
		for range 300 {
			at = at.Add(time.Duration(rng.Int64N(int64(l.Window / 3))))
			hits := rng.Uint64N(4)
			next, d := step(s, at, l, hits)
			w := at.UnixMicro() - at.UnixMicro()%l.Window.Microseconds()
			if d.Allowed {
				admitted[w] += hits
			}
			if admitted[w] > l.Requests {
				t.Fatalf("run %d: window %d admitted %d > limit %d", run, w, admitted[w], l.Requests)
			}
			if want := l.Requests - admitted[w]; d.Remaining != want {
				t.Fatalf("run %d at %v: remaining %d, want %d", run, at, d.Remaining, want)
			}
			s = next
		}
	}
}

func TestAlgorithmNames(t *testing.T) {
	for _, a := range Algorithms() {
		got, err := ParseAlgorithm(a.String())
		if err != nil || got != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v; want %v", a.String(), got, err, a)
		}
	}
	if _, err := ParseAlgorithm("Fixed_Window"); err == nil {
		t.Error("ParseAlgorithm accepted a wrongly cased name")
	}
	_, err := ParseAlgorithm("leaky")
	if want := `unknown algorithm "leaky"; accepted: fixed_window, sliding_window_log, sliding_window_counter, token_bucket, leaky_bucket, gcra, burst_fill`; err == nil || err.Error() != want {
		t.Errorf("ParseAlgorithm(leaky) error = %v, want %q", err, want)
	}
}

// TestPropertiesMatchCheck checks that the properties rule validation
// reads agree with the bounds Check enforces: MaxLog bounds exactly the
// algorithms that log hits, MaxBucket those and the bucket algorithms.
func TestPropertiesMatchCheck(t *testing.T) {
	for _, a := range Algorithms() {
		overLog := Limit{Algorithm: a, Requests: MaxLog + 1, Window: time.Second}
		if refused := overLog.Check() != nil; refused != a.LogsHits() {
			t.Errorf("%v: Check refuses %d requests: %v; LogsHits: %v", a, overLog.Requests, refused, a.LogsHits())
		}
		overBucket := Limit{Algorithm: a, Requests: MaxBucket + 1, Window: time.Second}
		if refused := overBucket.Check() != nil; refused != (a.LogsHits() || a.UsesBurst()) {
			t.Errorf("%v: Check refuses %d requests: %v; LogsHits: %v, UsesBurst: %v", a, overBucket.Requests, refused, a.LogsHits(), a.UsesBurst())
		}
	}
}

// TestEveryUnleasableAlgorithmSaysWhy checks that an algorithm has a
// reason not to lease exactly when it does not, and that the reason is
// its own, not the fallback.
func TestEveryUnleasableAlgorithmSaysWhy(t *testing.T) {
	for _, a := range append(Algorithms(), Concurrency) {
		why := a.UnleasableReason()
		switch {
		case a.Leasable() && why != "":
			t.Errorf("%v leases, yet says it cannot because it %s", a, why)
		case !a.Leasable() && (why == "" || why == Algorithm(255).UnleasableReason()):
			t.Errorf("%v does not lease and says only %q", a, why)
		}
	}
}

// TestFullUntilAdmissible checks the property an over-limit cache relies
// on: after a refusal, hits counted past the limit keep refusing until the
// admissible instant the refusal named, and then no longer weigh, exactly
// for the algorithms that say so.
func TestFullUntilAdmissible(t *testing.T) {
	for _, a := range Algorithms() {
		l := Limit{Algorithm: a, Requests: 3, Window: time.Second}
		counting := func(hits uint64) *Request { return &Request{Limit: l, Hits: hits, Count: true} }
		var s State
		for range l.Requests {
			if d := Apply(&s, epoch, counting(1)); !d.Allowed {
				t.Fatalf("%v: refused a hit within the limit: %+v", a, d)
			}
		}
		refusal := Apply(&s, epoch, counting(1))
		if refusal.Allowed || refusal.RetryAfter <= 0 || refusal.RetryAfter == Never {
			t.Fatalf("%v: the hit past the limit got %+v, want a refusal with a retry", a, refusal)
		}
		if d := Apply(&s, epoch.Add(refusal.RetryAfter/2), counting(5)); d.Allowed {
			t.Fatalf("%v: admitted hits before the admissible instant: %+v", a, d)
		}
		d := Step(&s, epoch.Add(refusal.RetryAfter), l, 1)
		if d.Allowed != a.FullUntilAdmissible() {
			t.Errorf("%v: at the admissible instant, after counting past the limit, a hit is allowed: %v; FullUntilAdmissible: %v",
				a, d.Allowed, a.FullUntilAdmissible())
		}
	}
}

func TestStepUnknownAlgorithmRefuses(t *testing.T) {
	s := State{Time: 1, Count: 1}
	next, d := step(s, epoch, Limit{Algorithm: 200, Requests: 10, Window: time.Second}, 1)
	if d.Allowed || d.RetryAfter != Never || !next.Equal(s) {
		t.Errorf("unknown algorithm: got %+v and state %+v, want a refusal leaving the state alone", d, next)
	}
}

func BenchmarkStep(b *testing.B) {
	for _, a := range Algorithms() {
		b.Run(a.String(), func(b *testing.B) {
			// A hit every µs against 1000 per ms: mostly admitted, and
			// a sliding log of up to 1000 entries.
			l := Limit{Algorithm: a, Requests: 1000, Window: time.Millisecond}
			var s State
			now := epoch
			b.ReportAllocs()
			for b.Loop() {
				now = now.Add(time.Microsecond)
				Step(&s, now, l, 1)
			}
		})
	}
}
