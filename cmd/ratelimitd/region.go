package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/console"
	"github.com/ratelimitd/ratelimitd/pkg/region"
	"github.com/ratelimitd/ratelimitd/pkg/tlsconfig"
	"github.com/ratelimitd/ratelimitd/pkg/wire"
)

// regionConfig is the multi-region configuration (-region*).
type regionConfig struct {
	name     string
	peers    string // as given: name=host:port,...
	interval time.Duration
	weight   float64
	parsed   []region.Peer
	// addr is the listener of region sync alone (-region-addr); empty:
	// served on the gRPC port.
	addr string
	// tls are the -region-tls-* files as given; files, once validated,
	// the ones in force: each defaults to its -grpc-tls-* twin.
	tls, files tlsconfig.Files
	san        string // -region-san, with {region}
}

func addRegionFlags(fs *flag.FlagSet, c *regionConfig) {
	fs.StringVar(&c.name, "region", "", "this region's `name`: limits with scope: global are counted across it and its -region-peers (docs/multi-region.md); empty: one region, every limit counted here alone")
	fs.StringVar(&c.peers, "region-peers", "", "the other regions, `name=host:port,...`: each region's name and the address its replicas take pushes on (their -region-addr, or gRPC port), to push this region's counts to; needs mutual TLS (-region-tls-*): a push is accepted only from the region its certificate names")
	fs.DurationVar(&c.interval, "region-sync-interval", region.DefaultInterval, "how often each replica pushes its region's counts of global limits to every peer region, and reads what they pushed")
	fs.Float64Var(&c.weight, "region-weight", 1, "this region's part of a global limit while cut off from a peer, relative to the other regions' -region-weight (equal by default)")
	fs.StringVar(&c.addr, "region-addr", "", "listen `address` of region sync alone (the peers' pushes), over mutual TLS with the -region-tls-* files; empty: region sync is served on the gRPC port; port 0 picks a free port")
	fs.StringVar(&c.tls.Cert, "region-tls-cert", "", "PEM `file` of this region's certificate chain, which names it (-region-san): presented to the peers when pushing, and served on -region-addr (default: -grpc-tls-cert)")
	fs.StringVar(&c.tls.Key, "region-tls-key", "", "PEM `file` of the key of -region-tls-cert (default: -grpc-tls-key)")
	fs.StringVar(&c.tls.ClientCA, "region-tls-ca", "", "PEM `file` of the CAs the regions' certificates are signed by: the peers are verified against them, as servers and as clients (default: -grpc-tls-client-ca)")
	fs.StringVar(&c.san, "region-san", region.DefaultSAN, "the subject alternative name (URI or DNS) by which a region's certificate names it, {region} standing for the region's name: a push is accepted only from a certificate naming the region it comes from")
}

// validate checks the -region* flags; source names a flag as the user set
// it, grpcTLS are the gRPC listener's files.
func (c *regionConfig) validate(source func(string) string, grpcTLS tlsconfig.Files) error {
	if c.name == "" {
		switch {
		case c.peers != "":
			return fmt.Errorf("%s needs %s: name this region first", source("region-peers"), source("region"))
		case c.addr != "":
			return fmt.Errorf("%s needs %s: name this region first", source("region-addr"), source("region"))
		}
		return nil
	}
	if err := region.CheckName(c.name); err != nil {
		return fmt.Errorf("invalid %s: %v", source("region"), err)
	}
	c.parsed = nil
	seen := map[string]bool{c.name: true}
	for _, item := range strings.Split(c.peers, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, addr, ok := strings.Cut(item, "=")
		if !ok || addr == "" {
			return fmt.Errorf("invalid %s %q: %q is not name=host:port", source("region-peers"), c.peers, item)
		}
		if err := region.CheckName(name); err != nil {
			return fmt.Errorf("invalid %s: %v", source("region-peers"), err)
		}
		if seen[name] {
			if name == c.name {
				return fmt.Errorf("invalid %s: %q is this region (%s); list the other regions", source("region-peers"), name, source("region"))
			}
			return fmt.Errorf("invalid %s: region %q is given twice", source("region-peers"), name)
		}
		seen[name] = true
		c.parsed = append(c.parsed, region.Peer{Name: name, Addr: addr})
	}
	switch {
	case c.interval < 10*time.Millisecond || c.interval > time.Minute:
		return fmt.Errorf("invalid %s %v; want 10ms to 1m", source("region-sync-interval"), c.interval)
	case !(c.weight > 0) || math.IsInf(c.weight, 0):
		return fmt.Errorf("invalid %s %v; want a positive number", source("region-weight"), c.weight)
	case strings.Count(c.san, "{region}") != 1:
		return fmt.Errorf("invalid %s %q; want a name with {region} once, such as %s", source("region-san"), c.san, region.DefaultSAN)
	}
	c.files = c.tls
	for _, f := range []struct {
		v    *string
		twin string
	}{{&c.files.Cert, grpcTLS.Cert}, {&c.files.Key, grpcTLS.Key}, {&c.files.ClientCA, grpcTLS.ClientCA}} {
		if *f.v == "" {
			*f.v = f.twin
		}
	}
	mtls := c.files.Cert != "" && c.files.Key != "" && c.files.ClientCA != ""
	switch {
	case !mtls && len(c.parsed) > 0:
		return fmt.Errorf("%s needs mutual TLS between the regions, so that a push is accepted only from the region its certificate names: give %s, %s and %s (each defaults to its -grpc-tls-* twin)",
			source("region-peers"), source("region-tls-cert"), source("region-tls-key"), source("region-tls-ca"))
	case !mtls && c.addr != "":
		return fmt.Errorf("%s is served over mutual TLS only: give %s, %s and %s (each defaults to its -grpc-tls-* twin)",
			source("region-addr"), source("region-tls-cert"), source("region-tls-key"), source("region-tls-ca"))
	case len(c.parsed) > 0 && c.addr == "" && grpcTLS.ClientCA == "":
		return fmt.Errorf("%s without %s: the peers push to the gRPC port, whose listener must then ask for client certificates (%s); or serve region sync on a listener of its own (%s)",
			source("region-peers"), source("grpc-tls-client-ca"), source("grpc-tls-client-ca"), source("region-addr"))
	}
	return nil
}

