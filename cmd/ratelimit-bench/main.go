// Command ratelimit-bench loads a ratelimitd (or any Envoy
// RateLimitService v3 server) on loopback and reports what its decisions
// cost: decisions per second, latency percentiles, the answers' codes and,
// given the processes' PIDs, the CPU time each used per decision.
//
// Usage:
//
//	ratelimit-bench [flags]            load the server at -addr and report
//	ratelimit-bench loadtest [flags]   start Redis and ratelimitd, run the
//	                                   standard scenarios, print one table
//	ratelimit-bench floor-server       serve RLS with a constant answer: the
//	                                   least a grpc-go server costs
//	ratelimit-bench wan-links          slow links between regions, driven
//	                                   by the load test over stdin
//
// N workers (-workers) share C gRPC connections (-conns) and send
// ShouldRateLimit calls for -duration or -count, each for one of -keys
// pre-built requests (uniform or Zipf), with 1 to 3 descriptors. Without
// -rate the loop is closed: each worker sends its next call when the last
// one answered, and latency runs from the send. With -rate R the loop is
// open: the calls are due at fixed intervals of 1/R over every worker,
// and latency runs from the due time, so a stall shows up as latency
// rather than as calls not made (no coordinated omission).
//
// The generator only targets loopback addresses, and every run is
// bounded (at most 10 minutes or 100 million calls).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the run failed
	exitUsage = 2 // the command line is wrong
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	os.Exit(Main(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// Main runs the command line args and returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "loadtest" {
		return loadtestMain(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "floor-server" {
		return floorMain(ctx, args[1:], stderr)
	}
	if len(args) > 0 && args[0] == "wan-links" {
		return wanLinksMain(ctx, args[1:], os.Stdin, stdout, stderr)
	}
	c, asJSON, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "ratelimit-bench: %v\n", err)
		return exitUsage
	}
	r, err := runBench(ctx, c)
	if err != nil {
		fmt.Fprintf(stderr, "ratelimit-bench: %v\n", err)
		return exitError
	}
	if asJSON {
		err = r.writeJSON(stdout)
	} else {
		err = r.writeText(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ratelimit-bench: %v\n", err)
		return exitError
	}
	if r.Interrupted {
		return exitError
	}
	return exitOK
}

// parseFlags reads the generator's command line into a validated
// configuration.
func parseFlags(args []string, stderr io.Writer) (c *benchConfig, asJSON bool, err error) {
	c = &benchConfig{}
	fs := flag.NewFlagSet("ratelimit-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.Addr, "addr", "127.0.0.1:8081", "gRPC address of the server: host:port on loopback (127.0.0.0/8, ::1, localhost)")
	fs.IntVar(&c.Workers, "workers", 50, fmt.Sprintf("concurrent callers, 1 to %d", maxWorkers))
	fs.IntVar(&c.Conns, "conns", 0, "gRPC connections the workers share, round robin (0: min(workers, 4))")
	fs.DurationVar(&c.Duration, "duration", 0, fmt.Sprintf("measure for this long, at most %v (this or -count is required)", maxDuration))
	fs.Uint64Var(&c.Count, "count", 0, fmt.Sprintf("measure this many calls, at most %d (this or -duration is required)", maxCount))
	fs.IntVar(&c.Keys, "keys", 10_000, fmt.Sprintf("distinct descriptor values, 1 to %d; one pre-built request per value", maxKeys))
	fs.StringVar(&c.Dist, "dist", "uniform", "how calls pick a request: uniform or zipf")
	fs.Float64Var(&c.ZipfS, "zipf-s", 1.1, "Zipf exponent (> 0): request i is picked with probability proportional to 1/(i+1)^s")
	fs.IntVar(&c.Descriptors, "descriptors", 1, "descriptors per request, 1 to 3: request i's d-th has the value numbered (i+d) mod -keys")
	fs.StringVar(&c.Domain, "domain", "api", "the requests' domain")
	fs.StringVar(&c.Key, "key", "user_id", "the key of each descriptor's entry")
	fs.StringVar(&c.ValuePrefix, "value-prefix", "user-", "each entry's value is this and a number below -keys")
	fs.StringVar(&c.Nested, "nested", "", "a second entry of every descriptor, `key=value`, for rules that nest a key below -key (such as -key route -value-prefix r -nested user=u1); empty for none")
	fs.Float64Var(&c.Rate, "rate", 0, "open loop: send this many calls per second in total on a fixed schedule; 0: closed loop")
	fs.DurationVar(&c.Warmup, "warmup", time.Second, fmt.Sprintf("load the server this long before measuring, at most %v", maxWarmup))
	fs.DurationVar(&c.Timeout, "timeout", 5*time.Second, "calls still running this long after the planned end are cancelled and counted as errors")
	fs.Uint64Var(&c.Seed, "seed", 1, "seed of the workers' key choice")
	pids := fs.String("pids", "", "report the CPU time of these processes: name=PID,name=PID (such as ratelimitd=123,redis=456)")
	fs.BoolVar(&asJSON, "json", false, "print the report as JSON")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write the generator's own CPU profile of the measured interval to this file (go tool pprof)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage:\n  ratelimit-bench [flags]            load a RateLimitService on loopback and report\n  ratelimit-bench loadtest [flags]   start Redis and ratelimitd, run the standard scenarios (loadtest -h)\n  ratelimit-bench floor-server       serve RLS with a constant answer on loopback (floor-server -h)\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, false, err
	}
	if fs.NArg() > 0 {
		return nil, false, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if c.Procs, err = parsePIDs(*pids); err != nil {
		return nil, false, err
	}
	if err := c.validate(); err != nil {
		return nil, false, err
	}
	return c, asJSON, nil
}

// checkLoopback refuses an address that is not host:port on loopback:
// the generator must not be pointed at a shared service by mistake.
func checkLoopback(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-addr %q: want host:port on loopback, such as 127.0.0.1:8081 (%v)", addr, err)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return fmt.Errorf("-addr %q: the port %q is not a number from 1 to 65535", addr, port)
	}
	if host == "localhost" {
		ips, err := net.DefaultResolver.LookupIPAddr(context.Background(), host)
		if err != nil {
			return fmt.Errorf("-addr %q: resolving localhost: %v", addr, err)
		}
		for _, ip := range ips {
			if !ip.IP.IsLoopback() {
				return fmt.Errorf("-addr %q: localhost resolves to %s, which is not a loopback address", addr, ip.IP)
			}
		}
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("-addr %q: %q is not a loopback address: ratelimit-bench only loads servers on this machine (127.0.0.0/8, ::1 or localhost)", addr, host)
	}
	return nil
}
