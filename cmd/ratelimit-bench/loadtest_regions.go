package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratelimitd/ratelimitd/internal/pki"
)

// The regions group measures what other regions cost a region: ratelimitd
// on Redis deciding a limit of scope: global (domain globalLimit) alone,
// without -region, then as region eu with two peer regions, us and ap,
// each a ratelimitd on a Redis of its own, over links of -region-latency
// each way (toxiproxy, in a wan-links process). The rows differ only in eu's
// region engine and its sync: its peers serve no load, and run in both
// rows. They and the links stand for servers in other datacenters and the
// network between, so they run at the lowest CPU priority (nice 19): on
// this one machine, what they spend receiving and carrying eu's pushes
// would otherwise be taken from the region measured. Their CPU is
// reported beside eu's sync bandwidth per active key, read from eu's
// metrics.

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
// in regionRounds rounds.
func (lt *loadtest) regionsGroup(ctx context.Context, redis *child, redisAddr string, rdb *goredis.Client) ([]scenario, error) {
	c := lt.cfg
	runs := func(label string) []generatorRun {
		return []generatorRun{
			{name: fmt.Sprintf("%s: %d callers, closed loop", label, c.Workers), domain: globalLimit, workers: c.Workers, conns: c.Conns, file: "regions-closed-%d"},
			{name: label + ": 1 caller, closed loop", domain: globalLimit, workers: 1, conns: 1, file: "regions-closed-1"},
			{name: fmt.Sprintf("%s: open loop at %s/s (%d workers)", label, num(c.Rate), c.Workers), domain: globalLimit, workers: c.Workers, conns: c.Conns, rate: c.Rate, file: "regions-open"},
		}
	}
	nruns := len(runs(""))
	// The peers, and the links, first: they run for both rows.
	wan, err := lt.startWANLinks(elsewhere)
	if err != nil {
		return nil, err
	}
	defer wan.stop()
	regions := []string{"eu", "us", "ap"}
	links := map[[2]string]string{} // from, to: the address of the link
	for _, from := range regions {
		for _, to := range regions {
			if from == to {
				continue
			}
			addr, err := wan.link(from+"-"+to, c.Regions.Latency.Milliseconds())
			if err != nil {
				return nil, err
			}
			links[[2]string{from, to}] = addr
		}
	}
	peersOf := func(r string) string {
		var peers []string
		for _, to := range regions {
			if to != r {
				peers = append(peers, to+"="+links[[2]string{r, to}])
			}
		}
		return strings.Join(peers, ",")
	}
	// The regions push to each other over mutual TLS, on listeners of
	// their own (-region-addr), each with a certificate naming its region,
	// as ratelimitd requires of peers; Envoy's port stays plaintext.
	ca, err := pki.New(lt.dir, "ratelimit-bench regions")
	if err != nil {
		return nil, fmt.Errorf("regions' CA: %w", err)
	}
	addrs := map[string]string{} // by region: where its pushes go
	regionArgs := func(r, url string) ([]string, error) {
		cert, err := ca.Sign(pki.RegionLeaf(r))
		if err != nil {
			return nil, fmt.Errorf("region %s's certificate: %w", r, err)
		}
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		addrs[r] = fmt.Sprintf("127.0.0.1:%d", port)
		return []string{"-backend", "redis", "-redis-url", url, "-region", r, "-region-peers", peersOf(r), "-region-sync-interval", c.Regions.Sync.String(),
			"-region-addr", addrs[r], "-region-tls-cert", cert.File, "-region-tls-key", cert.KeyFile, "-region-tls-ca", ca.File}, nil
	}
	var peers []proc // the peer regions' processes, whose CPU is reported
	for _, r := range regions[1:] {
		rch, raddr, err := lt.startRedis(ctx, elsewhere)
		if err != nil {
			return nil, err
		}
		args, err := regionArgs(r, "redis://"+raddr)
		if err != nil {
			return nil, err
		}
		ch, _, err := lt.startRatelimitdAt(ctx, elsewhere, "ratelimitd-"+r, args...)
		if err != nil {
			return nil, err
		}
		peers = append(peers, proc{"ratelimitd-" + r, ch.pid()}, proc{"redis-" + r, rch.pid()})
	}
	// eu's links lead to it once it listens; until then they lead nowhere.
	route := func() error {
		for k := range links {
			if err := wan.route(k[0]+"-"+k[1], addrs[k[1]]); err != nil {
				return err
			}
		}
		return nil
	}

	// The server without a region runs throughout; eu is started for its
	// rows and stopped after them, so that its sync (the full pushes of
	// the keys it decided) does not run during the other rows. The rows
	// are measured in turn, A, B, A, B..., so that neither is always the
	// one measured on a machine warmer or busier; both decide on the same
	// Redis, where the limit never binds.
	alone, aloneAddr, err := lt.startRatelimitd(ctx, "ratelimitd-alone", "-backend", "redis", "-redis-url", "redis://"+redisAddr)
	if err != nil {
		return nil, err
	}
	defer lt.stop(alone)
	aloneLabel := "ratelimitd, Redis, scope: global, no region"
	regionLabel := fmt.Sprintf("ratelimitd, Redis, scope: global, region eu with 2 peers at %v each way", c.Regions.Latency)
	hz, _ := clockTicks()
	var rows []scenario
	ratios := make([][2][]float64, nruns) // by run: decisions/s and p99
	for round := 1; round <= regionRounds; round++ {
		got, err := lt.generateAll(ctx, runs(fmt.Sprintf("%s (round %d)", aloneLabel, round)), aloneAddr, []proc{{"ratelimitd", alone.pid()}, {"redis", redis.pid()}}, rdb)
		if err != nil {
			return nil, err
		}
		rows = append(rows, got...)

		args, err := regionArgs("eu", "redis://"+redisAddr)
		if err != nil {
			return nil, err
		}
		eu, euAddr, err := lt.startRatelimitd(ctx, fmt.Sprintf("ratelimitd-eu-%d", round), args...)
		if err != nil {
			return nil, err
		}
		if err := route(); err != nil {
			lt.stop(eu)
			return nil, err
		}
		httpAddr := httpAddrOf(eu)
		before, at := regionMetrics(ctx, httpAddr), time.Now()
		watched := append(slices.Clone(peers), proc{"links", wan.pid})
		peersBefore, perr := sampleCPU(watched)
		got, err = lt.generateAll(ctx, runs(fmt.Sprintf("%s (round %d)", regionLabel, round)), euAddr, []proc{{"ratelimitd", eu.pid()}, {"redis", redis.pid()}}, rdb)
		after, elapsed := regionMetrics(ctx, httpAddr), time.Since(at)
		peersAfter, perr2 := sampleCPU(watched)
		lt.stop(eu)
		if err != nil {
			return nil, err
		}
		for i := range got {
			a := rows[len(rows)-len(got)+i]
			if a.DecisionsPerS > 0 && a.P99 > 0 {
				dps, p99 := got[i].DecisionsPerS/a.DecisionsPerS, got[i].P99/a.P99
				got[i].Notes = append(got[i].Notes, fmt.Sprintf("%.2f× the decisions/s and %.2f× the p99 of the same load without a region, this round", dps, p99))
				ratios[i][0], ratios[i][1] = append(ratios[i][0], dps), append(ratios[i][1], p99)
			}
		}
		note := syncNote(before, after, elapsed)
		if perr == nil && perr2 == nil {
			var ticks uint64
			for i := range peers {
				ticks += peersAfter[i] - peersBefore[i]
			}
			links := peersAfter[len(peers)] - peersBefore[len(peers)]
			perS := func(t uint64) float64 { return float64(ticksToDuration(t, hz).Milliseconds()) / elapsed.Seconds() }
			note += fmt.Sprintf("; the peers (their ratelimitd and Redis, at nice 19) used %.0f CPU-ms/s receiving it, the links (toxiproxy, at nice 19) %.0f", perS(ticks), perS(links))
		}
		got[0].Notes = append(got[0].Notes, note)
		rows = append(rows, got...)
	}
	// The medians over the rounds: one round may meet a busier machine.
	last := rows[len(rows)-nruns:]
	for i := range last {
		if len(ratios[i][0]) == regionRounds {
			last[i].Notes = append(last[i].Notes, fmt.Sprintf("median over the %d rounds: %.2f× the decisions/s and %.2f× the p99 without a region", regionRounds, median(ratios[i][0]), median(ratios[i][1])))
		}
	}
	return rows, nil
}

// regionRounds is how many times the regions group measures both rows.
const regionRounds = 3

// median returns the median of xs (not empty); xs is sorted.
func median(xs []float64) float64 {
	slices.Sort(xs)
	if n := len(xs); n%2 == 0 {
		return (xs[n/2-1] + xs[n/2]) / 2
	}
	return xs[len(xs)/2]
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
	return fmt.Sprintf("sync over both runs of this round: %s B/s to each peer (%s pushes/s, %s counts/s) for %s active keys: %.1f B/s per active key per peer",
		num(perPeer), num((after.pushes-before.pushes)/s/2), num((after.counts-before.counts)/s/2), num(after.keys), perPeer/after.keys)
}
