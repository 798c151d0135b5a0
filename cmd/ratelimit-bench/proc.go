package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// proc is a process whose CPU time the report shows.
type proc struct {
	Name string
	PID  int
}

// parsePIDs reads -pids: name=PID pairs separated by commas, such as
// "ratelimitd=123,redis=456".
func parsePIDs(s string) ([]proc, error) {
	if s == "" {
		return nil, nil
	}
	var ps []proc
	seen := map[string]bool{}
	for item := range strings.SplitSeq(s, ",") {
		name, pid, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("-pids: %q is not name=PID", item)
		}
		n, err := strconv.Atoi(pid)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-pids: %s=%s: the PID is not a positive integer", name, pid)
		}
		if seen[name] {
			return nil, fmt.Errorf("-pids: the name %s is given twice", name)
		}
		seen[name] = true
		ps = append(ps, proc{Name: name, PID: n})
	}
	return ps, nil
}

// cpuTicks returns the CPU time process pid has used, user plus system, in
// clock ticks: fields 14 (utime) and 15 (stime) of /proc/PID/stat.
func cpuTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStat(b)
}

// parseStat reads utime+stime from the text of /proc/PID/stat. The
// second field, the command name in parentheses, may hold spaces and
// parentheses itself, so the fields are counted from the last ')'.
func parseStat(b []byte) (uint64, error) {
	end := bytes.LastIndexByte(b, ')')
	if end < 0 {
		return 0, fmt.Errorf("/proc stat %q: no ')' closing the command name", clip(string(b), 60))
	}
	// After ") ": field 3 (state) is index 0, so field n is index n-3.
	f := strings.Fields(string(b[end+1:]))
	const utime, stime = 14 - 3, 15 - 3
	if len(f) <= stime {
		return 0, fmt.Errorf("/proc stat: %d fields after the command name, want more than %d", len(f), stime)
	}
	u, err := strconv.ParseUint(f[utime], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc stat: utime %q: %v", f[utime], err)
	}
	s, err := strconv.ParseUint(f[stime], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc stat: stime %q: %v", f[stime], err)
	}
	return u + s, nil
}

// clockTicks returns the kernel's clock ticks per second (USER_HZ), which
// /proc/PID/stat counts in, from `getconf CLK_TCK`; when getconf fails it
// assumes 100, Linux's value on every common architecture, and says so in
// note.
func clockTicks() (hz uint64, note string) {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if n, err := strconv.ParseUint(strings.TrimSpace(string(out)), 10, 64); err == nil && n > 0 {
			return n, ""
		}
	}
	return 100, "getconf CLK_TCK failed; assumed 100 ticks per second"
}

// cpuSample is the CPU time of every watched process at one instant.
type cpuSample []uint64

// sampleCPU reads the CPU ticks of each of ps.
func sampleCPU(ps []proc) (cpuSample, error) {
	s := make(cpuSample, len(ps))
	for i, p := range ps {
		t, err := cpuTicks(p.PID)
		if err != nil {
			return nil, fmt.Errorf("CPU time of %s (PID %d): %w", p.Name, p.PID, err)
		}
		s[i] = t
	}
	return s, nil
}

// ticksToDuration converts clock ticks at hz per second to a duration.
func ticksToDuration(ticks, hz uint64) time.Duration {
	return time.Duration(float64(ticks) / float64(hz) * float64(time.Second))
}

// clip shortens s to at most n bytes for an error message.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
