package console

import (
	"cmp"
	"slices"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// State is what GET /ui/api/state answers: this replica's view, now.
type State struct {
	Now     time.Time `json:"now"`
	Replica string    `json:"replica,omitempty"`
	Version string    `json:"version,omitempty"`
	// Rules identifies the rules in force; the page fetches GET
	// /ui/api/rules again when Hash changes.
	Rules RulesInfo `json:"rules"`
	// ResetEnabled tells whether POST /ui/api/reset may clear counters
	// (-enable-reset); the page shows reset buttons only then.
	ResetEnabled bool         `json:"resetEnabled"`
	Traffic      Traffic      `json:"traffic"`
	TopKeys      TopKeys      `json:"topKeys"`
	Backend      BackendState `json:"backend"`
}

// RulesInfo identifies the rules in force.
type RulesInfo struct {
	Hash    string `json:"hash"`
	Count   int    `json:"count"`
	Domains int    `json:"domains"`
	Source  Source `json:"source"`
}

// Source is where the rules come from.
type Source struct {
	// Kind is "file" (Path is -config) or "xds" (from Server, at
	// Version; Connected while the stream is up; Error is why the last
	// response was rejected, if it was).
	Kind      string    `json:"kind"`
	Path      string    `json:"path,omitempty"`
	Server    string    `json:"server,omitempty"`
	Version   string    `json:"version,omitempty"`
	Connected bool      `json:"connected,omitempty"`
	Error     string    `json:"error,omitempty"`
	LoadedAt  time.Time `json:"loadedAt,omitzero"`
}

// Traffic is the decisions of each rule that decided any.
type Traffic struct {
	// RateSeconds is the span Rate is averaged over: up to RateWindow,
	// since the oldest snapshot of the counters kept (0: none yet, and
	// no rates; the page's next poll, a second later, has them).
	RateSeconds float64       `json:"rateSeconds"`
	Rules       []RuleTraffic `json:"rules"`
}

// RuleTraffic is one rule's decisions by outcome, counting descriptors
// (not hits): in all since the start, and per second lately.
type RuleTraffic struct {
	Domain string `json:"domain"`
	// Rule is the rule's ID; "" for the descriptors of the domain that
	// carried their own limit (an override).
	Rule string `json:"rule"`
	// Loaded is false for a rule the rules in force no longer have.
	Loaded bool    `json:"loaded"`
	Total  Counts  `json:"total"`
	Rate   *Counts `json:"rate,omitempty"`
}

// Counts are decisions by outcome: totals, or rates per second.
type Counts struct {
	OK        float64 `json:"ok"`
	Near      float64 `json:"near"`
	Over      float64 `json:"over"`
	Shadow    float64 `json:"shadow"`
	Unlimited float64 `json:"unlimited"`
}

func countsOf(n *[numOutcomes]uint64, scale float64) Counts {
	return Counts{OK: float64(n[0]) * scale, Near: float64(n[1]) * scale, Over: float64(n[2]) * scale,
		Shadow: float64(n[3]) * scale, Unlimited: float64(n[4]) * scale}
}

// TopKeys are the descriptors refused most over the last minute, from a
// Space-Saving sketch: each Count is at most MaxError too high (Count −
// Err is a lower bound), MaxError ≤ Refused / Counters, and every
// descriptor refused more than Refused / Counters times is listed (when
// the list is not cut at its first 20).
type TopKeys struct {
	WindowSeconds float64  `json:"windowSeconds"`
	Refused       uint64   `json:"refused"`
	Counters      int      `json:"counters"`
	MaxError      uint64   `json:"maxError"`
	Keys          []TopKey `json:"keys"`
}

// TopKey is a descriptor refused often.
type TopKey struct {
	Domain string `json:"domain"`
	// Rule is the ID of the rule that refused it; "" for its own limit.
	Rule    string  `json:"rule"`
	Entries []Entry `json:"entries"`
	// Cut is set when the descriptor was too long to keep whole: its
	// last entry shown is cut short, and those after it are missing.
	Cut   bool   `json:"cut,omitempty"`
	Count uint64 `json:"count"`
	Err   uint64 `json:"err"`
}

// Entry is an entry of a descriptor.
type Entry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// BackendState is the backend as given by Options.Backend, with what the
// console observed of its calls.
type BackendState struct {
	Backend
	Calls CallStats `json:"calls"`
	// FailureModes counts, since the start, the requests decided by
	// each failure mode because the backend failed.
	FailureModes map[string]uint64 `json:"failureModes"`
}

// CallStats are the backend calls the service made: in all, and lately
// (over Traffic.RateSeconds, or since the start before a rate exists).
type CallStats struct {
	Total           uint64  `json:"total"`
	Errors          uint64  `json:"errors"`
	PerSecond       float64 `json:"perSecond"`
	ErrorsPerSecond float64 `json:"errorsPerSecond"`
	// P50Ms, P99Ms and MaxMs bound the latency of the calls lately, in
	// milliseconds: upper bounds of power-of-two buckets; 0 without
	// calls.
	P50Ms float64 `json:"p50Ms"`
	P99Ms float64 `json:"p99Ms"`
	MaxMs float64 `json:"maxMs"`
}

// Backend describes the backend and what stands in front of it; the
// fields that do not apply are nil.
type Backend struct {
	// Kind is "memory" or "redis"; FailureMode the server's failure mode.
	Kind        string `json:"kind"`
	FailureMode string `json:"failureMode,omitempty"`
	Redis       *Redis `json:"redis,omitempty"`
	// Memory is the memory backend's size (the main backend's, not the
	// fallback's of failure mode local).
	Memory     *Memory     `json:"memory,omitempty"`
	Circuit    *Circuit    `json:"circuit,omitempty"`
	LocalCache *LocalCache `json:"localCache,omitempty"`
	Leases     *Leases     `json:"leases,omitempty"`
	Region     *Region     `json:"region,omitempty"`
}

// Redis is the Redis backend's configuration.
type Redis struct {
	// Mode is standalone, sentinel or cluster; URL the seeds, without
	// credentials; Master the name sentinels monitor.
	Mode    string `json:"mode"`
	URL     string `json:"url"`
	Master  string `json:"master,omitempty"`
	Prefix  string `json:"prefix"`
	HashTag string `json:"hashTag,omitempty"`
	// Lua is "functions" (FCALL) or "scripts" (EVALSHA); Clock "redis"
	// or "local"; KeyFormat "native" or "reference".
	Lua       string `json:"lua"`
	Clock     string `json:"clock"`
	KeyFormat string `json:"keyFormat"`
}

// Memory is the memory backend's size.
type Memory struct {
	Keys      int    `json:"keys"`
	MaxKeys   int    `json:"maxKeys"`
	Evictions uint64 `json:"evictions"`
}

// Circuit is the circuit breaker in front of Redis.
type Circuit struct {
	// State is closed, open or half-open.
	State    string `json:"state"`
	Calls    uint64 `json:"calls"`
	Errors   uint64 `json:"errors"`
	Timeouts uint64 `json:"timeouts"`
	Rejected uint64 `json:"rejected"`
	Opens    uint64 `json:"opens"`
}

// LocalCache is the local over-limit cache.
type LocalCache struct {
	Keys   int    `json:"keys"`
	Hits   uint64 `json:"hits"`
	Misses uint64 `json:"misses"`
}

// Leases is the lease engine of limits with consistency: leased.
type Leases struct {
	Keys     int64  `json:"keys"`
	Held     int64  `json:"held"`
	Local    uint64 `json:"local"`
	Backend  uint64 `json:"backend"`
	Stranded uint64 `json:"stranded"`
	Errors   uint64 `json:"errors"`
}

// Region is the region engine of limits with scope: global.
type Region struct {
	Name         string `json:"name"`
	Keys         int    `json:"keys"`
	Peers        []Peer `json:"peers"`
	Pushes       uint64 `json:"pushes"`
	PushFailures uint64 `json:"pushFailures"`
	Received     uint64 `json:"received"`
}

// Peer is a peer region.
type Peer struct {
	Name string `json:"name"`
	Addr string `json:"addr"`
	// Unheard is how long since it was last heard, as a Go duration, or
	// "never".
	Unheard string  `json:"unheard"`
	CutOff  bool    `json:"cutOff"`
	Weight  float64 `json:"weight"`
}

// snapshot is the console's counters at one time.
type snapshot struct {
	at          time.Time
	rules       [][numOutcomes]uint64 // by ruleStats.idx
	calls, errs uint64
	latency     [latencyBuckets]uint64
}

// snapshot reads the counters.
func (c *Console) snapshot(now time.Time) *snapshot {
	c.mu.Lock()
	list := c.list[:len(c.list):len(c.list)]
	c.mu.Unlock()
	s := &snapshot{at: now, rules: make([][numOutcomes]uint64, len(list)), calls: c.calls.Load(), errs: c.errs.Load()}
	for i, st := range list {
		for o := range numOutcomes {
			s.rules[i][o] = st.n[o].Load()
		}
	}
	for i := range s.latency {
		s.latency[i] = c.latency[i].Load()
	}
	return s
}

// minRateSpan is the shortest span a rate is computed over, and the
// least time between two snapshots kept.
const minRateSpan = time.Second

// sample takes a snapshot at now and returns it with the oldest snapshot
// kept within RateWindow to compute rates from (nil when there is none
// yet), keeping the new one if the last kept is at least a second old.
func (c *Console) sample(now time.Time) (cur, base *snapshot) {
	cur = c.snapshot(now)
	c.snapMu.Lock()
	defer c.snapMu.Unlock()
	keep := c.snaps[:0]
	for _, s := range c.snaps {
		if age := now.Sub(s.at); age <= RateWindow && age >= 0 {
			keep = append(keep, s)
		}
	}
	clear(c.snaps[len(keep):])
	c.snaps = keep
	if len(keep) > 0 && now.Sub(keep[0].at) >= minRateSpan/2 {
		base = keep[0]
	}
	if len(keep) == 0 || now.Sub(keep[len(keep)-1].at) >= minRateSpan {
		c.snaps = append(c.snaps, cur)
	}
	return cur, base
}

// traffic is the decisions of every rule that decided any.
func (c *Console) traffic(cur, base *snapshot, rules *config.Rules) Traffic {
	c.mu.Lock()
	list := c.list[:len(cur.rules):len(cur.rules)]
	c.mu.Unlock()
	var t Traffic
	var scale float64
	if base != nil {
		t.RateSeconds = cur.at.Sub(base.at).Seconds()
		scale = 1 / t.RateSeconds
	}
	t.Rules = []RuleTraffic{}
	for i, st := range list {
		n := cur.rules[i]
		if n == [numOutcomes]uint64{} {
			continue
		}
		rt := RuleTraffic{Domain: st.key.domain, Rule: st.key.id, Total: countsOf(&n, 1)}
		if d := rules.Domain(st.key.domain); d != nil {
			rt.Loaded = st.key.id == "" || d.Rule(st.key.id) != nil
		}
		if base != nil {
			var delta [numOutcomes]uint64
			if i < len(base.rules) {
				for o := range numOutcomes {
					delta[o] = n[o] - min(base.rules[i][o], n[o])
				}
			} else {
				delta = n
			}
			r := countsOf(&delta, scale)
			rt.Rate = &r
		}
		t.Rules = append(t.Rules, rt)
	}
	// The busiest refusals first, then the busiest rules.
	slices.SortStableFunc(t.Rules, func(a, b RuleTraffic) int {
		if c := cmp.Compare(rate(b).Over, rate(a).Over); c != 0 {
			return c
		}
		if c := cmp.Compare(b.Total.Over, a.Total.Over); c != 0 {
			return c
		}
		return cmp.Compare(sum(b.Total), sum(a.Total))
	})
	return t
}

func rate(r RuleTraffic) Counts {
	if r.Rate == nil {
		return Counts{}
	}
	return *r.Rate
}

func sum(c Counts) float64 { return c.OK + c.Near + c.Over + c.Shadow + c.Unlimited }

// calls is what the console observed of backend calls.
func calls(cur, base *snapshot) CallStats {
	cs := CallStats{Total: cur.calls, Errors: cur.errs}
	lat := cur.latency
	if base != nil {
		secs := cur.at.Sub(base.at).Seconds()
		cs.PerSecond = float64(cur.calls-min(base.calls, cur.calls)) / secs
		cs.ErrorsPerSecond = float64(cur.errs-min(base.errs, cur.errs)) / secs
		for i := range lat {
			lat[i] -= min(base.latency[i], lat[i])
		}
	}
	var n uint64
	for _, v := range lat {
		n += v
	}
	if n == 0 {
		return cs
	}
	ms := func(i int) float64 { return float64(latencyBound(i)) / float64(time.Millisecond) }
	var seen uint64
	for i, v := range lat {
		if v == 0 {
			continue
		}
		seen += v
		if cs.P50Ms == 0 && seen*2 >= n {
			cs.P50Ms = ms(i)
		}
		if cs.P99Ms == 0 && seen*100 >= n*99 {
			cs.P99Ms = ms(i)
		}
		cs.MaxMs = ms(i)
	}
	return cs
}

// topKeys is the top of the refused-keys sketch at now.
func (c *Console) topKeys(now time.Time) TopKeys {
	sum := c.top.Top(now, shownKeys)
	tk := TopKeys{
		WindowSeconds: c.top.Span().Seconds(),
		Refused:       sum.Total,
		Counters:      c.top.Cap(),
		MaxError:      sum.MaxErr,
		Keys:          make([]TopKey, len(sum.Items)),
	}
	for i, it := range sum.Items {
		k := decodeKey(it.Key)
		tk.Keys[i] = TopKey{Domain: k.domain, Rule: k.rule, Entries: k.entries, Cut: k.cut, Count: it.Count, Err: it.Err}
		if tk.Keys[i].Entries == nil {
			tk.Keys[i].Entries = []Entry{}
		}
	}
	return tk
}

// State returns the console's state at the console's now, under rules
// (the rules in force), with resetEnabled as the page should show it.
func (c *Console) State(rules *config.Rules, resetEnabled bool) *State {
	now := c.now()
	cur, base := c.sample(now)
	st := &State{
		Now: now, Replica: c.opts.Replica, Version: c.opts.Version,
		Rules:        RulesInfo{Hash: rules.Hash(), Domains: len(rules.Domains())},
		ResetEnabled: resetEnabled,
		Traffic:      c.traffic(cur, base, rules),
		TopKeys:      c.topKeys(now),
	}
	for _, d := range rules.Domains() {
		st.Rules.Count += len(d.Rules())
	}
	if c.opts.Source != nil {
		st.Rules.Source = c.opts.Source()
	}
	if c.opts.Backend != nil {
		st.Backend.Backend = c.opts.Backend()
	}
	st.Backend.Calls = calls(cur, base)
	st.Backend.FailureModes = make(map[string]uint64, len(failureModes))
	for i, m := range failureModes {
		st.Backend.FailureModes[string(m)] = c.degraded[i].Load()
	}
	return st
}
