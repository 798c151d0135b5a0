package topk

import (
	"sync"
	"time"
)

// Window counts items over the last few slots of time: a ring of
// sketches, one per slot, each of k counters. It is safe for concurrent
// use: a mutex guards the ring.
//
// Its memory is bounded by slots × k counters, whatever the number of
// distinct items; each counter holds a copy of its key, so bound the keys'
// length too.
type Window struct {
	slot time.Duration
	mu   sync.Mutex
	ring []windowSlot
}

type windowSlot struct {
	used   bool
	epoch  int64 // slot number (time / slot duration) the sketch counts
	sketch *Sketch
}

// NewWindow returns a window of slots slots of duration slot each, with a
// sketch of k counters per slot. It answers for the current slot and the
// slots−1 before it: between (slots−1)×slot and slots×slot of time.
func NewWindow(k, slots int, slot time.Duration) *Window {
	slots = max(slots, 1)
	if slot <= 0 {
		slot = time.Second
	}
	w := &Window{slot: slot, ring: make([]windowSlot, slots)}
	for i := range w.ring {
		w.ring[i] = windowSlot{sketch: New(k)}
	}
	return w
}

// Span returns the longest time the window answers for: slots × slot.
func (w *Window) Span() time.Duration { return w.slot * time.Duration(len(w.ring)) }

// Cap returns the number of counters of each slot's sketch: k.
func (w *Window) Cap() int { return w.ring[0].sketch.Cap() }

func (w *Window) epoch(now time.Time) int64 {
	ns, d := now.UnixNano(), int64(w.slot)
	e := ns / d
	if ns%d < 0 {
		e-- // floor: before 1970 too, a slot is [e×slot, (e+1)×slot)
	}
	return e
}

// index returns the place of slot number e in the ring.
func (w *Window) index(e int64) int {
	n := int64(len(w.ring))
	return int((e%n + n) % n)
}

// Add counts weight n of key at time now.
func (w *Window) Add(now time.Time, key []byte, n uint64) {
	e := w.epoch(now)
	w.mu.Lock()
	s := &w.ring[w.index(e)]
	switch {
	case s.used && s.epoch == e:
	case s.used && s.epoch > e:
		// Older than what the ring holds (a clock stepping back): count
		// it in the slot of its time's place, as if it were now.
	default:
		s.sketch.Reset()
		s.used, s.epoch = true, e
	}
	s.sketch.Add(key, n)
	w.mu.Unlock()
}

// Top returns the merge ([Merge]) of the slots within the window at time
// now, its Items cut to the n largest (all when n ≤ 0).
func (w *Window) Top(now time.Time, n int) Summary {
	e := w.epoch(now)
	w.mu.Lock()
	var live []*Sketch
	for i := range w.ring {
		if s := &w.ring[i]; s.used && s.epoch > e-int64(len(w.ring)) {
			live = append(live, s.sketch)
		}
	}
	sum := Merge(live...)
	w.mu.Unlock()
	if n > 0 && len(sum.Items) > n {
		sum.Items = sum.Items[:n]
	}
	return sum
}
