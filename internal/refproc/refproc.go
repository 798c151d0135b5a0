// Package refproc says how to run envoyproxy/ratelimit (the reference) on
// loopback next to ratelimitd: the environment its settings are read from
// (src/settings/settings.go at the reference's commit), and where it reads
// its rule files (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/*.yaml). The
// reference is never built or fetched here: a binary built from source is
// named by the caller (ANCHOR_BIN in the integration tests,
// -reference-bin in ratelimit-bench).
package refproc

import (
	"os"
	"path/filepath"
	"strconv"
)

// Subdirectory is the RUNTIME_SUBDIRECTORY the reference is run with.
const Subdirectory = "ratelimit"

// Settings say where one reference process listens and which Redis it
// counts in. Ports are on 127.0.0.1.
type Settings struct {
	Root                      string // RUNTIME_ROOT: rule files are in ConfigDir(Root)
	Redis                     string // host:port of a Redis reached over TCP
	HTTPPort, GRPCPort, Debug int
	LogLevel                  string // "" for warn
	// Extra holds more NAME=value settings (such as CACHE_KEY_PREFIX),
	// appended last, so that they win.
	Extra []string
}

// ConfigDir is the directory under root whose *.yaml files the reference
// loads as its rules.
func ConfigDir(root string) string { return filepath.Join(root, Subdirectory, "config") }

// Env returns the reference's whole environment for s: PATH from this
// process, nothing else of it (a RATELIMITD_ or REDIS_ variable here must
// not reach the reference), statsd off, the rule directory read once
// (RUNTIME_WATCH_ROOT false, dot files ignored).
func Env(s Settings) []string {
	level := s.LogLevel
	if level == "" {
		level = "warn"
	}
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOST=127.0.0.1", "PORT=" + strconv.Itoa(s.HTTPPort),
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + strconv.Itoa(s.GRPCPort),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + strconv.Itoa(s.Debug),
		"RUNTIME_ROOT=" + s.Root, "RUNTIME_SUBDIRECTORY=" + Subdirectory,
		"RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
		"LOG_LEVEL=" + level,
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + s.Redis,
		"USE_STATSD=false",
	}
	return append(env, s.Extra...)
}

// HealthURL is where the reference of s answers 200 once it has loaded
// its rules and serves.
func HealthURL(s Settings) string {
	return "http://127.0.0.1:" + strconv.Itoa(s.HTTPPort) + "/healthcheck"
}
