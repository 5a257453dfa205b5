#!/usr/bin/env python3
"""`make bench-rls`: sluice-service --rls side by side with Limitador, the Rate Limit Service
Kuadrant runs behind Envoy (issue 23). Both get the same limit on the same Redis (and each in
memory), the same load generator (service/examples/rls_load.rs, over gRPC) in four cases (1,000
keys and one hot key, each at 32 and at 128 calls in flight), and the same Envoy whose own
ratelimit filter asks them under wrk; interleaved rounds, medians, and sluice's figures as ratios
over Limitador's: calls/s, and CPU per call of the server, of Redis and of the load generator
(the figures that travel between machines; issue 37).
Rewrites the "rls" section of BENCHMARKS.md and bench/rls.json. Python 3 standard library only
(the library is bench/sluice_bench/).

Limitador is measured when the environment variable LIMITADOR names a limitador-server binary
(built by whoever runs this: the repository neither holds nor builds it); without it, only
sluice's rows are measured and the report says that Limitador's were left out.

  python3 bench/rls.py                                   # sluice alone
  LIMITADOR=/path/to/limitador-server python3 bench/rls.py --limitador-note "commit ..., ..."
  python3 bench/rls.py --quick                           # 1 round of 2 s: a smoke run
  python3 bench/rls.py --render-only                     # the section again, from bench/rls.json

Every step is bounded in time; every process started is stopped by PID; only 127.0.0.1 and free
ports are used.
"""

import argparse

from sluice_bench.markdown import write_section
from sluice_bench.paths import BENCH, ROOT, read_json, write_json
from sluice_bench.processes import log, run_main
from sluice_bench.rls_report import rls_section
from sluice_bench.rls_run import run_rls

RLS_JSON = BENCH / "rls.json"


def arguments():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=5, help="seconds measured per run")
    parser.add_argument("--warmup", type=int, default=1, help="seconds of load before each run")
    parser.add_argument("--connections", type=int, default=4,
                        help="HTTP/2 connections the load generator's calls share")
    parser.add_argument("--no-envoy", dest="envoy", action="store_false",
                        help="leave out the runs through Envoy's ratelimit filter")
    parser.add_argument("--limitador-note", default="",
                        help="what the report says of the Limitador measured (its commit, how it was built)")
    parser.add_argument("--quick", action="store_true", help="1 round of 2 s: a smoke run")
    parser.add_argument("--render-only", action="store_true", help="measure nothing: the section from rls.json")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.duration = 1, 2
    return args


def main():
    args = arguments()
    if not args.render_only:
        write_json(RLS_JSON, run_rls(args))
    lines = rls_section(read_json(RLS_JSON))
    write_section(ROOT / "BENCHMARKS.md", "rls", lines)
    print("\n".join(lines))
    log("wrote the rls section of BENCHMARKS.md and bench/rls.json")


if __name__ == "__main__":
    run_main("rls", main)
