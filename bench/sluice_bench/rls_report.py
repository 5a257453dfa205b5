"""BENCHMARKS.md's section on the RLS against Limitador (issue 23), rendered from bench/rls.json:
the figures of each server, then sluice's as ratios over Limitador's (the anchor), directly over
gRPC and through Envoy's own ratelimit filter, with the issue's claims beside this run's."""

import statistics

from .markdown import figure, table
from .processes import LOAD_CORE
from .rls_run import (BACKENDS, CASES, DESCRIPTOR_KEY, DOMAIN, ENVOY_CONNECTIONS, ENVOY_KEYS, LIMIT, SERVER_CORE,
                      SERVERS)

# The figures (issue 23): sluice over Limitador, as the lead to keep.
CLAIMS = {
    ("redis", "keys", "calls_per_s"): "2.46× (18,075 vs 7,361)",
    ("redis", "hot", "calls_per_s"): "3.08× (20,672 vs 6,706)",
    ("redis", "keys", "p50_ms"): "0.4×",
    ("redis", "hot", "p50_ms"): "0.4×",
    ("redis", "keys", "server_cpu_us_per_call"): "0.25–0.37×",
    ("redis", "hot", "server_cpu_us_per_call"): "0.25–0.37×",
    ("redis", "envoy", "rps"): "1.73×",
    ("memory", "keys", "calls_per_s"): "1.2×",
    ("memory", "hot", "calls_per_s"): "1.2×",
}
# Whether a higher ratio is sluice's lead (calls/s) or a lower one (latency, CPU).
HIGHER_IS_BETTER = {"calls_per_s": True, "rps": True, "p50_ms": False, "p99_ms": False,
                    "server_cpu_us_per_call": False, "server_cpu_us_per_request": False}


def rls_section(saved):
    """The section's lines."""
    info, args, summary = saved["info"], saved["args"], saved["summary"]
    with_limitador = "limitador" in saved["servers"]
    lines = [
        "## The RLS against Limitador (issue 23)",
        "",
        "Written by `make bench-rls` (`bench/rls.py`), separately from the figures above; the raw "
        "samples are in [`bench/rls.json`](bench/rls.json).",
        "",
        f"- Date: {info['date']}; the run took {saved['elapsed_s'] / 60:.1f} minutes",
        f"- Machine: {info['cpu']}, {info['cores']} cores, Linux {info['kernel']}; load average at the "
        f"start {' '.join(info['loadavg'])}, at the end {' '.join(info.get('loadavg_end', ['n/a']))}",
        f"- Commit: {info['commit']}; command: `{info['command']}`",
        f"- {info['redis'].split(' sha=')[0]}"
        + (f"; Envoy {info['envoy']}; {info['wrk']}" if "envoy" in info else ""),
        "- " + (f"Limitador: `{info['limitador']}`" + (f"; {args['limitador_note']}" if args.get("limitador_note")
                                                          else "")
                if with_limitador else
                "Limitador: not measured (`LIMITADOR` was not set): its rows and the ratios are left out"),
        "",
        method(args),
        "",
        *direct_table(summary, saved["servers"]),
    ]
    if with_limitador:
        lines += ["", *direct_ratios(summary, saved["rows"])]
    if any("/envoy/" in key for key in summary):
        lines += ["", *envoy_table(summary, saved["servers"])]
    if with_limitador:
        lines += ["", *claims(summary), "", *targets(summary, saved["rows"])]
    return lines


