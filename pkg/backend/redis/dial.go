package redis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Mode is how ratelimitd finds its Redis.
type Mode string

const (
	// Standalone is one Redis server (or a proxy that looks like one).
	Standalone Mode = "standalone"
	// Sentinel asks Redis Sentinels for the current master of a name and
	// follows it across failovers.
	Sentinel Mode = "sentinel"
	// Cluster is a Redis Cluster, reached through any of its nodes.
	Cluster Mode = "cluster"
)

// Defaults of [Config] for a decision service: a decision that waits for
// Redis longer than a few tens of milliseconds is worse than one taken by
// the failure policy.
const (
	DefaultDialTimeout  = 250 * time.Millisecond
	DefaultReadTimeout  = 100 * time.Millisecond
	DefaultWriteTimeout = 100 * time.Millisecond
	// DefaultClusterReloadInterval is how old a Cluster's slot map may
	// grow before the client reads it again (go-redis's default is 60 s).
	// A failed or refused primary triggers a reload at once besides
	// ([Backend.DecideVia]); the period bounds what no call's failure
	// reveals. One CLUSTER SLOTS a second per replica costs Redis nothing
	// to speak of.
	DefaultClusterReloadInterval = time.Second
)

// Config says how to reach Redis. The zero value of every field but URL
// selects a default.
type Config struct {
	// URL is redis://[user:password@]host:port[/db], or rediss:// for TLS.
	// For Sentinel it names the sentinels and for Cluster some of its
	// nodes, comma-separated; the scheme, credentials and database of the
	// first apply to every address. The credentials are those of the data
	// nodes (for Sentinel: the master and replicas).
	URL  string
	Mode Mode
	// MasterName is the name the sentinels monitor (Sentinel only).
	MasterName string
	// SentinelUsername and SentinelPassword authenticate to the sentinels
	// themselves, when they require it.
	SentinelUsername, SentinelPassword string
	// PoolSize is the most connections to each node; 0 selects go-redis's
	// 10 per CPU.
	PoolSize int
	// DialTimeout bounds opening a connection; ReadTimeout and WriteTimeout
	// each socket read and write of a call. Waiting for a free connection
	// of the pool is bounded by ReadTimeout too.
	DialTimeout, ReadTimeout, WriteTimeout time.Duration
	// ClusterReloadInterval is how old a Cluster's slot map may grow
	// before it is read again (Cluster only).
	ClusterReloadInterval time.Duration
	// TLSCAFile names a PEM file of the CAs to trust (default: the
	// system's); TLSCertFile and TLSKeyFile a client certificate for
	// mutual TLS. They apply to rediss:// URLs only.
	TLSCAFile, TLSCertFile, TLSKeyFile string
}

// Dial connects to Redis as cfg says, checks that it answers and runs Lua
// ([Backend.Check]), and returns a backend that closes the connections on
// Close.
func Dial(ctx context.Context, cfg Config, opts Options) (*Backend, error) {
	b, err := Open(cfg, opts)
	if err != nil {
		return nil, err
	}
	if err := b.Check(ctx); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// Open returns a backend on a new client for cfg, without connecting: the
// first decision connects, and loads the script if Redis lacks it. Close
// closes the client.
func Open(cfg Config, opts Options) (*Backend, error) {
	client, err := NewClient(cfg)
	if err != nil {
		return nil, err
	}
	b := New(client, opts)
	b.owned = true
	b.cfg = cfg
	return b, nil
}

// Check connects, refuses a server of the wrong mode (a Cluster node
// reached as standalone, say) and loads the script. An error for which
// [Unreachable] is true means Redis could not be reached at all.
func (b *Backend) Check(ctx context.Context) error {
	if err := b.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: %s mode at %s: %w", modeName(b.cfg.Mode), RedactURL(b.cfg.URL), err)
	}
	if err := checkMode(ctx, b.client, b.cfg.Mode); err != nil {
		return err
	}
	return b.LoadScript(ctx)
}

// Unreachable reports whether err says Redis could not be reached (a
// refused or timed-out connection), as opposed to Redis answering with an
// error (a wrong password, the wrong mode).
func Unreachable(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, context.DeadlineExceeded) ||
		strings.Contains(err.Error(), "all sentinels specified in configuration are unreachable")
}

// modeName names mode, the empty mode being standalone.
func modeName(m Mode) Mode {
	if m == "" {
		return Standalone
	}
	return m
}

// checkMode refuses a Cluster node reached in standalone or sentinel mode:
// its keys live on several masters, and every call for another master's
// slot would fail with MOVED. A server that does not let the user run INFO
// is not checked.
func checkMode(ctx context.Context, c goredis.UniversalClient, mode Mode) error {
	if mode == Cluster {
		return nil
	}
	info, err := c.Info(ctx, "cluster").Result()
	if err == nil && strings.Contains(info, "cluster_enabled:1") {
		return fmt.Errorf("redis: the server is a Cluster node; use -redis-mode cluster")
	}
	return nil
}

