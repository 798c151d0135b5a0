package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/ratelimitd/ratelimitd/pkg/config"
)

// checkConfig validates rule files: exit 0 with a summary, or 1 with every
// problem on stderr, one per line as file:line:column: field: message.
func checkConfig(args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check-config", flag.ContinueOnError)
	path := fs.String("config", "config", "rule `path`: a YAML rule file, or a directory of rule files")
	var opts config.Options
	configReadingFlags(fs, &opts)
	if _, err := parseFlags(fs, args, lookupEnv, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintf(stderr, "ratelimitd check-config: %v\n", err)
		return exitUsage
	}
	rules, err := config.LoadOptions(*path, opts)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitError
	}
	for _, w := range rules.Warnings() {
		fmt.Fprintln(stderr, "warning: "+w.Error())
	}
	n := 0
	for _, d := range rules.Domains() {
		n += len(d.Rules())
	}
	fmt.Fprintf(stdout, "ok: %d rule files, %d domains, %d rules (hash %s)\n", len(rules.Files()), len(rules.Domains()), n, rules.Hash())
	return exitOK
}
