"""BENCHMARKS.md's section on the RLQS (issue 36), rendered from bench/rlqs.json: what a request
costs through each setup, the service's CPU against the request rate, and how exactly each
setup keeps a budget three Envoys share."""

import statistics

from .markdown import figure, table
from .processes import LOAD_CORE
from .rlqs_run import (BUDGET_PER_MIN, CONNECTIONS, DELAY_MS, EXACT_SETUPS, KEY, KEYS, OFFERED_PER_S, RATES,
                       REPORTING_INTERVAL, SERVER_CORE, SETUPS, SHARED, SHARES)

# Issue 36's target: the RLQS Envoy's CPU per request at most this over native local_ratelimit's.
ENVOY_TARGET = 1.10


def rlqs_section(saved):
    info, args, summary = saved["info"], saved["args"], saved["summary"]
    return [
        "## The RLQS against the RLS, local_ratelimit and a static assignment (issue 36)",
        "",
        "Written by `make bench-rlqs` (`bench/rlqs.py`), separately from the figures above; the raw "
        "samples are in [`bench/rlqs.json`](bench/rlqs.json).",
        "",
        f"- Date: {info['date']}; the run took {saved['elapsed_s'] / 60:.1f} minutes",
        f"- Machine: {info['cpu']}, {info['cores']} cores, Linux {info['kernel']}, **shared**: other agents "
        "were building and testing on the same two cores meanwhile. Load average at the start "
        f"{' '.join(info['loadavg'])}, at the end {' '.join(info.get('loadavg_end', ['n/a']))}; "
        "*machine busy* below is all the CPU `/proc/stat` counted during each run, ours included, in cores",
        f"- Commit: {info['commit']}; command: `{info['command']}`",
        f"- {info['redis'].split(' sha=')[0]}; Envoy {info['envoy']}; {info['wrk']}; "
        f"`{info['service_version']}`, the release build `make bench` makes",
        "",
        method(args),
        "",
        *cost_table(summary["cost"], saved["cost"]),
        "",
        *rate_table(summary["rates"]),
        "",
        *exact_table(saved["exact"], args),
    ]


def method(args):
    return (
        "**Method.** The same Envoy (one worker, pinned to core "
        f"{SERVER_CORE}) in five setups, each a listener whose route leads to a second listener of the "
        "same Envoy that answers `ok` (the ratelimit filter reads a route's `rate_limits` only on a "
        "route to a cluster): **RLS**, Envoy's `ratelimit` filter asking `sluice-service --rls` "
        f"(a call per request, one descriptor `({KEY}=<x-user-id>)`); **RLQS**, Envoy's "
        "`rate_limit_quota` filter with `sluice-service --rlqs` (a bucket per `x-user-id`, its "
        "`bucket_id_builder` a `custom_value` reading the header; `reporting_interval: "
        f"{REPORTING_INTERVAL}`), and the same with one bucket for every request (a constant id); Envoy's native **local_ratelimit** (one token "
        "bucket, no response headers); and **no** rate-limit filter. The RLS and the RLQS read the "
        "same limits file (in `bench/rlqs.json`): a fixed window of a billion a minute per user "
        "(refusing nothing), and "
        f"{BUDGET_PER_MIN:,} a minute for `{KEY}={SHARED}` (part 3). Each service has a "
        f"`redis-server` of its own, on core {LOAD_CORE} with wrk; the services run on core {SERVER_CORE} "
        "with the Envoys. wrk sends `GET` with an `x-user-id` at random among "
        f"{KEYS:,} (so the RLQS Envoy holds {KEYS:,} buckets). **CPU** is each process's "
        "utime+stime from `/proc/<pid>/stat` over the run; per request, divided by the requests wrk "
        "completed; *core*, over the run's seconds."
    )


def cost_table(cost, samples):
    rows = []
    for setup, label in SETUPS.items():
        s = cost.get(setup)
        if not s:
            continue
        rows.append([label, f"{s['rps']:,.0f}", f"{s['p50_ms']:.3f}", f"{s['p99_ms']:.3f}",
                     f"{s['envoy_cpu_us_per_request']:.1f}", figure(s["service_cpu_us_per_request"], ".2f"),
                     pct(s["service_cpu_share"]), figure(s["redis_cpu_us_per_request"], ".2f"),
                     f"{s['non2xx']:,.0f}", f"{s['machine_busy_cores']:.2f}"])
    lines = [
        "### 1. What a request costs",
        "",
        f"Closed-loop wrk (`-t1 -c{CONNECTIONS}`), medians of the rounds (each round every setup in turn, "
        "after its warm-up):",
        "",
        *table(["Setup", "req/s", "p50 ms", "p99 ms", "Envoy CPU µs/req", "service CPU µs/req",
                "service core", "Redis CPU µs/req", "non-2xx", "machine busy (cores)"], rows, "lrrrrrrrrr"),
    ]
    rlqs, local, none, rls = (cost.get(k, {}).get("envoy_cpu_us_per_request") for k in ("rlqs", "local", "none",
                                                                                        "rls"))
    if rlqs and local:
        ratio = rlqs / local
        paired = sorted(a["envoy_cpu_us_per_request"] / b["envoy_cpu_us_per_request"]
                        for a, b in zip(samples.get("rlqs", []), samples.get("local", [])))
        rounds = (f" (within each round: median {statistics.median(paired):.3f}×, "
                  f"{paired[0]:.3f}–{paired[-1]:.3f}×)" if paired else "")
        per_round = statistics.median(paired) if paired else ratio
        verdict = ("met" if max(ratio, per_round) <= ENVOY_TARGET else
                   "**missed**" if min(ratio, per_round) > ENVOY_TARGET else
                   "at its edge: met by one of the two figures, not the other")
        lines += [
            "",
            f"RLQS Envoy CPU per request over native local_ratelimit's: **{ratio:.3f}×**{rounds} (issue 36's "
            f"target ≤ {ENVOY_TARGET:.2f}×: {verdict})"
            + (f"; over no filter's: {rlqs / none:.3f}×; local_ratelimit over no filter's: {local / none:.3f}×"
               if none else "")
            + (f"; with one bucket for every request (a constant bucket id, no header read): "
               f"{cost['rlqs1']['envoy_cpu_us_per_request'] / local:.3f}× local_ratelimit's"
               if cost.get("rlqs1") else "")
            + (f". The RLS Envoy's is {rls / local:.2f}× local_ratelimit's, and the RLS adds its service's "
               f"{cost['rls']['service_cpu_us_per_request']:.1f} µs and Redis's "
               f"{cost['rls']['redis_cpu_us_per_request']:.1f} µs per request; the RLQS's service "
               f"{cost['rlqs']['service_cpu_us_per_request']:.2f} µs and Redis "
               f"{cost['rlqs']['redis_cpu_us_per_request']:.2f} µs" if rls else "") + ".",
        ]
    return lines


