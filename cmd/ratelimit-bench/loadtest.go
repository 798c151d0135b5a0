package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
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
	// LeasedWarmup and LeasedWindow are the leased group's warm-up, and
	// how long its Redis rows at Workers callers are measured.
	LeasedWarmup, LeasedWindow time.Duration
	Workers                    int // of the concurrent scenarios
	Conns                      int
	Keys                       int
	ZipfS                      float64         // the exponent of the leased group's Zipf keys
	Rate                       float64         // of the open-loop scenario
	Out                        string          // directory for the JSON reports; "" for none
	Groups                     map[string]bool // the scenario groups to run (-scenarios)
	RLQS                       rlqsConfig      // the rlqs group's streams (-rlqs-*)
	Regions                    regionsConfig   // the regions group's links (-region-*)
	Side                       sideConfig      // the side-by-side group's servers (-reference-bin, -side-*)
}

// The scenario groups, as -scenarios names them, in the order their rows
// appear in the table.
const (
	// groupStandard: ratelimitd on Redis and on the memory backend, with
	// the standard runs (Workers callers, 1 caller, the open loop) and
	// AlsoDomain.
	groupStandard = "standard"
	// groupRedisBenchmark: redis-benchmark calling the decision code
	// alone, the ceiling of ratelimitd on Redis.
	groupRedisBenchmark = "redis-benchmark"
	// groupLeased: Zipf keys on a limit that rarely binds, decided
	// exactly and leased on Redis, and on the memory backend.
	groupLeased = "leased"
	// groupFloors: what this machine costs before anything is decided.
	groupFloors = "floors"
	// groupSlots: Acquire+Release pairs of a concurrency limit on Redis,
	// against the exact decision of one descriptor (loadtest_slots.go).
	groupSlots = "slots"
	// groupRLQS: RLQS streams reporting buckets to ratelimitd -rlqs
	// (loadtest_rlqs.go), in a table of its own.
	groupRLQS = "rlqs"
	// groupRegions: a global limit on Redis, alone and with two peer
	// regions over slow links (loadtest_regions.go).
	groupRegions = "regions"
)

// scenarioGroups lists every group, in table order.
var scenarioGroups = []string{groupStandard, groupRedisBenchmark, groupLeased, groupFloors, groupSlots, groupRegions, groupRLQS, groupSideBySide}

// parseScenarios reads -scenarios: "all", or group names separated by
// commas.
func parseScenarios(s string) (map[string]bool, error) {
	groups := map[string]bool{}
	for name := range strings.SplitSeq(s, ",") {
		name = strings.TrimSpace(name)
		switch {
		case name == "all":
			for _, g := range scenarioGroups {
				groups[g] = true
			}
		case slices.Contains(scenarioGroups, name):
			groups[name] = true
		default:
			return nil, fmt.Errorf("-scenarios %q: unknown group %q; want all, or some of %s separated by commas", s, name, strings.Join(scenarioGroups, ", "))
		}
	}
	return groups, nil
}

// scenario is one row of the load test's table.
type scenario struct {
	Name          string
	DecisionsPerS float64
	// Latencies in µs and CPU-µs per decision; negative when not measured.
	P50, P99, P999                float64
	ServerCPU, RedisCPU, BenchCPU float64
	// DecisionsPerCall is the decisions made per decision call Redis ran:
	// negative when not counted, +Inf when Redis ran no call.
	DecisionsPerCall float64
	Notes            []string
}

func loadtestMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := &loadtestConfig{}
	fs := flag.NewFlagSet("ratelimit-bench loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.Ratelimitd, "ratelimitd", "bin/ratelimitd", "the ratelimitd binary to start")
	fs.StringVar(&c.RedisServer, "redis-server", "redis-server", "the redis-server binary to start")
	fs.StringVar(&c.RedisBenchmark, "redis-benchmark", "redis-benchmark", "the redis-benchmark binary")
	fs.StringVar(&c.Config, "config", "", "rule files for ratelimitd; empty for the load test's own (domains "+strings.Join([]string{oneLimit, twoLimits, zipfExact, zipfLeased}, ", ")+")")
	fs.StringVar(&c.Domain, "domain", oneLimit, "the requests' domain")
	fs.StringVar(&c.AlsoDomain, "also-domain", twoLimits, "a second domain, measured with -workers callers only; empty for none")
	fs.StringVar(&c.Key, "key", "user_id", "the key of the requests' descriptor entry")
	fs.DurationVar(&c.Duration, "duration", 10*time.Second, "how long each scenario is measured")
	fs.DurationVar(&c.Warmup, "warmup", time.Second, "warm-up before each generator scenario")
	fs.DurationVar(&c.LeasedWarmup, "leased-warmup", 20*time.Second, "leased group: warm-up before each scenario, long enough for the Zipf tail's keys to be seen once (their first request always goes to Redis)")
	fs.DurationVar(&c.LeasedWindow, "leased-duration", time.Minute, "leased group: how long the Redis rows at -workers callers are measured; a whole window of the 1-minute limit, so that its rollover, when every key's leases end, counts once")
	fs.IntVar(&c.Workers, "workers", 50, "callers of the concurrent scenarios (and redis-benchmark's clients)")
	fs.IntVar(&c.Conns, "conns", 4, "gRPC connections of the concurrent scenarios")
	fs.IntVar(&c.Keys, "keys", 10_000, "distinct descriptor values, uniform or (leased group) Zipf; also redis-benchmark's key space")
	fs.Float64Var(&c.ZipfS, "zipf-s", 1.1, "Zipf exponent of the leased scenarios' keys (> 0): value i is asked with probability proportional to 1/(i+1)^s")
	fs.Float64Var(&c.Rate, "rate", 5000, "requests/s of the open-loop scenario")
	fs.StringVar(&c.Out, "out", "", "write each scenario's full report into this directory as JSON")
	addRLQSFlags(fs, &c.RLQS)
	addRegionsFlags(fs, &c.Regions)
	addSideFlags(fs, &c.Side)
	scenarios := fs.String("scenarios", "all", "the scenario groups to run: all, or some of "+strings.Join(scenarioGroups, ", ")+" separated by commas (such as leased, to reproduce just those rows)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: ratelimit-bench loadtest [flags]

Starts redis-server and ratelimitd (-backend redis, then -backend memory) on
free loopback ports, runs the standard scenarios against them and prints one
table; every process it started is stopped at the end, on failure too. The
last rows are this machine's floors: the same load on a grpc-go server that
answers at once (ratelimit-bench floor-server), and a round trip to Redis.

-scenarios picks groups of rows:
  %s: ratelimitd on Redis and on the memory backend
  %s: Redis running the decision code alone, the ceiling
  %s: Zipf keys on a limit of 1,000,000 a minute, consistency exact
      and leased on Redis, leased on the memory backend, with decisions
      per Redis call and the ratios of leased to exact and to memory
  %s: a grpc-go server answering at once, and a round trip to Redis
  %s: Acquire+Release pairs of a concurrency limit on Redis (many keys,
      one hot key, 1 caller), per pair, against one exact decision
  %s: a limit of scope: global on Redis, without a region, then as a
      region with two peer regions over links of -region-latency each
      way, with the ratios and the sync's bandwidth per active key
  %s: RLQS streams (-rlqs-streams) each reporting -rlqs-buckets buckets
      every -rlqs-interval to ratelimitd -rlqs on -rlqs-backends:
      report-to-assignment latency, CPU and memory, in a table of its own
  %s: ratelimitd beside envoyproxy/ratelimit (-reference-bin, or
      ANCHOR_BIN) and/or another ratelimitd (-baseline-ratelimitd) on the
      same Redis, rules and load, in interleaved rounds, with each round's
      ratios; skipped when neither is given

Flags:
`, groupStandard, groupRedisBenchmark, groupLeased, groupFloors, groupSlots, groupRegions, groupRLQS, groupSideBySide)
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
	if !(c.ZipfS > 0 && c.ZipfS < 100) {
		fmt.Fprintf(stderr, "ratelimit-bench loadtest: -zipf-s %v: want a number above 0 (and below 100)\n", c.ZipfS)
		return exitUsage
	}
	var err error
	if c.Groups, err = parseScenarios(*scenarios); err != nil {
		fmt.Fprintf(stderr, "ratelimit-bench loadtest: %v\n", err)
		return exitUsage
	}
	if err := c.Side.validate(); err != nil {
		fmt.Fprintf(stderr, "ratelimit-bench loadtest: %v\n", err)
		return exitUsage
	}
	if err := c.RLQS.validate(); err != nil {
		fmt.Fprintf(stderr, "ratelimit-bench loadtest: %v\n", err)
		return exitUsage
	}
	lt := &loadtest{cfg: c, log: stderr}
	defer lt.stopAll()
	rows, err := lt.run(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "ratelimit-bench loadtest: %v\n", err)
		return exitError
	}
	if len(rows) > 0 {
		writeTable(stdout, rows)
	}
	if len(lt.rlqsRows) > 0 {
		if len(rows) > 0 {
			fmt.Fprintln(stdout)
		}
		writeRLQSTable(stdout, lt.rlqsRows)
	}
	return exitOK
}

// loadtest runs the scenarios, keeping track of the processes it starts.
type loadtest struct {
	cfg *loadtestConfig
	log io.Writer
	dir string // temporary: logs and the Redis directory

	lua     string // how ratelimitd said it calls Redis: "functions (FCALL)", ...
	redises int    // redis-servers started, to name their directories

	rlqsRows []rlqsRow // the rlqs group's, printed in a table of their own

	mu       sync.Mutex
	children []*child
}

// run starts the servers and runs the scenarios of every group asked
// for, in turn.
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
		if err := writeRules(c.Config, c.Key); err != nil {
			return nil, err
		}
		if err := writeSlotsRules(c.Config, c.Key); err != nil {
			return nil, err
		}
		if err := writeRLQSRules(c.Config, c.Key); err != nil {
			return nil, err
		}
		if err := writeSideRules(c.Config, c.Key); err != nil {
			return nil, err
		}
		lt.logf("rules: %s", c.Config)
	}
	abs, err := filepath.Abs(c.Config)
	if err != nil {
		return nil, err
	}
	c.Config = abs
	if c.Groups[groupLeased] {
		if err := checkLeasedRules(c.Config, c.Key); err != nil {
			return nil, err
		}
	}
	if c.Groups[groupSlots] {
		if err := checkSlotsRules(c.Config, c.Key, c.Workers); err != nil {
			return nil, err
		}
	}
	if c.Groups[groupRLQS] {
		if err := checkRLQSRules(c.Config, c.Key); err != nil {
			return nil, err
		}
	}
	if c.Out != "" {
		if err := os.MkdirAll(c.Out, 0o755); err != nil {
			return nil, err
		}
	}
	// Every group needs Redis: ratelimitd's backend, redis-benchmark's
	// server, the round-trip floor.
	redis, redisAddr, err := lt.startRedis(ctx, here)
	if err != nil {
		return nil, err
	}
	rdb := goredis.NewClient(&goredis.Options{Addr: redisAddr, Protocol: 2, DisableIdentity: true})
	defer rdb.Close()

	var standardOnRedis, ceiling, standardOnMemory, leasedOnRedis, leasedOnMemory, slotsOnRedis []scenario
	if c.Groups[groupStandard] || c.Groups[groupLeased] || c.Groups[groupSlots] {
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
		var runs []generatorRun
		if c.Groups[groupStandard] {
			runs = lt.standardRuns("ratelimitd, "+onRedis, "redis")
			if c.AlsoDomain != "" {
				runs = append(runs, generatorRun{
					name:   fmt.Sprintf("ratelimitd, %s: %d callers, closed loop, domain %s", onRedis, c.Workers, c.AlsoDomain),
					domain: c.AlsoDomain, workers: c.Workers, conns: c.Conns, file: "redis-closed-%d-" + c.AlsoDomain,
				})
			}
		}
		if standardOnRedis, err = lt.generateAll(ctx, runs, grpcAddr, procs, rdb); err != nil {
			return nil, err
		}
		if c.Groups[groupLeased] {
			leased := lt.leasedRuns("ratelimitd, "+onRedis, "redis", zipfExact, zipfLeased)
			if leasedOnRedis, err = lt.generateAll(ctx, leased, grpcAddr, procs, rdb); err != nil {
				return nil, err
			}
		}
		if c.Groups[groupSlots] {
			var decision *scenario
			if len(standardOnRedis) > 0 {
				decision = &standardOnRedis[0] // Workers callers, closed loop
			}
			if slotsOnRedis, err = lt.slotsGroup(ctx, "ratelimitd, "+onRedis, grpcAddr, procs, rdb, decision); err != nil {
				return nil, err
			}
		}
		// Stopped before redis-benchmark runs: a server holding leases
		// gives them back to Redis in the background, which would count
		// in the ceiling's CPU.
		lt.stop(rl)
	}
	if c.Groups[groupRedisBenchmark] {
		if ceiling, err = lt.ceiling(ctx, rdb, redisAddr, redis.pid()); err != nil {
			return nil, err
		}
	}
	if c.Groups[groupStandard] || c.Groups[groupLeased] {
		mem, memAddr, err := lt.startRatelimitd(ctx, "ratelimitd-memory", "-backend", "memory")
		if err != nil {
			return nil, err
		}
		procs := []proc{{"ratelimitd", mem.pid()}}
		if c.Groups[groupStandard] {
			row, err := lt.generate(ctx, generatorRun{
				name:   fmt.Sprintf("ratelimitd, memory: %d callers, closed loop", c.Workers),
				domain: c.Domain, workers: c.Workers, conns: c.Conns, file: "memory-closed-%d",
			}, memAddr, procs, nil)
			if err != nil {
				return nil, err
			}
			if redisRow := standardOnRedis[0]; redisRow.DecisionsPerS > 0 { // Workers callers
				row.Notes = append(row.Notes, fmt.Sprintf("%.2f× the decisions/s of Redis at %d callers", row.DecisionsPerS/redisRow.DecisionsPerS, c.Workers))
			}
			standardOnMemory = append(standardOnMemory, row)
		}
		if c.Groups[groupLeased] {
			leased := lt.leasedRuns("ratelimitd, memory", "memory", zipfLeased)
			if leasedOnMemory, err = lt.generateAll(ctx, leased, memAddr, procs, nil); err != nil {
				return nil, err
			}
		}
		lt.stop(mem)
	}
	if c.Groups[groupRLQS] {
		if lt.rlqsRows, err = lt.rlqsGroup(ctx, redis, redisAddr); err != nil {
			return nil, err
		}
	}
	var side []scenario
	if c.Groups[groupSideBySide] {
		if side, err = lt.sideBySide(ctx, redis, redisAddr, rdb); err != nil {
			return nil, err
		}
	}
	var floors []scenario
	if c.Groups[groupFloors] {
		if floors, err = lt.floors(ctx, redisAddr, redis.pid()); err != nil {
			return nil, err
		}
	}
	// The table keeps the order it had before the leased group: the
	// standard rows on Redis, the ceiling, the memory backend's row.
	rows := slices.Concat(standardOnRedis, ceiling, standardOnMemory)
	if c.Groups[groupLeased] {
		rows = append(rows, compareLeased(leasedOnRedis, leasedOnMemory, c.Workers)...)
	}
	var regions []scenario
	if c.Groups[groupRegions] {
		if regions, err = lt.regionsGroup(ctx, redis, redisAddr, rdb); err != nil {
			return nil, err
		}
	}
	return slices.Concat(rows, side, floors, slotsOnRedis, regions), nil
}

// ceiling measures Redis running the decision code alone, called as the
// script and, where Redis has them, as a function, without and with a
// pipeline: how far ratelimitd on Redis could go; then, as a function,
// the floor of such a call, which reads and writes the same keys and
// decides nothing (bareLibrary).
func (lt *loadtest) ceiling(ctx context.Context, rdb *goredis.Client, redisAddr string, redisPID int) ([]scenario, error) {
	var rows []scenario
	for _, via := range []string{viaScript, viaFunction, viaBare} {
		for _, pipeline := range []int{1, 16} {
			if err := rdb.FlushAll(ctx).Err(); err != nil {
				return nil, err
			}
			row, err := lt.redisBenchmark(ctx, rdb, redisAddr, redisPID, via, pipeline)
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
	return rows, nil
}

// floors measures what this machine costs before ratelimitd decides
// anything: a grpc-go server answering at once, loaded as ratelimitd is,
// and a round trip to Redis. ratelimitd's rows read against them: deciding
// only adds to the first, and deciding with Redis to the second as well.
func (lt *loadtest) floors(ctx context.Context, redisAddr string, redisPID int) ([]scenario, error) {
	fl, addr, err := lt.startFloor(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := lt.generateAll(ctx, lt.standardRuns("floor: grpc-go answering at once", "floor"), addr, []proc{{"floor-server", fl.pid()}}, nil)
	if err != nil {
		return nil, err
	}
	lt.stop(fl)
	row, err := lt.redisRoundTrip(ctx, redisAddr, redisPID)
	if err != nil {
		return nil, err
	}
	return append(rows, row), nil
}

// generatorRun is one scenario of the generator: its row's name, what it
// asks and how its keys are picked, its callers, and the base name of its
// JSON report ("%d" for the callers).
type generatorRun struct {
	name           string
	domain         string
	workers, conns int
	rate           float64 // open loop; 0 for a closed loop
	zipf           bool    // keys by Zipf(ZipfS), not uniformly
	file           string
	// duration and warmup, when set, replace the configured ones.
	duration, warmup time.Duration
}

// standardRuns returns the scenarios every server of the load test is
// measured with, named after label, their reports after file: Workers
// callers, 1 caller, and the open loop at Rate.
func (lt *loadtest) standardRuns(label, file string) []generatorRun {
	c := lt.cfg
	return []generatorRun{
		{name: fmt.Sprintf("%s: %d callers, closed loop", label, c.Workers), domain: c.Domain, workers: c.Workers, conns: c.Conns, file: file + "-closed-%d"},
		{name: label + ": 1 caller, closed loop", domain: c.Domain, workers: 1, conns: 1, file: file + "-closed-1"},
		{name: fmt.Sprintf("%s: open loop at %s/s (%d workers)", label, num(c.Rate), c.Workers), domain: c.Domain, workers: c.Workers, conns: c.Conns, rate: c.Rate, file: file + "-open"},
	}
}

// generateAll runs each of runs against addr in turn and returns their
// rows. With rdb, the server decides with that Redis: it is emptied
// (FLUSHALL) before each run, so that no run starts on another's
// counters, and its decision calls are counted.
func (lt *loadtest) generateAll(ctx context.Context, runs []generatorRun, addr string, procs []proc, rdb *goredis.Client) ([]scenario, error) {
	var rows []scenario
	for _, g := range runs {
		if rdb != nil {
			if err := rdb.FlushAll(ctx).Err(); err != nil {
				return nil, fmt.Errorf("FLUSHALL before %q: %w", g.name, err)
			}
		}
		row, err := lt.generate(ctx, g, addr, procs, rdb)
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// generate runs the generator against addr and makes a row of its report.
// With rdb, the Redis the server decides with, the row counts the
// decision calls Redis ran.
func (lt *loadtest) generate(ctx context.Context, g generatorRun, addr string, procs []proc, rdb *goredis.Client) (scenario, error) {
	c := lt.cfg
	duration, warmup := c.Duration, c.Warmup
	if g.duration > 0 {
		duration = g.duration
	}
	if g.warmup > 0 {
		warmup = g.warmup
	}
	bc := &benchConfig{
		Addr: addr, Workers: g.workers, Conns: g.conns, Duration: duration,
		Keys: c.Keys, Dist: "uniform", Descriptors: 1,
		Domain: g.domain, Key: c.Key, ValuePrefix: "user-",
		Rate: g.rate, Warmup: warmup, Timeout: 5 * time.Second, Seed: 1, Procs: procs,
	}
	dist := ""
	if g.zipf {
		bc.Dist, bc.ZipfS = "zipf", c.ZipfS
		dist = fmt.Sprintf(" -dist zipf -zipf-s %g", c.ZipfS)
	}
	if rdb != nil {
		bc.BackendCalls = func(ctx context.Context) (uint64, error) { return decisionCalls(ctx, rdb) }
	}
	var pids []string
	for _, p := range procs {
		pids = append(pids, fmt.Sprintf("%s=%d", p.Name, p.PID))
	}
	lt.logf("running %s for %v (+%v warm-up): ratelimit-bench -addr %s -workers %d -conns %d -keys %d%s -domain %s -key %s -rate %g -duration %v -warmup %v -pids %s",
		g.name, duration, warmup, addr, g.workers, g.conns, c.Keys, dist, g.domain, c.Key, g.rate, duration, warmup, strings.Join(pids, ","))
	r, err := runBench(ctx, bc)
	if err != nil {
		return scenario{}, fmt.Errorf("%s: %w", g.name, err)
	}
	if r.Interrupted {
		return scenario{}, fmt.Errorf("%s: interrupted", g.name)
	}
	if c.Out != "" {
		file := g.file
		if strings.Contains(file, "%d") {
			file = fmt.Sprintf(file, g.workers)
		}
		if err := writeJSONFile(filepath.Join(c.Out, file+".json"), r); err != nil {
			return scenario{}, err
		}
	}
	row := scenario{
		Name: g.name, DecisionsPerS: r.RequestsPerSecond,
		P50: r.Latency.P50, P99: r.Latency.P99, P999: r.Latency.P999,
		ServerCPU: -1, RedisCPU: -1, BenchCPU: -1, DecisionsPerCall: -1,
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
	if bc := r.BackendCalls; bc != nil {
		row.DecisionsPerCall = math.Inf(1)
		if bc.Calls > 0 {
			row.DecisionsPerCall = bc.DecisionsPerCall
		}
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

func (lt *loadtest) logf(format string, args ...any) {
	fmt.Fprintf(lt.log, "loadtest: "+format+"\n", args...)
}
