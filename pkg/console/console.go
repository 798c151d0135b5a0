// Package console is ratelimitd's ops console: a read-only web page, served
// at /ui on the HTTP listener, that shows what this replica is deciding
// now (docs/console.md).
//
// A [Console] is a [service.Observer]: the service tells it of every
// decision and backend call, and it keeps, in bounded memory, per-rule
// counters of each outcome, the backend calls' latency, and a heavy-hitter
// sketch ([topk.Window]) of the descriptors refused over the last minute.
// [Console.Handler] serves the page (embedded: no build step, no
// framework), the JSON it polls, and the page's peek and reset calls; the
// page explains descriptors with the service's own POST /explain.
//
// The hot path costs a lookup in a slice by [config.Rule.Index], made by
// [Console.Rules] for the rules in force, and an atomic add per decision,
// whatever the number of rules (a rule it was not told of is looked up in
// a sync.Map by its pointer); a refused decision also takes the sketch's
// mutex and encodes
// its descriptor (on the stack; a key new to the sketch is copied into
// it). Nothing runs in the background: rates are computed when the page
// asks, from snapshots of the counters taken at most once a second.
package console

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/service"
	"github.com/ratelimitd/ratelimitd/pkg/topk"
)

// Defaults of [Options].
const (
	// DefaultTopKeys is the counters of each slot of the refused-keys
	// sketch: a count is too high by at most 1/256 of the refusals in the
	// window.
	DefaultTopKeys = 256
	// TopKeysSlots × TopKeysSlot is the window of the top limited keys:
	// the last minute, in slots of 10 s (the current slot is partly
	// elapsed, so the window spans 50 to 60 s).
	TopKeysSlots = 6
	TopKeysSlot  = 10 * time.Second
	// RateWindow is the span decision and call rates are averaged over.
	RateWindow = 10 * time.Second
	// maxKeyBytes bounds the encoding of one refused descriptor kept in
	// the sketch; longer ones are cut (and shown as cut).
	maxKeyBytes = 512
	// shownKeys is how many top limited keys the state lists.
	shownKeys = 20
)

// numOutcomes is the number of [service.Outcome] values counted.
const numOutcomes = int(service.OutcomeUnlimited) + 1

// Options configure a [Console]. The zero value selects every default.
type Options struct {
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Logger receives the console's logs (resets asked from the page).
	// Default: discard them.
	Logger *slog.Logger
	// TopKeys is the number of counters of each slot of the refused-keys
	// sketch. Default DefaultTopKeys.
	TopKeys int
	// Replica names this process on the page (its host name), for
	// replicas behind one address. Version is the binary's.
	Replica, Version string
	// Source tells where the rules come from; nil shows nothing.
	Source func() Source
	// Backend describes the backend and what stands in front of it; nil
	// shows only what the console observes of its calls.
	Backend func() Backend
}

// Console observes decisions and serves the ops console. Make it with
// [New]; it is safe for concurrent use.
type Console struct {
	opts Options
	now  func() time.Time
	log  *slog.Logger

	// table holds the stats of the rules in force by config.Rule.Index,
	// made by Rules; byRule maps other rules' *config.Rule to their
	// *ruleStats; overrides maps a domain to the *ruleStats of its limit
	// overrides.
	table     atomic.Pointer[[]ruleEntry]
	byRule    sync.Map
	overrides sync.Map
	mu        sync.Mutex // guards byID, list, cached
	byID      map[ruleKey]*ruleStats
	list      []*ruleStats // by idx
	cached    int          // pointers in byRule

	calls, errs atomic.Uint64
	latency     [latencyBuckets]atomic.Uint64
	degraded    [len(failureModes)]atomic.Uint64

	top *topk.Window

	snapMu sync.Mutex
	snaps  []*snapshot // oldest first, at least a second apart, within RateWindow
}

// ruleKey identifies a rule across reloads: its domain and ID; an empty
// ID stands for the domain's limit overrides.
type ruleKey struct{ domain, id string }

// ruleEntry is a rule of the rules in force and its stats, nil until it
// decides.
type ruleEntry struct {
	rule *config.Rule
	st   atomic.Pointer[ruleStats]
}

// ruleStats counts one rule's decisions by outcome, since the start.
type ruleStats struct {
	key ruleKey
	idx int
	n   [numOutcomes]atomic.Uint64
}

// failureModes are the modes FailureMode counts, in order.
var failureModes = [...]config.FailureMode{config.FailOpen, config.FailClosed, config.FailError, config.FailLocal}

// New returns a console.
func New(opts Options) (*Console, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.TopKeys == 0 {
		opts.TopKeys = DefaultTopKeys
	}
	if opts.TopKeys < 1 {
		return nil, errors.New("console: TopKeys must be at least 1")
	}
	return &Console{
		opts: opts,
		now:  opts.Now,
		log:  opts.Logger,
		byID: map[ruleKey]*ruleStats{},
		top:  topk.NewWindow(opts.TopKeys, TopKeysSlots, TopKeysSlot),
	}, nil
}

