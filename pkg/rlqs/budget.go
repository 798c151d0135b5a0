package rlqs

import (
	"math"
	"math/rand/v2"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/key"
)

// Cross-replica budget (phase 2). With [Options.Budget] set, the limit L
// of a pool (one bucket of one rule) is held in the shared store as a
// token bucket of L tokens that refills within a millisecond: a semaphore
// of L units whose units are held by leases ([algo.OpTake]) until they
// end or are given back ([algo.OpGive]). The store keeps the tokens in the
// bucket and the leases outstanding at most L together, so at every
// instant the leases of all replicas hold at most L.
//
// Each replica holds one lease per pool, as the lease engine holds one per
// key: the streams of the replica that report the bucket are assigned out
// of it by the pool's ledger (share.go), which keeps the assignments in
// force within what the lease holds. The lease outlives every assignment
// made from it, so the assignments in force across every replica sum to
// at most L. See docs/rlqs.md.
//
// A replica renews the lease, in one atomic call for all the pools of a
// report, when its members' targets drift from what it holds or before it
// ends too soon: the give of the old lease, then the take of the new one.
// Where the budget is scarce (a quarter of L or less was free at the last
// call), the call also announces the pool's demand and streams on this
// replica to two more semaphores, from which every replica reads the
// pool's global demand and stream count, so that targets follow the
// demand of all streams; and between renewals the pool reads them, and
// the budget, once an interval.

// budgetMark is the entry that sets RLQS keys apart from RLS keys: no rule
// file can name a key holding a NUL byte.
const budgetMark = "\x00rlqs"

// budgetLimit is the store's limit for a pool limit of l per period.
func budgetLimit(l uint64) algo.Limit {
	return algo.Limit{Algorithm: algo.TokenBucket, Requests: l, Window: time.Millisecond, Burst: l}
}

// announceSize is the capacity of the announcement semaphores: the most
// streams, and requests per interval, a pool's announcements can count.
const announceSize = 1 << 24

// announceLimit is the limit of a pool's announcement semaphores: like the
// budget, a token bucket that refills at once, whose leases outstanding
// are the announcements of the replicas that announced within a TTL. So
// announceSize less the tokens left after a take is the sum of the live
// announcements of all replicas, this one's included.
func announceLimit() algo.Limit {
	return algo.Limit{Algorithm: algo.TokenBucket, Requests: announceSize, Window: time.Second, Burst: announceSize}
}

// poolKeyPrefix returns the store key of a pool without its limit suffix:
// the domain, the mark with the rule's id, and the bucket's entries.
func poolKeyPrefix(domain, rule string, d bucketDescriptor) []byte {
	k := key.AppendDomain(nil, domain)
	k = key.AppendEntry(k, budgetMark, rule)
	for _, e := range d {
		k = key.AppendEntry(k, e.key, e.value)
	}
	return k[:len(k):len(k)] // appends copy: keys derived from it share nothing
}

func withLimit(prefix []byte, l algo.Limit) []byte {
	return key.AppendLimit(append([]byte(nil), prefix...), l)
}

// storeKeys returns the pool's store keys for bucket descriptor d of rule
// in domain, made once: they change only with its limit.
func (p *pool) storeKeys(domain, rule string, d bucketDescriptor) [3][]byte {
	if p.keys[0] == nil || p.keysLimit != p.limit {
		prefix := poolKeyPrefix(domain, rule, d)
		al := announceLimit()
		p.keys = [3][]byte{withLimit(prefix, budgetLimit(p.limit)), withLimit(key.AppendEntry(prefix, "demand", "per10s"), al), withLimit(key.AppendEntry(prefix, "streams", ""), al)}
		p.keysLimit = p.limit
	}
	return p.keys
}

// lease is budget held in the store.
type lease struct {
	key   []byte     // the store key it was taken from
	limit algo.Limit // the limit it was taken under
	hits  uint64
	mark  int64     // names it for OpGive
	end   time.Time // when the store stops counting it, on this clock (at the latest)
}

// give returns the request giving back l, or false when there is nothing
// to give (nothing held, or the lease has ended).
func (l *lease) give(now time.Time) (algo.Request, bool) {
	if l.hits == 0 || !now.Before(l.end) {
		return algo.Request{}, false
	}
	return algo.Request{Key: l.key, Limit: l.limit, Op: algo.OpGive, Hits: l.hits, Lease: algo.Lease{Mark: l.mark}, Shadow: true}, true
}

