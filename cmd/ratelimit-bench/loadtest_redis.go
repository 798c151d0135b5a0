package main

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// scriptCall returns the arguments of one decision the way the Redis
// backend makes it for a request with one descriptor (Key, some value)
// in Domain: EVALSHA's numkeys, KEYS and ARGV, with keys redis-benchmark
// randomizes (__rand_int__).
func (lt *loadtest) scriptCall() (keys, argv []string, err error) {
	c := lt.cfg
	rules, err := config.Load(c.Config)
	if err != nil {
		return nil, nil, err
	}
	dom := rules.Domain(c.Domain)
	if dom == nil {
		return nil, nil, fmt.Errorf("%s: no domain %q", c.Config, c.Domain)
	}
	rule := dom.Match(oneEntry{c.Key, "user-0"})
	if rule == nil || len(rule.Limits) == 0 {
		return nil, nil, fmt.Errorf("%s: domain %q has no limited rule for (%s, user-0)", c.Config, c.Domain, c.Key)
	}
	reqs := make([]algo.Request, len(rule.Limits))
	for i, l := range rule.Limits {
		reqs[i] = algo.Request{
			Limit: algo.Limit{Algorithm: l.Algorithm, Requests: uint64(l.RequestsPerUnit), Window: l.Window, Burst: l.Burst},
			Hits:  1,
		}
		keys = append(keys, fmt.Sprintf("ratelimit-bench:%d:__rand_int__", i))
	}
	for _, a := range algo.AppendScriptArgs(nil, time.Time{}, 0, time.Time{}, reqs) {
		s, ok := a.(string)
		if !ok {
			return nil, nil, fmt.Errorf("algo.AppendScriptArgs gave a %T, want strings", a)
		}
		argv = append(argv, s)
	}
	return keys, argv, nil
}

// How redis-benchmark calls the decision code: the script by EVALSHA
// (Script), or the function library by FCALL (Library, Redis 7); or, with
// viaBare, a function that decides nothing (bareLibrary), called with the
// same keys and arguments: the floor of the decision function's call.
const (
	viaScript   = "EVALSHA"
	viaFunction = "FCALL"
	viaBare     = "bare FCALL"
)

// bareLibrary is a function library whose function does what a decision
// of a fixed window cannot do without, and nothing else: read the Redis
// clock (TIME), read every key in one MGET, write each key (SET …
// KEEPTTL), and reply as the decision function does (admitted, five
// integers a key, no takes). Called with the decision's keys and
// arguments, it is the floor a decision's call costs Redis before
// deciding anything: the Redis path's ratio to it is what the decision
// itself costs (docs/performance.md).
const bareLibrary = `#!lua name=ratelimit_bench_bare
redis.register_function('ratelimit_bench_bare_rw', function(keys, args)
  redis.call('TIME')
  redis.call('MGET', unpack(keys))
  local r = {1}
  for i = 1, #keys do
    redis.call('SET', keys[i], '1763781234567890 12', 'KEEPTTL')
    local o = #r
    r[o + 1], r[o + 2], r[o + 3], r[o + 4], r[o + 5] = 1, 999, 12345, 0, 0
  end
  r[#r + 1] = 0
  return r
end)`

// errNoFunctions reports a Redis without FUNCTION and FCALL (before 7).
var errNoFunctions = errors.New("this Redis has no functions (FUNCTION LOAD, FCALL: Redis 7)")

// prepareCall loads the decision code into Redis, as a script (via
// viaScript) or a function library (viaFunction), and checks by one call
// that it takes the arguments of scriptCall. It returns the command and
// its first argument (EVALSHA and the SHA, or FCALL and the function),
// the keys and the ARGV.
func (lt *loadtest) prepareCall(ctx context.Context, rdb *goredis.Client, via string) (cmd []string, keys, argv []string, err error) {
	switch via {
	case viaScript:
		sha, err := rdb.ScriptLoad(ctx, algo.Script()).Result()
		if err != nil {
			return nil, nil, nil, fmt.Errorf("SCRIPT LOAD: %w", err)
		}
		cmd = []string{"evalsha", sha}
	case viaFunction:
		// A library of its own, apart from the one ratelimitd loads.
		name := "ratelimit_bench"
		if err := loadLibrary(ctx, rdb, algo.Library(name)); err != nil {
			return nil, nil, nil, err
		}
		cmd = []string{"fcall", name + "_decide"}
	case viaBare:
		if err := loadLibrary(ctx, rdb, bareLibrary); err != nil {
			return nil, nil, nil, err
		}
		cmd = []string{"fcall", "ratelimit_bench_bare_rw"}
	default:
		return nil, nil, nil, fmt.Errorf("unknown way to call the decision code: %s", via)
	}
	keys, argv, err = lt.scriptCall()
	if err != nil {
		return nil, nil, nil, err
	}
	concrete := make([]string, len(keys))
	for i, k := range keys {
		concrete[i] = strings.ReplaceAll(k, "__rand_int__", "check")
	}
	anyArgs := make([]any, len(argv))
	for i, a := range argv {
		anyArgs[i] = a
	}
	var reply []any
	if via == viaScript {
		reply, err = rdb.EvalSha(ctx, cmd[1], concrete, anyArgs...).Slice()
	} else {
		reply, err = rdb.FCall(ctx, cmd[1], concrete, anyArgs...).Slice()
	}
	if err != nil {
		return nil, nil, nil, fmt.Errorf("the decision %s refused the benchmark's arguments: %w", via, err)
	}
	if _, err := algo.ParseScriptReply(reply, make([]algo.Decision, len(keys))); err != nil {
		return nil, nil, nil, err
	}
	if err := rdb.Del(ctx, concrete...).Err(); err != nil {
		return nil, nil, nil, err
	}
	return cmd, keys, argv, nil
}

