// Package memory is the embedded, in-process [algo.Backend]: the default
// backend, used when no Redis is configured.
//
// State lives in a sharded map, one mutex per shard, so concurrent decisions
// on different keys rarely contend. A batch that spans several shards locks
// them in ascending order, which keeps multi-descriptor decisions atomic
// without deadlock. Entries expire when their state no longer matters and a
// sweeper removes them; the number of tracked keys is bounded by
// [Options.MaxKeys].
package memory

import (
	"context"
	"errors"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Defaults for [Options].
const (
	DefaultMaxKeys       = 1_000_000
	DefaultShards        = 256
	DefaultSweepInterval = time.Second
)

// evictionSample is how many entries a full shard inspects to find one to
// evict, in the spirit of Redis's sampled eviction.
const evictionSample = 8

// stackBatch is the batch size decided without allocating scratch space.
const stackBatch = 16

// Options configure a [Backend]. The zero value selects every default.
type Options struct {
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// MaxKeys bounds the number of keys tracked at once. Each shard holds
	// an equal share (MaxKeys / shards, rounded down), so evictions can start
	// before MaxKeys keys when one shard fills first. When a shard is full,
	// a new key first displaces an expired entry; failing that, the sampled
	// entry closest to expiry is evicted, which forgets its count. Keys of
	// the batch being decided are never evicted to make room for each
	// other, so a shard may pass its share by the size of one batch.
	// Default DefaultMaxKeys.
	MaxKeys int
	// Shards is the number of independently locked shards, rounded up to a
	// power of two, and lowered so that each holds at least one key.
	// Default DefaultShards.
	Shards int
	// SweepInterval is how often expired entries are removed in the
	// background. Negative disables the sweeper; [Backend.Sweep] still
	// works. Default DefaultSweepInterval.
	SweepInterval time.Duration
}

// Backend is the in-memory [algo.Backend]. Create it with [New] and stop its
// sweeper with [Backend.Close].
type Backend struct {
	now       func() time.Time
	seed      maphash.Seed
	shards    []shard
	mask      uint64
	shardCap  int
	evictions atomic.Uint64
	scratch   sync.Pool // of *scratch, for batches larger than stackBatch

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

type shard struct {
	mu sync.Mutex
	m  map[string]*entry
	_  [64 - 16]byte // one shard per 64-byte cache line: no false sharing
}

type entry struct {
	state   algo.State
	expires int64 // µs since the Unix epoch; the state is void from then on
}

var _ algo.Backend = (*Backend)(nil)

// New returns a memory backend configured by opts.
func New(opts Options) *Backend {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxKeys <= 0 {
		opts.MaxKeys = DefaultMaxKeys
	}
	if opts.Shards <= 0 {
		opts.Shards = DefaultShards
	}
	if opts.SweepInterval == 0 {
		opts.SweepInterval = DefaultSweepInterval
	}
	n := 1
	for n < opts.Shards {
		n <<= 1
	}
	for n > 1 && n > opts.MaxKeys {
		n >>= 1
	}
	b := &Backend{
		now:      opts.Now,
		seed:     maphash.MakeSeed(),
		shards:   make([]shard, n),
		mask:     uint64(n - 1),
		shardCap: opts.MaxKeys / n,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	for i := range b.shards {
		b.shards[i].m = make(map[string]*entry)
	}
	if opts.SweepInterval > 0 {
		go b.sweepEvery(opts.SweepInterval)
	} else {
		close(b.done)
	}
	return b
}

// Close stops the background sweeper. The backend still decides afterwards.
func (b *Backend) Close() error {
	b.closeOnce.Do(func() { close(b.stop) })
	<-b.done
	return nil
}

// Len returns the number of keys tracked, expired or not yet swept ones
// included.
func (b *Backend) Len() int {
	n := 0
	for i := range b.shards {
		sh := &b.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Evictions returns how many live entries were evicted because their shard
// was full. Each one forgot a count, so a non-zero value means MaxKeys is
// too small for the traffic.
func (b *Backend) Evictions() uint64 {
	return b.evictions.Load()
}

// errShortOut reports a caller bug: fewer decision slots than requests.
var errShortOut = errors.New("memory: out is shorter than reqs")

// Decide implements [algo.Backend].
func (b *Backend) Decide(ctx context.Context, reqs []algo.Request, out []algo.Decision) error {
	if len(out) < len(reqs) {
		return errShortOut
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	now := b.now()
	if len(reqs) == 1 {
		b.decideOne(now, &reqs[0], &out[0])
		return nil
	}
	b.decideBatch(now, reqs, out)
	return nil
}

// Reset implements [algo.Resetter]: it forgets keys.
func (b *Backend) Reset(ctx context.Context, reqs []algo.Request) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for i := range reqs {
		k := reqs[i].Key
		sh := &b.shards[maphash.Bytes(b.seed, k)&b.mask]
		sh.mu.Lock()
		delete(sh.m, string(k))
		sh.mu.Unlock()
	}
	return nil
}

// decideOne is the single-request path: one shard, no scratch space.
func (b *Backend) decideOne(now time.Time, r *algo.Request, out *algo.Decision) {
	nowUS := now.UnixMicro()
	sh := &b.shards[maphash.Bytes(b.seed, r.Key)&b.mask]
	sh.mu.Lock()
	e := sh.m[string(r.Key)]
	var st algo.State
	if e != nil && e.expires > nowUS {
		st = e.state
	}
	d := algo.Apply(&st, now, r)
	if algo.Stores(r, &d) {
		sh.store(b, r.Key, e, st, nowUS+algo.Keep(r, &d).Microseconds(), nowUS, nil)
	}
	sh.mu.Unlock()
	*out = d
}

// decideBatch decides several requests atomically: it locks every shard the
// batch touches, in ascending order, computes every step, and stores the new
// states only when the batch is admitted.
func (b *Backend) decideBatch(now time.Time, reqs []algo.Request, out []algo.Decision) {
	nowUS := now.UnixMicro()
	var (
		hashBuf [stackBatch]uint64
		lockBuf [stackBatch]uint64
		origBuf [stackBatch]algo.State
		nextBuf [stackBatch]algo.State
		entBuf  [stackBatch]*entry
		dupBuf  [stackBatch]int32
	)
	hashes, locks := hashBuf[:0], lockBuf[:0]
	orig, next := origBuf[:0], nextBuf[:0]
	ents, dups := entBuf[:0], dupBuf[:0]
	var sc *scratch
	if len(reqs) > stackBatch {
		if sc, _ = b.scratch.Get().(*scratch); sc == nil {
			sc = &scratch{last: make(map[uint64]int32)}
		}
		defer sc.put(&b.scratch)
		hashes, locks, orig, next, ents, dups = sc.hashes[:0], sc.locks[:0], sc.orig[:0], sc.next[:0], sc.ents[:0], sc.dups[:0]
	}
	hashes, locks, dups = b.locate(reqs, sc, hashes, locks, dups)
	for _, s := range locks {
		b.shards[s].mu.Lock()
	}
	var admit bool
	orig, next, ents, admit = b.tentative(now, nowUS, reqs, out, hashes, dups, orig, next, ents)
	if admit {
		b.storeAdmitted(nowUS, reqs, out, hashes, dups, next, ents)
	} else {
		b.refuse(now, nowUS, reqs, out, orig, next, ents, dups, hashes)
	}
	for j := len(locks) - 1; j >= 0; j-- {
		b.shards[locks[j]].mu.Unlock()
	}
	if sc != nil {
		sc.hashes, sc.locks, sc.orig, sc.next, sc.ents, sc.dups = hashes, locks, orig, next, ents, dups
	}
}

// locate appends to hashes the hash of each request's key, to dups the
// latest earlier request of the batch with the same key (-1: none), and
// to locks the shards the batch touches, in ascending order. A batch
// larger than stackBatch finds its duplicates through sc's index of the
// hashes; a smaller one (sc nil) by scanning.
func (b *Backend) locate(reqs []algo.Request, sc *scratch, hashes, locks []uint64, dups []int32) ([]uint64, []uint64, []int32) {
	for i := range reqs {
		h := maphash.Bytes(b.seed, reqs[i].Key)
		hashes = append(hashes, h)
		locks = insertSorted(locks, h&b.mask)
		// dups[i]: the latest earlier request of the same key, or -1.
		// Hashes first: long keys compare only on a match.
		d := int32(-1)
		if sc == nil {
			for j := i - 1; j >= 0; j-- {
				if hashes[j] == h && string(reqs[j].Key) == string(reqs[i].Key) {
					d = int32(j)
					break
				}
			}
		} else {
			for j, ok := sc.last[h]; ok && j >= 0; j = sc.prev[j] {
				if string(reqs[j].Key) == string(reqs[i].Key) {
					d = j
					break
				}
			}
			if j, ok := sc.last[h]; ok {
				sc.prev = append(sc.prev, j)
			} else {
				sc.prev = append(sc.prev, -1)
			}
			sc.last[h] = int32(i)
		}
		dups = append(dups, d)
	}
	return hashes, locks, dups
}

// tentative decides every request into out, without storing anything:
// each from its key's state as stored (appended to orig, and its entry
// to ents), or as an earlier request of the batch with the same key left
// it; the state each leaves is appended to next. admit reports whether
// every request not in shadow mode was allowed. The shards must be
// locked.
func (b *Backend) tentative(now time.Time, nowUS int64, reqs []algo.Request, out []algo.Decision, hashes []uint64, dups []int32,
	orig, next []algo.State, ents []*entry) (_, _ []algo.State, _ []*entry, admit bool) {
	admit = true
	for i := range reqs {
		r := &reqs[i]
		var (
			e  *entry
			st algo.State
		)
		if j := dups[i]; j >= 0 {
			// A key seen earlier in this batch continues from that
			// request's tentative state.
			e, st = ents[j], next[j]
			orig = append(orig, orig[j])
		} else {
			e = b.shards[hashes[i]&b.mask].m[string(r.Key)]
			if e != nil && e.expires > nowUS {
				st = e.state
			}
			orig = append(orig, st)
		}
		ents = append(ents, e)
		next = append(next, st)
		d := algo.Apply(&next[i], now, r)
		out[i] = d
		if !d.Allowed && !r.Shadow {
			admit = false
		}
	}
	return orig, next, ents, admit
}

// storeAdmitted stores, in order, the states the requests of an admitted
// batch left (next, as tentative computed them), updating ents. The shards
// must be locked.
func (b *Backend) storeAdmitted(nowUS int64, reqs []algo.Request, out []algo.Decision, hashes []uint64, dups []int32, next []algo.State, ents []*entry) {
	for i := range reqs {
		r := &reqs[i]
		// An earlier store in this batch may have created the entry.
		if j := dups[i]; j >= 0 {
			ents[i] = ents[j]
		}
		if !algo.Stores(r, &out[i]) {
			continue
		}
		sh := &b.shards[hashes[i]&b.mask]
		ents[i] = sh.store(b, r.Key, ents[i], next[i], nowUS+algo.Keep(r, &out[i]).Microseconds(), nowUS, reqs)
	}
}

// refuse decides a refused batch again, consuming nothing but the hits of
// its counting requests (see count): every decision reports the state as
// it stands (orig), not as earlier requests of this batch would have left
// it, and refused requests keep their refusal and retry-after. The shards
// must be locked.
func (b *Backend) refuse(now time.Time, nowUS int64, reqs []algo.Request, out []algo.Decision, orig, next []algo.State, ents []*entry, dups []int32, hashes []uint64) {
	counting := false
	for i := range reqs {
		if reqs[i].Counting() {
			counting = true
			continue
		}
		d := algo.Step(&orig[i], now, reqs[i].Limit, 0)
		if !out[i].Allowed {
			d.Allowed, d.RetryAfter = false, out[i].RetryAfter
		}
		out[i] = d
	}
	if counting {
		b.count(now, nowUS, reqs, out, orig, next, ents, dups, hashes)
	}
}

// count decides again, in order, the requests of a refused batch that
// count ([algo.Request.Count]), from the states the batch found (orig),
// each continuing from the last earlier counting request of its key, and
// stores what they leave: a refused batch consumes their hits all the
// same. A take is decided as a plain request: a refused batch leases
// nothing. next holds the states of the first pass, which count
// overwrites; ents the entries, which it updates. The shards must be
// locked.
func (b *Backend) count(now time.Time, nowUS int64, reqs []algo.Request, out []algo.Decision, orig, next []algo.State, ents []*entry, dups []int32, hashes []uint64) {
	for i := range reqs {
		r := reqs[i]
		if !r.Counting() {
			continue
		}
		j := dups[i]
		for j >= 0 && !reqs[j].Counting() {
			j = dups[j]
		}
		if j >= 0 {
			next[i] = next[j]
		} else {
			next[i] = orig[i]
			next[i].Log = slices.Clone(orig[i].Log) // the first pass may have written past its end
		}
		if r.Op == algo.OpTake {
			r.Op = algo.OpDecide
		}
		out[i] = algo.Apply(&next[i], now, &r)
		if !algo.Stores(&r, &out[i]) {
			continue
		}
		// In order: a key keeps the state of its last request.
		e := ents[i]
		for j := dups[i]; j >= 0; j = dups[j] {
			if ents[j] != nil {
				e = ents[j]
				break
			}
		}
		sh := &b.shards[hashes[i]&b.mask]
		ents[i] = sh.store(b, r.Key, e, next[i], nowUS+algo.Keep(&r, &out[i]).Microseconds(), nowUS, reqs)
	}
}

// scratch is the working space of a batch larger than stackBatch, reused
// across batches: a report of many keys would otherwise allocate (and the
// garbage collector scan) several slices per call.
type scratch struct {
	hashes, locks []uint64
	orig, next    []algo.State
	ents          []*entry
	dups, prev    []int32
	last          map[uint64]int32 // hash → the latest request of the batch with it
}

// put clears what sc refers to and returns it to pool.
func (sc *scratch) put(pool *sync.Pool) {
	clear(sc.orig[:cap(sc.orig)])
	clear(sc.next[:cap(sc.next)])
	clear(sc.ents[:cap(sc.ents)])
	clear(sc.last)
	sc.prev = sc.prev[:0]
	pool.Put(sc)
}

// store saves st under key until expires and returns its entry. e is the
// key's current entry or nil; batch holds the requests being decided, whose
// keys must not be evicted to make room. The shard must be locked.
func (sh *shard) store(b *Backend, key []byte, e *entry, st algo.State, expires, nowUS int64, batch []algo.Request) *entry {
	if e != nil {
		e.state, e.expires = st, expires
		return e
	}
	if len(sh.m) >= b.shardCap {
		sh.makeRoom(b, nowUS, batch)
	}
	e = &entry{state: st, expires: expires}
	sh.m[string(key)] = e
	return e
}

// makeRoom frees one slot in a full shard: an expired entry if the sample
// holds one, else the sampled entry closest to expiry. Keys of batch are
// passed over; when the sample holds nothing else, nothing is freed.
func (sh *shard) makeRoom(b *Backend, nowUS int64, batch []algo.Request) {
	var (
		victim  string
		soonest int64
		seen    int
	)
	for k, e := range sh.m { // map iteration starts at a random position
		if inBatch(batch, k) {
			continue
		}
		if e.expires <= nowUS {
			delete(sh.m, k)
			return
		}
		if seen == 0 || e.expires < soonest {
			victim, soonest = k, e.expires
		}
		if seen++; seen == evictionSample {
			break
		}
	}
	if seen > 0 {
		delete(sh.m, victim)
		b.evictions.Add(1)
	}
}

func inBatch(batch []algo.Request, key string) bool {
	for i := range batch {
		if string(batch[i].Key) == key {
			return true
		}
	}
	return false
}

// Sweep removes every expired entry now. The backend calls it every
// [Options.SweepInterval]; tests with a fake clock call it directly.
func (b *Backend) Sweep() {
	nowUS := b.now().UnixMicro()
	for i := range b.shards {
		sh := &b.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if e.expires <= nowUS {
				delete(sh.m, k)
			}
		}
		sh.mu.Unlock()
	}
}

func (b *Backend) sweepEvery(d time.Duration) {
	defer close(b.done)
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
			b.Sweep()
		}
	}
}

// insertSorted inserts v into the ascending slice s unless present.
func insertSorted(s []uint64, v uint64) []uint64 {
	i := len(s)
	for i > 0 && s[i-1] > v {
		i--
	}
	if i > 0 && s[i-1] == v {
		return s
	}
	s = append(s, 0)
	copy(s[i+1:], s[i:])
	s[i] = v
	return s
}
