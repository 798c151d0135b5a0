package main

import (
	"net/http"
	"os"
	"strings"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
)

// secretFlags are the flags whose values may hold a secret, and how a
// value is shown: the Redis URL with its passwords masked, the others not
// at all.
var secretFlags = map[string]func(string) string{
	"redis-url":               redis.RedactURL,
	"redis-sentinel-password": hidden,
	"xds-headers":             hidden,
}

func hidden(string) string { return "<hidden>" }

// redactArgs returns a command line as it may be shown: each secret
// flag's value masked, in every form the flag package reads (-name=value,
// --name=value, -name value).
func redactArgs(args []string) []string {
	out := make([]string, len(args))
	copy(out, args)
	for i := 0; i < len(out); i++ {
		a := out[i]
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		mask, secret := secretFlags[name]
		switch {
		case !secret:
		case hasValue:
			out[i] = a[:len(a)-len(value)] + mask(value)
		case i+1 < len(out):
			i++
			out[i] = mask(out[i])
		}
	}
	return out
}

// serveCmdline answers /debug/pprof/cmdline as net/http/pprof does, with
// the command line's secrets masked: the debug address may be reached by
// more people than the process's environment.
func serveCmdline(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Write([]byte(strings.Join(redactArgs(os.Args), "\x00")))
}
