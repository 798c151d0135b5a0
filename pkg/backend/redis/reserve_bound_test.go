package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
)

// reservationModel is the semantics of reservations written plainly, one
// entry per reservation: what a window admits, what a settle charges and
// where, for the property test to hold the Go and Lua twins to, and to
// check the bound against.
type reservationModel struct {
	n, w  int64 // N, W in µs
	held  []modelReservation
	count map[int64]int64 // charged, by window start
	// excess and late are, by window, what its settles charged beyond
	// the reservations they released, and what settles that found none
	// charged: the bound's terms.
	excess, late map[int64]int64
}

type modelReservation struct{ end, window, hits int64 }

func (m *reservationModel) window(now int64) int64 { return now - ((now%m.w)+m.w)%m.w }

func (m *reservationModel) live(now int64) {
	m.held = slices.DeleteFunc(m.held, func(r modelReservation) bool { return r.end <= now })
}

// remaining is N less the window's count and the reservations made in it.
func (m *reservationModel) remaining(now int64) int64 {
	m.live(now)
	win := m.window(now)
	used := m.count[win]
	for _, r := range m.held {
		if r.window == win {
			used += r.hits
		}
	}
	return max(m.n-used, 0)
}

func (m *reservationModel) reserve(now, hits, ttl int64) bool {
	if hits > m.remaining(now) {
		return false
	}
	g := max(ttl/16, 1000)
	end := now + ttl
	end += ((-end % g) + g) % g
	r := modelReservation{end, m.window(now), hits}
	i := len(m.held)
	for i > 0 && (m.held[i-1].end > end || m.held[i-1].end == end && m.held[i-1].window > r.window) {
		i--
	}
	m.held = slices.Insert(m.held, i, r)
	return true
}

func (m *reservationModel) settle(now, cost int64) {
	m.live(now)
	win := m.window(now)
	if len(m.held) == 0 {
		m.count[win] += cost
		m.late[win] += cost
		return
	}
	r := m.held[0]
	m.held = m.held[1:]
	if r.window == win {
		m.count[win] += cost
		m.excess[win] += max(cost-r.hits, 0)
	}
}

// TestReservationBound runs random streams against the memory backend and
// the Lua scripts: request-time calls holding reservations, settles of
// costs under, over and at 0 of them, after any delay, streams that never
// settle. Every answer must be the model's, and in every window the
// count must stay within N plus what settles charged beyond the
// reservations they released plus what settles that found none charged
// (docs/algorithms.md, reservations). Shown failing against a build whose
// settles charge the current window whatever reservation they release:
// its answers are not the model's.
func TestReservationBound(t *testing.T) {
	c := client(t)
	subjects := map[string]func(now *time.Time) (algotest.Subject, func()){
		"go": func(now *time.Time) (algotest.Subject, func()) {
			m := memory.New(memory.Options{Now: func() time.Time { return *now }, SweepInterval: -1})
			return memorySubject{m, now}, func() { m.Close() }
		},
		"lua": func(*time.Time) (algotest.Subject, func()) { return clocked{testBackend(t, c)}, func() {} },
	}
	for name, newSubject := range subjects {
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(5, 17))
			for run := range *luaRuns {
				now := algotest.Epoch
				s, done := newSubject(&now)
				boundRun(t, rng, run, s, &now)
				done()
			}
		})
	}
}

// memorySubject decides with the memory backend at the clock now points
// to.
type memorySubject struct {
	m   *memory.Backend
	now *time.Time
}

func (s memorySubject) Decide(ctx context.Context, at time.Time, reqs []algo.Request, out []algo.Decision) error {
	*s.now = at
	return s.m.Decide(ctx, reqs, out)
}

