package algo

// tokenBucketOp is [tokenBucket], also for a take or a give (o.op).
//
// A clock that steps back finds the last refill in its future: the bucket
// then earns nothing until the clock passes it again, unless the refill
// lies more than a window ahead, when the state is void, as if the bucket
// had refilled.
//
// Leases outstanding (s.Log, see [leases]) hold tokens outside the bucket:
// until each lease ends, the bucket refills only up to B less the hits of
// the leases outstanding, so the tokens in the bucket and in leases never
// exceed B and a leased bucket admits no more in any interval than an
// exact one (docs/leasing.md). [rate.refill] follows the cap through the
// ends of the leases.
func tokenBucketOp(s *State, now int64, l Limit, hits uint64, o leaseOp) Decision {
	if l.Requests == 0 {
		if o.op == OpGive {
			return Decision{Allowed: true}
		}
		return refuseAll(hits)
	}
	r, b, w, at := newRate(l), int64(l.capacity()), windowMicros(l), inst{now, 0}
	held := leases(s.Log)
	live := held.live(now)
	tokens, last := b-min(held.hits(), b), at
	if s.Time != 0 {
		tokens, last = min(s.Count, b-min(held.hits(), b)), r.stored(s.Time, s.Frac)
		switch {
		case last.cmp(at) > 0:
			if r.sub(last, at).cmp(inst{w, 0}) > 0 {
				tokens, last = b-min(live.hits(), b), at
			}
		default:
			tokens, last = r.refill(tokens, last, b, held, at)
		}
	}
	if o.op == opCount {
		// Into debt, by at most N tokens: the hits' cost beyond that would
		// keep the key refused for longer than a window.
		n := int64(l.Requests)
		tokens = max(tokens-int64(min(hits, uint64(b+n))), -n)
		*s = State{Time: last.us, Frac: last.f, Count: tokens, Log: live}
		return Decision{}
	}
	// until returns the time until the bucket holds k tokens.
	until := func(k, tokens int64, live leases) int64 { return r.until(k, tokens, last, b, live, at) }
	// keep stores the bucket with tokens and the leases live.
	keep := func(tokens int64, live leases) {
		*s = State{Time: last.us, Frac: last.f, Count: tokens, Log: live}
	}

	d := Decision{Remaining: uint64(max(tokens, 0))} // tokens < 0: a debt (opCount)
	if tokens < b {
		d.ResetAfter = micros(until(b, tokens, live))
	}
	if o.op == OpGive {
		live, n := live.without(o.mark, int64(min(hits, uint64(b))))
		if tokens += n; tokens == b {
			*s = State{}
			return Decision{Allowed: true, Remaining: uint64(b)}
		}
		keep(tokens, live)
		return Decision{Allowed: true, Remaining: uint64(max(tokens, 0)), ResetAfter: micros(until(b, tokens, live))}
	}
	switch {
	case hits == 0 && o.op != OpTake && !(o.strict && tokens < 0):
		d.Allowed = true
		return d
	case hits > uint64(b):
		d.RetryAfter = Never
		return d
	case int64(hits) > tokens:
		d.RetryAfter = micros(until(int64(hits), tokens, live))
		return d
	}
	taken := o.taken(hits, uint64(tokens))
	if taken == 0 {
		d.Allowed = true
		return d
	}
	tokens -= int64(taken)
	live = o.hold(live, now, taken, hits)
	keep(tokens, live)
	d = Decision{Allowed: true, Remaining: uint64(tokens), ResetAfter: micros(until(b, tokens, live))}
	o.report(&d, now, taken, hits)
	return d
}

// refill returns the tokens of a bucket of capacity b at to, and the
// instant of its last refill, when it held tokens at last with the leases
// ls outstanding: the bucket earns one token per emission interval up to b
// less the leases not yet ended, and a cap that rises when a lease ends
// restarts the refill at that end.
func (r rate) refill(tokens int64, last inst, b int64, ls leases, to inst) (int64, inst) {
	c := b - min(ls.hits(), b)
	for i := 0; i < len(ls) && ls[i] <= to.us; i += 2 {
		tokens, last = r.refillTo(tokens, last, c, inst{ls[i], 0})
		c = min(c+ls[i+1], b)
	}
	return r.refillTo(tokens, last, c, to)
}

