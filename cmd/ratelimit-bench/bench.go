package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Hard bounds of a run: the generator refuses anything larger.
const (
	maxDuration    = 10 * time.Minute
	maxWarmup      = time.Minute
	maxCount       = 100_000_000
	maxKeys        = 10_000_000
	maxWorkers     = 10_000
	maxConns       = 1_000
	maxDescriptors = 3
	maxRate        = 10_000_000
)

// benchConfig is one run of the generator.
type benchConfig struct {
	Addr        string
	Workers     int
	Conns       int
	Duration    time.Duration // measured time; zero when Count bounds the run
	Count       uint64        // measured requests; zero when Duration bounds the run
	Keys        int
	Dist        string // "uniform" or "zipf"
	ZipfS       float64
	Descriptors int
	Domain      string
	Key         string
	ValuePrefix string
	// Nested, when set, is a second entry "key=value" of every
	// descriptor, after Key's: for rules that nest a key below Key, such
	// as route=rN with a nested user.
	Nested  string
	Rate    float64 // requests/s in total; zero for a closed loop
	Warmup  time.Duration
	Timeout time.Duration // how long calls may run past the end
	Seed    uint64
	Procs   []proc // whose CPU time to report; the generator is added
	// BackendCalls, when set, reads how many decision calls the backend
	// behind the server has run so far, such as Redis's FCALLs: the
	// report shows how many it ran in the measured interval, and so how
	// many decisions the server made per call.
	BackendCalls func(context.Context) (uint64, error)
	CPUProfile   string // where to write the generator's CPU profile; "" for none
}

// validate checks c against the bounds and fills in what follows from
// the rest (Conns).
func (c *benchConfig) validate() error {
	if err := checkLoopback(c.Addr); err != nil {
		return err
	}
	switch {
	case c.Workers < 1 || c.Workers > maxWorkers:
		return fmt.Errorf("-workers %d: want 1 to %d", c.Workers, maxWorkers)
	case c.Conns < 0 || c.Conns > maxConns:
		return fmt.Errorf("-conns %d: want 1 to %d (0: min(workers, 4))", c.Conns, maxConns)
	case c.Conns > c.Workers:
		return fmt.Errorf("-conns %d: more connections than the %d workers that would use them", c.Conns, c.Workers)
	case (c.Duration == 0) == (c.Count == 0):
		return errors.New("give exactly one of -duration and -count: the run must be bounded")
	case c.Duration < 0 || c.Duration > maxDuration:
		return fmt.Errorf("-duration %v: want at most %v", c.Duration, maxDuration)
	case c.Count > maxCount:
		return fmt.Errorf("-count %d: want at most %d", c.Count, maxCount)
	case c.Warmup < 0 || c.Warmup > maxWarmup:
		return fmt.Errorf("-warmup %v: want 0 to %v", c.Warmup, maxWarmup)
	case c.Keys < 1 || c.Keys > maxKeys:
		return fmt.Errorf("-keys %d: want 1 to %d", c.Keys, maxKeys)
	case c.Descriptors < 1 || c.Descriptors > maxDescriptors:
		return fmt.Errorf("-descriptors %d: want 1 to %d", c.Descriptors, maxDescriptors)
	case c.Descriptors > c.Keys:
		return fmt.Errorf("-descriptors %d: a request's descriptors take distinct values, and -keys is only %d", c.Descriptors, c.Keys)
	case c.Dist != "uniform" && c.Dist != "zipf":
		return fmt.Errorf("-dist %q: want uniform or zipf", c.Dist)
	case c.Dist == "zipf" && !(c.ZipfS > 0 && c.ZipfS < 100):
		return fmt.Errorf("-zipf-s %v: want a number above 0 (and below 100)", c.ZipfS)
	case c.Rate < 0 || c.Rate > maxRate:
		return fmt.Errorf("-rate %v: want 0 (closed loop) to %d requests/s", c.Rate, maxRate)
	case c.Domain == "":
		return errors.New("-domain: empty")
	case c.Key == "":
		return errors.New("-key: empty")
	case c.Nested != "" && !strings.Contains(c.Nested, "=") || strings.HasPrefix(c.Nested, "="):
		return fmt.Errorf("-nested %q: want key=value", c.Nested)
	case c.Timeout <= 0 || c.Timeout > time.Minute:
		return fmt.Errorf("-timeout %v: want more than 0, at most 1m", c.Timeout)
	}
	if c.Rate > 0 && c.Count > 0 {
		if d := time.Duration(float64(c.Count) / c.Rate * float64(time.Second)); d > maxDuration {
			return fmt.Errorf("-count %d at -rate %v takes %v: want at most %v", c.Count, c.Rate, d.Round(time.Second), maxDuration)
		}
	}
	if c.Rate > 0 && c.Duration > 0 && c.Rate*c.Duration.Seconds() < 1 {
		return fmt.Errorf("-rate %v for %v schedules no request", c.Rate, c.Duration)
	}
	if c.Conns == 0 {
		c.Conns = min(c.Workers, 4)
	}
	return nil
}

