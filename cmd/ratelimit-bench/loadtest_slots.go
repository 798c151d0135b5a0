package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimitd/ratelimitd/pkg/config"
	ratelimitdv1 "github.com/ratelimitd/ratelimitd/proto/ratelimitd/v1"
)

// The slots group measures concurrency limits on Redis: callers that take
// a slot (Acquire) and give it back at once (Release), as the concurrency
// middleware does around a handler that takes no time. A row's rate,
// latencies and CPU are per Acquire+Release pair: two calls, each one
// script call in Redis. The pairs are compared with the exact decision of
// one descriptor (ShouldRateLimit on domain one_limit), measured on the
// same server in the same run.

// The slots group's rule: domain slotsDomain limits every value of the
// key to slotsMaxInFlight slots, well above the callers, so that no
// Acquire is refused and every call is a pair's; a hot key holds up to
// one slot per caller.
const (
	slotsDomain      = "slots"
	slotsMaxInFlight = 1000
	slotsLeaseTTL    = 30 * time.Second
)

// slotsRule is the rule file of domain slotsDomain, limiting key.
func slotsRule(key string) string {
	return fmt.Sprintf(`# written by ratelimit-bench loadtest
domain: %s
descriptors:
  - key: %s
    concurrency:
      max_in_flight: %d
      lease_ttl: %s
`, slotsDomain, key, slotsMaxInFlight, slotsLeaseTTL)
}

// writeSlotsRules writes the slots group's rule file into dir.
func writeSlotsRules(dir, key string) error {
	return os.WriteFile(filepath.Join(dir, slotsDomain+".yaml"), []byte(slotsRule(key)), 0o644)
}

// checkSlotsRules checks that the rules at path limit (key, any value) in
// domain slotsDomain by a concurrency limit of at least workers slots, so
// that the group measures pairs, not refusals.
func checkSlotsRules(path, key string, workers int) error {
	rules, err := config.Load(path)
	if err != nil {
		return err
	}
	dom := rules.Domain(slotsDomain)
	if dom == nil {
		return fmt.Errorf("%s: no domain %s, which the slots scenarios use: add it (ratelimit-bench loadtest without -config writes one), or leave slots out of -scenarios", path, slotsDomain)
	}
	rule := dom.Match(oneEntry{key, "user-0"})
	if rule == nil || rule.Concurrency == nil {
		return fmt.Errorf("%s: domain %s has no concurrency limit for (%s, user-0)", path, slotsDomain, key)
	}
	if n := rule.Concurrency.MaxInFlight; int(n) < workers {
		return fmt.Errorf("%s: domain %s allows %d slots of (%s, user-0), fewer than the %d callers: the hot-key scenario would measure refusals", path, slotsDomain, n, key, workers)
	}
	return nil
}

// slotsRun is one scenario of the slots group.
type slotsRun struct {
	name           string
	workers, conns int
	keys           int // values of the key, picked uniformly; 1 for a hot key
	file           string
}

// slotsRuns returns the slots group's scenarios, named after label:
// Workers callers over Keys values, Workers callers on one value (its
// sorted set holds up to one slot per caller), and 1 caller.
func (lt *loadtest) slotsRuns(label string) []slotsRun {
	c := lt.cfg
	keys := num(float64(c.Keys))
	return []slotsRun{
		{name: fmt.Sprintf("%s: Acquire+Release pairs, %d callers, %s keys", label, c.Workers, keys), workers: c.Workers, conns: c.Conns, keys: c.Keys, file: "slots-closed-%d"},
		{name: fmt.Sprintf("%s: Acquire+Release pairs, %d callers, one key (up to %d slots held)", label, c.Workers, c.Workers), workers: c.Workers, conns: c.Conns, keys: 1, file: "slots-closed-%d-one-key"},
		{name: fmt.Sprintf("%s: Acquire+Release pairs, 1 caller, %s keys", label, keys), workers: 1, conns: 1, keys: c.Keys, file: "slots-closed-1"},
	}
}

