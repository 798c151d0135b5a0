// Package topk finds the heavy hitters of a stream in bounded memory: the
// items seen most often, among any number of distinct items.
//
// [Sketch] is the Space-Saving algorithm (Metwally, Agrawal and El Abbadi,
// "Efficient Computation of Frequent and Top-k Elements in Data Streams",
// ICDT 2005) with k counters. After a stream of total weight N:
//
//   - it holds at most k items, whatever the number of distinct items;
//   - each item it holds has a count c and an error e, and the item's true
//     count lies in [c − e, c]; e is at most N/k (more precisely, at most
//     the smallest count held, [Sketch.Min], which is at most N/k);
//   - every item whose true count is above N/k is held (above Min, when the
//     sketch is full);
//   - an item not held was seen at most Min times.
//
// [Window] keeps a ring of sketches, one per slot of time, to answer for
// the last few slots only (the last minute, say), and merges them on
// read ([Merge]) with the same guarantees over the window: counts too high
// by at most N/k, N the weight the window saw, and every item above N/k
// present.
//
// The package imports nothing outside the standard library.
package topk

import (
	"cmp"
	"slices"
)

// Item is an item of a sketch or of a merge: its true count lies in
// [Count − Err, Count].
type Item struct {
	Key   string
	Count uint64
	Err   uint64
}

// counter is one of a sketch's k counters.
type counter struct {
	key   string
	count uint64
	err   uint64
}

// Sketch is a Space-Saving sketch of k counters. Its zero value is not
// usable; make one with [New]. It is not safe for concurrent use.
type Sketch struct {
	k     int
	total uint64
	// heap is a min-heap of the counters by count; index maps a key to
	// its position in heap.
	heap  []counter
	index map[string]int
}

// New returns a sketch of k counters (at least 1).
func New(k int) *Sketch {
	k = max(k, 1)
	return &Sketch{k: k, heap: make([]counter, 0, k), index: make(map[string]int, k)}
}

// Add counts weight w of item key. Looking key up does not allocate; a key
// the sketch does not hold is copied in, taking the place of the smallest
// counter when all k are in use.
func (s *Sketch) Add(key []byte, w uint64) {
	if w == 0 {
		return
	}
	s.total += w
	if i, ok := s.index[string(key)]; ok {
		s.heap[i].count += w
		s.down(i)
		return
	}
	if len(s.heap) < s.k {
		s.heap = append(s.heap, counter{key: string(key), count: w})
		i := len(s.heap) - 1
		s.index[s.heap[i].key] = i
		s.up(i)
		return
	}
	// Full: the smallest counter goes to key, which may have been seen
	// that many times, unnoticed, since it was last held.
	root := &s.heap[0]
	delete(s.index, root.key)
	root.key, root.err = string(key), root.count
	root.count += w
	s.index[root.key] = 0
	s.down(0)
}

// Total returns the weight added since the sketch was made or reset: N.
func (s *Sketch) Total() uint64 { return s.total }

// Len returns the number of counters in use, at most [Sketch.Cap].
func (s *Sketch) Len() int { return len(s.heap) }

// Cap returns k, the number of counters.
func (s *Sketch) Cap() int { return s.k }

// Min returns the most an item the sketch does not hold may have been
// seen, which is also the largest error of any count it holds: the
// smallest count when all k counters are in use, else 0 (every item seen
// is held, exactly). It is at most Total/k.
func (s *Sketch) Min() uint64 {
	if len(s.heap) < s.k {
		return 0
	}
	return s.heap[0].count
}

// Items returns the items held, largest count first (ties by key).
func (s *Sketch) Items() []Item {
	out := make([]Item, len(s.heap))
	for i, c := range s.heap {
		out[i] = Item{Key: c.key, Count: c.count, Err: c.err}
	}
	sortItems(out)
	return out
}

// Reset empties the sketch, keeping its memory.
func (s *Sketch) Reset() {
	clear(s.index)
	clear(s.heap) // drop the keys for the collector
	s.heap = s.heap[:0]
	s.total = 0
}

func (s *Sketch) less(i, j int) bool { return s.heap[i].count < s.heap[j].count }

func (s *Sketch) swap(i, j int) {
	h := s.heap
	h[i], h[j] = h[j], h[i]
	s.index[h[i].key] = i
	s.index[h[j].key] = j
}

func (s *Sketch) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			return
		}
		s.swap(i, p)
		i = p
	}
}

func (s *Sketch) down(i int) {
	n := len(s.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && s.less(r, l) {
			m = r
		}
		if !s.less(m, i) {
			return
		}
		s.swap(i, m)
		i = m
	}
}

// Summary is the merge of sketches.
type Summary struct {
	// Items are every item any of the sketches holds, largest count
	// first. Each Count is an upper bound of the item's true count over
	// all the sketches' streams, and Count − Err a lower bound.
	Items []Item
	// Total is the weight the sketches saw together: N.
	Total uint64
	// MaxErr bounds every Count's error, and the count of any item not
	// in Items: the sum of the sketches' Min. It is at most Total/k.
	MaxErr uint64
}

// Merge merges sketches of disjoint parts of one stream (of successive
// slots of time, say) into a summary of the whole. An item a sketch does
// not hold may have been seen up to that sketch's Min times there, so its
// merged Count adds that Min, and its lower bound nothing: every item's
// true count lies in [Count − Err, Count], Err ≤ MaxErr ≤ Σ Nᵢ/k = N/k for
// sketches of k counters. An item whose true count is above N/k is in
// Items: it is above Nᵢ/k in at least one part, whose sketch holds it.
func Merge(sketches ...*Sketch) Summary {
	var sum Summary
	type bounds struct{ hi, lo, missing uint64 }
	byKey := map[string]*bounds{}
	for _, s := range sketches {
		sum.Total += s.total
		sum.MaxErr += s.Min()
	}
	for _, s := range sketches {
		for _, c := range s.heap {
			b := byKey[c.key]
			if b == nil {
				b = &bounds{missing: sum.MaxErr}
				byKey[c.key] = b
			}
			b.hi += c.count
			b.lo += c.count - c.err
			b.missing -= s.Min() // held here: this sketch's Min does not apply
		}
	}
	sum.Items = make([]Item, 0, len(byKey))
	for k, b := range byKey {
		hi := b.hi + b.missing
		sum.Items = append(sum.Items, Item{Key: k, Count: hi, Err: hi - b.lo})
	}
	sortItems(sum.Items)
	return sum
}

func sortItems(items []Item) {
	slices.SortFunc(items, func(a, b Item) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
}
