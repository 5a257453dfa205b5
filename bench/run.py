#!/usr/bin/env python3
"""`make bench`: what sluice costs Envoy, against Envoy alone, Envoy's native local rate limit,
an empty proxy-wasm filter and the floor of sluice's design. Writes BENCHMARKS.md,
bench/results.svg and bench/results.json. Python 3 standard library only (the library is
bench/sluice_bench/).

Each setup is its own Envoy (one worker, pinned to core 0) answering from a direct_response
route, so no upstream cost hides the filter's; wrk (pinned to core 1) loads it over keep-alive
connections. The setups are measured interleaved, A B C ... A B C ..., for several rounds, and
the medians reported. Envoy's CPU time per request is utime+stime from /proc/<pid>/stat over
the wrk run, divided by the requests wrk completed.

Every step is bounded in time, and the script stops the Envoys it started (by PID), whatever
happens.

  python3 bench/run.py                 # the full run, about 5 minutes on 2 cores
  python3 bench/run.py --quick         # a 1-round smoke run, about a minute
  python3 bench/run.py --only 1,4,7    # some setups (the ratios need both sides)
  python3 bench/run.py --instructions  # instructions per request instead (below), about 4 minutes

--instructions (make bench-instructions) runs each setup's Envoy under valgrind's callgrind, one
at a time, and counts the instructions its worker thread executes per request: deterministic
where CPU time on a shared machine moves ±20% between runs, though blind to cache misses and to
what syscalls cost. It writes bench/instructions.json and its own section of BENCHMARKS.md; a CPU
run keeps that section (rendered from the JSON).
"""

import argparse
from pathlib import Path

from sluice_bench import processes
from sluice_bench.benchmarks_report import render
from sluice_bench.cpu_run import run_cpu
from sluice_bench.instruction_run import WARMUP, run_instructions
from sluice_bench.paths import Reports, read_json


def arguments():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=int, default=5, help="seconds of wrk per measurement")
    parser.add_argument("--warmup", type=int, default=1, help="seconds of wrk before each measurement")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--accuracy-seconds", type=int, default=10)
    parser.add_argument("--only", help="comma-separated setup ids")
    parser.add_argument("--nice", type=int, default=0,
                        help="run Envoy and wrk under nice -n NICE (negative: ahead of other work)")
    parser.add_argument("--no-micro", action="store_true", help="skip cargo bench")
    parser.add_argument("--quick", action="store_true", help="1 round of 3 s: a smoke run")
    parser.add_argument("--render-only", action="store_true",
                        help="measure nothing: rewrite BENCHMARKS.md and results.svg from results.json "
                        "(and instructions.json)")
    parser.add_argument("--instructions", action="store_true",
                        help="instead of CPU time, count the instructions Envoy's worker executes per "
                        "request under valgrind's callgrind; writes instructions.json and its section "
                        "of BENCHMARKS.md (make bench-instructions)")
    parser.add_argument("--requests", type=int, default=1000,
                        help=f"with --instructions: requests counted per setup (after {WARMUP} of warm-up)")
    parser.add_argument("--out", type=Path,
                        help="write BENCHMARKS.md, results.svg and results.json to this directory "
                        "instead of the committed ones")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.duration, args.accuracy_seconds = 1, 3, 5
    return args


def main():
    args = arguments()
    processes.set_nice(args.nice)
    reports = Reports.in_directory(args.out) if args.out else Reports.committed()
    if args.render_only:
        render(read_json(reports.results_json), reports)
    elif args.instructions:
        run_instructions(args, reports)
    else:
        run_cpu(args, reports)


if __name__ == "__main__":
    processes.run_main("bench", main)
