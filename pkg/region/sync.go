package region

import (
	"context"
	"sync"
	"time"

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
			e.push(ctx, i, pushes[n].reqs, pushes[n].sent)
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
			e.push(ctx, i, []*ratelimitdv1.PushRequest{{Region: e.opts.Region, Weight: e.opts.Weight}}, nil)
			if !p.failed {
				o := e.everyCount(i)
				e.push(ctx, i, o.reqs, o.sent)
			}
		}()
	}
	e.refresh(ctx, refresh, now)
	e.load(ctx, now)
	e.notePartitions(now)
}

// outgoing is a push being made for one peer: its requests, and the
// counts they carry, to note once acknowledged.
type outgoing struct {
	reqs []*ratelimitdv1.PushRequest
	sent []sentCount
}

// scan makes the pushes of this round to the ready peers (see
// sentCount) and returns the reads that refresh this region's count of
// this round's part of the keys decided here. Most rounds it goes over the
// keys whose count grew since a round pushed them to every peer (the
// shards' dirty lists); every FullEvery rounds, or when a ready peer is
// due a full push, over every key, a shard at a time: it then also forgets
// the windows that ended more than a window ago and the keys left with
// none that are not decided here any more, and refreshes a part of the
// keys (every key once every refreshRounds rounds).
func (e *Engine) scan(now time.Time, ready []int) ([]outgoing, []algo.Request) {
	ms := now.UnixMilli()
	out := make([]outgoing, len(ready))
	full := make([]bool, len(ready))
	all := e.ticks%e.opts.FullEvery == 0
	for n, i := range ready {
		p := e.peers[i]
		full[n] = p.sent%e.opts.FullEvery == 0
		all = all || full[n]
		p.sent++
		out[n].reqs = []*ratelimitdv1.PushRequest{{Region: e.opts.Region, Weight: e.opts.Weight}}
	}
	// The dirty lists are emptied once every peer was offered them.
	settled := len(ready) == len(e.peers)
	var refresh []algo.Request
	for si := range e.shards {
		sh := &e.shards[si]
		sh.mu.Lock()
		if all {
			part := -1
			if e.ticks%e.opts.FullEvery == 0 {
				part = (e.ticks / e.opts.FullEvery) % (refreshRounds / e.opts.FullEvery)
			}
			refresh = e.scanShard(sh, ms, now, ready, full, out, part, refresh)
		} else {
			for _, ks := range sh.dirty {
				e.offer(sh, ks, ready, full, out)
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
	return out, refresh
}

// everyCount returns a full push to peer i, made apart from a round.
func (e *Engine) everyCount(i int) outgoing {
	out := []outgoing{{reqs: []*ratelimitdv1.PushRequest{{Region: e.opts.Region, Weight: e.opts.Weight}}}}
	now := e.opts.Now()
	for si := range e.shards {
		sh := &e.shards[si]
		sh.mu.Lock()
		e.scanShard(sh, now.UnixMilli(), now, []int{i}, []bool{true}, out, -1, nil)
		sh.mu.Unlock()
	}
	return out[0]
}

// scanShard is scan's work on every key of sh, whose mutex is held:
// refreshing the keys decided here of refresh group part (-1: none).
func (e *Engine) scanShard(sh *shard, ms int64, now time.Time, ready []int, full []bool, out []outgoing, part int, refresh []algo.Request) []algo.Request {
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
		e.offer(sh, ks, ready, full, out)
		if decided && ks.part%(refreshRounds/e.opts.FullEvery) == part {
			refresh = append(refresh, algo.Request{Key: ks.key, Limit: ks.limit, Peek: true, Global: ks.global})
		}
	}
	return refresh
}

// offer adds the counts of ks to the pushes to the ready peers: those
// that grew since the peer acknowledged them, or all on a full push.
// sh's mutex is held.
func (e *Engine) offer(sh *shard, ks *keyState, ready []int, full []bool, out []outgoing) {
	for j := range ks.win {
		w := &ks.win[j]
		if w.Start == 0 || w.own == 0 {
			continue
		}
		for n, i := range ready {
			if !full[n] && w.own <= w.acked[i] {
				continue
			}
			o := &out[n]
			req := o.reqs[len(o.reqs)-1]
			if len(req.Counts) == maxPushCounts {
				req = &ratelimitdv1.PushRequest{Region: e.opts.Region, Weight: e.opts.Weight}
				o.reqs = append(o.reqs, req)
			}
			req.Counts = append(req.Counts, &ratelimitdv1.RegionCount{Key: ks.key, WindowStartMs: w.Start, WindowMs: w.Length, Count: w.own})
			o.sent = append(o.sent, sentCount{sh: sh, key: ks.key, window: w.Window, count: w.own})
		}
	}
}

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
	e.pmu.Lock()
	defer e.pmu.Unlock()
	p := e.peers[i]
	if at.After(p.heard) {
		p.heard = at
	}
	if weight > 0 {
		p.weight = weight
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
	if ws == nil || c.Count <= ws.remote[i] {
		return
	}
	if !ws.at[i].IsZero() {
		if dt := now.Sub(ws.at[i]).Seconds(); dt > 0 {
			ws.rate[i] = float64(c.Count-ws.remote[i]) / dt
		}
	}
	ws.remote[i], ws.at[i] = c.Count, now
}

// sentCount is a count pushed to a peer, to note once acknowledged. A
// push carries this region's counts that grew since the peer acknowledged
// them, or every count on a full push (every FullEvery pushes, and once a
// peer that failed answers again); a push with no count still tells the
// peer this region is heard.
type sentCount struct {
	sh     *shard
	key    []byte
	window Window
	count  uint64
}

// pushRetries is how many times a push that failed is sent again, a
// quarter interval apart, before the next tick sends newer counts: a link
// that comes back is used within a quarter interval, not a whole one.
const pushRetries = 3

// push sends reqs to peer i and, once all are acknowledged, notes sent as
// the counts the peer holds. A push that fails is sent again up to
// pushRetries times; a count the peer already held is merged again,
// harmlessly.
func (e *Engine) push(ctx context.Context, i int, reqs []*ratelimitdv1.PushRequest, sent []sentCount) {
	p := e.peers[i]
	for attempt := 0; ; attempt++ {
		err := e.send(ctx, p, reqs)
		if err == nil {
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
	p.lastPush = e.opts.Now()
	// sent is in shard order (scan's): one lock per shard.
	var locked *shard
	for _, s := range sent {
		if s.sh != locked {
			if locked != nil {
				locked.mu.Unlock()
			}
			locked = s.sh
			locked.mu.Lock()
		}
		if ks := s.sh.keys[string(s.key)]; ks != nil {
			if ws := e.window(ks, s.window, false); ws != nil {
				ws.acked[i] = max(ws.acked[i], s.count)
			}
		}
	}
	if locked != nil {
		locked.mu.Unlock()
	}
}

// send sends the pushes reqs to p, and counts them.
func (e *Engine) send(ctx context.Context, p *peer, reqs []*ratelimitdv1.PushRequest) error {
	for _, req := range reqs {
		cctx, cancel := context.WithTimeout(ctx, e.timeout())
		_, err := p.client.Push(cctx, req)
		cancel()
		e.pushes.Add(1)
		e.pushBytes.Add(uint64(proto.Size(req)))
		e.pushCounts.Add(uint64(len(req.Counts)))
		if err != nil {
			e.pushFailures.Add(1)
			return err
		}
	}
	return nil
}

// notePartitions logs each peer that became cut off, or heard again.
func (e *Engine) notePartitions(now time.Time) {
	e.pmu.Lock()
	defer e.pmu.Unlock()
	for _, p := range e.peers {
		cut := e.cutOff(p, now)
		if cut == p.cut {
			continue
		}
		p.cut = cut
		if cut {
			e.opts.Logger.Warn("region sync: a peer is cut off; global limits count it as its share, or as its last count if more (on_partition: share), or are decided per region (exact-local)",
				"peer", p.Name, "unheard_for", now.Sub(p.heard).Round(time.Millisecond), "partition_after", e.opts.PartitionAfter)
		} else {
			e.opts.Logger.Info("region sync: a cut-off peer is heard again", "peer", p.Name)
		}
	}
}
