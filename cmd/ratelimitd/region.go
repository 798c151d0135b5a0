package main

import (
	"flag"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/region"
	"github.com/ratelimitd/ratelimitd/pkg/tlsconfig"
)

// regionConfig is the multi-region configuration (-region*).
type regionConfig struct {
	name     string
	peers    string // as given: name=host:port,...
	interval time.Duration
	weight   float64
	parsed   []region.Peer
}

func addRegionFlags(fs *flag.FlagSet, c *regionConfig) {
	fs.StringVar(&c.name, "region", "", "this region's `name`: limits with scope: global are counted across it and its -region-peers (docs/multi-region.md); empty: one region, every limit counted here alone")
	fs.StringVar(&c.peers, "region-peers", "", "the other regions, `name=host:port,...`: each region's name and the gRPC address of its replicas, to push this region's counts to")
	fs.DurationVar(&c.interval, "region-sync-interval", region.DefaultInterval, "how often each replica pushes its region's counts of global limits to every peer region, and reads what they pushed")
	fs.Float64Var(&c.weight, "region-weight", 1, "this region's part of a global limit while cut off from a peer, relative to the other regions' -region-weight (equal by default)")
}

// validate checks the -region* flags; source names a flag as the user set
// it.
func (c *regionConfig) validate(source func(string) string) error {
	if c.name == "" {
		if c.peers != "" {
			return fmt.Errorf("%s needs %s: name this region first", source("region-peers"), source("region"))
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
	}
	return nil
}

// regionDial returns how a replica dials its peers: with the gRPC
// listener's files for mutual TLS (its certificate as the client's, its
// client CAs to verify the peers') when they name all three, else in
// plaintext.
func regionDial(c *serveConfig, log *slog.Logger) (func(string) (grpc.ClientConnInterface, error), error) {
	creds := insecure.NewCredentials()
	if f := c.grpcTLS; f.ClientCA != "" {
		cfg, err := tlsconfig.Peer(f, func(err error) { log.Warn("region sync: TLS files changed but could not be read", "error", err) })
		if err != nil {
			return nil, fmt.Errorf("region peers: %w", err)
		}
		creds = credentials.NewTLS(cfg)
	}
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
	dial, err := regionDial(c, log)
	if err != nil {
		return nil, nil, err
	}
	e, err := region.New(inner, region.Options{
		Region: c.region.name, Weight: c.region.weight, Peers: c.region.parsed, Interval: c.region.interval,
		Store: store, Dial: dial, Now: now, Logger: log,
	})
	if err != nil {
		return nil, nil, err
	}
	peers := make([]string, 0, len(c.region.parsed))
	for _, p := range c.region.parsed {
		peers = append(peers, p.Name+"="+p.Addr)
	}
	log.Info("region: limits with scope: global are counted across the regions", "region", c.region.name, "peers", strings.Join(peers, ","),
		"sync_interval", c.region.interval, "weight", c.region.weight, "mtls", c.grpcTLS.ClientCA != "")
	return e, e, nil
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
	regionReceivedDesc = regionDesc("received_total", "Pushes received from peers, and the counts they carried.", "what")
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
}
