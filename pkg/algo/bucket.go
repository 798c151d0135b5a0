package algo

// tokenBucket is the step of [TokenBucket]. now is in microseconds.
//
// A clock that steps back finds the last refill in its future: the bucket
// then earns nothing until the clock passes it again, unless the refill
// lies more than a window ahead, when the state is void, as if the bucket
// had refilled.
func tokenBucket(s *State, now int64, l Limit, hits uint64) Decision {
	if l.Requests == 0 {
		return refuseAll(hits)
	}
	r, b, w, at := newRate(l), int64(l.capacity()), windowMicros(l), inst{now, 0}
	tokens, last := b, at
	if s.Time != 0 {
		tokens, last = min(s.Count, b), r.stored(s.Time, s.Frac)
		switch {
		case last.cmp(at) > 0:
			if r.sub(last, at).cmp(inst{w, 0}) > 0 {
				tokens, last = b, at
			}
		case tokens < b:
			k := r.fit(r.sub(at, last), b-tokens)
			if tokens += k; tokens == b {
				last = at
			} else {
				last = r.add(last, r.cost(k))
			}
		default:
			last = at
		}
	}
	// full returns the time until the bucket holds b tokens again.
	full := func(tokens int64) int64 { return r.sub(r.add(last, r.cost(b-tokens)), at).ceil() }

	d := Decision{Remaining: uint64(tokens)}
	if tokens < b {
		d.ResetAfter = micros(full(tokens))
	}
	switch {
	case hits == 0:
		d.Allowed = true
		return d
	case hits > uint64(b):
		d.RetryAfter = Never
		return d
	case int64(hits) > tokens:
		d.RetryAfter = micros(r.sub(r.add(last, r.cost(int64(hits)-tokens)), at).ceil())
		return d
	}
	tokens -= int64(hits)
	*s = State{Time: last.us, Frac: last.f, Count: tokens}
	return Decision{Allowed: true, Remaining: uint64(tokens), ResetAfter: micros(full(tokens))}
}

// leakyBucket is the step of [LeakyBucket]. now is in microseconds.
//
// A clock that steps back finds the last leak in its future: the queue then
// does not drain until the clock passes it again, unless the leak lies more
// than a window ahead, when the state is void.
func leakyBucket(s *State, now int64, l Limit, hits uint64) Decision {
	if l.Requests == 0 {
		return refuseAll(hits)
	}
	r, b, w, at := newRate(l), int64(l.capacity()), windowMicros(l), inst{now, 0}
	level, last := s.Count, r.stored(s.Time, s.Frac)
	switch {
	case level <= 0:
		level, last = 0, at
	case last.cmp(at) > 0:
		if r.sub(last, at).cmp(inst{w, 0}) > 0 {
			level, last = 0, at
		}
	default:
		k := r.fit(r.sub(at, last), level)
		if level -= k; level == 0 {
			last = at
		} else {
			last = r.add(last, r.cost(k))
		}
	}
	// drained returns the time until a queue of level has drained.
	drained := func(level int64) int64 { return r.sub(r.add(last, r.cost(level)), at).ceil() }

	d := Decision{Remaining: uint64(max(b-level, 0))}
	if level > 0 {
		d.ResetAfter = micros(drained(level))
	}
	switch {
	case hits == 0:
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

// gcra is the step of [GCRA]. now is in microseconds.
//
// A clock that steps back finds the theoretical arrival time further
// ahead, which counts as hits spent: the key is refused for up to the step.
// A TAT more than a window further ahead than a full burst can put it is
// void.
func gcra(s *State, now int64, l Limit, hits uint64) Decision {
	if l.Requests == 0 {
		return refuseAll(hits)
	}
	r, b, w, at := newRate(l), int64(l.capacity()), windowMicros(l), inst{now, 0}
	limit := r.cost(b) // the furthest the TAT may be ahead of now
	tat := r.stored(s.Time, s.Frac)
	if tat.cmp(at) < 0 || r.sub(tat, at).cmp(inst{limit.us + w, limit.f}) > 0 {
		tat = at
	}
	ahead := r.sub(tat, at)

	d := Decision{Remaining: uint64(b - r.hitsIn(ahead, b)), ResetAfter: micros(ahead.ceil())}
	switch {
	case hits == 0:
		d.Allowed = true
		return d
	case hits > uint64(b):
		d.RetryAfter = Never
		return d
	}
	next := r.add(tat, r.cost(int64(hits)))
	ahead = r.sub(next, at)
	if ahead.cmp(limit) > 0 {
		d.RetryAfter = micros(r.sub(ahead, limit).ceil())
		return d
	}
	*s = State{Time: next.us, Frac: next.f}
	return Decision{Allowed: true, Remaining: uint64(b - r.hitsIn(ahead, b)), ResetAfter: micros(ahead.ceil())}
}
