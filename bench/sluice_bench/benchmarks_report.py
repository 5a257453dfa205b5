"""BENCHMARKS.md and bench/results.svg, rendered from what a CPU run saved in results.json (with
bench/history.jsonl for run-to-run figures and bench/instructions.json for its own section), so
that `run.py --render-only` rewrites them without measuring. One function a section; the sections
other scripts write between markers (bench/tables.py, bench/rls.py) are kept."""

import statistics

from .chart import svg_chart
from .global_traffic import SETTLE_WAIT_S
from .history import RUN_TO_RUN, read_history
from .instructions_report import instructions_section
from .load import PATH
from .markdown import figure, marked_sections, table, times, verdict
from .paths import BENCH, read_json
from .processes import ENVOY_CORE, LOAD_CORE
from .setups import CALLOUT_BUDGET_US, DEFAULT_MAX_KEYS, RATIOS, STEPS, TARGETS, TRAFFIC_SETUP, ratio, step

CPU = "cpu_us_per_request"
# Issue 24: the usage scanner's native throughput, at least this.
SCANNER_GIB_PER_S = 1.0


def render(saved, reports):
    """BENCHMARKS.md and the chart, from a saved results.json."""
    info, labels = saved["info"], saved["labels"]
    title = f"sluice benchmark, {info['date']}, commit {info['commit'].split()[0]}, Envoy {info['envoy']}"
    reports.results_svg.write_text(svg_chart(list(labels), labels, saved["summary"], title))
    history = read_history(reports.history)
    sections = [
        header(saved, reports),
        method(saved["args"]),
        results(saved, reports),
        ratios(saved["summary"], saved["rounds"]),
        targets(saved["summary"], history),
        features(saved),
        run_to_run(history),
        instructions_section(read_json(reports.instructions_json), saved["summary"], reports),
        accuracy(saved["accuracy"]),
        micro_benchmarks(saved["micro"]),
        replay_section(),
        # What other scripts wrote into it (bench/tables.py, bench/rls.py, bench/rlqs.py), kept as it is.
        *marked_sections(reports.benchmarks_md),
    ]
    reports.benchmarks_md.write_text("\n\n".join("\n".join(lines) for lines in sections if lines) + "\n")


def header(saved, reports):
    info = saved["info"]
    return [
        "# Benchmarks",
        "",
        "Written by `make bench` (`bench/run.py`); rerun it to refresh this file, "
        f"[`bench/results.svg`]({reports.link(reports.results_svg)}) and the raw samples in "
        f"[`bench/results.json`]({reports.link(reports.results_json)}). Not part of `make test`. "
        "Its later sections are written by their own commands and kept as they are: "
        "`make bench-instructions`, `python3 bench/tables.py`, `make bench-rls` and `make bench-rlqs`.",
        "",
        f"- Date: {info['date']}; the run took {saved['elapsed_s'] / 60:.1f} minutes",
        f"- Machine: {info['cpu']}, {info['cores']} cores, Linux {info['kernel']}; "
        f"load average at the start {' '.join(info['loadavg'])}",
        f"- Commit: {info['commit']}; command: `{info.get('command', 'python3 bench/run.py')}`",
        f"- Envoy {info['envoy']} (`{info['envoy_full']}`); {info['wrk']}",
    ]


def method(args):
    connections = args["connections"]
    return [
        "## Method",
        "",
        f"Each setup is its own Envoy (`--concurrency 1`, pinned to core {ENVOY_CORE} with `taskset`) "
        "whose only route is a `direct_response`, so no upstream cost hides the filter's (\"ok\\n\"; "
        "setups 12 to 13T an LLM's response, below). "
        f"wrk, pinned to core {LOAD_CORE}, sends `GET {PATH}` with a fixed `x-user-id` and `x-api-key` "
        f"over {connections} keep-alive connections (`wrk -t1 -c{connections} -d{args['duration']}s "
        f"--latency`, after {args['warmup']}s of warm-up). The setups run interleaved, A B C ... A B C ..., "
        f"for {args['rounds']} rounds; every figure is the median over the rounds. "
        "**CPU/request** is Envoy's utime+stime (`/proc/<pid>/stat`, all threads) over the wrk run, "
        "divided by the requests wrk completed; RSS is `VmRSS` after the run. "
        + (f"Envoy and wrk ran under `nice -n {args['nice']}`. " if args["nice"] else "")
        + "The accuracy Envoy is separate (below). "
        "sluice sends its default `legacy` rate-limit headers on every response, and the native "
        "filter its `x-ratelimit-*` headers (`enable_x_ratelimit_headers`); the native filter has one "
        "bucket for all requests (no key), sluice one per `x-user-id`. Each sluice policy keeps the "
        "default `max_keys` (10,000 shared-data slots per key layout, created at start).",
    ]


