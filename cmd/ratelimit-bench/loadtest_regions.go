package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// The regions group measures what other regions cost a region: ratelimitd
// on Redis deciding a limit of scope: global (domain globalLimit) alone,
// without -region, then as region eu with two peer regions, us and ap,
// each a ratelimitd on a Redis of its own, over links of -region-latency
// each way (toxiproxy, in this process). The rows differ only in eu's
// region engine and its sync: its peers serve no load, and run in both
// rows. eu's metrics give the sync's bandwidth per active key.

// globalLimit is the regions group's domain: the leased group's limit
// (1,000,000 a minute, so that the load rarely meets it), with scope:
// global.
const globalLimit = "global_limit"

// globalRule is globalLimit's rule file, limiting key.
func globalRule(key string) string {
	return `# written by ratelimit-bench loadtest
domain: ` + globalLimit + `
descriptors:
  - key: ` + key + `
    rate_limit:
      requests_per_unit: 1000000
      unit: minute
      scope: global
`
}

// regionsConfig is the regions group's flags.
type regionsConfig struct {
	Latency time.Duration // each way, on each link between two regions
	Sync    time.Duration // -region-sync-interval
}

func addRegionsFlags(fs interface {
	DurationVar(*time.Duration, string, time.Duration, string)
}, c *regionsConfig) {
	fs.DurationVar(&c.Latency, "region-latency", 100*time.Millisecond, "regions group: latency of the links between regions, each way")
	fs.DurationVar(&c.Sync, "region-sync", 100*time.Millisecond, "regions group: the regions' -region-sync-interval")
}

// regionsGroup returns the regions group's rows: eu alone, then with its
// peers, each at Workers callers then 1 caller, on the Redis at redisAddr,
// in two rounds.
func (lt *loadtest) regionsGroup(ctx context.Context, redis *child, redisAddr string, rdb *goredis.Client) ([]scenario, error) {
	c := lt.cfg
	runs := func(label string) []generatorRun {
		return []generatorRun{
			{name: fmt.Sprintf("%s: %d callers, closed loop", label, c.Workers), domain: globalLimit, workers: c.Workers, conns: c.Conns, file: "regions-closed-%d"},
			{name: label + ": 1 caller, closed loop", domain: globalLimit, workers: 1, conns: 1, file: "regions-closed-1"},
		}
	}
	// The peers, and the links, first: they run for both rows.
	tp := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	regions := []string{"eu", "us", "ap"}
	links := map[[2]string]*toxiproxy.Proxy{}
	defer func() {
		for _, p := range links {
			p.Stop()
		}
	}()
	lat := c.Regions.Latency.Milliseconds()
	for _, from := range regions {
		for _, to := range regions {
			if from == to {
				continue
			}
			p := toxiproxy.NewProxy(tp, from+"-"+to, "127.0.0.1:0", "127.0.0.1:1")
			if err := p.Start(); err != nil {
				return nil, err
			}
			for _, dir := range []string{"upstream", "downstream"} {
				toxic := fmt.Sprintf(`{"name": "wan-%s", "type": "latency", "stream": %q, "attributes": {"latency": %d}}`, dir, dir, lat)
				if _, err := p.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
					return nil, err
				}
			}
			links[[2]string{from, to}] = p
		}
	}
	peersOf := func(r string) string {
		var peers []string
		for _, to := range regions {
			if to != r {
				peers = append(peers, to+"="+links[[2]string{r, to}].Listen)
			}
		}
		return strings.Join(peers, ",")
	}
	regionArgs := func(r, url string) []string {
		return []string{"-backend", "redis", "-redis-url", url, "-region", r, "-region-peers", peersOf(r), "-region-sync-interval", c.Regions.Sync.String()}
	}
	addrs := map[string]string{}
	for _, r := range regions[1:] {
		_, raddr, err := lt.startRedis(ctx)
		if err != nil {
			return nil, err
		}
		_, addr, err := lt.startRatelimitd(ctx, "ratelimitd-"+r, regionArgs(r, "redis://"+raddr)...)
		if err != nil {
			return nil, err
		}
		addrs[r] = addr
	}

	// Both servers run throughout, on the same Redis (the limit never
	// binds), and are loaded in turn, twice: A, B, A, B, so that neither
	// row is always the one measured on a machine warmer or busier.
	alone, aloneAddr, err := lt.startRatelimitd(ctx, "ratelimitd-alone", "-backend", "redis", "-redis-url", "redis://"+redisAddr)
	if err != nil {
		return nil, err
	}
	defer lt.stop(alone)
	eu, euAddr, err := lt.startRatelimitd(ctx, "ratelimitd-eu", regionArgs("eu", "redis://"+redisAddr)...)
	if err != nil {
		return nil, err
	}
	defer lt.stop(eu)
	addrs["eu"] = euAddr
	for k, p := range links {
		if err := p.Update(&toxiproxy.Proxy{Listen: p.Listen, Upstream: addrs[k[1]], Enabled: true}); err != nil {
			return nil, err
		}
	}
	httpAddr := httpAddrOf(eu)
	before, at := regionMetrics(ctx, httpAddr), time.Now()
	aloneLabel := "ratelimitd, Redis, scope: global, no region"
	regionLabel := fmt.Sprintf("ratelimitd, Redis, scope: global, region eu with 2 peers at %v each way", c.Regions.Latency)
	var rows []scenario
	for round := 1; round <= 2; round++ {
		for _, r := range []struct {
			label, addr string
			pid         int
		}{{aloneLabel, aloneAddr, alone.pid()}, {regionLabel, euAddr, eu.pid()}} {
			got, err := lt.generateAll(ctx, runs(fmt.Sprintf("%s (round %d)", r.label, round)), r.addr, []proc{{"ratelimitd", r.pid}, {"redis", redis.pid()}}, rdb)
			if err != nil {
				return nil, err
			}
			rows = append(rows, got...)
		}
	}
	after, elapsed := regionMetrics(ctx, httpAddr), time.Since(at)
	// rows: per round, alone (many, one caller) then eu (many, one).
	for round := range 2 {
		a, b := rows[4*round:4*round+2], rows[4*round+2:4*round+4]
		for i := range b {
			if a[i].DecisionsPerS > 0 && a[i].P99 > 0 {
				b[i].Notes = append(b[i].Notes, fmt.Sprintf("%.2f× the decisions/s and %.2f× the p99 of the same load without a region, this round", b[i].DecisionsPerS/a[i].DecisionsPerS, b[i].P99/a[i].P99))
			}
		}
	}
	if note := syncNote(before, after, elapsed); note != "" {
		rows[len(rows)-2].Notes = append(rows[len(rows)-2].Notes, note)
	}
	return rows, nil
}

