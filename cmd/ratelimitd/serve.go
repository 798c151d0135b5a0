package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/breaker"
	"github.com/ratelimitd/ratelimitd/pkg/backend/lease"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/backend/overlimit"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/config"
	"github.com/ratelimitd/ratelimitd/pkg/metrics"
	"github.com/ratelimitd/ratelimitd/pkg/region"
	"github.com/ratelimitd/ratelimitd/pkg/reload"
	"github.com/ratelimitd/ratelimitd/pkg/rlqs"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// evictionReportInterval is how often serve reports evictions of live keys.
const evictionReportInterval = 30 * time.Second

// redisGCPercent is the garbage collector's target (GOGC) on the Redis
// backend when the environment sets none.
const redisGCPercent = 400

// tuneGC lets the heap of a Redis-backed replica grow to 5 times its live
// size between collections instead of twice, unless GOGC is set. Such a
// heap holds no counters, only the garbage of calls in flight, so it
// stays small (tens of MB), and collecting it at Go's default rate cost
// a seventh of ratelimitd's CPU under load (docs/performance.md). The
// memory backend's heap is its counters: there GOGC=400 would mean five
// times their size, so the default stays, and operators choose.
func tuneGC(c *serveConfig, log *slog.Logger) {
	if c.backend != "redis" {
		return
	}
	if v, ok := c.lookupEnv("GOGC"); ok {
		log.Info("garbage collector: GOGC from the environment", "gogc", v)
		return
	}
	debug.SetGCPercent(redisGCPercent)
	log.Info("garbage collector: GOGC unset, collecting at 400% growth (a Redis-backed heap is small)", "gogc", redisGCPercent)
}

// streamWorkers is the size of the gRPC server's goroutine pool: about as
// many calls as a replica has in flight under load (each waits on the
// backend for most of its time).
const streamWorkers = 64

// serve runs the servers until ctx is done, then drains them.
func serve(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stderr io.Writer) int {
	c, log, code := configure(args, lookupEnv, stderr)
	if c == nil {
		return code
	}
	if err := run(ctx, c, log); err != nil {
		log.Error("ratelimitd stopped", "error", err)
		return exitError
	}
	return exitOK
}

// configure reads serve's configuration from args and the environment,
// compatibility mode's included, and validates it. It returns the
// configuration and the logger it asks for, or nil and the exit code once
// it has written why to stderr (exitOK for -help).
func configure(args []string, lookupEnv func(string) (string, bool), stderr io.Writer) (*serveConfig, *slog.Logger, int) {
	compat, err := compatMode(lookupEnv)
	if err != nil {
		fmt.Fprintf(stderr, "ratelimitd: %v\n", err)
		return nil, nil, exitUsage
	}
	var compatFlags, notHonoured []string
	var compatFrom map[string]string
	if compat {
		if compatFlags, notHonoured, compatFrom, err = compatArgs(lookupEnv); err != nil {
			fmt.Fprintf(stderr, "ratelimitd: %v\n", err)
			return nil, nil, exitUsage
		}
		args = append(slices.Clip(compatFlags), args...)
		lookupEnv = compatEnvironment(lookupEnv)
	}
	c := &serveConfig{}
	fs := newServeFlags(c)
	c.flags = fs
	fs.Usage = func() { usage(stderr) }
	if c.fromEnv, err = parseFlags(fs, args, lookupEnv, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, nil, exitOK
		}
		fmt.Fprintf(stderr, "ratelimitd: %v%s\n", err, compatSource(err, compatFrom))
		return nil, nil, exitUsage
	}
	if compat {
		// Errors about a flag the reference's settings gave name them.
		own := commandLineFlags(args[len(compatFlags):])
		for name, from := range compatFrom {
			if !own[name] {
				c.fromEnv[name] = from
			}
		}
	}
	c.lookupEnv = lookupEnv
	if err := c.validate(); err != nil {
		fmt.Fprintf(stderr, "ratelimitd: %v\n", err)
		return nil, nil, exitUsage
	}
	log := newLogger(c, stderr)
	if compat {
		log.Info("envoyproxy/ratelimit compatibility mode: configured from its environment", "flags", redactArgs(compatFlags))
		if len(notHonoured) > 0 {
			log.Warn("envoyproxy/ratelimit settings not honoured (docs/migrating.md)", "settings", notHonoured)
		}
	}
	return c, log, exitOK
}