def results(saved, reports):
    summary, labels, rounds = saved["summary"], saved["labels"], saved["rounds"]
    rows = [
        [sid, labels[sid], f"{s['rps']:,.0f}", f"{s['p50_ms']:.3f}", f"{s['p99_ms']:.3f}", f"{s[CPU]:.1f}",
         f"{s['rss_mib']:.1f}", f"{100 * s['non2xx_share']:.1f}%"]
        for sid, s in ((sid, summary[sid]) for sid in labels)
    ]
    per_round = "; ".join(f"{sid}: " + " / ".join(f"{r[CPU]:.1f}" for r in rounds[sid]) for sid in labels)
    return [
        "## Results",
        "",
        *table(["#", "Setup", "req/s", "p50 ms", "p99 ms", "CPU µs/request", "RSS MiB", "non-2xx"], rows,
               "llrrrrrr"),
        "",
        f"![requests/s, p99 latency and CPU per request, per setup]({reports.link(reports.results_svg)})",
        "",
        *shared_data_estimate(summary),
        "Envoy's CPU share over the runs (the load must saturate the Envoy core for "
        "requests/s to mean anything): "
        + ", ".join(f"{sid}: {100 * summary[sid]['envoy_cpu_share']:.0f}%" for sid in labels)
        + ".",
        *others_line(summary, labels),
        "",
        f"Per round, CPU µs/request (the spread behind the medians): {per_round}.",
    ]


def others_line(summary, labels):
    """What the rest of the machine took during each setup's runs (median), when measured."""
    if not all("others_share" in summary[sid] for sid in labels):
        return []
    return [
        "",
        "The rest of the machine meanwhile, in cores (`/proc/stat` less Envoy and wrk; on 8 and 9 "
        "sluice-service and Redis are part of it): "
        + ", ".join(f"{sid}: {summary[sid]['others_share']:.2f}" for sid in labels)
        + ". Other work on a shared machine shows here; the rounds it crowded are the ones to distrust.",
    ]


def shared_data_estimate(summary):
    """Envoy's memory per shared-data entry, from setups 4 and 5b: the same filter with 1 and with
    5 tables of the default max_keys slots each."""
    if "4" not in summary or "5b" not in summary:
        return []
    from_4_to_5b = (summary["5b"]["rss_mib"] - summary["4"]["rss_mib"]) * 2**20
    slots = 4 * DEFAULT_MAX_KEYS
    return [
        f"RSS per shared-data slot, estimated from 5b − 4 ({slots:,} more slots): "
        f"{from_4_to_5b / slots:.0f} bytes.",
        "",
    ]


def ratios(summary, rounds):
    rows = [
        [f"{a}/{b}", meaning, f"{figure(ratio(summary, a, b, CPU), '.3f')}×", per_round_spread(rounds, a, b),
         f"{figure(ratio(summary, a, b, 'rps'), '.3f')}×"]
        for a, b, meaning in RATIOS
    ]
    return [
        "## Ratios",
        "",
        "Ratios of the medians. *Per round*: the same ratio taken within each round (where both "
        "setups ran seconds apart), its median and range: how far other load on the machine moved it.",
        "",
        *table(["Ratio", "Meaning", "CPU/request", "per round", "requests/s"], rows, "llrrr"),
        "",
        "What each step adds, in CPU µs per request: "
        + ", ".join(f"{a}−{b} ({what}) {figure(step(summary, a, b, CPU), '+.1f')}" for a, b, what in STEPS)
        + ".",
    ]