// regionFigures are eu's sync counters, from its /metrics.
type regionFigures struct{ bytes, counts, pushes, keys float64 }

// regionMetrics scrapes a ratelimitd's region counters; all -1 when it
// cannot.
func regionMetrics(ctx context.Context, httpAddr string) regionFigures {
	b, err := fetchMetrics(ctx, httpAddr)
	if err != nil {
		return regionFigures{-1, -1, -1, -1}
	}
	read := func(name string) float64 {
		v, err := parseMetric(b, name)
		if err != nil {
			return -1
		}
		return v
	}
	return regionFigures{
		bytes: read("ratelimitd_region_push_bytes_total"), counts: read("ratelimitd_region_push_counts_total"),
		pushes: read(`ratelimitd_region_pushes_total{result="ok"}`), keys: read("ratelimitd_region_keys"),
	}
}

// syncNote says what eu's sync sent over elapsed: bytes per second to
// each peer, per active key; "" when the figures are missing.
func syncNote(before, after regionFigures, elapsed time.Duration) string {
	if before.bytes < 0 || after.bytes < 0 || after.keys <= 0 || elapsed <= 0 {
		return ""
	}
	s := elapsed.Seconds()
	perPeer := (after.bytes - before.bytes) / s / 2
	return fmt.Sprintf("sync over both runs: %s B/s to each peer (%s pushes/s, %s counts/s) for %s active keys: %.1f B/s per active key per peer",
		num(perPeer), num((after.pushes-before.pushes)/s/2), num((after.counts-before.counts)/s/2), num(after.keys), perPeer/after.keys)
}
