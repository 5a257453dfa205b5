"""`make chaos` (bench/chaos.py tells the design): Redis and sluice-service under faults behind
two Envoys, paced clients through both, and each phase summarized from the answers it got: who
decided them, how long they took, the emergency budgets, the time to recover."""

import contextlib
import threading
import time

from .builds import service_binary
from .envoy import sluice_envoy
from .envoy_config import service_cluster, service_settings
from .load import PacedClients, Pacer
from .processes import log
from .services import redis_and_service

TIMEOUT_MS = 50
GLOBAL_RATE, GLOBAL_BURST = 200, 200
EMERGENCY_RATE, EMERGENCY_BURST = 10, 10
OPEN_RATE, CLOSED_RATE = 60, 40  # requests/s per Envoy
CLOSED_RATE_LIMIT = 1000


def config():
    return {
        "version": "chaos",
        "headers": "legacy",
        "global": service_settings(f"{TIMEOUT_MS}ms"),
        "policies": [
            {"name": "shared-open", "scope": "global", "match": {"path_prefix": "/api/open"},
             "key": ["header:x-user-id"], "requests": GLOBAL_RATE, "per": "1s", "burst": GLOBAL_BURST,
             "failure_mode": "open",
             "emergency": {"requests": EMERGENCY_RATE, "per": "1s", "burst": EMERGENCY_BURST}},
            {"name": "tenant-closed", "scope": "global", "match": {"path_prefix": "/api/closed"},
             "key": ["header:x-tenant"], "requests": CLOSED_RATE_LIMIT, "per": "1s",
             "burst": CLOSED_RATE_LIMIT, "failure_mode": "closed"},
        ],
    }


class Record:
    """One response: when it was sent, through which Envoy, to which policy, what came back."""

    __slots__ = ("sent", "done", "envoy", "kind", "status", "limit", "remaining", "policy", "latency", "error")

    def __init__(self, sent, envoy, kind, result):
        status, headers, body, latency, error = result
        self.sent, self.envoy, self.kind = sent, envoy, kind
        self.status, self.latency, self.error = status, latency, error
        self.done = sent + latency
        limit, remaining = headers.get("x-ratelimit-limit", ""), headers.get("x-ratelimit-remaining", "")
        self.limit = int(limit) if limit.isdigit() else None
        self.remaining = int(remaining) if remaining.isdigit() else None
        text = body.decode(errors="replace")
        self.policy = text.split('"policy":"', 1)[1].split('"', 1)[0] if '"policy":"' in text else None

    @property
    def degraded(self):
        """Decided without the service: an emergency decision, or the closed policy's 503."""
        if self.kind == "open":
            return self.status == 429 or (self.remaining is not None and self.remaining < EMERGENCY_BURST)
        return self.status == 503

    @property
    def unexpected(self):
        if self.error or self.status is None:
            return True
        if self.status in (200, 429):
            # Every open-policy answer carries the rate-limit headers.
            return self.kind == "open" and (self.limit not in (GLOBAL_BURST, EMERGENCY_BURST) or self.remaining is None)
        return not (self.status == 503 and self.kind == "closed" and self.policy == "tenant-closed")


class Load(PacedClients):
    """Paced clients, two per Envoy (open and closed policy), recording every response."""

    def __init__(self, envoys, deadline):
        self.lock = threading.Lock()
        self.records = []
        super().__init__([
            Pacer(envoy.port, rate, path, headers, self.recorder(i, kind), deadline)
            for i, envoy in enumerate(envoys)
            for kind, rate, path, headers in [
                ("open", OPEN_RATE, "/api/open", {"x-user-id": "hot-user"}),
                ("closed", CLOSED_RATE, "/api/closed", {"x-tenant": "acme"}),
            ]
        ])

    def recorder(self, envoy, kind):
        def record(sent, result):
            r = Record(sent, envoy, kind, result)
            with self.lock:
                self.records.append(r)

        return record

    def since(self, t):
        with self.lock:
            return [r for r in self.records if r.sent >= t]


def per_fault_s(args):
    """A bound on one fault's phase."""
    return args.fault_seconds + args.recover_timeout + args.quiet_seconds + 5


def bound_s(args):
    """A bound on the whole run."""
    return args.baseline_seconds + 3 * per_fault_s(args) + 180


def run_chaos(envoy_bin, workdir, args):
    """The baseline and the three faults under load; each phase's summary and both Envoys'
    counters at the end."""
    with redis_and_service(workdir, service_binary()) as (redis, service), contextlib.ExitStack() as stack:
        envoys = [stack.enter_context(sluice_envoy(envoy_bin, f"chaos-{i}", config(), workdir,
                                                   [service_cluster(service.port)])) for i in range(2)]
        for envoy in envoys:
            envoy.start()
        log(f"Redis :{redis.port}, sluice-service :{service.port} ({service.binary}), "
            f"Envoys :{envoys[0].port} :{envoys[1].port}")
        faults = [
            ("Redis killed, then restarted (empty)", redis.kill, redis.start),
            ("Redis paused (SIGSTOP, then SIGCONT)", redis.pause, redis.resume),
            ("service killed, then restarted", service.kill, service.start),
        ]
        with Load(envoys, time.monotonic() + args.baseline_seconds + 3 * per_fault_s(args) + 60) as load:
            start = time.monotonic()
            time.sleep(args.baseline_seconds)
            phases = [summarize("none (baseline)", load.since(start), start, None, start, start)]
            log(f"baseline: {phases[-1]['requests']} requests, {phases[-1]['unexpected']} unexpected")
            phases += [fault_phase(load, name, inject, lift, args) for name, inject, lift in faults]
        return {"phases": phases, "counters": [envoy.wasm_counters() for envoy in envoys]}


