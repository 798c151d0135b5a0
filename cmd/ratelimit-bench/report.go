package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
)

// report is the outcome of a run, printed as text or, with -json, as
// this structure. Durations are in microseconds; a decision is one
// ShouldRateLimit call (one request, whatever its descriptors).
type report struct {
	Mode        string  `json:"mode"` // "closed" or "open"
	Addr        string  `json:"addr"`
	Domain      string  `json:"domain"`
	Key         string  `json:"key"`
	Workers     int     `json:"workers"`
	Conns       int     `json:"conns"`
	Keys        int     `json:"keys"`
	Dist        string  `json:"dist"`
	ZipfS       float64 `json:"zipf_s,omitempty"`
	Descriptors int     `json:"descriptors_per_request"`
	Rate        float64 `json:"rate,omitempty"` // target requests/s of the open loop
	WarmupS     float64 `json:"warmup_s"`
	ElapsedS    float64 `json:"elapsed_s"` // the measured interval

	Requests             uint64  `json:"requests"` // completed calls, errors included
	RequestsPerSecond    float64 `json:"requests_per_s"`
	DescriptorsDecided   uint64  `json:"descriptors"` // descriptor statuses received
	DescriptorsPerSecond float64 `json:"descriptors_per_s"`

	Latency latencyReport  `json:"latency_us"`            // calls answered without error
	SendLag *latencyReport `json:"send_lag_us,omitempty"` // open loop: how late calls left

	RequestCodes    codeCounts        `json:"request_codes"`    // by overall_code
	DescriptorCodes codeCounts        `json:"descriptor_codes"` // by each status's code
	Errors          map[string]uint64 `json:"errors"`           // failed calls by gRPC code
	Unsent          uint64            `json:"unsent,omitempty"` // open loop: abandoned at the hard stop

	CPU          []cpuReport  `json:"cpu"`
	BackendCalls *callsReport `json:"backend_calls,omitempty"` // when the run counted them
	Notes        []string     `json:"notes,omitempty"`
	Interrupted  bool         `json:"interrupted,omitempty"`
}

