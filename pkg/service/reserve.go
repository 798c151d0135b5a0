package service

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// Reservations (SPEC section 12, docs/ai-gateway.md): a limit that
// reserves (rate_limit.reserve, or Options.Reserve for the limits whose
// rule does not say) has two kinds of calls, told apart on the wire as
// Envoy's ratelimit filter sends them. A descriptor without a hits_addend
// of its own is a request-time call: it holds a reservation
// (algo.OpReserve) of the limit's reservation, or of the request's hits
// when more. A descriptor with one is a stream-done call: it charges
// that cost and releases one reservation (algo.OpSettle).
//
// With auto, each limit learns its reservation, the 97th percentile of
// the last 256 costs settled, and how long a reservation lasts, six
// times the median of the last 64 check-to-settle times (at least 1 s, at
// most 15 min, half as long again while more than 5% of settles find no
// reservation left); until it has seen reserveColdSamples costs, it reserves a
// sixteenth of the limit, or the largest cost seen if more, and until it
// has seen as many times, for reserveColdTTL. A fixed reservation learns
// only how long reservations last.

const (
	// reserveSamples is how many recent costs a limit learns from, and
	// reserveTimeSamples how many check-to-settle times: fewer, so that
	// the lifetime forgets the times of its cold start soon.
	reserveSamples     = 256
	reserveTimeSamples = 64
	// reserveColdSamples is how many costs a limit sees before its
	// reservation follows them.
	reserveColdSamples = 10
	// reserveEvery is how many settles pass between two updates of what
	// is learnt.
	reserveEvery = 8
	// reserveColdTTL is how long a reservation lasts before a limit has
	// learnt it.
	reserveColdTTL = 30 * time.Second
	// reserveMinTTL and reserveMaxTTL bound a learnt lifetime.
	reserveMinTTL = time.Second
	reserveMaxTTL = 15 * time.Minute
	// reserveCostPercentile is what a reservation follows. A cost over
	// its reservation pushes its window past the limit by the difference
	// (docs/algorithms.md, the bound's Σ (c − R)⁺): log-normal costs of
	// spread 0.6 exceed their 95th percentile by 3.4% of their sum, their
	// 97th by 2.1%, their 99th by 0.7%; a higher one leaves more budget
	// idle at each window's end (R − c of each stream in flight, up to R
	// unused) and swings wider from one sample of costs to the next. A
	// rule on the excess itself (the least R the costs exceed by at most
	// 1% of their sum) follows the few largest costs: learnt from 60 of
	// issue 31's costs, one time in twenty it is the largest, 4,000; the
	// 97th percentile is 3,072 or more as often.
	reserveCostPercentile = 0.97
	// reserveTimePercentile and reserveTimeFactor make the lifetime six
	// times the median check-to-settle time: a settle releases the
	// oldest reservation, which is often one whose stream failed and will
	// never settle, held as long as the lifetime allows. A high
	// percentile of the times would follow those, and a lifetime made of
	// them would hold them longer still; the median does not, while they
	// are fewer than half. Six medians cover the 99th percentile of
	// log-normal times up to a spread (sigma) of 0.77 (e^(2.33 sigma) = 6), costs of tokens
	// streamed at a steady pace; a longer tail shows as settles finding no
	// reservation, which lengthen it (reserveLateShare).
	reserveTimePercentile = 0.5
	reserveTimeFactor     = 6
	// reserveLateShare is the share of settles finding no reservation,
	// over a run of reserveTimeSamples settles, past which the lifetime
	// grows by half: reservations end before their streams do.
	reserveLateShare = 0.05
)

// learner is what one limit that reserves learns: its reservation and
// how long reservations last, read on every request-time call, updated by
// the settles.
type learner struct {
	limit uint64 // N, requests_per_unit
	fixed uint64 // the reservation of reserve: N; 0 for auto
	hits  atomic.Uint64
	ttl   atomic.Int64 // nanoseconds

	mu       sync.Mutex
	costs    []uint64 // the last reserveSamples costs, a ring
	times    []int64  // the last check-to-settle times, ns, a ring
	nc, nt   int      // costs and times seen
	maxCost  uint64
	settles  uint64 // settles seen
	late     int    // settles of the current run that found no reservation
	window   int    // settles of the current run, up to reserveTimeSamples
	released uint64 // settles that released a reservation
}

func newLearner(l *config.Limit, r config.Reserve) *learner {
	lr := &learner{limit: uint64(l.RequestsPerUnit)}
	if r.Mode == config.ReserveFixed {
		lr.fixed = r.Hits
	}
	lr.hits.Store(lr.coldHits())
	lr.ttl.Store(int64(reserveColdTTL))
	return lr
}

