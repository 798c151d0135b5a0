package region

import (
	"context"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// GlobalState implements [algo.GlobalReader]: what this replica knows of
// key, a limit l of scope: global, in the window that holds now; false
// when l is not one the engine decides. This region's count is read from
// the backend (a read that stores nothing), as the other replicas of the
// region may have counted hits this one has not decided.
func (e *Engine) GlobalState(key []byte, l algo.Limit, g algo.Global) (algo.GlobalState, bool) {
	r := algo.Request{Key: key, Limit: l, Global: g}
	if !global(&r) {
		return algo.GlobalState{}, false
	}
	now := e.opts.Now()
	r.Peek = true
	out := make([]algo.Decision, 1)
	ctx, cancel := context.WithTimeout(context.Background(), e.timeout())
	var counted uint64 // this region's count, as the backend holds it
	if err := e.inner.Decide(ctx, []algo.Request{r}, out); err == nil && out[0].ResetAfter > 0 {
		counted = l.Requests - min(out[0].Remaining, l.Requests)
	}
	cancel()
	w := windowOf(now, l.Window)
	st := algo.GlobalState{Start: time.UnixMilli(w.Start), Window: time.Duration(w.Length) * time.Millisecond}
	sh := e.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ks := sh.keys[string(key)]
	if ks == nil {
		ks = &keyState{limit: l, global: g} // not kept: explaining changes nothing
	}
	ws := e.window(ks, w, false)
	own := algo.RegionCount{Region: e.opts.Region, Count: counted}
	if ws != nil {
		own.Count = max(own.Count, ws.own)
	}
	st.Counts = append(st.Counts, own)
	limitKS := *ks
	limitKS.limit = l
	st.Offset = e.offset(&limitKS, w, g, now)
	for i, p := range e.peers {
		rc := algo.RegionCount{Region: p.Name, Unheard: now.Sub(p.heardAt()), CutOff: e.cutOff(p, now)}
		if p.heardAt().IsZero() {
			rc.Unheard = -1
		}
		if ws != nil {
			rc.Count, rc.Rate = ws.peers[i].remote, ws.peers[i].rate
		}
		if rc.CutOff && g == algo.GlobalShare {
			rc.Reserved = max(rc.Count, e.share(i, l.Requests))
		}
		if rc.Unheard >= 0 {
			// What the peer counted since the push last heard was made: up
			// to an interval before it was sent, the push's way here
			// (about what this replica's pushes to it take), and since.
			st.Unseen += rc.Rate * (rc.Unheard + e.opts.Interval + time.Duration(p.took.Load())).Seconds()
		}
		st.Counts = append(st.Counts, rc)
	}
	return st, true
}

// Stats is a snapshot of an engine, for metrics.
type Stats struct {
	Region string
	// Keys is how many global keys the replica knows in their current or
	// previous window.
	Keys int
	// Known is, per region (this one included), the sum over those keys
	// of its count in their current window, as this replica knows it.
	Known map[string]uint64
	Peers []PeerStats
	// Pushes counts the pushes sent (one per peer per interval, or more
	// for over 10,000 counts), PushFailures those that failed, PushBytes
	// their size (protobuf) and PushCounts the counts they carried;
	// Received and ReceivedCounts the same of the pushes received;
	// Refused counts the pushes refused before any count was read: whose
	// caller did not prove to be the region they name (Options.
	// Authenticate), or that name a region not a peer.
	Pushes, PushFailures, PushBytes, PushCounts uint64
	Received, ReceivedCounts, Refused           uint64
}

// PeerStats is a peer as the engine sees it.
type PeerStats struct {
	Name, Addr string
	// Unheard is how long since any replica of this region last heard it
	// (negative: never); CutOff, whether it counts as cut off.
	Unheard time.Duration
	CutOff  bool
	Weight  float64
	// PushTook is how long this replica's last push to the peer took
	// until acknowledged (zero: none yet). The sync delay is at most an
	// interval, two such pushes and a quarter interval
	// (docs/multi-region.md#the-sync-delay).
	PushTook time.Duration
}

// Stats returns a snapshot of the engine.
func (e *Engine) Stats() Stats {
	now := e.opts.Now()
	st := Stats{
		Region: e.opts.Region, Known: map[string]uint64{e.opts.Region: 0},
		Pushes: e.pushes.Load(), PushFailures: e.pushFailures.Load(), PushBytes: e.pushBytes.Load(), PushCounts: e.pushCounts.Load(),
		Received: e.received.Load(), ReceivedCounts: e.receivedCounts.Load(), Refused: e.refused.Load(),
	}
	for _, p := range e.peers {
		st.Known[p.Name] = 0
		ps := PeerStats{Name: p.Name, Addr: p.Addr, Unheard: now.Sub(p.heardAt()), CutOff: e.cutOff(p, now), Weight: p.weightOf(), PushTook: time.Duration(p.took.Load())}
		if p.heardAt().IsZero() {
			ps.Unheard = -1
		}
		st.Peers = append(st.Peers, ps)
	}
	ms := now.UnixMilli()
	for si := range e.shards {
		sh := &e.shards[si]
		sh.mu.Lock()
		for _, ks := range sh.keys {
			st.Keys++
			for j := range ks.win {
				w := &ks.win[j]
				if w.Start == 0 || ms < w.Start || ms >= w.End() {
					continue // not the current window
				}
				st.Known[e.opts.Region] += w.own
				for i, p := range e.peers {
					st.Known[p.Name] += w.peers[i].remote
				}
			}
		}
		sh.mu.Unlock()
	}
	return st
}
