# rdmago: make test runs everything (integration tests on real rxe and siw
# devices in qemu guests, lint and host unit tests); make demo runs the main demo;
# make bench measures the examples against the C tools.
# Both install what they need on a Debian 12 machine first.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

export RDMAGO_TESTBED_CACHE ?= $(CURDIR)/.cache/testbed
# The fault matrix's tests keep their tables here (bench/faults-*.md).
export RDMAGO_FAULT_TABLE_DIR ?= $(CURDIR)/bench
RDMAVM := $(CURDIR)/bin/rdmavm
# Programs with heavy dependencies (gRPC) live in a module of their own, so
# that the library's go.mod holds only what the library needs.
APPS := examples/apps
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
# The oldest Go that go.mod's go line allows (go 1.24 or 1.24.0 is toolchain
# go1.24.0): mingo builds and tests with exactly that toolchain, which the go
# command fetches through the module proxy.
GO_MIN := $(shell awk '$$1 == "go" { v = $$2; if (v ~ /^[0-9]+\.[0-9]+$$/) v = v ".0"; print v }' go.mod)
# Packages with tests for inside a guest (integration) and tests that boot
# guests from the host (testbed): only those pay for a boot.
INTEGRATION_PKGS = $(shell grep -rl --include='*_test.go' '^//go:build.*\bintegration\b' . | grep -v '^./$(APPS)/' | xargs -r -n1 dirname | sort -u)
TESTBED_PKGS = $(shell grep -rl --include='*_test.go' '^//go:build.*\btestbed\b' . | xargs -r -n1 dirname | sort -u)

.PHONY: all deps test host-checks unit unit-tests fuzz lint gomod api mingo mingo-build mingo-tests integration integration-late-builds integration-in-guest testbed prepare demo bench examples shell clean

all: test

# DEPS_DONE=1 skips it in a make that a make which ran it started.
deps:
	@[ -n "$(DEPS_DONE)" ] || bash test/testbed/vm/install-deps.sh

$(RDMAVM): deps FORCE
	@go build -o $(RDMAVM) ./test/testbed/cmd/rdmavm

FORCE:

# The guests' tests leave about half of the two cores idle while they wait on
# timeouts, and the host's checks need no guest. So make test starts with the
# guests, and beside them, at the lowest priority (nice 19, taking only what
# the guests leave), runs what needs nothing of the tests' timing: lint, one
# API, the oldest Go's build, the fuzzing, and the compiles of the host's
# tests, which then run after the guests' from a warm cache. Either side
# failing fails make test (-k: a guest's failure still runs the host's
# tests); the background's output comes last. Both sides run in the background of this recipe's
# shell, each in a session of its own, and a HUP, INT or TERM to the shell
# stops both process groups: make passes a TERM to a recipe's shell only,
# not to the go test in a pipeline under it. (A KILL reaches neither side:
# they are no longer in make's process group.) Where the kernel groups a
# session's tasks for scheduling (autogroup), the checks' group's nice is set
# as well, since nice alone would then weigh only within the group and the
# checks would take half of the CPU.
HOST_CHECKS_LOG := $(CURDIR)/bin/host-checks.log
test: prepare
	@mkdir -p bin; rm -f $(HOST_CHECKS_LOG); \
	echo "== beside the guests' tests, at nice 19: lint, one API, the oldest Go's build, fuzzing (their output comes last)"; \
	t0=$$(date +%s); \
	setsid -w sh -c '{ echo 19 > /proc/self/autogroup; } 2>/dev/null; nice -n 19 "$$@"; s=$$?; \
		echo "== these checks took $$(( $$(date +%s) - $$0 )) s"; exit $$s' $$t0 \
		$(MAKE) --no-print-directory DEPS_DONE=1 host-checks > $(HOST_CHECKS_LOG) 2>&1 & checks=$$!; \
	setsid -w $(MAKE) --no-print-directory -k DEPS_DONE=1 integration testbed unit-tests mingo-tests & tests=$$!; \
	trap 'kill -- -$$checks 2>/dev/null || true' EXIT; \
	trap 'kill -- -$$tests 2>/dev/null || true; wait $$tests || true; exit 143' HUP INT TERM; \
	status=0; wait $$tests || status=$$?; \
	echo "== the tests' side (the guests', then the host's tests) took $$(( $$(date +%s) - t0 )) s"; \
	checks_status=0; wait $$checks || checks_status=$$?; \
	echo "== run beside the guests' tests: lint, one API, the oldest Go's build, the host tests' compiles, fuzzing"; \
	cat $(HOST_CHECKS_LOG); \
	if [ $$checks_status -ne 0 ]; then echo "those checks FAILED (exit status $$checks_status): see above"; fi; \
	[ $$status -eq 0 ] && [ $$checks_status -eq 0 ]

