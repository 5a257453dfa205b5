#!/usr/bin/env python3
"""What a key table costs against its max_keys (1; 10,000; 100,000; 1,000,000): the time an Envoy
with it takes to be ready, and its resident memory per key once the table is full, over the
same build with max_keys 1 given the same requests. Rewrites the "tables" section of
BENCHMARKS.md.

  python3 bench/tables.py                       # the current build (make build)
  python3 bench/tables.py --before old.wasm     # and a build before a change, side by side

About 4 minutes a build on 2 cores (3.3 million requests). Every loop is bounded; every child is
stopped by PID; only 127.0.0.1 and free ports are used. The library is bench/sluice_bench/.
"""

import argparse
import signal
import tempfile
from pathlib import Path

from sluice_bench.builds import require_wasm
from sluice_bench.envoy import find_envoy
from sluice_bench.facts import command_line, facts, facts_lines
from sluice_bench.markdown import write_section
from sluice_bench.paths import ROOT, SLUICE_WASM
from sluice_bench.processes import install_signal_handlers, log, require, run_main
from sluice_bench.tables import measure, report


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="a sluice.wasm built before the change, measured first")
    args = parser.parse_args()
    require("wrk")
    require_wasm("python3 bench/tables.py")
    install_signal_handlers()
    envoy_bin = find_envoy()
    info = facts(envoy_bin, command_line("tables.py"))
    builds = ([("before", args.before.resolve())] if args.before else []) + [("after" if args.before else "this build", SLUICE_WASM)]
    signal.alarm(3600)
    with tempfile.TemporaryDirectory(prefix="sluice-tables-") as tmp:
        results = measure(envoy_bin, builds, Path(tmp))
    signal.alarm(0)
    lines = report(facts_lines(info), results)
    write_section(ROOT / "BENCHMARKS.md", "tables", lines)
    print("\n".join(lines))
    log("wrote the tables section of BENCHMARKS.md")


if __name__ == "__main__":
    run_main("tables", main)