// Close stops the coalescing workers, and closes the client if [Open] or
// [Dial] made it.
func (b *Backend) Close() error {
	if b.co != nil {
		b.co.close()
	}
	if b.owned {
		return b.client.Close()
	}
	return nil
}

// NewClient returns a go-redis client for cfg without connecting.
func NewClient(cfg Config) (goredis.UniversalClient, error) {
	if cfg.URL == "" {
		return nil, errors.New("redis: no URL: give redis://host:port (comma-separated addresses for sentinel and cluster)")
	}
	first, addrs, err := parseURLs(cfg.URL)
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if first.TLSConfig != nil {
		if err := addTLSFiles(first.TLSConfig, cfg); err != nil {
			return nil, err
		}
	} else if cfg.TLSCAFile != "" || cfg.TLSCertFile != "" {
		return nil, errors.New("redis: TLS files given for a redis:// URL; use rediss:// to connect with TLS")
	}

	switch cfg.Mode {
	case Standalone, "":
		return newStandalone(cfg, first, addrs)
	case Sentinel:
		return newSentinel(cfg, first, addrs)
	case Cluster:
		return newCluster(cfg, first, addrs)
	}
	return nil, fmt.Errorf("redis: unknown mode %q; accepted: standalone, sentinel, cluster", cfg.Mode)
}

// parseURLs parses the comma-separated addresses of a Config's URL: it
// returns the options of the first, whose scheme, credentials and
// database apply to every address, and the address (host:port) of each.
// A bare host:port shares the scheme of the URL before it; the URLs may
// not mix redis:// and rediss://. An error shows no password.
func parseURLs(rawURL string) (first *goredis.Options, addrs []string, _ error) {
	parts := strings.Split(rawURL, ",")
	addrs = make([]string, 0, len(parts))
	scheme := "redis"
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if s, _, ok := strings.Cut(p, "://"); !ok {
			// A bare host:port shares the scheme of the URL before it.
			p = scheme + "://" + p
		} else if i == 0 {
			scheme = s
		}
		o, err := goredis.ParseURL(p)
		var urlErr *url.Error
		if errors.As(err, &urlErr) {
			err = urlErr.Err // without the URL and its password
		}
		if err != nil {
			hint := ""
			if u, perr := url.Parse(p); perr == nil && u.Query().Has("password") {
				hint = "; give the password as the URL's user info: redis://[user]:PASSWORD@host:port"
			}
			return nil, nil, fmt.Errorf("redis: address %d of the URL (%s): %w%s", i+1, RedactURL(p), err, hint)
		}
		if first == nil {
			first = o
		} else if (o.TLSConfig == nil) != (first.TLSConfig == nil) {
			return nil, nil, fmt.Errorf("redis: address %d of the URL mixes redis:// and rediss://", i+1)
		}
		addrs = append(addrs, o.Addr)
	}
	return first, addrs, nil
}

// withDefaults returns cfg with the default of each timeout and interval
// left zero.
func (cfg Config) withDefaults() Config {
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.ReadTimeout == 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.ClusterReloadInterval == 0 {
		cfg.ClusterReloadInterval = DefaultClusterReloadInterval
	}
	return cfg
}

// newStandalone returns the client of one server, the one address of
// addrs, whose URL gave first.
func newStandalone(cfg Config, first *goredis.Options, addrs []string) (goredis.UniversalClient, error) {
	if len(addrs) > 1 {
		return nil, fmt.Errorf("redis: standalone mode takes one address, the URL has %d; for several nodes use -redis-mode cluster or sentinel", len(addrs))
	}
	o := first
	o.PoolSize, o.DialTimeout, o.ReadTimeout, o.WriteTimeout = cfg.PoolSize, cfg.DialTimeout, cfg.ReadTimeout, cfg.WriteTimeout
	o.PoolTimeout, o.MaxRetries, o.ContextTimeoutEnabled = cfg.ReadTimeout, maxRetries, true
	o.DialerRetries = dialAttempts
	o.Dialer = dialer(cfg.DialTimeout, o.TLSConfig)
	return goredis.NewClient(o), nil
}

// newSentinel returns the client of the master that the sentinels at
// addrs name, with the credentials and database of first.
func newSentinel(cfg Config, first *goredis.Options, addrs []string) (goredis.UniversalClient, error) {
	if cfg.MasterName == "" {
		return nil, errors.New("redis: sentinel mode needs the master's name (-redis-master)")
	}
	return goredis.NewFailoverClient(&goredis.FailoverOptions{
		MasterName:            cfg.MasterName,
		SentinelAddrs:         addrs,
		SentinelUsername:      cfg.SentinelUsername,
		SentinelPassword:      cfg.SentinelPassword,
		Username:              first.Username,
		Password:              first.Password,
		DB:                    first.DB,
		TLSConfig:             first.TLSConfig,
		PoolSize:              cfg.PoolSize,
		DialTimeout:           cfg.DialTimeout,
		ReadTimeout:           cfg.ReadTimeout,
		WriteTimeout:          cfg.WriteTimeout,
		PoolTimeout:           cfg.ReadTimeout,
		MaxRetries:            maxRetries,
		DialerRetries:         dialAttempts,
		ContextTimeoutEnabled: true,
		Dialer:                dialer(cfg.DialTimeout, first.TLSConfig),
	}), nil
}

