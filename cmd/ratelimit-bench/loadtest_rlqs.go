package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// The rlqs group measures ratelimitd's RLQS server (pkg/rlqs, its budget
// held in the backend of -rlqs-backends) under streams that report as
// Envoy's rate_limit_quota filter does: each stream reports the usage of
// its buckets every interval, from a steady demand, and the server
// answers each report with one response assigning every bucket of it. A
// row's latency is, per report, from its send to the receipt of that
// response (the server answers a stream's reports in order, one response
// each, so a stream's responses are matched to its reports first in,
// first out; a response that comes while no report waits is a push,
// which answers none, and is counted apart).

// The rlqs group's rule: every value of the key in domain rlqsDomain is
// limited to rlqsLimit requests a second, shared among the streams that
// report it.
const (
	rlqsDomain = "rlqs"
	rlqsLimit  = 1000
)

// rlqsRule is the rule file of domain rlqsDomain, limiting key.
func rlqsRule(key string) string {
	return fmt.Sprintf(`# written by ratelimit-bench loadtest
domain: %s
descriptors:
  - key: %s
    rate_limit:
      requests_per_unit: %d
      unit: second
`, rlqsDomain, key, rlqsLimit)
}

// writeRLQSRules writes the rlqs group's rule file into dir.
func writeRLQSRules(dir, key string) error {
	return os.WriteFile(filepath.Join(dir, rlqsDomain+".yaml"), []byte(rlqsRule(key)), 0o644)
}

// checkRLQSRules checks that the rules at path limit (key, any value) in
// domain rlqsDomain by a rate, so that the buckets are shares of a limit
// (a bucket no rule limits is assigned ALLOW_ALL without any sharing).
func checkRLQSRules(path, key string) error {
	rules, err := config.Load(path)
	if err != nil {
		return err
	}
	dom := rules.Domain(rlqsDomain)
	if dom == nil {
		return fmt.Errorf("%s: no domain %s, which the rlqs scenarios use: add it (ratelimit-bench loadtest without -config writes one), or leave rlqs out of -scenarios", path, rlqsDomain)
	}
	rule := dom.Match(oneEntry{key, "user-0"})
	if rule == nil || rule.Unlimited || rule.ShadowMode || len(rule.Limits) == 0 {
		return fmt.Errorf("%s: domain %s has no rate limit for (%s, user-0): its buckets would not share a limit", path, rlqsDomain, key)
	}
	return nil
}

// rlqsConfig is the rlqs group's part of the load test's command line.
type rlqsConfig struct {
	Streams  int           // streams open at once, like as many Envoys
	Buckets  int           // buckets in each stream's reports
	Conns    int           // gRPC connections carrying the streams
	Interval time.Duration // each stream's reporting interval
	Demand   float64       // requests/s of each bucket of each stream
	Share    []int         // one row each: how many streams report each bucket
	share    string        // -rlqs-share as given
	Backends []string      // the server's -backend, one row each per share
	backends string        // -rlqs-backends as given
}

// addRLQSFlags defines the rlqs group's flags on fs.
func addRLQSFlags(fs *flag.FlagSet, c *rlqsConfig) {
	fs.IntVar(&c.Streams, "rlqs-streams", 1000, "rlqs group: RLQS streams open at once (simulated Envoys)")
	fs.IntVar(&c.Buckets, "rlqs-buckets", 100, "rlqs group: buckets in each stream's reports")
	fs.IntVar(&c.Conns, "rlqs-conns", 4, "rlqs group: gRPC connections the streams are spread over")
	fs.DurationVar(&c.Interval, "rlqs-interval", 5*time.Second, "rlqs group: each stream's reporting interval (Envoy's filter reports every 5s whatever its config says)")
	fs.Float64Var(&c.Demand, "rlqs-demand", 10, "rlqs group: steady requests/s of each bucket of each stream, reported as allowed")
	fs.StringVar(&c.share, "rlqs-share", "1,10", "rlqs group: one row per number, the streams reporting each bucket (1: every stream its own buckets; -rlqs-streams: every stream the same buckets), separated by commas")
	fs.StringVar(&c.backends, "rlqs-backends", "memory,redis", "rlqs group: the server's backends, the budget store its streams share, one row each per -rlqs-share: memory, redis, or both separated by commas")
}

