// Package footprint measures, for benchmarks, the memory a structure
// holds per item: the live heap after a collection, and how much the
// process's resident set (RSS) grew, which is what a container's memory
// limit meets.
//
// Take a [Baseline] before filling the structure and a [Take] after, with
// the structure still reachable; [Cycle] then lets the heap run through
// the collector's target as a serving process's does, and a last [Take]
// sees the resident set that needs. [Report] gives the differences per
// item.
package footprint

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"testing"
)

// Sample is the process's memory at one instant.
type Sample struct {
	// Heap is the live heap after a collection (MemStats.HeapAlloc), in
	// bytes.
	Heap uint64
	// RSS is the resident set (VmRSS of /proc/self/status), in bytes; 0
	// where it cannot be read (other than Linux).
	RSS uint64
}

// Baseline collects garbage, returns the free memory to the operating
// system (so that what an earlier measurement left does not hide this
// one's growth) and takes a sample.
func Baseline() Sample {
	runtime.GC()
	debug.FreeOSMemory()
	return Take()
}

// Take collects garbage and takes a sample. The resident set is left as
// the collector left it: it holds what the heap grew to between
// collections (GOGC), as a running process's does.
func Take() Sample {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s := Sample{Heap: ms.HeapAlloc}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		if rss, err := ParseVmRSS(b); err == nil {
			s.RSS = rss
		}
	}
	return s
}

// Cycle allocates short-lived garbage, as a serving process's calls do,
// until the collector has run twice (or ten times the heap is allocated,
// should GOGC=off never start it): the heap has then grown to the
// collector's target over what is live (GOGC, capped by GOMEMLIMIT), and
// the resident set with it, as in a process that serves.
func Cycle() {
	const chunk = 1 << 10
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/gc/heap/goal:bytes"}}
	metrics.Read(s)
	start, most := s[0].Value.Uint64(), 10*s[1].Value.Uint64()
	var inFlight [256][]byte // the garbage of calls in flight
	for n := uint64(0); n < most; n += chunk {
		inFlight[(n/chunk)%uint64(len(inFlight))] = make([]byte, chunk)
		if n%(1<<20) == 0 {
			if metrics.Read(s); s[0].Value.Uint64() >= start+2 {
				return
			}
		}
	}
}

// Report reports on b what each of n items costs: B/key, the live heap
// from before to filled; RSS-B/key, the growth of the resident set from
// before to filled (the heap grown only by the filling's own garbage);
// and cycled-RSS-B/key, its growth from before to cycled, a sample taken
// after [Cycle]: what a serving process holding the items needs. The RSS
// metrics are left out where the resident set could not be read.
func Report(b *testing.B, before, filled, cycled Sample, n int) {
	ReportPer(b, before, filled, cycled, n, "key")
}

// ReportPer is [Report] for items other than keys, each metric's unit
// ending in "/"+item: B/rule, RSS-B/rule, cycled-RSS-B/rule for "rule".
func ReportPer(b *testing.B, before, filled, cycled Sample, n int, item string) {
	per := func(from, to uint64) float64 { return (float64(to) - float64(from)) / float64(n) }
	b.ReportMetric(per(before.Heap, filled.Heap), "B/"+item)
	if before.RSS > 0 && filled.RSS > 0 && cycled.RSS > 0 {
		b.ReportMetric(per(before.RSS, filled.RSS), "RSS-B/"+item)
		b.ReportMetric(per(before.RSS, cycled.RSS), "cycled-RSS-B/"+item)
	}
}

// ParseVmRSS reads VmRSS from the text of /proc/PID/status, in bytes.
func ParseVmRSS(status []byte) (uint64, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:")
		if !ok {
			continue
		}
		kb, ok := strings.CutSuffix(strings.TrimSpace(rest), " kB")
		if !ok {
			return 0, fmt.Errorf("/proc status: VmRSS %q: want a number of kB", rest)
		}
		n, err := strconv.ParseUint(strings.TrimSpace(kb), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc status: VmRSS %q: %v", rest, err)
		}
		return n * 1024, nil
	}
	return 0, fmt.Errorf("/proc status: no VmRSS line")
}
