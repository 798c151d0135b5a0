package region

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

// Run exchanges counts with the peers every interval until ctx ends. At
// each tick it pushes this region's own counts to every peer, each push
// on its own (a peer whose last push is still on its way is skipped), and
// reads from the store what the peers pushed to any replica of the
// region, which it also does every quarter interval in between. Run
// returns once ctx is done and the pushes on their way have ended.
func (e *Engine) Run(ctx context.Context) {
	t := time.NewTicker(e.opts.Interval)
	defer t.Stop()
	// The store is read four times a round: reading what arrived costs
	// little, and a replica then learns a push its sibling received within
	// a quarter interval.
	read := time.NewTicker(e.opts.Interval / 4)
	defer read.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		e.tick(ctx, &wg)
		for again := true; again; {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				again = false
			case <-read.C:
				e.load(ctx, e.opts.Now())
			}
		}
	}
}

// tick is one round of Run.
func (e *Engine) tick(ctx context.Context, wg *sync.WaitGroup) {
	now := e.opts.Now()
	var ready, down []int // the peers whose last push is done: answering, or not
	for i, p := range e.peers {
		switch {
		case !p.busy.CompareAndSwap(false, true):
		case p.failed:
			down = append(down, i)
		default:
			ready = append(ready, i)
		}
	}
	pushes, refresh := e.scan(now, ready)
	e.ticks++
	for n, i := range ready {
		p := e.peers[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer p.busy.Store(false)
			e.push(ctx, i, pushes[n])
		}()
	}
	// A peer whose last push failed is sent an empty push, which costs
	// nothing to make; once it answers, every count follows at once. So a
	// peer that is down costs a heartbeat a round.
	for _, i := range down {
		p := e.peers[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer p.busy.Store(false)
			e.push(ctx, i, e.encode(nil, nil))
			if !p.failed {
				e.push(ctx, i, e.everyCount(i))
			}
		}()
	}
	e.refresh(ctx, refresh, now)
	e.load(ctx, now)
	e.notePartitions(now)
}

// offered is what a round offers the peers: the counts every ready peer
// is sent (common), and those only some are (only, by ready peer), each
// beside what to note once the peer acknowledges it.
type offered struct {
	common     []*ratelimitdv1.RegionCount
	commonSent []sentCount
	only       [][]*ratelimitdv1.RegionCount
	onlySent   [][]sentCount
}

// scan makes the pushes of this round to the ready peers and returns the
// reads that refresh this region's count of this round's part of the keys
// decided here. Most rounds it goes over the keys whose count grew since
// a round offered them to every peer (the shards' dirty lists); every
// scanEvery rounds, or when a ready peer is due a full push (every
// FullEvery), over every key, a shard at a time: it then also forgets the
// windows that ended more than a window ago and the keys left with none
// that are not decided here any more, and refreshes a part of the keys
// not decided lately (each such key once every refreshRounds rounds), so
// that what a replica knows of its region's count of a key is never more
// than about 2·refreshRounds rounds old.
func (e *Engine) scan(now time.Time, ready []int) ([]outgoing, []algo.Request) {
	ms := now.UnixMilli()
	full := make([]bool, len(ready))
	all := e.ticks%scanEvery == 0
	for n, i := range ready {
		p := e.peers[i]
		if now.Sub(p.lastFull) >= e.opts.FullEvery {
			full[n] = true
			p.lastFull = now
		}
		all = all || full[n]
	}
	o := offered{only: make([][]*ratelimitdv1.RegionCount, len(ready)), onlySent: make([][]sentCount, len(ready))}
	// The dirty lists are emptied once every peer was offered them.
	settled := len(ready) == len(e.peers)
	var refresh []algo.Request
	for si := range e.shards {
		sh := &e.shards[si]
		sh.mu.Lock()
		if all {
			part := -1
			if e.ticks%scanEvery == 0 {
				part = (e.ticks / scanEvery) % (refreshRounds / scanEvery)
			}
			refresh = e.scanShard(sh, ms, now, ready, full, &o, part, refresh)
		} else {
			for _, ks := range sh.dirty {
				e.offer(sh, ks, ready, full, &o)
			}
		}
		if settled {
			for _, ks := range sh.dirty {
				ks.dirty = false
			}
			clear(sh.dirty)
			sh.dirty = sh.dirty[:0]
		}
		sh.mu.Unlock()
	}
	// The counts common to every ready peer are encoded once.
	common := e.encode(o.common, o.commonSent)
	out := make([]outgoing, len(ready))
	for n := range ready {
		out[n] = common
		if len(o.only[n]) > 0 {
			own := e.encode(o.only[n], o.onlySent[n])
			out[n] = outgoing{reqs: append(slices.Clip(common.reqs), own.reqs...), sent: append(slices.Clip(common.sent), own.sent...)}
		}
	}
	return out, refresh
}

