package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// gatherAndCompare compares g's families named names with expected, in the
// text exposition format (testutil.GatherAndCompare).
func gatherAndCompare(t *testing.T, g prometheus.Gatherer, expected string, names ...string) {
	t.Helper()
	if err := testutil.GatherAndCompare(g, strings.NewReader(expected), names...); err != nil {
		t.Error(err)
	}
}
