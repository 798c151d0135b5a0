package main

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestCPUOfThisProcess(t *testing.T) {
	before, err := cpuTicks(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	hz, note := clockTicks()
	if hz == 0 {
		t.Fatal("zero clock ticks per second")
	}
	if note != "" {
		t.Log(note)
	}
	// Burn CPU until the tick count moves (a few ticks at most).
	deadline := time.Now().Add(5 * time.Second)
	x := 0
	after := before
	for after < before+3 && time.Now().Before(deadline) {
		for i := range 1_000_000 {
			x += i * i
		}
		if after, err = cpuTicks(os.Getpid()); err != nil {
			t.Fatal(err)
		}
	}
	if after < before+3 {
		t.Fatalf("CPU ticks went from %d to %d in 5s of busy work (%d)", before, after, x)
	}
	if d := ticksToDuration(after-before, hz); d <= 0 || d > 10*time.Second {
		t.Fatalf("%d ticks at %d/s = %v", after-before, hz, d)
	}
	s, err := sampleCPU([]proc{{"self", os.Getpid()}})
	if err != nil || len(s) != 1 || s[0] < after {
		t.Fatalf("sampleCPU: %v, %v", s, err)
	}
	if _, err := sampleCPU([]proc{{"gone", 1 << 30}}); err == nil || !strings.Contains(err.Error(), "gone") {
		t.Fatalf("a PID that does not exist: %v", err)
	}
}

func TestParseStat(t *testing.T) {
	// The command name may hold spaces and parentheses.
	line := "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 1234 0 0 0 170 35 0 0 20 0 9 0 123456 987654321 2000 18446744073709551615\n"
	ticks, err := parseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if ticks != 170+35 {
		t.Fatalf("utime+stime = %d, want 205", ticks)
	}
	for _, bad := range []string{"", "1 (x S 1 2", "1 (x) S 1 2 3", "1 (x) S 1 2 3 4 5 6 7 8 9 10 eleven 12"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestParsePIDs(t *testing.T) {
	ps, err := parsePIDs("ratelimitd=123, redis=456")
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 || ps[0] != (proc{"ratelimitd", 123}) || ps[1] != (proc{"redis", 456}) {
		t.Fatalf("%+v", ps)
	}
	for _, bad := range []string{"ratelimitd", "=1", "a=0", "a=x", "a=1,a=2"} {
		if _, err := parsePIDs(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
