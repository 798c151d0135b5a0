package footprint

import (
	"runtime"
	"testing"
)

func TestParseVmRSS(t *testing.T) {
	status := "Name:\tratelimitd\nVmPeak:\t  900 kB\nVmRSS:\t   31936 kB\nRssAnon:\t 20000 kB\n"
	if n, err := ParseVmRSS([]byte(status)); err != nil || n != 31936*1024 {
		t.Errorf("ParseVmRSS = %d, %v; want %d", n, err, 31936*1024)
	}
	for _, bad := range []string{"Name:\tx\n", "VmRSS:\t12 MB\n", "VmRSS:\tx kB\n"} {
		if n, err := ParseVmRSS([]byte(bad)); err == nil {
			t.Errorf("ParseVmRSS(%q) = %d, want an error", bad, n)
		}
	}
}

// TestTakeSeesTheHeapGrow: a sample taken while 64 MiB are held shows
// them in the live heap and, on Linux, in the resident set.
func TestTakeSeesTheHeapGrow(t *testing.T) {
	before := Baseline()
	held := make([]byte, 64<<20)
	for i := 0; i < len(held); i += 4096 {
		held[i] = 1 // each page touched: resident
	}
	after := Take()
	if grew := after.Heap - before.Heap; grew < 64<<20 {
		t.Errorf("the live heap grew by %d bytes while 64 MiB were held", grew)
	}
	if runtime.GOOS == "linux" && (before.RSS == 0 || after.RSS < before.RSS+60<<20) {
		t.Errorf("RSS %d then %d while 64 MiB were held", before.RSS, after.RSS)
	}
	runtime.KeepAlive(held)
}

// TestCycleRunsTheCollector: Cycle returns once the collector has run at
// least twice, so that the heap went through its target.
func TestCycleRunsTheCollector(t *testing.T) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	Cycle()
	runtime.ReadMemStats(&after)
	if after.NumGC < before.NumGC+2 {
		t.Errorf("%d collections during Cycle, want at least 2", after.NumGC-before.NumGC)
	}
}