func run(ctx context.Context, c *serveConfig, log *slog.Logger) error {
	ctx, cancel := context.WithCancel(ctx) // ends the xDS client on every return
	defer cancel()
	var rules *config.Rules
	var fromXDS *xdsSource // rules from -xds-server instead of -config; nil for files
	if c.xds.server != "" {
		var err error
		if fromXDS, err = startXDS(ctx, c, log); err != nil {
			return err
		}
		if rules = fromXDS.initial(ctx, c.xds.forceStart, log); rules == nil {
			log.Info("stopped before the first rules arrived from xDS")
			return nil
		}
	} else {
		var err error
		if rules, err = config.LoadOptions(c.config, c.configOpts); err != nil {
			return fmt.Errorf("loading rules from %s:\n%w", c.config, err)
		}
		log.Info("rules loaded", "path", c.config, "files", len(rules.Files()), "domains", len(rules.Domains()), "hash", rules.Hash())
		for _, w := range rules.Warnings() {
			log.Warn("rules: " + w.Error())
		}
	}

	tuneGC(c, log)
	logKeyFormat(c, rules, log)
	reg := newRegistry()
	be, err := newBackend(ctx, c, log, reg)
	if err != nil {
		return err
	}
	defer be.close()

	// Requests are decoded first: descriptor bytes that are not UTF-8 are
	// decided, other requests that do not decode are refused naming the
	// field (service.DecodeOptions); its interceptors are the outermost.
	grpcOpts := service.DecodeOptions()
	if c.tracing {
		tp, err := newTracerProvider(ctx, c.lookupEnv)
		if err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := tp.Shutdown(sctx); err != nil {
				log.Warn("tracing: spans not flushed at exit", "error", err)
			}
		}()
		be.main = newTracedBackend(be.main, tp, c.backend)
		grpcOpts = append(grpcOpts, tracingServerOptions(tp)...)
		log.Info("tracing on: exporting spans as the OTEL_* variables say")
	}

	mets, err := metrics.New(reg, metrics.Options{Logger: log, MaxDetailedSeries: c.maxDetailedSeries})
	if err != nil {
		return err
	}
	mets.Rules(rules)
	// envoyproxy/ratelimit's statistics, when asked for, beside ours.
	ref, err := newRefStats(c, log, reg)
	if err != nil {
		return err
	}
	defer ref.close()
	ref.configLoaded(true)
	mode, _ := config.ParseFailureMode(c.failureMode)              // validated
	overLimitHits, _ := config.ParseOverLimitHits(c.overLimitHits) // validated
	// The rules in force were loaded now, or at the watcher's last reload.
	loadedAt, loaded := time.Now(), func() time.Time { return time.Time{} }
	rulesLoaded := func() time.Time {
		if t := loaded(); t.After(loadedAt) {
			return t
		}
		return loadedAt
	}
	// The ops console (-ui) observes decisions beside the metrics.
	cons, err := newConsole(c, be, fromXDS, rulesLoaded, log)
	if err != nil {
		return err
	}
	observers := []service.Observer{mets, ref.observer()}
	if cons != nil {
		observers = append(observers, cons)
	}
	svc, err := service.New(be.main, rules, service.Options{
		Logger: log, Bounds: c.bounds,
		FailureMode: mode, Fallback: be.fallback, LocalShare: c.localShare, Now: be.now,
		ResponseHeaders: c.responseHeaders, HeaderNames: c.headerNames, DynamicMetadata: c.dynamicMetadata, NearLimitRatio: c.nearLimitRatio,
		Observer: service.Tee(observers...), EnableReset: c.enableReset, Leases: be.leases, Global: be.global,
		ShadowMode: c.shadowMode, QuotaMode: c.quotaMode, OverLimitHits: overLimitHits,
		ReferenceKeys: c.referenceKeys(),
	})
	if err != nil {
		return err
	}
	registerService(reg, svc, rulesLoaded)
	reg.MustRegister(sourceInfo{fromXDS})
	if c.redisStartup.healthCheck && be.redis != nil {
		go watchRedisHealth(ctx, be.redis, redisHealthInterval, func(bad bool) {
			svc.SetUnhealthy("redis", "no connection to Redis", bad)
		}, log)
	}
	// The RLQS server exists before rules can be reloaded, so that every
	// reload pushes what it changed to its streams; it is registered on the
	// gRPC server below.
	var quota *rlqs.Server // nil with -rlqs=false
	if c.rlqs.on {
		opts := c.rlqs.options()
		opts.Rules, opts.Budget, opts.Now, opts.Logger = svc.Rules, be.quota, be.now, log
		if quota, err = rlqs.New(opts); err != nil {
			return err
		}
		registerRLQS(reg, quota)
	}
	warnGlobalAlone(c, rules, log)
	setRules := func(r *config.Rules) {
		svc.SetRules(r)
		warnGlobalAlone(c, r, log)
		if quota != nil {
			quota.Reload() // after SetRules: the pushes read the new rules
		}
	}
	if fromXDS != nil {
		// With -xds-ready-with-rules, health follows whether the rules
		// in force hold a domain, as the reference's config component
		// does (src/service/ratelimit.go, SetConfig).
		// The set served before the first rules arrive is empty too.
		awaiting := func(r *config.Rules) bool { return c.xds.readyWithRules && len(r.Domains()) == 0 }
		svc.SetAwaitingRules(awaiting(rules))
		// Every update and every rejection counts in the reference's
		// statistics, as its SetConfig counts them
		// (src/service/ratelimit.go).
		fromXDS.attach(rules, func(r *config.Rules) {
			setRules(r)
			mets.Rules(r)
			svc.SetAwaitingRules(awaiting(r))
			ref.configLoaded(true)
		}, func(error) { ref.configLoaded(false) })
		registerXDS(reg, fromXDS)
		loaded = func() time.Time { return fromXDS.client.Status().LastUpdate }
	} else if c.watchConfig {
		apply := func(r *config.Rules) {
			setRules(r)
			mets.Rules(r)
			ref.configLoaded(true)
		}
		reject := func(error) { ref.configLoaded(false) }
		rw, err := reload.New(reload.Options{Path: c.config, Config: c.configOpts, Apply: apply, Reject: reject, Logger: log, Current: rules})
		if err != nil {
			// Serving without reload beats not serving (the inotify limit,
			// say); a restart still picks up new rules.
			log.Error("rules are not watched: edits need a restart", "path", c.config, "error", err)
		} else {
			go rw.Run(ctx)
			registerReload(reg, rw)
			loaded = rw.LastReload
			log.Info("watching rules for changes", "path", c.config)
		}
	}

	// TLS files are checked before any port is opened.
	grpcTLS, err := listenerTLS("gRPC", c.grpcTLS, log)
	if err != nil {
		return err
	}
	httpTLS, err := listenerTLS("HTTP", c.httpTLS, log)
	if err != nil {
		return err
	}
	var regionTLS *tls.Config // of -region-addr
	if c.region.addr != "" {
		if regionTLS, err = listenerTLS("region sync", c.region.files, log); err != nil {
			return err
		}
	}

	grpcLis, err := listenGRPC(c.grpcAddr)
	if err != nil {
		return fmt.Errorf("gRPC listener: %w", err)
	}
	httpLis, err := net.Listen("tcp", c.httpAddr)
	if err != nil {
		grpcLis.Close()
		return fmt.Errorf("HTTP listener: %w", err)
	}

	// A panicking handler is answered Internal and logged; the process stays.
	grpcOpts = append(grpcOpts, ref.serverOptions()...)
	grpcOpts = append(grpcOpts,
		grpc.ChainUnaryInterceptor(svc.UnaryInterceptor()),
		grpc.ChainStreamInterceptor(svc.StreamInterceptor()),
	)
	if grpcTLS != nil {
		grpcOpts = append(grpcOpts, grpc.Creds(credentials.NewTLS(grpcTLS)))
	}
	// Calls run on a pool of goroutines whose stacks have already grown:
	// a goroutine per call spent a tenth of the CPU growing its stack
	// (docs/performance.md). Calls beyond the pool get goroutines of their
	// own, so the pool never makes a call wait.
	grpcOpts = append(grpcOpts, grpc.NumStreamWorkers(streamWorkers))
	if c.grpcMaxConnAge > 0 {
		grpcOpts = append(grpcOpts, grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionAge:      c.grpcMaxConnAge,
			MaxConnectionAgeGrace: c.grpcMaxConnAgeGrace,
		}))
	}
	gs := grpc.NewServer(grpcOpts...)
	svc.RegisterGRPC(gs)
	if be.region != nil {
		if c.region.addr == "" {
			be.region.Register(gs)
		}
		registerRegion(reg, be.region)
		// The sync goes on while the servers drain after SIGTERM, so that
		// the peers do not count this region as cut off meanwhile.
		rctx, rcancel := context.WithCancel(context.WithoutCancel(ctx))
		defer rcancel()
		go be.region.Run(rctx)
	}
	if quota != nil {
		quota.Register(gs)
		log.Info("serving Envoy's Rate Limit Quota Service (RLQS) on the gRPC port; each limit's budget is held in the backend, shared by every replica on it (docs/rlqs.md)", "backend", c.backend)
	}
	app := svc.WrapHTTP(withConsole(withMetrics(withRLQSExplain(withRulesSource(svc.HTTPHandler(), c, fromXDS), quota), reg), cons, svc))
	hs := newHTTPServer(app, log)
	hs.TLSConfig = httpTLS
	servers := []*http.Server{hs}

	failed := make(chan error, 5)
	// Region sync on a listener of its own: the peers' pushes, over mutual
	// TLS with the region's files, apart from the port Envoy calls.
	var rs *grpc.Server
	if regionTLS != nil {
		if rs, err = serveRegion(c.region.addr, regionTLS, be.region, svc, log, failed); err != nil {
			gs.Stop()
			grpcLis.Close()
			httpLis.Close()
			return err
		}
		defer rs.Stop() // after the graceful stop below, or on an early return
	}
	go func() { failed <- fmt.Errorf("gRPC server: %w", gs.Serve(grpcLis)) }()
	go func() {
		if httpTLS != nil {
			// No file names: the config supplies the certificate and rotates it.
			failed <- fmt.Errorf("HTTP server: %w", hs.ServeTLS(httpLis, "", ""))
			return
		}
		failed <- fmt.Errorf("HTTP server: %w", hs.Serve(httpLis))
	}()
	log.Info("serving gRPC", "addr", grpcLis.Addr().String(), "tls", grpcTLS != nil, "mtls", c.grpcTLS.ClientCA != "")
	log.Info("serving HTTP", "addr", httpLis.Addr().String(), "tls", httpTLS != nil, "mtls", c.httpTLS.ClientCA != "")
	if c.debugAddr != "" {
		debugLis, err := net.Listen("tcp", c.debugAddr)
		if err != nil {
			gs.Stop()
			hs.Close()
			return fmt.Errorf("debug listener: %w", err)
		}
		ds := newHTTPServer(debugHandler(app), log)
		ds.WriteTimeout = 0 // profiles and traces stream for as long as asked
		servers = append(servers, ds)
		go func() { failed <- fmt.Errorf("debug server: %w", ds.Serve(debugLis)) }()
		log.Warn("serving profiles (pprof): keep this address private", "addr", debugLis.Addr().String())
	}

	if rs, err := ref.listen(c, log, failed); err != nil {
		gs.Stop()
		for _, h := range servers {
			h.Close()
		}
		return err
	} else if rs != nil {
		servers = append(servers, rs)
	}

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-failed:
	}

	// Health checks turn to not serving first. While load balancers and
	// Envoy's health checks notice, for the shutdown delay, every call is
	// still served; then the servers stop taking new calls and finish the
	// ones in flight, within the timeout. A server that failed skips the
	// delay: it is not serving anyway.
	svc.Drain()
	if serveErr == nil && c.shutdownDelay > 0 {
		log.Info("shutting down: health checks report not serving; still serving calls", "delay", c.shutdownDelay)
		select {
		case <-time.After(c.shutdownDelay):
		case serveErr = <-failed:
		}
	}
	log.Info("shutting down: draining in-flight calls", "timeout", c.shutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel()
	stopped := make(chan struct{})
	if quota != nil {
		// RLQS streams never end on their own: end them, so that the
		// graceful stop waits only for calls in flight.
		quota.Close()
	}
	go func() {
		if rs != nil {
			rs.GracefulStop()
		}
		gs.GracefulStop()
		close(stopped)
	}()
	for _, h := range servers {
		if err := h.Shutdown(sctx); err != nil {
			log.Warn("HTTP calls cut short", "error", err)
		}
	}
	select {
	case <-stopped:
	case <-sctx.Done():
		log.Warn("gRPC calls cut short: shutdown timeout reached")
		if rs != nil {
			rs.Stop()
		}
		gs.Stop()
	}
	if serveErr != nil {
		return serveErr
	}
	log.Info("stopped")
	return nil
}

