package region

import (
	"context"
	"strconv"
	"sync"
	"time"
)

// Store keeps, for every replica of a region, the pushes its peers sent to
// any of them (they sit behind one address), for a while: each replica
// follows it from its own cursor every sync interval, so reading costs
// what arrived since, not all that is known. A push is a state (the
// sender's counts), not a change, so a replica that starts, or falls
// behind past what is kept, loses nothing by reading what is kept: full
// pushes come every Options.FullEvery from every peer replica.
type Store interface {
	// Append records push.
	Append(ctx context.Context, push Push) error
	// Read returns the pushes recorded after cursor, oldest first (every
	// push kept, from the empty cursor), at most limit of them, and the
	// cursor to read the next ones from.
	Read(ctx context.Context, cursor string, limit int) ([]Push, string, error)
}

// Push is what a peer region pushed: its counts, and when it was heard.
type Push struct {
	Region string
	Weight float64
	At     time.Time // when a replica of this region received it, on its clock
	Counts []Count
}

// Window is one window of a limit: its length and its start, both in ms
// (since the Unix epoch for the start).
type Window struct{ Length, Start int64 }

// End returns the end of the window, in ms since the Unix epoch.
func (w Window) End() int64 { return w.Start + w.Length }

// Count is a region's count of one key in one window.
type Count struct {
	Region string
	Key    []byte
	Window Window
	Count  uint64
}

// Heard is when a peer region was last heard from, and the weight it
// announced.
type Heard struct {
	At     time.Time
	Weight float64
}

// KeepFor is how long a store of a region syncing every interval keeps
// the pushes: several full pushes of every peer replica, so that a replica
// that reads only what is kept still finds every count.
func KeepFor(interval time.Duration) time.Duration {
	return max(4*scanEvery*interval, 10*time.Second)
}

// MemoryStore is a [Store] in this process: for a region of one replica
// (ratelimitd on the memory backend), or tests. It keeps the pushes of the
// last Keep (10 s by default).
type MemoryStore struct {
	mu     sync.Mutex
	pushes []Push
	first  int // the sequence number of pushes[0]
	now    func() time.Time
	Keep   time.Duration
}

// NewMemoryStore returns an empty MemoryStore on the clock now (nil:
// time.Now).
func NewMemoryStore(now func() time.Time) *MemoryStore {
	if now == nil {
		now = time.Now
	}
	return &MemoryStore{now: now, Keep: 10 * time.Second}
}

// Append implements [Store].
func (m *MemoryStore) Append(_ context.Context, push Push) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	cut := 0
	for cut < len(m.pushes) && m.now().Sub(m.pushes[cut].At) > m.Keep {
		cut++
	}
	m.pushes, m.first = append(m.pushes[cut:], push), m.first+cut
	return nil
}

// Read implements [Store].
func (m *MemoryStore) Read(_ context.Context, cursor string, limit int) ([]Push, string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	next := m.first
	if cursor != "" {
		n, err := strconv.Atoi(cursor)
		if err != nil {
			return nil, cursor, err
		}
		next = n
	}
	i := min(len(m.pushes), max(next-m.first, 0))
	j := min(len(m.pushes), i+limit)
	out := append([]Push(nil), m.pushes[i:j]...)
	return out, strconv.Itoa(m.first + j), nil
}
