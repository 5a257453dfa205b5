# sluice: build the wasm filter, try it in Envoy, run the checks CI runs.
#
#   make build   compile target/wasm32-wasip1/release/sluice.wasm
#   make run     build, then start Envoy with envoy/demo.yaml (foreground)
#   make run-global  redis-server, sluice-service and Envoy with envoy/global.yaml
#   make run-rls  redis-server, sluice-service --rls and Envoy's own ratelimit filter (envoy/rls.yaml)
#   make test    lint, build, then every test: the core's on wasm32 too, the service's,
#                and the integration tests that drive real Envoys, Redis and the service
#   make lint    cargo fmt --check and clippy for the host and for wasm
#   make bench   the cost per request against Envoy's native limiter (BENCHMARKS.md)
#   make bench-instructions   instructions per request under valgrind, deterministic (BENCHMARKS.md)
#   make soak, make chaos   key floods, long runs and faults (docs/reliability.md)
#   make clean   cargo clean (keeps .venv, where scripts/find-envoy installs Envoy)

# Recipes run from the repo root, wherever make was started from: the demo
# config names the wasm by a path relative to it.
ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
WASM_TARGET := wasm32-wasip1
WASM := target/$(WASM_TARGET)/release/sluice.wasm

.PHONY: build service run run-global run-rls test lint toolchain clean

# Adds the wasm target and the lint components when rustup lacks them.
toolchain:
	@rustup target list --installed | grep -qx '$(WASM_TARGET)' || rustup target add $(WASM_TARGET)
	@rustup component list --installed | grep -q '^clippy' || rustup component add clippy
	@rustup component list --installed | grep -q '^rustfmt' || rustup component add rustfmt

build: toolchain
	cd $(ROOT) && cargo build --release --target $(WASM_TARGET)

# The global-limit service, as the integration tests and run-global use it.
service:
	cd $(ROOT) && cargo build -p sluice-service

run-global: build service
	@cd $(ROOT) && exec scripts/run-global

# No wasm here: Envoy's native ratelimit filter asks sluice-service over gRPC.
run-rls: service
	@cd $(ROOT) && exec scripts/run-rls

run: build
	@cd $(ROOT) && envoy="$$(scripts/find-envoy)" && \
	printf '%s\n' \
	  "Envoy: $$envoy" \
	  "Listener http://127.0.0.1:10000, admin http://127.0.0.1:9901. Try, in another shell:" \
	  "  for i in \$$(seq 8); do curl -s -o /dev/null -w '%{http_code}\\n' -H 'x-user-id: alice' localhost:10000/api/hello; done" \
	  "  curl -si -H 'x-user-id: bob' localhost:10000/api/hello" \
	  "  curl -s 'localhost:9901/stats?filter=sluice'" \
	  "Ctrl-C stops Envoy." && \
	exec "$$envoy" -c envoy/demo.yaml --concurrency 2 -l info

lint: toolchain
	cd $(ROOT) && cargo fmt --check
	cd $(ROOT) && cargo clippy --workspace --all-targets -- -D warnings
	cd $(ROOT) && cargo clippy -p sluice --target $(WASM_TARGET) --lib -- -D warnings

# Lint first so that cargo test's summary is the last thing printed. The core's unit tests
# also run compiled for wasm32, under Node's WASI (.cargo/config.toml).
test: lint build service
	cd $(ROOT) && cargo test -p sluice --target $(WASM_TARGET) --lib
	cd $(ROOT) && ENVOY="$$(scripts/find-envoy)" && export ENVOY && \
	cargo test --workspace --all-targets

clean:
	cd $(ROOT) && cargo clean

# Not part of make test. Measures sluice against Envoy alone, native local_ratelimit and two
# wasm fixtures, with wrk, and rewrites BENCHMARKS.md and bench/results.{svg,json}: about
# 5 minutes on 2 cores, plus compiling the fixtures and micro-benchmarks the first time.
# Options go through BENCH_ARGS, e.g. make bench BENCH_ARGS=--quick (see bench/run.py --help).
.PHONY: bench
bench: build
	cd $(ROOT) && python3 bench/run.py $(BENCH_ARGS)

# Not part of make test: the same setups, each Envoy under valgrind's callgrind, counting the
# instructions its worker executes per request. Deterministic where make bench's CPU time moves
# ±20% between runs on a shared machine, but blind to cache misses and syscall costs: a complement,
# not a replacement. Rewrites bench/instructions.json and its section of BENCHMARKS.md; about
# 4 minutes. Needs valgrind (apt-get install valgrind). Options through BENCH_ARGS, e.g. --only 3b,4.
.PHONY: bench-instructions
bench-instructions: build
	cd $(ROOT) && python3 bench/run.py --instructions $(BENCH_ARGS)

# Not part of make test: reliability runs that rewrite their sections of docs/reliability.md.
# make soak: a flood of 1,000,000 new keys against max_keys, then SOAK_MINUTES (default 10) of
# mixed local and global traffic; make chaos: Redis and the service killed and paused under load
# (about 2 minutes). Both build the service as make bench does (release, without LTO).
# Options go through SOAK_ARGS / CHAOS_ARGS (see bench/soak.py --help, bench/chaos.py --help).
.PHONY: soak chaos
soak: build
	cd $(ROOT) && python3 bench/soak.py $(SOAK_ARGS)

chaos: build
	cd $(ROOT) && python3 bench/chaos.py $(CHAOS_ARGS)
