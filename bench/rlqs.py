#!/usr/bin/env python3
"""`make bench-rlqs`: Envoy's `rate_limit_quota` filter with sluice-service --rlqs (issue 36),
side by side in one run with Envoy's ratelimit filter calling sluice-service --rls (a call per
request), Envoy's native local_ratelimit and no rate-limit filter, for the same traffic:

1. what a request costs (req/s, p50/p99, Envoy's, the service's and Redis's CPU per request),
   with the RLQS Envoy's CPU per request over local_ratelimit's against issue 36's ≤ 1.10×;
2. the service's CPU per second at two request rates (the RLQS's should stay flat, the RLS's grow);
3. three Envoys sharing one budget, offered twice it split 70/20/10: what the RLQS, the RLS and
   a static per-Envoy assignment admit over the limit.

Rewrites the "rlqs" section of BENCHMARKS.md and bench/rlqs.json. Python 3 standard library only
(the library is bench/sluice_bench/). About 16 minutes (plus the service's release build).

  python3 bench/rlqs.py                  # the real run
  python3 bench/rlqs.py --quick          # a smoke run: short windows (its figures mean little)
  python3 bench/rlqs.py --render-only    # the section again, from bench/rlqs.json

SLUICE_SERVICE=path uses that sluice-service instead of building it. Every step is bounded in
time; every process started is stopped by PID; only 127.0.0.1 and free ports are used.
"""

import argparse

from sluice_bench.markdown import write_section
from sluice_bench.paths import BENCH, ROOT, read_json, write_json
from sluice_bench.processes import log, run_main
from sluice_bench.rlqs_report import rlqs_section
from sluice_bench.rlqs_run import run_rlqs

RLQS_JSON = BENCH / "rlqs.json"


def arguments():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of part 1")
    parser.add_argument("--duration", type=int, default=10, help="seconds measured per run of part 1")
    parser.add_argument("--warmup", type=int, default=6, help="seconds of load before each run of part 1")
    parser.add_argument("--rate-rounds", type=int, default=2, help="rounds of part 2")
    parser.add_argument("--rate-duration", type=int, default=20, help="seconds measured per run of part 2")
    parser.add_argument("--rate-warmup", type=int, default=6, help="seconds of load before each run of part 2")
    parser.add_argument("--exact-window", type=int, default=60, help="seconds counted in part 3")
    parser.add_argument("--exact-warmup", type=int, default=15, help="seconds before part 3's window")
    parser.add_argument("--quick", action="store_true", help="a smoke run: short windows")
    parser.add_argument("--render-only", action="store_true", help="measure nothing: the section from rlqs.json")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.duration, args.warmup = 1, 2, 2
        args.rate_rounds, args.rate_duration, args.rate_warmup = 1, 5, 2
        args.exact_window, args.exact_warmup = 10, 5
    return args


def main():
    args = arguments()
    if not args.render_only:
        write_json(RLQS_JSON, run_rlqs(args))
    lines = rlqs_section(read_json(RLQS_JSON))
    write_section(ROOT / "BENCHMARKS.md", "rlqs", lines)
    print("\n".join(lines))
    log("wrote the rlqs section of BENCHMARKS.md and bench/rlqs.json")


if __name__ == "__main__":
    run_main("rlqs", main)
