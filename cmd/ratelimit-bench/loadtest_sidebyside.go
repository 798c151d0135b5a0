package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/refproc"
	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// groupSideBySide: ratelimitd beside envoyproxy/ratelimit (the
// reference) and, or, beside another build of ratelimitd (a baseline),
// on the same Redis, the same rules and the same load, in interleaved
// rounds, with the ratios of each round. It runs only with -reference-bin
// (or ANCHOR_BIN) or -baseline-ratelimitd; without either it is skipped.
const groupSideBySide = "side-by-side"

// hourLimit is a domain both servers load: (key, any value) at 1,000,000
// an hour, the per-hour rule beside one_limit's per-second one.
const hourLimit = "hour_limit"

// sideConfig is the side-by-side group's command line.
type sideConfig struct {
	Reference       string // the reference's binary; "" for none
	Baseline        string // another ratelimitd binary; "" for none
	BaselineFlags   string // more flags for the baseline
	RatelimitdFlags string // more flags for ratelimitd itself
	Compat          bool   // also each ratelimitd with -redis-key-format reference
	Rounds          int
	Domains         string // comma-separated
}

func addSideFlags(fs *flag.FlagSet, c *sideConfig) {
	fs.StringVar(&c.Reference, "reference-bin", os.Getenv("ANCHOR_BIN"), "side-by-side: an envoyproxy/ratelimit binary built from source, run beside ratelimitd on the same Redis (default $ANCHOR_BIN); the group is skipped without it and without -baseline-ratelimitd")
	fs.StringVar(&c.Baseline, "baseline-ratelimitd", "", "side-by-side: another ratelimitd binary (an earlier commit's) run beside -ratelimitd")
	fs.StringVar(&c.BaselineFlags, "baseline-flags", "", "side-by-side: more flags for the baseline ratelimitd, separated by spaces")
	fs.StringVar(&c.RatelimitdFlags, "side-flags", "", "side-by-side: more flags for -ratelimitd, separated by spaces")
	fs.BoolVar(&c.Compat, "side-compat", true, "side-by-side: also run each ratelimitd with -redis-key-format reference (the reference's keys, INCRBY and EXPIRE)")
	fs.IntVar(&c.Rounds, "side-rounds", 3, "side-by-side: rounds, each measuring every server once per domain, in an order rotated each round")
	fs.StringVar(&c.Domains, "side-domains", oneLimit+","+hourLimit, "side-by-side: the domains measured, separated by commas; each must limit (key, any value) with one fixed window a reference can load")
}

// validate checks the flags that need no file.
func (c *sideConfig) validate() error {
	if c.Rounds < 1 || c.Rounds > 50 {
		return fmt.Errorf("-side-rounds %d: want 1 to 50", c.Rounds)
	}
	if len(c.domains()) == 0 {
		return errors.New("-side-domains is empty")
	}
	return nil
}

func (c *sideConfig) domains() []string {
	var out []string
	for d := range strings.SplitSeq(c.Domains, ",") {
		if d = strings.TrimSpace(d); d != "" {
			out = append(out, d)
		}
	}
	return out
}

// contender is one server of the side-by-side group.
type contender struct {
	label string
	bin   string
	args  []string // ratelimitd's flags beyond the load test's own
	ref   bool     // the reference: started with refproc's environment
}

// contenders returns the servers to compare, ratelimitd first (the
// ratios are against it), or nil when there is nothing to compare it
// with.
func (c *sideConfig) contenders(ratelimitd, redisAddr string) []contender {
	if c.Reference == "" && c.Baseline == "" {
		return nil
	}
	native := []string{"-backend", "redis", "-redis-url", "redis://" + redisAddr}
	compat := []string{"-redis-key-format", "reference"}
	own := append(append([]string{}, native...), strings.Fields(c.RatelimitdFlags)...)
	out := []contender{{label: "ratelimitd", bin: ratelimitd, args: own}}
	if c.Compat {
		out = append(out, contender{label: "ratelimitd -redis-key-format reference", bin: ratelimitd, args: append(append([]string{}, own...), compat...)})
	}
	if c.Baseline != "" {
		base := append(append([]string{}, native...), strings.Fields(c.BaselineFlags)...)
		out = append(out, contender{label: "baseline ratelimitd", bin: c.Baseline, args: base})
		if c.Compat {
			out = append(out, contender{label: "baseline ratelimitd -redis-key-format reference", bin: c.Baseline, args: append(append([]string{}, base...), compat...)})
		}
	}
	if c.Reference != "" {
		out = append(out, contender{label: "envoyproxy/ratelimit", bin: c.Reference, ref: true})
	}
	return out
}

// sideRules returns the rule files the side-by-side group needs beside
// the load test's own, by name: hour_limit. They use nothing but the
// reference's format, so both servers load them.
func sideRules(key string) map[string]string {
	return map[string]string{hourLimit + ".yaml": `# written by ratelimit-bench loadtest
domain: ` + hourLimit + `
descriptors:
  - key: ` + key + `
    rate_limit:
      requests_per_unit: 1000000
      unit: hour
`}
}

