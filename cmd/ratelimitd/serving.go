package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/ratelimitd/ratelimitd/pkg/tlsconfig"
)

// servingConfig is the server's own configuration, beside its
// components': the gRPC, HTTP and debug listeners, the logs, the clock and
// how it shuts down.
type servingConfig struct {
	grpcAddr            string
	grpcMaxConnAge      time.Duration
	grpcMaxConnAgeGrace time.Duration
	httpAddr            string
	grpcTLS             tlsconfig.Files
	httpTLS             tlsconfig.Files
	debugAddr           string
	clockOffset         time.Duration
	logLevel            string
	logFormat           string
	shutdownTimeout     time.Duration
	shutdownDelay       time.Duration
}

// streamWorkers is the size of the gRPC server's goroutine pool: about as
// many calls as a replica has in flight under load (each waits on the
// backend for most of its time).
const streamWorkers = 64

func (c *servingConfig) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.grpcAddr, "grpc-addr", ":8081", "gRPC listen `address` (Envoy RLS v3, grpc.health.v1, reflection); port 0 picks a free port; unix:PATH listens on a Unix socket")
	fs.StringVar(&c.httpAddr, "http-addr", ":8080", "HTTP listen `address` (/json, /healthcheck, /rlconfig); port 0 picks a free port")
	fs.StringVar(&c.grpcTLS.Cert, "grpc-tls-cert", "", "PEM `file` of the gRPC listener's certificate chain; with -grpc-tls-key, gRPC is served over TLS (re-read when the file changes)")
	fs.StringVar(&c.grpcTLS.Key, "grpc-tls-key", "", "PEM `file` of the key of -grpc-tls-cert")
	fs.StringVar(&c.grpcTLS.ClientCA, "grpc-tls-client-ca", "", "PEM `file` of the CAs gRPC clients' certificates must chain to: requires client certificates (mutual TLS)")
	fs.StringVar(&c.grpcTLS.ClientSAN, "grpc-tls-client-san", "", "with -grpc-tls-client-ca, the `name` (DNS or IP) client certificates must also be valid for")
	fs.DurationVar(&c.grpcMaxConnAge, "grpc-max-connection-age", 0, "close each gRPC connection (GOAWAY) after this long, so clients reconnect and spread over new replicas; 0 keeps connections")
	fs.DurationVar(&c.grpcMaxConnAgeGrace, "grpc-max-connection-age-grace", 0, "after -grpc-max-connection-age, how long calls in flight may take before the connection is cut; 0 waits for them")
	fs.StringVar(&c.httpTLS.Cert, "http-tls-cert", "", "PEM `file` of the HTTP listener's certificate chain; with -http-tls-key, HTTP is served over TLS (re-read when the file changes)")
	fs.StringVar(&c.httpTLS.Key, "http-tls-key", "", "PEM `file` of the key of -http-tls-cert")
	fs.StringVar(&c.httpTLS.ClientCA, "http-tls-client-ca", "", "PEM `file` of the CAs HTTP clients' certificates must chain to: requires client certificates (mutual TLS)")
	fs.StringVar(&c.debugAddr, "debug-addr", "", "listen `address` for Go's profiles (/debug/pprof/); off when empty. Keep it private")
	fs.DurationVar(&c.clockOffset, "clock-offset", 0, "testing aid: shift this process's clock by this `duration` (simulates a replica whose clock is wrong)")
	fs.StringVar(&c.logLevel, "log-level", "info", "least important log `level` written: debug, info, warn, error")
	fs.StringVar(&c.logFormat, "log-format", "text", "log `format`: text or json")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 15*time.Second, "on SIGTERM, how long in-flight calls may take before connections are closed")
	fs.DurationVar(&c.shutdownDelay, "shutdown-delay", 5*time.Second, "on SIGTERM, how long health checks report not serving while calls are still served, before the listeners close (load balancers stop sending meanwhile); 0 closes at once")
}

