package main

import (
	"slices"
	"testing"
)

// TestRedactArgs masks each secret flag in every form the flag package
// reads, and leaves the rest of the command line as it was.
func TestRedactArgs(t *testing.T) {
	in := []string{"ratelimitd", "serve",
		"-redis-url", "redis://:hunter2@h:1",
		"--redis-url=redis://h:1/0?password=hunter2",
		"-redis-sentinel-password=hunter3",
		"--redis-sentinel-password", "hunter3",
		"-xds-headers", "authorization=Bearer hunter4",
		"-redis-prefix", "hunter-not-a-secret",
		"-redis-url"}
	want := []string{"ratelimitd", "serve",
		"-redis-url", "redis://:xxxxx@h:1",
		"--redis-url=redis://h:1/0?password=xxxxx",
		"-redis-sentinel-password=<hidden>",
		"--redis-sentinel-password", "<hidden>",
		"-xds-headers", "<hidden>",
		"-redis-prefix", "hunter-not-a-secret",
		"-redis-url"}
	orig := slices.Clone(in)
	if got := redactArgs(in); !slices.Equal(got, want) {
		t.Errorf("redactArgs:\n got %q\nwant %q", got, want)
	}
	if !slices.Equal(in, orig) {
		t.Errorf("redactArgs changed its argument: %q", in)
	}
}