// writeSideRules writes sideRules into dir.
func writeSideRules(dir, key string) error {
	for name, text := range sideRules(key) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// referenceRules writes the rule files of domains, read from the files
// of dir (ratelimitd's), into the reference's rule directory under root.
// A domain's file is found by its name (DOMAIN.yaml); it must decide
// (key, user-0) with one limit, as the reference can.
func referenceRules(dir, root, key string, domains []string) error {
	rules, err := config.Load(dir)
	if err != nil {
		return err
	}
	to := refproc.ConfigDir(root)
	if err := os.MkdirAll(to, 0o755); err != nil {
		return err
	}
	for _, d := range domains {
		dom := rules.Domain(d)
		if dom == nil {
			return fmt.Errorf("%s: no domain %s, which -side-domains names", dir, d)
		}
		if r := dom.Match(oneEntry{key, "user-0"}); r == nil || len(r.Limits) != 1 {
			return fmt.Errorf("%s: domain %s does not limit (%s, user-0) with one limit, as the reference must be able to", dir, d, key)
		}
		text, err := os.ReadFile(filepath.Join(dir, d+".yaml"))
		if err != nil {
			return fmt.Errorf("domain %s: the reference reads it from %s.yaml: %w", d, d, err)
		}
		if err := os.WriteFile(filepath.Join(to, d+".yaml"), text, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// startReference starts the reference on free ports of 127.0.0.1 with
// the rules under root, counting in the Redis at redisAddr, and returns
// its gRPC address once its health check answers.
func (lt *loadtest) startReference(ctx context.Context, bin, root, redisAddr string) (*child, string, error) {
	var ports [3]int
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, "", err
		}
		ports[i] = p
	}
	s := refproc.Settings{Root: root, Redis: redisAddr, HTTPPort: ports[0], GRPCPort: ports[1], Debug: ports[2]}
	lt.logf("starting the reference: %s %s", strings.Join(refproc.Env(s)[1:], " "), bin)
	ch, err := lt.startEnv("reference", bin, nil, refproc.Env(s), nil, here)
	if err != nil {
		return nil, "", err
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, refproc.HealthURL(s), nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				addr := fmt.Sprintf("127.0.0.1:%d", ports[1])
				lt.logf("reference (PID %d) serving gRPC on %s", ch.pid(), addr)
				return ch, addr, nil
			}
		}
		select {
		case <-ch.done:
			return nil, "", fmt.Errorf("the reference exited (%v) before serving%s", ch.err, ch.tail())
		case <-ctx.Done():
			return nil, "", ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, "", fmt.Errorf("the reference's %s did not answer 200 within 20s%s", refproc.HealthURL(s), ch.tail())
		}
	}
}

// sideBySide runs the group: every contender started on the Redis at
// redisAddr, then Rounds rounds of each domain on each contender, and
// returns a row per domain and contender with the medians of its rounds,
// the ratios of each round in the notes. It returns no row when there is
// nothing to compare.
func (lt *loadtest) sideBySide(ctx context.Context, redis *child, redisAddr string, rdb *goredis.Client) ([]scenario, error) {
	c := lt.cfg
	cs := c.Side.contenders(c.Ratelimitd, redisAddr)
	if cs == nil {
		lt.logf("side-by-side: skipped: no -reference-bin (or ANCHOR_BIN) and no -baseline-ratelimitd to compare ratelimitd with")
		return nil, nil
	}
	addrs := make([]string, len(cs))
	pids := make([]int, len(cs))
	for i, ct := range cs {
		var ch *child
		var err error
		if ct.ref {
			if ct.bin, err = absBin(ct.bin); err != nil {
				return nil, fmt.Errorf("-reference-bin: %w", err)
			}
			root := filepath.Join(lt.dir, "reference")
			if err = referenceRules(c.Config, root, c.Key, c.Side.domains()); err != nil {
				return nil, err
			}
			ch, addrs[i], err = lt.startReference(ctx, ct.bin, root, redisAddr)
		} else if ct.bin, err = absBin(ct.bin); err == nil {
			ch, addrs[i], err = lt.startServer(ctx, fmt.Sprintf("side-%d", i), ct.bin, lt.ratelimitdArgs(ct.args), here)
		}
		if err != nil {
			return nil, fmt.Errorf("side-by-side, %s: %w", ct.label, err)
		}
		defer lt.stop(ch)
		pids[i] = ch.pid()
	}
	return lt.sideRounds(ctx, cs, addrs, pids, redis.pid(), rdb)
}

// absBin finds bin and returns its absolute path: the servers run in a
// directory of their own.
func absBin(bin string) (string, error) {
	p, err := exec.LookPath(bin)
	if err != nil {
		return "", err
	}
	return filepath.Abs(p)
}