def per_round_spread(rounds, a, b):
    """The ratio a/b of CPU per request taken within each round: its median (range)."""
    paired = sorted(x[CPU] / y[CPU] for x, y in zip(rounds.get(a, []), rounds.get(b, [])) if y[CPU])
    return f"{statistics.median(paired):.2f} ({paired[0]:.2f}–{paired[-1]:.2f})" if paired else "n/a"


def targets(summary, history):
    """The issues' targets on this run, and on the median of the latest full runs."""
    recent = history[-RUN_TO_RUN:]
    rows = []
    for a, b, limit, issue in TARGETS:
        value = ratio(summary, a, b, CPU)
        past = sorted(r["ratios"][f"{a}/{b}"] for r in recent if f"{a}/{b}" in r.get("ratios", {}))
        typical = statistics.median(past) if past else None
        spread = f"{times(typical)} ({past[0]:.2f}–{past[-1]:.2f})" if past else "n/a"
        rows.append([issue, f"{a} ≤ {limit}× {b}", f"{figure(value, '.3f')}×", verdict(value, limit), spread,
                     verdict(typical, limit)])
    callout = step(summary, "8", "1", CPU)
    return [
        "## Targets (on CPU per request)",
        "",
        f"This run, and the median of the last {len(recent)} full runs "
        "(`bench/history.jsonl`, see *Run to run*): one run on a busy or virtual machine can land "
        "either side of a 15% margin."
        if history
        else "This run.",
        "",
        *table(["Issue", "Target", "This run", "Result", "Runs: median (range)", "Result"], rows, "llrlrl"),
        f"| 5 | 8 − 1 ≤ {CALLOUT_BUDGET_US:.0f} µs (half a gRPC callout per request) | {figure(callout, '.1f')} µs | "
        f"{'n/a' if callout is None else verdict(callout / CALLOUT_BUDGET_US, 1.0)} | | |",
    ]


def features(saved):
    """Issues 24 and 25: what a token budget and a concurrency slot cost per request, against the
    policies they stand beside, and what a global concurrency policy sends the service."""
    summary, micro = saved["summary"], saved.get("micro") or {}
    pairs = [("12T", "12", "4 KiB OpenAI JSON response", 1.2), ("13T", "13", "200-event OpenAI SSE stream", 1.5),
             ("12P", "12", "OpenAI's own rate-limit headers too, 4 KiB JSON", 1.03),
             ("10", "4", "concurrency slot (local) over a token bucket", 1.15),
             ("11", "8", "global concurrency over a strict global token bucket", None)]
    rows = []
    for a, b, what, limit in pairs:
        if a not in summary or b not in summary:
            continue
        value = ratio(summary, a, b, CPU)
        rows.append([f"{a}/{b}", what, f"{summary[b][CPU]:.1f}", f"{summary[a][CPU]:.1f}",
                     f"{figure(step(summary, a, b, CPU), '+.1f')}", times(value),
                     f"≤ {limit}×: {verdict(value, limit)}" if limit else ""])
    if not rows and not saved.get("global_traffic"):
        return []
    scans = [c for c in micro.get("cases", []) if c["name"].startswith("usage::Scanner") and "gib_per_s" in c]
    lines = [
        "## Token budgets, provider headers and concurrency limits (issues 24, 25 and 33)",
        "",
        "Setups 12 to 13T answer an LLM's response from the route (`direct_response` with its "
        "`content-type`, no upstream): 12 and 12T a 4 KiB OpenAI Chat Completions JSON with its `usage`, "
        "13 and 13T an OpenAI chat stream of 200 events (`text/event-stream`, 61,584 bytes) whose last "
        "chunk before `[DONE]` has the usage: the bodies of `bench/micro.rs`'s scanner cases. 12 and 13 "
        "count requests (setup 4's token bucket per `x-user-id`); 12T and 13T charge each response its "
        "`total_tokens` (`\"cost\": {\"from_response\": {\"usage\": \"total_tokens\"}}`, reserving "
        "nothing, a billion tokens a second: never refusing): the scanner reads every body chunk (of a "
        "stream, only the events that hold a usage other than `\"usage\":null`: the others are passed "
        "over in one search, 16 bytes at a time with wasm's SIMD128), and the usage is settled in shared "
        "data when the response ends. 12P is 12 with `\"api\": \"openai\"`: OpenAI's own "
        "`x-ratelimit-*-requests` headers on every response, in place of the default legacy ones. Envoy hands a `direct_response` body "
        "to the filter whole, so the stream reaches the scanner in one piece (an upstream that streams "
        "hands it over event by event, as the micro-benchmark feeds it). Setup 10 holds a slot per "
        "request (`\"algorithm\": \"concurrency\"`), taken at admission and given back when the "
        "response ends, both in shared data; 11 the same policy global: a check per request to "
        "sluice-service carrying the slot, the releases sent in batches (`POST /v1/settle`).",
        "",
        *(table(["Ratio", "What", "CPU µs/request (anchor)", "CPU µs/request", "difference", "ratio", "target"],
                rows, "llrrrrl") if rows else []),
    ]
    if scans:
        lines += ["", "The usage scanner alone, natively (`cargo bench --bench micro`, *Micro-benchmarks* below): "
                  + "; ".join(f"{c['name'].removeprefix('usage::Scanner on ')} {c['gib_per_s']:.2f} GiB/s"
                              for c in scans)
                  + f" (target: ≥ {SCANNER_GIB_PER_S:.0f} GiB/s)."]
    lines += traffic_lines(saved.get("global_traffic"))
    return lines