// newCluster returns the client of the Cluster that the nodes at addrs
// belong to, with the credentials of first.
func newCluster(cfg Config, first *goredis.Options, addrs []string) (goredis.UniversalClient, error) {
	if first.DB != 0 {
		return nil, fmt.Errorf("redis: a cluster has only database 0; the URL selects %d", first.DB)
	}
	return goredis.NewClusterClient(&goredis.ClusterOptions{
		Addrs:                 addrs,
		Username:              first.Username,
		Password:              first.Password,
		TLSConfig:             first.TLSConfig,
		PoolSize:              cfg.PoolSize,
		DialTimeout:           cfg.DialTimeout,
		ReadTimeout:           cfg.ReadTimeout,
		WriteTimeout:          cfg.WriteTimeout,
		PoolTimeout:           cfg.ReadTimeout,
		MaxRetries:            maxRetries,
		DialerRetries:         dialAttempts,
		ContextTimeoutEnabled: true,
		Dialer:                dialer(cfg.DialTimeout, first.TLSConfig),
		// A primary that dies gives no MOVED, only refused
		// connections: the slot map is read again every period, and
		// whenever a primary fails (Backend.DecideVia).
		ClusterStateReloadInterval: cfg.ClusterReloadInterval,
	}), nil
}

// maxRetries is how often go-redis repeats a call that failed on the
// network (a broken pooled connection, say, after a failover). A decision
// is not idempotent: when the first call did run and only its answer was
// lost, the retry consumes the hits again. That errs toward refusing, never
// toward admitting more than the limit.
const maxRetries = 1

// dialAttempts is how many times one call tries to open a connection.
// go-redis's default, 5 attempts 100 ms apart, would hold a decision for
// half a second against a dead server; the circuit breaker, not the pool,
// is what retries a backend that is down.
const dialAttempts = 1

// addTLSFiles adds cfg's CA and client certificate to t.
func addTLSFiles(t *tls.Config, cfg Config) error {
	if cfg.TLSCAFile != "" {
		pem, err := os.ReadFile(cfg.TLSCAFile)
		if err != nil {
			return fmt.Errorf("redis: TLS CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("redis: TLS CA file %s holds no PEM certificate", cfg.TLSCAFile)
		}
		t.RootCAs = pool
	}
	if (cfg.TLSCertFile == "") != (cfg.TLSKeyFile == "") {
		return errors.New("redis: a TLS client certificate needs both the certificate and the key file")
	}
	if cfg.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return fmt.Errorf("redis: TLS client certificate: %w", err)
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return nil
}

// Logger passes go-redis's own log lines to a slog logger: news from the
// sentinels (the master they name) at info level, anything else (a pool
// failing to dial, say) at warn level. Install it with goredis.SetLogger.
type Logger struct{ Log *slog.Logger }

// Printf implements go-redis's logging interface.
func (l Logger) Printf(ctx context.Context, format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	level := slog.LevelWarn
	if strings.HasPrefix(msg, "sentinel: ") {
		level = slog.LevelInfo
	}
	l.Log.Log(ctx, level, "redis client: "+msg)
}

// RedactURL returns the URL (or comma-separated URLs) with every password
// replaced by "xxxxx", fit for logs and errors: the user info's, and the
// value of every query parameter whose name says it holds a secret
// (password, pass, pwd, secret, token, key, auth, credential). A URL too
// broken to parse is not shown at all.
func RedactURL(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil {
			if strings.Contains(p, "@") || strings.Contains(p, "?") {
				parts[i] = "<unparsable URL hidden: it may hold a password>"
			}
			continue
		}
		if u.RawQuery != "" {
			q, err := url.ParseQuery(u.RawQuery)
			if err != nil {
				u.RawQuery = "<unparsable query hidden>"
			} else {
				for name := range q {
					if secretParam(name) {
						q[name] = []string{"xxxxx"}
					}
				}
				u.RawQuery = q.Encode()
			}
		}
		parts[i] = u.Redacted()
	}
	return strings.Join(parts, ",")
}

// secretParam reports whether a URL query parameter of this name may hold
// a secret.
func secretParam(name string) bool {
	name = strings.ToLower(name)
	for _, s := range []string{"pass", "pwd", "secret", "token", "key", "auth", "cred"} {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
}
