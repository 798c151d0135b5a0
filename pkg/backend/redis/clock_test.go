package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// TestLateCallDecidesNothing runs the decision with a not-after instant on
// the Redis clock, as functions and as scripts: past it, the call decides
// and stores nothing and fails with an error IsLate recognizes; before it,
// the call decides as always. In a call of several batches, a batch whose
// own instant has passed is left out, marked late, and the others are
// decided.
func TestLateCallDecidesNothing(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	l := algo.Limit{Algorithm: algo.FixedWindow, Requests: 5, Window: time.Hour}
	for _, scripts := range []bool{false, true} {
		t.Run(map[bool]string{false: "functions", true: "scripts"}[scripts], func(t *testing.T) {
			b := New(c, Options{Prefix: fmt.Sprintf("late:%s:%d:", t.Name(), time.Now().UnixNano())})
			b.scripts.Store(scripts)
			redisNow, err := c.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			past, future := redisNow.Add(-time.Second), redisNow.Add(time.Minute)
			reqs := []algo.Request{{Key: []byte("one"), Limit: l, Hits: 2}}
			keys, _ := b.prepare(reqs, false)

			_, err = b.run(ctx, c, keys, algo.AppendScriptArgs(nil, time.Time{}, 0, past, reqs))
			if !algo.IsLate(err) {
				t.Fatalf("a call past its not-after instant: %v, want a late error", err)
			}
			if n, err := c.Exists(ctx, keys...).Result(); err != nil || n != 0 {
				t.Fatalf("a late call stored its key (%d, %v)", n, err)
			}
			reply, err := b.run(ctx, c, keys, algo.AppendScriptArgs(nil, time.Time{}, 0, future, reqs))
			if err != nil {
				t.Fatal(err)
			}
			out := make([]algo.Decision, 1)
			if _, err := algo.ParseScriptReply(reply, out); err != nil || !out[0].Allowed || out[0].Remaining != 3 {
				t.Fatalf("a call before its not-after instant: %+v, %v; want 2 of 5 taken", out[0], err)
			}

			// Batches: the first late, the second on time.
			batches := [][]algo.Request{{{Key: []byte("a"), Limit: l, Hits: 1}}, {{Key: []byte("b"), Limit: l, Hits: 1}}}
			ka, _ := b.prepare(batches[0], false)
			kb, _ := b.prepare(batches[1], false)
			args := algo.AppendBatchesHeader(nil, time.Time{}, 0, time.Time{}, 2)
			args = algo.AppendBatchLen(args, 1, past)
			args = algo.AppendBatchLen(args, 1, future)
			args = algo.AppendRequestArgs(args, batches[0])
			args = algo.AppendRequestArgs(args, batches[1])
			reply, err = b.run(ctx, c, append(ka, kb...), args)
			if err != nil {
				t.Fatal(err)
			}
			outs, late := [][]algo.Decision{make([]algo.Decision, 1), make([]algo.Decision, 1)}, make([]bool, 2)
			if err := algo.ParseBatchesReply(reply, outs, late); err != nil {
				t.Fatal(err)
			}
			if !late[0] || late[1] || !outs[1][0].Allowed || outs[1][0].Remaining != 4 {
				t.Fatalf("batches late %v, decisions %+v; want the first late, the second decided", late, outs)
			}
			if n, _ := c.Exists(ctx, ka...).Result(); n != 0 {
				t.Error("the late batch stored its key")
			}
			if n, _ := c.Exists(ctx, kb...).Result(); n != 1 {
				t.Error("the batch on time did not store its key")
			}
		})
	}
}

// TestClockOffset: the backend measures the Redis clock's offset (on
// loopback, the same clock: a few milliseconds at most) and gives calls
// the instant their caller gives up on it. A wrong offset, which makes a
// call its caller still waits for late, is forgotten: that call fails
// (its caller is answered by the failure mode, as on a timeout), the next
// carries no instant until the offset is measured again.
func TestClockOffset(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	b := New(c, Options{Prefix: fmt.Sprintf("offset:%d:", time.Now().UnixNano())})
	if err := b.LoadScript(ctx); err != nil {
		t.Fatal(err)
	}
	offset, slack, known := b.clock.get(c)
	if !known || offset.Abs() > 50*time.Millisecond || slack > 50*time.Millisecond {
		t.Fatalf("offset %v ± %v (known %t) on loopback, want about 0", offset, slack, known)
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	deadline, _ := dctx.Deadline()
	if got, want := b.notAfter(dctx), deadline.Add(offset+slack+lateMargin); !got.Equal(want) {
		t.Errorf("not-after %v for a deadline %v with an offset of %v ± %v, want %v", got, deadline, offset, slack, want)
	}
	if !New(c, Options{Now: time.Now}).notAfter(dctx).IsZero() {
		t.Error("a backend deciding by its own clock (no TIME in scripts) sends a not-after instant")
	}

	// The Redis clock an hour behind, as the backend wrongly believes.
	b.clock.last.Store(&clockSample{offset: -time.Hour, at: time.Now()})
	l := algo.Limit{Algorithm: algo.FixedWindow, Requests: 5, Window: time.Hour}
	out := make([]algo.Decision, 1)
	err := b.Decide(dctx, []algo.Request{{Key: []byte("k"), Limit: l, Hits: 1}}, out)
	if !algo.IsLate(err) {
		t.Fatalf("with a wrong offset: %v, want a late error", err)
	}
	if b.clock.last.Load() != nil {
		t.Fatal("the wrong offset is still known after a late call its caller waited for")
	}
	if err := b.Decide(dctx, []algo.Request{{Key: []byte("k"), Limit: l, Hits: 1}}, out); err != nil || !out[0].Allowed {
		t.Fatalf("the next call: %+v, %v; want it decided", out[0], err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if offset, _, known := b.clock.get(c); known && offset.Abs() < 50*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the offset was not measured again within 5s")
		}
	}
}
