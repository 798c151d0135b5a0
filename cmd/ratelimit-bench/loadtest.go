package main

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// loadtestConfig is the command line of `ratelimit-bench loadtest`.
type loadtestConfig struct {
	Ratelimitd     string        // the ratelimitd binary
	RedisServer    string        // the redis-server binary
	RedisBenchmark string        // the redis-benchmark binary
	Config         string        // rule files for ratelimitd
	Domain, Key    string        // what the requests ask about
	AlsoDomain     string        // a second domain measured at Workers callers; "" for none
	Duration       time.Duration // of each scenario's measurement
	Warmup         time.Duration // before each generator scenario
	Workers        int           // of the concurrent scenarios
	Conns          int
	Keys           int
	Rate           float64 // of the open-loop scenario
	Out            string  // directory for the JSON reports; "" for none
}

// scenario is one row of the load test's table.
type scenario struct {
	Name          string
	DecisionsPerS float64
	// Latencies in µs and CPU-µs per decision; negative when not measured.
	P50, P99, P999                float64
	ServerCPU, RedisCPU, BenchCPU float64
	Notes                         []string
}

func loadtestMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := &loadtestConfig{}
	fs := flag.NewFlagSet("ratelimit-bench loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.Ratelimitd, "ratelimitd", "bin/ratelimitd", "the ratelimitd binary to start")
	fs.StringVar(&c.RedisServer, "redis-server", "redis-server", "the redis-server binary to start")
	fs.StringVar(&c.RedisBenchmark, "redis-benchmark", "redis-benchmark", "the redis-benchmark binary")
	fs.StringVar(&c.Config, "config", "", "rule files for ratelimitd; empty for the load test's own (domains "+oneLimit+" and "+twoLimits+")")
	fs.StringVar(&c.Domain, "domain", oneLimit, "the requests' domain")
	fs.StringVar(&c.AlsoDomain, "also-domain", twoLimits, "a second domain, measured with -workers callers only; empty for none")
	fs.StringVar(&c.Key, "key", "user_id", "the key of the requests' descriptor entry")
	fs.DurationVar(&c.Duration, "duration", 10*time.Second, "how long each scenario is measured")
	fs.DurationVar(&c.Warmup, "warmup", time.Second, "warm-up before each generator scenario")
	fs.IntVar(&c.Workers, "workers", 50, "callers of the concurrent scenarios (and redis-benchmark's clients)")
	fs.IntVar(&c.Conns, "conns", 4, "gRPC connections of the concurrent scenarios")
	fs.IntVar(&c.Keys, "keys", 10_000, "distinct descriptor values (and redis-benchmark's key space)")
	fs.Float64Var(&c.Rate, "rate", 5000, "requests/s of the open-loop scenario")
	fs.StringVar(&c.Out, "out", "", "write each scenario's full report into this directory as JSON")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: ratelimit-bench loadtest [flags]

Starts redis-server and ratelimitd (-backend redis, then -backend memory) on
free loopback ports, runs the standard scenarios against them and prints one
table; every process it started is stopped at the end, on failure too. The
last rows are this machine's floors: the same load on a grpc-go server that
answers at once (ratelimit-bench floor-server), and a round trip to Redis.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ratelimit-bench loadtest: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	if c.Duration <= 0 || c.Duration > maxDuration {
		fmt.Fprintf(stderr, "ratelimit-bench loadtest: -duration %v: want more than 0, at most %v\n", c.Duration, maxDuration)
		return exitUsage
	}
	lt := &loadtest{cfg: c, log: stderr}
	defer lt.stopAll()
	rows, err := lt.run(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "ratelimit-bench loadtest: %v\n", err)
		return exitError
	}
	writeTable(stdout, rows)
	return exitOK
}

// The load test's own rules: one descriptor (user_id) limited once, as the
// incumbent's reference figures are, and limited twice, as examples/api.yaml
// does, which doubles the keys every decision reads and writes. The
// limits are high enough that the uniform load over 10,000 users is
// admitted.
const (
	oneLimit  = "one_limit"
	twoLimits = "two_limits"
)

