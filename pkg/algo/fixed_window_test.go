package algo

import (
	"math/rand/v2"
	"testing"
	"time"
)

// epoch is an arbitrary instant on a whole minute, so aligned windows of a
// second or a minute start exactly there.
var epoch = time.Unix(1_700_000_040, 0)

type step struct {
	at   time.Duration // since epoch
	hits uint64
	want Decision
}

func runSteps(t *testing.T, l Limit, steps []step) {
	t.Helper()
	var s State
	for i, st := range steps {
		next, got := Step(s, epoch.Add(st.at), l, st.hits)
		if got != st.want {
			t.Fatalf("step %d (at %v, hits %d): got %+v, want %+v", i, st.at, st.hits, got, st.want)
		}
		if !got.Allowed && !next.Equal(s) {
			t.Fatalf("step %d: refused decision changed the state from %+v to %+v", i, s, next)
		}
		s = next
	}
}

func TestFixedWindow(t *testing.T) {
	sec := time.Second
	ms := time.Millisecond
	perSecond := func(n uint64) Limit { return Limit{Requests: n, Window: sec} }

	cases := []struct {
		name  string
		limit Limit
		steps []step
	}{
		{"fills then refuses until the aligned window ends", perSecond(2), []step{
			{0, 1, Decision{Allowed: true, Remaining: 1, ResetAfter: sec}},
			{250 * ms, 1, Decision{Allowed: true, Remaining: 0, ResetAfter: 750 * ms}},
			{500 * ms, 1, Decision{Remaining: 0, ResetAfter: 500 * ms, RetryAfter: 500 * ms}},
			{999 * ms, 1, Decision{Remaining: 0, ResetAfter: ms, RetryAfter: ms}},
			{sec, 1, Decision{Allowed: true, Remaining: 1, ResetAfter: sec}},
		}},
		{"window boundary admits 2N in a short span", perSecond(2), []step{
			{900 * ms, 2, Decision{Allowed: true, Remaining: 0, ResetAfter: 100 * ms}},
			{1000 * ms, 2, Decision{Allowed: true, Remaining: 0, ResetAfter: sec}},
		}},
		{"several hits are all or nothing", perSecond(5), []step{
			{0, 3, Decision{Allowed: true, Remaining: 2, ResetAfter: sec}},
			{10 * ms, 3, Decision{Remaining: 2, ResetAfter: 990 * ms, RetryAfter: 990 * ms}},
			{20 * ms, 2, Decision{Allowed: true, Remaining: 0, ResetAfter: 980 * ms}},
		}},
		{"hits above the limit are never admitted", perSecond(5), []step{
			{0, 6, Decision{Remaining: 5, RetryAfter: Never}},
			{10 * ms, 5, Decision{Allowed: true, Remaining: 0, ResetAfter: 990 * ms}},
			{20 * ms, 6, Decision{Remaining: 0, ResetAfter: 980 * ms, RetryAfter: Never}},
		}},
		{"zero hits peek without consuming", perSecond(3), []step{
			{0, 0, Decision{Allowed: true, Remaining: 3}},
			{0, 1, Decision{Allowed: true, Remaining: 2, ResetAfter: sec}},
			{500 * ms, 0, Decision{Allowed: true, Remaining: 2, ResetAfter: 500 * ms}},
		}},
		{"a limit of zero admits nothing", perSecond(0), []step{
			{0, 1, Decision{Remaining: 0, RetryAfter: Never}},
			{0, 0, Decision{Allowed: true, Remaining: 0}},
		}},
		{"an idle gap longer than the window forgets the count", perSecond(1), []step{
			{0, 1, Decision{Allowed: true, Remaining: 0, ResetAfter: sec}},
			{10 * sec, 1, Decision{Allowed: true, Remaining: 0, ResetAfter: sec}},
		}},
		{"a clock stepping back less than a window keeps the newer window", perSecond(2), []step{
			{5500 * ms, 2, Decision{Allowed: true, Remaining: 0, ResetAfter: 500 * ms}},
			// 0.7 s back: the window [5 s, 6 s) is still counting.
			{4800 * ms, 1, Decision{Remaining: 0, ResetAfter: 1200 * ms, RetryAfter: 1200 * ms}},
			{6 * sec, 1, Decision{Allowed: true, Remaining: 1, ResetAfter: sec}},
		}},
		{"a clock stepping back more than a window starts afresh", perSecond(2), []step{
			{5 * sec, 2, Decision{Allowed: true, Remaining: 0, ResetAfter: sec}},
			// 3 s back: the stored window is void rather than frozen for 3 s.
			{2 * sec, 1, Decision{Allowed: true, Remaining: 1, ResetAfter: sec}},
			{2500 * ms, 2, Decision{Remaining: 1, ResetAfter: 500 * ms, RetryAfter: 500 * ms}},
		}},
		{"a clock stepping forward starts a fresh window", perSecond(2), []step{
			{0, 2, Decision{Allowed: true, Remaining: 0, ResetAfter: sec}},
			{time.Hour + 300*ms, 1, Decision{Allowed: true, Remaining: 1, ResetAfter: 700 * ms}},
		}},
		{"minute windows align to the epoch", Limit{Requests: 10, Window: time.Minute}, []step{
			{45 * sec, 4, Decision{Allowed: true, Remaining: 6, ResetAfter: 15 * sec}},
			{59*sec + 999*ms, 6, Decision{Allowed: true, Remaining: 0, ResetAfter: ms}},
			{time.Minute, 10, Decision{Allowed: true, Remaining: 0, ResetAfter: time.Minute}},
		}},
		{"a window shorter than a microsecond counts as one", Limit{Requests: 1, Window: 0}, []step{
			{0, 1, Decision{Allowed: true, Remaining: 0, ResetAfter: time.Microsecond}},
			{0, 1, Decision{Remaining: 0, ResetAfter: time.Microsecond, RetryAfter: time.Microsecond}},
			{time.Microsecond, 1, Decision{Allowed: true, Remaining: 0, ResetAfter: time.Microsecond}},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { runSteps(t, c.limit, c.steps) })
	}
}

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
			next, d := Step(s, at, l, hits)
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

func TestStepUnknownAlgorithmRefuses(t *testing.T) {
	s := State{Time: 1, Count: 1}
	next, d := Step(s, epoch, Limit{Algorithm: 200, Requests: 10, Window: time.Second}, 1)
	if d.Allowed || d.RetryAfter != Never || !next.Equal(s) {
		t.Errorf("unknown algorithm: got %+v and state %+v, want a refusal leaving the state alone", d, next)
	}
}

func BenchmarkStep(b *testing.B) {
	for _, a := range Algorithms() {
		b.Run(a.String(), func(b *testing.B) {
			l := Limit{Algorithm: a, Requests: 1 << 40, Window: time.Second}
			var s State
			now := epoch
			b.ReportAllocs()
			for b.Loop() {
				now = now.Add(time.Microsecond)
				s, _ = Step(s, now, l, 1)
			}
		})
	}
}