// regionDial returns how a replica dials its peers: over mutual TLS with
// the region's files (its certificate as the client's, the regions' CAs to
// verify the peers' servers).
func regionDial(c *regionConfig, log *slog.Logger) (func(string) (grpc.ClientConnInterface, error), error) {
	cfg, err := tlsconfig.Peer(c.files, func(err error) { log.Warn("region sync: TLS files changed but could not be read", "error", err) })
	if err != nil {
		return nil, fmt.Errorf("region peers: %w", err)
	}
	creds := credentials.NewTLS(cfg)
	// A link that comes back after a partition is dialed again within half
	// an interval, not after gRPC's default backoff of up to two minutes:
	// the regions' counts converge soon after a partition heals.
	bo := backoff.Config{BaseDelay: max(c.interval/4, 10*time.Millisecond), Multiplier: 1.6, Jitter: 0.2, MaxDelay: max(c.interval/2, 20*time.Millisecond)}
	params := grpc.ConnectParams{Backoff: bo, MinConnectTimeout: max(c.interval, time.Second)}
	return func(addr string) (grpc.ClientConnInterface, error) {
		return grpc.NewClient(addr, grpc.WithTransportCredentials(creds), grpc.WithConnectParams(params))
	}, nil
}

// newEngine puts a region engine in front of inner, keeping the peers'
// counts in store.
func (c *regionConfig) newEngine(inner algo.Backend, store region.Store, now func() time.Time, log *slog.Logger) (*region.Engine, error) {
	opts := region.Options{
		Region: c.name, Weight: c.weight, Peers: c.parsed, Interval: c.interval,
		Store: store, Now: now, Logger: log,
	}
	if len(c.parsed) > 0 {
		var err error
		if opts.Dial, err = regionDial(c, log); err != nil {
			return nil, err
		}
		if opts.Authenticate, err = regionAuth(c, log); err != nil {
			return nil, err
		}
	}
	e, err := region.New(inner, opts)
	if err != nil {
		return nil, err
	}
	peers := make([]string, 0, len(c.parsed))
	for _, p := range c.parsed {
		peers = append(peers, p.Name+"="+p.Addr)
	}
	log.Info("region: limits with scope: global are counted across the regions", "region", c.name, "peers", strings.Join(peers, ","),
		"sync_interval", c.interval, "weight", c.weight, "peer_san", c.san)
	return e, nil
}

