// Command goldengen writes the Prometheus series envoyproxy/ratelimit's
// USE_PROMETHEUS shows for a list of its statsd statistics: it feeds them,
// as the reference's sink does (src/stats/prom/prometheus_sink.go,
// FlushCounter and FlushTimer), to statsd_exporter's exporter at the
// version the reference builds with (v0.26.1, its go.mod), mapped by the
// reference's own src/stats/prom/default_mapper.yaml, and prints what the
// registry exposes. The mapping file is read from a checkout of the
// reference; nothing of it is kept here.
//
// It is a module of its own, under testdata so that the main module's
// builds and tests skip it, because the main module uses a later
// statsd_exporter. Run from this directory:
//
//	go run . -mapper REF/src/stats/prom/default_mapper.yaml \
//	    -events ../reference-events.txt > ../reference-prometheus.golden
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"log"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	kitlog "github.com/go-kit/log"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/statsd_exporter/pkg/event"
	"github.com/prometheus/statsd_exporter/pkg/exporter"
	"github.com/prometheus/statsd_exporter/pkg/mapper"
)

func main() {
	mapperPath := flag.String("mapper", "", "the reference's src/stats/prom/default_mapper.yaml")
	eventsPath := flag.String("events", "", "statsd statistics, one a line: counter|timer NAME VALUE")
	header := flag.String("header", "", "a comment line to start the output with")
	flag.Parse()

	reg := prometheus.NewRegistry()
	m := &mapper.MetricMapper{Registerer: reg}
	// The reference ignores this error (NewPrometheusSink); so would a
	// mapping that does not load here, leaving every statistic unmapped.
	if err := m.InitFromFile(*mapperPath); err != nil {
		log.Fatalf("the mapping does not load: %v", err)
	}
	c := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		reg.MustRegister(v)
		return v
	}
	unmapped := prometheus.NewCounter(prometheus.CounterOpts{Name: "statsd_exporter_events_unmapped_total", Help: "unmapped"})
	reg.MustRegister(unmapped)
	count := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "statsd_exporter_metrics_total", Help: "metrics"}, []string{"type"})
	reg.MustRegister(count)
	exp := exporter.NewExporter(reg, m, kitlog.NewNopLogger(),
		c("statsd_exporter_events_actions_total", "actions", "action"), unmapped,
		c("statsd_exporter_events_error_total", "errors", "reason"), c("statsd_exporter_events_total", "events", "type"),
		c("statsd_exporter_events_conflict_total", "conflicts", "type"), count)

	f, err := os.Open(*eventsPath)
	if err != nil {
		log.Fatal(err)
	}
	var evs event.Events
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 3 {
			log.Fatalf("bad line %q", line)
		}
		v, err := strconv.ParseFloat(fields[2], 64)
		if err != nil {
			log.Fatalf("bad value in %q", line)
		}
		switch fields[0] {
		case "counter":
			evs = append(evs, &event.CounterEvent{CMetricName: fields[1], CValue: v, CLabels: map[string]string{}})
		case "timer":
			evs = append(evs, &event.ObserverEvent{OMetricName: fields[1], OValue: v, OLabels: map[string]string{}})
		default:
			log.Fatalf("bad kind in %q", line)
		}
	}
	ch := make(chan event.Events, 1)
	ch <- evs
	close(ch)
	exp.Listen(ch) // returns once ch is drained and closed
	time.Sleep(10 * time.Millisecond)

	mfs, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	var buf bytes.Buffer
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&buf, mf); err != nil {
			log.Fatal(err)
		}
	}
	var out []string
	for _, l := range strings.Split(buf.String(), "\n") {
		if (strings.HasPrefix(l, "ratelimit") || strings.HasPrefix(l, "statsd_exporter_events_unmapped_total")) && !strings.Contains(l, "_bucket{") {
			out = append(out, l)
		}
	}
	sort.Strings(out)
	if *header != "" {
		fmt.Println("# " + *header)
	}
	fmt.Println(strings.Join(out, "\n"))
}