// refillTo refills a bucket holding tokens at last up to the cap c until
// to, and returns its tokens and the instant of its last refill.
func (r rate) refillTo(tokens int64, last inst, c int64, to inst) (int64, inst) {
	switch {
	case last.cmp(to) > 0:
		return tokens, last
	case tokens >= c:
		return tokens, to
	}
	k := r.fit(r.sub(to, last), c-tokens)
	if tokens += k; tokens == c {
		return tokens, to
	}
	return tokens, r.add(last, r.cost(k))
}

// until returns the time from at until a bucket of capacity b, holding
// tokens refilled at last with the leases live outstanding (all ending
// after at), holds k tokens, k at most b.
func (r rate) until(k, tokens int64, last inst, b int64, live leases, at inst) int64 {
	if tokens >= k {
		return 0
	}
	c := b - min(live.hits(), b)
	for i := 0; i < len(live); i += 2 {
		e := inst{live[i], 0}
		if c >= k {
			if t := r.add(last, r.cost(k-tokens)); t.cmp(e) <= 0 {
				return r.sub(t, at).ceil()
			}
		}
		tokens, last = r.refillTo(tokens, last, c, e)
		c = min(c+live[i+1], b)
	}
	return r.sub(r.add(last, r.cost(k-tokens)), at).ceil()
}

// leakyBucket is the step of [LeakyBucket]. now is in microseconds.
//
// A clock that steps back finds the last leak in its future: the queue then
// does not drain until the clock passes it again, unless the leak lies more
// than a window ahead, when the state is void.
func leakyBucket(s *State, now int64, l Limit, hits uint64, strict bool) Decision {
	if l.Requests == 0 {
		return refuseAll(hits)
	}
	r, b, at := newRate(l), int64(l.capacity()), inst{now, 0}
	level, last := r.drain(s, at, windowMicros(l))
	// drained returns the time until a queue of level has drained.
	drained := func(level int64) int64 { return r.sub(r.add(last, r.cost(level)), at).ceil() }

	d := Decision{Remaining: uint64(max(b-level, 0))}
	if level > 0 {
		d.ResetAfter = micros(drained(level))
	}
	switch {
	case hits == 0 && !(strict && level > b):
		d.Allowed = true
		return d
	case hits > uint64(b):
		d.RetryAfter = Never
		return d
	case level+int64(hits) > b:
		d.RetryAfter = micros(drained(level + int64(hits) - b))
		return d
	}
	wait := d.ResetAfter
	level += int64(hits)
	*s = State{Time: last.us, Frac: last.f, Count: level}
	return Decision{Allowed: true, Remaining: uint64(b - level), ResetAfter: micros(drained(level)), Wait: wait}
}

// drain returns the level of the queue s holds at at, and the instant of
// its last leak, for a window of w µs: a queue leaks one hit per emission
// interval. A last leak more than a window ahead of at (a clock stepped
// back) is void.
func (r rate) drain(s *State, at inst, w int64) (int64, inst) {
	level, last := s.Count, r.stored(s.Time, s.Frac)
	switch {
	case level <= 0:
		return 0, at
	case last.cmp(at) > 0:
		if r.sub(last, at).cmp(inst{w, 0}) > 0 {
			return 0, at
		}
		return level, last
	}
	k := r.fit(r.sub(at, last), level)
	if level -= k; level == 0 {
		return 0, at
	}
	return level, r.add(last, r.cost(k))
}