// boundRun is one random run of TestReservationBound.
func boundRun(t *testing.T, rng *rand.Rand, run int, s algotest.Subject, now *time.Time) {
	t.Helper()
	windows := []time.Duration{time.Second, 7 * time.Second}
	l := algo.Limit{Algorithm: algo.FixedWindow, Requests: 100 + rng.Uint64N(5000), Window: windows[rng.IntN(2)]}
	m := &reservationModel{n: int64(l.Requests), w: l.Window.Microseconds(), count: map[int64]int64{}, excess: map[int64]int64{}, late: map[int64]int64{}}
	hits := 1 + rng.Uint64N(l.Requests/4)
	ttl := time.Duration(int64(l.Window)/4 + rng.Int64N(2*int64(l.Window)))
	type pending struct {
		at   time.Time
		cost uint64
	}
	var settles []pending
	key := []byte(fmt.Sprintf("bound|%d", run))
	decide := func(q algo.Request) algo.Decision {
		t.Helper()
		q.Key, q.Limit = key, l
		out := make([]algo.Decision, 1)
		if err := s.Decide(context.Background(), *now, []algo.Request{q}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	check := func(what string, d algo.Decision) {
		t.Helper()
		if want := m.remaining(now.UnixMicro()); int64(d.Remaining) != want {
			t.Fatalf("run %d at %v, after %s: %d remaining, the model %d", run, now.Sub(algotest.Epoch), what, d.Remaining, want)
		}
	}
	for range 400 {
		*now = now.Add(time.Duration(rng.Int64N(int64(l.Window) / 20)))
		slices.SortFunc(settles, func(a, b pending) int { return a.at.Compare(b.at) })
		for len(settles) > 0 && !settles[0].at.After(*now) {
			p := settles[0]
			settles = settles[1:]
			at := *now
			*now = p.at
			m.settle(now.UnixMicro(), int64(p.cost))
			check("a settle", decide(algo.Request{Op: algo.OpSettle, Hits: p.cost}))
			*now = at
		}
		d := decide(algo.Request{Op: algo.OpReserve, Hits: hits, Lease: algo.Lease{TTL: ttl}})
		if admitted := m.reserve(now.UnixMicro(), int64(hits), ttl.Microseconds()); d.Allowed != admitted {
			t.Fatalf("run %d at %v: reservation allowed %v, the model %v", run, now.Sub(algotest.Epoch), d.Allowed, admitted)
		}
		check("a reservation", d)
		if !d.Allowed || rng.IntN(10) == 0 {
			continue // refused, or a stream that never settles
		}
		cost := rng.Uint64N(hits + 1)
		switch rng.IntN(20) {
		case 0:
			cost = 0
		case 1, 2, 3, 4:
			cost = hits + rng.Uint64N(hits+1) // over its reservation
		}
		settles = append(settles, pending{now.Add(time.Duration(rng.Int64N(int64(ttl) * 3 / 2))), cost})
	}
	for win, count := range m.count {
		if bound := m.n + m.excess[win] + m.late[win]; count > bound {
			t.Fatalf("run %d, window %d: %d charged, over the bound %d = N %d + excess %d + late %d", run, win, count, bound, m.n, m.excess[win], m.late[win])
		}
	}
}

// BenchmarkReservations compares, on a real redis-server on loopback, an
// exact decision of a fixed window with the two calls of a stream that
// reserves: a request-time reservation and its stream-done settle. Each
// reports the server's time and allocations per call and, from INFO
// commandstats, the CPU Redis spent per call (redis-µs/call), the cost an
// operator scales Redis by. The reservation state of a key holds one slot
// here: its streams settle before the next starts.
func BenchmarkReservations(b *testing.B) {
	srv := redistest.Start(b)
	ctx := context.Background()
	be, err := Dial(ctx, Config{URL: srv.URL}, Options{Prefix: "bench:"})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	l := algo.Limit{Algorithm: algo.FixedWindow, Requests: 1 << 40, Window: time.Hour}
	key := descriptorKey("bench", "user", "alice", l)
	for _, c := range []struct {
		name string
		ops  []algo.Request
	}{
		{"exact", []algo.Request{{Key: key, Limit: l, Hits: 1}}},
		{"reserve+settle", []algo.Request{
			{Key: key, Limit: l, Hits: 700, Op: algo.OpReserve, Lease: algo.Lease{TTL: time.Minute}},
			{Key: key, Limit: l, Hits: 650, Op: algo.OpSettle},
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			out := make([]algo.Decision, 1)
			usec0, calls0 := fcallStats(b, be)
			for b.Loop() {
				for i := range c.ops {
					if err := be.Decide(ctx, c.ops[i:i+1], out); err != nil {
						b.Fatal(err)
					}
				}
			}
			usec, calls := fcallStats(b, be)
			if calls > calls0 {
				b.ReportMetric(float64(usec-usec0)/float64(calls-calls0), "redis-µs/call")
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(c.ops)), "ns/call")
		})
	}
}

// fcallStats returns the CPU time in µs Redis spent in FCALL and EVALSHA,
// and their calls, from INFO commandstats.
func fcallStats(b *testing.B, be *Backend) (usec, calls int64) {
	info, err := be.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range []string{"cmdstat_fcall:", "cmdstat_evalsha:"} {
			rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd)
			if !ok {
				continue
			}
			for _, kv := range strings.Split(rest, ",") {
				k, v, _ := strings.Cut(kv, "=")
				n, _ := strconv.ParseInt(v, 10, 64)
				switch k {
				case "calls":
					calls += n
				case "usec":
					usec += n
				}
			}
		}
	}
	return usec, calls
}