// poolLease is what this replica holds in the store for one pool, and
// what the store showed of the pool at the last call.
type poolLease struct {
	leases [3]lease // the budget, and the announcements: demand, streams
	// renewBy is when the leases must be taken again, before the first of
	// them ends too soon to back an assignment (zero: no lease backs any).
	renewBy time.Time
	under   uint64 // the pool limit the leases were taken under
	// free is what the budget held beyond every replica's lease at the
	// last call (viewed: one answered since the lease was lost);
	// announced, whether the leases include the announcements.
	free      uint64
	viewed    bool
	announced bool
	// gDemand and gCount are the pool's demand (requests per second) and
	// streams across all replicas as the last announcements showed (0
	// when not announced).
	gDemand, gCount float64
	// inflight is set while a renewal of the lease is on its way; next
	// is when the pool may read the store again without a renewal (a pool
	// shared by many streams reads once or twice an interval, not at each
	// of their reports).
	inflight bool
	next     time.Time
	// dropped is set when the pool lost its last member while a call was
	// on its way: what that call takes is given back as it settles.
	dropped bool
	// polling is set while a look at the store of a starved pool is
	// scheduled (Server.pollStarved); polled is when the last was.
	polling bool
	polled  time.Time
}

// held is the budget the lease backs assignments with.
func (l *poolLease) held() uint64 { return l.leases[0].hits }

// backs reports whether the lease backs an assignment sent at now to a
// pool of limit limit: it lasts long enough, and was taken under that limit.
func (l *poolLease) backs(limit uint64, now time.Time) bool {
	return now.Before(l.renewBy) && l.under == limit
}

// gives appends to batch the gives of the leases still running, and
// forgets them.
func (l *poolLease) gives(now time.Time, batch *[]algo.Request) {
	for i := range l.leases {
		if g, ok := l.leases[i].give(now); ok {
			*batch = append(*batch, g)
		}
		l.leases[i] = lease{}
	}
	l.renewBy, l.viewed, l.announced, l.gDemand, l.gCount = time.Time{}, false, false, 0, 0
}

// How long leases outlive the assignments they back, in reporting
// intervals: a pool whose targets and demand hold renews its lease about
// every renewAhead+1 reports, not at every one. Where the budget is
// scarce, shares must move quickly and a replica that dies should strand
// little, so leases are short; where it is plentiful, nobody waits for
// what a lease holds, and leases are long (less a jitter of up to
// renewJitter intervals, so that the pools a stream opened at once do not
// all renew at once). See docs/rlqs.md, across replicas.
const (
	renewAhead     = 2
	renewAheadLong = 9
	renewJitter    = 4
	// renewEarly is how many intervals before its lease stops backing
	// assignments a plentiful pool renews it, in the background of a
	// report that the lease still backs: the next report, an interval
	// later or a little more, finds the new lease in place.
	renewEarly = 2
)

// scarce reports whether free units of a pool limit of limit are too few
// for a new stream, or a growing one, to find its share among them: a
// quarter of the limit.
func scarce(free, limit uint64) bool { return free < limit/4+1 }

// contended reports whether the pool takes part in the sharing across
// replicas: when its last call showed the budget scarce. A pool that has
// not seen the budget yet takes as where it is plentiful, one take and no
// announcement, the cheapest first call for a pool that most often has
// units to spare; should the take show the budget scarce, the pool
// announces at its next report.
func (l *poolLease) contended(limit uint64) bool {
	return l.viewed && scarce(l.free, limit)
}

// leaseTTL is the TTL of the leases backing assignments of TTL ttl to
// streams reporting every interval: what an assignment needs (its TTL and
// the grace), renewAhead intervals more where the budget is scarce and
// about renewAheadLong where it is not, and half an interval for reports
// that come a little late.
func leaseTTL(ttl, interval time.Duration, scarce bool) time.Duration {
	ahead := time.Duration(renewAhead) * interval
	if !scarce {
		ahead = renewAheadLong*interval - rand.N(renewJitter*interval)
	}
	return ttl + ledgerGrace + ahead + interval/2
}