var _ service.Observer = (*Console)(nil)

// Decided implements [service.Observer]: it counts the decision under its
// rule and outcome and, when refused, the descriptor in the sketch of
// refused keys.
func (c *Console) Decided(domain string, rule *config.Rule, d *rlv3.RateLimitDescriptor, o service.Outcome, hits uint64) {
	var st *ruleStats
	if rule == nil {
		st = c.override(domain)
	} else {
		st = c.rule(domain, rule)
	}
	if int(o) < numOutcomes {
		st.n[o].Add(1)
	}
	if o == service.OutcomeOverLimit {
		c.refused(domain, rule, d)
	}
}

// refused counts descriptor d, refused under rule, in the sketch. Its key
// is encoded in a buffer on the stack.
func (c *Console) refused(domain string, rule *config.Rule, d *rlv3.RateLimitDescriptor) {
	var buf [maxKeyBytes]byte
	id := ""
	if rule != nil {
		id = rule.ID
	}
	key := appendKey(buf[:0], domain, id, d.GetEntries())
	c.top.Add(c.now(), key, 1)
}

// BackendCall implements [service.Observer]: it counts the call, its
// error and its latency.
func (c *Console) BackendCall(took time.Duration, err error) {
	c.calls.Add(1)
	if err != nil {
		c.errs.Add(1)
	}
	c.latency[latencyBucket(took)].Add(1)
}

// FailureMode implements [service.Observer]: it counts a request decided
// by failure mode m.
func (c *Console) FailureMode(domain string, m config.FailureMode) {
	for i, fm := range failureModes {
		if fm == m {
			c.degraded[i].Add(1)
			return
		}
	}
}

// Rules makes the table in which Decided finds the stats of the rules of
// rules, whatever their number, and forgets the rules it was told of
// before, so that they can be freed. Call it with the rules at start and
// after each reload; decisions of rules it was not told of are counted
// too, found at a cost that grows with the rules.
func (c *Console) Rules(rules *config.Rules) {
	t := make([]ruleEntry, rules.NumRules())
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range rules.Domains() {
		for _, r := range d.Rules() {
			e := &t[r.Index()]
			e.rule = r
			if st := c.byID[ruleKey{d.Name, r.ID}]; st != nil {
				e.st.Store(st)
			}
		}
	}
	c.table.Store(&t)
	c.byRule.Clear()
	c.cached = 0
}

// rule returns the stats of rule, making them on first sight of the
// rule. A reload brings new pointers for the same IDs: they share the
// stats of the ID.
func (c *Console) rule(domain string, rule *config.Rule) *ruleStats {
	if t := c.table.Load(); t != nil {
		if i := rule.Index(); i < len(*t) && (*t)[i].rule == rule {
			e := &(*t)[i]
			if st := e.st.Load(); st != nil {
				return st
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			st := c.statsLocked(ruleKey{rule.Domain, rule.ID})
			e.st.Store(st)
			return st
		}
	}
	if st, ok := c.byRule.Load(rule); ok {
		return st.(*ruleStats)
	}
	if rule.Domain != "" {
		domain = rule.Domain
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.statsLocked(ruleKey{domain, rule.ID})
	// Forget old pointers once they could be half the cache; the stats
	// stay, by ID.
	if c.cached >= 2*len(c.byID)+16 {
		c.byRule.Clear()
		c.cached = 0
	}
	c.byRule.Store(rule, st)
	c.cached++
	return st
}

// override returns the stats of domain's limit overrides.
func (c *Console) override(domain string) *ruleStats {
	if st, ok := c.overrides.Load(domain); ok {
		return st.(*ruleStats)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.statsLocked(ruleKey{domain: domain})
	c.overrides.Store(domain, st)
	return st
}

// statsLocked returns the stats of key, making them; c.mu is held. They
// are never dropped: they are bounded by the rule IDs ever loaded.
func (c *Console) statsLocked(key ruleKey) *ruleStats {
	if st := c.byID[key]; st != nil {
		return st
	}
	st := &ruleStats{key: key, idx: len(c.list)}
	c.byID[key] = st
	c.list = append(c.list, st)
	return st
}

// latencyBuckets are powers of two of microseconds: bucket i counts calls
// that took less than 2^i µs (and at least 2^(i-1)); the last, longer.
const latencyBuckets = 24

func latencyBucket(d time.Duration) int {
	us := uint64(max(d, 0) / time.Microsecond)
	i := 0
	for us > 0 && i < latencyBuckets-1 {
		us >>= 1
		i++
	}
	return i
}

// latencyBound returns the upper bound of bucket i: 2^i µs.
func latencyBound(i int) time.Duration { return time.Duration(uint64(1)<<i) * time.Microsecond }