// buildRequests encodes the run's Keys requests, before it starts. Request
// i carries Descriptors descriptors, the d-th one the single entry (Key,
// value (i+d) mod Keys), values being ValuePrefix and a number: there are
// Keys distinct values, and a request's descriptors are distinct
// counters.
func buildRequests(c *benchConfig) ([]*rawRequest, error) {
	values := make([]string, c.Keys)
	for i := range values {
		values[i] = c.ValuePrefix + strconv.Itoa(i)
	}
	nestedKey, nestedValue, nested := strings.Cut(c.Nested, "=")
	reqs := make([]*rawRequest, c.Keys)
	for i := range reqs {
		req := &rlsv3.RateLimitRequest{Domain: c.Domain}
		for d := range c.Descriptors {
			entries := []*rlv3.RateLimitDescriptor_Entry{{Key: c.Key, Value: values[(i+d)%c.Keys]}}
			if nested {
				entries = append(entries, &rlv3.RateLimitDescriptor_Entry{Key: nestedKey, Value: nestedValue})
			}
			req.Descriptors = append(req.Descriptors, &rlv3.RateLimitDescriptor{Entries: entries})
		}
		r, err := newRawRequest(req)
		if err != nil {
			return nil, err
		}
		reqs[i] = r
	}
	return reqs, nil
}

// newChooser returns the key distribution of c.
func newChooser(c *benchConfig) (chooser, error) {
	if c.Dist == "zipf" {
		return newZipf(c.Keys, c.ZipfS)
	}
	return uniform{k: c.Keys}, nil
}

