package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestRLQSRules loads the rlqs group's rule with the project's config
// package beside the load test's other rules: a rate limit on any value of
// the key.
func TestRLQSRules(t *testing.T) {
	dir := t.TempDir()
	if err := writeRules(dir, "user_id"); err != nil {
		t.Fatal(err)
	}
	if err := checkRLQSRules(dir, "user_id"); err == nil || !strings.Contains(err.Error(), "no domain rlqs") {
		t.Errorf("rules without the rlqs domain: %v", err)
	}
	if err := writeRLQSRules(dir, "user_id"); err != nil {
		t.Fatal(err)
	}
	if err := checkRLQSRules(dir, "user_id"); err != nil {
		t.Errorf("the load test's own rules: %v", err)
	}
	if err := checkRLQSRules(dir, "account"); err == nil || !strings.Contains(err.Error(), "no rate limit for (account, user-0)") {
		t.Errorf("another key: %v", err)
	}
	if g, err := parseScenarios("rlqs"); err != nil || len(g) != 1 || !g[groupRLQS] {
		t.Errorf("-scenarios rlqs: %v, %v", g, err)
	}
}

// rlqsFlags parses args with the rlqs group's flags and validates them.
func rlqsFlags(args ...string) (rlqsConfig, error) {
	var c rlqsConfig
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addRLQSFlags(fs, &c)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	return c, c.validate()
}

