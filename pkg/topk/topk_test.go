package topk

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"
)

// zipf returns a stream of n items drawn from a Zipf distribution of
// exponent s over universe items, with a fixed seed, and the exact count
// of each item.
func zipf(n int, s float64, universe uint64, seed uint64) ([][]byte, map[string]uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	z := rand.NewZipf(r, s, 1, universe-1)
	stream := make([][]byte, n)
	exact := map[string]uint64{}
	for i := range stream {
		key := "user-" + strconv.FormatUint(z.Uint64(), 10)
		stream[i] = []byte(key)
		exact[key]++
	}
	return stream, exact
}

// trueTop returns the n items of exact with the largest counts.
func trueTop(exact map[string]uint64, n int) []Item {
	all := make([]Item, 0, len(exact))
	for k, c := range exact {
		all = append(all, Item{Key: k, Count: c})
	}
	sortItems(all)
	return all[:min(n, len(all))]
}

// checkBounds checks the documented guarantees of items (a sketch's, or a
// merge's) against the exact counts of a stream of total weight n seen by
// sketches of k counters: every true count in [Count − Err, Count], every
// error at most maxErr ≤ n/k, every item above n/k present.
func checkBounds(t *testing.T, items []Item, maxErr uint64, exact map[string]uint64, n uint64, k int) {
	t.Helper()
	if maxErr > n/uint64(k) {
		t.Errorf("largest error %d is above N/k = %d/%d", maxErr, n, k)
	}
	held := map[string]bool{}
	for _, it := range items {
		held[it.Key] = true
		tc := exact[it.Key]
		if tc > it.Count || tc < it.Count-it.Err {
			t.Errorf("%s: true count %d outside [%d, %d]", it.Key, tc, it.Count-it.Err, it.Count)
		}
		if it.Err > maxErr {
			t.Errorf("%s: error %d above the bound %d", it.Key, it.Err, maxErr)
		}
	}
	for key, c := range exact {
		if c > n/uint64(k) && !held[key] {
			t.Errorf("%s: true count %d is above N/k = %d but it is not held", key, c, n/uint64(k))
		}
		if !held[key] && c > maxErr {
			t.Errorf("%s: not held, true count %d above the bound %d of an absent item", key, c, maxErr)
		}
	}
}

// TestZipfTopK feeds a Zipf stream of a million items over 100,000 distinct
// ones to a sketch of 200 counters and checks the documented bounds
// against exact counts, and that the true top 10 come out as the top 10:
// on this stream the gaps between them are far above the error bound.
func TestZipfTopK(t *testing.T) {
	const (
		n = 1_000_000
		k = 200
	)
	stream, exact := zipf(n, 1.1, 100_000, 1)
	s := New(k)
	for _, item := range stream {
		s.Add(item, 1)
		if s.Len() > k {
			t.Fatalf("sketch holds %d counters, more than k = %d", s.Len(), k)
		}
	}
	if s.Total() != n {
		t.Fatalf("Total = %d, want %d", s.Total(), n)
	}
	t.Logf("%d distinct items, N/k = %d, largest error %d", len(exact), n/k, s.Min())
	items := s.Items()
	checkBounds(t, items, s.Min(), exact, n, k)

	// The true top 10 are held (each is above N/k), and the sketch's top
	// 10 is the true one within the documented error: the item it ranks
	// i-th has a true count at most MaxErr below the true i-th's.
	want := trueTop(exact, 10)
	for _, w := range want {
		if !slices.ContainsFunc(items, func(it Item) bool { return it.Key == w.Key }) {
			t.Errorf("%s of the true top 10 (count %d) is not held", w.Key, w.Count)
		}
	}
	exactOrder := true
	for i := range want {
		got := items[i]
		if got.Key != want[i].Key {
			exactOrder = false
		}
		if exact[got.Key]+s.Min() < want[i].Count {
			t.Errorf("top %d: %s has a true count of %d, more than %d below the true %d-th (%s, %d)",
				i+1, got.Key, exact[got.Key], s.Min(), i+1, want[i].Key, want[i].Count)
		}
	}
	t.Logf("top 10 in the true order: %t", exactOrder)
}

// TestSketchExactWhenNotFull: with no more distinct items than counters,
// every count is exact.
func TestSketchExactWhenNotFull(t *testing.T) {
	s := New(4)
	for i, key := range []string{"a", "b", "a", "c", "a", "b"} {
		s.Add([]byte(key), uint64(i%2+1))
	}
	got := s.Items()
	want := []Item{{Key: "b", Count: 4}, {Key: "a", Count: 3}, {Key: "c", Count: 2}}
	if !slices.Equal(got, want) {
		t.Fatalf("Items = %v, want %v", got, want)
	}
	if s.Min() != 0 {
		t.Fatalf("Min = %d on a sketch not full, want 0", s.Min())
	}
}

// TestSketchReplacesSmallest: a new item in a full sketch takes the
// smallest counter and inherits its count as its error.
func TestSketchReplacesSmallest(t *testing.T) {
	s := New(2)
	s.Add([]byte("a"), 5)
	s.Add([]byte("b"), 2)
	s.Add([]byte("c"), 1)
	want := []Item{{Key: "a", Count: 5}, {Key: "c", Count: 3, Err: 2}}
	if got := s.Items(); !slices.Equal(got, want) {
		t.Fatalf("Items = %v, want %v", got, want)
	}
	if s.Min() != 3 {
		t.Fatalf("Min = %d, want 3", s.Min())
	}
	s.Reset()
	if s.Len() != 0 || s.Total() != 0 || len(s.Items()) != 0 {
		t.Fatalf("after Reset: Len %d, Total %d, Items %v", s.Len(), s.Total(), s.Items())
	}
}

