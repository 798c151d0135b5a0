package main

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"

	"github.com/ratelimitd/ratelimitd/pkg/tlsconfig"
)

// listenerTLS returns the TLS config of a listener, or nil when f names no
// file. Certificates rotated on disk are picked up; a rotation that cannot
// be loaded is logged and the previous certificate kept.
func listenerTLS(name string, f tlsconfig.Files, log *slog.Logger) (*tls.Config, error) {
	if !f.Enabled() {
		return nil, nil
	}
	cfg, err := tlsconfig.Server(f, func(err error) {
		log.Error(name+" TLS files changed but could not be loaded; serving the previous ones", "error", err)
	})
	if err != nil {
		return nil, fmt.Errorf("%s TLS: %w", name, err)
	}
	return cfg, nil
}

// debugHandler serves Go's profiles (net/http/pprof) under /debug/pprof/,
// for the opt-in -debug-addr only: profiles reveal internals and cost CPU.
// It also serves GET /rlconfig from app, where envoyproxy/ratelimit serves
// it (its debug port, 6070).
func debugHandler(app http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /rlconfig", app)
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", serveCmdline) // secrets masked
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// listenGRPC listens on addr: host:port over TCP, or unix:PATH on a Unix
// socket (envoyproxy/ratelimit's GRPC_UDS), replacing a socket file left
// by a previous run.
func listenGRPC(addr string) (net.Listener, error) {
	path, ok := strings.CutPrefix(addr, "unix:")
	if !ok {
		return net.Listen("tcp", addr)
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		os.Remove(path)
	}
	return net.Listen("unix", path)
}
