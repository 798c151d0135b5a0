package main

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// chooser picks which of k pre-built requests to send next.
type chooser interface {
	// next returns an index in [0, k).
	next(r *rand.Rand) int
}

// uniform picks every index with the same probability.
type uniform struct{ k int }

func (u uniform) next(r *rand.Rand) int { return r.IntN(u.k) }

// zipf picks index i with probability proportional to 1/(i+1)^s: index 0
// is the hottest key. Unlike math/rand's Zipf it takes any s > 0, the
// usual 0.99 of YCSB-like workloads included. It samples by binary search
// in the cumulative distribution, 8 bytes per key, shared read-only by
// every worker.
type zipf struct {
	cdf []float64 // cdf[i] = P(index <= i), cdf[k-1] = 1
}

// newZipf returns a Zipf chooser over k indexes with exponent s.
func newZipf(k int, s float64) (*zipf, error) {
	if k < 1 {
		return nil, fmt.Errorf("zipf over %d keys: need at least one", k)
	}
	if !(s > 0) || math.IsInf(s, 0) {
		return nil, fmt.Errorf("zipf exponent %v: need a finite number > 0", s)
	}
	cdf := make([]float64, k)
	var sum float64
	for i := range cdf {
		sum += math.Pow(float64(i+1), -s)
		cdf[i] = sum
	}
	for i := range cdf {
		cdf[i] /= sum
	}
	cdf[k-1] = 1
	return &zipf{cdf: cdf}, nil
}

func (z *zipf) next(r *rand.Rand) int {
	u := r.Float64() // [0, 1)
	// The least i with cdf[i] > u; cdf[k-1] = 1 > u.
	lo, hi := 0, len(z.cdf)-1
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if z.cdf[m] > u {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo
}

// prob returns the probability of index i.
func (z *zipf) prob(i int) float64 {
	if i == 0 {
		return z.cdf[0]
	}
	return z.cdf[i] - z.cdf[i-1]
}