// sideRounds measures each domain on each contender (addrs, pids) once
// per round, the contenders' order rotated by one each round, and
// summarizes the rounds (sideRows).
func (lt *loadtest) sideRounds(ctx context.Context, cs []contender, addrs []string, pids []int, redisPID int, rdb *goredis.Client) ([]scenario, error) {
	c := lt.cfg
	domains := c.Side.domains()
	// runs[d][i]: domain d on contender i, one row per round.
	runs := make([][][]scenario, len(domains))
	for d := range domains {
		runs[d] = make([][]scenario, len(cs))
	}
	for round := range c.Side.Rounds {
		for d, domain := range domains {
			for k := range cs {
				i := (k + round) % len(cs)
				if err := rdb.FlushAll(ctx).Err(); err != nil {
					return nil, fmt.Errorf("FLUSHALL: %w", err)
				}
				name := "reference"
				counted := rdb
				if !cs[i].ref {
					name = "ratelimitd"
				} else {
					counted = nil // it makes no decision calls to count
				}
				row, err := lt.generate(ctx, generatorRun{
					name:   fmt.Sprintf("side by side, round %d, domain %s: %s, %d callers", round+1, domain, cs[i].label, c.Workers),
					domain: domain, workers: c.Workers, conns: c.Conns,
					file: fmt.Sprintf("side-%s-%d-round%d", domain, i, round+1),
				}, addrs[i], []proc{{name, pids[i]}, {"redis", redisPID}}, counted)
				if err != nil {
					return nil, err
				}
				runs[d][i] = append(runs[d][i], row)
			}
		}
	}
	var rows []scenario
	for d, domain := range domains {
		rows = append(rows, sideRows(domain, cs, runs[d], c.Workers)...)
	}
	return rows, nil
}

// sideRows summarizes one domain's rounds: a row per contender holding
// the median of each figure over its rounds, and for every contender but
// the first the ratios of each round against the first's run of the same
// round, with their medians: decisions/s as the first's over its, CPU per
// decision as its over the first's (above 1: the first is cheaper).
func sideRows(domain string, cs []contender, runs [][]scenario, workers int) []scenario {
	rows := make([]scenario, len(cs))
	for i, ct := range cs {
		rs := runs[i]
		med := func(f func(scenario) float64) float64 {
			xs := make([]float64, 0, len(rs))
			for _, r := range rs {
				if v := f(r); v >= 0 {
					xs = append(xs, v)
				}
			}
			if len(xs) == 0 {
				return -1
			}
			return median(xs)
		}
		rows[i] = scenario{
			Name:             fmt.Sprintf("side by side, domain %s: %s, %d callers (median of %d rounds)", domain, ct.label, workers, len(rs)),
			DecisionsPerS:    med(func(s scenario) float64 { return s.DecisionsPerS }),
			P50:              med(func(s scenario) float64 { return s.P50 }),
			P99:              med(func(s scenario) float64 { return s.P99 }),
			P999:             med(func(s scenario) float64 { return s.P999 }),
			ServerCPU:        med(func(s scenario) float64 { return s.ServerCPU }),
			RedisCPU:         med(func(s scenario) float64 { return s.RedisCPU }),
			BenchCPU:         med(func(s scenario) float64 { return s.BenchCPU }),
			DecisionsPerCall: med(func(s scenario) float64 { return s.DecisionsPerCall }),
		}
		for _, r := range rs {
			rows[i].Notes = append(rows[i].Notes, r.Notes...)
		}
		switch {
		case ct.ref:
			// Every ratelimitd against the reference.
			for j := range cs {
				if !cs[j].ref {
					rows[i].Notes = append(rows[i].Notes, sideRatioNote(cs[j].label, runs[j], rs))
				}
			}
		case i > 0:
			rows[i].Notes = append(rows[i].Notes, sideRatioNote(cs[0].label, runs[0], rs))
		}
	}
	return rows
}

// sideRatioNote says, round by round, how first compares with theirs.
func sideRatioNote(first string, ours, theirs []scenario) string {
	var rate, server, redis []float64
	for k := range min(len(ours), len(theirs)) {
		o, t := ours[k], theirs[k]
		if t.DecisionsPerS > 0 {
			rate = append(rate, o.DecisionsPerS/t.DecisionsPerS)
		}
		if o.ServerCPU > 0 && t.ServerCPU > 0 {
			server = append(server, t.ServerCPU/o.ServerCPU)
		}
		if o.RedisCPU > 0 && t.RedisCPU > 0 {
			redis = append(redis, t.RedisCPU/o.RedisCPU)
		}
	}
	return fmt.Sprintf("%s against it, median of the rounds' ratios (each round): decisions/s %s; server CPU-µs/decision %s cheaper; Redis CPU-µs/decision %s cheaper",
		first, ratioList(rate), ratioList(server), ratioList(redis))
}

// ratioList formats ratios as "×M (×a, ×b, …)", M their median, in the
// order given.
func ratioList(xs []float64) string {
	if len(xs) == 0 {
		return "not measured"
	}
	each := make([]string, len(xs))
	for i, x := range xs {
		each[i] = fmt.Sprintf("×%.2f", x)
	}
	return fmt.Sprintf("×%.2f (%s)", median(append([]float64(nil), xs...)), strings.Join(each, ", "))
}
