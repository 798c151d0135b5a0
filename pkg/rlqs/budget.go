package rlqs

import (
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/key"
)

// Cross-replica budget (phase 2). With [Options.Budget] set, the limit L
// of a pool (one bucket of one rule) is held in the shared store as a
// token bucket of L tokens that refills within a millisecond: a semaphore
// of L units whose units are held by leases ([algo.OpTake]) until they
// end or are given back ([algo.OpGive]). The store keeps the tokens in the
// bucket and the leases outstanding at most L together, so at every
// instant the leases of all replicas hold at most L. Every assignment a
// stream is sent is backed by a lease of as many units, taken when it is
// computed and lasting its TTL plus ledgerGrace: the assignments in force
// across every replica sum to at most L. See docs/rlqs.md.
//
// Each report of a pooled bucket costs, in one atomic call for all the
// buckets of the report: the give of the stream's previous lease, the take
// of its new one (max: its target; whatever is free when less), and two
// announcements to sliding window counters from which every replica reads
// the pool's global demand and stream count, to compute targets from the
// demand of all streams, not its own streams' alone.

// budgetMark is the entry that sets RLQS keys apart from RLS keys: no rule
// file can name a key holding a NUL byte.
const budgetMark = "\x00rlqs"

// budgetLimit is the store's limit for a pool limit of l per unit.
func budgetLimit(l uint64) algo.Limit {
	return algo.Limit{Algorithm: algo.TokenBucket, Requests: l, Window: time.Millisecond, Burst: l}
}

// announceSize is the capacity of the announcement semaphores: the most
// streams, and requests per interval, a pool's announcements can count.
const announceSize = 1 << 24

// announceLimit is the limit of a pool's announcement semaphores: like the
// budget, a token bucket that refills at once, whose leases outstanding
// are the announcements of the streams that reported within a TTL. So
// announceSize less the tokens left after a take is the sum of the live
// announcements of all replicas' streams, this one's included.
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

// lease is the budget a member holds in the store for its assignment.
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
	return algo.Request{Key: l.key, Limit: l.limit, Op: algo.OpGive, Hits: l.hits, Lease: algo.Lease{Mark: l.mark}}, true
}

// pending is one pooled bucket of a report waiting for the store: the
// requests of its batch start at take. A peek's are the reads of the two
// announcements alone (its assignment is made already, from the leases
// the member holds); the others' are the takes of the budget and of the
// two announcements.
type pending struct {
	m      *member
	peek   bool
	qa     *rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction
	unit   typev3.RateLimitUnit
	take   int    // index in the batch of the budget's take (a peek's: the demand's read); the announcements' follow
	target uint64 // what the take asks for
	local  uint64 // the phase 1 assignment, sent if the store fails
	key    []byte
	limit  algo.Limit
	ttl    time.Duration // the leases' TTL
	renew  time.Duration // how much of it an assignment needs: renewBy is ttl-renew after the take
	ival   time.Duration // the reporting interval the demand is announced per
	akeys  [2][]byte     // the announcement keys: demand, streams
}

// estimate reads a pool's global demand (requests per second) and stream
// count from the decisions of the two announcements' takes.
func estimate(demand, count algo.Decision, interval time.Duration) (float64, float64) {
	d := float64(announceSize-min(demand.Remaining, announceSize)) / interval.Seconds()
	n := float64(announceSize - min(count.Remaining, announceSize))
	return d, n
}

// settleScratch is the space of one report's budget call (its requests,
// the buckets waiting for them, the decisions), reused across reports: a
// report of 100 buckets makes 600 requests, which would otherwise be
// allocated, and scanned by the garbage collector, at every report.
type settleScratch struct {
	batch []algo.Request
	pend  []pending
	out   []algo.Decision
	pool  *sync.Pool // where put returns it
}

// getSettleScratch returns scratch space from pool whose batch and pend
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
	if cap(sc.pend) < n {
		sc.pend = make([]pending, 0, n)
	}
	sc.batch, sc.pend, sc.out = sc.batch[:0], sc.pend[:0], sc.out[:0]
	return sc
}

// put clears what sc refers to (keys, members, responses) and returns it
// to the pool.
func (sc *settleScratch) put() {
	clear(sc.batch) // only these were used: the rest is clear already
	clear(sc.pend)
	sc.batch, sc.pend = sc.batch[:0], sc.pend[:0]
	sc.pool.Put(sc)
}

// renewAhead is how many reporting intervals a lease outlives the
// assignment it backs, so that a stream whose share and demand hold still
// renews its leases about every renewAhead+1 reports, not at every one.
// The price: budget a replica that dies holds stays counted for as much
// longer (docs/rlqs.md, across replicas).
const renewAhead = 2

// leaseTTL is the TTL of the leases backing assignments of TTL ttl to a
// stream reporting every interval: what an assignment needs (its TTL and
// the grace), renewAhead intervals more, and half an interval for reports
// that come a little late.
func leaseTTL(ttl, interval time.Duration) time.Duration {
	return ttl + ledgerGrace + renewAhead*interval + interval/2
}

// unitSeconds is the length of an Envoy time unit in seconds.
func unitSeconds(u typev3.RateLimitUnit) float64 {
	for _, c := range envoyUnits {
		if c.unit == u {
			return c.d.Seconds()
		}
	}
	return 1
}

// renewal reports whether member m must renew its leases at now to be
// assigned its target (per unit) of a pool limit of limit, given its
// demand (requests per unit, and per interval as announced). It must when
//
//   - its leases end too soon to back an assignment sent now, or are
//     taken under another limit (the rules were reloaded);
//   - it is hungry: it holds less than its target while its demand is at
//     least 90% of what it holds, so it keeps asking at every report and
//     takes what the others free as soon as they free it;
//   - it holds more than its target by over a quarter: the excess goes
//     back for the others to take;
//   - its demand moved by over an eighth (and one request) from what it
//     announced, so every replica's targets follow it.
//
// Otherwise it is assigned min(target, held) from the leases it holds:
// safe, since they outlive the assignment, and without a store call.
func (m *member) renewal(target, perInterval uint64, demandPerUnit float64, limit uint64, now time.Time) bool {
	held, ann := m.leases[0], m.leases[1].hits
	switch {
	case !now.Before(m.renewBy), m.under != limit:
		return true
	case target > held.hits && demandPerUnit >= 0.9*float64(held.hits):
		return true
	case held.hits > target+target/4:
		return true
	}
	return perInterval > ann+ann/8+1 || ann > perInterval+perInterval/8+1
}