// validate checks the rlqs flags and reads -rlqs-share.
func (c *rlqsConfig) validate() error {
	switch {
	case c.Streams < 1 || c.Streams > 100_000:
		return fmt.Errorf("-rlqs-streams %d: want 1 to 100,000", c.Streams)
	case c.Buckets < 1 || c.Buckets > 1000:
		// pkg/rlqs refuses reports of more than 1,000 buckets by default.
		return fmt.Errorf("-rlqs-buckets %d: want 1 to 1,000 (the server's bound on a report)", c.Buckets)
	case c.Conns < 1 || c.Conns > c.Streams:
		return fmt.Errorf("-rlqs-conns %d: want 1 to -rlqs-streams (%d)", c.Conns, c.Streams)
	case c.Interval < 10*time.Millisecond || c.Interval > time.Minute:
		return fmt.Errorf("-rlqs-interval %v: want 10ms to 1m", c.Interval)
	case !(c.Demand >= 0 && c.Demand <= 1e9):
		return fmt.Errorf("-rlqs-demand %v: want 0 or more requests/s", c.Demand)
	}
	c.Share = nil
	for s := range strings.SplitSeq(c.share, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > c.Streams {
			return fmt.Errorf("-rlqs-share %q: %q is not a number of streams from 1 to -rlqs-streams (%d)", c.share, s, c.Streams)
		}
		c.Share = append(c.Share, n)
	}
	c.Backends = nil
	for b := range strings.SplitSeq(c.backends, ",") {
		b = strings.TrimSpace(b)
		if b != "memory" && b != "redis" {
			return fmt.Errorf("-rlqs-backends %q: %q is not a backend: want memory or redis", c.backends, b)
		}
		c.Backends = append(c.Backends, b)
	}
	return nil
}

// rlqsBucketValue is the value of the key in bucket b of stream s when
// share streams report each bucket: streams s and t report the same
// buckets when s/share == t/share.
func rlqsBucketValue(s, b, share, buckets int) string {
	return "user-" + strconv.Itoa((s/share)*buckets+b)
}

// rlqsDistinctBuckets is how many buckets the server holds shares of.
func rlqsDistinctBuckets(streams, buckets, share int) int {
	return (streams + share - 1) / share * buckets
}

// newRLQSReport encodes the report stream s sends every interval, as
// Envoy's filter builds one (buildReports and getUsageFromBucket in its
// global_client_impl.cc): the domain, set on every report, and for each
// of its buckets demand×interval requests allowed over time_elapsed, the
// interval in whole seconds, truncated.
func newRLQSReport(key string, s, share, buckets int, interval time.Duration, demand float64) (*rawRequest, error) {
	rep := &rlqsv3.RateLimitQuotaUsageReports{Domain: rlqsDomain}
	allowed := uint64(demand*interval.Seconds() + 0.5)
	for b := range buckets {
		rep.BucketQuotaUsages = append(rep.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqsv3.BucketId{Bucket: map[string]string{key: rlqsBucketValue(s, b, share, buckets)}},
			TimeElapsed:        &durationpb.Duration{Seconds: int64(interval / time.Second)},
			NumRequestsAllowed: allowed,
		})
	}
	b, err := proto.Marshal(rep)
	if err != nil {
		return nil, err
	}
	return &rawRequest{frame: mem.BufferSlice{mem.SliceBuffer(b)}}, nil
}

// The field numbers the rlqs codec reads, from the generated descriptors.
var (
	fieldBucketAction = fieldNumber(&rlqsv3.RateLimitQuotaResponse{}, "bucket_action")
	fieldQuotaAssign  = fieldNumber(&rlqsv3.RateLimitQuotaResponse_BucketAction{}, "quota_assignment_action")
	fieldAbandon      = fieldNumber(&rlqsv3.RateLimitQuotaResponse_BucketAction{}, "abandon_action")
)

// rlqsReply is what the generator keeps of a RateLimitQuotaResponse: how
// many buckets it assigned and abandoned.
type rlqsReply struct{ assigned, abandoned int }

