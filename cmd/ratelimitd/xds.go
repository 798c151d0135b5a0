package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/xds"
)

// xdsConfig is what the -xds-* flags set.
type xdsConfig struct {
	server         string
	nodeID         string
	nodeMetadata   string
	headers        string
	tls            xds.TLS
	backoffInitial time.Duration
	backoffMax     time.Duration
	forceStart     bool
	readyWithRules bool

	// Parsed by validate.
	metadata, headerMap map[string]string
}

func addXDSFlags(fs *flag.FlagSet, c *xdsConfig) {
	fs.StringVar(&c.server, "xds-server", "", "xDS control plane `address` (host:port) to take the rules from, as RateLimitConfig resources over ADS, instead of the files of -config (docs/xds.md)")
	fs.StringVar(&c.nodeID, "xds-node-id", xds.DefaultNodeID, "node `id` this replica gives the xDS control plane, which picks the snapshot to serve by it")
	fs.StringVar(&c.nodeMetadata, "xds-node-metadata", "", "node metadata for the xDS control plane: `k1=v1,k2=v2`")
	fs.StringVar(&c.headers, "xds-headers", "", "gRPC metadata sent on the xDS stream, such as an authorization token: `k1=v1,k2=v2` (values are never logged)")
	fs.BoolVar(&c.tls.Enabled, "xds-tls", false, "connect to the xDS control plane over TLS, verified against the system's CAs (implied by any -xds-tls-* flag)")
	fs.StringVar(&c.tls.CA, "xds-tls-ca", "", "PEM `file` of the CAs the xDS control plane's certificate must chain to")
	fs.StringVar(&c.tls.Cert, "xds-tls-cert", "", "PEM `file` of a client certificate for mutual TLS with the xDS control plane (re-read at each reconnect)")
	fs.StringVar(&c.tls.Key, "xds-tls-key", "", "PEM `file` of the key of -xds-tls-cert")
	fs.StringVar(&c.tls.ServerName, "xds-tls-server-name", "", "`name` the xDS control plane's certificate must hold, when not the host of -xds-server")
	fs.DurationVar(&c.backoffInitial, "xds-backoff-initial", xds.DefaultBackoffInitial, "first wait before reconnecting to the xDS control plane; it doubles with each failure in a row, jittered")
	fs.DurationVar(&c.backoffMax, "xds-backoff-max", xds.DefaultBackoffMax, "longest wait before reconnecting to the xDS control plane")
	fs.BoolVar(&c.readyWithRules, "xds-ready-with-rules", false, "health checks report not serving while the rules in force hold no domain: before the first rules arrive (with -xds-force-start) and after an update with none; calls are answered meanwhile (envoyproxy/ratelimit's HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED)")
	fs.BoolVar(&c.forceStart, "xds-force-start", false, "serve before the first rules arrive from the xDS control plane, with no rules meanwhile (every request OK); without it, ratelimitd opens no port until they arrive")
}

// check checks the -xds-* flags; flagName names a flag as the user set it.
func (x *xdsConfig) check(flagName func(string) string) error {
	if x.server == "" {
		for _, f := range []struct{ name, v string }{
			{"xds-node-metadata", x.nodeMetadata}, {"xds-headers", x.headers},
			{"xds-tls-ca", x.tls.CA}, {"xds-tls-cert", x.tls.Cert}, {"xds-tls-key", x.tls.Key},
			{"xds-tls-server-name", x.tls.ServerName},
		} {
			if f.v != "" {
				return fmt.Errorf("%s needs -xds-server: the control plane it is for", flagName(f.name))
			}
		}
		if x.forceStart {
			return fmt.Errorf("%s needs -xds-server: the control plane whose rules it does not wait for", flagName("xds-force-start"))
		}
		if x.readyWithRules {
			return fmt.Errorf("%s needs -xds-server: from files, rules with a domain are there before any port opens", flagName("xds-ready-with-rules"))
		}
		if x.tls.Enabled {
			return fmt.Errorf("%s needs -xds-server: the control plane it is for", flagName("xds-tls"))
		}
		return nil
	}
	var err error
	if x.metadata, err = xds.ParsePairs(x.nodeMetadata); err != nil {
		return fmt.Errorf("invalid %s: %v", flagName("xds-node-metadata"), err)
	}
	if x.headerMap, err = xds.ParsePairs(x.headers); err != nil {
		return fmt.Errorf("invalid %s: %v", flagName("xds-headers"), err)
	}
	if (x.tls.Cert == "") != (x.tls.Key == "") {
		return fmt.Errorf("%s and %s go together: give both or neither", flagName("xds-tls-cert"), flagName("xds-tls-key"))
	}
	if x.backoffInitial <= 0 {
		return fmt.Errorf("invalid %s %v; it must be positive", flagName("xds-backoff-initial"), x.backoffInitial)
	}
	if x.backoffMax < x.backoffInitial {
		return fmt.Errorf("invalid %s %v; it must be at least %s (%v)", flagName("xds-backoff-max"), x.backoffMax, flagName("xds-backoff-initial"), x.backoffInitial)
	}
	return nil
}

