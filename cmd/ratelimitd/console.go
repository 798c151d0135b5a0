package main

import (
	"context"
	"flag"
	"net/http"
	"os"

	"github.com/ratelimitd/ratelimitd/pkg/console"
	"github.com/ratelimitd/ratelimitd/pkg/tlsconfig"
)

// opsConsole is the component of the ops console (-ui, docs/console.md):
// an observer of the service, served under /ui on the HTTP port.
type opsConsole struct {
	on bool
	// httpTLS and enableReset are the HTTP listener's files and the RLS
	// front end's -enable-reset, which the console's start-up line
	// names.
	httpTLS     *tlsconfig.Files
	enableReset *bool
}

func (o *opsConsole) addFlags(fs *flag.FlagSet) {
	fs.BoolVar(&o.on, "ui", false, "serve the ops console at /ui on the HTTP listener: rules, live decisions, top limited keys (descriptor values of every caller), backend state, explain (docs/console.md); put the listener behind TLS and auth first")
}

func (o *opsConsole) check(func(string) string) error { return nil }

func (o *opsConsole) build(_ context.Context, s *server) (hooks, error) {
	if !o.on {
		return hooks{}, nil
	}
	replica, _ := os.Hostname()
	s.log.Info("ops console on: /ui on the HTTP listener shows rules, live decisions and the descriptors refused most; keep the listener behind TLS and auth (docs/console.md)",
		"tls", o.httpTLS.Cert != "", "mtls", o.httpTLS.ClientCA != "", "reset", *o.enableReset)
	cons, err := console.New(console.Options{
		Now: s.now, Logger: s.log, Replica: replica, Version: version(),
		Source: s.source.describe, Backend: s.stack.describeAll,
	})
	if err != nil {
		return hooks{}, err
	}
	cons.Rules(s.source.initial)
	s.observers = append(s.observers, cons)
	return hooks{
		rules: cons.Rules,
		http: func(mux *http.ServeMux) {
			ui := cons.Handler(s.svc)
			mux.Handle("/ui", ui)
			mux.Handle("/ui/", ui)
		},
	}, nil
}

// describeAll describes the backend stack as the ops console shows it,
// each layer filling in its part.
func (st *stack) describeAll() console.Backend {
	var d console.Backend
	for _, f := range st.describe {
		f(&d)
	}
	return d
}