def method(args):
    cases = "; ".join(f"{c.label} (`--keys {c.keys} --concurrency {c.concurrency}`)" for c in CASES)
    return (
        "**Method.** Two implementations of Envoy's Rate Limit Service, each given the same limit "
        f"(domain `{DOMAIN}`, a fixed window of {LIMIT:,} calls a minute per value of the descriptor "
        f"`{DESCRIPTOR_KEY}`: never refusing; `bench/rls.json` has both files), one on the same "
        "`redis-server` as the other, and in memory (`sluice-service --memory`; Limitador's `memory` "
        "storage). sluice-service is the release build `make bench` measures; Limitador counts "
        "in Redis without its cache (its `redis` storage, a Redis call per call as sluice makes: its "
        "`redis_cached` storage would batch). Each server runs pinned to core "
        f"{SERVER_CORE} (`taskset`); the load and Redis run on core {LOAD_CORE}. **Direct**: the same "
        "tonic load generator (`service/examples/rls_load.rs`: `ShouldRateLimit` with one "
        f"descriptor `({DESCRIPTOR_KEY}=user-<n>)`, a value at random among the keys, over "
        f"{args.get('connections', 4)} HTTP/2 connections) in {len(CASES)} cases: {cases}; "
        f"{args['duration']} s measured after {args['warmup']} s of warm-up. **Through Envoy**: wrk "
        f"(`-t1 -c{ENVOY_CONNECTIONS}`, an `x-user-id` at random among {ENVOY_KEYS:,}) through an Envoy "
        "(one worker) whose own ratelimit filter (`envoy.filters.http.ratelimit`, as `envoy/rls.yaml` "
        "sets it up) asks the server, its route leading to a second listener of the same Envoy that "
        f"answers; Envoy shares core {SERVER_CORE} with the server, so that the requests/s answer for "
        "what both spend. The measurements run interleaved (in each round every case, sluice then "
        f"Limitador) for {args['rounds']} rounds; every figure is the median over the rounds. "
        "**CPU per call** is the process's utime+stime (`/proc/<pid>/stat`, all threads) over the "
        "run, divided by the calls answered; *core* is that CPU time over the run's seconds (near "
        "100%: the server was the bottleneck; well below, the calls waited on something else: the "
        "load generator and Redis sharing a core, the round trips, or other work). *Redis CPU per call* is the "
        "same of the `redis-server` process (each server has it to itself while it is measured). The *load "
        "generator*'s CPU is its utime+stime as a child waited for (`RUSAGE_CHILDREN`): it shares core "
        f"{LOAD_CORE} with Redis, so where it takes most of that core, calls/s measure the core and not the server, and CPU per call is the figure to read. *Others* is the CPU "
        "the rest of the machine took meanwhile (`/proc/stat` less our processes), in cores: on a "
        "machine shared with other work, the rounds where it is high are the ones to distrust, and "
        "CPU per call moves less with it than calls/s do."
    )


def row_label(backend, case_id):
    return BACKENDS[backend], next(c.label for c in CASES if c.id == case_id)


def direct_table(summary, servers):
    rows = []
    for backend in BACKENDS:
        for case in CASES:
            for server in servers:
                s = summary.get(f"{backend}/{case.id}/{server}")
                if not s:
                    continue
                not_ok = (s["errors"] or 0) + (s["other_code"] or 0) + (s["over_limit"] or 0)
                rows.append([BACKENDS[backend], case.label, SERVERS[server], f"{s['calls_per_s']:,.0f}",
                             f"{s['p50_ms']:.3f}", f"{s['p99_ms']:.3f}", f"{s['server_cpu_us_per_call']:.1f}",
                             f"{100 * s['server_cpu_share']:.0f}%", figure(s["redis_cpu_us_per_call"], ".1f"),
                             share(s.get("redis_cpu_share")), figure(s.get("load_cpu_us_per_call"), ".1f"),
                             share(s.get("load_cpu_share")), figure(s.get("others_share"), ".2f"), f"{not_ok:,.0f}"])
    return [
        "### Direct gRPC calls",
        "",
        *table(["Storage", "Case", "Server", "calls/s", "p50 ms", "p99 ms", "server CPU µs/call", "core",
                "Redis CPU µs/call", "Redis core", "load gen. CPU µs/call", "load gen. core", "others (cores)",
                "not OK"], rows, "lllrrrrrrrrrrr"),
    ]


def share(value):
    """A share of a core as a percentage, or n/a."""
    return "n/a" if value is None else f"{100 * value:.0f}%"


def ratio_of(summary, backend, case_id, name):
    """sluice's figure over Limitador's, or None."""
    ours, theirs = (summary.get(f"{backend}/{case_id}/{s}") for s in ("sluice", "limitador"))
    if not ours or not theirs or ours.get(name) is None or not theirs.get(name):
        return None
    return ours[name] / theirs[name]


def per_round(rows, backend, case_id, name):
    """The ratio taken within each round: median (range)."""
    paired = sorted(a[name] / b[name] for a, b in zip(rows.get(f"{backend}/{case_id}/sluice", []),
                                                       rows.get(f"{backend}/{case_id}/limitador", [])) if b[name])
    return f"{statistics.median(paired):.2f} ({paired[0]:.2f}–{paired[-1]:.2f})" if paired else "n/a"


def direct_ratios(summary, rows):
    names = ["calls_per_s", "p50_ms", "p99_ms", "server_cpu_us_per_call", "redis_cpu_us_per_call"]
    table_rows = []
    for backend in BACKENDS:
        for case in CASES:
            values = [ratio_of(summary, backend, case.id, n) for n in names]
            table_rows.append([*row_label(backend, case.id),
                               *(f"{figure(v, '.2f')}×" if v is not None else "n/a" for v in values),
                               per_round(rows, backend, case.id, "calls_per_s"),
                               lead(values[0], True) + ", " + lead(values[3], False)])
    return [
        "sluice over Limitador (Limitador's figure = 1; *per round*: the calls/s ratio within each round, "
        "its median and range):",
        "",
        *table(["Storage", "Case", "calls/s", "p50 latency", "p99 latency", "server CPU/call", "Redis CPU/call",
                "calls/s per round", "lead (calls/s, CPU)"], table_rows, "llrrrrrrl"),
    ]


