package region

import (
	"context"
	"sync"
	"time"
)

// Store keeps, for every replica of a region, what the peer regions
// reported: their counts per key and window, merged by maximum, and when
// each peer was last heard and with what weight. Any replica may receive
// a peer's push (they sit behind one address); every replica reads the
// store every sync interval.
type Store interface {
	// Merge records counts of region, each kept only if larger than the
	// one recorded, and, when heard is not nil, that region was heard
	// then (a peer's push; a replica records its own region's counts with
	// none, for its siblings).
	Merge(ctx context.Context, region string, counts []Count, heard *Heard) error
	// Load returns every count recorded in the windows given, and every
	// peer's last hearing.
	Load(ctx context.Context, windows []Window) ([]Count, map[string]Heard, error)
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

// keep is how long a store keeps a window's counts past its end: long
// enough for the peers' pushes of the previous window to arrive, and to be
// read at the next interval.
func keep(w Window) time.Duration {
	return time.Duration(w.Length)*time.Millisecond + 10*time.Second
}

// MemoryStore is a [Store] in this process: for a region of one replica
// (ratelimitd on the memory backend). Windows are dropped once ended for
// as long as keep says, on the next Merge.
type MemoryStore struct {
	mu      sync.Mutex
	windows map[Window]map[countKey]uint64
	heard   map[string]Heard
	now     func() time.Time
}

type countKey struct{ region, key string }

// NewMemoryStore returns an empty MemoryStore on the clock now (nil:
// time.Now).
func NewMemoryStore(now func() time.Time) *MemoryStore {
	if now == nil {
		now = time.Now
	}
	return &MemoryStore{windows: make(map[Window]map[countKey]uint64), heard: make(map[string]Heard), now: now}
}

// Merge implements [Store].
func (m *MemoryStore) Merge(_ context.Context, region string, counts []Count, heard *Heard) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now().UnixMilli()
	for w := range m.windows {
		if w.End()+keep(w).Milliseconds() < now {
			delete(m.windows, w)
		}
	}
	for _, c := range counts {
		w := m.windows[c.Window]
		if w == nil {
			w = make(map[countKey]uint64)
			m.windows[c.Window] = w
		}
		k := countKey{region, string(c.Key)}
		w[k] = max(w[k], c.Count)
	}
	if h := m.heard[region]; heard != nil && !heard.At.Before(h.At) {
		m.heard[region] = *heard
	}
	return nil
}

// Load implements [Store].
func (m *MemoryStore) Load(_ context.Context, windows []Window) ([]Count, map[string]Heard, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Count
	for _, w := range windows {
		for k, n := range m.windows[w] {
			out = append(out, Count{Region: k.region, Key: []byte(k.key), Window: w, Count: n})
		}
	}
	heard := make(map[string]Heard, len(m.heard))
	for r, h := range m.heard {
		heard[r] = h
	}
	return out, heard, nil
}