// TestMergeBounds splits a Zipf stream into six parts, as a window's
// slots do, and checks the merged bounds against the exact counts of the
// whole stream.
func TestMergeBounds(t *testing.T) {
	const (
		n = 600_000
		k = 100
	)
	stream, exact := zipf(n, 1.05, 50_000, 2)
	parts := make([]*Sketch, 6)
	for i := range parts {
		parts[i] = New(k)
	}
	for i, item := range stream {
		// Uneven parts, as traffic is: part p gets a share growing with p.
		parts[(i*i)%len(parts)].Add(item, 1)
	}
	sum := Merge(parts...)
	if sum.Total != n {
		t.Fatalf("Total = %d, want %d", sum.Total, n)
	}
	t.Logf("merged: %d items, N/k = %d, largest error %d", len(sum.Items), n/k, sum.MaxErr)
	checkBounds(t, sum.Items, sum.MaxErr, exact, n, k)
	want := trueTop(exact, 5)
	for i := range want {
		if sum.Items[i].Key != want[i].Key {
			t.Errorf("merged top %d: got %s, want %s", i+1, sum.Items[i].Key, want[i].Key)
		}
	}
}

// TestWindowForgetsOldSlots counts items in successive slots and checks
// that the window answers for its span only.
func TestWindowForgetsOldSlots(t *testing.T) {
	w := NewWindow(8, 6, 10*time.Second)
	if w.Span() != time.Minute {
		t.Fatalf("Span = %v, want 1m", w.Span())
	}
	t0 := time.Unix(1_700_000_000, 0)
	w.Add(t0, []byte("old"), 100)
	for i := range 6 {
		w.Add(t0.Add(time.Duration(i+1)*10*time.Second), []byte("new"), 1)
	}
	now := t0.Add(65 * time.Second) // the slot of t0 has left the window
	top := w.Top(now, 10)
	if len(top.Items) != 1 || top.Items[0] != (Item{Key: "new", Count: 6}) || top.Total != 6 {
		t.Fatalf("Top = %+v, want only new×6", top)
	}
	// A minute without anything: empty.
	if top := w.Top(now.Add(2*time.Minute), 10); len(top.Items) != 0 || top.Total != 0 {
		t.Fatalf("Top after two idle minutes = %+v, want empty", top)
	}
	// Before 1970, slot numbers are negative: still a place in the ring.
	w = NewWindow(8, 6, 10*time.Second)
	w.Add(time.Unix(-95, 0), []byte("early"), 1)
	w.Add(time.Unix(-175, 0), []byte("too early"), 1)
	if top := w.Top(time.Unix(-90, 0), 0); len(top.Items) != 1 || top.Items[0].Key != "early" {
		t.Fatalf("Top before 1970 = %+v", top)
	}
}

// TestWindowZipf feeds a Zipf stream over 60 seconds of a window of six
// 10-second slots and checks the merged bounds on read.
func TestWindowZipf(t *testing.T) {
	const (
		n = 300_000
		k = 64
	)
	stream, exact := zipf(n, 1.2, 20_000, 3)
	w := NewWindow(k, 6, 10*time.Second)
	t0 := time.Unix(1_700_000_000, 0)
	for i, item := range stream {
		w.Add(t0.Add(time.Duration(i)*time.Minute/n), item, 1)
	}
	top := w.Top(t0.Add(59*time.Second), 0)
	if top.Total != n {
		t.Fatalf("Total = %d, want %d", top.Total, n)
	}
	if len(top.Items) > 6*k {
		t.Fatalf("%d items, more than the %d counters of the window", len(top.Items), 6*k)
	}
	checkBounds(t, top.Items, top.MaxErr, exact, n, k)
	if cut := w.Top(t0.Add(59*time.Second), 3); len(cut.Items) != 3 || cut.Items[0] != top.Items[0] {
		t.Fatalf("Top(3) = %v, want the first 3 of %v", cut.Items, top.Items[:3])
	}
}

// TestSketchMemoryBounded feeds 300,000 distinct keys to a sketch of 100
// counters: it keeps at most 100, and the heap it retains stays small
// (a map of them all would take tens of MB).
func TestSketchMemoryBounded(t *testing.T) {
	const k = 100
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := New(k)
	buf := make([]byte, 0, 32)
	for i := range 300_000 {
		buf = fmt.Appendf(buf[:0], "distinct-key-%d", i)
		s.Add(buf, 1)
		if s.Len() > k {
			t.Fatalf("sketch holds %d counters, more than k = %d", s.Len(), k)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap grew by %d bytes for %d counters", grew, s.Len())
	if grew > 1<<20 {
		t.Errorf("heap grew by %d bytes after 300,000 distinct keys; a sketch of %d counters should hold well under 1 MiB", grew, k)
	}
	runtime.KeepAlive(s)
}

// TestAddHeldKeyDoesNotAllocate: counting a key the sketch holds costs
// no allocation, so the hot path of a hammering client is free of them.
func TestAddHeldKeyDoesNotAllocate(t *testing.T) {
	s := New(16)
	key := []byte("hammering-client")
	s.Add(key, 1)
	if n := testing.AllocsPerRun(1000, func() { s.Add(key, 1) }); n != 0 {
		t.Fatalf("Add of a held key allocates %v times", n)
	}
}

func BenchmarkSketchAdd(b *testing.B) {
	stream, _ := zipf(1<<16, 1.1, 100_000, 4)
	s := New(256)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		s.Add(stream[i&(len(stream)-1)], 1)
	}
}

func BenchmarkWindowAdd(b *testing.B) {
	stream, _ := zipf(1<<16, 1.1, 100_000, 4)
	w := NewWindow(256, 6, 10*time.Second)
	now := time.Now()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		w.Add(now, stream[i&(len(stream)-1)], 1)
	}
}