def lead(value, higher_is_better):
    """Whether sluice's ratio over Limitador is in sluice's favour ("even" within half a percent)."""
    if value is None:
        return "n/a"
    if abs(value - 1) < 0.005:
        return "even"
    return "kept" if (value > 1) == higher_is_better else "**lost**"


def envoy_table(summary, servers):
    rows = []
    for backend in BACKENDS:
        for server in servers:
            s = summary.get(f"{backend}/envoy/{server}")
            if not s:
                continue
            rows.append([BACKENDS[backend], SERVERS[server], f"{s['rps']:,.0f}", f"{s['p50_ms']:.3f}",
                         f"{s['p99_ms']:.3f}", f"{s['envoy_cpu_us_per_request']:.1f}",
                         f"{s['server_cpu_us_per_request']:.1f}", figure(s["redis_cpu_us_per_request"], ".1f"),
                         f"{100 * s['core_share']:.0f}%", figure(s.get("others_share"), ".2f"), f"{s['rls_errors']:,}"])
    ratios = []
    for backend in BACKENDS:
        rps = ratio_of(summary, backend, "envoy", "rps")
        cpu = ratio_of(summary, backend, "envoy", "server_cpu_us_per_request")
        if rps is not None:
            ratios.append(f"{BACKENDS[backend]}: {rps:.2f}× the requests/s, {figure(cpu, '.2f')}× the RLS's CPU "
                          "per request")
    return [
        "### Through Envoy's native ratelimit filter",
        "",
        *table(["Storage", "RLS", "req/s", "p50 ms", "p99 ms", "Envoy CPU µs/req", "RLS CPU µs/req",
                "Redis CPU µs/req", f"core {SERVER_CORE}", "others (cores)", "RLS errors"], rows, "llrrrrrrrrr"),
        *(["", "sluice over Limitador: " + "; ".join(ratios) + "."] if ratios else []),
    ]


def claims(summary):
    """The issue's figures, and this run's."""
    rows = []
    meaning = {"calls_per_s": "calls/s", "p50_ms": "p50 latency", "server_cpu_us_per_call": "server CPU per call",
               "rps": "requests/s through Envoy"}
    for (backend, case_id, name), claim in CLAIMS.items():
        value = ratio_of(summary, backend, case_id, name)
        where = BACKENDS[backend] + ("" if case_id == "envoy" else ", " + row_label(backend, case_id)[1])
        ours, theirs = (summary.get(f"{backend}/{case_id}/{s}", {}).get(name) for s in ("sluice", "limitador"))
        measured = f"{figure(value, '.2f')}×"
        if name in ("calls_per_s", "rps") and ours and theirs:
            measured += f" ({ours:,.0f} vs {theirs:,.0f})"
        rows.append([f"{meaning[name]}: {where}", claim, measured, lead(value, HIGHER_IS_BETTER[name])])
    return [
        "The issue's figures (sluice over Limitador, measured there) beside this run's:",
        "",
        *table(["Figure", "Issue 23", "This run", "Lead"], rows, "lrrl"),
    ]


# Issue 37's targets: sluice's figure over Limitador's, at most this.
TARGETS = [
    *((("redis", case.id, "redis_cpu_us_per_call"), 1.0) for case in CASES),
    *((("redis", case.id, "server_cpu_us_per_call"), 0.5) for case in CASES),
    *((("memory", case.id, "server_cpu_us_per_call"), 0.9) for case in CASES),
]


def targets(summary, rows):
    """Issue 37's targets (CPU per call, the figures that travel between machines), and this run's."""
    meaning = {"redis_cpu_us_per_call": "Redis CPU per call", "server_cpu_us_per_call": "server CPU per call"}
    table_rows = []
    for (backend, case_id, name), bound in TARGETS:
        value = ratio_of(summary, backend, case_id, name)
        where = ", ".join(row_label(backend, case_id))
        met = "n/a" if value is None else ("met" if value <= bound else "**missed**")
        table_rows.append([f"{meaning[name]}: {where}", f"≤ {bound:.1f}×", f"{figure(value, '.2f')}×",
                           per_round(rows, backend, case_id, name), met])
    return [
        "Issue 37's targets (sluice over Limitador; *per round*: the ratio within each round, its median and "
        "range):",
        "",
        *table(["Figure", "Target", "This run", "per round", ""], table_rows, "lrrrl"),
    ]