def traffic_lines(traffic):
    """Setup 11's calls to the service per 1,000 requests, paced and saturated."""
    if not traffic:
        return []
    rows = []
    for name, t in traffic.items():
        per = t["per_1000"]
        settled = ", ".join(f"{op} {n:,}" for op, n in sorted(t["settlements"].items())) or "none"
        rows.append([name, t["load"], f"{t['requests']:,}", f"{100 * t['refused'] / max(t['requests'], 1):.1f}%",
                     f"{t['checks']:,}", f"{t['settles']:,}", settled, f"{t['failed_calls']:,}",
                     f"{per['checks']:,.0f} / {per['settles']:,.1f} / {per['settlements']:,.0f}"])
    return [
        "",
        f"Setup {TRAFFIC_SETUP}'s traffic to sluice-service, from its `/metrics` around each load and "
        f"{SETTLE_WAIT_S} s after it (for the last batches). Each worker's outbox sends its releases "
        "every 20 ms, and at once behind a batch delivered while a full batch (256) waits: a slot is free again a "
        "moment after its request ends, whatever the rate. *Paced*: a steady rate from keep-alive "
        "clients; *saturated*: wrk as in the rounds, run after them.",
        "",
        *table(["Load", "How", "requests", "refused", "`/v1/check`", "`/v1/settle`", "settlements",
                "failed calls", "per 1,000 requests: checks / settle calls / settlements"], rows, "llrrrrlrr"),
    ]


def run_to_run(history):
    """The key figures of the latest full runs, when there are two or more."""
    if len(history) <= 1:
        return []
    rows = [
        [run["date"], run["commit"], *(figure(run.get("cpu_us", {}).get(sid), ".1f") for sid in ("1", "3b", "4")),
         *(figure(run.get("ratios", {}).get(f"{a}/{b}"), ".3f") for a, b, _, _ in TARGETS),
         figure(run.get("accuracy_error"), "+.1f")]
        for run in history[-RUN_TO_RUN:]
    ]
    header = ["Date", "Commit", "1 µs", "3b µs", "4 µs", *(f"{a}/{b}" for a, b, _, _ in TARGETS), "Accuracy"]
    return [
        "## Run to run",
        "",
        "The same figures from the latest full runs (`bench/history.jsonl`): on a shared or "
        "virtual machine, how far a figure moves between runs of the same code says how small a "
        "change can be told from noise.",
        "",
        *table(header, rows, "ll" + "r" * (len(header) - 2)),
    ]