// dial opens c.Conns connections and waits until each is ready.
func dial(ctx context.Context, c *benchConfig) ([]*grpc.ClientConn, error) {
	conns := make([]*grpc.ClientConn, 0, c.Conns)
	fail := func(err error) ([]*grpc.ClientConn, error) {
		for _, cc := range conns {
			cc.Close()
		}
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// A plain TCP connection first, for a clear error when nothing
	// listens.
	var d net.Dialer
	probe, err := d.DialContext(ctx, "tcp", c.Addr)
	if err != nil {
		return nil, fmt.Errorf("no gRPC server at %s: %w", c.Addr, err)
	}
	probe.Close()
	for range c.Conns {
		cc, err := grpc.NewClient("passthrough:///"+c.Addr,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
		if err != nil {
			return fail(err)
		}
		conns = append(conns, cc)
		cc.Connect()
		for s := cc.GetState(); s != connectivity.Ready; s = cc.GetState() {
			if s == connectivity.TransientFailure || s == connectivity.Shutdown || !cc.WaitForStateChange(ctx, s) {
				return fail(fmt.Errorf("no gRPC server ready at %s (connection %s)", c.Addr, s))
			}
		}
	}
	return conns, nil
}

// workerStats is what one worker saw; the report merges them.
type workerStats struct {
	latency histogram // completed calls, from the (scheduled) send time
	lag     histogram // open loop: actual send time minus scheduled time

	requests                           uint64 // completed calls, errors included
	reqOK, reqOverLimit, reqUnknown    uint64 // by overall_code
	descOK, descOverLimit, descUnknown uint64 // by descriptor status code
	errors                             map[codes.Code]uint64
	unsent                             uint64 // open loop: calls abandoned at the hard stop

	rng *rand.Rand // the worker's key choice
}

// phase is one timed part of a run: the warm-up or the measurement.
type phase struct {
	cfg     *benchConfig
	conns   []*grpc.ClientConn
	reqs    []*rawRequest
	choose  chooser
	seed    uint64
	limit   uint64        // requests; zero for no limit
	length  time.Duration // duration; zero for no limit
	tickets atomic.Uint64 // closed loop with a limit: calls claimed
}

// run starts the workers and waits for them; elapsed runs from the start
// until the last call ended.
func (p *phase) run(ctx context.Context) (stats []*workerStats, elapsed time.Duration) {
	c := p.cfg
	// Calls still running this long after the planned end are cancelled
	// and counted as errors.
	hardStop := p.length
	if p.limit > 0 {
		hardStop = maxDuration
		if c.Rate > 0 {
			hardStop = time.Duration(float64(p.limit) / c.Rate * float64(time.Second))
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stats = make([]*workerStats, c.Workers)
	var wg sync.WaitGroup
	var tickets chan time.Time
	var pacerUnsent uint64
	start := time.Now()
	t := time.AfterFunc(hardStop+c.Timeout, cancel)
	defer t.Stop()
	if c.Rate > 0 {
		total := p.limit
		if total == 0 {
			total = uint64(c.Rate * p.length.Seconds())
		}
		tickets = make(chan time.Time, c.Workers)
		wg.Go(func() { pacerUnsent = p.pace(ctx, start, total, hardStop+c.Timeout, tickets) })
	}
	for w := range c.Workers {
		ws := &workerStats{errors: map[codes.Code]uint64{}, rng: rand.New(rand.NewPCG(p.seed, uint64(w)))}
		stats[w] = ws
		cc := p.conns[w%len(p.conns)]
		wg.Go(func() {
			if c.Rate > 0 {
				p.openLoop(ctx, ws, cc, tickets)
			} else {
				p.closedLoop(ctx, ws, cc, start)
			}
		})
	}
	wg.Wait()
	stats[0].unsent += pacerUnsent
	return stats, time.Since(start)
}

// closedLoop sends one call after the other until the phase's count or
// time is used up; latency runs from each send.
func (p *phase) closedLoop(ctx context.Context, ws *workerStats, cc *grpc.ClientConn, start time.Time) {
	var rep reply
	deadline := start.Add(p.length)
	now := start
	for ctx.Err() == nil {
		if p.limit > 0 {
			if p.tickets.Add(1) > p.limit {
				return
			}
		} else if !now.Before(deadline) {
			return
		}
		req := p.reqs[p.choose.next(ws.rng)]
		sent := time.Now()
		err := cc.Invoke(ctx, shouldRateLimit, req, &rep)
		now = time.Now()
		ws.count(err, &rep, now.Sub(sent))
	}
}

// maxPacerSleep bounds each of the pacer's sleeps, so that it notices
// the end of the run soon at low rates.
const maxPacerSleep = 50 * time.Millisecond

// pace hands out the open loop's calls: call n (of total) is due at
// start + n/rate, and is put on tickets, as its due time, no earlier. A
// due time is never moved: when every worker is busy the pacer waits,
// and the calls it then hands out late carry their original due time.
// It returns how many calls it abandoned at the hard stop.
func (p *phase) pace(ctx context.Context, start time.Time, total uint64, hardStop time.Duration, tickets chan<- time.Time) (unsent uint64) {
	defer close(tickets)
	sl := newSleeper()
	defer sl.close()
	interval := float64(time.Second) / p.cfg.Rate
	for n := range total {
		due := start.Add(time.Duration(float64(n) * interval))
		for d := time.Until(due); d > 0; d = time.Until(due) {
			if ctx.Err() != nil {
				return total - n
			}
			sl.sleep(min(d, maxPacerSleep))
		}
		if time.Since(start) > hardStop {
			return total - n
		}
		select {
		case tickets <- due:
		case <-ctx.Done():
			return total - n
		}
	}
	return 0
}

// openLoop sends the calls the pacer hands out. Latency runs from each
// call's due time, so a server (or a client) that falls behind shows up
// as latency rather than as fewer calls: no coordinated omission. Calls
// handed out after the hard stop are not sent but counted as unsent.
func (p *phase) openLoop(ctx context.Context, ws *workerStats, cc *grpc.ClientConn, tickets <-chan time.Time) {
	var rep reply
	for due := range tickets {
		if ctx.Err() != nil {
			ws.unsent++
			continue
		}
		req := p.reqs[p.choose.next(ws.rng)]
		sent := time.Now()
		err := cc.Invoke(ctx, shouldRateLimit, req, &rep)
		done := time.Now()
		ws.lag.record(sent.Sub(due))
		ws.count(err, &rep, done.Sub(due))
	}
}

// count records one completed call. A call the hard stop (or an
// interrupt) cancelled counts as an error, Canceled.
func (ws *workerStats) count(err error, rep *reply, latency time.Duration) {
	ws.requests++
	if err != nil {
		ws.errors[status.Code(err)]++
		return
	}
	ws.latency.record(latency)
	switch rep.overall {
	case rlsv3.RateLimitResponse_OK:
		ws.reqOK++
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		ws.reqOverLimit++
	default:
		ws.reqUnknown++
	}
	ws.descOK += uint64(rep.ok)
	ws.descOverLimit += uint64(rep.overLimit)
	ws.descUnknown += uint64(rep.unknown)
}

// runBench runs c: it builds the requests, connects, warms up and
// measures, and returns the report.
func runBench(ctx context.Context, c *benchConfig) (*report, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	reqs, err := buildRequests(c)
	if err != nil {
		return nil, err
	}
	choose, err := newChooser(c)
	if err != nil {
		return nil, err
	}
	conns, err := dial(ctx, c)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, cc := range conns {
			cc.Close()
		}
	}()
	procs := append([]proc{{Name: "ratelimit-bench", PID: os.Getpid()}}, c.Procs...)
	hz, hzNote := clockTicks()

	if c.Warmup > 0 {
		w := &phase{cfg: c, conns: conns, reqs: reqs, choose: choose, seed: c.Seed ^ 0x5eed, length: c.Warmup}
		w.run(ctx)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	// The backend's count is read outside the CPU samples: reading it
	// costs the backend too.
	var callsBefore uint64
	if c.BackendCalls != nil {
		if callsBefore, err = c.BackendCalls(ctx); err != nil {
			return nil, fmt.Errorf("the backend's calls before measuring: %w", err)
		}
	}
	before, err := sampleCPU(procs)
	if err != nil {
		return nil, err
	}
	if c.CPUProfile != "" {
		f, err := os.Create(c.CPUProfile)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, err
		}
	}
	m := &phase{cfg: c, conns: conns, reqs: reqs, choose: choose, seed: c.Seed, limit: c.Count, length: c.Duration}
	stats, elapsed := m.run(ctx)
	if c.CPUProfile != "" {
		pprof.StopCPUProfile()
	}
	after, err := sampleCPU(procs)
	if err != nil {
		return nil, err
	}
	r := newReport(c, stats, elapsed)
	r.addCPU(procs, before, after, hz)
	// An interrupted run reports without them: its figures are not
	// used, and the count could not be read any more.
	if c.BackendCalls != nil && ctx.Err() == nil {
		callsAfter, err := c.BackendCalls(ctx)
		if err != nil {
			return nil, fmt.Errorf("the backend's calls after measuring: %w", err)
		}
		if callsAfter < callsBefore {
			return nil, fmt.Errorf("the backend's count of calls went back from %d to %d while measuring: was it restarted or its statistics reset (CONFIG RESETSTAT)? Run again", callsBefore, callsAfter)
		}
		r.addBackendCalls(callsAfter - callsBefore)
	}
	if hzNote != "" {
		r.Notes = append(r.Notes, hzNote)
	}
	if ctx.Err() != nil {
		r.Interrupted = true
	}
	return r, nil
}
