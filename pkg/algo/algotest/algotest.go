// Package algotest is the conformance suite of the rate-limit algorithms:
// hand-computed vectors, sequences of {at, hits, want}, that every
// implementation of an [algo.Algorithm] must reproduce exactly. The same
// vectors run against the Go step functions ([algo.Step]), the in-memory
// backend and the Lua scripts in a real Redis, which is what makes the
// implementations twins rather than look-alikes.
//
// Use it like testing/slogtest: wrap the implementation in a [Subject] and
// call [Run] from a test.
package algotest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Epoch is the instant the vectors count from. It falls on a whole minute,
// so epoch-aligned windows of a second or a minute start exactly there.
var Epoch = time.Unix(1_700_000_040, 0)

// Subject decides a batch of requests at an instant the suite chooses. Its
// Decide has the semantics of [algo.Backend.Decide], with the clock given.
type Subject interface {
	Decide(ctx context.Context, now time.Time, reqs []algo.Request, out []algo.Decision) error
}

// Step is one request of a vector: Hits at Epoch+At, and the decision it
// must get.
type Step struct {
	At   time.Duration
	Hits uint64
	Want algo.Decision
}

// LeaseStep is a Step that may take or give back a lease (see
// [algo.OpTake]): Op with the arguments in Lease.
type LeaseStep struct {
	Step
	Op     algo.Op
	Lease  algo.Lease
	Holder algo.Holder // of a concurrency op
}

// LeaseCase is a vector of lease steps on one fresh key.
type LeaseCase struct {
	Name  string
	Limit algo.Limit
	Steps []LeaseStep
}

// Case is one vector: a limit and the steps applied to one fresh key.
type Case struct {
	Name  string
	Limit algo.Limit
	Steps []Step
}

// Run runs every case of [Cases], [CountCases], [LeaseCases],
// [ReserveCases] and [ConcurrencyCases] against a fresh subject from newSubject, each case on
// its own key, one request at a time.
func Run(t *testing.T, newSubject func(t *testing.T) Subject) {
	t.Helper()
	type run struct {
		LeaseCase
		count bool // every request counts its hits (CountCases)
	}
	var cs []run
	plain := Cases()
	for i, c := range append(plain, CountCases()...) {
		steps := make([]LeaseStep, len(c.Steps))
		for i, st := range c.Steps {
			steps[i].Step = st
		}
		cs = append(cs, run{LeaseCase{c.Name, c.Limit, steps}, i >= len(plain)})
	}
	for _, c := range append(append(LeaseCases(), ReserveCases()...), ConcurrencyCases()...) {
		cs = append(cs, run{LeaseCase: c})
	}
	for _, c := range cs {
		t.Run(c.Limit.Algorithm.String()+"/"+c.Name, func(t *testing.T) {
			s := newSubject(t)
			key := []byte(fmt.Sprintf("algotest|%s|%s", c.Limit.Algorithm, c.Name))
			reqs := []algo.Request{{Key: key, Limit: c.Limit, Count: c.count}}
			out := make([]algo.Decision, 1)
			for i, st := range c.Steps {
				reqs[0].Hits, reqs[0].Op, reqs[0].Lease, reqs[0].Holder = st.Hits, st.Op, st.Lease, st.Holder
				if err := s.Decide(context.Background(), Epoch.Add(st.At), reqs, out); err != nil {
					t.Fatalf("step %d (at %v, hits %d, op %d): %v", i, st.At, st.Hits, st.Op, err)
				}
				if out[0] != st.Want {
					t.Fatalf("step %d (at %v, hits %d, op %d):\n got %s\nwant %s", i, st.At, st.Hits, st.Op, Format(out[0]), Format(st.Want))
				}
			}
		})
	}
}

// RunBatches runs every case of [BatchCases] against a fresh subject from
// newSubject: the batch contract of [algo.Backend], which backends keep
// and step functions alone do not.
func RunBatches(t *testing.T, newSubject func(t *testing.T) Subject) {
	t.Helper()
	for _, c := range BatchCases() {
		t.Run("batch/"+c.Name, func(t *testing.T) {
			s := newSubject(t)
			reqs := make([]algo.Request, len(c.Requests))
			for i, r := range c.Requests {
				reqs[i] = algo.Request{Key: []byte("algotest|batch|" + c.Name + "|" + r.Key), Limit: r.Limit, Shadow: r.Shadow, Peek: r.Peek, Count: r.Count}
			}
			for i, st := range c.Steps {
				for j := range reqs {
					reqs[j].Hits = st.Hits[j]
				}
				out := make([]algo.Decision, len(reqs))
				if err := s.Decide(context.Background(), Epoch.Add(st.At), reqs, out); err != nil {
					t.Fatalf("step %d (at %v): %v", i, st.At, err)
				}
				for j := range reqs {
					if out[j] != st.Want[j] {
						t.Fatalf("step %d (at %v), request %d (key %s, hits %d):\n got %s\nwant %s",
							i, st.At, j, c.Requests[j].Key, st.Hits[j], Format(out[j]), Format(st.Want[j]))
					}
				}
			}
		})
	}
}

// Format prints a decision compactly, for failure messages.
func Format(d algo.Decision) string {
	retry := d.RetryAfter.String()
	if d.RetryAfter == algo.Never {
		retry = "never"
	}
	if d.Taken == 0 && d.Mark == 0 && d.Valid == 0 {
		return fmt.Sprintf("{allowed %v, remaining %d, reset %v, retry %s, wait %v}", d.Allowed, d.Remaining, d.ResetAfter, retry, d.Wait)
	}
	return fmt.Sprintf("{allowed %v, remaining %d, reset %v, retry %s, wait %v, taken %d, mark %d, valid %v}",
		d.Allowed, d.Remaining, d.ResetAfter, retry, d.Wait, d.Taken, d.Mark, d.Valid)
}

// BatchCase is a vector of batches: several requests decided together, as
// one atomic [algo.Backend.Decide].
type BatchCase struct {
	Name     string
	Requests []BatchRequest
	Steps    []BatchStep
}

// BatchRequest is one request of every batch of a [BatchCase]. Requests
// with the same Key share state.
type BatchRequest struct {
	Key    string
	Limit  algo.Limit
	Shadow bool
	Peek   bool
	Count  bool
}

// BatchStep is one batch: Hits[i] for request i at Epoch+At, and the
// decisions wanted.
type BatchStep struct {
	At   time.Duration
	Hits []uint64
	Want []algo.Decision
}
