package main

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

func TestWriteTable(t *testing.T) {
	var b bytes.Buffer
	writeTable(&b, []scenario{
		{Name: "a", DecisionsPerS: 12345.6, P50: 95, P99: 1500, P999: 2_500_000, ServerCPU: 12.34, RedisCPU: -1, BenchCPU: 3, DecisionsPerCall: -1, Notes: []string{"n"}},
		{Name: "exact", DecisionsPerS: 20000, P50: 2000, P99: 4000, P999: 9000, ServerCPU: 30, RedisCPU: 11.04, BenchCPU: 20, DecisionsPerCall: 1.04},
		{Name: "leased", DecisionsPerS: 40000, P50: 900, P99: 3000, P999: 5000, ServerCPU: 25, RedisCPU: 0.046, BenchCPU: 20, DecisionsPerCall: 212.7},
		{Name: "quiet", DecisionsPerS: 100, P50: 90, P99: 300, P999: 500, ServerCPU: 25, RedisCPU: 0, BenchCPU: 20, DecisionsPerCall: math.Inf(1)},
	})
	if !strings.Contains(b.String(), "| generator CPU-µs/decision | decisions/Redis call |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n") {
		t.Errorf("no column for the decisions per Redis call, or the separator does not match the header:\n%s", b.String())
	}
	for _, want := range []string{
		"| a | 12,346 | 95.0µs | 1.50ms | 2.50s | 12.3 | – | 3.0 | – |\n",
		"| exact | 20,000 | 2.00ms | 4.00ms | 9.00ms | 30.0 | 11.0 | 20.0 | 1.0 |\n",
		// Below 1 CPU-µs, two decimals: the leased group's Redis figures.
		"| leased | 40,000 | 900µs | 3.00ms | 5.00ms | 25.0 | 0.05 | 20.0 | 213 |\n",
		"| quiet | 100 | 90.0µs | 300µs | 500µs | 25.0 | 0.00 | 20.0 | no call |\n",
		"- a: n\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table:\n%s\nwant %q", b.String(), want)
		}
	}
}