// coldHits is the reservation before enough costs are seen: the fixed
// one, or a sixteenth of the limit, at least 1, or the largest cost seen
// if more; at most the limit.
func (lr *learner) coldHits() uint64 {
	if lr.fixed > 0 {
		return lr.fixed
	}
	return min(max((lr.limit+15)/16, lr.maxCost, 1), max(lr.limit, 1))
}

// reservation returns what a request-time call of hits holds, and for how
// long.
func (lr *learner) reservation(hits uint64) (uint64, time.Duration) {
	return max(lr.hits.Load(), hits), time.Duration(lr.ttl.Load())
}

// settled learns from a settle of cost that got decision d: the cost,
// and, when it released a reservation, how long that reservation had
// been held.
func (lr *learner) settled(cost uint64, d *algo.Decision) {
	ttl := time.Duration(lr.ttl.Load())
	lr.mu.Lock()
	defer lr.mu.Unlock()
	if lr.costs == nil {
		lr.costs, lr.times = make([]uint64, reserveSamples), make([]int64, reserveTimeSamples)
	}
	lr.costs[lr.nc%reserveSamples] = cost
	lr.nc++
	lr.maxCost = max(lr.maxCost, cost)
	if d.Taken > 0 {
		// How long the reservation released was held, on the store's
		// clock, whatever replica made it (algo.OpSettle).
		lr.times[lr.nt%reserveTimeSamples] = int64(d.Valid)
		lr.nt++
		lr.released++
	} else {
		lr.late++
	}
	lr.window++
	if lr.settles++; lr.settles%reserveEvery == 0 {
		lr.update(ttl)
	}
}

// update recomputes the reservation and its lifetime from what was seen;
// lr.mu is held.
func (lr *learner) update(ttl time.Duration) {
	switch {
	case lr.fixed > 0:
	case lr.nc < reserveColdSamples:
		lr.hits.Store(lr.coldHits())
	default:
		p := percentile(lr.costs[:min(lr.nc, reserveSamples)], reserveCostPercentile)
		lr.hits.Store(min(max(p, 1), max(lr.limit, 1)))
	}
	next := ttl
	if lr.nt >= reserveColdSamples {
		times := make([]uint64, min(lr.nt, reserveTimeSamples))
		for i := range times {
			times[i] = uint64(lr.times[i])
		}
		next = reserveTimeFactor * time.Duration(percentile(times, reserveTimePercentile))
	}
	if lr.window >= reserveTimeSamples {
		// Settles that found no reservation outlived theirs: the times
		// learnt cannot show it (a reservation that ended is not
		// released), so the lifetime grows by half while they are more
		// than a few, judged afresh over each run of settles.
		if float64(lr.late) > reserveLateShare*float64(lr.window) {
			next = max(next, ttl*3/2)
		}
		lr.late, lr.window = 0, 0
	}
	lr.ttl.Store(int64(min(max(next, reserveMinTTL), reserveMaxTTL)))
}

// percentile returns the p-th percentile of xs (nearest rank), xs left
// unsorted.
func percentile(xs []uint64, p float64) uint64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// reserving is the learners of the limits that reserve, under one rule
// set: learners[r][j] for limit j of rule r, nil when it does not.
type reserving struct {
	def      config.Reserve // Options.Reserve
	learners map[*config.Rule][]*learner
	byKey    map[string]*learner // the same, by reserveKey, to keep across rule sets
}

// newReserving returns the learners of rules, each limit reserving as its
// rule says or, when it does not, as def says if it can (a fixed window,
// exact, of its region); learners of prev are kept for the limits they
// learnt.
func newReserving(rules *config.Rules, def config.Reserve, prev *reserving) *reserving {
	rs := &reserving{def: def, learners: map[*config.Rule][]*learner{}, byKey: map[string]*learner{}}
	for _, d := range rules.Domains() {
		for _, r := range d.Rules() {
			var ls []*learner
			for j := range r.Limits {
				l := &r.Limits[j]
				res := rs.reserveOf(l)
				if !res.On() {
					continue
				}
				if ls == nil {
					ls = make([]*learner, len(r.Limits))
				}
				k := reserveKey(r, j, res)
				lr := prev.learner(k)
				if lr == nil {
					lr = newLearner(l, res)
				}
				ls[j], rs.byKey[k] = lr, lr
			}
			if ls != nil {
				rs.learners[r] = ls
			}
		}
	}
	return rs
}

// reserveOf returns how limit l reserves: as its rule says, or when it
// does not, as the server's default says if it can.
func (rs *reserving) reserveOf(l *config.Limit) config.Reserve {
	if l.Reserve.Mode == config.ReserveDefault && reservable(l) {
		return rs.def
	}
	return l.Reserve
}

