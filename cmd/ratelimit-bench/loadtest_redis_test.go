package main

import (
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

func TestScriptCallFollowsTheRules(t *testing.T) {
	// examples/api.yaml limits user_id twice (per second and per hour):
	// one decision is a script call over two keys.
	lt := &loadtest{cfg: &loadtestConfig{Config: "../../examples", Domain: "api", Key: "user_id"}}
	keys, argv, err := lt.scriptCall()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || !strings.Contains(keys[0], "__rand_int__") || keys[0] == keys[1] {
		t.Fatalf("keys %q: want two distinct randomized keys", keys)
	}
	if want := 2 + algo.ScriptArgsPerRequest*len(keys); len(argv) != want {
		t.Fatalf("%d ARGV for %d keys, want %d: %q", len(argv), len(keys), want, argv)
	}
	if argv[0] != "" {
		t.Errorf("ARGV[1] = %q: want the Redis clock (empty)", argv[0])
	}
	lt.cfg.Domain = "nope"
	if _, _, err := lt.scriptCall(); err == nil {
		t.Error("an unknown domain gave a script call")
	}
}

func TestParseBenchmarkCSV(t *testing.T) {
	out := `"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
"EVALSHA x 1 k:__rand_int__  0","90909.09","0.041","0.016","0.039","0.079","0.111","0.287"
`
	r, err := parseBenchmarkCSV([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if r.rps != 90909.09 || r.p50 != 39 || r.p99 != 111 {
		t.Fatalf("%+v", r)
	}
	// An older redis-benchmark prints only the rate.
	r, err = parseBenchmarkCSV([]byte("\"test\",\"rps\"\n\"EVALSHA\",\"1000.00\"\n"))
	if err != nil || r.rps != 1000 || r.p50 >= 0 || r.p99 >= 0 {
		t.Fatalf("%+v, %v", r, err)
	}
	if _, err := parseBenchmarkCSV([]byte("ERR unknown command\n")); err == nil {
		t.Fatal("an error message parsed")
	}
}

func TestCommandCalls(t *testing.T) {
	info := "# Commandstats\r\n" +
		"cmdstat_fcall:calls=120,usec=900,usec_per_call=7.50,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_evalsha:calls=3,usec=30,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_eval_ro:calls=1000,usec=1,usec_per_call=0.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=7,usec=70,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_function|load:calls=1,usec=500,usec_per_call=500.00,rejected_calls=0,failed_calls=0\r\n"
	// EVAL has not run: no line, 0 calls; EVAL_RO is another command.
	n, err := commandCalls(info, decisionCommands...)
	if err != nil || n != 123 {
		t.Fatalf("%d, %v: want 123 (fcall 120 + evalsha 3)", n, err)
	}
	if n, err := commandCalls("", decisionCommands...); err != nil || n != 0 {
		t.Fatalf("no commandstats: %d, %v", n, err)
	}
	if _, err := commandCalls("cmdstat_fcall:usec=900,calls=12\r\n", "fcall"); err == nil {
		t.Fatal("a line without calls= first was read")
	}
}
