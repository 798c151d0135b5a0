// Package clocktest is the fake clock of ratelimitd's tests: a clock that
// moves only when a test moves it, and runs the functions set with
// AfterFunc when it passes their instant.
//
// Production code takes its time as Options.Now (and, in pkg/rlqs,
// Options.AfterFunc); a test hands it the methods of one Clock:
//
//	clk := clocktest.New(time.Unix(1_700_000_040, 0))
//	b := memory.New(memory.Options{Now: clk.Now})
//	clk.Advance(time.Minute)
//
// A Clock is safe for concurrent use. Now is one atomic load, so that
// parallel benchmarks do not contend on it; only the timers take a lock.
package clocktest

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Clock is a fake clock, safe for concurrent use. The zero Clock reads the
// Unix epoch in the local time zone; New starts one elsewhere.
type Clock struct {
	ns  atomic.Int64   // the time, in nanoseconds since the Unix epoch
	loc *time.Location // where Now reports the time; nil for time.Local. Set by New only.

	mu     sync.Mutex
	timers []timer // in the order AfterFunc set them
}

// timer is a function AfterFunc set to run at an instant.
type timer struct {
	at int64 // nanoseconds since the Unix epoch
	f  func()
}

// New returns a Clock reading t. Now reports times in t's location.
func New(t time.Time) *Clock {
	c := &Clock{loc: t.Location()}
	c.ns.Store(t.UnixNano())
	return c
}

// Now returns the clock's time. It has no monotonic reading, and is in the
// location of the time given to New. Its method value is what Options.Now
// of the production packages takes.
func (c *Clock) Now() time.Time {
	return c.at(c.ns.Load())
}

// Ticking returns a Now function that moves the clock d on each time it is
// read, and returns the time it moved to: the first read is d past the
// clock's time. Reads are atomic, so concurrent readers each see their
// own instant. It stands for a clock that every reader sees pass, such as
// a service timing each backend call as d long.
func (c *Clock) Ticking(d time.Duration) func() time.Time {
	return func() time.Time { return c.at(c.ns.Add(int64(d))) }
}

// Advance moves the clock d on, then runs the functions of AfterFunc that
// are due: those whose instant is at or before the clock's new time. It
// runs them on the calling goroutine, in the order of their instants (in
// the order they were set, for the same instant), with no lock held, so
// that they may read the clock and set new timers. A timer a function
// sets runs at a later Advance or Set, even if it is already due.
func (c *Clock) Advance(d time.Duration) {
	c.ns.Add(int64(d))
	c.fire()
}

// Set moves the clock to t, then runs the functions of AfterFunc that are
// due, as Advance does. t may be earlier than the clock's time: the clock
// goes back, and no timer runs until the clock reaches its instant again.
// Now keeps reporting times in the location of the time given to New.
func (c *Clock) Set(t time.Time) {
	c.ns.Store(t.UnixNano())
	c.fire()
}

// AfterFunc sets f to run once the clock reaches d past its current time,
// when an Advance or Set takes it there: a d of zero or less runs f at the
// next Advance or Set. Its method value is what rlqs.Options.AfterFunc
// takes. Unlike time.AfterFunc, f runs on the goroutine moving the clock.
func (c *Clock) AfterFunc(d time.Duration, f func()) {
	c.mu.Lock()
	c.timers = append(c.timers, timer{at: c.ns.Load() + int64(d), f: f})
	c.mu.Unlock()
}

// fire runs the timers due at the clock's time, in the order of their
// instants, outside the lock.
func (c *Clock) fire() {
	c.mu.Lock()
	now := c.ns.Load()
	var due []timer
	kept := c.timers[:0]
	for _, tm := range c.timers {
		if tm.at <= now {
			due = append(due, tm)
		} else {
			kept = append(kept, tm)
		}
	}
	clear(c.timers[len(kept):]) // let the functions that ran be collected
	c.timers = kept
	c.mu.Unlock()
	slices.SortStableFunc(due, func(a, b timer) int { return cmp.Compare(a.at, b.at) })
	for _, tm := range due {
		tm.f()
	}
}

// at returns the time ns nanoseconds after the Unix epoch, in the clock's
// location.
func (c *Clock) at(ns int64) time.Time {
	t := time.Unix(0, ns)
	if c.loc != nil {
		t = t.In(c.loc)
	}
	return t
}
