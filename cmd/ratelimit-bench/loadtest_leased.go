package main

import (
	"fmt"
	"time"
)

// The leased group measures what consistency: leased is for: with Redis
// behind ratelimitd, most decisions of a leased limit are made in process
// from budget leased out of Redis in batches, so Redis should spend a
// fraction of what the same limit decided exactly costs it, and
// ratelimitd should come close to the memory backend, which decides a
// leased limit exactly in process with no Redis at all. The keys follow a
// Zipf law, as real traffic does: a few hot keys, whose leases cover many
// decisions, and a long tail of cold ones.

// leasedRuns returns the leased group's scenarios on one server, named
// after label, their reports after file: for each of domains in turn,
// Workers callers then 1 caller, closed loop, keys by Zipf(ZipfS) over
// Keys values. Exact domains are best given first: a leased run leaves
// leases behind, given back to Redis in the background during the next
// run.
func (lt *loadtest) leasedRuns(label, file string, domains ...string) []generatorRun {
	c := lt.cfg
	keys := fmt.Sprintf("Zipf(%g) over %s keys", c.ZipfS, num(float64(c.Keys)))
	var runs []generatorRun
	// The rows on Redis at Workers callers are measured over a whole
	// window of the limit: once a minute every key's leases end with their
	// window, and a 10 s slice would count that either not at all or six
	// times over.
	window := time.Duration(0)
	if file == "redis" {
		window = c.LeasedWindow
	}
	for _, d := range domains {
		runs = append(runs,
			generatorRun{
				name:   fmt.Sprintf("%s: %d callers, closed loop, %s, domain %s", label, c.Workers, keys, d),
				domain: d, workers: c.Workers, conns: c.Conns, zipf: true, file: file + "-zipf-closed-%d-" + d,
				duration: window, warmup: c.LeasedWarmup,
			},
			generatorRun{
				name:   fmt.Sprintf("%s: 1 caller, closed loop, %s, domain %s", label, keys, d),
				domain: d, workers: 1, conns: 1, zipf: true, file: file + "-zipf-closed-1-" + d,
				warmup: c.LeasedWarmup,
			})
	}
	return runs
}

// leasedRows are the leased group's rows at one number of callers: the
// exact and the leased domain on Redis, and the leased domain on the
// memory backend.
type leasedRows struct {
	exact, leased, memory scenario
}

// compareLeased returns the leased group's rows in table order, Workers
// callers first, with notes on the leased rows comparing them to the
// others measured in the same run. onRedis holds the rows of
// leasedRuns(…, zipfExact, zipfLeased), onMemory those of
// leasedRuns(…, zipfLeased).
func compareLeased(onRedis, onMemory []scenario, workers int) []scenario {
	if len(onRedis) != 4 || len(onMemory) != 2 {
		// Not the runs of the leased group: nothing to compare.
		return append(onRedis, onMemory...)
	}
	many := leasedRows{exact: onRedis[0], leased: onRedis[2], memory: onMemory[0]}
	one := leasedRows{exact: onRedis[1], leased: onRedis[3], memory: onMemory[1]}
	if e, l := many.exact.RedisCPU, many.leased.RedisCPU; e > 0 && l >= 0 {
		many.leased.Notes = append(many.leased.Notes, fmt.Sprintf("Redis CPU-µs per decision %.2f× the exact domain's (%.2f against %.2f at %d callers)", l/e, l, e, workers))
	}
	if m, l := many.memory.DecisionsPerS, many.leased.DecisionsPerS; m > 0 {
		many.leased.Notes = append(many.leased.Notes, fmt.Sprintf("decisions/s %.2f× the memory backend's on the leased domain (%s against %s at %d callers)", l/m, num(l), num(m), workers))
	}
	if m, l := one.memory.P50, one.leased.P50; m > 0 {
		one.leased.Notes = append(one.leased.Notes, fmt.Sprintf("p50 %.2f× the memory backend's on the leased domain (%s against %s at 1 caller)", l/m, us(l), us(m)))
	}
	return []scenario{many.exact, many.leased, many.memory, one.exact, one.leased, one.memory}
}