// loadLibrary loads (or replaces) the function library code into Redis;
// errNoFunctions when Redis has no functions.
func loadLibrary(ctx context.Context, rdb *goredis.Client, code string) error {
	if _, err := rdb.FunctionLoadReplace(ctx, code).Result(); err != nil {
		if strings.Contains(strings.ToLower(err.Error()), "unknown command") {
			return errNoFunctions
		}
		return fmt.Errorf("FUNCTION LOAD: %w", err)
	}
	return nil
}

// redisBenchmark runs redis-benchmark calling the decision code (via
// EVALSHA or FCALL) with the arguments of one decision, pipelined this
// deep.
func (lt *loadtest) redisBenchmark(ctx context.Context, rdb *goredis.Client, addr string, redisPID int, via string, pipeline int) (scenario, error) {
	c := lt.cfg
	name := fmt.Sprintf("redis-benchmark: %s of the decision script, %d clients", via, c.Workers)
	switch via {
	case viaFunction:
		name = fmt.Sprintf("redis-benchmark: %s of the decision function, %d clients", via, c.Workers)
	case viaBare:
		name = fmt.Sprintf("floor: redis-benchmark: FCALL of a bare read-and-write function (TIME, MGET, SET, reply), %d clients", c.Workers)
	}
	if pipeline > 1 {
		name += fmt.Sprintf(", %d-deep pipeline", pipeline)
	}
	call, keys, argv, err := lt.prepareCall(ctx, rdb, via)
	if err != nil {
		return scenario{}, err
	}
	host, port, _ := net.SplitHostPort(addr)
	row, err := lt.measureRedisBenchmark(ctx, name, redisPID, func(n int) []string {
		a := []string{"-h", host, "-p", port, "-c", strconv.Itoa(c.Workers), "-n", strconv.Itoa(n),
			"-r", strconv.Itoa(c.Keys), "-P", strconv.Itoa(pipeline), "--csv"}
		a = append(a, call...)
		a = append(a, strconv.Itoa(len(keys)))
		a = append(a, keys...)
		return append(a, argv...)
	})
	if err != nil {
		return scenario{}, err
	}
	does := fmt.Sprintf("decides the %d limit(s) of (%s, …) in domain %s", len(keys), c.Key, c.Domain)
	if via == viaBare {
		does = fmt.Sprintf("reads and writes the %d key(s) of a decision of (%s, …) in domain %s, called with its arguments, and decides nothing", len(keys), c.Key, c.Domain)
	}
	row.Notes = append(row.Notes, "each call "+does+"; redis-benchmark reports no p99.9")
	return row, nil
}

// redisRoundTrip runs redis-benchmark sending PING from one client: the
// latency of a round trip to Redis on this machine, which every decision
// ratelimitd makes with Redis pays once.
func (lt *loadtest) redisRoundTrip(ctx context.Context, addr string, redisPID int) (scenario, error) {
	host, port, _ := net.SplitHostPort(addr)
	row, err := lt.measureRedisBenchmark(ctx, "floor: redis-benchmark: PING, 1 client", redisPID, func(n int) []string {
		return []string{"-h", host, "-p", port, "-c", "1", "-n", strconv.Itoa(n), "--csv", "ping"}
	})
	if err != nil {
		return scenario{}, err
	}
	row.Notes = append(row.Notes, "one round trip to Redis and back; redis-benchmark reports no p99.9")
	return row, nil
}

