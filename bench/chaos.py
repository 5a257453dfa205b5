#!/usr/bin/env python3
"""`make chaos`: global mode under faults. redis-server, sluice-service and two Envoys
(2 workers each) sharing a global policy; a paced load through both Envoys while, in turn,
Redis is killed (then restarted, empty), Redis is paused (SIGSTOP, then SIGCONT), and the
service is killed (then restarted on the same port). Writes the "chaos" section of
docs/reliability.md.

Policies (callout timeout 50 ms, the default):
- `shared-open` on /api/open, per `x-user-id`: global, 200/s burst 200 across both Envoys,
  failure_mode open with an emergency budget of 10/s burst 10 per Envoy. The load sends one
  user at 60/s per Envoy: healthy, the global bucket never runs low (every request passes with
  over 100 tokens left); degraded, each Envoy admits at most its emergency budget.
- `tenant-closed` on /api/closed, per `x-tenant`: global, 1000/s (never denies when healthy),
  failure_mode closed: a 503 while the service cannot answer.

Every response says who decided it: an emergency decision leaves fewer than 10 tokens
(`x-ratelimit-remaining`) or denies, a global one leaves over 100; a 503 names its policy.
(`x-ratelimit-limit` says it too since bee485b; before, emergency decisions reported the global
burst.) For each phase the table gives requests,
answers, unexpected outcomes (a connection error, a status other than 200/429, a 503 not from
the closed policy), the worst latency (bound: the callout timeout plus a margin), whether each
Envoy's emergency admissions stayed within 10 + 10/s x the time it spent degraded, and the time
from lifting the fault until every decision was global again. Exits 1 when a phase fails one of
those.

  python3 bench/chaos.py                  # about 2 minutes
  python3 bench/chaos.py --fault-seconds 5

Every loop is bounded; every child is stopped by PID, whatever happens; only 127.0.0.1. The
library is bench/sluice_bench/.
"""

import argparse
import sys
from pathlib import Path

from sluice_bench.chaos_faults import bound_s, failed_phases, run_chaos
from sluice_bench.chaos_report import report
from sluice_bench.facts import command_line
from sluice_bench.processes import log, run_main
from sluice_bench.reliability_run import run_reliability


def arguments():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fault-seconds", type=float, default=8.0, help="how long each fault lasts")
    parser.add_argument("--quiet-seconds", type=float, default=3.0,
                        help="clean global decisions that count as recovered")
    parser.add_argument("--recover-timeout", type=float, default=60.0)
    parser.add_argument("--baseline-seconds", type=float, default=8.0)
    parser.add_argument("--margin-ms", type=float, default=50.0, help="latency allowed over the callout timeout")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    return parser.parse_args()


def main():
    args = arguments()
    results = run_reliability(
        "chaos", command_line("chaos.py"), ("redis-server",), bound_s(args),
        lambda envoy_bin, workdir: run_chaos(envoy_bin, workdir, args),
        lambda info, results: report(info, args, results["phases"], results["counters"]), args.json,
    )
    bad = failed_phases(results["phases"], args.margin_ms)
    if bad:
        log(f"FAILED: {', '.join(bad)}")
        sys.exit(1)


if __name__ == "__main__":
    run_main("chaos", main)