// slotsGroup runs the slots group against the server at addr on Redis
// (rdb) and returns its rows: the pairs, then, unless decision (the exact
// decision of one descriptor at Workers callers, from the standard group)
// was measured already, that decision too. The first row's notes compare
// a pair with the decision.
func (lt *loadtest) slotsGroup(ctx context.Context, label, addr string, procs []proc, rdb *goredis.Client, decision *scenario) ([]scenario, error) {
	c := lt.cfg
	var rows []scenario
	for _, g := range lt.slotsRuns(label) {
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			return nil, fmt.Errorf("FLUSHALL before %q: %w", g.name, err)
		}
		row, err := lt.generateSlots(ctx, g, addr, procs, rdb)
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}
	if decision == nil {
		runs := lt.standardRuns(label, "redis")[:1] // Workers callers, closed loop
		measured, err := lt.generateAll(ctx, runs, addr, procs, rdb)
		if err != nil {
			return nil, err
		}
		rows = append(rows, measured[0])
		decision = &rows[len(rows)-1]
	}
	rows[0].Notes = append(rows[0].Notes, comparePairs(rows[0], *decision, c.Workers)...)
	return rows, nil
}

// comparePairs says what a pair costs against one exact decision, both at
// workers callers.
func comparePairs(pairs, decision scenario, workers int) []string {
	var notes []string
	ratio := func(what string, p, d float64, f func(float64) string) {
		if p >= 0 && d > 0 {
			notes = append(notes, fmt.Sprintf("%s per pair %.2f× one exact decision's (%s against %s at %d callers)", what, p/d, f(p), f(d), workers))
		}
	}
	cpu := func(v float64) string { return fmt.Sprintf("%.1f", v) }
	ratio("Redis CPU-µs", pairs.RedisCPU, decision.RedisCPU, cpu)
	ratio("ratelimitd CPU-µs", pairs.ServerCPU, decision.ServerCPU, cpu)
	ratio("p50", pairs.P50, decision.P50, us)
	if d := decision.DecisionsPerS; d > 0 {
		notes = append(notes, fmt.Sprintf("pairs/s %.2f× the decisions/s (%s against %s at %d callers)", pairs.DecisionsPerS/d, num(pairs.DecisionsPerS), num(d), workers))
	}
	return notes
}

// The field numbers the slots codec reads and writes, from the generated
// descriptors.
var (
	fieldAcquireAllowed = fieldNumber(&ratelimitdv1.AcquireResponse{}, "allowed")
	fieldAcquireLease   = fieldNumber(&ratelimitdv1.AcquireResponse{}, "lease_id")
	fieldReleaseLease   = fieldNumber(&ratelimitdv1.ReleaseRequest{}, "lease_id")
	fieldReleased       = fieldNumber(&ratelimitdv1.ReleaseResponse{}, "released")
)

// acquireReply is what the generator keeps of an AcquireResponse.
type acquireReply struct {
	allowed bool
	lease   []byte // reused from call to call
}

// parse reads an encoded AcquireResponse, skipping the results.
func (r *acquireReply) parse(b []byte) error {
	r.allowed, r.lease = false, r.lease[:0]
	return eachField(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case num == fieldAcquireAllowed && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			r.allowed = v != 0
			return n, nil
		case num == fieldAcquireLease && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			r.lease = append(r.lease, v...)
			return n, nil
		}
		return protowire.ConsumeFieldValue(num, typ, b), nil
	})
}

// releaseReply is what the generator keeps of a ReleaseResponse.
type releaseReply struct{ released bool }

func (r *releaseReply) parse(b []byte) error {
	r.released = false
	return eachField(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if num == fieldReleased && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			r.released = v != 0
			return n, nil
		}
		return protowire.ConsumeFieldValue(num, typ, b), nil
	})
}

// eachField calls value for each field of the encoded message b, with b
// at the field's value; value returns the value's length, negative for a
// parse error.
func eachField(b []byte, value func(protowire.Number, protowire.Type, []byte) (int, error)) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		n, err := value(num, typ, b)
		if err != nil {
			return err
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
	}
	return nil
}

// appendReleaseRequest appends the encoded ReleaseRequest of lease to dst.
func appendReleaseRequest(dst, lease []byte) []byte {
	dst = protowire.AppendTag(dst, fieldReleaseLease, protowire.BytesType)
	return protowire.AppendBytes(dst, lease)
}

// slotsCodec sends a *rawRequest's bytes as they are and parses answers
// into an *acquireReply or a *releaseReply, as rawCodec does for
// ShouldRateLimit.
type slotsCodec struct{}