def pct(value):
    return "n/a" if value is None else f"{100 * value:.1f}%"


def rate_table(rates):
    rows = []
    for setup in ("rls", "rlqs"):
        for rate in RATES:
            s = rates.get(f"{setup}/{rate}")
            if not s:
                continue
            rows.append([SETUPS[setup].split(":")[0], rate, f"{s['rps']:,.0f}", f"{s['p99_ms']:.3f}",
                         f"{s['envoy_cpu_us_per_request']:.1f}", pct(s["service_cpu_share"]),
                         f"{s['service_cpu_share'] * 1e6 / max(s['rps'], 1):.2f}",
                         pct(s["redis_cpu_share"]), f"{s['non2xx']:,.0f}", f"{s['machine_busy_cores']:.2f}"])
    growth = []
    for setup in ("rls", "rlqs"):
        low, high = rates.get(f"{setup}/1x"), rates.get(f"{setup}/4x")
        if low and high and low["service_cpu_share"]:
            growth.append(f"{SETUPS[setup].split(':')[0]}: {high['rps'] / low['rps']:.2f}× the requests, "
                          f"{high['service_cpu_share'] / low['service_cpu_share']:.2f}× the service's CPU per "
                          f"second, {high['redis_cpu_share'] / max(low['redis_cpu_share'], 1e-9):.2f}× Redis's")
    return [
        "### 2. The service's CPU against the request rate",
        "",
        "The same Envoy and the same "
        f"{KEYS:,} users at two paced rates (wrk, each connection waiting {DELAY_MS} ms between requests: "
        + ", ".join(f"{c} connections at {r}" for r, c in RATES.items())
        + "), medians of the rounds. *Service core* is its CPU per second of the run:",
        "",
        *table(["Setup", "rate", "req/s", "p99 ms", "Envoy CPU µs/req", "service core", "service CPU µs/req",
                "Redis core", "non-2xx", "machine busy (cores)"], rows, "llrrrrrrrr"),
        *(["", "; ".join(growth) + "."] if growth else []),
    ]


def exact_table(exact, args):
    rows = []
    for setup, label in EXACT_SETUPS.items():
        e = exact.get(setup)
        if not e:
            continue
        per = ", ".join(f"{p['admitted']:,} of {p['sent']:,}" for p in e["per_envoy"])
        warm = sum(p["warmup_admitted"] for p in e["per_envoy"])
        rows.append([label, f"{e['limit']:,.0f}", f"{e['admitted']:,}", f"**{e['admitted_over_limit']:.3f}**",
                     per, f"{e['sent']:,}", f"{warm:,}", figure(e.get("service_cpu_s"), ".2f")])
    rates = ", ".join(f"{r:g}" for r in OFFERED_PER_S)
    return [
        "### 3. Exactness: three Envoys sharing one budget",
        "",
        f"Three Envoys (one worker each, not pinned) share `{KEY}={SHARED}`'s {BUDGET_PER_MIN:,} a minute; "
        f"paced clients (one keep-alive connection each, {rates} requests a second: twice the budget, split "
        + "/".join(f"{round(100 * s)}" for s in SHARES)
        + f"), counted over {args['exact_window']} s after a warm-up of {args['exact_warmup']} s, one "
        "setup after the other. The static assignment gives each Envoy a native local_ratelimit of "
        f"the whole budget ({BUDGET_PER_MIN // 60} a second, 2 s of burst): what a static per-Envoy "
        "strategy such as jukie/rlqs's amounts to. Its overshoot is the sum over the Envoys of "
        "min(demand, budget): here 1.6×, up to 3× with three Envoys each asking the whole budget.",
        "",
        *table(["Setup", "limit in the window", "admitted", "admitted / limit", "per Envoy (70/20/10%)",
                "sent", "admitted in the warm-up", "service CPU s"], rows, "lrrrlrrr"),
    ]
