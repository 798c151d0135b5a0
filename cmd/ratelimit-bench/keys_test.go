package main

import (
	"math"
	"math/rand/v2"
	"testing"
)

// within reports whether an observed count is within 5 standard
// deviations of a binomial's expectation: a seeded test that fails only
// when the sampler is wrong.
func within(observed int, n int, p float64) bool {
	mean := float64(n) * p
	sd := math.Sqrt(float64(n) * p * (1 - p))
	return math.Abs(float64(observed)-mean) <= 5*sd+1
}

func TestUniformChoosesEveryKeyAlike(t *testing.T) {
	const k, n = 100, 200_000
	rng := rand.New(rand.NewPCG(7, 8))
	u := uniform{k: k}
	counts := make([]int, k)
	for range n {
		i := u.next(rng)
		if i < 0 || i >= k {
			t.Fatalf("index %d outside [0, %d)", i, k)
		}
		counts[i]++
	}
	for i, c := range counts {
		if !within(c, n, 1.0/k) {
			t.Errorf("key %d chosen %d times of %d, expected about %d", i, c, n, n/k)
		}
	}
}

func TestZipfFollowsItsLaw(t *testing.T) {
	for _, s := range []float64{0.99, 1.1, 2} {
		const k, n = 1000, 300_000
		z, err := newZipf(k, s)
		if err != nil {
			t.Fatal(err)
		}
		// The probabilities are proportional to 1/(i+1)^s and add up to 1.
		var h float64
		for i := range k {
			h += math.Pow(float64(i+1), -s)
		}
		var total float64
		for i := range k {
			want := math.Pow(float64(i+1), -s) / h
			if got := z.prob(i); math.Abs(got-want) > 1e-9 {
				t.Fatalf("s=%v: P(%d) = %v, want %v", s, i, got, want)
			}
			total += z.prob(i)
		}
		if math.Abs(total-1) > 1e-9 {
			t.Fatalf("s=%v: probabilities add up to %v", s, total)
		}
		rng := rand.New(rand.NewPCG(9, 10))
		counts := make([]int, k)
		for range n {
			i := z.next(rng)
			if i < 0 || i >= k {
				t.Fatalf("index %d outside [0, %d)", i, k)
			}
			counts[i]++
		}
		// The hottest keys, one by one, and the cold tail as a whole.
		tail, tailP := 0, 0.0
		for i := range k {
			if i < 20 {
				if !within(counts[i], n, z.prob(i)) {
					t.Errorf("s=%v: key %d chosen %d times of %d, expected about %.0f", s, i, counts[i], n, z.prob(i)*n)
				}
				continue
			}
			tail += counts[i]
			tailP += z.prob(i)
		}
		if !within(tail, n, tailP) {
			t.Errorf("s=%v: keys 20 and up chosen %d times of %d, expected about %.0f", s, tail, n, tailP*n)
		}
		if counts[0] <= counts[1] || counts[1] <= counts[9] {
			t.Errorf("s=%v: key 0 should be hottest: %v", s, counts[:10])
		}
	}
}

func TestZipfRefusesBadParameters(t *testing.T) {
	for _, tc := range []struct {
		k int
		s float64
	}{{0, 1}, {10, 0}, {10, -1}, {10, math.NaN()}, {10, math.Inf(1)}} {
		if _, err := newZipf(tc.k, tc.s); err == nil {
			t.Errorf("newZipf(%d, %v) succeeded", tc.k, tc.s)
		}
	}
	z, err := newZipf(1, 1.5)
	if err != nil {
		t.Fatal(err)
	}
	if i := z.next(rand.New(rand.NewPCG(1, 1))); i != 0 {
		t.Fatalf("one key: chose %d", i)
	}
}