// latencyReport holds percentiles in microseconds.
type latencyReport struct {
	Count uint64  `json:"count"`
	Min   float64 `json:"min"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	P999  float64 `json:"p99_9"`
	Max   float64 `json:"max"`
}

// callsReport is how many decision calls the backend behind the server
// ran in the measured interval (for Redis: FCALL, EVALSHA and EVAL, from
// INFO commandstats).
type callsReport struct {
	Calls uint64 `json:"calls"`
	// DecisionsPerCall is completed calls of the generator per backend
	// call; absent when the backend ran no call.
	DecisionsPerCall float64 `json:"decisions_per_call,omitempty"`
}

// codeCounts counts answers by RateLimitResponse code.
type codeCounts struct {
	OK        uint64 `json:"ok"`
	OverLimit uint64 `json:"over_limit"`
	Unknown   uint64 `json:"unknown"`
}

// cpuReport is the CPU time one process used in the measured interval.
type cpuReport struct {
	Name    string  `json:"name"`
	PID     int     `json:"pid"`
	Seconds float64 `json:"cpu_s"` // user + system
	// MicrosPerDecision is CPU µs per completed call;
	// SecondsPer100k the same in CPU seconds per 100,000 calls.
	MicrosPerDecision float64 `json:"cpu_us_per_decision"`
	SecondsPer100k    float64 `json:"cpu_s_per_100k_decisions"`
	// Cores is the average number of cores the process kept busy.
	Cores float64 `json:"cores"`
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func latencyOf(h *histogram) latencyReport {
	return latencyReport{
		Count: h.total,
		Min:   micros(time.Duration(h.min)),
		Mean:  micros(h.mean()),
		P50:   micros(h.quantile(0.50)),
		P90:   micros(h.quantile(0.90)),
		P99:   micros(h.quantile(0.99)),
		P999:  micros(h.quantile(0.999)),
		Max:   micros(time.Duration(h.max)),
	}
}

// newReport merges the workers' stats.
func newReport(c *benchConfig, stats []*workerStats, elapsed time.Duration) *report {
	r := &report{
		Mode: "closed", Addr: c.Addr, Domain: c.Domain, Key: c.Key,
		Workers: c.Workers, Conns: c.Conns, Keys: c.Keys, Dist: c.Dist,
		Descriptors: c.Descriptors, Rate: c.Rate,
		WarmupS: c.Warmup.Seconds(), ElapsedS: elapsed.Seconds(),
		Errors: map[string]uint64{},
	}
	if c.Dist == "zipf" {
		r.ZipfS = c.ZipfS
	}
	if c.Rate > 0 {
		r.Mode = "open"
	}
	var lat, lag histogram
	for _, ws := range stats {
		lat.merge(&ws.latency)
		lag.merge(&ws.lag)
		r.Requests += ws.requests
		r.RequestCodes.OK += ws.reqOK
		r.RequestCodes.OverLimit += ws.reqOverLimit
		r.RequestCodes.Unknown += ws.reqUnknown
		r.DescriptorCodes.OK += ws.descOK
		r.DescriptorCodes.OverLimit += ws.descOverLimit
		r.DescriptorCodes.Unknown += ws.descUnknown
		r.Unsent += ws.unsent
		for code, n := range ws.errors {
			r.Errors[code.String()] += n
		}
	}
	r.DescriptorsDecided = r.DescriptorCodes.OK + r.DescriptorCodes.OverLimit + r.DescriptorCodes.Unknown
	if s := elapsed.Seconds(); s > 0 {
		r.RequestsPerSecond = float64(r.Requests) / s
		r.DescriptorsPerSecond = float64(r.DescriptorsDecided) / s
	}
	r.Latency = latencyOf(&lat)
	if c.Rate > 0 {
		l := latencyOf(&lag)
		r.SendLag = &l
	}
	if n := r.Errors[codes.Canceled.String()]; n > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("%d calls were cancelled: still running -timeout (%v) after the planned end, or interrupted", n, c.Timeout))
	}
	if r.Unsent > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("%d scheduled calls were never sent: the run fell more than -timeout (%v) behind its schedule", r.Unsent, c.Timeout))
	}
	return r
}

// addCPU adds each process's CPU time between two samples.
func (r *report) addCPU(procs []proc, before, after cpuSample, hz uint64) {
	for i, p := range procs {
		d := ticksToDuration(after[i]-before[i], hz)
		cr := cpuReport{Name: p.Name, PID: p.PID, Seconds: d.Seconds()}
		if r.Requests > 0 {
			cr.MicrosPerDecision = micros(d) / float64(r.Requests)
			cr.SecondsPer100k = d.Seconds() / float64(r.Requests) * 100_000
		}
		if r.ElapsedS > 0 {
			cr.Cores = d.Seconds() / r.ElapsedS
		}
		r.CPU = append(r.CPU, cr)
	}
	r.Notes = append(r.Notes, fmt.Sprintf("CPU times are user+system from /proc/PID/stat, counted in ticks of 1/%d s: each is within a tick or two", hz))
}

// addBackendCalls adds the decision calls the backend ran in the
// measured interval.
func (r *report) addBackendCalls(calls uint64) {
	r.BackendCalls = &callsReport{Calls: calls}
	if calls > 0 {
		r.BackendCalls.DecisionsPerCall = float64(r.Requests) / float64(calls)
	}
}

// cpuOf returns the report of the process named name, or nil.
func (r *report) cpuOf(name string) *cpuReport {
	for i := range r.CPU {
		if r.CPU[i].Name == name {
			return &r.CPU[i]
		}
	}
	return nil
}

// writeJSON prints r as indented JSON.
func (r *report) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// writeText prints r for people.
func (r *report) writeText(w io.Writer) error {
	var b strings.Builder
	loop := "closed loop"
	if r.Mode == "open" {
		loop = fmt.Sprintf("open loop at %s requests/s", num(r.Rate))
	}
	dist := r.Dist
	if r.Dist == "zipf" {
		dist = fmt.Sprintf("zipf (s=%g)", r.ZipfS)
	}
	fmt.Fprintf(&b, "%s, %d workers over %d connections, %s keys %s, %d descriptor(s) per request, domain %q key %q\n",
		loop, r.Workers, r.Conns, num(float64(r.Keys)), dist, r.Descriptors, r.Domain, r.Key)
	fmt.Fprintf(&b, "measured %.2fs after %.2fs of warm-up%s\n\n", r.ElapsedS, r.WarmupS, map[bool]string{true: " (interrupted)"}[r.Interrupted])
	fmt.Fprintf(&b, "decisions    %12d  %12s/s  (requests)\n", r.Requests, num(r.RequestsPerSecond))
	fmt.Fprintf(&b, "descriptors  %12d  %12s/s\n", r.DescriptorsDecided, num(r.DescriptorsPerSecond))
	fmt.Fprintf(&b, "requests     OK %d  OVER_LIMIT %d  UNKNOWN %d\n", r.RequestCodes.OK, r.RequestCodes.OverLimit, r.RequestCodes.Unknown)
	fmt.Fprintf(&b, "descriptors  OK %d  OVER_LIMIT %d  UNKNOWN %d\n", r.DescriptorCodes.OK, r.DescriptorCodes.OverLimit, r.DescriptorCodes.Unknown)
	if len(r.Errors) == 0 {
		fmt.Fprintf(&b, "errors       none\n")
	} else {
		fmt.Fprintf(&b, "errors       %s\n", countsText(r.Errors, "  "))
	}
	if r.Unsent > 0 {
		fmt.Fprintf(&b, "unsent       %d\n", r.Unsent)
	}
	b.WriteString("\n")
	since := "from the send"
	if r.Mode == "open" {
		since = "from the scheduled send time"
	}
	fmt.Fprintf(&b, "latency (%s, %d answered calls)\n", since, r.Latency.Count)
	writeLatency(&b, "  ", r.Latency)
	if r.SendLag != nil {
		fmt.Fprintf(&b, "send lag (actual minus scheduled send time: the client's timer slack and backlog)\n")
		writeLatency(&b, "  ", *r.SendLag)
	}
	b.WriteString("\nCPU in the measured interval\n")
	fmt.Fprintf(&b, "  %-16s %8s %7s %8s %16s %18s\n", "process", "PID", "cores", "CPU s", "CPU-µs/decision", "CPU s/100k decis.")
	for _, c := range r.CPU {
		fmt.Fprintf(&b, "  %-16s %8d %7.2f %8.2f %16.1f %18.2f\n", c.Name, c.PID, c.Cores, c.Seconds, c.MicrosPerDecision, c.SecondsPer100k)
	}
	if bc := r.BackendCalls; bc != nil {
		per := "no call"
		if bc.Calls > 0 {
			per = fmt.Sprintf("%s decisions per call", num(bc.DecisionsPerCall))
		}
		fmt.Fprintf(&b, "\nbackend calls in the measured interval: %d (%s)\n", bc.Calls, per)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writeLatency(b *strings.Builder, indent string, l latencyReport) {
	fmt.Fprintf(b, "%sp50 %s  p90 %s  p99 %s  p99.9 %s  max %s  (mean %s, min %s)\n", indent,
		us(l.P50), us(l.P90), us(l.P99), us(l.P999), us(l.Max), us(l.Mean), us(l.Min))
}

// us formats microseconds in µs, ms or s, with 3 or 4 significant
// digits.
func us(v float64) string {
	unit := "µs"
	switch {
	case v >= 1e6:
		v, unit = v/1e6, "s"
	case v >= 1e3:
		v, unit = v/1e3, "ms"
	}
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f%s", v, unit)
	case v >= 10:
		return fmt.Sprintf("%.1f%s", v, unit)
	default:
		return fmt.Sprintf("%.2f%s", v, unit)
	}
}

// num formats a rate or count with thousands separators.
func num(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	if v < 100 && v != float64(int64(v)) {
		s = fmt.Sprintf("%.1f", v)
	}
	intPart, frac, _ := strings.Cut(s, ".")
	var out []byte
	for i, ch := range []byte(intPart) {
		if i > 0 && (len(intPart)-i)%3 == 0 && intPart[i-1] != '-' {
			out = append(out, ',')
		}
		out = append(out, ch)
	}
	if frac != "" {
		return string(out) + "." + frac
	}
	return string(out)
}

// countsText lists counts by name, "name n", in name order, joined by sep.
func countsText(counts map[string]uint64, sep string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, counts[k]))
	}
	return strings.Join(parts, sep)
}