func (r *rlqsReply) parse(b []byte) error {
	r.assigned, r.abandoned = 0, 0
	return eachField(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if num != fieldBucketAction || typ != protowire.BytesType {
			return protowire.ConsumeFieldValue(num, typ, b), nil
		}
		action, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return n, nil
		}
		err := eachField(action, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
			switch num {
			case fieldQuotaAssign:
				r.assigned++
			case fieldAbandon:
				r.abandoned++
			}
			return protowire.ConsumeFieldValue(num, typ, b), nil
		})
		return n, err
	})
}

// rlqsCodec sends a *rawRequest's bytes as they are and counts the
// actions of a response into an *rlqsReply.
type rlqsCodec struct{}

func (rlqsCodec) Name() string { return "proto" }

func (rlqsCodec) Marshal(v any) (mem.BufferSlice, error) { return rawCodec{}.Marshal(v) }

func (rlqsCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*rlqsReply)
	if !ok {
		return fmt.Errorf("ratelimit-bench rlqs codec: cannot read into %T", v)
	}
	if len(data) == 1 {
		return r.parse(data[0].ReadOnlyData())
	}
	return r.parse(data.Materialize())
}

// rlqsStats is what the streams of one connection saw in the measured
// window; its streams share it, under mu.
type rlqsStats struct {
	mu         sync.Mutex
	latency    histogram // report sent to its response received
	reports    uint64    // reports sent in the window and answered
	buckets    uint64    // assignments in those responses
	pushes     uint64    // responses while no report waited for its answer: pushed
	abandoned  uint64    // abandon actions received
	unanswered uint64    // reports sent in the window, not answered by the end
	skipped    uint64    // reports not sent: too many unanswered already
	errors     map[string]uint64
}

// rlqsMaxUnanswered is how many reports a stream sends ahead of the
// responses before it skips reports (and counts them skipped).
const rlqsMaxUnanswered = 16

// runRLQSStreams opens one stream per entry of reports over conns, each
// sending its report every interval from a random phase, and records the
// reports sent between start and end. The streams end at end plus two
// intervals, or with ctx.
func runRLQSStreams(ctx context.Context, conns []*grpc.ClientConn, reports []*rawRequest, buckets int, interval time.Duration, start, end time.Time) ([]*rlqsStats, error) {
	stats := make([]*rlqsStats, len(conns))
	for i := range stats {
		stats[i] = &rlqsStats{errors: map[string]uint64{}}
	}
	ctx, cancel := context.WithDeadline(ctx, end.Add(2*interval))
	defer cancel()
	rng := rand.New(rand.NewPCG(1, 2))
	desc := &rlqsv3.RateLimitQuotaService_ServiceDesc.Streams[0]
	var wg sync.WaitGroup
	for s, rep := range reports {
		cc := conns[s%len(conns)]
		st := stats[s%len(conns)]
		stream, err := cc.NewStream(ctx, desc, rlqsv3.RateLimitQuotaService_StreamRateLimitQuotas_FullMethodName, grpc.ForceCodecV2(rlqsCodec{}))
		if err != nil {
			return nil, fmt.Errorf("opening stream %d: %w", s, err)
		}
		phase := time.Duration(rng.Int64N(int64(interval)))
		sent := make(chan time.Time, rlqsMaxUnanswered)
		sendDone := make(chan struct{})
		wg.Go(func() { // receives
			var r rlqsReply
			for {
				if err := stream.RecvMsg(&r); err != nil {
					if ctx.Err() == nil && err != io.EOF {
						st.mu.Lock()
						st.errors[status.Code(err).String()]++
						st.mu.Unlock()
					}
					break
				}
				now := time.Now()
				var at time.Time
				select {
				case at = <-sent:
				default:
					// No report is waiting for its answer: this is a push
					// (after a reload, or when the store showed a
					// bucket's shares moved). One that comes while a
					// report waits is taken for its answer, and the
					// answer then for a push: a latency a little short.
					st.mu.Lock()
					st.pushes++
					st.mu.Unlock()
					continue
				}
				if at.Before(start) || !at.Before(end) {
					continue
				}
				st.mu.Lock()
				st.latency.record(now.Sub(at))
				st.reports++
				st.buckets += uint64(r.assigned)
				st.abandoned += uint64(r.abandoned)
				st.mu.Unlock()
			}
			// Reports of the window left unanswered.
			<-sendDone
			close(sent)
			var n uint64
			for at := range sent {
				if !at.Before(start) && at.Before(end) {
					n++
				}
			}
			st.mu.Lock()
			st.unanswered += n
			st.mu.Unlock()
		})
		wg.Go(func() { // sends
			defer close(sendDone)
			defer stream.CloseSend()
			t := time.NewTimer(phase)
			defer t.Stop()
			for next := time.Now().Add(phase); ; next = next.Add(interval) {
				t.Reset(time.Until(next))
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				now := time.Now()
				if !now.Before(end) {
					return
				}
				select {
				case sent <- now:
				default:
					if !now.Before(start) {
						st.mu.Lock()
						st.skipped++
						st.mu.Unlock()
					}
					continue
				}
				if err := stream.SendMsg(rep); err != nil {
					return // the receiver sees why
				}
			}
		})
	}
	wg.Wait()
	return stats, nil
}