// loadtestRules are the rule files of the load test's own rules, by name,
// limiting descriptors of key.
func loadtestRules(key string) map[string]string {
	return map[string]string{
		oneLimit + ".yaml": `# written by ratelimit-bench loadtest
domain: ` + oneLimit + `
descriptors:
  - key: ` + key + `
    rate_limit:
      requests_per_unit: 1000
      unit: second
`,
		twoLimits + ".yaml": `# written by ratelimit-bench loadtest
domain: ` + twoLimits + `
descriptors:
  - key: ` + key + `
    rate_limits:
      - requests_per_unit: 1000
        unit: second
      - requests_per_unit: 1000000
        unit: hour
`,
	}
}

// loadtest runs the scenarios, keeping track of the processes it starts.
type loadtest struct {
	cfg *loadtestConfig
	log io.Writer
	dir string // temporary: logs and the Redis directory

	lua string // how ratelimitd said it calls Redis: "functions (FCALL)", ...

	mu       sync.Mutex
	children []*child
}

// run starts the servers and runs every scenario in turn.
func (lt *loadtest) run(ctx context.Context) ([]scenario, error) {
	c := lt.cfg
	for _, bin := range []*string{&c.Ratelimitd, &c.RedisServer, &c.RedisBenchmark} {
		p, err := exec.LookPath(*bin)
		if err != nil {
			return nil, fmt.Errorf("%s: %w (build ratelimitd with `make build`; Debian: apt-get install redis-server redis-tools)", *bin, err)
		}
		// The servers run in a directory of their own: paths must be
		// absolute.
		if *bin, err = filepath.Abs(p); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "ratelimit-bench-loadtest-")
	if err != nil {
		return nil, err
	}
	lt.dir = dir
	lt.logf("logs and the Redis directory: %s", dir)
	if c.Config == "" {
		c.Config = filepath.Join(dir, "rules")
		if err := os.Mkdir(c.Config, 0o755); err != nil {
			return nil, err
		}
		for name, text := range loadtestRules(c.Key) {
			if err := os.WriteFile(filepath.Join(c.Config, name), []byte(text), 0o644); err != nil {
				return nil, err
			}
		}
		lt.logf("rules: %s", c.Config)
	}
	abs, err := filepath.Abs(c.Config)
	if err != nil {
		return nil, err
	}
	c.Config = abs
	if c.Out != "" {
		if err := os.MkdirAll(c.Out, 0o755); err != nil {
			return nil, err
		}
	}
	redis, redisAddr, err := lt.startRedis(ctx)
	if err != nil {
		return nil, err
	}
	rdb := goredis.NewClient(&goredis.Options{Addr: redisAddr, Protocol: 2, DisableIdentity: true})
	defer rdb.Close()

	var rows []scenario
	rl, grpcAddr, err := lt.startRatelimitd(ctx, "ratelimitd-redis", "-backend", "redis", "-redis-url", "redis://"+redisAddr)
	if err != nil {
		return nil, err
	}
	procs := []proc{{"ratelimitd", rl.pid()}, {"redis", redis.pid()}}
	onRedis := "Redis"
	if lt.lua != "" {
		// "Redis (FCALL)" or "Redis (EVALSHA)": what the server calls.
		if _, how, ok := strings.Cut(lt.lua, "("); ok {
			onRedis = "Redis (" + how
		}
	}
	generator := lt.standardRuns("ratelimitd, "+onRedis, "redis")
	if c.AlsoDomain != "" {
		generator = append(generator, generatorRun{fmt.Sprintf("ratelimitd, %s: %d callers, closed loop, domain %s", onRedis, c.Workers, c.AlsoDomain), c.AlsoDomain, c.Workers, c.Conns, 0, "redis-closed-%d-" + c.AlsoDomain})
	}
	for _, g := range generator {
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			return nil, fmt.Errorf("FLUSHALL before %q: %w", g.name, err)
		}
		row, err := lt.generate(ctx, g.name, g.file, grpcAddr, g.domain, g.workers, g.conns, g.rate, procs)
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}
	// The ceiling: Redis running the decision code alone, called as the
	// script and, where Redis has them, as a function.
	for _, via := range []string{viaScript, viaFunction} {
		for _, pipeline := range []int{1, 16} {
			if err := rdb.FlushAll(ctx).Err(); err != nil {
				return nil, err
			}
			row, err := lt.redisBenchmark(ctx, rdb, redisAddr, redis.pid(), via, pipeline)
			if errors.Is(err, errNoFunctions) {
				lt.logf("no FCALL rows: %v", err)
				break
			}
			if err != nil {
				return nil, err
			}
			rows = append(rows, row)
		}
	}
	lt.stop(rl)

	mem, memAddr, err := lt.startRatelimitd(ctx, "ratelimitd-memory", "-backend", "memory")
	if err != nil {
		return nil, err
	}
	row, err := lt.generate(ctx, fmt.Sprintf("ratelimitd, memory: %d callers, closed loop", c.Workers), "memory-closed-%d",
		memAddr, c.Domain, c.Workers, c.Conns, 0, []proc{{"ratelimitd", mem.pid()}})
	if err != nil {
		return nil, err
	}
	row.RedisCPU = -1
	if rows[0].DecisionsPerS > 0 {
		row.Notes = append(row.Notes, fmt.Sprintf("%.2f× the decisions/s of Redis at %d callers", row.DecisionsPerS/rows[0].DecisionsPerS, c.Workers))
	}
	rows = append(rows, row)
	lt.stop(mem)

	floors, err := lt.floors(ctx, redisAddr, redis.pid())
	if err != nil {
		return nil, err
	}
	return append(rows, floors...), nil
}