// measureRedisBenchmark runs redis-benchmark with args(n) for n calls,
// sized by a short run to last about the load test's duration, and makes a
// row of its result and of what Redis spent per call.
func (lt *loadtest) measureRedisBenchmark(ctx context.Context, name string, redisPID int, args func(n int) []string) (scenario, error) {
	c := lt.cfg
	lt.logf("running %s: sizing", name)
	cal, err := lt.runRedisBenchmark(ctx, args(20_000))
	if err != nil {
		return scenario{}, err
	}
	n := int(min(max(cal.rps*c.Duration.Seconds(), 10_000), maxCount))
	lt.logf("running %s: %d calls (about %v): %s", name, n, c.Duration, shellJoin(append([]string{filepath.Base(c.RedisBenchmark)}, args(n)...)))
	before, err := cpuTicks(redisPID)
	if err != nil {
		return scenario{}, err
	}
	res, err := lt.runRedisBenchmark(ctx, args(n))
	if err != nil {
		return scenario{}, err
	}
	after, err := cpuTicks(redisPID)
	if err != nil {
		return scenario{}, err
	}
	hz, _ := clockTicks()
	row := scenario{
		Name: name, DecisionsPerS: res.rps,
		P50: res.p50, P99: res.p99, P999: -1,
		ServerCPU: -1, BenchCPU: -1, DecisionsPerCall: -1,
		RedisCPU: micros(ticksToDuration(after-before, hz)) / float64(n),
		Notes:    []string{fmt.Sprintf("%d calls", n)},
	}
	lt.logf("  %s calls/s, p50 %s, p99 %s", num(row.DecisionsPerS), us(row.P50), us(row.P99))
	return row, nil
}

// benchResult is what redis-benchmark's CSV says; latencies in µs,
// negative when it did not report them.
type benchResult struct {
	rps, p50, p99 float64
}

// runRedisBenchmark runs redis-benchmark with args (which include --csv)
// and reads its CSV.
func (lt *loadtest) runRedisBenchmark(ctx context.Context, args []string) (benchResult, error) {
	cmd := exec.CommandContext(ctx, lt.cfg.RedisBenchmark, args...)
	cmd.SysProcAttr = childAttr()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return benchResult{}, fmt.Errorf("redis-benchmark: %v\n%s%s", err, out, stderr.String())
	}
	return parseBenchmarkCSV(out)
}

// parseBenchmarkCSV reads redis-benchmark --csv output: a header, then one
// row per test; the columns are found by name.
func parseBenchmarkCSV(out []byte) (benchResult, error) {
	recs, err := csv.NewReader(strings.NewReader(string(out))).ReadAll()
	if err != nil || len(recs) < 2 {
		return benchResult{}, fmt.Errorf("redis-benchmark printed no CSV result: %q", clip(string(out), 500))
	}
	col := func(name string) float64 {
		for i, h := range recs[0] {
			if h == name && i < len(recs[1]) {
				if v, err := strconv.ParseFloat(recs[1][i], 64); err == nil {
					return v
				}
			}
		}
		return -1
	}
	r := benchResult{rps: col("rps"), p50: col("p50_latency_ms"), p99: col("p99_latency_ms")}
	if r.rps <= 0 {
		return benchResult{}, fmt.Errorf("redis-benchmark printed no rps: %q", clip(string(out), 500))
	}
	if r.p50 >= 0 {
		r.p50 *= 1000
	}
	if r.p99 >= 0 {
		r.p99 *= 1000
	}
	return r, nil
}

// decisionCommands are the commands ratelimitd's Redis backend decides
// with: FCALL of its function library, or EVALSHA of its script, and
// EVAL when Redis lost the script. Lease takes and gives travel in the
// same calls.
var decisionCommands = []string{"fcall", "evalsha", "eval"}

// decisionCalls returns how many decision calls the Redis of rdb has run
// since it started (or since CONFIG RESETSTAT), from INFO commandstats.
func decisionCalls(ctx context.Context, rdb *goredis.Client) (uint64, error) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO commandstats: %w", err)
	}
	return commandCalls(info, decisionCommands...)
}

// commandCalls sums the calls of cmds (in lower case) in the text of INFO
// commandstats, whose lines read "cmdstat_fcall:calls=12,usec=...". A
// command Redis has not run has no line: it counts 0. Commands a script
// runs are counted under their own names, not under the script's call.
func commandCalls(info string, cmds ...string) (uint64, error) {
	var n uint64
	for line := range strings.SplitSeq(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		cmd, isStat := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isStat || !slices.Contains(cmds, cmd) {
			continue
		}
		calls, _, _ := strings.Cut(stats, ",")
		v, ok := strings.CutPrefix(calls, "calls=")
		if !ok {
			return 0, fmt.Errorf("INFO commandstats line %q: no calls= first", clip(line, 200))
		}
		c, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO commandstats line %q: %v", clip(line, 200), err)
		}
		n += c
	}
	return n, nil
}
