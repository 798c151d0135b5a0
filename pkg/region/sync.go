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
// each tick it reads from the store what the peers pushed to any replica
// of the region, then pushes this region's own counts to every peer, each
// push on its own (a peer whose last push is still on its way is skipped).
// Run returns once ctx is done and the pushes on their way have ended.
func (e *Engine) Run(ctx context.Context) {
	t := time.NewTicker(e.opts.Interval)
	defer t.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		e.tick(ctx, &wg)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// tick is one round of Run.
func (e *Engine) tick(ctx context.Context, wg *sync.WaitGroup) {
	now := e.opts.Now()
	if e.ticks%e.opts.FullEvery == 0 {
		e.refresh(ctx, now)
	}
	e.ticks++
	windows := e.prune(now)
	e.load(ctx, windows, now)
	e.write(ctx)
	for i, p := range e.peers {
		if !p.busy.CompareAndSwap(false, true) {
			continue
		}
		reqs, sent := e.pushOf(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer p.busy.Store(false)
			e.push(ctx, i, reqs, sent)
		}()
	}
	e.notePartitions(now)
}

// timeout bounds a call to the store or to a peer.
func (e *Engine) timeout() time.Duration { return max(4*e.opts.Interval, time.Second) }

// prune forgets the windows that ended more than a window ago, and the
// keys left with none, and returns the windows to read from the store:
// the current and the previous one of every window length in use.
func (e *Engine) prune(now time.Time) []Window {
	ms := now.UnixMilli()
	lengths := make(map[int64]bool)
	e.mu.Lock()
	for k, ks := range e.keys {
		// A key decided here stays while it may be decided again in this
		// window or the next, so that the peers' counts of its windows are
		// read even before this region counts anything in them.
		live := ks.limit.Window > 0 && now.Sub(ks.used) < 2*ks.limit.Window
		if live {
			lengths[max(ks.limit.Window.Milliseconds(), 1)] = true
		}
		for j := range ks.win {
			w := &ks.win[j]
			if w.Start != 0 && w.End()+w.Length <= ms {
				*w = winState{}
			}
			if w.Start != 0 {
				live = true
				lengths[w.Length] = true
			}
		}
		if !live {
			delete(e.keys, k)
		}
	}
	e.mu.Unlock()
	windows := make([]Window, 0, 2*len(lengths))
	for l := range lengths {
		w := windowOf(now, time.Duration(l)*time.Millisecond)
		windows = append(windows, w, Window{Length: l, Start: w.Start - l})
	}
	return windows
}

// load reads what the peers pushed in windows, and when each was heard.
func (e *Engine) load(ctx context.Context, windows []Window, now time.Time) {
	if len(windows) == 0 && len(e.peers) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, e.timeout())
	defer cancel()
	counts, heard, err := e.opts.Store.Load(ctx, windows)
	if err != nil {
		if ctx.Err() == nil {
			e.opts.Logger.Warn("region sync: reading the peers' counts failed; deciding by the counts known", "error", err)
		}
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for r, h := range heard {
		e.hear(r, h.At, h.Weight)
	}
	for i := range counts {
		e.merge(&counts[i], now)
	}
}

// refresh reads from the region's backend this region's count of every
// key decided here, in its current window: a replica learns its region's
// count from its own decisions, and its siblings' only through the store
// (write), so this finds the hits of a sibling that died before it wrote
// them. Once every FullEvery rounds.
func (e *Engine) refresh(ctx context.Context, now time.Time) {
	var reqs []algo.Request
	e.mu.Lock()
	for _, ks := range e.keys {
		if ks.limit.Window > 0 && now.Sub(ks.used) < 2*ks.limit.Window {
			reqs = append(reqs, algo.Request{Key: ks.key, Limit: ks.limit, Peek: true, Global: ks.global})
		}
	}
	e.mu.Unlock()
	if len(reqs) == 0 {
		return
	}
	out := make([]algo.Decision, len(reqs))
	ctx, cancel := context.WithTimeout(ctx, e.timeout())
	defer cancel()
	if err := e.inner.Decide(ctx, reqs, out); err != nil {
		return // the next round tries again; decisions keep counting meanwhile
	}
	e.observe(reqs, out, now)
}

// write stores this region's counts that grew since this replica last
// wrote them, for its siblings to read: each replica knows the count as
// of its own decisions, and they all push, so that the peers have the
// largest; written, each replica also knows its siblings'.
func (e *Engine) write(ctx context.Context) {
	var counts []Count
	type wrote struct {
		ws *winState
		n  uint64
	}
	var done []wrote
	e.mu.Lock()
	for _, ks := range e.keys {
		for j := range ks.win {
			w := &ks.win[j]
			if w.Start != 0 && w.own > w.wrote {
				counts = append(counts, Count{Region: e.opts.Region, Key: ks.key, Window: w.Window, Count: w.own})
				done = append(done, wrote{w, w.own})
			}
		}
	}
	e.mu.Unlock()
	if len(counts) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, e.timeout())
	defer cancel()
	if err := e.opts.Store.Merge(ctx, e.opts.Region, counts, nil); err != nil {
		return // written at the next round
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, d := range done {
		d.ws.wrote = max(d.ws.wrote, d.n) // a slot reused meanwhile holds a later window: no harm, it is written again
	}
}

// hear notes that peer region was heard at at, announcing weight.
// Called with e.mu held.
func (e *Engine) hear(region string, at time.Time, weight float64) {
	i, ok := e.index[region]
	if !ok {
		return
	}
	p := e.peers[i]
	if at.After(p.heard) {
		p.heard = at
	}
	if weight > 0 {
		p.weight = weight
	}
}

// merge records a peer's count heard at now, if larger than the one
// known. Called with e.mu held.
func (e *Engine) merge(c *Count, now time.Time) {
	if c.Region == e.opts.Region && c.Count > 0 {
		// A sibling's view of this region's count.
		if ks := e.keys[string(c.Key)]; ks != nil {
			if ws := e.window(ks, c.Window, true); ws != nil {
				ws.own = max(ws.own, c.Count)
				ws.wrote = max(ws.wrote, c.Count)
			}
		}
		return
	}
	i, ok := e.index[c.Region]
	if !ok || c.Count == 0 {
		return
	}
	ks := e.keys[string(c.Key)]
	if ks == nil {
		ks = &keyState{key: append([]byte(nil), c.Key...)}
		e.keys[string(ks.key)] = ks
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

// sentCount is a count pushed to a peer, to note once acknowledged.
type sentCount struct {
	key    string
	window Window
	count  uint64
}

// pushOf returns the pushes to peer i: this region's counts that grew
// since the peer acknowledged them, or every count on a full push (every
// FullEvery pushes, and after a failure). A push with no count still
// tells the peer this region is heard.
func (e *Engine) pushOf(i int) ([]*ratelimitdv1.PushRequest, []sentCount) {
	p := e.peers[i]
	full := p.failed || p.sent%e.opts.FullEvery == 0
	p.sent++
	req := &ratelimitdv1.PushRequest{Region: e.opts.Region, Weight: e.opts.Weight}
	reqs := []*ratelimitdv1.PushRequest{req}
	var sent []sentCount
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, ks := range e.keys {
		for j := range ks.win {
			w := &ks.win[j]
			if w.Start == 0 || w.own == 0 || (!full && w.own <= w.acked[i]) {
				continue
			}
			if len(req.Counts) == maxPushCounts {
				req = &ratelimitdv1.PushRequest{Region: e.opts.Region, Weight: e.opts.Weight}
				reqs = append(reqs, req)
			}
			req.Counts = append(req.Counts, &ratelimitdv1.RegionCount{Key: ks.key, WindowStartMs: w.Start, WindowMs: w.Length, Count: w.own})
			sent = append(sent, sentCount{key: k, window: w.Window, count: w.own})
		}
	}
	return reqs, sent
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
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range sent {
		if ks := e.keys[s.key]; ks != nil {
			if ws := e.window(ks, s.window, false); ws != nil {
				ws.acked[i] = max(ws.acked[i], s.count)
			}
		}
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
	e.mu.Lock()
	defer e.mu.Unlock()
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