// everyCount returns a full push to peer i, made apart from a round.
func (e *Engine) everyCount(i int) outgoing {
	o := offered{only: make([][]*ratelimitdv1.RegionCount, 1), onlySent: make([][]sentCount, 1)}
	now := e.opts.Now()
	e.peers[i].lastFull = now
	for si := range e.shards {
		sh := &e.shards[si]
		sh.mu.Lock()
		e.scanShard(sh, now.UnixMilli(), now, []int{i}, []bool{true}, &o, -1, nil)
		sh.mu.Unlock()
	}
	return e.encode(o.common, o.commonSent)
}

// scanShard is scan's work on every key of sh, whose mutex is held:
// refreshing the keys decided here of refresh group part (-1: none).
func (e *Engine) scanShard(sh *shard, ms int64, now time.Time, ready []int, full []bool, o *offered, part int, refresh []algo.Request) []algo.Request {
	for k, ks := range sh.keys {
		// A key decided here stays while it may be decided again in this
		// window or the next.
		decided := ks.limit.Window > 0 && now.Sub(ks.used) < 2*ks.limit.Window
		live := decided
		for j := range ks.win {
			w := &ks.win[j]
			if w.Start != 0 && w.End()+w.Length <= ms {
				*w = winState{}
			}
			live = live || w.Start != 0
		}
		if !live {
			delete(sh.keys, k) // a dirty list may still hold it: harmless
			continue
		}
		e.offer(sh, ks, ready, full, o)
		// A key decided within the last refreshRounds rounds learned its
		// count then; only those idle for longer are read.
		if decided && ks.part%(refreshRounds/scanEvery) == part && now.Sub(ks.used) >= refreshRounds*e.opts.Interval {
			refresh = append(refresh, algo.Request{Key: ks.key, Limit: ks.limit, Peek: true, Global: ks.global})
		}
	}
	return refresh
}

// offer adds the counts of ks to the pushes to the ready peers: those
// that grew since the peer acknowledged them, or all on a full push; a
// count every ready peer is due goes to the common part. sh's mutex is
// held.
func (e *Engine) offer(sh *shard, ks *keyState, ready []int, full []bool, o *offered) {
	for j := range ks.win {
		w := &ks.win[j]
		if w.Start == 0 || w.own == 0 {
			continue
		}
		due := 0
		for n, i := range ready {
			if full[n] || w.own > w.peers[i].acked {
				due++
			}
		}
		if due == 0 {
			continue
		}
		rc := &ratelimitdv1.RegionCount{Key: ks.key, WindowStartMs: w.Start, WindowMs: w.Length, Count: w.own}
		sc := sentCount{sh: sh, ks: ks, window: w.Window, count: w.own}
		if due == len(ready) {
			o.common, o.commonSent = append(o.common, rc), append(o.commonSent, sc)
			continue
		}
		for n, i := range ready {
			if full[n] || w.own > w.peers[i].acked {
				o.only[n], o.onlySent[n] = append(o.only[n], rc), append(o.onlySent[n], sc)
			}
		}
	}
}

// outgoing is a push being made for one peer: its requests, each
// encoded, and the counts they carry, to note once acknowledged. Peers
// sent the same counts share them.
type outgoing struct {
	reqs []*encodedPush
	sent []sentCount
}

// encodedPush is one PushRequest, encoded: this region's name and weight,
// then its counts. Encoded once, it is sent to any number of peers.
type encodedPush struct {
	header, counts []byte
	n              int // counts carried
}