# The checks, the compiles of the host's tests (no test selected; TestMain
# still runs), and the fuzzing, whose budgets are counts of executions, not
# time: none of it depends on how much CPU it gets.
host-checks: lint mingo-build
	@echo "== compiling the host's tests for later"
	GOTOOLCHAIN=go$(GO_MIN) CGO_ENABLED=1 go test -count=1 -run '^$$' ./...
	go test -race -count=1 -run '^$$' ./...
	CGO_ENABLED=0 go test -count=1 -run '^$$' $(NOCGO_PKGS)
	@$(MAKE) --no-print-directory fuzz

lint: deps gomod
	@echo "== lint: gofmt, go vet, staticcheck"
	@unformatted=$$(gofmt -l .); if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	go vet ./...
	go vet -tags integration ./...
	go vet -tags testbed ./...
	go run $(STATICCHECK) ./...
	go run $(STATICCHECK) -tags integration ./...
	go run $(STATICCHECK) -tags testbed ./...
	cd $(APPS) && go vet ./... && go vet -tags integration ./... && go run $(STATICCHECK) -tags integration ./...
	@$(MAKE) --no-print-directory api

# go.mod and go.sum are what go mod tidy makes them.
gomod:
	@echo "== go.mod and go.sum tidy"
	go mod tidy -diff
	cd $(APPS) && go mod tidy -diff

# One API everywhere: each public package exports the same API with cgo, without
# cgo and on darwin, never mentioning unsafe or cgo's types, and every package,
# example and test builds and vets in each (internal/cmd/apicheck).
api: deps
	@echo "== one API with and without cgo, on linux and darwin"
	go run ./internal/cmd/apicheck

# The oldest toolchain go.mod allows still builds everything and passes the
# host unit tests (no race detector: this is about the language and library).
mingo: mingo-build mingo-tests

mingo-tests: deps
	@echo "== the oldest Go go.mod allows, go$(GO_MIN): host unit tests"
	GOTOOLCHAIN=go$(GO_MIN) CGO_ENABLED=1 go test -count=1 ./...

mingo-build: deps
	@echo "== the oldest Go go.mod allows, go$(GO_MIN): build, vet"
	GOTOOLCHAIN=go$(GO_MIN) go build ./...
	GOTOOLCHAIN=go$(GO_MIN) go vet -tags integration ./...
	GOTOOLCHAIN=go$(GO_MIN) go vet -tags testbed ./...

unit: lint mingo unit-tests fuzz

# Pure Go also builds and passes without cgo.
NOCGO_PKGS := ./verbs/... ./rdmacm/... ./resolver/... ./internal/...
# Every decoder of bytes a peer sends, and the rules that take user input:
# package:target.
FUZZ_TARGETS := verbs:FuzzValidate verbs:FuzzTimerEncoders rdmacm:FuzzDecodePrivateData \
	rdmacm:FuzzReceivedPrivateData rdmacm:FuzzParseRemoteBuffer rdmacm/msg:FuzzDecodeFrame \
	rdmacm/msg:FuzzParseHello oob:FuzzPeerLine
# fuzz_each runs every target for $(1) executions, each command shown.
fuzz_each = for f in $(FUZZ_TARGETS); do \
	echo "go test -run '^\$$' -fuzz '^$${f\#*:}\$$' -fuzztime $(1) ./$${f%%:*}"; \
	go test -run '^$$' -fuzz "^$${f\#*:}$$" -fuzztime $(1) ./$${f%%:*} || exit 1; done
# build_only builds test binaries and runs none (-exec /bin/true), showing
# only what is not "ok": go test -p 1 compiles one package at a time, so the
# compiles go first, on both cores. Compiles are cached, links are not.
build_only = go test -count=1 -exec /bin/true $(1) | { grep -v '^ok ' || true; }

unit-tests: deps
	@echo "== unit tests on the host (race detector; pure Go also without cgo)"
	go test -race -count=1 ./...
	CGO_ENABLED=0 go test -count=1 $(NOCGO_PKGS)

fuzz: deps
	@echo "== fuzzing, briefly"
	@# Budgets in executions, not seconds: go1.26's fuzz coordinator can fail a
	@# duration-bounded run with "context deadline exceeded" at the deadline
	@# (go.dev/issue/75804, fixed in go1.27); a count has no deadline to race.
	@$(call fuzz_each,100000x)

