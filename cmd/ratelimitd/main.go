// Command ratelimitd is the rate-limit decision service: Envoy's
// RateLimitService v3 over gRPC, deciding with rule files in the
// envoyproxy/ratelimit format.
//
// Usage:
//
//	ratelimitd [serve] [flags]            serve decisions (the default command)
//	ratelimitd check-config -config PATH  validate rule files
//	ratelimitd version                    print the version
//
// Every flag can also be set by an environment variable named
// RATELIMITD_ and the flag's name in upper case with dashes as
// underscores, such as RATELIMITD_GRPC_ADDR; a flag on the command line
// wins. Run "ratelimitd help" for the flags.
//
// Under the name ratelimit (envoyproxy/ratelimit's /bin/ratelimit), or
// with RATELIMITD_COMPAT=envoyproxy, serve takes its configuration from
// envoyproxy/ratelimit's environment variables instead
// (docs/migrating.md).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the command failed: bad rules, a port in use, ...
	exitUsage = 2 // the command line or environment is wrong
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	os.Exit(Main(ctx, os.Args[1:], withCompatName(os.Args[0], os.LookupEnv), os.Stdout, os.Stderr))
}

// Main runs the command line args and returns the exit code. It reads the
// environment only through lookupEnv, and a serving command stops when ctx
// is done.
func Main(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && (!strings.HasPrefix(args[0], "-") || isHelp(args[0])) {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(ctx, args, lookupEnv, stderr)
	case "check-config":
		return checkConfig(args, lookupEnv, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, version())
		return exitOK
	case "help", "-h", "-help", "--help":
		usage(stdout)
		return exitOK
	}
	fmt.Fprintf(stderr, "ratelimitd: unknown command %q; commands: serve, check-config, version, help\n", cmd)
	return exitUsage
}

func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help"
}

func usage(w io.Writer) {
	fmt.Fprint(w, `ratelimitd: a rate-limit decision service for Envoy and any gRPC or HTTP client.

Commands:
  ratelimitd [serve] [flags]            serve decisions (the default command)
  ratelimitd check-config -config PATH  validate rule files; exit 0, or 1 listing every problem
  ratelimitd version                    print the version

Every flag can also be set by the environment variable RATELIMITD_<FLAG>, such as
RATELIMITD_GRPC_ADDR for -grpc-addr; a flag on the command line wins.

Flags of serve:
`)
	fs := newServeConfig().flags
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// version describes the binary from its build information.
func version() string {
	v := "(unknown)"
	var extra []string
	if bi, ok := debug.ReadBuildInfo(); ok {
		v = bi.Main.Version
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision", "vcs.time", "vcs.modified":
				extra = append(extra, s.Key+"="+s.Value)
			}
		}
	}
	out := fmt.Sprintf("ratelimitd %s %s %s/%s", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if len(extra) > 0 {
		out += " " + strings.Join(extra, " ")
	}
	return out
}