// check checks the listeners', the logs' and the shutdown's flags;
// flagName names a flag as the user set it.
func (c *servingConfig) check(flagName func(string) string) error {
	for _, a := range []struct{ name, v string }{{"grpc-addr", c.grpcAddr}, {"http-addr", c.httpAddr}} {
		if a.v == "" {
			return fmt.Errorf("invalid %s: it must not be empty", flagName(a.name))
		}
	}
	for _, l := range []struct {
		name string
		f    tlsconfig.Files
	}{{"grpc", c.grpcTLS}, {"http", c.httpTLS}} {
		cert, key, ca := flagName(l.name+"-tls-cert"), flagName(l.name+"-tls-key"), flagName(l.name+"-tls-client-ca")
		if (l.f.Cert == "") != (l.f.Key == "") {
			return fmt.Errorf("%s and %s go together: give both or neither", cert, key)
		}
		if l.f.ClientCA != "" && l.f.Cert == "" {
			return fmt.Errorf("%s needs %s and %s: mutual TLS is TLS first", ca, cert, key)
		}
	}
	if _, err := parseLevel(c.logLevel); err != nil {
		return fmt.Errorf("invalid %s %q; accepted: debug, info, warn, error", flagName("log-level"), c.logLevel)
	}
	if c.logFormat != "text" && c.logFormat != "json" {
		return fmt.Errorf("invalid %s %q; accepted: text, json", flagName("log-format"), c.logFormat)
	}
	if c.grpcMaxConnAge < 0 || c.grpcMaxConnAgeGrace < 0 {
		name, v := "grpc-max-connection-age", c.grpcMaxConnAge
		if v >= 0 {
			name, v = "grpc-max-connection-age-grace", c.grpcMaxConnAgeGrace
		}
		return fmt.Errorf("invalid %s %v; it must not be negative", flagName(name), v)
	}
	if c.grpcTLS.ClientSAN != "" && c.grpcTLS.ClientCA == "" {
		return fmt.Errorf("%s needs %s: only mutual TLS verifies client certificates", flagName("grpc-tls-client-san"), flagName("grpc-tls-client-ca"))
	}
	if c.shutdownDelay < 0 {
		return fmt.Errorf("invalid %s %v; it must not be negative", flagName("shutdown-delay"), c.shutdownDelay)
	}
	if c.shutdownTimeout < 0 {
		return fmt.Errorf("invalid %s %v; it must not be negative", flagName("shutdown-timeout"), c.shutdownTimeout)
	}
	return nil
}

// clock returns the clock of the whole server: time.Now, shifted by
// -clock-offset.
func (c *servingConfig) clock(log *slog.Logger) func() time.Time {
	if c.clockOffset == 0 {
		return time.Now
	}
	offset := c.clockOffset
	log.Warn("clock shifted by -clock-offset: this process decides as if the time were off", "offset", offset)
	return func() time.Time { return time.Now().Add(offset) }
}

// grpcOptions returns the gRPC server's own options: TLS, the stream
// workers and the connections' age.
func (c *servingConfig) grpcOptions(cfg *tls.Config) []grpc.ServerOption {
	var opts []grpc.ServerOption
	if cfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg)))
	}
	// Calls run on a pool of goroutines whose stacks have already grown:
	// a goroutine per call spent a tenth of the CPU growing its stack
	// (docs/performance.md). Calls beyond the pool get goroutines of their
	// own, so the pool never makes a call wait.
	opts = append(opts, grpc.NumStreamWorkers(streamWorkers))
	if c.grpcMaxConnAge > 0 {
		opts = append(opts, grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionAge:      c.grpcMaxConnAge,
			MaxConnectionAgeGrace: c.grpcMaxConnAgeGrace,
		}))
	}
	return opts
}

// logServing returns what logs that a listener serves at an address.
func logServing(log *slog.Logger, msg string, attrs ...any) func(net.Addr) {
	return func(addr net.Addr) { log.Info(msg, append([]any{"addr", addr.String()}, attrs...)...) }
}
