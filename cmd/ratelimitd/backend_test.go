package main

import (
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/redistest"
)

// TestBackendTimeoutAboveReadTimeoutWarned: with -backend-timeout longer
// than -redis-read-timeout a Redis call gives up at the read timeout, so
// the backend timeout set is never reached; serve says so at start, and
// says nothing with the defaults (50 ms under 100 ms).
func TestBackendTimeoutAboveReadTimeoutWarned(t *testing.T) {
	r := redistest.Start(t)
	const warning = "Redis calls give up at -redis-read-timeout"
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{nil, false},
		{[]string{"-backend-timeout", "2s", "-redis-read-timeout", "2s"}, false},
		{[]string{"-backend-timeout", "2s"}, true},
	} {
		args := append([]string{"-config", "../../examples", "-backend", "redis", "-redis-url", r.URL}, tc.args...)
		p := startServe(t, true, args...)
		var got []string
		for _, w := range p.warnings {
			if strings.Contains(w, warning) {
				got = append(got, w)
			}
		}
		if tc.want && (len(got) != 1 || !strings.Contains(got[0], `"backend_timeout":2000000000`) || !strings.Contains(got[0], `"redis_read_timeout":100000000`)) {
			t.Errorf("%v: warnings %q; want one saying %q with both timeouts", tc.args, got, warning)
		}
		if !tc.want && len(got) != 0 {
			t.Errorf("%v: warned %q", tc.args, got)
		}
		p.stop(t)
	}
}