// regionAuth returns how pushes are authenticated: by a client
// certificate that chains to the regions' CAs (-region-tls-ca, re-read
// when it changes) and names the region pushing (-region-san). It fails
// when this region's own certificate does not name it: its pushes would
// be refused.
func regionAuth(c *regionConfig, log *slog.Logger) (func(context.Context, string) error, error) {
	srv, err := tlsconfig.Server(c.files, func(err error) { log.Warn("region sync: TLS files changed but could not be read", "error", err) })
	if err != nil {
		return nil, fmt.Errorf("region TLS: %w", err)
	}
	own, err := srv.GetCertificate(nil)
	if err != nil {
		return nil, fmt.Errorf("region TLS: %w", err)
	}
	if names := region.Names(own.Leaf, c.san); !slices.Contains(names, c.name) {
		of := "no region"
		if len(names) > 0 {
			of = "region " + strings.Join(names, ", ")
		}
		return nil, fmt.Errorf("region %s: its certificate %s does not name it (want a URI or DNS SAN %s; it names %s): the peers would refuse its pushes",
			c.name, c.files.Cert, strings.ReplaceAll(c.san, "{region}", c.name), of)
	}
	return region.CertAuth{Roots: func() *x509.CertPool { return tlsconfig.ClientCAs(srv) }, SAN: c.san}.Authenticate, nil
}

// warnGlobalAlone logs, when rules hold limits of scope: global and there
// is no -region, that they are counted in this region alone.
func warnGlobalAlone(rules *config.Rules, log *slog.Logger) {
	if rules == nil {
		return
	}
	var ids []string
	for _, d := range rules.Domains() {
		for _, r := range d.Rules() {
			for _, l := range r.Limits {
				if l.Scope == config.Global {
					ids = append(ids, r.ID)
					break
				}
			}
		}
	}
	if len(ids) > 0 {
		log.Warn("rules with scope: global, but no -region: they are counted in this region alone", "rules", strings.Join(ids, ","))
	}
}

// regionMetrics exports a region engine's counts under ratelimitd_region_.
type regionMetrics struct{ e *region.Engine }

func regionDesc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(metricsNamespace, "region", name), help, labels, nil)
}

var (
	regionKeysDesc     = regionDesc("keys", "Keys of limits with scope: global this replica knows in their current or previous window.")
	regionKnownDesc    = regionDesc("known_count", "Per region, the sum over those keys of its count in their current window, as this replica knows it: its view of the global count.", "region")
	regionUnheardDesc  = regionDesc("peer_unheard_seconds", "Per peer region, the time since any replica of this region last heard from it: the lag of what this region knows of its counts (-1: never heard).", "peer")
	regionPushTookDesc = regionDesc("peer_push_seconds", "Per peer region, how long this replica's last push to it took until acknowledged: the sync delay is at most -region-sync-interval, two such pushes and a quarter interval.", "peer")
	regionCutOffDesc   = regionDesc("peer_cut_off", "1 while the peer region counts as cut off (unheard for 10 sync intervals, at least 1 s), 0 otherwise.", "peer")
	regionPushesDesc   = regionDesc("pushes_total", "Pushes of this region's counts sent to peers, by result.", "result")
	regionBytesDesc    = regionDesc("push_bytes_total", "Bytes (protobuf) of the pushes sent to peers.")
	regionCountsDesc   = regionDesc("push_counts_total", "Counts (one key in one window each) carried by the pushes sent to peers.")
	regionReceivedDesc = regionDesc("received_total", "Pushes received from peers, and the counts they carried; refused: pushes refused because their caller did not prove to be the region they name (its certificate), or named a region not a peer.", "what")
)

func registerRegion(reg prometheus.Registerer, e *region.Engine) {
	if e != nil {
		reg.MustRegister(regionMetrics{e})
	}
}

func (regionMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{regionKeysDesc, regionKnownDesc, regionUnheardDesc, regionPushTookDesc, regionCutOffDesc, regionPushesDesc, regionBytesDesc, regionCountsDesc, regionReceivedDesc} {
		ch <- d
	}
}

func (m regionMetrics) Collect(ch chan<- prometheus.Metric) {
	st := m.e.Stats()
	ch <- prometheus.MustNewConstMetric(regionKeysDesc, prometheus.GaugeValue, float64(st.Keys))
	for r, n := range st.Known {
		ch <- prometheus.MustNewConstMetric(regionKnownDesc, prometheus.GaugeValue, float64(n), r)
	}
	for _, p := range st.Peers {
		ch <- prometheus.MustNewConstMetric(regionUnheardDesc, prometheus.GaugeValue, p.Unheard.Seconds(), p.Name)
		ch <- prometheus.MustNewConstMetric(regionPushTookDesc, prometheus.GaugeValue, p.PushTook.Seconds(), p.Name)
		cut := 0.0
		if p.CutOff {
			cut = 1
		}
		ch <- prometheus.MustNewConstMetric(regionCutOffDesc, prometheus.GaugeValue, cut, p.Name)
	}
	ch <- prometheus.MustNewConstMetric(regionPushesDesc, prometheus.CounterValue, float64(st.Pushes-st.PushFailures), "ok")
	ch <- prometheus.MustNewConstMetric(regionPushesDesc, prometheus.CounterValue, float64(st.PushFailures), "failed")
	ch <- prometheus.MustNewConstMetric(regionBytesDesc, prometheus.CounterValue, float64(st.PushBytes))
	ch <- prometheus.MustNewConstMetric(regionCountsDesc, prometheus.CounterValue, float64(st.PushCounts))
	ch <- prometheus.MustNewConstMetric(regionReceivedDesc, prometheus.CounterValue, float64(st.Received), "pushes")
	ch <- prometheus.MustNewConstMetric(regionReceivedDesc, prometheus.CounterValue, float64(st.ReceivedCounts), "counts")
	ch <- prometheus.MustNewConstMetric(regionReceivedDesc, prometheus.CounterValue, float64(st.Refused), "refused")
}

