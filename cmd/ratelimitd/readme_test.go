package main

import (
	"flag"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestREADMEListsEveryFlag keeps the flag table of README.md whole: every
// flag of serve is named there, spelled out, with its environment
// variable's prefix.
func TestREADMEListsEveryFlag(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	n := 0
	newServeConfig().flags.VisitAll(func(f *flag.Flag) {
		n++
		if !strings.Contains(readme, "`-"+f.Name+"`") {
			t.Errorf("README.md's flag table does not name -%s (%s)", f.Name, f.Usage)
		}
	})
	if n < 50 {
		t.Fatalf("serve has %d flags: the flag set was not read", n)
	}
}

// TestDocsNameOnlyRealFlags: every flag (`-name`) and variable
// (`RATELIMITD_NAME`) that README.md and docs/migrating.md name is one
// serve reads, so that a flag renamed or dropped in the code is noticed
// where operators read of it.
func TestDocsNameOnlyRealFlags(t *testing.T) {
	fs := newServeConfig().flags
	var names []string // every flag, and COMPAT: RATELIMITD_COMPAT turns compatibility mode on
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	names = append(names, "compat")
	// A name ending in - or _ is a family, such as -xds-tls-* or
	// RATELIMITD_REDIS_SENTINEL_…: some flag must start with it.
	exists := func(name string) bool {
		if strings.HasSuffix(name, "-") {
			return slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, name) })
		}
		return slices.Contains(names, name) || subcommandFlag(name)
	}
	flagRef := regexp.MustCompile("`-([a-z][a-z0-9-]*)")
	envRef := regexp.MustCompile(`RATELIMITD_([A-Z0-9_]+)`)
	for _, doc := range []string{"../../README.md", "../../docs/migrating.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, m := range flagRef.FindAllStringSubmatch(string(b), -1) {
			if n++; !exists(m[1]) {
				t.Errorf("%s names -%s, which serve does not take", doc, m[1])
			}
		}
		for _, m := range envRef.FindAllStringSubmatch(string(b), -1) {
			if n++; !exists(strings.ToLower(strings.ReplaceAll(m[1], "_", "-"))) {
				t.Errorf("%s names %s, which is no flag's variable", doc, m[0])
			}
		}
		if n < 40 {
			t.Errorf("%s: %d flags and variables named: the patterns missed them", doc, n)
		}
	}
}

// subcommandFlag reports whether name is a flag of a command other than
// serve, or of go test (the recorders' -record and -record-settings
// included), that the docs may name.
func subcommandFlag(name string) bool {
	switch name {
	case "h", "help", "update", "race", "run", "count", "bench", "benchmem", "timeout", "fuzz", "fuzztime", "cpuprofile", "memprofile", "record", "record-settings":
		return true
	}
	return false
}
