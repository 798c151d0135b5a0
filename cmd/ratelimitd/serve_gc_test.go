package main

import (
	"io"
	"log/slog"
	"runtime/debug"
	"testing"
)

// TestTuneGC checks that a Redis-backed replica collects at 400% growth
// unless GOGC is set, and that the memory backend keeps Go's default.
func TestTuneGC(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	prev := debug.SetGCPercent(100)
	defer debug.SetGCPercent(prev)
	for _, tc := range []struct {
		backend string
		gogc    string // "" for unset
		want    int
	}{
		{"redis", "", redisGCPercent},
		{"redis", "150", 100},
		{"memory", "", 100},
	} {
		debug.SetGCPercent(100)
		tuneGC(tc.backend, func(k string) (string, bool) {
			if k == "GOGC" && tc.gogc != "" {
				return tc.gogc, true
			}
			return "", false
		}, log)
		if got := debug.SetGCPercent(100); got != tc.want {
			t.Errorf("backend %s, GOGC %q: GC percent %d, want %d", tc.backend, tc.gogc, got, tc.want)
		}
	}
}
