"""BENCHMARKS.md's section on instructions per request, rendered from bench/instructions.json,
with the CPU run's ratios beside the instruction ones when results.json has both setups."""

from .load import PATH
from .markdown import figure, table, times, verdict
from .setups import CALLOUT_BUDGET_US, RATIOS, STEPS, TARGETS, ratio, step

WHAT_IT_IS = (
    "**What it is, and is not.** The instructions Envoy's worker thread executes per request, "
    "counted by valgrind's callgrind: Envoy's own code and the filter's wasm as V8 compiled it. "
    "Unlike CPU time it does not move with other load on the machine: reruns of the same build "
    "count the same to within about 0.1% (the residue is work done per second rather than per "
    "request, such as sluice's counter flush, which weighs more at valgrind's pace), so a change "
    "of a percent shows at once. It is not time: every instruction weighs the same, so it does "
    "not see cache misses, mispredicted branches or what a syscall costs in the kernel (only the "
    "instructions leading to it), and it leaves out Envoy's other threads (their share is in "
    "*all threads*). Its ratios can therefore land on either side of the CPU ones, and the "
    "issue's targets were set on CPU time: the CPU figures above stay the primary ones; these "
    "tell whether a change altered the work per request, and by how much."
)


def instructions_section(saved, cpu_summary, reports):
    """The section, from a saved instructions.json (none without one); `cpu_summary`: results.json's."""
    if not saved:
        return []
    info, rows = saved["info"], saved["rows"]
    counts = {sid: {"ir": row["instructions_per_request"]} for sid, row in rows.items() if row["as_designed"]}
    return [
        "## Instructions per request (callgrind)",
        "",
        "Written by `make bench-instructions` (`bench/run.py --instructions`), separately from the "
        f"figures above; the raw counts are in [`bench/instructions.json`]({reports.link(reports.instructions_json)}).",
        "",
        f"- Date: {info['date']}; the run took {saved['elapsed_s'] / 60:.1f} minutes",
        f"- Commit: {info['commit']}; command: `{info['command']}`",
        f"- Envoy {info['envoy']}; {info['valgrind']}",
        "",
        WHAT_IT_IS,
        "",
        method(saved),
        "",
        *count_table(rows, saved["labels"]),
        "",
        *ratio_table(counts, cpu_summary or {}),
        "",
        *target_table(counts),
        "",
        "The target on strict global calls (8 − 1 ≤ "
        f"{CALLOUT_BUDGET_US:.0f} µs) is one of time: only the CPU run checks it. What each step "
        "adds, in instructions per request: "
        + ", ".join(f"{a}−{b} ({what}) {figure(step(counts, a, b, 'ir'), '+,.0f')}" for a, b, what in STEPS)
        + ".",
    ]


def method(saved):
    return (
        "**Method.** Each setup is its own Envoy (`--concurrency 1`, one at a time, not pinned) "
        f"under `{' '.join(saved['callgrind'])}` (start-up runs uninstrumented). Once Envoy is up: "
        f"instrumentation on (`callgrind_control --instr=on`), {saved['warmup']} warm-up requests, "
        f"counters zeroed, {saved['requests']:,} requests counted, a dump; all the same "
        f"`GET {PATH}` with the fixed `x-user-id` and `x-api-key`, one after another over one "
        "keep-alive connection (Python's `http.client`). The figure is the busiest thread's count "
        "(the worker's) over the counted requests. Under valgrind Envoy answers only a few hundred "
        "requests a second, so two kinds of setup differ from the CPU run: the denying setups 6 and 7 "
        "refill their 100 tokens per hour instead of per second (a refill per second would let a "
        "part of the counted requests through), and the global rows 8, 9 and 11 give "
        "sluice-service 5 s instead of 1 s to answer. Every counted request must get the setup's "
        "answer (200; 429 for 6 and 7) and on the global rows no call to the service may fail; a row "
        "that does not is shown but left out of the ratios."
    )


def count_table(rows, labels):
    return table(
        ["#", "Setup", "instructions/request", "all threads", "answers", "requests/s under valgrind"],
        [[sid, labels[sid], f"{row['instructions_per_request']:,.0f}", f"{row['all_threads_per_request']:,.0f}",
          answers(row), f"{row['requests_per_s']:,.0f}"] for sid, row in rows.items()],
        "llrrlr",
    )


def answers(row):
    """The statuses a setup got, its calls to the service, and whether that was as designed."""
    text = ", ".join(f"{n:,} × {code}" for code, n in sorted(row["statuses"].items()))
    if row["callouts"]:
        text += f"; {row['callouts']['callouts']:,} calls, {row['callouts']['callout_failures']} failed"
    if not row["as_designed"]:
        text += " (**not as designed**)"
    return text


def ratio_table(counts, cpu_summary):
    return table(
        ["Ratio", "Meaning", "instructions", "CPU/request (the CPU run's *Ratios* above)"],
        [[f"{a}/{b}", meaning, times(ratio(counts, a, b, "ir")), times(ratio(cpu_summary, a, b, "cpu_us_per_request"))]
         for a, b, meaning in RATIOS],
        "llrr",
    )


def target_table(counts):
    rows = []
    for a, b, limit, issue in TARGETS:
        value = ratio(counts, a, b, "ir")
        rows.append([issue, f"{a} ≤ {limit}× {b}", times(value), verdict(value, limit)])
    return table(["Issue", "Target", "instructions", "Result"], rows, "llrl")