// encode makes the requests of a push of counts: one with none if there
// are none, else as many as it takes of at most maxPushCounts each.
func (e *Engine) encode(counts []*ratelimitdv1.RegionCount, sent []sentCount) outgoing {
	header, _ := proto.Marshal(&ratelimitdv1.PushRequest{Region: e.opts.Region, Weight: e.opts.Weight})
	out := outgoing{sent: sent}
	for first := true; first || len(counts) > 0; first = false {
		part := counts[:min(len(counts), maxPushCounts)]
		counts = counts[len(part):]
		// Encoded messages of one type concatenated decode as their merge:
		// the header's fields, and the counts.
		b, _ := proto.Marshal(&ratelimitdv1.PushRequest{Counts: part})
		out.reqs = append(out.reqs, &encodedPush{header: header, counts: b, n: len(part)})
	}
	return out
}

// pushCodec sends an [encodedPush] as it is, and anything else as the
// proto codec does, whose name it takes: the receiver decodes the push
// as the PushRequest it is.
type pushCodec struct{ proto encoding.CodecV2 }

func (c pushCodec) Marshal(v any) (mem.BufferSlice, error) {
	if p, ok := v.(*encodedPush); ok {
		out := mem.BufferSlice{mem.SliceBuffer(p.header)}
		if len(p.counts) > 0 {
			out = append(out, mem.SliceBuffer(p.counts))
		}
		return out, nil
	}
	return c.proto.Marshal(v)
}

func (c pushCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }
func (c pushCodec) Name() string                                { return c.proto.Name() }

// timeout bounds a call to the store or to a peer.
func (e *Engine) timeout() time.Duration { return max(4*e.opts.Interval, time.Second) }

// readBatch and readBatches bound one round's reading of the store.
const (
	readBatch   = 1000
	readBatches = 20
)

// load reads the pushes the region's replicas received since the last
// round, and notes each peer's counts and hearing.
func (e *Engine) load(ctx context.Context, now time.Time) {
	ctx, cancel := context.WithTimeout(ctx, e.timeout())
	defer cancel()
	for range readBatches {
		pushes, cursor, err := e.opts.Store.Read(ctx, e.cursor, readBatch)
		if err != nil {
			if ctx.Err() == nil {
				e.opts.Logger.Warn("region sync: reading the peers' pushes failed; deciding by the counts known", "error", err)
			}
			return
		}
		e.cursor = cursor
		for i := range pushes {
			p := &pushes[i]
			e.hear(p.Region, p.At, p.Weight)
			for j := range p.Counts {
				e.merge(&p.Counts[j], now)
			}
		}
		if len(pushes) < readBatch {
			return
		}
	}
}

// refreshBatch bounds the reads of one call refreshing counts, so that
// the backend serves decisions between them.
const refreshBatch = 256

// refresh reads from the region's backend this region's count of the keys
// of reqs (reads that store nothing), each in its current window: a
// replica learns its region's count from its own decisions, so this finds
// its siblings' hits, those of a sibling that died before it pushed them
// among them.
func (e *Engine) refresh(ctx context.Context, reqs []algo.Request, now time.Time) {
	for len(reqs) > 0 {
		batch := reqs[:min(len(reqs), refreshBatch)]
		reqs = reqs[len(batch):]
		out := make([]algo.Decision, len(batch))
		cctx, cancel := context.WithTimeout(ctx, e.timeout())
		err := e.inner.Decide(cctx, batch, out)
		cancel()
		if err != nil {
			return // the next rounds try again; decisions keep counting meanwhile
		}
		e.observe(batch, make([]*keyState, len(batch)), out, now)
	}
}

// hear notes that peer region was heard at at, announcing weight.
func (e *Engine) hear(region string, at time.Time, weight float64) {
	i, ok := e.index[region]
	if !ok {
		return
	}
	p := e.peers[i]
	for ns := at.UnixNano(); ; {
		last := p.heard.Load()
		if ns <= last || p.heard.CompareAndSwap(last, ns) {
			break
		}
	}
	if weight > 0 {
		p.weight.Store(math.Float64bits(weight))
	}
}