// floors measures what this machine costs before ratelimitd decides
// anything: a grpc-go server answering at once, loaded as ratelimitd is,
// and a round trip to Redis. ratelimitd's rows read against them: deciding
// only adds to the first, and deciding with Redis to the second as well.
func (lt *loadtest) floors(ctx context.Context, redisAddr string, redisPID int) ([]scenario, error) {
	var rows []scenario
	fl, addr, err := lt.startFloor(ctx)
	if err != nil {
		return nil, err
	}
	procs := []proc{{"floor-server", fl.pid()}}
	for _, g := range lt.standardRuns("floor: grpc-go answering at once", "floor") {
		row, err := lt.generate(ctx, g.name, g.file, addr, g.domain, g.workers, g.conns, g.rate, procs)
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}
	lt.stop(fl)
	row, err := lt.redisRoundTrip(ctx, redisAddr, redisPID)
	if err != nil {
		return nil, err
	}
	return append(rows, row), nil
}

// generatorRun is one scenario of the generator: its row's name, what it
// asks, its callers, and the base name of its JSON report ("%d" for the
// callers).
type generatorRun struct {
	name           string
	domain         string
	workers, conns int
	rate           float64
	file           string
}

// standardRuns returns the scenarios every server of the load test is
// measured with, named after label, their reports after file: Workers
// callers, 1 caller, and the open loop at Rate.
func (lt *loadtest) standardRuns(label, file string) []generatorRun {
	c := lt.cfg
	return []generatorRun{
		{fmt.Sprintf("%s: %d callers, closed loop", label, c.Workers), c.Domain, c.Workers, c.Conns, 0, file + "-closed-%d"},
		{label + ": 1 caller, closed loop", c.Domain, 1, 1, 0, file + "-closed-1"},
		{fmt.Sprintf("%s: open loop at %s/s (%d workers)", label, num(c.Rate), c.Workers), c.Domain, c.Workers, c.Conns, c.Rate, file + "-open"},
	}
}

