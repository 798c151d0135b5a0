package clocktest_test

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
)

var epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func TestNowAdvanceSet(t *testing.T) {
	c := clocktest.New(epoch)
	if got := c.Now(); got != epoch {
		t.Fatalf("Now = %v, want %v", got, epoch)
	}
	c.Advance(1500 * time.Millisecond)
	if got, want := c.Now(), epoch.Add(1500*time.Millisecond); got != want {
		t.Fatalf("after Advance, Now = %v, want %v", got, want)
	}
	c.Set(epoch.Add(-time.Hour))
	if got, want := c.Now(), epoch.Add(-time.Hour); got != want {
		t.Fatalf("after Set back, Now = %v, want %v", got, want)
	}
	// Set keeps the location of New, whatever the location of its time.
	c.Set(epoch.In(time.FixedZone("east", 3600)))
	if got := c.Now(); got != epoch || got.Location() != time.UTC {
		t.Fatalf("after Set in another zone, Now = %v, want %v", got, epoch)
	}
}

func TestZeroClock(t *testing.T) {
	var c clocktest.Clock
	if got := c.Now(); !got.Equal(time.Unix(0, 0)) || got.Location() != time.Local {
		t.Fatalf("zero Clock reads %v, want the Unix epoch, local", got)
	}
	c.Advance(time.Second)
	if got := c.Now(); !got.Equal(time.Unix(1, 0)) {
		t.Fatalf("zero Clock after Advance reads %v, want 1s past the epoch", got)
	}
}

func TestTicking(t *testing.T) {
	c := clocktest.New(epoch)
	now := c.Ticking(time.Millisecond)
	for i := 1; i <= 3; i++ {
		if got, want := now(), epoch.Add(time.Duration(i)*time.Millisecond); got != want {
			t.Fatalf("read %d = %v, want %v", i, got, want)
		}
	}
	if got, want := c.Now(), epoch.Add(3*time.Millisecond); got != want {
		t.Fatalf("Now after three ticking reads = %v, want %v", got, want)
	}
}

// TestTimersAtTheirInstant holds a timer to its instant: not a nanosecond
// before, and at it exactly.
func TestTimersAtTheirInstant(t *testing.T) {
	c := clocktest.New(epoch)
	var ran []time.Time
	c.AfterFunc(time.Second, func() { ran = append(ran, c.Now()) })
	c.Advance(time.Second - time.Nanosecond)
	if len(ran) != 0 {
		t.Fatalf("timer of 1s ran %d times at 1s-1ns", len(ran))
	}
	c.Advance(time.Nanosecond)
	if want := []time.Time{epoch.Add(time.Second)}; !slices.Equal(ran, want) {
		t.Fatalf("timer ran at %v, want %v", ran, want)
	}
	c.Advance(time.Hour)
	if len(ran) != 1 {
		t.Fatalf("timer ran %d times, want once", len(ran))
	}
}

// TestTimersInOrder runs the timers one Advance passes in the order of
// their instants, and those of one instant in the order they were set.
func TestTimersInOrder(t *testing.T) {
	c := clocktest.New(epoch)
	var order []string
	for _, tm := range []struct {
		name string
		d    time.Duration
	}{{"3s", 3 * time.Second}, {"1s", time.Second}, {"2s-a", 2 * time.Second}, {"5s", 5 * time.Second}, {"2s-b", 2 * time.Second}, {"0s", 0}} {
		c.AfterFunc(tm.d, func() { order = append(order, tm.name) })
	}
	c.Advance(4 * time.Second)
	if want := []string{"0s", "1s", "2s-a", "2s-b", "3s"}; !slices.Equal(order, want) {
		t.Fatalf("timers ran in order %v, want %v", order, want)
	}
	c.Set(epoch.Add(5 * time.Second))
	if want := []string{"0s", "1s", "2s-a", "2s-b", "3s", "5s"}; !slices.Equal(order, want) {
		t.Fatalf("after Set to 5s, timers ran %v, want %v", order, want)
	}
}

// TestTimersSetBack keeps a timer when Set moves the clock back, and runs
// it when the clock reaches its instant again.
func TestTimersSetBack(t *testing.T) {
	c := clocktest.New(epoch)
	c.Advance(time.Minute)
	ran := 0
	c.AfterFunc(time.Second, func() { ran++ })
	c.Set(epoch)
	c.Advance(time.Minute)
	if ran != 0 {
		t.Fatalf("timer at 1m1s ran at 1m after a Set back")
	}
	c.Advance(time.Second)
	if ran != 1 {
		t.Fatalf("timer at 1m1s ran %d times at 1m1s, want once", ran)
	}
}

// TestTimerSetsTimer holds that a timer runs with no lock held: it reads
// the clock and sets another timer, which runs at a later Advance.
func TestTimerSetsTimer(t *testing.T) {
	c := clocktest.New(epoch)
	var ran []string
	c.AfterFunc(time.Second, func() {
		ran = append(ran, fmt.Sprint("first at ", c.Now().Sub(epoch)))
		c.AfterFunc(0, func() { ran = append(ran, fmt.Sprint("second at ", c.Now().Sub(epoch))) })
	})
	c.Advance(2 * time.Second)
	if want := []string{"first at 2s"}; !slices.Equal(ran, want) {
		t.Fatalf("after the first Advance ran %q, want %q", ran, want)
	}
	c.Advance(0)
	if want := []string{"first at 2s", "second at 2s"}; !slices.Equal(ran, want) {
		t.Fatalf("after the second Advance ran %q, want %q", ran, want)
	}
}

// TestConcurrent moves, reads and sets timers on one clock from many
// goroutines: run it with -race. The clock ends at the sum of the
// moves, and every timer runs once, each due by the Advance after it.
func TestConcurrent(t *testing.T) {
	const goroutines, moves = 8, 1000
	c := clocktest.New(epoch)
	var ran atomic.Int64
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			last := c.Now()
			for range moves {
				c.AfterFunc(time.Millisecond, func() { ran.Add(1) })
				c.Advance(time.Millisecond)
				now := c.Now()
				if now.Before(last) {
					t.Errorf("the clock went back from %v to %v", last, now)
					return
				}
				last = now
			}
		})
	}
	wg.Wait()
	if got, want := c.Now(), epoch.Add(goroutines*moves*time.Millisecond); got != want {
		t.Fatalf("Now = %v, want %v", got, want)
	}
	if got := ran.Load(); got != goroutines*moves {
		t.Fatalf("%d timers ran, want %d", got, goroutines*moves)
	}
}

// BenchmarkNowParallel is the cost of the clock to a parallel benchmark
// that reads it on every operation.
func BenchmarkNowParallel(b *testing.B) {
	c := clocktest.New(epoch)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = c.Now()
		}
	})
}
