"""What a run reads off Envoy while it works: CPU time per request over a wrk run (utime+stime
of the whole process from /proc, over the requests wrk completed) and RSS after it, the medians
over rounds, and samples of any probe taken every few seconds in the background."""

import statistics
import threading
import time

from .load import wrk
from .processes import children_cpu_seconds, cpu_seconds, machine_busy_seconds

# The per-run figures the benchmark reports the median of.
MEDIAN_FIGURES = ("rps", "p50_ms", "p99_ms", "cpu_us_per_request", "rss_mib", "envoy_cpu_share", "others_share")


def measure(envoy, duration, warmup, connections=16):
    """wrk's figures for one run against `envoy` (after `warmup` seconds of it), with Envoy's CPU
    time per request, its share of a core, and its RSS after the run."""
    if warmup:
        wrk(envoy.port, warmup, connections)
    cpu_before, machine_before, wrk_before = cpu_seconds(envoy.pid), machine_busy_seconds(), children_cpu_seconds()
    result = wrk(envoy.port, duration, connections)
    cpu = cpu_seconds(envoy.pid) - cpu_before
    wrk_cpu = children_cpu_seconds() - wrk_before
    result["cpu_us_per_request"] = cpu / max(result["requests"], 1) * 1e6
    result["envoy_cpu_share"] = cpu / result["seconds"]
    # The rest of the machine meanwhile, in cores: other work (and the global rows' service and Redis).
    result["others_share"] = max(machine_busy_seconds() - machine_before - cpu - wrk_cpu, 0.0) / result["seconds"]
    result["rss_mib"] = envoy.rss_mib()
    return result


def summarize(rows):
    """Per setup, the median of each figure over its rounds, and of its share of non-2xx answers."""
    return {
        sid: {key: statistics.median(s[key] for s in samples) for key in MEDIAN_FIGURES if key in samples[0]}
        | {"non2xx_share": statistics.median(s["non2xx"] / max(s["requests"], 1) for s in samples)}
        for sid, samples in rows.items()
    }


class Sampler(threading.Thread):
    """Samples `probe()` (a dict) every `period` seconds until stopped or `deadline`; each sample
    gets its time since the start, "t"."""

    def __init__(self, probe, period, deadline):
        super().__init__(daemon=True)
        self.probe, self.period, self.deadline = probe, period, deadline
        self.samples = []
        self.stopping = threading.Event()
        self.started = time.monotonic()

    def run(self):
        while not self.stopping.is_set() and time.monotonic() < self.deadline:
            self.take()
            self.stopping.wait(self.period)

    def take(self):
        try:
            sample = self.probe()
        except Exception as error:  # a sample that fails is noted, never fatal
            sample = {"error": str(error)}
        sample["t"] = time.monotonic() - self.started
        self.samples.append(sample)
        return sample

    def stop(self):
        self.stopping.set()
        if self.is_alive():
            self.join(timeout=self.period + 5)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *_exc):
        self.stop()
