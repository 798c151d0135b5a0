package main

import (
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/lease"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/console"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

// newConsole returns the ops console of -ui (docs/console.md), nil when
// it is off. loaded tells when the rules in force were loaded.
func newConsole(c *serveConfig, be *backends, x *xdsSource, loaded func() time.Time, log *slog.Logger) (*console.Console, error) {
	if !c.ui {
		return nil, nil
	}
	replica, _ := os.Hostname()
	log.Info("ops console on: /ui on the HTTP listener shows rules, live decisions and the descriptors refused most; keep the listener behind TLS and auth (docs/console.md)",
		"tls", c.httpTLS.Cert != "", "mtls", c.httpTLS.ClientCA != "", "reset", c.enableReset)
	return console.New(console.Options{
		Now: be.now, Logger: log, Replica: replica, Version: version(),
		Source: func() console.Source {
			if x == nil {
				return console.Source{Kind: "file", Path: c.config, LoadedAt: loaded()}
			}
			st := x.client.Status()
			return console.Source{Kind: "xds", Server: st.Server, Version: st.Version, Connected: st.Connected,
				Error: st.LastError, LoadedAt: st.LastUpdate}
		},
		Backend: func() console.Backend { return describeBackend(c, be) },
	})
}

// withConsole serves the ops console under /ui beside h; h alone when
// cons is nil.
func withConsole(h http.Handler, cons *console.Console, svc *service.Service) http.Handler {
	if cons == nil {
		return h
	}
	ui := cons.Handler(svc)
	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.Handle("/ui", ui)
	mux.Handle("/ui/", ui)
	return mux
}

// describeBackend describes be as the console shows it.
func describeBackend(c *serveConfig, be *backends) console.Backend {
	d := console.Backend{Kind: c.backend, FailureMode: c.failureMode}
	if be.redis != nil {
		lua := "functions"
		if !be.redis.Functions() {
			lua = "scripts"
		}
		d.Redis = &console.Redis{Mode: string(c.redis.Mode), URL: redis.RedactURL(c.redis.URL), Master: c.redis.MasterName,
			Prefix: c.redisPrefix, Lua: lua, Clock: c.redisClock, KeyFormat: c.redisKeyFormat}
		if c.redis.Mode == redis.Cluster {
			d.Redis.HashTag = c.redisHashTag
		}
	}
	if be.memory != nil {
		d.Memory = &console.Memory{Keys: be.memory.Len(), MaxKeys: c.memoryMaxKeys, Evictions: be.memory.Evictions()}
	}
	if be.guard != nil {
		st := be.guard.Stats()
		d.Circuit = &console.Circuit{State: be.guard.State().String(), Calls: st.Calls, Errors: st.Errors,
			Timeouts: st.Timeouts, Rejected: st.Rejected, Opens: st.Opens}
	}
	if be.cache != nil {
		d.LocalCache = &console.LocalCache{Keys: be.cache.Len(), Hits: be.cache.Hits(), Misses: be.cache.Misses()}
	}
	if le, ok := be.leases.(*lease.Engine); ok {
		st := le.Stats()
		d.Leases = &console.Leases{Keys: st.Keys, Held: st.Held, Local: st.Local, Backend: st.Backend, Stranded: st.Stranded, Errors: st.Errors}
	}
	if be.region != nil {
		st := be.region.Stats()
		r := &console.Region{Name: st.Region, Keys: st.Keys, Pushes: st.Pushes, PushFailures: st.PushFailures, Received: st.Received, Peers: []console.Peer{}}
		for _, p := range st.Peers {
			unheard := "never"
			if p.Unheard >= 0 {
				unheard = p.Unheard.Round(time.Millisecond).String()
			}
			r.Peers = append(r.Peers, console.Peer{Name: p.Name, Addr: p.Addr, Unheard: unheard, CutOff: p.CutOff, Weight: p.Weight})
		}
		d.Region = r
	}
	return d
}