// gcraOp is [gcra], also for a take or a give (o.op).
//
// A clock that steps back finds the theoretical arrival time further
// ahead, which counts as hits spent: the key is refused for up to the step.
// A TAT more than a window further ahead than a full burst can put it is
// void.
//
// Leases outstanding (s.Log, see [leases]) count as hits spent until they
// end: at every instant, the TAT is at least that instant plus the
// emission time of the leases outstanding then, as the token bucket's
// refill stops short of their hits. The TAT read at now is therefore at
// least each lease end e (ended by now) plus the emission time of the
// leases outstanding just before e, and now plus that of the leases
// outstanding.
func gcraOp(s *State, now int64, l Limit, hits uint64, o leaseOp) Decision {
	if l.Requests == 0 {
		if o.op == OpGive {
			return Decision{Allowed: true}
		}
		return refuseAll(hits)
	}
	r, b, w, at := newRate(l), int64(l.capacity()), windowMicros(l), inst{now, 0}
	limit := r.cost(b) // the furthest the TAT may be ahead of now
	tat := r.stored(s.Time, s.Frac)
	if tat.cmp(at) < 0 || r.sub(tat, at).cmp(inst{limit.us + w, limit.f}) > 0 {
		tat = at
	}
	held := leases(s.Log)
	out := held.hits()
	for i := 0; i < len(held) && held[i] <= now; i += 2 {
		tat = later(tat, r.add(inst{held[i], 0}, r.cost(min(out, b))))
		out -= held[i+1]
	}
	tat = later(tat, r.add(at, r.cost(min(out, b))))
	live := held.live(now)
	if o.op == opCount {
		// The TAT moves ahead by the hits' emission time, at most to B + N
		// emission times ahead of now (a debt of N), which is not void.
		n := int64(l.Requests)
		next := r.add(tat, r.cost(int64(min(hits, uint64(b+n)))))
		if most := r.add(at, r.cost(b+n)); next.cmp(most) > 0 {
			next = most
		}
		*s = State{Time: next.us, Frac: next.f, Log: live}
		return Decision{}
	}
	// reset returns the time until the TAT is behind now for good: a full
	// bucket, once every lease has ended.
	reset := func(tat inst, live leases) int64 {
		out := live.hits()
		for i := 0; i < len(live); i += 2 {
			tat = later(tat, r.add(inst{live[i], 0}, r.cost(min(out, b))))
			out -= live[i+1]
		}
		return max(r.sub(tat, at).ceil(), 0)
	}
	// retry returns the time until hits fit: within a burst of the TAT,
	// and with the leases then outstanding.
	retry := func(hits int64) int64 {
		t, start, out := tat, at, live.hits()
		for i := 0; out+hits > b; i += 2 {
			start = inst{live[i], 0}
			t = later(t, r.add(start, r.cost(min(out, b))))
			out -= live[i+1]
		}
		return r.sub(later(start, r.sub(r.add(t, r.cost(hits)), limit)), at).ceil()
	}
	remaining := func(tat inst) uint64 { return uint64(b - r.hitsIn(r.sub(tat, at), b)) }

	d := Decision{Remaining: remaining(tat), ResetAfter: micros(reset(tat, live))}
	if o.op == OpGive {
		live, n := live.without(o.mark, int64(min(hits, uint64(b))))
		if tat = r.sub(tat, r.cost(n)); tat.cmp(at) <= 0 && len(live) == 0 {
			*s = State{}
			return Decision{Allowed: true, Remaining: uint64(b)}
		}
		tat = later(tat, at)
		*s = State{Time: tat.us, Frac: tat.f, Log: live}
		return Decision{Allowed: true, Remaining: remaining(tat), ResetAfter: micros(reset(tat, live))}
	}
	switch {
	case hits == 0 && o.op != OpTake && !(o.strict && r.sub(tat, at).cmp(limit) > 0):
		d.Allowed = true
		return d
	case hits > uint64(b):
		d.RetryAfter = Never
		return d
	}
	if r.sub(r.add(tat, r.cost(int64(hits))), at).cmp(limit) > 0 {
		d.RetryAfter = micros(retry(int64(hits)))
		return d
	}
	taken := o.taken(hits, d.Remaining)
	if taken == 0 {
		d.Allowed = true
		return d
	}
	next := r.add(tat, r.cost(int64(taken))) // taken fits what remained: within limit
	live = o.hold(live, now, taken, hits)
	*s = State{Time: next.us, Frac: next.f, Log: live}
	d = Decision{Allowed: true, Remaining: remaining(next), ResetAfter: micros(reset(next, live))}
	o.report(&d, now, taken, hits)
	return d
}

// later returns the later of a and b.
func later(a, b inst) inst {
	if a.cmp(b) < 0 {
		return b
	}
	return a
}