// rlqsRow is one row of the rlqs group's table.
type rlqsRow struct {
	Name                     string
	Streams, Buckets, Share  int
	ReportsPerS, BucketsPerS float64
	// Latencies in µs; CPU in µs per report and per bucket; negative when
	// not measured.
	P50, P99, P999 float64
	// CPU-seconds per second (cores) and CPU-µs per report and per
	// bucket assigned.
	ServerCores, ServerPerReport, ServerPerBucket float64
	BenchCores, BenchPerReport                    float64
	// The CPU of the store the budget is held in (Redis), in cores and
	// CPU-µs per bucket assigned; negative when the server's own memory
	// holds it.
	StoreCores, StorePerBucket float64
	// The server's memory in bytes, negative when not read, and what it
	// grew by from idle per stream and per stream-bucket.
	RSS, RSSIdle, Heap, HeapIdle     int64
	RSSPerStream, RSSPerStreamBucket float64
	HeapPerStreamBucket              float64
	Notes                            []string
}

// rlqsMemory is the server's memory before the streams opened (idle) and
// at the end of the window, in bytes; negative when not read.
type rlqsMemory struct{ RSSIdle, RSS, HeapIdle, Heap int64 }

// rlqsRowOf makes a table row of what the streams saw over elapsed, with
// the CPU time of the server and of the generator over it and the
// server's memory.
func rlqsRowOf(name string, c rlqsConfig, share int, stats []*rlqsStats, elapsed time.Duration, serverCPU, benchCPU, storeCPU time.Duration, m rlqsMemory) rlqsRow {
	var lat histogram
	var reports, buckets, pushes, abandoned, unanswered, skipped uint64
	errs := map[string]uint64{}
	for _, st := range stats {
		lat.merge(&st.latency)
		reports += st.reports
		buckets += st.buckets
		pushes += st.pushes
		abandoned += st.abandoned
		unanswered += st.unanswered
		skipped += st.skipped
		for k, n := range st.errors {
			errs[k] += n
		}
	}
	row := rlqsRow{
		Name: name, Streams: c.Streams, Buckets: c.Buckets, Share: share,
		P50: -1, P99: -1, P999: -1, ServerCores: -1, ServerPerReport: -1, ServerPerBucket: -1, BenchCores: -1, BenchPerReport: -1,
		StoreCores: -1, StorePerBucket: -1,
		RSS: m.RSS, RSSIdle: m.RSSIdle, Heap: m.Heap, HeapIdle: m.HeapIdle,
		RSSPerStream: -1, RSSPerStreamBucket: -1, HeapPerStreamBucket: -1,
	}
	if s := elapsed.Seconds(); s > 0 {
		row.ReportsPerS, row.BucketsPerS = float64(reports)/s, float64(buckets)/s
		if serverCPU >= 0 {
			row.ServerCores = serverCPU.Seconds() / s
		}
		if benchCPU >= 0 {
			row.BenchCores = benchCPU.Seconds() / s
		}
		if storeCPU >= 0 {
			row.StoreCores = storeCPU.Seconds() / s
		}
	}
	if reports > 0 {
		row.P50, row.P99, row.P999 = micros(lat.quantile(0.50)), micros(lat.quantile(0.99)), micros(lat.quantile(0.999))
		if serverCPU >= 0 {
			row.ServerPerReport = micros(serverCPU) / float64(reports)
		}
		if benchCPU >= 0 {
			row.BenchPerReport = micros(benchCPU) / float64(reports)
		}
	}
	if buckets > 0 && serverCPU >= 0 {
		row.ServerPerBucket = micros(serverCPU) / float64(buckets)
	}
	if buckets > 0 && storeCPU >= 0 {
		row.StorePerBucket = micros(storeCPU) / float64(buckets)
	}
	held := float64(c.Streams) * float64(c.Buckets) // stream-buckets the server holds
	if m.RSS >= 0 && m.RSSIdle >= 0 {
		row.RSSPerStream = float64(m.RSS-m.RSSIdle) / float64(c.Streams)
		row.RSSPerStreamBucket = float64(m.RSS-m.RSSIdle) / held
	}
	if m.Heap >= 0 && m.HeapIdle >= 0 {
		row.HeapPerStreamBucket = float64(m.Heap-m.HeapIdle) / held
	}
	row.Notes = append(row.Notes, fmt.Sprintf("%s streams × %s buckets, each bucket reported by %s stream(s) (%s distinct buckets), every %v, %s requests/s per bucket per stream",
		num(float64(c.Streams)), num(float64(c.Buckets)), num(float64(share)), num(float64(rlqsDistinctBuckets(c.Streams, c.Buckets, share))), c.Interval, num(c.Demand)))
	if want := float64(c.Streams) / c.Interval.Seconds(); row.ReportsPerS < 0.95*want {
		row.Notes = append(row.Notes, fmt.Sprintf("answered %s reports/s of the %s/s sent on schedule: the server or the generator falls behind", num(row.ReportsPerS), num(want)))
	}
	if pushes > 0 {
		row.Notes = append(row.Notes, fmt.Sprintf("%d responses pushed without a report (a rebalance or a reload; not in the latencies)", pushes))
	}
	if abandoned > 0 {
		row.Notes = append(row.Notes, fmt.Sprintf("%d buckets abandoned", abandoned))
	}
	if unanswered > 0 {
		row.Notes = append(row.Notes, fmt.Sprintf("%d reports of the window unanswered two intervals after it", unanswered))
	}
	if skipped > 0 {
		row.Notes = append(row.Notes, fmt.Sprintf("%d reports skipped: their stream had %d unanswered", skipped, rlqsMaxUnanswered))
	}
	if len(errs) > 0 {
		row.Notes = append(row.Notes, "stream errors: "+countsText(errs, ", "))
	}
	return row
}