// generate runs the generator against addr and makes a row of its report.
func (lt *loadtest) generate(ctx context.Context, name, file, addr, domain string, workers, conns int, rate float64, procs []proc) (scenario, error) {
	c := lt.cfg
	bc := &benchConfig{
		Addr: addr, Workers: workers, Conns: conns, Duration: c.Duration,
		Keys: c.Keys, Dist: "uniform", Descriptors: 1,
		Domain: domain, Key: c.Key, ValuePrefix: "user-",
		Rate: rate, Warmup: c.Warmup, Timeout: 5 * time.Second, Seed: 1, Procs: procs,
	}
	var pids []string
	for _, p := range procs {
		pids = append(pids, fmt.Sprintf("%s=%d", p.Name, p.PID))
	}
	lt.logf("running %s for %v (+%v warm-up): ratelimit-bench -addr %s -workers %d -conns %d -keys %d -domain %s -key %s -rate %g -duration %v -warmup %v -pids %s",
		name, c.Duration, c.Warmup, addr, workers, conns, c.Keys, domain, c.Key, rate, c.Duration, c.Warmup, strings.Join(pids, ","))
	r, err := runBench(ctx, bc)
	if err != nil {
		return scenario{}, fmt.Errorf("%s: %w", name, err)
	}
	if r.Interrupted {
		return scenario{}, fmt.Errorf("%s: interrupted", name)
	}
	if c.Out != "" {
		if strings.Contains(file, "%d") {
			file = fmt.Sprintf(file, workers)
		}
		if err := writeJSONFile(filepath.Join(c.Out, file+".json"), r); err != nil {
			return scenario{}, err
		}
	}
	row := scenario{
		Name: name, DecisionsPerS: r.RequestsPerSecond,
		P50: r.Latency.P50, P99: r.Latency.P99, P999: r.Latency.P999,
		ServerCPU: -1, RedisCPU: -1, BenchCPU: -1,
	}
	if p := r.cpuOf(procs[0].Name); p != nil { // the server is first
		row.ServerCPU = p.MicrosPerDecision
	}
	if p := r.cpuOf("redis"); p != nil {
		row.RedisCPU = p.MicrosPerDecision
	}
	if p := r.cpuOf("ratelimit-bench"); p != nil {
		row.BenchCPU = p.MicrosPerDecision
	}
	if n := r.RequestCodes.OverLimit; n > 0 {
		row.Notes = append(row.Notes, fmt.Sprintf("%d of %d answers OVER_LIMIT", n, r.Requests))
	}
	var errs []string
	for code, n := range r.Errors {
		errs = append(errs, fmt.Sprintf("%s %d", code, n))
	}
	if len(errs) > 0 {
		row.Notes = append(row.Notes, "errors: "+strings.Join(errs, ", "))
	}
	if r.SendLag != nil {
		row.Notes = append(row.Notes, fmt.Sprintf("calls left p50 %s, p99 %s after their scheduled time", us(r.SendLag.P50), us(r.SendLag.P99)))
	}
	for _, n := range r.Notes {
		if !strings.HasPrefix(n, "CPU times") {
			row.Notes = append(row.Notes, n)
		}
	}
	lt.logf("  %s decisions/s, p50 %s, p99 %s", num(row.DecisionsPerS), us(row.P50), us(row.P99))
	return row, nil
}

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
		a, err := algo.ParseAlgorithm(l.Algorithm.String())
		if err != nil {
			return nil, nil, err
		}
		reqs[i] = algo.Request{
			Limit: algo.Limit{Algorithm: a, Requests: uint64(l.RequestsPerUnit), Window: l.Window, Burst: l.Burst},
			Hits:  1,
		}
		keys = append(keys, fmt.Sprintf("ratelimit-bench:%d:__rand_int__", i))
	}
	for _, a := range algo.AppendScriptArgs(nil, time.Time{}, 0, reqs) {
		s, ok := a.(string)
		if !ok {
			return nil, nil, fmt.Errorf("algo.AppendScriptArgs gave a %T, want strings", a)
		}
		argv = append(argv, s)
	}
	return keys, argv, nil
}

// How redis-benchmark calls the decision code: the script by EVALSHA
// (Script), or the function library by FCALL (Library, Redis 7).
const (
	viaScript   = "EVALSHA"
	viaFunction = "FCALL"
)

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
		if _, err := rdb.FunctionLoadReplace(ctx, algo.Library(name)).Result(); err != nil {
			if strings.Contains(strings.ToLower(err.Error()), "unknown command") {
				return nil, nil, nil, errNoFunctions
			}
			return nil, nil, nil, fmt.Errorf("FUNCTION LOAD: %w", err)
		}
		cmd = []string{"fcall", name + "_decide"}
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

// oneEntry is a descriptor of one entry, for config.Domain.Match.
type oneEntry [2]string

func (d oneEntry) Len() int                      { return 1 }
func (d oneEntry) Entry(int) (key, value string) { return d[0], d[1] }

