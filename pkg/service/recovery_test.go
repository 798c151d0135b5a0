package service

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/wire"
)

// TestPanicsCountsTheSharedRecovery: Panics, exported as
// ratelimitd_panics_total, counts the panics of every server that shares
// Options.Recovery (the region sync server, say), not only the service's;
// without one, the service recovers on its own and logs to its Logger.
func TestPanicsCountsTheSharedRecovery(t *testing.T) {
	rules, err := config.Parse(config.File{Name: "rules.yaml", Data: []byte(testRules)})
	if err != nil {
		t.Fatal(err)
	}
	be := memory.New(memory.Options{SweepInterval: -1})
	t.Cleanup(func() { be.Close() })
	boom := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") })
	serve := func(h http.Handler) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		if rec.Code != http.StatusInternalServerError {
			t.Fatalf("a panicking handler answered %d, want 500", rec.Code)
		}
	}

	shared := wire.NewRecovery(slog.New(slog.DiscardHandler))
	svc, err := New(be, rules, Options{Recovery: shared})
	if err != nil {
		t.Fatal(err)
	}
	serve(shared.WrapHTTP(boom)) // another server's handler
	serve(svc.WrapHTTP(boom))
	if svc.Panics() != 2 || shared.Panics() != 2 {
		t.Errorf("the service counts %d panics, the shared recovery %d; want 2 and 2", svc.Panics(), shared.Panics())
	}

	var logs bytes.Buffer
	own, err := New(be, rules, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	serve(own.WrapHTTP(boom))
	if own.Panics() != 1 || !strings.Contains(logs.String(), "panic in HTTP handler") {
		t.Errorf("without Options.Recovery: %d panics, log %q; want 1, logged to Options.Logger", own.Panics(), logs.String())
	}
}