// writeRLQSTable prints the rlqs group's rows as one Markdown table, then
// their notes.
func writeRLQSTable(w io.Writer, rows []rlqsRow) {
	cell := func(v float64, f func(float64) string) string {
		if v < 0 {
			return "–"
		}
		return f(v)
	}
	cpu := func(v float64) string {
		if v < 1 {
			return fmt.Sprintf("%.2f", v)
		}
		return fmt.Sprintf("%.1f", v)
	}
	cores := func(v float64) string { return fmt.Sprintf("%.2f", v) }
	mb := func(v float64) string { return fmt.Sprintf("%.1f MB", v/1e6) }
	bytes := func(v float64) string { return num(v) + " B" }
	fmt.Fprintln(w, "| RLQS scenario | reports/s | buckets/s | p50 | p99 | p99.9 | server CPU (cores) | server CPU-µs/report | server CPU-µs/bucket | Redis CPU (cores) | Redis CPU-µs/bucket | generator CPU (cores) | server RSS (idle) | RSS/stream | RSS/stream-bucket | Go heap in use (idle) | heap/stream-bucket |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		rss, heap := "–", "–"
		if r.RSS >= 0 {
			rss = fmt.Sprintf("%s (%s)", mb(float64(r.RSS)), cell(float64(r.RSSIdle), mb))
		}
		if r.Heap >= 0 {
			heap = fmt.Sprintf("%s (%s)", mb(float64(r.Heap)), cell(float64(r.HeapIdle), mb))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.Name,
			num(r.ReportsPerS), num(r.BucketsPerS), cell(r.P50, us), cell(r.P99, us), cell(r.P999, us),
			cell(r.ServerCores, cores), cell(r.ServerPerReport, cpu), cell(r.ServerPerBucket, cpu),
			cell(r.StoreCores, cores), cell(r.StorePerBucket, cpu), cell(r.BenchCores, cores),
			rss, cell(r.RSSPerStream, bytes), cell(r.RSSPerStreamBucket, bytes), heap, cell(r.HeapPerStreamBucket, bytes))
	}
	fmt.Fprintln(w)
	for _, r := range rows {
		for _, n := range r.Notes {
			fmt.Fprintf(w, "- %s: %s\n", r.Name, n)
		}
	}
}

