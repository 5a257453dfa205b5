"""What a global concurrency policy (setup 11) sends sluice-service per 1,000 requests: its
checks (`POST /v1/check`, one per request, carrying the slot) and its settle calls
(`POST /v1/settle`: the releases, sent in batches from each worker's 20 ms timer and behind
each batch delivered while a full one waits), with the settlements they carry, read off the service's `/metrics`
around the load.

Two loads, one after the other, through the setup's own Envoy: *paced*, a steady rate from
keep-alive clients, where a batch carries the few requests that ended since the last tick; then
*saturated*, wrk as the CPU rounds run it, where batches fill up. Releases that fell behind would
show as refusals: the key's slots full of requests long ended."""

import re
import threading
import time

from .load import CLIENT_HEADERS, PATH, PacedClients, Pacer, http_get, wrk

# The paced load: this many requests a second, from as many keep-alive clients.
PACED_RATE = 500
PACED_CLIENTS = 5
# Waited for after each load, so that the releases of its last requests are counted too.
SETTLE_WAIT_S = 3
_SERIES = re.compile(r'^(sluice_service_\w+)\{([^}]*)\} (\d+)$', re.MULTILINE)


def service_counters(port):
    """The service's calls by path and its settlements by op and result: {(series, labels): n}."""
    status, text = http_get(port, "/metrics", timeout=5)
    if status != 200:
        raise OSError(f"/metrics answered {status}")
    counters = {}
    for name, labels, value in _SERIES.findall(text):
        if name in ("sluice_service_http_requests_total", "sluice_service_settlements_total"):
            counters[(name, tuple(sorted(re.findall(r'(\w+)="([^"]*)"', labels))))] = int(value)
    return counters


def outbox_counts(envoy):
    """The filter's settlements delivered and dropped, in all."""
    counters = envoy.wasm_counters()
    return {k: counters.get(f"sluice.settlements_{k}", 0) for k in ("delivered", "dropped")}


def global_traffic(envoy, service_port, seconds, connections):
    """The paced load, then the saturated one: each's traffic (`traffic`)."""
    return {
        "paced": traffic(envoy, service_port, lambda: paced(envoy.port, seconds)),
        "saturated": traffic(envoy, service_port, lambda: saturated(envoy.port, seconds, connections)),
    }


def paced(port, seconds):
    """PACED_RATE requests a second for `seconds`: the statuses, counted."""
    statuses, lock = {}, threading.Lock()

    def record(_sent, result):
        with lock:
            key = str(result[0])
            statuses[key] = statuses.get(key, 0) + 1

    deadline = time.monotonic() + seconds
    pacers = [Pacer(port, PACED_RATE / PACED_CLIENTS, PATH, CLIENT_HEADERS, record, deadline)
              for _ in range(PACED_CLIENTS)]
    with PacedClients(pacers):
        time.sleep(seconds)
    return {"load": f"{PACED_RATE} requests/s for {seconds} s ({PACED_CLIENTS} keep-alive clients)",
            "statuses": statuses}


def saturated(port, seconds, connections):
    """wrk as the CPU rounds run it."""
    result = wrk(port, seconds, connections)
    return {"load": f"wrk -c{connections} for {seconds} s ({result['rps']:,.0f} requests/s)",
            "refused_share": result["non2xx"] / max(result["requests"], 1)}


def traffic(envoy, service_port, load):
    """`load()` through `envoy`, then SETTLE_WAIT_S: the requests Envoy answered, and the
    service's calls and settlements over them, in all and per 1,000."""
    before, answered, outbox = service_counters(service_port), envoy.downstream_counts(), outbox_counts(envoy)
    result = load()
    time.sleep(SETTLE_WAIT_S)
    after, counts, outbox_after = service_counters(service_port), envoy.downstream_counts(), outbox_counts(envoy)
    delta = {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0)}
    requests = counts["completed"] - answered["completed"]

    def calls(path):
        return sum(n for (name, labels), n in delta.items()
                   if name == "sluice_service_http_requests_total" and ("path", path) in labels)

    settlements = {f"{dict(labels)['op']} {dict(labels)['result']}": n for (name, labels), n in delta.items()
                   if name == "sluice_service_settlements_total"}
    failed = sum(n for (name, labels), n in delta.items()
                 if name == "sluice_service_http_requests_total" and dict(labels).get("status") != "200")
    per_1000 = 1000 / max(requests, 1)
    return {
        **result,
        "requests": requests,
        "refused": counts["4xx"] - answered["4xx"],
        "checks": calls("/v1/check"),
        "settles": calls("/v1/settle"),
        "failed_calls": failed,
        "settlements": settlements,
        "outbox": {k: outbox_after[k] - outbox[k] for k in outbox},
        "per_1000": {
            "checks": calls("/v1/check") * per_1000,
            "settles": calls("/v1/settle") * per_1000,
            "settlements": sum(settlements.values()) * per_1000,
        },
    }