// xdsSource receives the rules of the xDS control plane. Until attach, it
// keeps the latest; from then on it hands each to the service, and tells
// of each rejected.
type xdsSource struct {
	client *xds.Client

	mu     sync.Mutex
	latest *config.Rules
	apply  func(*config.Rules)
	reject func(error)
}

// startXDS starts the client of -xds-server; it runs until ctx is done.
func startXDS(ctx context.Context, x *xdsConfig, log *slog.Logger) (*xdsSource, error) {
	s := &xdsSource{}
	client, err := xds.New(xds.Options{
		Server: x.server, NodeID: x.nodeID, NodeMetadata: x.metadata, Headers: x.headerMap, TLS: x.tls,
		BackoffInitial: x.backoffInitial, BackoffMax: x.backoffMax,
		OnRules: s.onRules, OnReject: s.onReject, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	s.client = client
	log.Info("rules come from xDS; the files of -config are not read", "xds_server", x.server, "node_id", x.nodeID,
		"node_metadata", x.metadata, "headers", slices.Sorted(maps.Keys(x.headerMap)), "tls", x.tls.Enabled || x.tls.CA != "" || x.tls.ServerName != "" || x.tls.Cert != "",
		"mtls", x.tls.Cert != "", "force_start", x.forceStart)
	go client.Run(ctx)
	return s, nil
}

func (s *xdsSource) onRules(r *config.Rules, version string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.latest = r
	if s.apply != nil {
		s.apply(r)
	}
}

func (s *xdsSource) onReject(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reject != nil {
		s.reject(err)
	}
}

// initial returns the rules to start serving with: with force start, what
// has arrived or an empty rule set; else it waits for
// the first rules. It returns nil when ctx ends first.
func (s *xdsSource) initial(ctx context.Context, forceStart bool, log *slog.Logger) *config.Rules {
	if !forceStart {
		select {
		case <-s.client.Ready():
		default:
			log.Info("waiting for the first rules from the xDS control plane before serving (-xds-force-start serves at once)")
			select {
			case <-s.client.Ready():
			case <-ctx.Done():
				return nil
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.latest != nil {
		return s.latest
	}
	empty, _ := config.Parse() // no files: a valid, empty rule set
	log.Warn("serving without rules until the xDS control plane sends them: every request is OK meanwhile")
	return empty
}

// attach hands every later rule set to apply, and at once the latest one
// if it is not serving already, and the error of every later rejected one
// to reject.
func (s *xdsSource) attach(serving *config.Rules, apply func(*config.Rules), reject func(error)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.apply, s.reject = apply, reject
	if s.latest != nil && s.latest != serving {
		apply(s.latest)
	}
}

// sourceInfo exports ratelimitd_config_source_info{source, version} 1:
// where the rules in force come from, and their xDS version.
type sourceInfo struct{ x *xdsSource }

var sourceInfoDesc = prometheus.NewDesc(metricsNamespace+"_config_source_info",
	"Where the rules in force come from: 1, with source (file or xds) and, from xDS, their version_info as labels.", []string{"source", "version"}, nil)

func (sourceInfo) Describe(ch chan<- *prometheus.Desc) { ch <- sourceInfoDesc }

func (i sourceInfo) Collect(ch chan<- prometheus.Metric) {
	source, version := "file", ""
	if i.x != nil {
		source, version = "xds", i.x.client.Status().Version
	}
	ch <- prometheus.MustNewConstMetric(sourceInfoDesc, prometheus.GaugeValue, 1, source, version)
}

// registerXDS exports the xDS client's state, under the names the file
// watcher's reloads use where they mean the same.
func registerXDS(reg prometheus.Registerer, x *xdsSource) {
	st := func(f func(xds.Status) uint64) func() uint64 { return func() uint64 { return f(x.client.Status()) } }
	reg.MustRegister(
		counter("config", "reloads_total", "Changed rule sets loaded and put in force (from xDS: responses ACKed).", nil, st(func(s xds.Status) uint64 { return s.Updates })),
		counter("config", "reload_rejections_total", "Changed rule sets rejected as invalid (from xDS: responses NACKed); the last good rules kept serving.", nil, st(func(s xds.Status) uint64 { return s.Rejections })),
		gauge("config", "last_reload_timestamp_seconds", "Unix time of the last rules reload; 0 if none.", func() float64 {
			if t := x.client.Status().LastUpdate; !t.IsZero() {
				return float64(t.UnixNano()) / 1e9
			}
			return 0
		}),
		gauge("xds", "connected", "1 while the stream to the xDS control plane is open, else 0.", func() float64 {
			if x.client.Status().Connected {
				return 1
			}
			return 0
		}),
		counter("xds", "stream_errors_total", "xDS streams that failed or could not be opened; each is retried after a backoff.", nil, st(func(s xds.Status) uint64 { return s.StreamErrors })),
	)
}
