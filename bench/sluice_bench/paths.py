"""Where the benchmark scripts read and write: the repository, the builds they measure, and the
report files, which `run.py --out DIR` moves together."""

import dataclasses
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
FIXTURES = BENCH / "fixtures"
FIXTURE_TARGET = ROOT / "target" / "bench-fixtures"
SERVICE_TARGET = ROOT / "target" / "bench-service"
SLUICE_WASM = ROOT / "target" / "wasm32-wasip1" / "release" / "sluice.wasm"
FIND_ENVOY = ROOT / "scripts" / "find-envoy"
# soak.py and chaos.py each rewrite their own sections of it.
RELIABILITY_MD = ROOT / "docs" / "reliability.md"


@dataclasses.dataclass(frozen=True)
class Reports:
    """The benchmark's report files: BENCHMARKS.md and its companions."""

    benchmarks_md: Path
    results_json: Path
    results_svg: Path
    # One line per full run, kept: the key figures of earlier runs, to tell a change from noise.
    history: Path
    # What --instructions measured (BENCHMARKS.md renders its section from it).
    instructions_json: Path

    @classmethod
    def committed(cls):
        return cls(ROOT / "BENCHMARKS.md", BENCH / "results.json", BENCH / "results.svg",
                   BENCH / "history.jsonl", BENCH / "instructions.json")

    @classmethod
    def in_directory(cls, directory):
        directory.mkdir(parents=True, exist_ok=True)
        return cls(directory / "BENCHMARKS.md", directory / "results.json", directory / "results.svg",
                   directory / "history.jsonl", directory / "instructions.json")

    def link(self, path):
        """A link from BENCHMARKS.md to one of its companions."""
        return os.path.relpath(path, self.benchmarks_md.parent)


def read_json(path):
    """A JSON file a run saved, or None when there is none."""
    return json.loads(path.read_text()) if path.exists() else None


def write_json(path, data):
    """JSON as the runs save it: one value a line at most, a newline at the end."""
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