func TestRLQSFlags(t *testing.T) {
	c, err := rlqsFlags()
	if err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if c.Streams != 1000 || c.Buckets != 100 || c.Interval != 5*time.Second || !slices.Equal(c.Share, []int{1, 10}) {
		t.Errorf("defaults %+v: want issue 17's 1,000 streams × 100 buckets every 1s, rows of 1 and 10 streams per bucket", c)
	}
	if c, err := rlqsFlags("-rlqs-streams", "20", "-rlqs-share", " 20 ,1"); err != nil || !slices.Equal(c.Share, []int{20, 1}) {
		t.Errorf("-rlqs-share 20,1: %v, %v", c.Share, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-rlqs-streams", "0"}, "-rlqs-streams 0"},
		{[]string{"-rlqs-buckets", "1001"}, "-rlqs-buckets 1001: want 1 to 1,000"},
		{[]string{"-rlqs-streams", "2", "-rlqs-conns", "3", "-rlqs-share", "1"}, "-rlqs-conns 3: want 1 to -rlqs-streams (2)"},
		{[]string{"-rlqs-interval", "1ms"}, "-rlqs-interval 1ms"},
		{[]string{"-rlqs-demand", "-1"}, "-rlqs-demand -1"},
		{[]string{"-rlqs-demand", "NaN"}, "-rlqs-demand NaN"},
		{[]string{"-rlqs-share", "1,1001"}, `"1001" is not a number of streams from 1 to -rlqs-streams (1000)`},
		{[]string{"-rlqs-share", ""}, `"" is not a number of streams`},
		{[]string{"-rlqs-share", "0"}, `"0" is not`},
	} {
		if _, err := rlqsFlags(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
	// A wrong rlqs flag is a usage error before any process starts.
	var out, errOut bytes.Buffer
	args := []string{"loadtest", "-ratelimitd", "/nonexistent/ratelimitd", "-scenarios", "rlqs", "-rlqs-buckets", "0"}
	if code := Main(context.Background(), args, &out, &errOut); code != exitUsage || !strings.Contains(errOut.String(), "-rlqs-buckets 0") {
		t.Errorf("exit %d, stderr %q; want a usage error", code, errOut.String())
	}
}

func TestRLQSBuckets(t *testing.T) {
	// 1 stream per bucket: every stream its own; 3: streams 0-2 share.
	if a, b := rlqsBucketValue(0, 5, 1, 100), rlqsBucketValue(1, 5, 1, 100); a != "user-5" || b != "user-105" {
		t.Errorf("share 1: %s, %s", a, b)
	}
	if a, b, c := rlqsBucketValue(0, 5, 3, 100), rlqsBucketValue(2, 5, 3, 100), rlqsBucketValue(3, 5, 3, 100); a != b || a == c {
		t.Errorf("share 3: streams 0 and 2 report %s and %s, stream 3 %s", a, b, c)
	}
	for _, tc := range []struct{ streams, buckets, share, want int }{
		{1000, 100, 1, 100_000}, {1000, 100, 10, 10_000}, {1000, 100, 1000, 100}, {10, 100, 3, 400},
	} {
		if got := rlqsDistinctBuckets(tc.streams, tc.buckets, tc.share); got != tc.want {
			t.Errorf("%+v: %d distinct buckets", tc, got)
		}
	}

	r, err := newRLQSReport("user_id", 7, 1, 3, time.Second, 10)
	if err != nil {
		t.Fatal(err)
	}
	var rep rlqsv3.RateLimitQuotaUsageReports
	if err := proto.Unmarshal(r.frame.Materialize(), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Domain != rlqsDomain || len(rep.BucketQuotaUsages) != 3 {
		t.Fatalf("report %v", &rep)
	}
	u := rep.BucketQuotaUsages[2]
	if u.BucketId.Bucket["user_id"] != "user-23" || u.NumRequestsAllowed != 10 || u.TimeElapsed.AsDuration() != time.Second {
		t.Errorf("bucket 2 of stream 7: %v", u)
	}
}

// TestRLQSCodec encodes responses with the generated types and counts
// their actions with the generator's parser.
func TestRLQSCodec(t *testing.T) {
	assign := func(v string) *rlqsv3.RateLimitQuotaResponse_BucketAction {
		return &rlqsv3.RateLimitQuotaResponse_BucketAction{
			BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"user_id": v}},
			BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(2 * time.Second),
			}},
		}
	}
	abandon := &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId:     &rlqsv3.BucketId{Bucket: map[string]string{"user_id": "gone"}},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}},
	}
	b, err := proto.Marshal(&rlqsv3.RateLimitQuotaResponse{BucketAction: []*rlqsv3.RateLimitQuotaResponse_BucketAction{assign("a"), abandon, assign("b")}})
	if err != nil {
		t.Fatal(err)
	}
	var r rlqsReply
	// Split over two buffers, as a large message may be.
	if err := (rlqsCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b[:5]), mem.SliceBuffer(b[5:])}, &r); err != nil || r.assigned != 2 || r.abandoned != 1 {
		t.Errorf("read %+v, %v; want 2 assigned, 1 abandoned", r, err)
	}
	if err := r.parse(nil); err != nil || r.assigned != 0 || r.abandoned != 0 {
		t.Errorf("an empty response: %+v, %v", r, err)
	}
	if err := r.parse(b[:len(b)-1]); err == nil {
		t.Error("a truncated response parsed")
	}
	if err := (rlqsCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &reply{}); err == nil {
		t.Error("the rlqs codec read into a reply of ShouldRateLimit")
	}
}

