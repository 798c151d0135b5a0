package aigwsim_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/ratelimitd/ratelimitd/internal/aigwsim"
)

// TestWorkloadDraws: the default workload is issue 31's, and a seed
// draws the same streams every time.
func TestWorkloadDraws(t *testing.T) {
	w := aigwsim.DefaultWorkload()
	a, b := rand.New(rand.NewPCG(7, 1)), rand.New(rand.NewPCG(7, 1))
	for range 1000 {
		if x, y := w.Draw(a), w.Draw(b); x != y {
			t.Fatalf("same seed, streams %+v and %+v", x, y)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	const n = 20000
	var costs []uint64
	fates := map[aigwsim.Fate]int{}
	zero, capped, long := 0, 0, 0
	for range n {
		s := w.Draw(r)
		fates[s.Fate]++
		if s.Fate != aigwsim.Complete {
			continue
		}
		costs = append(costs, s.Cost)
		switch {
		case s.Cost == 0:
			zero++
		case s.Cost > 4000:
			t.Fatalf("cost %d past the cap of 4000", s.Cost)
		case s.Cost == 4000:
			capped++
		}
		if s.Duration > 10*time.Second {
			long++
		}
	}
	slices.Sort(costs)
	if m := costs[len(costs)/2]; m < 665 || m > 735 {
		t.Errorf("median cost %d; want about 700", m)
	}
	if zero == 0 || capped == 0 || long == 0 {
		t.Errorf("%d streams of cost 0, %d capped, %d longer than 10s; want some of each", zero, capped, long)
	}
	share := func(f aigwsim.Fate) float64 { return float64(fates[f]) / n }
	if s := share(aigwsim.UpstreamFailure); s < 0.044 || s > 0.056 {
		t.Errorf("upstream failures %.3f; want about 0.05", s)
	}
	if fates[aigwsim.ClientReset] == 0 || fates[aigwsim.ResetWhileChecking] == 0 {
		t.Errorf("fates %v; want resets of both kinds", fates)
	}
}

// afterTheFact is a rate limit service that counts after the fact, as
// envoyproxy/ratelimit and ratelimitd's over_limit_hits: count do: every
// call adds its hits (a request-time call 1) to an epoch-aligned fixed
// window, and is over the limit when the count passes it. It answers
// after latency and records what each window was charged by stream-done
// calls. It is a direct client, for tests in a synctest bubble.
type afterTheFact struct {
	limit   uint64
	window  time.Duration
	latency time.Duration

	mu      sync.Mutex
	count   map[int64]uint64 // window → hits
	charged map[int64]uint64 // window → stream-done hits
}

func newAfterTheFact(limit uint64, window time.Duration) *afterTheFact {
	return &afterTheFact{limit: limit, window: window, latency: time.Millisecond, count: map[int64]uint64{}, charged: map[int64]uint64{}}
}

func (f *afterTheFact) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest, _ ...grpc.CallOption) (*rlsv3.RateLimitResponse, error) {
	if err := (aigwsim.RealClock{}).Sleep(ctx, f.latency); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	k := time.Now().UnixNano() / int64(f.window)
	hits, done := uint64(1), false
	if h := req.Descriptors[0].HitsAddend; h != nil {
		hits, done = h.Value, true
		f.charged[k] += hits
	}
	f.count[k] += hits
	code := rlsv3.RateLimitResponse_OK
	if f.count[k] > f.limit && !done {
		code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return &rlsv3.RateLimitResponse{OverallCode: code}, nil
}

// TestLoadBounded: a load stops starting streams at For, resets the
// streams still going, and never sends more than MaxRequests; every
// served stream's cost reaches the service.
func TestLoadBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rls := newAfterTheFact(1<<40, time.Minute)
		c := aigwsim.NewClient(aigwsim.Config{Route: route}, rls)
		l := aigwsim.Load{Users: 5, Workload: aigwsim.DefaultWorkload(), Think: 100 * time.Millisecond, For: time.Minute, MaxRequests: 1 << 20, Seed: 1}
		run, err := l.Run(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		if d := run.Ended.Sub(run.Began); d != time.Minute {
			t.Fatalf("ran %v; want For, 1m", d)
		}
		var charged uint64
		cut := 0
		for _, r := range run.Results {
			if r.Asked.After(run.Ended) || r.Ended.After(run.Ended) {
				t.Fatalf("stream %+v outlived the run, ended at %v", r, run.Ended)
			}
			if r.Outcome == aigwsim.Served != r.StreamDone {
				t.Fatalf("stream %+v: served without a stream-done call, or the reverse", r)
			}
			charged += r.Charged
			if r.Outcome == aigwsim.Reset && r.Stream.Fate == aigwsim.Complete {
				cut++
			}
		}
		var got uint64
		for _, h := range rls.charged {
			got += h
		}
		if got != charged || charged == 0 {
			t.Fatalf("the service was charged %d; the streams %d", got, charged)
		}
		if rep := aigwsim.Measure(run, 1<<40, time.Minute); rep.CutAtEnd != cut || cut == 0 {
			t.Fatalf("%d streams cut by the end counted; %d were", rep.CutAtEnd, cut)
		}

		l.MaxRequests = 7
		if run, _ = l.Run(context.Background(), c); len(run.Results) != 7 {
			t.Fatalf("%d requests; want MaxRequests, 7", len(run.Results))
		}
		if _, err := (aigwsim.Load{Users: 1, For: time.Second}).Run(context.Background(), c); err == nil {
			t.Fatal("a load without MaxRequests ran")
		}
	})
}

