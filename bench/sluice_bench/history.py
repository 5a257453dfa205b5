"""bench/history.jsonl: one line per full CPU run (every setup, every round), kept, with the key
figures that the next runs compare themselves with: on a shared or virtual machine, how far a
figure moves between runs of the same code says how small a change can be told from noise."""

import json

from .setups import RATIOS, ratio

# How many of the latest runs the report shows and takes the median of.
RUN_TO_RUN = 8


def history_entry(info, summary, acc):
    return {
        "date": info["date"],
        "commit": info["commit"],
        "cpu_us": {sid: round(s["cpu_us_per_request"], 2) for sid, s in summary.items()},
        "rps": {sid: round(s["rps"]) for sid, s in summary.items()},
        "ratios": {
            f"{a}/{b}": round(value, 4)
            for a, b, _ in RATIOS
            if (value := ratio(summary, a, b, "cpu_us_per_request")) is not None
        },
        "accuracy_error": None if acc is None else round(acc["error"], 2),
    }


def read_history(path):
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append_history(path, entry):
    path.write_text("".join(json.dumps(run) + "\n" for run in read_history(path) + [entry]))