func (slotsCodec) Name() string { return "proto" }

func (slotsCodec) Marshal(v any) (mem.BufferSlice, error) {
	return rawCodec{}.Marshal(v)
}

func (slotsCodec) Unmarshal(data mem.BufferSlice, v any) error {
	var b []byte
	if len(data) == 1 {
		b = data[0].ReadOnlyData()
	} else {
		b = data.Materialize()
	}
	switch r := v.(type) {
	case *acquireReply:
		return r.parse(b)
	case *releaseReply:
		return r.parse(b)
	}
	return fmt.Errorf("ratelimit-bench slots codec: cannot read into %T", v)
}

// slotsCall is the generator's option on every Acquire and Release.
var slotsCall = grpc.ForceCodecV2(slotsCodec{})

// newAcquireRequests encodes one AcquireRequest of domain slotsDomain per
// value of key: values "user-0" to "user-(keys-1)".
func newAcquireRequests(key string, keys int) ([]*rawRequest, error) {
	reqs := make([]*rawRequest, keys)
	for i := range reqs {
		b, err := proto.Marshal(&ratelimitdv1.AcquireRequest{Domain: slotsDomain, Descriptors: []*ratelimitdv1.Descriptor{
			{Entries: []*ratelimitdv1.Entry{{Key: key, Value: fmt.Sprintf("user-%d", i)}}},
		}})
		if err != nil {
			return nil, err
		}
		reqs[i] = &rawRequest{frame: mem.BufferSlice{mem.SliceBuffer(b)}}
	}
	return reqs, nil
}

// pairStats is what one caller of the slots group saw.
type pairStats struct {
	latency     histogram // of each pair, from the Acquire's send to the Release's answer
	pairs       uint64    // Acquire admitted, then Release answered
	refused     uint64    // Acquire refused: no pair
	notReleased uint64    // pairs whose Release answered released false
	errors      map[string]uint64
}

// runPairs has workers callers send pairs over conns for length: each
// Acquires a slot of a random one of reqs, then Releases it at once.
// Calls still running 5 s after the end are cancelled.
func runPairs(ctx context.Context, conns []*grpc.ClientConn, reqs []*rawRequest, workers int, length time.Duration, seed uint64) ([]*pairStats, time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, length+5*time.Second)
	defer cancel()
	stats := make([]*pairStats, workers)
	start := time.Now()
	deadline := start.Add(length)
	var wg sync.WaitGroup
	for w := range workers {
		st := &pairStats{errors: map[string]uint64{}}
		stats[w] = st
		cc := conns[w%len(conns)]
		rng := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Go(func() {
			var acq acquireReply
			var rel releaseReply
			relReq := &rawRequest{frame: mem.BufferSlice{nil}}
			var buf []byte
			for ctx.Err() == nil && time.Now().Before(deadline) {
				req := reqs[rng.IntN(len(reqs))]
				sent := time.Now()
				if err := cc.Invoke(ctx, ratelimitdv1.RateLimiter_Acquire_FullMethodName, req, &acq, slotsCall); err != nil {
					st.errors["Acquire "+status.Code(err).String()]++
					continue
				}
				if !acq.allowed {
					st.refused++
					continue
				}
				buf = appendReleaseRequest(buf[:0], acq.lease)
				relReq.frame[0] = mem.SliceBuffer(buf)
				if err := cc.Invoke(ctx, ratelimitdv1.RateLimiter_Release_FullMethodName, relReq, &rel, slotsCall); err != nil {
					st.errors["Release "+status.Code(err).String()]++
					continue
				}
				st.latency.record(time.Since(sent))
				st.pairs++
				if !rel.released {
					st.notReleased++
				}
			}
		})
	}
	wg.Wait()
	return stats, time.Since(start)
}

