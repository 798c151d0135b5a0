package region

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	encproto "google.golang.org/grpc/encoding/proto"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Defaults of [Options].
const (
	DefaultInterval = 100 * time.Millisecond
	// partitionIntervals is how many sync intervals a peer may go unheard
	// before it counts as cut off (at least minPartitionAfter).
	partitionIntervals = 10
	minPartitionAfter  = time.Second
	// scanEvery is how many rounds pass between two that go over every
	// key: forgetting the windows that ended, refreshing a part of the
	// counts from the backend.
	scanEvery = 10
	// maxPushCounts bounds the counts of one push; more go in several.
	maxPushCounts = 10000
)

// Options configure an [Engine].
type Options struct {
	// Region is this region's name (-region). Required.
	Region string
	// Weight is this region's part of a global limit while it cannot hear
	// a peer, relative to the peers' (-region-weight). Default 1: equal
	// shares.
	Weight float64
	// Peers are the other regions, each by name and the gRPC address of
	// its replicas (-region-peers).
	Peers []Peer
	// Interval is how often each replica pushes its region's counts to
	// every peer, and reads what the peers pushed (-region-sync-interval).
	// Default 100ms.
	Interval time.Duration
	// PartitionAfter is how long a peer may go unheard before this region
	// counts it as cut off. Default 10 intervals, at least 1s.
	PartitionAfter time.Duration
	// FullEvery is how long passes between two pushes to a peer that
	// carry every count, not only those that grew since the peer last
	// acknowledged them. Default half of [KeepFor] the interval (5 s at
	// the default interval): a replica that reads only what the store
	// keeps still finds every count.
	FullEvery time.Duration
	// Store keeps what the peers pushed for every replica of the region.
	// Required.
	Store Store
	// Dial opens a connection to a peer's address (TLS is the caller's).
	// Default: plaintext gRPC.
	Dial func(addr string) (grpc.ClientConnInterface, error)
	// Authenticate is asked, for each push received, whether its caller
	// (ctx, as gRPC handed it to the handler) is the region the push
	// names; the push is refused with its error (a gRPC status) unless it
	// returns nil. [CertAuth.Authenticate] accepts only the region a
	// client certificate names. Required with Peers: without it anyone
	// could push counts in a peer's name.
	Authenticate func(ctx context.Context, region string) error
	// Now is this replica's clock, which names windows as the region's
	// Redis does (keep them in step: NTP). Default time.Now.
	Now func() time.Time
	// Logger receives sync failures and partitions. Default slog.Default().
	Logger *slog.Logger
}

// Peer is a peer region: its name and the address of its replicas.
type Peer struct{ Name, Addr string }