// regionSync is the component that counts limits of scope: global across
// regions (-region): a layer of the backend stack, the region engine, in
// front of the store, and the sync between regions, served on the gRPC
// port or on a listener of its own (-region-addr).
type regionSync struct {
	config regionConfig
	// grpcTLS are the gRPC listener's files, each -region-tls-* file's
	// default.
	grpcTLS *tlsconfig.Files

	engine *region.Engine // nil without -region
	tls    *tls.Config    // of -region-addr; nil without it
}

func (r *regionSync) addFlags(fs *flag.FlagSet) { addRegionFlags(fs, &r.config) }

func (r *regionSync) check(flagName func(string) string) error {
	return r.config.validate(flagName, *r.grpcTLS)
}

func (r *regionSync) build(_ context.Context, s *server) (hooks, error) {
	if r.config.name == "" {
		// Without regions, a limit of scope: global is counted in this
		// region alone: say so at start and at every reload.
		warn := func(rules *config.Rules) { warnGlobalAlone(rules, s.log) }
		warn(s.source.initial)
		return hooks{rules: warn}, nil
	}
	// The peers' pushes are kept in this region's store, Redis or
	// memory, for every replica to read.
	var store region.Store = region.NewMemoryStore(s.now)
	if s.stack.redis != nil {
		store = region.NewRedisStore(s.stack.redis.Client(), s.stack.prefix, region.KeepFor(r.config.interval))
	}
	e, err := r.config.newEngine(s.stack.main, store, s.now, s.log)
	if err != nil {
		return hooks{}, err
	}
	r.engine = e
	s.stack.main, s.stack.global = e, e
	registerRegion(s.reg, e)
	s.stack.describe = append(s.stack.describe, r.describe)
	if r.config.addr != "" {
		if r.tls, err = listenerTLS("region sync", r.config.files, s.log); err != nil {
			return hooks{}, err
		}
	}
	// The sync goes on while the servers drain after SIGTERM, so that the
	// peers do not count this region as cut off meanwhile.
	rctx, rcancel := context.WithCancel(context.Background())
	return hooks{
		grpc: func(gs *grpc.Server) {
			if r.config.addr == "" {
				e.Register(gs)
			}
		},
		listeners: func() []listener { return r.listeners(s) },
		start:     func(context.Context) { go e.Run(rctx) },
		close:     rcancel,
	}, nil
}

// listeners serves region sync alone on -region-addr, over mutual TLS
// with the region's files, decoding requests as the gRPC port does: the
// peers' pushes, apart from the port Envoy calls. None without
// -region-addr.
func (r *regionSync) listeners(s *server) []listener {
	if r.config.addr == "" {
		return nil
	}
	// Region sync tolerates no string that is not UTF-8: its pushes are
	// refused naming the field.
	opts := append(wire.DecodeOptions(), s.recovery.ServerOptions()...)
	opts = append(opts, grpc.Creds(credentials.NewTLS(r.tls)))
	gs := grpc.NewServer(opts...)
	r.engine.Register(gs)
	return []listener{grpcListener("region sync", r.config.addr, gs, s.log, logServing(s.log, "serving region sync", "mtls", true))}
}

// describe adds the region and its peers to what the ops console shows.
func (r *regionSync) describe(d *console.Backend) {
	st := r.engine.Stats()
	cr := &console.Region{Name: st.Region, Keys: st.Keys, Pushes: st.Pushes, PushFailures: st.PushFailures, Received: st.Received, Peers: []console.Peer{}}
	for _, p := range st.Peers {
		unheard := "never"
		if p.Unheard >= 0 {
			unheard = p.Unheard.Round(time.Millisecond).String()
		}
		cr.Peers = append(cr.Peers, console.Peer{Name: p.Name, Addr: p.Addr, Unheard: unheard, CutOff: p.CutOff, Weight: p.Weight})
	}
	d.Region = cr
}