// generateSlots runs one scenario of the slots group: a warm-up, then the
// measurement, with the CPU time of procs and of the generator, and the
// decision calls Redis ran.
func (lt *loadtest) generateSlots(ctx context.Context, g slotsRun, addr string, procs []proc, rdb *goredis.Client) (scenario, error) {
	c := lt.cfg
	reqs, err := newAcquireRequests(c.Key, g.keys)
	if err != nil {
		return scenario{}, err
	}
	conns, err := dial(ctx, &benchConfig{Addr: addr, Conns: g.conns})
	if err != nil {
		return scenario{}, err
	}
	defer func() {
		for _, cc := range conns {
			cc.Close()
		}
	}()
	lt.logf("running %s for %v (+%v warm-up)", g.name, c.Duration, c.Warmup)
	if c.Warmup > 0 {
		runPairs(ctx, conns, reqs, g.workers, c.Warmup, 0x5eed)
	}
	if err := ctx.Err(); err != nil {
		return scenario{}, err
	}
	all := append([]proc{{Name: "ratelimit-bench", PID: os.Getpid()}}, procs...)
	hz, _ := clockTicks()
	callsBefore, err := decisionCalls(ctx, rdb)
	if err != nil {
		return scenario{}, err
	}
	before, err := sampleCPU(all)
	if err != nil {
		return scenario{}, err
	}
	stats, elapsed := runPairs(ctx, conns, reqs, g.workers, c.Duration, 1)
	after, err := sampleCPU(all)
	if err != nil {
		return scenario{}, err
	}
	if err := ctx.Err(); err != nil {
		return scenario{}, fmt.Errorf("%s: interrupted", g.name)
	}
	callsAfter, err := decisionCalls(ctx, rdb)
	if err != nil {
		return scenario{}, err
	}
	cpu := map[string]time.Duration{}
	for i, p := range all {
		cpu[p.Name] = ticksToDuration(after[i]-before[i], hz)
	}
	calls := int64(-1)
	if callsAfter >= callsBefore {
		calls = int64(callsAfter - callsBefore)
	}
	row := pairsRow(g.name, procs[0].Name, stats, elapsed, cpu, calls)
	lt.logf("  %s pairs/s, p50 %s, p99 %s", num(row.DecisionsPerS), us(row.P50), us(row.P99))
	return row, nil
}

// pairsRow makes a table row of a slots scenario: pairs/s, the pairs'
// latencies, and the CPU time of each process (the server named server,
// "redis", "ratelimit-bench") and the Redis calls (negative when not
// counted) per pair.
func pairsRow(name, server string, stats []*pairStats, elapsed time.Duration, cpu map[string]time.Duration, calls int64) scenario {
	var lat histogram
	var pairs, refused, notReleased uint64
	errs := map[string]uint64{}
	for _, st := range stats {
		lat.merge(&st.latency)
		pairs += st.pairs
		refused += st.refused
		notReleased += st.notReleased
		for k, n := range st.errors {
			errs[k] += n
		}
	}
	row := scenario{Name: name, P50: -1, P99: -1, P999: -1, ServerCPU: -1, RedisCPU: -1, BenchCPU: -1, DecisionsPerCall: -1}
	if s := elapsed.Seconds(); s > 0 {
		row.DecisionsPerS = float64(pairs) / s
	}
	if pairs > 0 {
		row.P50 = micros(lat.quantile(0.50))
		row.P99 = micros(lat.quantile(0.99))
		row.P999 = micros(lat.quantile(0.999))
		perPair := func(name string) float64 {
			d, ok := cpu[name]
			if !ok {
				return -1
			}
			return micros(d) / float64(pairs)
		}
		row.ServerCPU, row.RedisCPU, row.BenchCPU = perPair(server), perPair("redis"), perPair("ratelimit-bench")
	}
	row.Notes = append(row.Notes, "a row of pairs: its rate, latencies and CPU are per Acquire+Release pair (two calls), its decisions/Redis call pairs per script call")
	if calls == 0 {
		row.DecisionsPerCall = math.Inf(1)
	} else if calls > 0 {
		row.DecisionsPerCall = float64(pairs) / float64(calls)
		if pairs > 0 {
			row.Notes = append(row.Notes, fmt.Sprintf("Redis ran %.2f script calls per pair", float64(calls)/float64(pairs)))
		}
	}
	if refused > 0 {
		row.Notes = append(row.Notes, fmt.Sprintf("%d Acquires refused (no pair)", refused))
	}
	if notReleased > 0 {
		row.Notes = append(row.Notes, fmt.Sprintf("%d of %d Releases answered released false: the slot was not held", notReleased, pairs))
	}
	if len(errs) > 0 {
		row.Notes = append(row.Notes, "errors: "+countsText(errs, ", "))
	}
	return row
}