// newHTTPServer returns an HTTP server for handler with timeouts fit for
// short calls.
func newHTTPServer(handler http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// newBreaker puts a circuit breaker with deadline timeout and the
// -circuit-* flags in front of b, logging its state changes as those of
// the circuit named what; whileOpen says what an open circuit means. In
// front of a backend made of nodes (a Redis Cluster: clusterNodes) it
// keeps a circuit per node, and the lines name the node.
func newBreaker(b algo.Backend, c *serveConfig, timeout time.Duration, now func() time.Time, log *slog.Logger, what, whileOpen string) *breaker.Breaker {
	_, nodes := b.(breaker.Nodes)
	return breaker.New(b, breaker.Options{
		Timeout: timeout, Failures: c.breaker.Failures, Cooldown: c.breaker.Cooldown, Now: now,
		OnStateChange: func(node string, from, to breaker.State, err error) {
			name, attrs := what+" circuit", []any{"from", from.String()}
			if nodes {
				name += " of node " + breaker.NodeName(node)
				attrs = append(attrs, "node", breaker.NodeName(node))
			}
			if to == breaker.Open {
				log.Warn(name+" open: "+whileOpen, append(attrs, "error", err, "cooldown", c.breaker.Cooldown)...)
			} else {
				log.Info(name+" "+to.String(), attrs...)
			}
		},
	})
}

// clusterNodes is the Redis backend on a Cluster, seen by the breaker as a
// backend made of nodes (breaker.Nodes): one circuit per primary, so that
// a dead primary fails only the keys of its slots.
type clusterNodes struct{ *redis.Backend }

// DecideVia implements breaker.Nodes.
func (c clusterNodes) DecideVia(ctx context.Context, gate breaker.Gate, reqs []algo.Request, out []algo.Decision) error {
	return c.Backend.DecideVia(ctx, gate, reqs, out)
}

// backends are what newBackend builds.
type backends struct {
	main     algo.Backend
	fallback algo.Backend     // decides while main fails, in failure mode local
	leases   algo.LeaseReader // what this replica holds of leased keys; nil without leasing
	// region counts the limits of scope: global across regions; nil
	// without -region. global is the same, nil without it.
	region *region.Engine
	global algo.GlobalReader
	// quota holds RLQS budgets across replicas: the store itself (on
	// Redis, behind a breaker of its own), without the over-limit cache,
	// which must not answer takes and gives from memory.
	quota algo.Backend
	now   func() time.Time
	close func()

	// What the ops console describes, nil when absent: the Redis
	// backend and its breaker, the memory backend (the main one, not a
	// fallback) and the local over-limit cache. (The lease engine is
	// leases.)
	redis  *redis.Backend
	guard  *breaker.Breaker
	memory *memory.Backend
	cache  *overlimit.Cache
}

// setRegion records the region engine e (nil: none).
func (be *backends) setRegion(e *region.Engine) {
	be.region = e
	if e != nil {
		be.global = e
	}
}

// leaseReturnTimeout bounds giving leases back at shutdown.
const leaseReturnTimeout = 2 * time.Second

// newBackend builds the backend c selects. Redis is guarded by a deadline
// and a circuit breaker, with a memory backend as the fallback of failure
// mode local; the local over-limit cache, when on, comes first.
func newBackend(ctx context.Context, c *serveConfig, log *slog.Logger, reg prometheus.Registerer) (*backends, error) {
	be := &backends{now: time.Now}
	if c.clockOffset != 0 {
		offset := c.clockOffset
		be.now = func() time.Time { return time.Now().Add(offset) }
		log.Warn("clock shifted by -clock-offset: this process decides as if the time were off", "offset", offset)
	}
	switch c.backend {
	case "redis":
		tag, _ := redis.ParseHashTag(c.redisHashTag) // validated
		opts := redis.Options{Prefix: c.redisPrefix, HashTag: tag, Scripts: c.redisScripts, Coalesce: c.redisCoalesce, ExpirationJitter: c.redisJitter}
		if c.redisClock == "local" {
			opts.Now = be.now
		}
		// go-redis logs through a logger of its own, global to the process.
		goredis.SetLogger(redis.Logger{Log: log})
		b, err := redis.Open(c.redis, opts)
		if err != nil {
			return nil, err
		}
		attrs := []any{"backend", "redis", "mode", c.redis.Mode, "url", redis.RedactURL(c.redis.URL),
			"prefix", c.redisPrefix, "clock", c.redisClock}
		if c.redis.Mode == redis.Cluster {
			attrs = append(attrs, "hash_tag", c.redisHashTag)
		}
		check := func(ctx context.Context) error {
			dctx, cancel := context.WithTimeout(ctx, redisDialTimeout)
			defer cancel()
			return b.Check(dctx)
		}
		if c.redisStartup.initial > 0 {
			// As the reference: no port opens before Redis answers,
			// and none at all when it never does.
			if err = waitRedis(ctx, c.redisStartup, check, log); err != nil {
				b.Close()
				return nil, err
			}
		} else {
			err = check(ctx)
		}
		switch {
		case err == nil:
			lua := "functions (FCALL)"
			if !b.Functions() {
				lua = "scripts (EVALSHA)"
			}
			log.Info("backend ready", append(attrs, "lua", lua)...)
		case redis.Unreachable(err):
			// Serving by the failure mode beats not serving: the breaker
			// probes Redis until it answers.
			log.Error("backend unreachable at start; deciding by the failure mode until it answers",
				append(attrs, "error", err, "failure_mode", c.failureMode)...)
		case redis.Refusing(err):
			// A full Redis (maxmemory, noeviction) or one loading its
			// data is up: pods that exit would crash-loop until it frees
			// memory. The first decision it takes loads the functions.
			log.Error("backend refuses writes at start; deciding by the failure mode until it takes them, then loading the decision functions",
				append(attrs, "error", err, "failure_mode", c.failureMode)...)
		default:
			b.Close()
			return nil, err
		}
		fallback := memory.New(memory.Options{MaxKeys: c.memoryMaxKeys, Now: be.now})
		var guarded algo.Backend = b
		if c.redis.Mode == redis.Cluster {
			guarded = clusterNodes{b}
		}
		guard := newBreaker(guarded, c, c.breaker.Timeout, be.now, log, "backend", "calls fail at once until a probe succeeds")
		registerBreaker(reg, guard)
		// Limits of scope: global are decided against the other regions'
		// counts, kept in this region's Redis; others pass through.
		inner, eng, err := newRegion(c, guard, region.NewRedisStore(b.Client(), c.redisPrefix, region.KeepFor(c.region.interval)), be.now, log)
		if err != nil {
			b.Close()
			return nil, err
		}
		be.setRegion(eng)
		// Rules with consistency: leased are decided in process from
		// budget leased out of Redis (of the region engine for global
		// ones: it lowers what a take may take); others pass through.
		lopts := c.lease
		lopts.Now, lopts.Logger, lopts.Timeout = be.now, log, max(c.breaker.Timeout, lease.DefaultTimeout)
		leases, err := lease.New(inner, lopts)
		if err != nil {
			b.Close()
			return nil, err
		}
		registerLease(reg, leases)
		// RLQS budgets go to Redis through a breaker of their own, with
		// -rlqs-budget-timeout as its deadline: a budget call is off
		// Envoy's request path and may carry a whole report's buckets, so
		// one slower than an RLS decision's deadline neither fails nor
		// opens the circuit that RLS decisions go through.
		quota := newBreaker(guarded, c, c.rlqs.budgetTimeout, be.now, log, "rlqs budget",
			"budget calls fail at once until a probe succeeds; reports are answered with this replica's share alone")
		be.main, be.fallback, be.leases, be.quota = leases, fallback, leases, quota
		be.redis, be.guard = b, guard
		be.close = func() {
			// Budget still leased goes back before the connections close.
			ctx, cancel := context.WithTimeout(context.Background(), leaseReturnTimeout)
			defer cancel()
			if err := leases.Close(ctx); err != nil {
				log.Warn("leases not all given back: their budget returns to the pool when they end", "error", err, "lease_ttl", c.lease.TTL)
			} else if st := leases.Stats(); st.Given > 0 {
				log.Info("leases given back", "hits", st.Given)
			}
			b.Close()
			fallback.Close()
		}
	default:
		b := memory.New(memory.Options{MaxKeys: c.memoryMaxKeys, Now: be.now})
		log.Info("backend ready", "backend", "memory", "max_keys", c.memoryMaxKeys)
		go watchEvictions(ctx, b, log, evictionReportInterval)
		registerMemory(reg, b)
		main, eng, err := newRegion(c, b, region.NewMemoryStore(be.now), be.now, log)
		if err != nil {
			b.Close()
			return nil, err
		}
		be.setRegion(eng)
		be.main, be.quota, be.close = main, b, func() { b.Close() }
		be.memory = b
	}
	if c.localCacheKeys > 0 {
		cache, err := overlimit.New(be.main, overlimit.Options{MaxKeys: c.localCacheKeys, Now: be.now})
		if err != nil {
			be.close()
			return nil, err
		}
		log.Info("local over-limit cache on", "max_keys", c.localCacheKeys)
		registerCache(reg, cache)
		be.main, be.cache = cache, cache
	}
	return be, nil
}

// redisDialTimeout bounds connecting to Redis and loading the script at
// start.
const redisDialTimeout = 10 * time.Second

// watchEvictions logs a warning, at most once per interval, when the memory
// backend has evicted live keys since the last look: each eviction forgot a
// count, which -memory-max-keys is too small to keep. It returns when ctx is
// done.
func watchEvictions(ctx context.Context, b *memory.Backend, log *slog.Logger, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var last uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if n := b.Evictions(); n > last {
				log.Warn("memory backend full: live keys evicted and their counts forgotten; raise -memory-max-keys",
					"evicted", n-last, "evicted_total", n, "interval", interval)
				last = n
			}
		}
	}
}
