"""`make bench` (bench/run.py tells what it measures): the setups interleaved for several rounds
under wrk, then the accuracy run and the micro-benchmarks; bench/results.json (and, for a full
run, a line of bench/history.jsonl), from which BENCHMARKS.md and bench/results.svg are
rendered."""

import contextlib
import os
import signal
import tempfile
import time
from pathlib import Path

from .accuracy import accuracy
from .benchmarks_report import render
from .builds import micro_benchmarks, require_wasm
from .envoy import Envoy, find_envoy
from .facts import command_line, facts
from .global_traffic import global_traffic
from .history import append_history, history_entry
from .measure import measure, summarize
from .paths import read_json, write_json
from .processes import Failure, install_signal_handlers, log, require
from .setups import TRAFFIC_SETUP, chosen_setups, services_for


def run_cpu(args, reports):
    check_machine()
    install_signal_handlers()
    started = time.monotonic()
    envoy_bin = find_envoy()
    info = facts(envoy_bin, command_line("run.py"))
    load = float(info["loadavg"][0])
    if load > 0.5:
        log(f"warning: load average {load} before the run: other work on this machine skews the figures")
    chosen, service_port = chosen_setups(args.only)
    with tempfile.TemporaryDirectory(prefix="sluice-bench-") as tmp:
        workdir = Path(tmp)
        micro = None if args.no_micro else micro_benchmarks(workdir)
        # A bound on the whole run: the measurements plus generous start-up and slack.
        per_round = len(chosen) * (args.duration + args.warmup + 2)
        signal.alarm(int(args.rounds * per_round + args.accuracy_seconds + 300))
        rows, traffic = measure_rounds(envoy_bin, chosen, workdir, service_port, args)
        acc = accuracy(envoy_bin, workdir, args.accuracy_seconds) if args.accuracy_seconds > 0 else None
        signal.alarm(0)
    summary = summarize(rows)
    elapsed = time.monotonic() - started
    write_json(reports.results_json, {
        "info": info, "args": vars(args), "labels": {s.id: s.label for s in chosen}, "rounds": rows,
        "summary": summary, "accuracy": acc, "micro": micro, "global_traffic": traffic, "elapsed_s": elapsed,
    })
    # A run of every setup, rounds included, is one the next runs compare themselves with.
    if not args.only and not args.quick:
        append_history(reports.history, history_entry(info, summary, acc))
    render(read_json(reports.results_json), reports)
    log(f"wrote {reports.benchmarks_md}, {reports.results_svg.name} and {reports.results_json.name} in {elapsed:.0f}s")
    print(reports.benchmarks_md.read_text())


def check_machine():
    require("wrk", "taskset", "cargo", hint=" (wrk: apt-get install wrk; taskset: util-linux)")
    if (os.cpu_count() or 1) < 2:
        raise Failure("needs 2 cores (Envoy on core 0, wrk on core 1)")
    require_wasm("make bench")


def measure_rounds(envoy_bin, chosen, workdir, service_port, args):
    """Every setup's Envoy started, then `args.rounds` rounds of one measurement each; the
    measurements by setup id, and (with setup 11) the global concurrency policy's traffic to the
    service. The Envoys and services are stopped whatever happens."""
    rows = {s.id: [] for s in chosen}
    with services_for(chosen, workdir, service_port), contextlib.ExitStack() as envoys:
        started = {}
        for s in chosen:
            log(f"starting Envoy for setup {s.id}: {s.label}")
            started[s.id] = envoys.enter_context(Envoy(envoy_bin, s.id, s.filters, workdir, clusters=s.clusters,
                                                         response=s.response))
            started[s.id].start()
        for r in range(1, args.rounds + 1):
            for s in chosen:
                result = measure(started[s.id], args.duration, args.warmup, args.connections)
                rows[s.id].append(result)
                log_measurement(f"round {r}/{args.rounds} setup {s.id:>2}", s, result)
        traffic = None
        if TRAFFIC_SETUP in started:
            traffic = global_traffic(started[TRAFFIC_SETUP], service_port, args.duration, args.connections)
            for load, t in traffic.items():
                log(f"setup {TRAFFIC_SETUP}, {load} ({t['load']}): {t['requests']:,} requests, {t['refused']:,} "
                    f"refused; per 1,000: {t['per_1000']}; settlements {t['settlements']}, outbox {t['outbox']}, "
                    f"failed calls {t['failed_calls']}")
    return rows, traffic


def log_measurement(where, setup, result):
    log(
        f"{where}: {result['rps']:>9,.0f} req/s  "
        f"p50 {result['p50_ms']:.3f} ms  p99 {result['p99_ms']:.3f} ms  "
        f"{result['cpu_us_per_request']:6.1f} µs CPU/req  "
        f"Envoy CPU {100 * result['envoy_cpu_share']:.0f}%  others {result['others_share']:.2f} cores  "
        f"RSS {result['rss_mib']:.1f} MiB  non-2xx {result['non2xx']}"
    )
    if result["socket_errors"]:
        log(f"warning: {result['socket_errors']} socket errors")
    share = result["non2xx"] / max(result["requests"], 1)
    if (setup.denies and share < 0.9) or (not setup.denies and result["non2xx"]):
        log(f"warning: setup {setup.id} answered {100 * share:.1f}% non-2xx, not as designed")