// redisBenchmark runs redis-benchmark calling the decision code (via
// EVALSHA or FCALL) with the arguments of one decision, pipelined this
// deep.
func (lt *loadtest) redisBenchmark(ctx context.Context, rdb *goredis.Client, addr string, redisPID int, via string, pipeline int) (scenario, error) {
	c := lt.cfg
	what := "decision script"
	if via == viaFunction {
		what = "decision function"
	}
	name := fmt.Sprintf("redis-benchmark: %s of the %s, %d clients", via, what, c.Workers)
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
	row.Notes = append(row.Notes, fmt.Sprintf("each call decides the %d limit(s) of (%s, …) in domain %s; redis-benchmark reports no p99.9", len(keys), c.Key, c.Domain))
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
		ServerCPU: -1, BenchCPU: -1,
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

// child is a process the load test started.
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // its exit status, once done
	log  string        // where its output goes
}

func (ch *child) pid() int { return ch.cmd.Process.Pid }

// start starts bin with args, its output into a log file of the load
// test's directory; the kernel kills it should the load test die without
// stopping it.
func (lt *loadtest) start(name, bin string, args []string, stderr io.Writer) (*child, error) {
	logPath := filepath.Join(lt.dir, name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = lt.dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	if stderr != nil {
		cmd.Stderr = io.MultiWriter(logf, stderr)
	}
	cmd.Env = cleanEnv()
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	ch := &child{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() {
		ch.err = cmd.Wait()
		logf.Close() // only now: with stderr, the copy to the log runs until the end
		close(ch.done)
	}()
	lt.mu.Lock()
	lt.children = append(lt.children, ch)
	lt.mu.Unlock()
	return ch, nil
}

// cleanEnv is this process's environment without RATELIMITD_ variables,
// which would change the servers' configuration.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RATELIMITD_") {
			env = append(env, kv)
		}
	}
	return env
}

// stop ends ch: SIGTERM, then SIGKILL after 3 seconds.
func (lt *loadtest) stop(ch *child) {
	select {
	case <-ch.done:
		return
	default:
	}
	_ = ch.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-ch.done:
	case <-time.After(3 * time.Second):
		_ = ch.cmd.Process.Kill()
		<-ch.done
	}
}

// stopAll stops every process the load test started and removes its
// directory.
func (lt *loadtest) stopAll() {
	lt.mu.Lock()
	children := lt.children
	lt.children = nil
	lt.mu.Unlock()
	for _, ch := range children {
		lt.stop(ch)
	}
	if lt.dir != "" {
		_ = os.RemoveAll(lt.dir)
	}
}

// tail returns the end of ch's log, for an error message.
func (ch *child) tail() string {
	b, _ := os.ReadFile(ch.log)
	if len(b) > 4<<10 {
		b = b[len(b)-4<<10:]
	}
	return fmt.Sprintf("\n--- %s:\n%s", ch.log, b)
}

