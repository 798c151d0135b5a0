package rlqs

import (
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// BenchmarkBudgetReports is issue 17's load on the shared budget, on the
// memory backend as the store: -streams streams of -buckets buckets each
// (every stream its own buckets), each reporting once per simulated
// second. One op is one report; the memory reported is the heap in use
// per stream-bucket after the rounds, garbage collected.
func BenchmarkBudgetReports(b *testing.B) {
	const streams, buckets = 1000, 100
	rules, err := config.Parse(config.File{Name: "rlqs.yaml", Data: []byte("domain: rlqs\ndescriptors:\n  - key: user_id\n    rate_limit: {requests_per_unit: 1000, unit: second}\n")})
	if err != nil {
		b.Fatal(err)
	}
	clk := clocktest.New(time.Unix(1_700_000_000, 0))
	store := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
	defer store.Close()
	s, err := New(Options{Rules: func() *config.Rules { return rules }, Budget: store, Now: clk.Now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	ss := make([]*stream, streams)
	reps := make([]*rlqsv3.RateLimitQuotaUsageReports, streams)
	for i := range ss {
		ss[i] = &stream{id: uint64(i + 1), buckets: make(map[string]*streamBucket), wake: make(chan struct{}, 1)}
		rep := &rlqsv3.RateLimitQuotaUsageReports{Domain: "rlqs"}
		for j := range buckets {
			rep.BucketQuotaUsages = append(rep.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
				BucketId:           &rlqsv3.BucketId{Bucket: map[string]string{"user_id": fmt.Sprintf("user-%d", i*buckets+j)}},
				TimeElapsed:        durationpb.New(time.Second),
				NumRequestsAllowed: 10,
			})
		}
		reps[i] = rep
	}
	round := func() {
		var wg sync.WaitGroup
		next := make(chan int, streams)
		for i := range streams {
			next <- i
		}
		close(next)
		for range runtime.GOMAXPROCS(0) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					if err := s.handle(ss[i], reps[i], func(*rlqsv3.RateLimitQuotaResponse) {}); err != nil {
						b.Error(err)
					}
				}
			}()
		}
		wg.Wait()
		clk.Advance(time.Second)
		store.Sweep()
	}
	for range 3 { // warm-up: every pool and lease in place
		round()
	}
	b.ResetTimer()
	b.ReportAllocs()
	rounds := 0
	for done := 0; done < b.N; done += streams {
		round()
		rounds++
	}
	b.StopTimer()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapInuse)/float64(streams*buckets), "heapB/stream-bucket")
	b.ReportMetric(float64(store.Len())/float64(streams*buckets), "keys/stream-bucket")
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(rounds*streams), "µs/report")
}
