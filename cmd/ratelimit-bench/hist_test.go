package main

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// maxRelErr is the histogram's promised bound: a quantile overstates the
// exact one by less than this share of it.
const maxRelErr = 1.0 / subCount

func TestBucketsCoverEveryValue(t *testing.T) {
	// Each bucket starts where the previous one ended, and every value
	// lies in the bucket bucketOf names, up to the largest int64.
	var next int64
	last := bucketOf(math.MaxInt64)
	for i := 0; i <= last; i++ {
		lo, hi := bucketRange(i)
		if lo != next {
			t.Fatalf("bucket %d starts at %d, want %d", i, lo, next)
		}
		if hi < lo {
			t.Fatalf("bucket %d: [%d, %d]", i, lo, hi)
		}
		for _, v := range []int64{lo, hi, lo + (hi-lo)/2} {
			if got := bucketOf(v); got != i {
				t.Fatalf("bucketOf(%d) = %d, want %d", v, got, i)
			}
		}
		if lo > 2*subCount && float64(hi-lo+1)/float64(lo) > maxRelErr {
			t.Fatalf("bucket %d [%d, %d] is wider than 1/%d of its start", i, lo, hi, subCount)
		}
		if i == last {
			if hi != math.MaxInt64 {
				t.Fatalf("last bucket ends at %d, want MaxInt64", hi)
			}
			break
		}
		next = hi + 1
	}
	if last >= numBuckets {
		t.Fatalf("bucketOf(MaxInt64) = %d, beyond the %d buckets", last, numBuckets)
	}
}

// exactQuantile is the ceil(q×n)-th smallest of sorted values.
func exactQuantile(sorted []int64, q float64) int64 {
	rank := max(int(math.Ceil(q*float64(len(sorted)))), 1)
	return sorted[rank-1]
}

func TestQuantilesOfKnownDistributions(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	dists := map[string]func() int64{
		// Uniform latencies from 0 to 10 ms.
		"uniform": func() int64 { return rng.Int64N(int64(10 * time.Millisecond)) },
		// Exponential, mean 200 µs: a long tail.
		"exponential": func() int64 { return int64(rng.ExpFloat64() * float64(200*time.Microsecond)) },
		// Log-normal around 1 ms, spanning orders of magnitude.
		"lognormal": func() int64 { return int64(math.Exp(rng.NormFloat64()*1.5) * float64(time.Millisecond)) },
		// Small values, where the buckets are exact.
		"exact": func() int64 { return rng.Int64N(2 * subCount) },
	}
	for name, draw := range dists {
		t.Run(name, func(t *testing.T) {
			var h histogram
			vals := make([]int64, 200_000)
			var sum float64
			for i := range vals {
				vals[i] = draw()
				sum += float64(vals[i])
				h.record(time.Duration(vals[i]))
			}
			slices.Sort(vals)
			for _, q := range []float64{0, 0.001, 0.25, 0.5, 0.9, 0.99, 0.999, 0.9999, 1} {
				want := exactQuantile(vals, q)
				got := int64(h.quantile(q))
				if got < want || float64(got-want) > maxRelErr*float64(want) {
					t.Errorf("quantile(%v) = %d, exact %d: want within +%.2f%%", q, got, want, 100*maxRelErr)
				}
			}
			if int64(h.quantile(1)) != vals[len(vals)-1] || h.max != vals[len(vals)-1] || h.min != vals[0] {
				t.Errorf("max %d, min %d, quantile(1) %v; want %d and %d", h.max, h.min, h.quantile(1), vals[len(vals)-1], vals[0])
			}
			if got, want := float64(h.mean()), sum/float64(len(vals)); math.Abs(got-want) > 1 {
				t.Errorf("mean %v, want %v", got, want)
			}
		})
	}
}

func TestMergeEqualsRecordingTogether(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var a, b, both histogram
	for i := range 10_000 {
		d := time.Duration(rng.Int64N(int64(time.Second)))
		both.record(d)
		if i%3 == 0 {
			a.record(d)
		} else {
			b.record(d)
		}
	}
	var m histogram
	m.merge(&a)
	m.merge(&b)
	m.merge(&histogram{}) // an empty one changes nothing
	if m.counts != both.counts || m.total != both.total || m.min != both.min || m.max != both.max {
		t.Fatal("merging two histograms differs from recording into one")
	}
}

func TestEmptyAndNegative(t *testing.T) {
	var h histogram
	if h.quantile(0.5) != 0 || h.mean() != 0 {
		t.Fatal("an empty histogram reports a latency")
	}
	h.record(-time.Second)
	if h.quantile(1) != 0 || h.min != 0 {
		t.Fatalf("a negative duration counts as %v, want 0", h.quantile(1))
	}
}