var regionName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// CheckName reports whether name may name a region: 1 to 63 letters,
// digits, '.', '_' and '-', starting with a letter or digit.
func CheckName(name string) error {
	if !regionName.MatchString(name) {
		return fmt.Errorf("region name %q: want 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	return nil
}

// Engine is an [algo.Backend] in front of a region's backend that decides
// the limits of scope: global (requests marked [algo.Request.Global])
// against the counts of every region it knows: it lowers such a request's
// limit by what the peers counted in its window, so that the region admits
// while the global count it knows is under the limit. Other requests pass
// through. [Engine.Run] exchanges the counts with the peers. It is safe
// for concurrent use.
type Engine struct {
	inner algo.Backend
	opts  Options
	peers []*peer
	index map[string]int // peer name → index in peers

	// The keys, in shards by hash, so that a round's scan holds one shard
	// at a time while decisions go on in the others.
	seed   maphash.Seed
	shards [numShards]shard
	parts  atomic.Int64 // keys made, to spread their refreshes over the rounds

	batches sync.Pool // *batch: copies of batches with global requests

	// Owned by Run: the rounds run, and where the store is read from.
	ticks  int
	cursor string

	codec grpc.CallOption // sends pushes encoded once for every peer

	pushes, pushFailures, pushBytes, pushCounts atomic.Uint64
	received, receivedCounts, refused           atomic.Uint64
}

// peer is a peer region as this replica sees it.
type peer struct {
	Peer
	conn grpc.ClientConnInterface
	// Read by decisions, without a lock: written only when the peer is
	// heard.
	heard  atomic.Int64  // when last heard, by this replica or another of the region (Unix ns; 0: never)
	weight atomic.Uint64 // the weight it announced (float64 bits); 1 until heard
	// took is how long the last push it acknowledged took, from sending
	// to its answer (ns; 0: none yet): a term of the sync delay.
	took atomic.Int64
	// Owned by the sync loop:
	cut      bool      // counted as cut off at the last check (for logs)
	failed   bool      // the last push failed: the next is an empty probe, then every count
	lastFull time.Time // when the last push of every count was made
	busy     atomic.Bool
}

// heardAt returns when p was last heard; the zero time if never.
func (p *peer) heardAt() time.Time {
	if ns := p.heard.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// weightOf returns the weight p announced, 1 until heard.
func (p *peer) weightOf() float64 { return math.Float64frombits(p.weight.Load()) }

// numShards is the number of shards of the keys.
const numShards = 32

// shard is a part of the keys, by hash.
type shard struct {
	mu   sync.Mutex
	keys map[string]*keyState // by counter key
	// dirty lists the keys whose count grew since a round offered them to
	// every peer (keyState.dirty marks them).
	dirty []*keyState
}

// refreshRounds is how many rounds pass between two refreshes of a key's
// count from the backend: each round refreshes that part of the keys.
const refreshRounds = 50

// keyState is what the engine knows of one global key: the limit it was
// last decided under, and its two latest windows.
type keyState struct {
	key    []byte
	limit  algo.Limit // N and W; zero until a decision here
	global algo.Global
	used   time.Time   // its last decision here
	part   int         // its refresh group: refreshed once every refreshRounds rounds
	dirty  bool        // in its shard's dirty list
	win    [2]winState // by start; the zero start is an empty slot
}

// winState is one window of a key.
type winState struct {
	Window
	own   uint64      // this region's count, the largest seen
	peers []peerCount // by peer, in one allocation: a decision reads them all
}

// peerCount is what a window of a key holds for one peer.
type peerCount struct {
	acked  uint64 // own as the peer acknowledged it
	remote uint64 // the peer's count, the largest heard
	// at and rate: when the peer's count last grew (Unix ns, 0: never),
	// and how fast it grew then (hits per second), for explain's
	// estimate of what is unseen.
	at   int64
	rate float64
}

// New returns an engine deciding through inner.
func New(inner algo.Backend, opts Options) (*Engine, error) {
	if err := CheckName(opts.Region); err != nil {
		return nil, fmt.Errorf("region: %w", err)
	}
	if opts.Store == nil {
		return nil, errors.New("region: Options.Store is required")
	}
	if len(opts.Peers) > 0 && opts.Authenticate == nil {
		return nil, errors.New("region: Options.Authenticate is required with peers: a push naming a peer would be accepted from anyone")
	}
	switch {
	case opts.Weight == 0:
		opts.Weight = 1
	case !(opts.Weight > 0) || math.IsInf(opts.Weight, 0):
		return nil, fmt.Errorf("region: weight %v: want a positive number", opts.Weight)
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.PartitionAfter <= 0 {
		opts.PartitionAfter = max(partitionIntervals*opts.Interval, minPartitionAfter)
	}
	if opts.FullEvery <= 0 {
		opts.FullEvery = KeepFor(opts.Interval) / 2
	}
	if opts.Dial == nil {
		opts.Dial = func(addr string) (grpc.ClientConnInterface, error) {
			return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		}
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	e := &Engine{inner: inner, opts: opts, index: make(map[string]int), seed: maphash.MakeSeed(),
		codec: grpc.ForceCodecV2(pushCodec{proto: encoding.GetCodecV2(encproto.Name)})}
	for i := range e.shards {
		e.shards[i].keys = make(map[string]*keyState)
	}
	for _, p := range opts.Peers {
		if err := CheckName(p.Name); err != nil {
			return nil, fmt.Errorf("region: peer: %w", err)
		}
		if p.Name == opts.Region {
			return nil, fmt.Errorf("region: peer %q is this region", p.Name)
		}
		if _, dup := e.index[p.Name]; dup {
			return nil, fmt.Errorf("region: peer %q given twice", p.Name)
		}
		conn, err := opts.Dial(p.Addr)
		if err != nil {
			return nil, fmt.Errorf("region: peer %s at %s: %w", p.Name, p.Addr, err)
		}
		e.index[p.Name] = len(e.peers)
		pr := &peer{Peer: p, conn: conn}
		pr.weight.Store(math.Float64bits(1))
		e.peers = append(e.peers, pr)
	}
	return e, nil
}

// windowOf returns the window of length w that holds now.
func windowOf(now time.Time, length time.Duration) Window {
	l := max(length.Milliseconds(), 1)
	ms := now.UnixMilli()
	start := ms - ms%l
	if ms < 0 && ms%l != 0 {
		start -= l
	}
	return Window{Length: l, Start: start}
}

// global reports whether the engine decides r: a fixed window of scope:
// global (the rule files allow no other).
func global(r *algo.Request) bool {
	return r.Global != algo.NotGlobal && r.Limit.Algorithm == algo.FixedWindow && r.Op != algo.OpGive
}

// Decide implements [algo.Backend].
func (e *Engine) Decide(ctx context.Context, reqs []algo.Request, out []algo.Decision) error {
	i := 0
	for i < len(reqs) && !global(&reqs[i]) {
		i++
	}
	if i == len(reqs) {
		return e.inner.Decide(ctx, reqs, out)
	}
	// The requests are copied, so that the caller's keep their limits.
	b, _ := e.batches.Get().(*batch)
	if b == nil {
		b = new(batch)
	}
	defer e.batches.Put(b)
	b.reqs = append(b.reqs[:0], reqs...)
	if cap(b.keys) < len(reqs) {
		b.keys = make([]*keyState, len(reqs))
	}
	b.keys = b.keys[:len(reqs)] // nil: cleared when last used
	defer b.clear()
	cp := b.reqs
	now := e.opts.Now()
	for ; i < len(cp); i++ {
		r := &cp[i]
		if !global(r) {
			continue
		}
		sh := e.shardOf(r.Key)
		sh.mu.Lock()
		ks := e.track(sh, r, now)
		off := e.offset(ks, windowOf(now, r.Limit.Window), r.Global, now)
		sh.mu.Unlock()
		r.Limit.Requests -= min(off, r.Limit.Requests)
		b.keys[i] = ks
	}
	if err := e.inner.Decide(ctx, cp, out); err != nil {
		return err
	}
	e.observe(cp, b.keys, out, now)
	return nil
}

// batch is a copy of a batch of requests with global ones, and their keys'
// states (nil for the others), reused from call to call.
type batch struct {
	reqs []algo.Request
	keys []*keyState
}

// clear drops what b refers to: the caller's keys, the states.
func (b *batch) clear() {
	clear(b.reqs)
	clear(b.keys)
}

// shardOf returns the shard of key.
func (e *Engine) shardOf(key []byte) *shard {
	return &e.shards[maphash.Bytes(e.seed, key)%numShards]
}

// track returns the state of r's key, made if new, noting r's limit.
// Called with sh's mutex held, sh the key's shard.
func (e *Engine) track(sh *shard, r *algo.Request, now time.Time) *keyState {
	ks := sh.keys[string(r.Key)]
	if ks == nil {
		ks = e.newKey(sh, r.Key)
	}
	ks.limit, ks.global, ks.used = r.Limit, r.Global, now
	return ks
}

// newKey makes and keeps the state of key in its shard sh. Called with
// sh's mutex held.
func (e *Engine) newKey(sh *shard, key []byte) *keyState {
	ks := &keyState{key: append([]byte(nil), key...), part: int(e.parts.Add(1) % refreshRounds)}
	sh.keys[string(ks.key)] = ks
	return ks
}

// window returns the state of window w of the key, made (in place of the
// older slot) when create is set; nil when absent and not made.
func (e *Engine) window(ks *keyState, w Window, create bool) *winState {
	for i := range ks.win {
		if ks.win[i].Window == w {
			return &ks.win[i]
		}
	}
	if !create {
		return nil
	}
	old := 0
	if ks.win[1].Start < ks.win[0].Start {
		old = 1
	}
	if ks.win[old].Start > w.Start {
		return nil // older than both: no longer kept
	}
	n := len(e.peers)
	ks.win[old] = winState{Window: w, peers: make([]peerCount, n)}
	return &ks.win[old]
}

// offset returns what a request of key ks in window w counts against the
// limit for the peers: what each counted, or, for a peer cut off, that or
// its share of the limit, whichever is more (on_partition: share); with
// on_partition: exact-local, nothing at all while any peer is cut off.
// Called with the key's shard's mutex held.
func (e *Engine) offset(ks *keyState, w Window, g algo.Global, now time.Time) uint64 {
	ws := e.window(ks, w, false)
	var off uint64
	for i, p := range e.peers {
		var c uint64
		if ws != nil {
			c = ws.peers[i].remote
		}
		if e.cutOff(p, now) {
			if g == algo.GlobalExactLocal {
				return 0
			}
			c = max(c, e.share(i, ks.limit.Requests))
		}
		off += c
	}
	return off
}

// cutOff reports whether peer p has gone unheard for longer than
// PartitionAfter.
func (e *Engine) cutOff(p *peer, now time.Time) bool {
	return now.Sub(p.heardAt()) > e.opts.PartitionAfter
}

// share returns peer i's share of a limit of n: n times its weight over
// the weights of every region, rounded up.
func (e *Engine) share(i int, n uint64) uint64 {
	total := e.opts.Weight
	for _, p := range e.peers {
		total += p.weightOf()
	}
	return uint64(math.Ceil(float64(n) * e.peers[i].weightOf() / total))
}

// observe records this region's count of each global key decided, from
// the decisions out of the requests reqs (their limits lowered), whose
// keys' states are keys (nil: looked up): the count in the window is the
// lowered limit less what remains, exact but when nothing remains, when
// it is at least the lowered limit. The window is the one the backend
// decided in: it ends ResetAfter from now.
func (e *Engine) observe(reqs []algo.Request, keys []*keyState, out []algo.Decision, now time.Time) {
	for i := range reqs {
		r, d := &reqs[i], &out[i]
		if !global(r) || d.ResetAfter <= 0 {
			continue
		}
		n := r.Limit.Requests
		count := n - min(d.Remaining, n)
		if count == 0 {
			continue
		}
		l := max(r.Limit.Window.Milliseconds(), 1)
		end := now.Add(d.ResetAfter).UnixMilli()
		end = (end + l/2) / l * l // the backend's window ends on a multiple of its length
		sh := e.shardOf(r.Key)
		sh.mu.Lock()
		ks := keys[i]
		if ks == nil {
			ks = sh.keys[string(r.Key)]
		}
		if ks != nil {
			if ws := e.window(ks, Window{Length: l, Start: end - l}, true); ws != nil && count > ws.own {
				ws.own = count
				if !ks.dirty {
					ks.dirty = true
					sh.dirty = append(sh.dirty, ks)
				}
			}
		}
		sh.mu.Unlock()
	}
}