// TestLoadOvershootsAfterTheFact is issue 31's scenario in virtual time
// against a service that counts after the fact: 40 users, 50,000 tokens
// per 10 s. Its full windows charge well past the limit, and the report's
// per-window charges are what the service itself counted.
func TestLoadOvershootsAfterTheFact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const limit, window = 50000, 10 * time.Second
		// Start in the middle of a window, as a test would.
		time.Sleep(time.Until(time.Now().Truncate(window).Add(window + window/2)))
		rls := newAfterTheFact(limit, window)
		c := aigwsim.NewClient(aigwsim.Config{Route: route, Timeout: time.Second}, rls, rls)
		l := aigwsim.Load{Users: 40, Workload: aigwsim.DefaultWorkload(), Think: 250 * time.Millisecond, For: 2 * time.Minute, MaxRequests: 1 << 20, Seed: 31}
		run, err := l.Run(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		rep := aigwsim.Measure(run, limit, window)
		t.Log("\n" + rep.String())
		if rep.FullWindows != 11 || rep.Windows[0].Full || rep.Windows[len(rep.Windows)-1].Full {
			t.Fatalf("%d full windows; want 11, between two partial ones", rep.FullWindows)
		}
		if rep.MaxRatio < 1.3 || rep.DemandWindows != rep.FullWindows || rep.MinUtilisation < 1 {
			t.Fatalf("max ratio %.2f, min utilisation %.2f over %d windows of demand; want overshoot past 1.3 in every window", rep.MaxRatio, rep.MinUtilisation, rep.DemandWindows)
		}
		for _, w := range rep.Windows {
			if k := w.Start.UnixNano() / int64(window); rls.charged[k] != w.Charged {
				t.Fatalf("window %v: report says %d charged, the service %d", w.Start, w.Charged, rls.charged[k])
			}
		}
		for _, o := range []aigwsim.Outcome{aigwsim.Served, aigwsim.Refused, aigwsim.UpstreamFailed, aigwsim.Reset, aigwsim.CancelledInFlight} {
			if rep.Count(o) == 0 {
				t.Errorf("no stream %v; want some", o)
			}
		}
		if !strings.Contains(rep.String(), "max ratio over 11 full windows") {
			t.Errorf("report lacks its summary:\n%s", rep)
		}
	})
}

// TestMeasure: windows are epoch-aligned, a stream-done call counts in
// the window it was sent in, only full windows make the figures, and
// utilisation is taken over windows whose demand exceeded the limit.
func TestMeasure(t *testing.T) {
	const w = 10 * time.Second
	at := func(s float64) time.Time {
		return time.Unix(1_800_000_000, 0).Add(time.Duration(s * float64(time.Second)))
	}
	served := func(asked, ended float64, cost uint64) aigwsim.Result {
		return aigwsim.Result{Stream: aigwsim.Stream{Fate: aigwsim.Complete, Cost: cost}, Outcome: aigwsim.Served,
			Asked: at(asked), Ended: at(ended), StreamDone: true, Charged: cost}
	}
	run := aigwsim.Run{Began: at(5), Ended: at(35), Results: []aigwsim.Result{
		served(5, 6, 5000),   // partial window [0, 10): not counted
		served(9, 12, 800),   // charged in [10, 20)
		served(11, 19, 300),  // [10, 20)
		served(21, 29, 1200), // [20, 30)
		{Stream: aigwsim.Stream{Fate: aigwsim.Complete, Cost: 700}, Outcome: aigwsim.Refused, Asked: at(22), Ended: at(22)},
		{Stream: aigwsim.Stream{Fate: aigwsim.UpstreamFailure}, Outcome: aigwsim.UpstreamFailed, Asked: at(23), Ended: at(24)},
		{Stream: aigwsim.Stream{Fate: aigwsim.Complete, Cost: 900}, Outcome: aigwsim.Reset, Asked: at(31), Ended: at(35)},
	}}
	rep := aigwsim.Measure(run, 1000, w)
	if len(rep.Windows) != 4 || rep.FullWindows != 2 {
		t.Fatalf("%d windows, %d full; want 4, 2\n%s", len(rep.Windows), rep.FullWindows, rep)
	}
	want := []aigwsim.Window{
		{Start: at(0), Charged: 5000, Offered: 5800, Asked: 2},
		{Start: at(10), Full: true, Charged: 1100, Offered: 300, Asked: 1},
		{Start: at(20), Full: true, Charged: 1200, Offered: 1900, Asked: 3, Refused: 1},
		{Start: at(30), Offered: 900, Asked: 1},
	}
	for i, g := range rep.Windows {
		if !g.Start.Equal(want[i].Start) || g.Full != want[i].Full || g.Charged != want[i].Charged || g.Offered != want[i].Offered || g.Asked != want[i].Asked || g.Refused != want[i].Refused {
			t.Fatalf("window %d: %+v; want %+v", i, g, want[i])
		}
	}
	if rep.MaxRatio != 1.2 || rep.DemandWindows != 1 || rep.MinUtilisation != 1.2 || rep.MeanUtilisation != 1.2 {
		t.Fatalf("max ratio %v, %d demand windows, utilisation %v/%v; want 1.2, 1, 1.2/1.2", rep.MaxRatio, rep.DemandWindows, rep.MinUtilisation, rep.MeanUtilisation)
	}
	if rep.Count(aigwsim.Served) != 4 || rep.Count(aigwsim.Refused) != 1 || rep.CutAtEnd != 1 {
		t.Fatalf("outcomes %v, %d cut; want 4 served, 1 refused, 1 cut", rep.Outcomes, rep.CutAtEnd)
	}
}