// renewal reports whether pool p must renew its lease, which backs
// assignments now, given whether the budget is contended. It must when
//
//   - contended, it has not announced its demand, or what it announced
//     (demand per interval and streams) moved by over an eighth; or it is
//     hungry: its members' targets sum to more than it holds while they
//     use at least 90% of it and the store showed units nobody holds, so
//     it takes what the others freed; or it holds more than its targets
//     by over a sixteenth (and its assignments in force), so the excess
//     goes back for the others;
//   - plentiful, its targets rose by over a quarter of what it holds, or
//     fell to half: a lease a little off its targets costs nobody
//     anything while the pool has units to spare.
//
// Otherwise its members are assigned out of what it holds: safe, since
// the lease outlives their assignments, and without a take.
func (p *pool) renewal(contended bool) bool {
	l := &p.lease
	held := l.held()
	if !contended {
		return p.target > held+held/4 || held > 2*p.target
	}
	if !l.announced {
		return true
	}
	if p.target > held && l.free > 0 && p.demand*float64(p.period) >= 0.9*float64(held) {
		return true
	}
	// With little free in the store, another replica may be short of its
	// targets by what this one holds beyond its own (held over from before
	// demand moved): that goes back, past a sixteenth of what it needs
	// (its targets, or its assignments in force where they are kept above
	// them), so that the replicas' leases settle at their targets rather
	// than within a quarter of them.
	if p.surplus() {
		return true
	}
	return drifted(uint64(p.n), l.leases[2].hits) || drifted(announced(p.demand), l.leases[1].hits)
}

// surplus reports whether the pool's lease holds more than it needs, its
// targets or its assignments in force where they are kept above them, by
// over a sixteenth (and one).
func (p *pool) surplus() bool {
	need := max(p.target, p.assigned)
	return p.lease.held() > need+need/16+1
}

// drifted reports whether now differs from was by over an eighth (and one).
func drifted(now, was uint64) bool {
	return now > was+was/8+1 || was > now+now/8+1
}

// announceSpan is the time a demand is announced over: a demand of d
// requests per second is announced as ⌈d·announceSpan⌉ units, the same
// span on every replica whatever its streams' report periods, so that the
// announcements of all replicas add up to their demand (a tenth of a
// request per second at least, up to announceSize/10 a second).
const announceSpan = 10 * time.Second

// announced is a demand of d requests per second as announced units.
func announced(d float64) uint64 {
	return uint64(math.Ceil(d * announceSpan.Seconds()))
}

// estimate reads a pool's global demand (requests per second) and stream
// count from the decisions of the two announcements' takes, or reads.
func estimate(demand, count algo.Decision) (float64, float64) {
	d := float64(announceSize-min(demand.Remaining, announceSize)) / announceSpan.Seconds()
	n := float64(announceSize - min(count.Remaining, announceSize))
	return d, n
}

// call is one pool's part of a report's budget call, waiting for the
// store: its requests start at first in the batch. A renewal's are the
// gives of its old leases, then the take of the budget and, when it
// announces, of the two announcements; a read's, the reads of the budget
// and the two announcements.
type call struct {
	p     *pool
	read  bool
	first int // index in the batch of the budget's take or read; the announcements' follow
	// A renewal:
	announce bool
	limit    algo.Limit    // the budget's
	keys     [3][]byte     // budget, demand, streams
	ttl      time.Duration // the leases' TTL
	renew    time.Duration // how much of it an assignment needs: renewBy is ttl-renew after the take
	interval time.Duration // the reporting interval of the streams
	// The member whose report asked for the call, if any, and, for a
	// renewal, where its assignment goes once the call settles.
	m     *member
	qa    *rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction
	until time.Time
}

// read appends to batch the reads of pool p's budget and announcements,
// to refresh what the pool knows of the other replicas, at a report of
// member m.
func (p *pool) read(m *member, now time.Time, interval time.Duration, batch *[]algo.Request, calls *[]call) {
	// Half an interval: a stream's reports come about an interval apart,
	// a little less at times, and each should read.
	p.lease.next = now.Add(interval / 2)
	peek := func(k []byte, lim algo.Limit) algo.Request {
		return algo.Request{Key: k, Limit: lim, Peek: true, Shadow: true}
	}
	*calls = append(*calls, call{p: p, read: true, first: len(*batch), interval: interval, m: m})
	*batch = append(*batch, peek(p.keys[0], budgetLimit(p.limit)), peek(p.keys[1], announceLimit()), peek(p.keys[2], announceLimit()))
}

