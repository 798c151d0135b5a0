package client

import (
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// waitQueues hold the requests a [Middleware] with MaxWait makes wait:
// one queue per domain and descriptors, first in, first out (see
// [Middleware]).
type waitQueues struct {
	max int // MaxWaiting

	mu      sync.Mutex
	waiting int                   // the requests in all queues
	queues  map[string]*waitQueue // by queueKey; a queue leaves when it empties
}

// waitQueue is the requests waiting for one domain and descriptors.
type waitQueue struct {
	key string
	// waiters are in the order they joined; the first asks ratelimitd.
	waiters []*waiter
	// notBefore is the instant before which the last refusal said the
	// first is not admitted, and last that refusal.
	notBefore time.Time
	last      Decision
}

// waiter is a request in a queue.
type waiter struct {
	deadline time.Time // its arrival plus MaxWait
	// wake is sent one message at most: that it is first of its queue
	// now, or that it is refused. It has room for it, so that whoever
	// sends it never blocks.
	wake chan wakeup
}

// wakeup is a message to a waiter.
type wakeup struct {
	first bool
	d     Decision // the refusal, unless first
}

// serve decides r, whose descriptors are ds, and answers it as e says;
// when it is refused, it waits in its queue first.
func (qs *waitQueues) serve(e *enforcer, w http.ResponseWriter, r *http.Request, ds []Descriptor) {
	deadline := time.Now().Add(e.opts.MaxWait)
	key := queueKey(e.opts.Domain, ds)
	qs.mu.Lock()
	q := qs.queues[key]
	if q == nil {
		// Nobody with these descriptors waits: ask.
		qs.mu.Unlock()
		d, err := e.l.Allow(r.Context(), e.opts.Domain, ds...)
		if err != nil || d.Allowed || d.RetryAfter == Never || d.RetryAfter > e.opts.MaxWait {
			e.answer(w, r, d, err)
			return
		}
		until := time.Now().Add(retryPause(d))
		qs.mu.Lock()
		if q = qs.queues[key]; q == nil {
			// A queue whose first is refused until then; it is added to
			// qs.queues with its first waiter.
			q = &waitQueue{key: key, notBefore: until, last: d}
		}
	}
	// Wait behind those who wait already, unless the queue is full or the
	// first of it is not admitted before MaxWait ends.
	refusal := q.refusal(time.Now())
	if qs.waiting >= qs.max || q.notBefore.After(deadline) {
		qs.mu.Unlock()
		e.answer(w, r, refusal, nil)
		return
	}
	wt := &waiter{deadline: deadline, wake: make(chan wakeup, 1)}
	q.waiters = append(q.waiters, wt)
	qs.waiting++
	if len(q.waiters) == 1 {
		qs.queues[key] = q
		wt.wake <- wakeup{first: true}
	}
	qs.mu.Unlock()
	if e.opts.OnWait != nil {
		e.opts.OnWait(r, refusal)
	}
	qs.wait(e, w, r, ds, q, wt)
}

// wait holds r, waiter wt of q, until its turn, then asks ratelimitd
// until r is admitted, refused for good or past its MaxWait, and answers
// it.
func (qs *waitQueues) wait(e *enforcer, w http.ResponseWriter, r *http.Request, ds []Descriptor, q *waitQueue, wt *waiter) {
	ctx := r.Context()
	timer := time.NewTimer(time.Until(wt.deadline))
	defer timer.Stop()
	select {
	case m := <-wt.wake:
		if !m.first {
			e.answer(w, r, m.d, nil)
			return
		}
	case <-timer.C:
		e.answer(w, r, qs.leave(q, wt), nil)
		return
	case <-ctx.Done():
		e.answer(w, r, qs.leave(q, wt), nil)
		return
	}
	// First of the queue: ask when the last refusal says the limit may
	// admit it.
	for {
		qs.mu.Lock()
		notBefore := q.notBefore
		qs.mu.Unlock()
		now := time.Now()
		if notBefore.After(wt.deadline) || now.After(wt.deadline) {
			e.answer(w, r, qs.leave(q, wt), nil)
			return
		}
		if pause := notBefore.Sub(now); pause > 0 {
			pause = min(pause+jitter(pause, rand.Int64N), wt.deadline.Sub(now))
			if sleep(ctx, pause) != nil {
				e.answer(w, r, qs.leave(q, wt), nil)
				return
			}
		}
		d, err := e.l.Allow(ctx, e.opts.Domain, ds...)
		if err != nil || d.Allowed || d.RetryAfter == Never {
			qs.leave(q, wt)
			e.answer(w, r, d, err)
			return
		}
		qs.refused(q, d, time.Now())
	}
}

// refused records d, the refusal of the first of q at now, and answers
// the waiters behind it whose MaxWait ends before it can be admitted:
// none of them is admitted before it.
func (qs *waitQueues) refused(q *waitQueue, d Decision, now time.Time) {
	until := now.Add(retryPause(d))
	qs.mu.Lock()
	defer qs.mu.Unlock()
	q.notBefore, q.last = until, d
	kept := q.waiters[:1]
	for _, o := range q.waiters[1:] {
		if o.deadline.Before(until) {
			o.wake <- wakeup{d: q.refusal(now)}
			qs.waiting--
			continue
		}
		kept = append(kept, o)
	}
	clear(q.waiters[len(kept):])
	q.waiters = kept
}

// leave takes wt out of q, the next waiter becoming first when wt was,
// and returns the refusal to answer it with: the one it was sent, when it
// was refused meanwhile, or the last of q.
func (qs *waitQueues) leave(q *waitQueue, wt *waiter) Decision {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	i := slices.Index(q.waiters, wt)
	if i < 0 {
		// Refused while it left: the refusal is in wake already.
		return (<-wt.wake).d
	}
	q.waiters = slices.Delete(q.waiters, i, i+1)
	qs.waiting--
	switch {
	case len(q.waiters) == 0:
		if qs.queues[q.key] == q {
			delete(qs.queues, q.key)
		}
	case i == 0:
		q.waiters[0].wake <- wakeup{first: true}
	}
	return q.refusal(time.Now())
}

// refusal returns the last refusal of q, its RetryAfter counted from now,
// with results of its own.
func (q *waitQueue) refusal(now time.Time) Decision {
	d := q.last
	d.RetryAfter = max(q.notBefore.Sub(now), 0)
	d.Results = slices.Clone(d.Results)
	return d
}

// retryPause is the time after which the first of a queue refused with d
// asks again: its RetryAfter, or DefaultBackoffBase for a refusal that
// tells none (Envoy's API may not), rather than ask again at once.
func retryPause(d Decision) time.Duration {
	if d.RetryAfter <= 0 {
		return DefaultBackoffBase
	}
	return d.RetryAfter
}

// queueKey names the queue of requests of domain for descriptors ds, the
// hits they ask for aside.
func queueKey(domain string, ds []Descriptor) string {
	b := appendField(nil, domain)
	for _, d := range ds {
		b = append(strconv.AppendInt(b, int64(len(d.Entries)), 10), '/')
		for _, e := range d.Entries {
			b = appendField(appendField(b, e.Key), e.Value)
		}
	}
	return string(b)
}

// appendField appends s to b, prefixed with its length so that no two
// lists of fields give the same bytes.
func appendField(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}
