package algo

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestReservationSlotsBounded: reservations made with TTLs that change at
// every call, so that no two share a slot, stay within
// maxReservationSlots entries, hold every hit reserved, and keep their
// order; a reservation past the cap joins the latest slot of its window,
// which ends no earlier than either. Without the cap the entries would
// grow with every reservation.
func TestReservationSlotsBounded(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	l := Limit{Algorithm: FixedWindow, Requests: 1 << 40, Window: time.Hour}
	now := time.Unix(1_700_000_040, 0)
	var s State
	var reserved uint64
	for i := range 200 {
		hits := 1 + rng.Uint64N(5)
		ttl := time.Duration(200+rng.Int64N(600)) * time.Second // none ends within the test
		d := reserve(&s, now.UnixMicro(), l, hits, ttl.Microseconds())
		if !d.Allowed || d.Taken != hits {
			t.Fatalf("reservation %d refused: %+v", i, d)
		}
		reserved += hits
		rs := reservations(s.Log)
		if len(rs)%rsvStride != 0 || len(rs)/rsvStride > maxReservationSlots {
			t.Fatalf("after %d reservations: %d values, want at most %d entries", i+1, len(rs), maxReservationSlots)
		}
		if held := uint64(rs.heldIn(s.Time)); held != reserved {
			t.Fatalf("after %d reservations: %d held, want %d", i+1, held, reserved)
		}
		for j := rsvStride; j < len(rs); j += rsvStride {
			if rs[j] < rs[j-rsvStride] {
				t.Fatalf("entries out of order: %v", rs)
			}
		}
		if last := rs.lastEnd(); last < d.Mark {
			t.Fatalf("the latest slot ends at %d, before the reservation's end %d", last, d.Mark)
		}
		now = now.Add(time.Duration(rng.Int64N(int64(time.Second))))
	}
	if len(s.Log)/rsvStride != maxReservationSlots {
		t.Fatalf("%d entries after 200 reservations of distinct slots, want the cap %d", len(s.Log)/rsvStride, maxReservationSlots)
	}
}

// TestReleaseHoldsNothingBelowZero: settles with no reservation
// outstanding release nothing and charge the window; held never goes
// below zero, and a quadruple's reservations release all its hits, the
// last one the rest.
func TestReleaseHoldsNothingBelowZero(t *testing.T) {
	l := Limit{Algorithm: FixedWindow, Requests: 100, Window: time.Minute}
	now := time.Unix(1_700_000_040, 0).UnixMicro()
	var s State
	for range 3 {
		reserve(&s, now, l, 7, time.Second.Microseconds())
	}
	var released uint64
	for i := range 5 {
		d := settle(&s, now, l, 1)
		released += d.Taken
		if i >= 3 && d.Taken != 0 {
			t.Fatalf("settle %d released %d with none outstanding", i, d.Taken)
		}
	}
	if released != 21 || len(s.Log) != 0 || s.Count != 5 {
		t.Fatalf("released %d (want 21), reservations %v (want none), count %d (want 5)", released, s.Log, s.Count)
	}
}