prepare: $(RDMAVM)
	@echo "== test bed: guest kernel, siw and initramfs (cached in $(RDMAGO_TESTBED_CACHE))"
	$(RDMAVM) prepare

# One guest serves every package's test binary in turn (rdmavm session): a
# boot costs about 7 s under emulation, and there are some twenty binaries.
# They are compiled before the guest boots (build_only).
# The apps' and the cgocheck2 build's tests, run last, compile meanwhile at
# nice 19 (about 45 s from an empty build cache): their go test compiles
# whatever that has not finished, and reports its errors (lint, beside,
# vets the apps' code sooner).
integration: prepare
	@echo "== compiling the integration tests"
	$(call build_only,-race -tags integration $(INTEGRATION_PKGS))
	@echo "== integration tests inside a guest with rxe and siw (one guest for all, each package in a fresh process)"
	nice -n 19 $(MAKE) --no-print-directory integration-late-builds >/dev/null 2>&1 & builds=$$!; \
	status=0; $(RDMAVM) session $(MAKE) --no-print-directory integration-in-guest || status=$$?; \
	wait $$builds || true; exit $$status

integration-late-builds:
	cd $(APPS) && $(call build_only,-race -tags integration ./...)
	GOEXPERIMENT=cgocheck2 $(call build_only,-tags integration ./verbs)

integration-in-guest:
	go test -p 1 -count=1 -race -v -tags integration -exec "$(RDMAVM) exec" $(INTEGRATION_PKGS)
	@echo "== gRPC and net/http over rdmacm/stream, in their own module ($(APPS))"
	cd $(APPS) && go test -p 1 -count=1 -race -v -tags integration -exec "$(RDMAVM) exec" ./...
	@echo "== the verbs integration tests again under cgocheck2: no Go pointer kept by C or handed to the NIC"
	GOEXPERIMENT=cgocheck2 go test -count=1 -tags integration -exec "$(RDMAVM) exec" ./verbs

testbed: prepare
	$(call build_only,-tags testbed $(TESTBED_PKGS))
	@echo "== tests that boot guests from the host (two RoCE hosts, faults)"
	go test -p 1 -count=1 -v -tags testbed -run . $(TESTBED_PKGS)

# The examples, built for the guest (which sees this directory).
EXAMPLES := cmtime pingpong rping udaddy devices rdmapath streambench soak
examples: deps
	@for e in $(EXAMPLES); do go build -o bin/$$e ./examples/$$e; done
	cd $(APPS) && go build -o $(CURDIR)/bin/ ./grpcping ./httpecho

# Addresses of the test bed guest's devices (test/testbed): rxe0, then siw0.
DEMO_ADDRS := 10.10.0.1 10.30.0.1

demo: prepare examples
	@echo "== demo: pingpong over rxe (RoCE v2) and siw (iWARP) in a test bed guest"
	$(RDMAVM) exec $(CURDIR)/bin/pingpong $(DEMO_ADDRS)

bench: prepare examples
	@echo "== benchmarks: Go examples against rdma-core's and perftest's C tools, in one guest"
	@# perf samples the whole guest for the side-by-side system profiles; the
	@# guest runs the host's perf, which must match its kernel (Debian 12's 6.1).
	@bash test/testbed/vm/install-deps.sh linux-perf
	go build -o bin/bench ./bench
	go test -c -tags integration -o bin/rdmacm.bench.test ./rdmacm
	rm -rf bench/profiles
	@# First the cost model (one vCPU, instructions counted: the figures the
	@# targets are judged on), then the 2-vCPU wall clock, for information.
	$(RDMAVM) exec -cost-model $(CURDIR)/bin/bench -cost-model -bin $(CURDIR)/bin -out $(CURDIR)/bench/results.md
	$(RDMAVM) exec $(CURDIR)/bin/bench -append -bin $(CURDIR)/bin -out $(CURDIR)/bench/results.md
	$(RDMAVM) exec $(CURDIR)/bin/soak -duration 3m -out $(CURDIR)/bench/soak.md
	@# A profile is named after its tool: cmtime-rxe0.prof belongs to bin/cmtime.
	for f in bench/profiles/*.prof; do n=$$(basename $$f .prof); \
		go tool pprof -top -nodecount=30 bin/$${n%%-*} $$f > bench/profiles/$$n.txt || exit 1; done

shell: prepare
	$(RDMAVM) shell

clean:
	rm -rf bin .cache
