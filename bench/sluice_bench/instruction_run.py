"""`make bench-instructions` (run.py --instructions): each setup's Envoy under valgrind's
callgrind, one at a time, counting the instructions its worker thread executes per request;
bench/instructions.json, and BENCHMARKS.md rendered again (its CPU part from results.json)."""

import re
import signal
import tempfile
import time
from pathlib import Path

from .benchmarks_report import render
from .builds import require_wasm
from .envoy import Envoy, find_envoy
from .facts import command_line, facts
from .instructions_report import instructions_section
from .load import send
from .paths import read_json, write_json
from .processes import Failure, install_signal_handlers, log, require, run
from .setups import chosen_setups, services_for

# Envoy's command prefix. Start-up runs uninstrumented (--instr-atstart=no, several times
# faster); --smc-check=all-non-file makes valgrind see the code V8 writes, the compiled wasm.
CALLGRIND = [
    "valgrind", "--tool=callgrind", "--separate-threads=yes", "--smc-check=all-non-file",
    "--instr-atstart=no",
]
# Requests sent before counting (they fill the caches and drain the denying setups' bursts).
WARMUP = 300
# A bound per setup: start-up under valgrind (10 to 20 s, more on a busy machine) and the
# requests (about 400/s under valgrind).
SECONDS_PER_SETUP = 90


def run_instructions(args, reports):
    """Every setup (or --only's) under callgrind; instructions.json, and BENCHMARKS.md again."""
    valgrind = valgrind_version()
    require_wasm("make bench-instructions")
    install_signal_handlers()
    started = time.monotonic()
    envoy_bin = find_envoy()
    info = facts(envoy_bin, command_line("run.py")) | {"valgrind": valgrind}
    chosen, service_port = chosen_setups(args.only, valgrind=True)
    with tempfile.TemporaryDirectory(prefix="sluice-instructions-") as tmp:
        rows = count_setups(envoy_bin, chosen, Path(tmp), service_port, args.requests)
    saved = {"info": info, "warmup": WARMUP, "requests": args.requests, "callgrind": CALLGRIND,
             "labels": {s.id: s.label for s in chosen}, "rows": rows, "elapsed_s": time.monotonic() - started}
    write_json(reports.instructions_json, saved)
    log(f"wrote {reports.instructions_json.name} in {time.monotonic() - started:.0f}s")
    rerender(reports)


def valgrind_version():
    """valgrind's version; fails with how to install it if valgrind or callgrind_control lacks."""
    require("valgrind", "callgrind_control", hint=": --instructions needs valgrind (apt-get install valgrind)")
    return run(["valgrind", "--version"], timeout=30).strip()


def count_setups(envoy_bin, chosen, workdir, service_port, requests):
    """Each setup's counts, by id, within a bound on the whole."""
    signal.alarm(SECONDS_PER_SETUP * len(chosen) + 120)
    try:
        rows = {}
        with services_for(chosen, workdir, service_port):
            for s in chosen:
                log(f"setup {s.id}: {s.label}, under callgrind")
                rows[s.id] = row = count_instructions(envoy_bin, s, workdir, requests)
                log_row(s.id, row)
        return rows
    finally:
        signal.alarm(0)


def log_row(sid, row):
    log(
        f"setup {sid:>2}: {row['instructions_per_request']:>9,.0f} instructions/request "
        f"(all threads {row['all_threads_per_request']:,.0f}), answers {row['statuses']}, "
        f"start-up {row['start_s']:.0f}s, {row['requests_per_s']:.0f} requests/s"
        + (f", calls {row['callouts']}" if row["callouts"] else "")
    )
    if not row["as_designed"]:
        log(f"warning: setup {sid} did not answer as designed: left out of the ratios")


def count_instructions(envoy_bin, setup, workdir, requests):
    """One setup's Envoy under callgrind: warm up, zero, `requests` requests, dump. The busiest
    thread (the worker's) over the requests is the figure."""
    out = workdir / f"callgrind-{setup.id}"
    envoy = Envoy(envoy_bin, setup.id, setup.filters, workdir, pin=False, clusters=setup.clusters,
                  wrapper=CALLGRIND + [f"--callgrind-out-file={out}.%p"], response=setup.response)
    with envoy:
        began = time.monotonic()
        envoy.start(timeout=SECONDS_PER_SETUP)
        start_s = time.monotonic() - began
        callgrind_control(envoy, "--instr=on")
        warmup = send(envoy.port, WARMUP)
        callgrind_control(envoy, "--zero")
        began = time.monotonic()
        statuses = send(envoy.port, requests)
        seconds = time.monotonic() - began
        callgrind_control(envoy, "--dump")
        calls = callout_stats(envoy) if setup.uses_service else None
    threads = thread_totals(out, envoy.pid)
    expected = "429" if setup.denies else "200"
    return {
        "instructions_per_request": max(threads.values()) / requests,
        "all_threads_per_request": sum(threads.values()) / requests,
        "threads": threads,
        "requests": requests,
        "statuses": statuses,
        "warmup_statuses": warmup,
        "callouts": calls,
        "as_designed": statuses == {expected: requests} and not (calls and calls["callout_failures"]),
        "start_s": round(start_s, 1),
        "requests_per_s": round(requests / seconds, 1),
    }


def callgrind_control(envoy, option):
    """Sends a command (instrumentation on, zero, dump) to the callgrind running `envoy`."""
    run(["callgrind_control", option, str(envoy.pid)], timeout=120)


def callout_stats(envoy):
    """sluice's calls to the service and their failures, once its counters reach Envoy (they are
    flushed every second)."""
    time.sleep(1.5)
    stats = envoy.stats()
    return {name: stats.get(f"wasmcustom.sluice.{name}", 0) for name in ("callouts", "callout_failures")}


def thread_totals(out, pid):
    """Instructions per thread in callgrind's first dump (`<out>.<pid>.1-<thread>`), by thread."""
    totals = {}
    for path in out.parent.glob(f"{out.name}.{pid}.1-*"):
        match = re.search(r"^(?:summary|totals):\s+(\d+)", path.read_text(errors="replace"), re.MULTILINE)
        if match:
            totals[path.name.rsplit("-", 1)[1]] = int(match.group(1))
    if not totals:
        raise Failure(f"callgrind wrote no dump for {out.name} (pid {pid})")
    return dict(sorted(totals.items()))


def rerender(reports):
    """BENCHMARKS.md again, with the new section, when a CPU run's results.json is there."""
    cpu = read_json(reports.results_json)
    if cpu is None:
        log(f"no {reports.results_json.name}: BENCHMARKS.md not rewritten (make bench writes both)")
        return
    render(cpu, reports)
    log(f"rewrote {reports.benchmarks_md}")
    print("\n".join(instructions_section(read_json(reports.instructions_json), cpu["summary"], reports)))
