#!/usr/bin/env python3
"""`make soak`: does sluice hold its memory bound and its limits over time? Two parts, each
through a real Envoy with 2 workers; writes the "soak" sections of docs/reliability.md.

(a) Flood: wrk sends at least 1,000,000 requests, each with a new x-user-id, x-api-key and
    x-client-id, to three tables of max_keys 10,000 each (per-user: fast refill; per-api-key:
    slow refill, so its slots still owe when new keys take them; per-client: barely any refill).
    Meanwhile two legitimate clients, each on its own connection, send at a fixed rate: `steady`
    under its limits (every request should pass), `greedy` at twice per-user's rate (it should
    get exactly burst + rate x time); 20 newcomers, at points spread over the flood, each send
    per-client's burst + 3 requests (they should get exactly the burst); 5 x-client-ids drained
    before the flood ask again half-way and after it (they should stay drained). Envoy's RSS is
    sampled every second; the filter's counters tell evictions, what they forgave, and denials.
(b) Mixed: redis-server, sluice-service and Envoy with local and global policies (one of them
    failure_mode closed), wrk pacing requests over several keys (allowed and denied) for
    SOAK_MINUTES (default 10). RSS of Envoy, the service and Redis every 10 s; every 5xx counted.

  python3 bench/soak.py                       # both parts, 10 minutes of mixed traffic
  SOAK_MINUTES=2 python3 bench/soak.py        # a shorter mixed part
  python3 bench/soak.py --flood-keys 200000 --skip-mixed

Every loop is bounded; every child (Envoy, wrk, Redis, the service) is stopped by PID, whatever
happens; only 127.0.0.1 and free ports are used. The library is bench/sluice_bench/.
"""

import argparse
import os
from pathlib import Path

from sluice_bench.facts import command_line
from sluice_bench.processes import run_main
from sluice_bench.reliability_run import run_reliability
from sluice_bench.soak_flood import flood
from sluice_bench.soak_mixed import mixed
from sluice_bench.soak_report import report


def arguments():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flood-keys", type=int, default=1_000_000, help="distinct keys in the flood")
    parser.add_argument("--flood-max-seconds", type=int, default=600, help="bound on the flood's wrk run")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections of the flood")
    parser.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", "10")),
                        help="mixed traffic duration (default: $SOAK_MINUTES or 10)")
    parser.add_argument("--mixed-connections", type=int, default=8)
    parser.add_argument("--delay-ms", type=int, default=10, help="pause between a connection's requests")
    parser.add_argument("--warmup-seconds", type=int, default=60)
    parser.add_argument("--skip-flood", action="store_true")
    parser.add_argument("--skip-mixed", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    return parser.parse_args()


def main():
    args = arguments()
    command = command_line("soak.py")
    if "SOAK_MINUTES" in os.environ:
        command += f" (SOAK_MINUTES={os.environ['SOAK_MINUTES']})"
    # A bound on the whole run.
    bound_s = ((0 if args.skip_flood else args.flood_max_seconds + 180)
               + (0 if args.skip_mixed else args.minutes * 60 + 180))

    def measure(envoy_bin, workdir):
        return {"flood": None if args.skip_flood else flood(envoy_bin, workdir, args),
                "mixed": None if args.skip_mixed else mixed(envoy_bin, workdir, args)}

    run_reliability("soak", command, ("wrk", "redis-server"), bound_s, measure,
                    lambda info, results: report(info, args, results["flood"], results["mixed"]), args.json)


if __name__ == "__main__":
    run_main("soak", main)
