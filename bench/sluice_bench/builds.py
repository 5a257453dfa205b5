"""What the runs compile: the two wasm fixtures (an empty filter and the design's floor),
sluice-service and its RLS load generator optimized without the filter's LTO, and the pure core's
micro-benchmarks, natively and compiled to wasm32 under Node's V8."""

import functools
import json
import os
import shutil
from pathlib import Path

from .paths import FIXTURE_TARGET, FIXTURES, ROOT, SERVICE_TARGET, SLUICE_WASM
from .processes import Failure, log, run


def build_fixtures():
    """The fixtures' .wasm files, by name ("empty", "floor")."""
    wasm = {}
    for name in ("empty", "floor"):
        log(f"building the {name} fixture")
        run(
            [
                "cargo", "build", "--release", "--target", "wasm32-wasip1", "--quiet",
                "--manifest-path", str(FIXTURES / name / "Cargo.toml"),
                "--target-dir", str(FIXTURE_TARGET),
            ],
            timeout=900,
        )
        wasm[name] = FIXTURE_TARGET / "wasm32-wasip1" / "release" / f"bench_{name}.wasm"
    return wasm


# The service's release build as the runs make it: optimized, without the filter's LTO.
_SERVICE_PROFILE = {"CARGO_PROFILE_RELEASE_LTO": "false", "CARGO_PROFILE_RELEASE_CODEGEN_UNITS": "16",
                    "CARGO_PROFILE_RELEASE_PANIC": "unwind"}


@functools.cache
def build_service():
    """sluice-service optimized, without the filter's LTO (minutes of compiling on 2 cores); built
    once per run, when out of date."""
    log("building sluice-service (release)")
    run(["cargo", "build", "--release", "--quiet", "-p", "sluice-service", "--target-dir", str(SERVICE_TARGET)],
        timeout=1800, env=dict(os.environ, **_SERVICE_PROFILE))
    return SERVICE_TARGET / "release" / "sluice-service"


@functools.cache
def build_rls_load():
    """The RLS load generator (service/examples/rls_load.rs), built as the service is."""
    log("building the RLS load generator (release)")
    run(["cargo", "build", "--release", "--quiet", "-p", "sluice-service", "--example", "rls_load",
         "--target-dir", str(SERVICE_TARGET)], timeout=1800, env=dict(os.environ, **_SERVICE_PROFILE))
    return SERVICE_TARGET / "release" / "examples" / "rls_load"


def service_binary():
    """$SLUICE_SERVICE, else build_service's (the reliability runs' choice)."""
    chosen = os.environ.get("SLUICE_SERVICE")
    return Path(chosen) if chosen else build_service()


def micro_benchmarks(workdir):
    """`cargo bench --bench micro`'s results, natively, with the same cases compiled to wasm32 and
    run under Node's V8 (as the filter runs in Envoy's) under "wasm" when node is there."""
    micro = micro_benchmark_run(workdir)
    if shutil.which("node"):
        micro["wasm"] = micro_benchmark_run(workdir, wasm=True)["cases"]
    return micro


def micro_benchmark_run(workdir, wasm=False):
    where = "compiled to wasm32-wasip1, under Node's V8" if wasm else "natively"
    log(f"cargo bench --bench micro: the pure core, {where}")
    out = workdir / ("micro-wasm.json" if wasm else "micro.json")
    cmd = ["cargo", "bench", "--quiet", "--bench", "micro"]
    env = {**os.environ, "SLUICE_BENCH_JSON": str(out)}
    if wasm:
        cmd[2:2] = ["--target", "wasm32-wasip1"]
        # .cargo/config.toml's runner, scripts/wasi-runner.mjs, lets it write the results there.
        env["SLUICE_WASI_DIR"] = str(workdir)
    print(run(cmd, timeout=1200, env=env), end="", flush=True)
    return json.loads(out.read_text())


def require_wasm(target):
    """Fails unless the filter is built (`target`, a make target, builds it first)."""
    if not SLUICE_WASM.exists():
        raise Failure(f"{SLUICE_WASM.relative_to(ROOT)} is missing: run make build ({target} does)")
