package main

import (
	"fmt"
	"io"
	"math"
	"os"
)

// writeJSONFile writes r, the generator's report of one scenario, to path
// as JSON (-out).
func writeJSONFile(path string, r *report) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := r.writeJSON(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writeTable prints the rows as one Markdown table, then their notes.
func writeTable(w io.Writer, rows []scenario) {
	cell := func(v float64, f func(float64) string) string {
		if v < 0 {
			return "–"
		}
		return f(v)
	}
	// Two decimals below 1: leased decisions cost Redis a fraction of a
	// CPU-µs each.
	cpu := func(v float64) string {
		if v < 1 {
			return fmt.Sprintf("%.2f", v)
		}
		return fmt.Sprintf("%.1f", v)
	}
	perCall := func(v float64) string {
		if math.IsInf(v, 1) {
			return "no call"
		}
		return num(v)
	}
	fmt.Fprintln(w, "| scenario | decisions/s | p50 | p99 | p99.9 | server CPU-µs/decision | Redis CPU-µs/decision | generator CPU-µs/decision | decisions/Redis call |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.Name, num(r.DecisionsPerS),
			cell(r.P50, us), cell(r.P99, us), cell(r.P999, us),
			cell(r.ServerCPU, cpu), cell(r.RedisCPU, cpu), cell(r.BenchCPU, cpu), cell(r.DecisionsPerCall, perCall))
	}
	fmt.Fprintln(w)
	for _, r := range rows {
		for _, n := range r.Notes {
			fmt.Fprintf(w, "- %s: %s\n", r.Name, n)
		}
	}
}