func TestRLQSRow(t *testing.T) {
	c := rlqsConfig{Streams: 4, Buckets: 10, Interval: time.Second, Demand: 10}
	stats := []*rlqsStats{{errors: map[string]uint64{}}, {errors: map[string]uint64{"Unavailable": 1}}}
	for i := range 40 { // 4 streams × 10 reports over 10 s
		st := stats[i%2]
		st.latency.record(time.Duration(1000+i) * time.Microsecond)
		st.reports++
		st.buckets += 10
	}
	stats[0].pushes, stats[1].unanswered, stats[1].skipped = 1, 2, 3
	m := rlqsMemory{RSSIdle: 20e6, RSS: 24e6, HeapIdle: 3e6, Heap: 5e6}
	row := rlqsRowOf("rlqs", c, 2, stats, 10*time.Second, 200*time.Millisecond, 100*time.Millisecond, 50*time.Millisecond, m)
	if row.ReportsPerS != 4 || row.BucketsPerS != 40 || row.ServerCores != 0.02 || row.ServerPerReport != 5000 || row.ServerPerBucket != 500 || row.BenchCores != 0.01 || row.BenchPerReport != 2500 {
		t.Errorf("row %+v: want 4 reports/s, 40 buckets/s, 0.02 cores, 5,000 and 500 CPU-µs per report and bucket, generator 0.01 cores and 2,500 µs per report", row)
	}
	if row.StoreCores != 0.005 || row.StorePerBucket != 125 {
		t.Errorf("store %v cores, %v CPU-µs per bucket: want 0.005 and 125", row.StoreCores, row.StorePerBucket)
	}
	if row.RSSPerStream != 1e6 || row.RSSPerStreamBucket != 1e5 || row.HeapPerStreamBucket != 5e4 {
		t.Errorf("memory %+v: want 1 MB RSS per stream, 100 kB per stream-bucket, heap 50 kB per stream-bucket", row)
	}
	if p50 := row.P50; p50 < 1010 || p50 > 1030 { // the histogram is within 1/128
		t.Errorf("p50 %vµs, want about 1.02ms", p50)
	}
	notes := strings.Join(row.Notes, "\n")
	for _, want := range []string{"4 streams × 10 buckets, each bucket reported by 2 stream(s) (20 distinct buckets)", "1 responses pushed without a report", "2 reports of the window unanswered", "3 reports skipped", "stream errors: Unavailable 1"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes\n%s\nwant %q", notes, want)
		}
	}
	if strings.Contains(notes, "falls behind") {
		t.Errorf("4 reports/s of 4 streams every 1s is not behind: %s", notes)
	}

	none := rlqsRowOf("none", c, 1, []*rlqsStats{{errors: map[string]uint64{}}}, 10*time.Second, time.Second, -1, -1, rlqsMemory{RSS: -1, RSSIdle: -1, Heap: -1, HeapIdle: -1})
	if none.P50 != -1 || none.ServerPerReport != -1 || none.StoreCores != -1 || none.BenchCores != -1 || none.RSSPerStream != -1 || none.HeapPerStreamBucket != -1 || !strings.Contains(strings.Join(none.Notes, "\n"), "falls behind") {
		t.Errorf("no report answered: %+v", none)
	}

	var out bytes.Buffer
	writeRLQSTable(&out, []rlqsRow{row, none})
	for _, want := range []string{"| RLQS scenario | reports/s | buckets/s |", "| rlqs | 4 | 40 | 1.02ms |", "| 0.02 | 5000.0 | 500.0 | 0.01 | 125.0 | 0.01 |", "| 24.0 MB (20.0 MB) | 1,000,000 B | 100,000 B | 5.0 MB (3.0 MB) | 50,000 B |", "| none | 0 | 0 | – | – | – |", "- none: "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table\n%s\nwant %q", out.String(), want)
		}
	}
}

func TestParseVmRSSAndMetric(t *testing.T) {
	status := "Name:\tratelimitd\nVmPeak:\t  900 kB\nVmRSS:\t   31936 kB\nRssAnon:\t 20000 kB\n"
	if n, err := parseVmRSS([]byte(status)); err != nil || n != 31936*1024 {
		t.Errorf("VmRSS: %d, %v", n, err)
	}
	for _, bad := range []string{"Name: x\n", "VmRSS:\t12 MB\n", "VmRSS:\tx kB\n"} {
		if _, err := parseVmRSS([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	metrics := "# HELP go_memstats_heap_inuse_bytes x\n# TYPE go_memstats_heap_inuse_bytes gauge\ngo_memstats_heap_inuse_bytes_total 1\ngo_memstats_heap_inuse_bytes 4.14e+06\n"
	if v, err := parseMetric([]byte(metrics), "go_memstats_heap_inuse_bytes"); err != nil || v != 4.14e6 {
		t.Errorf("heap: %v, %v", v, err)
	}
	if _, err := parseMetric([]byte(metrics), "go_goroutines"); err == nil {
		t.Error("a missing series parsed")
	}
}
