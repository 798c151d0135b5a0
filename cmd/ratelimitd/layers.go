package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/lease"
	"github.com/ratelimitd/ratelimitd/pkg/backend/overlimit"
	"github.com/ratelimitd/ratelimitd/pkg/console"
)

// leaseReturnTimeout bounds giving leases back at shutdown.
const leaseReturnTimeout = 2 * time.Second

// leasing is the layer of the backend stack that decides the rules with
// consistency: leased in process, from budget leased out of Redis (of the
// region engine for global limits: it lowers what a take may take);
// other rules pass through. Only on Redis: the memory backend decides in
// process already.
type leasing struct {
	opts lease.Options
}

func (l *leasing) addFlags(fs *flag.FlagSet) {
	fs.DurationVar(&l.opts.TTL, "lease-ttl", lease.DefaultTTL, "rules with consistency: leased (Redis backend): how long a bucket's lease of budget may be spent (a window's lasts until its window ends), and when an idle key is forgotten (docs/leasing.md)")
	fs.DurationVar(&l.opts.Period, "lease-period", lease.DefaultPeriod, "rules with consistency: leased: how much of a key's traffic a lease covers, at most -lease-ttl; longer leases mean fewer Redis calls and more budget held by one replica")
	fs.Uint64Var(&l.opts.Share, "lease-share", lease.DefaultShare, "rules with consistency: leased: a lease takes at most 1/`N` of what a limit has left, so that no replica holds much of a limit that binds")
	fs.IntVar(&l.opts.MaxKeys, "lease-max-keys", lease.DefaultMaxKeys, "rules with consistency: leased: most keys the lease engine tracks at once (each, even one seen once, for -lease-ttl after its last use); beyond it the least recently used of a sample is evicted, its leases given back (docs/leasing.md)")
}

func (l *leasing) check(flagName func(string) string) error {
	switch {
	case l.opts.TTL < time.Millisecond:
		return fmt.Errorf("invalid %s %v; it must be at least 1ms", flagName("lease-ttl"), l.opts.TTL)
	case l.opts.Period < time.Millisecond || l.opts.Period > l.opts.TTL:
		return fmt.Errorf("invalid %s %v; it must be at least 1ms and at most %s (%v): a lease must be spendable for a period",
			flagName("lease-period"), l.opts.Period, flagName("lease-ttl"), l.opts.TTL)
	case l.opts.Share < 1:
		return fmt.Errorf("invalid %s %d; it must be at least 1 (1 lets one lease take all that remains)", flagName("lease-share"), l.opts.Share)
	case l.opts.MaxKeys < 1:
		return fmt.Errorf("invalid %s %d; it must be at least 1", flagName("lease-max-keys"), l.opts.MaxKeys)
	}
	return nil
}

func (l *leasing) build(_ context.Context, s *server) (hooks, error) {
	if s.stack.redis == nil {
		return hooks{}, nil
	}
	opts := l.opts
	opts.Now, opts.Logger, opts.Timeout = s.now, s.log, max(s.stack.breaker.Timeout, lease.DefaultTimeout)
	e, err := lease.New(s.stack.main, opts)
	if err != nil {
		return hooks{}, err
	}
	registerLease(s.reg, e)
	s.stack.main, s.stack.leases = e, e
	s.stack.describe = append(s.stack.describe, func(d *console.Backend) {
		st := e.Stats()
		d.Leases = &console.Leases{Keys: st.Keys, Held: st.Held, Local: st.Local, Backend: st.Backend, Stranded: st.Stranded, Errors: st.Errors}
	})
	evicted := func() uint64 { return e.Stats().Evicted }
	return hooks{
		start: func(ctx context.Context) {
			go watchEvictions(ctx, evicted, leaseEvictionsWarning, s.log, evictionReportInterval)
		},
		close: func() {
			// Budget still leased goes back before the connections close.
			ctx, cancel := context.WithTimeout(context.Background(), leaseReturnTimeout)
			defer cancel()
			if err := e.Close(ctx); err != nil {
				s.log.Warn("leases not all given back: their budget returns to the pool when they end", "error", err, "lease_ttl", l.opts.TTL)
			} else if st := e.Stats(); st.Given > 0 {
				s.log.Info("leases given back", "hits", st.Given)
			}
		},
	}, nil
}

// overLimitCache is the layer of the backend stack that remembers keys
// over their limit and refuses them locally, without a backend call,
// until they may pass again (-local-cache-keys).
type overLimitCache struct {
	maxKeys int
}

func (o *overLimitCache) addFlags(fs *flag.FlagSet) {
	fs.IntVar(&o.maxKeys, "local-cache-keys", 0, "remember up to this many over-limit keys and refuse them locally, without calling Redis, until they may pass again; 0 turns the cache off")
}

func (o *overLimitCache) check(flagName func(string) string) error {
	if o.maxKeys < 0 {
		return fmt.Errorf("invalid %s %d; it must not be negative (0 turns the cache off)", flagName("local-cache-keys"), o.maxKeys)
	}
	return nil
}

func (o *overLimitCache) build(_ context.Context, s *server) (hooks, error) {
	if o.maxKeys == 0 {
		return hooks{}, nil
	}
	cache, err := overlimit.New(s.stack.main, overlimit.Options{MaxKeys: o.maxKeys, Now: s.now})
	if err != nil {
		return hooks{}, err
	}
	s.log.Info("local over-limit cache on", "max_keys", o.maxKeys)
	registerCache(s.reg, cache)
	s.stack.main = cache
	s.stack.describe = append(s.stack.describe, func(d *console.Backend) {
		d.LocalCache = &console.LocalCache{Keys: cache.Len(), Hits: cache.Hits(), Misses: cache.Misses()}
	})
	return hooks{}, nil
}
