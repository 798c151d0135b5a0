package main

import (
	"math"
	"math/bits"
	"time"
)

// subBits sets the histogram's precision: each power of two is split into
// 2^subBits linear buckets, so a recorded value is known within
// 1/2^subBits (0.79%) of itself. Values below 2^(subBits+1) ns are exact.
const subBits = 7

const (
	subCount   = 1 << subBits
	numBuckets = (64 - subBits + 1) << subBits // 0 .. the bucket of MaxInt64
)

// histogram counts latencies in log-linear buckets, the layout of an HDR
// histogram: every value is kept within a relative error of 1/128, from a
// nanosecond to hours, in a fixed 59 KB. It is not safe for concurrent
// use: each worker records into its own and the report merges them.
type histogram struct {
	counts [numBuckets]uint64
	total  uint64
	sum    float64 // ns, for the mean
	min    int64
	max    int64
}

// bucketOf returns the index of the bucket holding v (ns, v >= 0).
func bucketOf(v int64) int {
	u := uint64(v)
	if u < 2*subCount {
		return int(u)
	}
	shift := bits.Len64(u) - 1 - subBits // >= 1
	return shift<<subBits + int(u>>uint(shift))
}

// bucketRange returns the least and the greatest value of bucket i.
func bucketRange(i int) (lo, hi int64) {
	if i < 2*subCount {
		return int64(i), int64(i)
	}
	shift := i>>subBits - 1
	top := uint64(i&(subCount-1) | subCount)
	lo = int64(top << uint(shift))
	return lo, lo + int64(1)<<uint(shift) - 1
}

// record counts one latency; negative durations count as zero.
func (h *histogram) record(d time.Duration) {
	v := int64(d)
	if v < 0 {
		v = 0
	}
	h.counts[bucketOf(v)]++
	if h.total == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.total++
	h.sum += float64(v)
}

// merge adds o's counts to h.
func (h *histogram) merge(o *histogram) {
	if o.total == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.total == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.total += o.total
	h.sum += o.sum
}

// quantile returns the latency at or below which a share q (0..1) of the
// recorded values lie: the greatest value of the bucket holding the
// ceil(q×total)-th smallest value, never beyond the largest recorded. It
// overstates the exact quantile by less than 1/128 of it.
func (h *histogram) quantile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.total)))
	rank = max(rank, 1)
	rank = min(rank, h.total)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			_, hi := bucketRange(i)
			return time.Duration(min(max(hi, h.min), h.max))
		}
	}
	return time.Duration(h.max) // unreachable: counts add up to total
}

// mean returns the mean recorded latency.
func (h *histogram) mean() time.Duration {
	if h.total == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.total))
}
