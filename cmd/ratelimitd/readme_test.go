package main

import (
	"flag"
	"os"
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
	newServeFlags(&serveConfig{}).VisitAll(func(f *flag.Flag) {
		n++
		if !strings.Contains(readme, "`-"+f.Name+"`") {
			t.Errorf("README.md's flag table does not name -%s (%s)", f.Name, f.Usage)
		}
	})
	if n < 50 {
		t.Fatalf("serve has %d flags: the flag set was not read", n)
	}
}
