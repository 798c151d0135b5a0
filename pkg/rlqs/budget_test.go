package rlqs_test

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/rlqs"
	"github.com/ratelimitd/ratelimitd/pkg/rlqs/rlqssim"
)

// TestReplicasShareOneBudget runs two servers (replicas) on one shared
// store, two simulated Envoys on each, all offering twice the fair share of
// 100/s, for 20 simulated seconds: the assignments across both replicas
// never sum to more than 100, what they admit stays within L·T + L, each
// stream gets about a quarter, and when one ends, the others take its
// share within two intervals.
func TestReplicasShareOneBudget(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	store := memory.New(memory.Options{Now: clk.Now})
	t.Cleanup(func() { store.Close() })
	r1 := startOn(t, rlqs.Options{Budget: store}, clk)
	r2 := startOn(t, rlqs.Options{Budget: store}, clk)
	clients := []*rlqssim.Client{r1.sim(t), r1.sim(t), r2.sim(t), r2.sim(t)}
	const seconds, limit = 20, 100
	rates := []float64{50, 50, 50, 50}
	sum := func(cs []*rlqssim.Client) (n uint64) {
		for _, c := range cs {
			n += share(c)
		}
		return n
	}
	total := 0
	for s := range seconds {
		for _, n := range drive(t, r1, clients, rates) {
			total += n
		}
		if n := sum(clients); n > limit {
			t.Fatalf("second %d: assignments across replicas sum to %d, over %d", s, n, limit)
		}
	}
	if bound := limit*seconds + limit; total > bound {
		t.Fatalf("admitted %d in %ds across replicas, over the bound %d", total, seconds, bound)
	}
	if total < limit*seconds*7/10 {
		t.Fatalf("admitted %d in %ds: under 70%% of the limit while demand is twice it", total, seconds)
	}
	for i, c := range clients {
		if sh := share(c); sh < 15 || sh > 35 {
			t.Errorf("client %d (replica %d): share %d, want about 25", i, i/2+1, sh)
		}
	}
	t.Logf("admitted %d in %d s across 2 replicas (limit %d/s, bound %d); shares %d %d %d %d",
		total, seconds, limit, limit*seconds+limit, share(clients[0]), share(clients[1]), share(clients[2]), share(clients[3]))

	// One Envoy of replica 2 leaves: its lease goes back, the others take it.
	clients[3].Close()
	deadline := time.Now().Add(5 * time.Second)
	for r2.srv.Streams() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("replica 2 did not see the stream end")
		}
		time.Sleep(time.Millisecond)
	}
	rest := clients[:3]
	for i := 1; i <= 2; i++ {
		drive(t, r1, rest, rates[:3])
		if n := sum(rest); n > limit {
			t.Fatalf("assignments sum to %d, over %d", n, limit)
		} else if n >= 95 {
			t.Logf("%d interval(s) after a stream ended, the other three hold %d", i, n)
			return
		}
	}
	t.Fatalf("two intervals after a stream ended: the others hold %d, want about 100", sum(rest))
}