// reservable reports whether limit l can take the server's default
// reservation: a fixed window decided exactly in its region.
func reservable(l *config.Limit) bool {
	return l.Algorithm == algo.FixedWindow && l.Consistency == config.Exact && l.Scope == config.Region
}

// reserveKey names the learner of limit j of rule r, reserving res,
// across rule sets: a limit that changed its N, its window or its
// reservation learns afresh.
func reserveKey(r *config.Rule, j int, res config.Reserve) string {
	l := &r.Limits[j]
	return fmt.Sprintf("%s\x00%s\x00%d\x00%d/%v\x00%s", r.Domain, r.ID, j, l.RequestsPerUnit, l.Window, res)
}

func (rs *reserving) learner(k string) *learner {
	if rs == nil {
		return nil
	}
	return rs.byKey[k]
}

// of returns the learner of limit j of rule r, nil when it does not
// reserve.
func (rs *reserving) of(r *config.Rule, j int) *learner {
	if rs == nil || r == nil {
		return nil
	}
	if ls, ok := rs.learners[r]; ok {
		return ls[j]
	}
	// A rule of another rule set, which a call read while the rules were
	// being replaced: its learner by name, or a new one.
	res := rs.reserveOf(&r.Limits[j])
	if !res.On() {
		return nil
	}
	if lr := rs.byKey[reserveKey(r, j, res)]; lr != nil {
		return lr
	}
	return newLearner(&r.Limits[j], res)
}

// reserveOp makes request q, of limit j of rule r, a reservation or a
// settle when the limit reserves: a settle when descriptor d carries a
// hits_addend of its own (Envoy's stream-done call), a reservation of
// the learnt amount, or the request's hits when more, otherwise. It
// reports whether the limit reserves.
func (rs *reserving) reserveOp(q *algo.Request, r *config.Rule, j int, d *rlv3.RateLimitDescriptor) bool {
	lr := rs.of(r, j)
	if lr == nil {
		return false
	}
	if d.GetHitsAddend() != nil {
		q.Op, q.Count = algo.OpSettle, false
		return true
	}
	q.Op, q.Count = algo.OpReserve, false
	q.Hits, q.Lease.TTL = lr.reservation(q.Hits)
	return true
}

// settled tells the learners of sc's settles what their decisions were.
func (rs *reserving) settled(sc *scratch) {
	for i := range sc.checks {
		c := &sc.checks[i]
		if c.kind != counted || c.rule == nil {
			continue
		}
		for j := range c.n {
			q := &sc.reqs[c.req+j]
			if q.Op != algo.OpSettle || q.Peek {
				continue
			}
			if lr := rs.of(c.rule, j); lr != nil {
				lr.settled(q.Hits, &sc.decisions[c.req+j])
			}
		}
	}
}

// ReserveState is what a limit that reserves has learnt, for operators.
type ReserveState struct {
	Domain, Rule string
	Limit        int
	// Auto is set when the reservation is learnt; Hits is the
	// reservation a request-time call holds now, TTL how long.
	Auto bool
	Hits uint64
	TTL  time.Duration
	// Settles counts the settles seen, Released those that released a
	// reservation (the others came after theirs had ended, or had none).
	Settles, Released uint64
}

// state reports lr as a ReserveState.
func (lr *learner) state() ReserveState {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	return ReserveState{Auto: lr.fixed == 0, Hits: lr.hits.Load(), TTL: time.Duration(lr.ttl.Load()), Settles: lr.settles, Released: lr.released}
}

// Reservations returns what each limit that reserves has learnt, by
// domain, rule and limit.
func (s *Service) Reservations() []ReserveState {
	rs := s.reserving.Load()
	var out []ReserveState
	for _, d := range s.Rules().Domains() {
		for _, r := range d.Rules() {
			for j, lr := range rs.learners[r] {
				if lr == nil {
					continue
				}
				st := lr.state()
				st.Domain, st.Rule, st.Limit = d.Name, r.ID, j
				out = append(out, st)
			}
		}
	}
	return out
}

// explain fills what the limits of rule r reserve into er, r's
// explanation.
func (rs *reserving) explain(er *ExplainRule, r *config.Rule) {
	for j := range er.Limits {
		lr := rs.of(r, j)
		if lr == nil {
			continue
		}
		el, st := &er.Limits[j], lr.state()
		el.Reserve = rs.reserveOf(&r.Limits[j]).String()
		el.ReserveHits, el.ReserveTTL = st.Hits, st.TTL.String()
		el.Settles, el.SettlesReleased = st.Settles, st.Released
	}
}
