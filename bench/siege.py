#!/usr/bin/env python3
"""`make siege`: sluice-service under every attack of issue 20 at once, for a minute, while
legitimate clients call it. Writes the "siege" section of docs/reliability.md.

sluice-service (release build, HTTP and --rls, every flag at its default) runs under
`ulimit -n 1024` in front of a redis-server with a small maxmemory and allkeys-lfu. Attackers,
each opening again at once whatever the service closes: slowloris connections to HTTP, idle
HTTP/2 connections and connections of half-sent HTTP/2 calls to the RLS, a flood of new keys of a
month each, and RLS calls with huge descriptor values. Two legitimate clients, one /v1/check and
one RLS, call every 100 ms and must be answered exactly (allowed, one less remaining each time)
within 10 s. The service's RSS and descriptors and Redis' used_memory are sampled every second.
Exits 1 when a legitimate call failed or was wrong, or the service's RSS or Redis' memory went
over its bound.

  .venv/bin/python bench/siege.py                    # about 2 minutes with the build done
  .venv/bin/python bench/siege.py --seconds 20 --json /tmp/siege.json

Needs grpcio (`scripts/ensure-deps grpcio` puts it in the repo's .venv; make siege runs this with
that Python). Every loop is bounded; every child is stopped by PID, whatever happens; only
127.0.0.1. The library is bench/sluice_bench/.
"""

import argparse
import signal
import sys
import tempfile
from pathlib import Path

from sluice_bench.builds import service_binary
from sluice_bench.facts import command_line, service_facts, service_facts_lines
from sluice_bench.paths import RELIABILITY_MD, ROOT, write_json
from sluice_bench.processes import install_signal_handlers, log, require, run_main
from sluice_bench.siege_attacks import run_siege
from sluice_bench.siege_report import failures, report


def arguments():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=60, help="how long the attacks last")
    parser.add_argument("--slowloris", type=int, default=600, help="slowloris connections to HTTP")
    parser.add_argument("--idle-http2", type=int, default=500, help="idle HTTP/2 connections to the RLS")
    parser.add_argument("--stream-connections", type=int, default=4,
                        help="HTTP/2 connections of 100 half-sent calls each")
    parser.add_argument("--flooders", type=int, default=2, help="connections flooding new keys")
    parser.add_argument("--label-bytes", type=int, default=60_000, help="length of the oversized values")
    parser.add_argument("--maxmemory-mb", type=int, default=32, help="Redis' maxmemory")
    parser.add_argument("--max-rss-mib", type=int, default=128, help="the bound on the service's RSS")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    return parser.parse_args()


def main():
    args = arguments()
    require("redis-server")
    install_signal_handlers()
    binary = service_binary()
    info = service_facts(command_line("siege.py"), binary)
    signal.alarm(args.seconds + 180)
    with tempfile.TemporaryDirectory(prefix="sluice-siege-") as tmp:
        results = run_siege(binary, Path(tmp), args)
    signal.alarm(0)
    if args.json:
        write_json(args.json, {"info": info, **results})
    print("\n".join(report(service_facts_lines(info), args, results)))
    log(f"wrote the siege section of {RELIABILITY_MD.relative_to(ROOT)}")
    bad = failures(results, args)
    if bad:
        log(f"FAILED: {'; '.join(bad)}")
        sys.exit(1)


if __name__ == "__main__":
    run_main("siege", main)