// startRedis starts redis-server on a free loopback port. A port found
// free can be taken before redis-server binds it, so it tries three
// times, and checks the server answering is its own (INFO's process_id).
func (lt *loadtest) startRedis(ctx context.Context) (*child, string, error) {
	var last error
	for attempt := range 3 {
		port, err := freePort()
		if err != nil {
			return nil, "", err
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		rdir := filepath.Join(lt.dir, fmt.Sprintf("redis-%d", attempt))
		if err := os.Mkdir(rdir, 0o755); err != nil {
			return nil, "", err
		}
		ch, err := lt.start(fmt.Sprintf("redis-%d", attempt), lt.cfg.RedisServer, []string{
			"--bind", "127.0.0.1", "--port", strconv.Itoa(port),
			"--save", "", "--appendonly", "no", "--dir", rdir,
		}, nil)
		if err != nil {
			return nil, "", err
		}
		if last = waitRedis(ctx, ch, addr); last == nil {
			lt.logf("redis-server (PID %d) on %s", ch.pid(), addr)
			return ch, addr, nil
		}
		lt.stop(ch)
	}
	return nil, "", last
}

// waitRedis waits until the redis-server of ch answers on addr.
func waitRedis(ctx context.Context, ch *child, addr string) error {
	rdb := goredis.NewClient(&goredis.Options{Addr: addr, Protocol: 2, DisableIdentity: true, MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-ch.done:
			return fmt.Errorf("redis-server exited (%v)%s", ch.err, ch.tail())
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		// A bare TCP connection first: go-redis logs every refused dial.
		var info string
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			info, err = rdb.Info(ctx, "server").Result()
		}
		if err == nil {
			if !strings.Contains(info, fmt.Sprintf("process_id:%d\r", ch.pid())) {
				return fmt.Errorf("another Redis answers on %s", addr)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s not ready within 10s: %v%s", addr, err, ch.tail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// freePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startRatelimitd starts ratelimitd on ports of 127.0.0.1 it picks itself
// and returns its gRPC address.
func (lt *loadtest) startRatelimitd(ctx context.Context, name string, extra ...string) (*child, string, error) {
	args := append([]string{
		"-config", lt.cfg.Config,
		"-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0",
		"-log-format", "json", "-watch-config=false", "-shutdown-timeout", "1s",
	}, extra...)
	return lt.startServer(ctx, name, lt.cfg.Ratelimitd, args)
}

// startFloor starts this program's floor-server on a port of 127.0.0.1 it
// picks itself and returns its gRPC address.
func (lt *loadtest) startFloor(ctx context.Context) (*child, string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, "", fmt.Errorf("finding ratelimit-bench itself for its floor-server: %w", err)
	}
	return lt.startServer(ctx, "floor-server", self, []string{"floor-server", "-addr", "127.0.0.1:0"})
}

// startServer starts the gRPC server bin with args and returns its
// address, read from its JSON log line "serving gRPC".
func (lt *loadtest) startServer(ctx context.Context, name, bin string, args []string) (*child, string, error) {
	lt.logf("starting %s", shellJoin(append([]string{bin}, args...)))
	pr, pw := io.Pipe()
	ch, err := lt.start(name, bin, args, pw)
	if err != nil {
		pw.Close()
		return nil, "", err
	}
	go func() {
		<-ch.done
		pw.Close()
	}()
	type ready struct{ addr, lua string }
	found := make(chan ready, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var lua string
		for sc.Scan() {
			var rec struct{ Msg, Addr, Lua string }
			if json.Unmarshal(sc.Bytes(), &rec) != nil {
				continue
			}
			switch {
			case rec.Msg == "backend ready":
				lua = rec.Lua
			case rec.Msg == "serving gRPC" && rec.Addr != "":
				select {
				case found <- ready{rec.Addr, lua}:
				default:
				}
			}
		}
		io.Copy(io.Discard, pr) // never block the child's writes
	}()
	select {
	case r := <-found:
		lt.logf("%s (PID %d) serving gRPC on %s", name, ch.pid(), r.addr)
		if r.lua != "" {
			lt.logf("%s decides with Redis %s", name, r.lua)
			lt.lua = r.lua
		}
		return ch, r.addr, nil
	case <-ch.done:
		return nil, "", fmt.Errorf("%s exited (%v) before serving%s", name, ch.err, ch.tail())
	case <-time.After(15 * time.Second):
		return nil, "", fmt.Errorf("%s did not log \"serving gRPC\" within 15s%s", name, ch.tail())
	case <-ctx.Done():
		return nil, "", ctx.Err()
	}
}

func (lt *loadtest) logf(format string, args ...any) {
	fmt.Fprintf(lt.log, "loadtest: "+format+"\n", args...)
}

func writeJSONFile(path string, r *report) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := r.writeJSON(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writeTable prints the rows as one Markdown table, then their notes.
func writeTable(w io.Writer, rows []scenario) {
	cell := func(v float64, f func(float64) string) string {
		if v < 0 {
			return "–"
		}
		return f(v)
	}
	cpu := func(v float64) string { return fmt.Sprintf("%.1f", v) }
	fmt.Fprintln(w, "| scenario | decisions/s | p50 | p99 | p99.9 | server CPU-µs/decision | Redis CPU-µs/decision | generator CPU-µs/decision |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", r.Name, num(r.DecisionsPerS),
			cell(r.P50, us), cell(r.P99, us), cell(r.P999, us),
			cell(r.ServerCPU, cpu), cell(r.RedisCPU, cpu), cell(r.BenchCPU, cpu))
	}
	fmt.Fprintln(w)
	for _, r := range rows {
		for _, n := range r.Notes {
			fmt.Fprintf(w, "- %s: %s\n", r.Name, n)
		}
	}
}

// shellJoin joins a command line for a shell, quoting what needs it.
func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a != "" && strings.IndexFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=,@%+", r))
		}) < 0 {
			q[i] = a
			continue
		}
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}
