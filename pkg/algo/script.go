package algo

import (
	"embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// scriptParts returns the Lua files of the decision script, in the order
// they are joined: helpers, every algorithm's twin (lua/<name>.lua, named
// as rule files name it), then the driver.
func scriptParts() []string {
	parts := []string{"common.lua"}
	for _, a := range append(Algorithms(), Concurrency) {
		parts = append(parts, a.String()+".lua")
	}
	return append(parts, "decide.lua")
}

// Script returns the Lua decision script: every algorithm's twin of its Go
// step function and a driver that decides a batch atomically, with the
// semantics of [Backend.Decide]. Its KEYS/ARGV/return contract opens
// lua/decide.lua; [AppendScriptArgs] builds the ARGV and
// [ParseScriptReply] reads the reply.
func Script() string {
	var b strings.Builder
	writeParts(&b)
	b.WriteString("return decide(KEYS, ARGV)\n")
	return b.String()
}

// writeParts writes every Lua file of the decision code to b, in order.
// The last, decide.lua, defines decide(KEYS, ARGV) without calling it.
func writeParts(b *strings.Builder) {
	for _, name := range scriptParts() {
		src, err := luaFiles.ReadFile("lua/" + name)
		if err != nil {
			panic(err) // the files are embedded: unreachable
		}
		b.Write(src)
		b.WriteByte('\n')
	}
}

// Library returns the decision script as a Redis 7 function library named
// name, registering one function, name+"_decide", that takes the script's
// KEYS and ARGV and answers as [Script] does. Unlike a script, whose top
// level defines every algorithm on every call, the library defines them
// once, on the function's first call after the library was loaded (Redis
// lets a library's load step touch only its registration API).
func Library(name string) string {
	var b strings.Builder
	b.WriteString("#!lua name=" + name + "\n")
	b.WriteString("local function build()\n")
	writeParts(&b)
	b.WriteString("return decide\nend\n")
	b.WriteString("local decide\n")
	b.WriteString("redis.register_function('" + name + "_decide', function(keys, args)\n")
	b.WriteString("  if decide == nil then decide = build() end\n")
	b.WriteString("  return decide(keys, args)\n")
	b.WriteString("end)\n")
	return b.String()
}

// ScriptArgsPerRequest is the number of ARGV entries of each request.
const ScriptArgsPerRequest = 3

// AppendScriptArgs appends the script's ARGV for reqs to dst. A zero now
// makes the script read the Redis clock; minTTL is the least TTL of a
// stored key (zero in production); a notAfter that is not zero, an
// instant on the Redis clock, makes a call that Redis runs after it decide
// and store nothing, and fail with an error [IsLate] recognizes. The
// script trusts its arguments: every limit must pass [Limit.Check].
func AppendScriptArgs(dst []any, now time.Time, minTTL time.Duration, notAfter time.Time, reqs []Request) []any {
	dst = appendHeader(dst, now, minTTL, notAfter)
	return AppendRequestArgs(dst, reqs)
}

// appendHeader appends ARGV[1] and ARGV[2]: now, and the least TTL with
// the not-after instant when there is one.
func appendHeader(dst []any, now time.Time, minTTL time.Duration, notAfter time.Time) []any {
	if now.IsZero() {
		dst = append(dst, "")
	} else {
		dst = append(dst, strconv.FormatInt(now.UnixMicro(), 10))
	}
	ttl := strconv.FormatInt(minTTL.Milliseconds(), 10)
	if !notAfter.IsZero() {
		ttl += " " + strconv.FormatInt(notAfter.UnixMicro(), 10)
	}
	return append(dst, ttl)
}

// IsLate reports whether err is the script's refusal of a call that ran
// after its not-after instant (see [AppendScriptArgs]), or [ErrLate]:
// nothing was decided or stored.
func IsLate(err error) bool {
	return err != nil && (errors.Is(err, ErrLate) || strings.Contains(err.Error(), "ratelimitd: late"))
}

// ErrLate is the error of a batch that ran after its not-after instant in
// a call of several batches: nothing of it was decided or stored.
var ErrLate = errors.New("ratelimitd: late: the decision ran after its caller gave up; nothing was decided")

// AppendRequestArgs appends the ARGV entries of each request:
// ScriptArgsPerRequest per request, its limit as one argument ("algorithm
// N W B"), its hits and its flags.
func AppendRequestArgs(dst []any, reqs []Request) []any {
	for i := range reqs {
		r := &reqs[i]
		f := 0
		if r.Shadow {
			f |= 1
		}
		if r.Peek {
			f |= 2
		}
		if r.Counting() {
			f |= 4
		}
		dst = append(dst, limitArg(r.Limit), hitsArg(r.Hits), flagsArg(r, f))
	}
	return dst
}

// hitsArg formats a request's hits argument. The counts nearly every
// request carries (0 and 1) are constants, which an interface holds
// without allocating.
func hitsArg(n uint64) any {
	switch n {
	case 0:
		return "0"
	case 1:
		return "1"
	}
	return strconv.FormatUint(n, 10)
}

// digitArg is the flags argument of a request with nothing after its
// digit f, as a constant: it takes no allocation to pass.
func digitArg(f int) any {
	switch f {
	case 0:
		return "0"
	case 1:
		return "1"
	case 2:
		return "2"
	case 3:
		return "3"
	case 4:
		return "4"
	case 5:
		return "5"
	case 6:
		return "6"
	}
	return "7"
}

// flagsArg formats a request's flags argument: the digit f of its shadow,
// peek and count flags, then for a take " t MAX SHARE TTL_US", for a give
// " g MARK", for a reservation of a fixed window " h TTL_US", for a
// settle of one " s", and for a [Plain] fixed window " w AT_US TTL_S". A take the script would decide as a plain request (see
// [Apply]) is sent as one.
func flagsArg(r *Request, f int) any {
	digit := "01234567"[f : f+1]
	leasable := r.Limit.Algorithm.Leasable()
	switch {
	case r.Op == OpTake && leasable && !r.Peek && r.Lease.TTL > 0:
		var buf [80]byte
		b := append(buf[:0], digit...)
		b = append(b, " t "...)
		b = strconv.AppendUint(b, r.Lease.Max, 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, max(r.Lease.Share, 1), 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, max(r.Lease.TTL.Microseconds(), 1), 10)
		return string(b)
	case r.Op == OpGive:
		return digit + " g " + strconv.FormatInt(r.Lease.Mark, 10)
	case r.Op == OpReserve && r.Limit.Algorithm == FixedWindow:
		return digit + " h " + strconv.FormatInt(max(r.Lease.TTL.Microseconds(), 1), 10)
	case r.Op == OpSettle && r.Limit.Algorithm == FixedWindow:
		return digit + " s"
	case !r.Plain.At.IsZero() && r.Limit.Algorithm == FixedWindow && r.Op == OpDecide:
		var buf [64]byte
		b := append(buf[:0], digit...)
		b = append(b, " w "...)
		b = strconv.AppendInt(b, r.Plain.At.UnixMicro(), 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, max(int64(r.Plain.TTL/time.Second), 1), 10)
		return string(b)
	case r.Limit.Algorithm == Concurrency && (r.Op == OpAcquire || r.Op == OpRelease || r.Op == OpRenew):
		return digit + " " + "arn"[r.Op-OpAcquire:r.Op-OpAcquire+1] + " " + r.Holder.String()
	}
	return digitArg(f)
}

// limitArg formats l as the script's limit argument: "algorithm N W B",
// W in microseconds and B the bucket's capacity.
func limitArg(l Limit) string {
	var buf [80]byte
	b := append(buf[:0], l.Algorithm.String()...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, l.Requests, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, windowMicros(l), 10)
	b = append(b, ' ')
	b = strconv.AppendUint(b, l.capacity(), 10)
	return string(b)
}

// AppendBatchesArgs appends the script's ARGV for several independent
// batches decided by one call: each all or nothing on its own, in order, as
// if by one call each. The call's KEYS are the batches' keys, batch after
// batch. now, minTTL and notAfter are as for [AppendScriptArgs].
func AppendBatchesArgs(dst []any, now time.Time, minTTL time.Duration, notAfter time.Time, batches [][]Request) []any {
	dst = AppendBatchesHeader(dst, now, minTTL, notAfter, len(batches))
	for _, b := range batches {
		dst = AppendBatchLen(dst, len(b), time.Time{})
	}
	for _, b := range batches {
		dst = AppendRequestArgs(dst, b)
	}
	return dst
}

// AppendBatchesHeader appends the ARGV header of a call of n batches; the
// caller then appends each batch's [AppendBatchLen], then each batch's
// [AppendRequestArgs].
func AppendBatchesHeader(dst []any, now time.Time, minTTL time.Duration, notAfter time.Time, n int) []any {
	return append(appendHeader(dst, now, minTTL, notAfter), "batches", strconv.Itoa(n))
}

// AppendBatchLen appends the ARGV entry of a batch of n requests in a
// call of several batches: n, and the batch's not-after instant, on the
// Redis clock, unless zero (a batch the call runs later decides and stores
// nothing; see [AppendScriptArgs]).
func AppendBatchLen(dst []any, n int, notAfter time.Time) []any {
	if notAfter.IsZero() {
		return append(dst, strconv.Itoa(n))
	}
	return append(dst, strconv.Itoa(n)+" "+strconv.FormatInt(notAfter.UnixMicro(), 10))
}

// ParseBatchesReply reads the reply of a call made with
// [AppendBatchesArgs] into outs, one slice of decisions per batch, each as
// long as its batch. late, when not nil, is as long as outs: late[i] is
// set when batch i ran after its not-after instant ([AppendBatchLen]) and
// was not decided (its decisions are zero).
func ParseBatchesReply(reply []any, outs [][]Decision, late []bool) error {
	for i, out := range outs {
		n, err := replyLen(reply, len(out))
		if err != nil {
			return fmt.Errorf("batch %d: %w", i, err)
		}
		if len(reply) < n {
			return fmt.Errorf("decision script replied %d values for batch %d of %d requests", len(reply), i, len(out))
		}
		if reply[0] == int64(-1) {
			clear(out)
			if late != nil {
				late[i] = true
			}
		} else if _, err := parseReply(reply[:n], out); err != nil {
			return err
		}
		reply = reply[n:]
	}
	if len(reply) != 0 {
		return fmt.Errorf("decision script replied %d values more than its batches hold", len(reply))
	}
	return nil
}

// ParseScriptReply reads the script's reply, an array of integers, into
// out and reports whether the batch was admitted.
func ParseScriptReply(reply []any, out []Decision) (admitted bool, err error) {
	n, err := replyLen(reply, len(out))
	if err != nil {
		return false, err
	}
	if len(reply) != n {
		return false, fmt.Errorf("decision script replied %d values for %d requests", len(reply), len(out))
	}
	return parseReply(reply, out)
}

// replyLen returns the length of the reply of a batch of n requests that
// opens reply: 1 + 5n values, then k, then 4 per take of those k.
func replyLen(reply []any, n int) (int, error) {
	if len(reply) < 2+5*n {
		return 0, fmt.Errorf("decision script replied %d values for %d requests", len(reply), n)
	}
	k, ok := reply[1+5*n].(int64)
	if !ok || k < 0 || k > int64(n) {
		return 0, fmt.Errorf("decision script replied %v takes for %d requests", reply[1+5*n], n)
	}
	return 2 + 5*n + 4*int(k), nil
}

// parseReply reads the reply of one batch, whose length replyLen checked.
func parseReply(reply []any, out []Decision) (admitted bool, err error) {
	var v [5]int64
	for i := range out {
		for j := range v {
			n, ok := reply[1+5*i+j].(int64)
			if !ok {
				return false, fmt.Errorf("decision script replied %T for request %d, want an integer", reply[1+5*i+j], i)
			}
			v[j] = n
		}
		o := v[:]
		d := Decision{
			Allowed:    o[0] == 1,
			Remaining:  uint64(o[1]),
			ResetAfter: micros(o[2]),
			RetryAfter: micros(o[3]),
			Wait:       micros(o[4]),
		}
		if o[3] < 0 {
			d.RetryAfter = Never
		}
		out[i] = d
	}
	takes := reply[2+5*len(out):]
	for j := 0; j+4 <= len(takes); j += 4 {
		var v [4]int64
		for x := range v {
			n, ok := takes[j+x].(int64)
			if !ok {
				return false, fmt.Errorf("decision script replied %T in a take, want an integer", takes[j+x])
			}
			v[x] = n
		}
		if v[0] < 0 || v[0] >= int64(len(out)) {
			return false, fmt.Errorf("decision script replied a take of request %d of %d", v[0], len(out))
		}
		d := &out[v[0]]
		d.Taken, d.Mark, d.Valid = uint64(v[1]), v[2], micros(v[3])
	}
	return reply[0] == int64(1), nil
}
