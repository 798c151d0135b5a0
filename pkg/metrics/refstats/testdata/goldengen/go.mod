module github.com/ratelimitd/ratelimitd/pkg/metrics/refstats/testdata/goldengen

go 1.22

require (
	github.com/go-kit/log v0.2.1
	github.com/prometheus/client_golang v1.19.1
	github.com/prometheus/common v0.48.0
	github.com/prometheus/statsd_exporter v0.26.1
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.2.0 // indirect
	github.com/go-logfmt/logfmt v0.6.0 // indirect
	github.com/kr/text v0.2.0 // indirect
	github.com/prometheus/client_model v0.6.0 // indirect
	github.com/prometheus/procfs v0.12.0 // indirect
	golang.org/x/sys v0.17.0 // indirect
	google.golang.org/protobuf v1.33.0 // indirect
	gopkg.in/yaml.v2 v2.4.0 // indirect
)
