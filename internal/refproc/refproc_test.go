package refproc

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestEnv checks the reference's environment: this process's PATH and
// nothing else of it, the settings on loopback, Extra last so it wins.
func TestEnv(t *testing.T) {
	t.Setenv("PATH", "/p")
	t.Setenv("RATELIMITD_BACKEND", "memory")
	t.Setenv("REDIS_URL", "elsewhere:6379")
	s := Settings{Root: "/root", Redis: "127.0.0.1:7000", HTTPPort: 1, GRPCPort: 2, Debug: 3, Extra: []string{"LOG_LEVEL=debug"}}
	env := Env(s)
	for _, kv := range []string{"PATH=/p", "HOST=127.0.0.1", "PORT=1", "GRPC_HOST=127.0.0.1", "GRPC_PORT=2", "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=3",
		"RUNTIME_ROOT=/root", "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=127.0.0.1:7000", "USE_STATSD=false", "LOG_LEVEL=warn"} {
		if !slices.Contains(env, kv) {
			t.Errorf("no %s in %q", kv, env)
		}
	}
	for _, kv := range env {
		if strings.HasPrefix(kv, "RATELIMITD_") || kv == "REDIS_URL=elsewhere:6379" {
			t.Errorf("%s leaked from this process", kv)
		}
	}
	if env[len(env)-1] != "LOG_LEVEL=debug" {
		t.Errorf("Extra is not last: %q", env)
	}
	if got, want := ConfigDir("/root"), filepath.Join("/root", "ratelimit", "config"); got != want {
		t.Errorf("ConfigDir: %s, want %s", got, want)
	}
	if got := HealthURL(s); got != "http://127.0.0.1:1/healthcheck" {
		t.Errorf("HealthURL: %s", got)
	}
}