// parseVmRSS reads VmRSS from the text of /proc/PID/status, in bytes.
func parseVmRSS(b []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("/proc status: VmRSS %q: want a number of kB", rest)
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc status: VmRSS %q: %v", rest, err)
		}
		return n * 1024, nil
	}
	return 0, fmt.Errorf("/proc status: no VmRSS line")
}

// parseMetric reads the value of the unlabelled series name from a
// Prometheus text exposition.
func parseMetric(b []byte, name string) (float64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), name+" ")
		if !ok {
			continue
		}
		return strconv.ParseFloat(strings.TrimSpace(rest), 64)
	}
	return 0, fmt.Errorf("no series %s", name)
}

// rssOf returns the resident memory of process pid in bytes, -1 when it
// cannot be read.
func rssOf(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	n, err := parseVmRSS(b)
	if err != nil {
		return -1
	}
	return n
}

// heapOf returns go_memstats_heap_inuse_bytes from the server's /metrics
// at httpAddr, -1 when it cannot be read.
func heapOf(ctx context.Context, httpAddr string) int64 {
	b, err := fetchMetrics(ctx, httpAddr)
	if err != nil {
		return -1
	}
	v, err := parseMetric(b, "go_memstats_heap_inuse_bytes")
	if err != nil {
		return -1
	}
	return int64(v)
}

// fetchMetrics returns the /metrics text of the ratelimitd serving HTTP at
// httpAddr.
func fetchMetrics(ctx context.Context, httpAddr string) ([]byte, error) {
	if httpAddr == "" {
		return nil, errors.New("no HTTP address")
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return b, err
}

// httpAddrOf reads the address of "serving HTTP" from the JSON log of a
// ratelimitd, waiting up to 5 s for it; "" when it is not there.
func httpAddrOf(ch *child) string {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile(ch.log)
		for line := range strings.SplitSeq(string(b), "\n") {
			var rec struct{ Msg, Addr string }
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "serving HTTP" && rec.Addr != "" {
				return rec.Addr
			}
		}
	}
	return ""
}

// rlqsGroup runs one rlqs scenario per -rlqs-backends and -rlqs-share,
// each on a ratelimitd of its own (-rlqs), so that its memory is the
// scenario's. With the redis backend, the budget the streams share is in
// the Redis at redisAddr.
func (lt *loadtest) rlqsGroup(ctx context.Context, redis *child, redisAddr string) ([]rlqsRow, error) {
	var rows []rlqsRow
	for _, backend := range lt.cfg.RLQS.Backends {
		for _, share := range lt.cfg.RLQS.Share {
			row, err := lt.rlqsScenario(ctx, backend, redis, redisAddr, share)
			if err != nil {
				return nil, err
			}
			rows = append(rows, row)
		}
	}
	return rows, nil
}

