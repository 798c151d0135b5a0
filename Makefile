# ratelimitd — run `make help` for the targets.

GO          ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
BENCHSTAT   ?= golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da
BENCH_COUNT ?= 10
BENCH       ?= .
FUZZ_TIME   ?= 30s
BUF         ?= github.com/bufbuild/buf/cmd/buf@v1.75.0
# The race detector needs cgo and a C compiler; without them, test without it.
RACE        ?= $(shell [ "$$($(GO) env CGO_ENABLED)" = 1 ] && command -v "$$($(GO) env CC)" >/dev/null 2>&1 && echo -race)

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-15s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## build bin/ratelimitd
	$(GO) build -o bin/ratelimitd ./cmd/ratelimitd

.PHONY: run
run: ## serve the example rules on the memory backend (gRPC :8081, HTTP :8080)
	$(GO) run ./cmd/ratelimitd -config examples

# Every fuzz target, as package:Target:N. -fuzz takes one target of one
# package per run, so each runs on its own. N is how many inputs `make
# test` tries, about 5 s of this target on the 2-core machine kind: a count,
# not a time, because go1.26's fuzzer can fail a run with "context deadline
# exceeded" when its -fuzztime ends mid-input (go.dev/issue/75804, fixed in
# go1.27); a count has no deadline to race.
FUZZ_TARGETS := \
	./pkg/config:FuzzParse:50000 \
	./pkg/key:FuzzRoundTrip:400000 \
	./pkg/key:FuzzDistinctDescriptorsDistinctKeys:400000 \
	./pkg/service:FuzzJSON:300 \
	./pkg/service:FuzzShouldRateLimit:2000 \
	./pkg/service:FuzzParseLease:20000 \
	./pkg/wire:FuzzDecode:20000

# $(call fuzz_each,TIME) fuzzes each of FUZZ_TARGETS for TIME (a duration,
# or "count" for each target's N inputs), printing each command first.
fuzz_each = @set -e; for t in $(FUZZ_TARGETS); do \
	  pkg="$${t%%:*}"; rest="$${t\#*:}"; name="$${rest%%:*}"; n="$${rest\#*:}"; \
	  ft="$(1)"; [ "$$ft" = count ] && ft="$${n}x"; \
	  echo "$(GO) test -run='^\$$' -fuzz='^$$name\$$' -fuzztime=$$ft $$pkg"; \
	  $(GO) test -run='^$$' -fuzz="^$$name\$$" -fuzztime="$$ft" "$$pkg"; \
	done

.PHONY: test
test: ## run every test (race detector when a C compiler is present), then each fuzz target for its N inputs
	@[ -n "$(RACE)" ] || echo "make test: no C compiler for cgo; testing without the race detector"
	$(GO) test $(RACE) -count=1 -timeout 30m ./...
	$(call fuzz_each,count)

.PHONY: lint
lint: ## check formatting, go vet and staticcheck
	@test -z "$$(gofmt -l .)" || { echo "gofmt would change:"; gofmt -l .; exit 1; }
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

.PHONY: bench
bench: ## run the benchmarks BENCH_COUNT times (compare runs with `make benchstat`)
	$(GO) test -run='^$$' -bench='$(BENCH)' -benchmem -count=$(BENCH_COUNT) ./...

.PHONY: benchstat
benchstat: ## compare two saved benchmark runs: make benchstat OLD=old.txt NEW=new.txt
	$(GO) run $(BENCHSTAT) $(OLD) $(NEW)

# How long each scenario of make loadtest is measured.
LOADTEST_DURATION ?= 10s

.PHONY: loadtest
loadtest: build ## start Redis and ratelimitd on loopback, load them, print one table (LOADTEST_DURATION each)
	$(GO) build -o bin/ratelimit-bench ./cmd/ratelimit-bench
	bin/ratelimit-bench loadtest -ratelimitd bin/ratelimitd -duration $(LOADTEST_DURATION)

.PHONY: fuzz
fuzz: ## run each fuzz target for FUZZ_TIME
	$(call fuzz_each,$(FUZZ_TIME))

.PHONY: fmt
fmt: ## format the code
	gofmt -w .

.PHONY: tidy
tidy: ## tidy go.mod and fail if it changed
	$(GO) mod tidy
	git diff --exit-code go.mod go.sum

.PHONY: ci
ci: lint test ## what CI checks: lint, then every test

.PHONY: proto
proto: ## lint proto/ with buf and regenerate its Go code (buf.gen.yaml)
	$(GO) run $(BUF) lint
	$(GO) run $(BUF) generate

.PHONY: proto-breaking
proto-breaking: ## check proto/ for breaking changes against the main branch
	$(GO) run $(BUF) breaking --against '.git#branch=main'

.PHONY: clean
clean: ## remove build output
	rm -rf bin