def fault_phase(load, name, inject, lift, args):
    """One fault: a second of load before it, `args.fault_seconds` of it, then until recovered."""
    start = time.monotonic()
    time.sleep(1.0)
    fault_at = time.monotonic()
    inject()
    log(f"fault: {name}")
    time.sleep(args.fault_seconds)
    lifted = time.monotonic()
    lift()
    log("lifted; waiting for global decisions on both Envoys")
    recovered = wait_recovered(load, lifted, args.quiet_seconds, args.recover_timeout)
    phase = summarize(name, load.since(start), start, fault_at, lifted, recovered)
    log(f"{name}: {phase['requests']} requests, {phase['unexpected']} unexpected, worst {phase['worst_ms']:.0f} ms, "
        f"recovered in {phase['recover_s'] if phase['recover_s'] is not None else 'never'} s")
    # Let the emergency buckets fill again before the next fault.
    time.sleep(1.0)
    return phase


def wait_recovered(load, lifted, quiet, timeout):
    """Waits until `quiet` seconds of responses after the fault was lifted are all global
    decisions from both Envoys (bounded by `timeout`); the time of the last degraded response."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.25)
        after = load.since(lifted)
        last_degraded = max((r.done for r in after if r.degraded or r.unexpected), default=lifted)
        clean = [r for r in after if r.sent > last_degraded]
        kinds = {(r.envoy, r.kind) for r in clean}
        if time.monotonic() - last_degraded >= quiet and len(kinds) == 4:
            return last_degraded
    return None


def emergency_use(records):
    """Per Envoy, the open-policy requests its emergency budget admitted, against that budget
    over the time between its first and last degraded decision."""
    emergency = {}
    for envoy in (0, 1):
        degraded = [r for r in records if r.envoy == envoy and r.kind == "open" and r.degraded]
        admitted = sum(1 for r in degraded if r.status == 200)
        span = (max(r.sent for r in degraded) - min(r.sent for r in degraded)) if degraded else 0.0
        budget = EMERGENCY_BURST + EMERGENCY_RATE * span
        emergency[envoy] = {"admitted": admitted, "span": span, "budget": budget, "within": admitted <= budget + 1}
    return emergency


def summarize(name, records, start, fault_at, lifted, recovered):
    """One phase: from its start to the end of its quiet period."""
    answered = [r for r in records if r.status is not None]
    unexpected = [r for r in records if r.unexpected]
    latencies = sorted(r.latency for r in records)
    opened = [r for r in records if r.kind == "open"]
    origin = fault_at if fault_at is not None else start
    return {
        "name": name,
        "requests": len(records),
        "answered": len(answered),
        "status": {s: sum(1 for r in answered if r.status == s) for s in sorted({r.status for r in answered})},
        "closed_503": sum(1 for r in records if r.kind == "closed" and r.status == 503),
        "open_degraded": sum(1 for r in opened if r.degraded),
        "open_emergency_admitted": sum(1 for r in opened if r.degraded and r.status == 200),
        "open_429": sum(1 for r in opened if r.status == 429),
        "global_open_admitted": sum(1 for r in opened if r.status == 200 and not r.degraded),
        "unexpected": len(unexpected),
        "unexpected_examples": [
            {"status": r.status, "kind": r.kind, "limit": r.limit, "policy": r.policy, "error": r.error}
            for r in unexpected[:5]
        ],
        "worst_ms": 1000 * (latencies[-1] if latencies else 0),
        "p99_ms": 1000 * (latencies[int(0.99 * (len(latencies) - 1))] if latencies else 0),
        "emergency": emergency_use(records),
        "fault_seconds": (lifted - fault_at) if fault_at is not None else 0,
        "recover_s": None if recovered is None else max(0.0, recovered - lifted) if fault_at is not None else 0.0,
        # For the JSON: requests over 20 ms, when (from the fault; before the fault: negative) and where.
        "slow": [
            {"t": round(r.sent - origin, 3), "envoy": r.envoy, "kind": r.kind, "status": r.status,
             "ms": round(1000 * r.latency, 1)}
            for r in records if r.latency > 0.020
        ][:300],
        "first_degraded_s": (
            min((r.sent for r in records if r.degraded), default=fault_at) - fault_at if fault_at is not None else None
        ),
    }


def failed_phases(phases, margin_ms):
    """The phases with an unexpected answer, a latency over the callout timeout + `margin_ms`, an
    Envoy over its emergency budget, or no recovery."""
    return [p["name"] for p in phases if p["unexpected"] or p["worst_ms"] > TIMEOUT_MS + margin_ms
            or not all(e["within"] for e in p["emergency"].values()) or p["recover_s"] is None]
