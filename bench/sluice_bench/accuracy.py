"""The benchmark's accuracy run: a separate Envoy with 2 workers (not pinned) and one local
policy, saturated by wrk on one key; its access log gives every request's time and status, so
the admitted requests can be held against the ideal burst + rate × (last − first)."""

import time

from .envoy import Envoy
from .envoy_config import policy, policy_counter, sluice
from .load import wrk
from .processes import Failure, log


def accuracy(envoy_bin, workdir, duration, rate=100, burst=50):
    access_log = workdir / "accuracy-access.log"
    filters = [sluice(policy("accuracy", "header:x-user-id", rate, "1s", burst))]
    with Envoy(envoy_bin, "accuracy", filters, workdir, concurrency=2, pin=False, access_log=access_log) as envoy:
        envoy.start()
        # The readiness probe took a token: let the bucket fill again, and leave the probe
        # out of the count by its time.
        time.sleep(1.0)
        since = time.time() - 0.01
        log(f"accuracy: {duration}s of wrk -t2 -c32 through 2 workers, {rate}/s burst {burst}")
        load = wrk(envoy.port, duration, connections=32, threads=2, core=None)
        lines = wait_for_access_log(envoy, access_log)
        time.sleep(1.5)
        stats = envoy.stats()
    entries = logged_since(lines, since)
    span = max(t for t, _ in entries) - min(t for t, _ in entries)
    admitted = sum(1 for _, code in entries if code == 200)
    ideal = burst + rate * span
    return {
        "rate": rate,
        "burst": burst,
        "workers": 2,
        "wrk_seconds": load["seconds"],
        "requests": len(entries),
        "span_s": span,
        "admitted": admitted,
        "ideal": ideal,
        "error": admitted - ideal,
        "other_status": sum(1 for _, code in entries if code not in (200, 429)),
        "rps": load["rps"],
        "cas_retries": stats.get("wasmcustom.sluice.cas_retries", 0),
        "cas_exhausted": stats.get("wasmcustom.sluice.cas_exhausted", 0),
        "counter_allowed": stats.get("wasmcustom." + policy_counter("accuracy", "allowed")),
    }


def wait_for_access_log(envoy, access_log, timeout=15):
    """The access log's lines once it has every request Envoy counted (access-log lines reach
    the file, and counters the stats, within about a second), or after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        time.sleep(1.0)
        completed = envoy.stats().get("http.bench.downstream_rq_completed", 0)
        lines = access_log.read_text(errors="replace").splitlines()
        if len(lines) >= completed:
            return lines
        if time.monotonic() > deadline:
            log("warning: the access log misses requests that Envoy counted")
            return lines


def logged_since(lines, since):
    """(start time, status) of the requests logged from `since` (epoch seconds) on."""
    entries = []
    for line in lines:
        fields = line.split()
        if len(fields) == 2 and float(fields[0]) >= since:
            entries.append((float(fields[0]), int(fields[1])))
    if not entries:
        raise Failure("the accuracy run logged no requests")
    return entries