// renew appends to batch the renewal of pool p's lease: the gives of the
// old leases, the take of at least what the assignments in force other
// than m's hold (the old lease held them, and goes back first in the same
// atomic call) and at most the members' targets, and, where contended,
// the announcements. m, when not nil, is the member whose assignment
// waits for it (qa, in force until until).
func (p *pool) renew(c call, contended bool, now time.Time, batch *[]algo.Request, calls *[]call) {
	l := &p.lease
	var floor uint64
	if l.backs(p.limit, now) {
		floor = p.assigned
		if c.m != nil {
			floor -= c.m.assigned
		}
	}
	l.gives(now, batch)
	l.inflight, l.next = true, now.Add(c.interval/2)
	c.p, c.first, c.announce = p, len(*batch), contended
	c.limit = budgetLimit(p.limit)
	c.ttl = leaseTTL(c.ttl, c.interval, contended)
	// A take of no hits takes min(Max, what is free) as a lease, and what
	// is free includes the old lease given back just before it in the
	// same atomic call: so it takes at least the floor.
	take := func(k []byte, lim algo.Limit, most uint64) algo.Request {
		return algo.Request{Key: k, Limit: lim, Op: algo.OpTake, Shadow: true, Lease: algo.Lease{Max: most, Share: 1, TTL: c.ttl}}
	}
	*batch = append(*batch, take(c.keys[0], c.limit, max(floor, p.target)))
	if contended {
		al := announceLimit()
		*batch = append(*batch, take(c.keys[1], al, announced(p.demand)), take(c.keys[2], al, uint64(p.n)))
	}
	*calls = append(*calls, c)
}

// settle records what the store answered to call c (err: the call
// failed), sent at sent, and returns the gives of what it took for a pool
// dropped meanwhile. Called with Server.mu held.
func (c *call) settle(out []algo.Decision, err error, sent time.Time, gives []algo.Request) []algo.Request {
	l := &c.p.lease
	if c.read {
		// A read takes no lease: it only refreshes the view, unless a
		// renewal is on its way, whose answer is at least as fresh.
		if err == nil && !l.inflight && !l.dropped {
			l.free = out[c.first].Remaining
			l.gDemand, l.gCount = estimate(out[c.first+1], out[c.first+2])
		}
		return gives
	}
	l.inflight = false
	if err != nil {
		return gives // no lease backs the pool: it renews at its next report
	}
	l.free, l.viewed, l.announced, l.under = out[c.first].Remaining, true, c.announce, c.limit.Requests
	// Renewed once what a lease has left no longer covers an assignment
	// sent then (its TTL and the grace).
	l.renewBy = sent.Add(c.ttl - c.renew)
	n := 1
	if c.announce {
		n = 3
		l.gDemand, l.gCount = estimate(out[c.first+1], out[c.first+2])
	}
	for i := range n {
		d := out[c.first+i]
		if d.Taken == 0 {
			continue
		}
		lim := c.limit
		if i > 0 {
			lim = announceLimit()
		}
		l.leases[i] = lease{key: c.keys[i], limit: lim, hits: d.Taken, mark: d.Mark, end: sent.Add(d.Valid)}
		if end := l.leases[i].end.Add(-c.renew); end.Before(l.renewBy) {
			l.renewBy = end
		}
	}
	if l.dropped {
		l.gives(sent, &gives)
	}
	return gives
}

// settleScratch is the space of one report's budget call (its requests,
// the calls waiting for them, the decisions), reused across reports: a
// report of 100 buckets makes up to 600 requests, which would otherwise
// be allocated, and scanned by the garbage collector, at every report.
type settleScratch struct {
	batch []algo.Request
	calls []call
	out   []algo.Decision
	pool  *sync.Pool // where put returns it
}

// getSettleScratch returns scratch space from pool whose batch and calls
// are empty and hold room for the requests of n buckets.
func getSettleScratch(pool *sync.Pool, n int) *settleScratch {
	sc, _ := pool.Get().(*settleScratch)
	if sc == nil {
		sc = new(settleScratch)
	}
	sc.pool = pool
	if cap(sc.batch) < 6*n {
		sc.batch = make([]algo.Request, 0, 6*n)
	}
	if cap(sc.calls) < n {
		sc.calls = make([]call, 0, n)
	}
	sc.batch, sc.calls, sc.out = sc.batch[:0], sc.calls[:0], sc.out[:0]
	return sc
}

// put clears what sc refers to (keys, pools, responses) and returns it
// to the pool.
func (sc *settleScratch) put() {
	clear(sc.batch) // only these were used: the rest is clear already
	clear(sc.calls)
	sc.batch, sc.calls = sc.batch[:0], sc.calls[:0]
	sc.pool.Put(sc)
}
