package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/config"
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
func regionDial(c *serveConfig, log *slog.Logger) (func(string) (grpc.ClientConnInterface, error), error) {
	cfg, err := tlsconfig.Peer(c.region.files, func(err error) { log.Warn("region sync: TLS files changed but could not be read", "error", err) })
	if err != nil {
		return nil, fmt.Errorf("region peers: %w", err)
	}
	creds := credentials.NewTLS(cfg)
	// A link that comes back after a partition is dialed again within half
	// an interval, not after gRPC's default backoff of up to two minutes:
	// the regions' counts converge soon after a partition heals.
	bo := backoff.Config{BaseDelay: max(c.region.interval/4, 10*time.Millisecond), Multiplier: 1.6, Jitter: 0.2, MaxDelay: max(c.region.interval/2, 20*time.Millisecond)}
	params := grpc.ConnectParams{Backoff: bo, MinConnectTimeout: max(c.region.interval, time.Second)}
	return func(addr string) (grpc.ClientConnInterface, error) {
		return grpc.NewClient(addr, grpc.WithTransportCredentials(creds), grpc.WithConnectParams(params))
	}, nil
}

// newRegion puts a region engine in front of inner, keeping the peers'
// counts in store, when -region is set; it returns inner and nil without.
func newRegion(c *serveConfig, inner algo.Backend, store region.Store, now func() time.Time, log *slog.Logger) (algo.Backend, *region.Engine, error) {
	if c.region.name == "" {
		return inner, nil, nil
	}
	opts := region.Options{
		Region: c.region.name, Weight: c.region.weight, Peers: c.region.parsed, Interval: c.region.interval,
		Store: store, Now: now, Logger: log,
	}
	if len(c.region.parsed) > 0 {
		var err error
		if opts.Dial, err = regionDial(c, log); err != nil {
			return nil, nil, err
		}
		if opts.Authenticate, err = regionAuth(&c.region, log); err != nil {
			return nil, nil, err
		}
	}
	e, err := region.New(inner, opts)
	if err != nil {
		return nil, nil, err
	}
	peers := make([]string, 0, len(c.region.parsed))
	for _, p := range c.region.parsed {
		peers = append(peers, p.Name+"="+p.Addr)
	}
	log.Info("region: limits with scope: global are counted across the regions", "region", c.region.name, "peers", strings.Join(peers, ","),
		"sync_interval", c.region.interval, "weight", c.region.weight, "peer_san", c.region.san)
	return e, e, nil
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

// serveRegion serves region sync (e's ratelimitd.v1.RegionSync) alone on
// addr, over cfg's mutual TLS, decoding requests as the gRPC port does and
// recovering panics with its recovery; a failure of the server goes to
// failed.
func serveRegion(addr string, cfg *tls.Config, e *region.Engine, recovery *wire.Recovery, log *slog.Logger, failed chan<- error) (*grpc.Server, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("region sync listener: %w", err)
	}
	// Region sync tolerates no string that is not UTF-8: its pushes are
	// refused naming the field.
	opts := append(wire.DecodeOptions(), recovery.ServerOptions()...)
	opts = append(opts, grpc.Creds(credentials.NewTLS(cfg)))
	gs := grpc.NewServer(opts...)
	e.Register(gs)
	go func() { failed <- fmt.Errorf("region sync server: %w", gs.Serve(lis)) }()
	log.Info("serving region sync", "addr", lis.Addr().String(), "mtls", true)
	return gs, nil
}

// warnGlobalAlone logs, when rules hold limits of scope: global and there
// is no -region, that they are counted in this region alone.
func warnGlobalAlone(c *serveConfig, rules *config.Rules, log *slog.Logger) {
	if c.region.name != "" || rules == nil {
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