// merge records a peer's count heard at now, if larger than the one
// known.
func (e *Engine) merge(c *Count, now time.Time) {
	i, ok := e.index[c.Region]
	if !ok || c.Count == 0 {
		return
	}
	sh := e.shardOf(c.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ks := sh.keys[string(c.Key)]
	if ks == nil {
		ks = e.newKey(sh, c.Key)
	}
	ws := e.window(ks, c.Window, true)
	if ws == nil || c.Count <= ws.peers[i].remote {
		return
	}
	pc := &ws.peers[i]
	if pc.at != 0 {
		if dt := float64(now.UnixNano()-pc.at) / 1e9; dt > 0 {
			pc.rate = float64(c.Count-pc.remote) / dt
		}
	}
	pc.remote, pc.at = c.Count, now.UnixNano()
}

// sentCount is a count pushed to a peer, to note once acknowledged. A
// push carries this region's counts that grew since the peer acknowledged
// them, or every count on a full push (every FullEvery, and once a peer
// that failed answers again); a push with no count still tells the peer
// this region is heard.
type sentCount struct {
	sh     *shard
	ks     *keyState // forgotten since, noting it is harmless
	window Window
	count  uint64
}

// pushRetries is how many times a push that failed is sent again, a
// quarter interval apart, before the next tick sends newer counts: a link
// that comes back is used within a quarter interval, not a whole one.
const pushRetries = 3

// push sends o to peer i and, once all its requests are acknowledged,
// notes the counts the peer holds. A push that fails is sent again up to
// pushRetries times; a count the peer already held is merged again,
// harmlessly.
func (e *Engine) push(ctx context.Context, i int, o outgoing) {
	p := e.peers[i]
	for attempt := 0; ; attempt++ {
		start := time.Now()
		err := e.send(ctx, p, o.reqs)
		if err == nil {
			p.took.Store(int64(time.Since(start)))
			break
		}
		if attempt == pushRetries || ctx.Err() != nil {
			if !p.failed && ctx.Err() == nil {
				e.opts.Logger.Warn("region sync: push to a peer failed; its counts are pushed whole once it answers", "peer", p.Name, "addr", p.Addr, "error", err)
			}
			p.failed = true
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(e.opts.Interval / 4):
		}
	}
	if p.failed {
		e.opts.Logger.Info("region sync: a peer answers again", "peer", p.Name)
	}
	p.failed = false
	// sent is mostly in shard order (scan's): one lock per run of a shard.
	var locked *shard
	for _, s := range o.sent {
		if s.sh != locked {
			if locked != nil {
				locked.mu.Unlock()
			}
			locked = s.sh
			locked.mu.Lock()
		}
		if ws := e.window(s.ks, s.window, false); ws != nil {
			ws.peers[i].acked = max(ws.peers[i].acked, s.count)
		}
	}
	if locked != nil {
		locked.mu.Unlock()
	}
}

// send sends the requests reqs to p, and counts them.
func (e *Engine) send(ctx context.Context, p *peer, reqs []*encodedPush) error {
	for _, req := range reqs {
		cctx, cancel := context.WithTimeout(ctx, e.timeout())
		err := p.conn.Invoke(cctx, ratelimitdv1.RegionSync_Push_FullMethodName, req, new(ratelimitdv1.PushResponse), e.codec)
		cancel()
		e.pushes.Add(1)
		e.pushBytes.Add(uint64(len(req.header) + len(req.counts)))
		e.pushCounts.Add(uint64(req.n))
		if err != nil {
			e.pushFailures.Add(1)
			return err
		}
	}
	return nil
}

// notePartitions logs each peer that became cut off, or heard again.
func (e *Engine) notePartitions(now time.Time) {
	for _, p := range e.peers {
		cut := e.cutOff(p, now)
		if cut == p.cut {
			continue
		}
		p.cut = cut
		if cut {
			e.opts.Logger.Warn("region sync: a peer is cut off; global limits count it as its share, or as its last count if more (on_partition: share), or are decided per region (exact-local)",
				"peer", p.Name, "unheard_for", now.Sub(p.heardAt()).Round(time.Millisecond), "partition_after", e.opts.PartitionAfter)
		} else {
			e.opts.Logger.Info("region sync: a cut-off peer is heard again", "peer", p.Name)
		}
	}
}