def accuracy(acc):
    if not acc:
        return []
    row = [f"{acc['requests']:,}", f"{acc['span_s']:.3f}", f"{acc['admitted']:,}", f"{acc['ideal']:.1f}",
           f"{acc['error']:+.1f} ({100 * acc['error'] / acc['ideal']:+.2f}%)", f"{acc['cas_retries']:,}",
           f"{acc['cas_exhausted']:,}"]
    return [
        "## Accuracy",
        "",
        f"**Local.** A separate Envoy with 2 workers (not pinned) and one policy of "
        f"{acc['rate']} requests/s, burst {acc['burst']}, on one key; wrk `-t2 -c32` saturated it for "
        f"{acc['wrk_seconds']:.2f} s ({acc['rps']:,.0f} requests/s). The ideal is b + r·t, with t from the "
        "first to the last request (Envoy's access log).",
        "",
        *table(["Requests", "t (s)", "Admitted", "Ideal b + r·t", "Admitted − ideal", "cas_retries",
                "cas_exhausted"], [row], "rrrrrrr"),
        "",
        "**Global.** Measured by `tests/envoy_global.rs` (part of `make test`), not here: three "
        "Envoys sharing one strict policy admit exactly its limit (10 of 45 requests); with leases "
        "of 4 the total stays within the limit. Calls to the service per 1,000 requests of one hot "
        "key: 1,000 strict, 11 with the over-limit cache once the key is over its limit, 50 with "
        "leases of 20.",
    ]


def micro_benchmarks(micro):
    if not micro:
        return []
    in_wasm = {c["name"]: c for c in micro.get("wasm", [])}
    rows = [
        [c["name"].replace("|", "\\|"), per_operation(c), f"{c['min_ns']:.1f} – {c['max_ns']:.1f}",
         per_operation(in_wasm.get(c["name"]))]
        for c in micro["cases"]
    ]
    return [
        "## Micro-benchmarks",
        "",
        "`cargo bench --bench micro`: the pure core compiled natively and, the same code, compiled "
        "to wasm32-wasip1 and run under Node's V8 (as the filter runs under Envoy's; needs "
        "`node`). Median of 31 batches of about 10 ms, with the range of the batches. Evaluate "
        "uses an in-memory store (a `HashMap`) where the filter has Envoy's shared data.",
        "",
        *table(["Case", "native ns", "batch range", "wasm (V8) ns"], rows),
        *decision_target(micro["cases"]),
        *scanner_target(micro["cases"]),
        "",
        "Shared data per key (its record in a page; a page holds several keys under one name, "
        "and Envoy adds its own per-page overhead):",
        "",
        *(f"- {size['label']}: a {size['record_bytes']} B record; a {size['name_bytes']} B name "
          f"per page of {size['page_keys']} keys" for size in micro["shared_data"]),
    ]


def per_operation(case):
    """A case's median in ns, with its throughput when it reads bytes; "n/a" when missing."""
    if case is None:
        return figure(None, ".1f")
    median = f"{case['median_ns']:.1f}"
    return f"{median} ({case['gib_per_s']:.2f} GiB/s)" if "gib_per_s" in case else median


def decision_target(cases):
    """The issue's target on one token-bucket decision, natively."""
    decision = next((c for c in cases if "one token-bucket decision" in c["name"]), None)
    if not decision:
        return []
    return [
        "",
        f"Target: a token-bucket decision ≤ 100 ns natively: {decision['median_ns']:.1f} ns, "
        f"{'pass' if decision['median_ns'] <= 100 else '**fail**'}.",
    ]


def scanner_target(cases):
    """Issue 24's target on the usage scanner: at least 1 GiB/s natively, on each body."""
    scans = [c for c in cases if c["name"].startswith("usage::Scanner") and "gib_per_s" in c]
    if not scans:
        return []
    slowest = min(c["gib_per_s"] for c in scans)
    each = "; ".join(f"{c['name'].removeprefix('usage::Scanner on ')} {c['gib_per_s']:.2f} GiB/s" for c in scans)
    return [
        "",
        f"Target (issue 24): the usage scanner reads ≥ {SCANNER_GIB_PER_S:.0f} GiB/s natively: {each}; "
        f"{'pass' if slowest >= SCANNER_GIB_PER_S else '**fail**'}.",
    ]


def replay_section():
    """sluice-replay's speed and memory: measured by hand (its own example, not make bench) and
    kept in bench/replay.md, which this carries over as it is."""
    path = BENCH / "replay.md"
    return path.read_text().rstrip("\n").split("\n") if path.exists() else []