// rlqsScenario measures the streams of -rlqs-streams, share of them
// reporting each bucket, against a new ratelimitd on backend (with
// redis, the one at redisAddr, whose CPU is measured too).
func (lt *loadtest) rlqsScenario(ctx context.Context, backend string, redis *child, redisAddr string, share int) (rlqsRow, error) {
	c := lt.cfg
	rc := c.RLQS
	name := fmt.Sprintf("ratelimitd -rlqs, %s: %s streams × %s buckets, %s stream(s) per bucket", backend, num(float64(rc.Streams)), num(float64(rc.Buckets)), num(float64(share)))
	reports := make([]*rawRequest, rc.Streams)
	for s := range reports {
		if s%share != 0 {
			reports[s] = reports[s-1] // the same buckets as the stream before
			continue
		}
		r, err := newRLQSReport(c.Key, s, share, rc.Buckets, rc.Interval, rc.Demand)
		if err != nil {
			return rlqsRow{}, err
		}
		reports[s] = r
	}
	args := []string{"-backend", backend, "-rlqs"}
	if backend == "redis" {
		args = append(args, "-redis-url", "redis://"+redisAddr)
	}
	srv, addr, err := lt.startRatelimitd(ctx, fmt.Sprintf("ratelimitd-rlqs-%s-%d", backend, share), args...)
	if err != nil {
		return rlqsRow{}, err
	}
	defer lt.stop(srv)
	httpAddr := httpAddrOf(srv)
	conns, err := dial(ctx, &benchConfig{Addr: addr, Conns: rc.Conns})
	if err != nil {
		return rlqsRow{}, err
	}
	defer func() {
		for _, cc := range conns {
			cc.Close()
		}
	}()
	memory := rlqsMemory{RSSIdle: rssOf(srv.pid()), HeapIdle: heapOf(ctx, httpAddr), RSS: -1, Heap: -1}
	// The warm-up lets every stream send a few reports: the first of each
	// bucket creates its share.
	warmup := max(c.Warmup, 3*rc.Interval)
	lt.logf("running %s for %v (+%v warm-up)", name, c.Duration, warmup)
	start := time.Now().Add(warmup)
	end := start.Add(c.Duration)
	// The CPU times at start and end, and the memory at end, are taken
	// while the streams run.
	type sample struct {
		server, bench, store uint64
		at                   time.Time
	}
	var before, after sample
	var sampleErr error
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		all := []proc{{Name: "ratelimitd", PID: srv.pid()}, {Name: "ratelimit-bench", PID: os.Getpid()}}
		if backend == "redis" {
			all = append(all, proc{Name: "redis", PID: redis.pid()})
		}
		for i, at := range []time.Time{start, end} {
			select {
			case <-time.After(time.Until(at)):
			case <-ctx.Done():
				sampleErr = ctx.Err()
				return
			}
			s, err := sampleCPU(all)
			if err != nil {
				sampleErr = err
				return
			}
			taken := sample{server: s[0], bench: s[1], at: time.Now()}
			if len(s) > 2 {
				taken.store = s[2]
			}
			if i == 0 {
				before = taken
				continue
			}
			after = taken
			memory.RSS, memory.Heap = rssOf(srv.pid()), heapOf(ctx, httpAddr)
		}
	}()
	stats, err := runRLQSStreams(ctx, conns, reports, rc.Buckets, rc.Interval, start, end)
	<-sampled
	if err != nil {
		return rlqsRow{}, err
	}
	if err := ctx.Err(); err != nil {
		return rlqsRow{}, fmt.Errorf("%s: interrupted", name)
	}
	if sampleErr != nil {
		return rlqsRow{}, fmt.Errorf("%s: CPU time: %w", name, sampleErr)
	}
	hz, _ := clockTicks()
	storeCPU := time.Duration(-1)
	if backend == "redis" {
		storeCPU = ticksToDuration(after.store-before.store, hz)
	}
	row := rlqsRowOf(name, rc, share, stats, after.at.Sub(before.at),
		ticksToDuration(after.server-before.server, hz), ticksToDuration(after.bench-before.bench, hz), storeCPU, memory)
	if httpAddr == "" {
		row.Notes = append(row.Notes, "no Go heap: the server's HTTP address was not in its log")
	}
	lt.logf("  %s reports/s, %s buckets/s, p50 %s, p99 %s, server %.2f cores, Redis %.2f cores", num(row.ReportsPerS), num(row.BucketsPerS), us(row.P50), us(row.P99), row.ServerCores, max(row.StoreCores, 0))
	return row, nil
}
