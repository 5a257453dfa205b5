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
from lifting the fault until every decision was global again.

  python3 bench/chaos.py                  # about 2 minutes
  python3 bench/chaos.py --fault-seconds 5

Every loop is bounded; every child is stopped by PID in a finally block; only 127.0.0.1.
"""

import argparse
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reliability as rl  # noqa: E402
from reliability import bench  # noqa: E402

log = rl.logger("chaos")

TIMEOUT_MS = 50
GLOBAL_RATE, GLOBAL_BURST = 200, 200
EMERGENCY_RATE, EMERGENCY_BURST = 10, 10
OPEN_RATE, CLOSED_RATE = 60, 40  # requests/s per Envoy
CLOSED_RATE_LIMIT = 1000


def config():
    return {
        "version": "chaos",
        "headers": "legacy",
        "global": rl.global_block(f"{TIMEOUT_MS}ms"),
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


class Load:
    """Paced clients, two per Envoy (open and closed policy), recording every response."""

    def __init__(self, envoys, deadline):
        self.lock = threading.Lock()
        self.records = []
        self.pacers = []
        for i, envoy in enumerate(envoys):
            for kind, rate, path, headers in [
                ("open", OPEN_RATE, "/api/open", {"x-user-id": "hot-user"}),
                ("closed", CLOSED_RATE, "/api/closed", {"x-tenant": "acme"}),
            ]:
                self.pacers.append(rl.Pacer(envoy.port, rate, lambda n, p=path, h=headers: (p, h),
                                            self.recorder(i, kind), deadline))

    def recorder(self, envoy, kind):
        def record(sent, result):
            r = Record(sent, envoy, kind, result)
            with self.lock:
                self.records.append(r)

        return record

    def start(self):
        for pacer in self.pacers:
            pacer.start()

    def stop(self):
        for pacer in self.pacers:
            pacer.stop()
        for pacer in self.pacers:
            pacer.join(timeout=10)

    def since(self, t):
        with self.lock:
            return [r for r in self.records if r.sent >= t]


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


def summarize(name, records, start, fault_at, lifted, recovered):
    """One phase: from its start to the end of its quiet period."""
    answered = [r for r in records if r.status is not None]
    unexpected = [r for r in records if r.unexpected]
    emergency = {}
    for envoy in (0, 1):
        admitted = [r for r in records if r.envoy == envoy and r.kind == "open" and r.status == 200 and r.degraded]
        degraded = [r for r in records if r.envoy == envoy and r.kind == "open" and r.degraded]
        span = (max(r.sent for r in degraded) - min(r.sent for r in degraded)) if degraded else 0.0
        budget = EMERGENCY_BURST + EMERGENCY_RATE * span
        emergency[envoy] = {"admitted": len(admitted), "span": span, "budget": budget,
                            "within": len(admitted) <= budget + 1}
    latencies = sorted(r.latency for r in records)
    p99 = latencies[int(0.99 * (len(latencies) - 1))] if latencies else 0
    global_open = [r for r in records if r.kind == "open" and r.status == 200 and not r.degraded]
    return {
        "name": name,
        "requests": len(records),
        "answered": len(answered),
        "status": {s: sum(1 for r in answered if r.status == s) for s in sorted({r.status for r in answered})},
        "closed_503": sum(1 for r in records if r.kind == "closed" and r.status == 503),
        "open_degraded": sum(1 for r in records if r.kind == "open" and r.degraded),
        "open_emergency_admitted": sum(1 for r in records if r.kind == "open" and r.degraded and r.status == 200),
        "open_429": sum(1 for r in records if r.kind == "open" and r.status == 429),
        "global_open_admitted": len(global_open),
        "unexpected": len(unexpected),
        "unexpected_examples": [
            {"status": r.status, "kind": r.kind, "limit": r.limit, "policy": r.policy, "error": r.error}
            for r in unexpected[:5]
        ],
        "worst_ms": 1000 * (latencies[-1] if latencies else 0),
        "p99_ms": 1000 * p99,
        "emergency": emergency,
        "fault_seconds": (lifted - fault_at) if fault_at is not None else 0,
        "recover_s": None if recovered is None else max(0.0, recovered - lifted) if fault_at is not None else 0.0,
        # For the JSON: requests over 20 ms, when (from the fault; before the fault: negative) and where.
        "slow": [
            {"t": round(r.sent - (fault_at if fault_at is not None else start), 3), "envoy": r.envoy,
             "kind": r.kind, "status": r.status, "ms": round(1000 * r.latency, 1)}
            for r in records if r.latency > 0.020
        ][:300],
        "first_degraded_s": (
            min((r.sent for r in records if r.degraded), default=fault_at) - fault_at if fault_at is not None else None
        ),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fault-seconds", type=float, default=8.0, help="how long each fault lasts")
    parser.add_argument("--quiet-seconds", type=float, default=3.0,
                        help="clean global decisions that count as recovered")
    parser.add_argument("--recover-timeout", type=float, default=60.0)
    parser.add_argument("--baseline-seconds", type=float, default=8.0)
    parser.add_argument("--margin-ms", type=float, default=50.0, help="latency allowed over the callout timeout")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args()
    if not shutil.which("redis-server"):
        sys.exit("chaos: redis-server not found")
    if not bench.SLUICE_WASM.exists():
        sys.exit("chaos: the wasm is missing: make build")

    rl.install_signal_handlers()
    envoy_bin = bench.run([str(rl.ROOT / "scripts" / "find-envoy")], timeout=600).strip()
    info = rl.facts(envoy_bin)
    per_fault = args.fault_seconds + args.recover_timeout + args.quiet_seconds + 5
    signal.alarm(int(args.baseline_seconds + 3 * per_fault + 180))
    phases = []
    with tempfile.TemporaryDirectory(prefix="sluice-chaos-") as tmp:
        workdir = Path(tmp)
        redis = rl.Redis(workdir)
        service = None
        envoys = []
        load = None
        try:
            redis.start()
            service = rl.Service(workdir, redis, rl.service_binary())
            service.start()
            for i in range(2):
                envoys.append(rl.make_envoy(envoy_bin, f"chaos-{i}", config(), workdir,
                                            clusters=[bench.service_cluster(service.port)]))
                envoys[-1].start()
            log(f"Redis :{redis.port}, sluice-service :{service.port} ({service.binary}), "
                f"Envoys :{envoys[0].port} :{envoys[1].port}")
            load = Load(envoys, time.monotonic() + args.baseline_seconds + 3 * per_fault + 60)
            load.start()
            start = time.monotonic()
            time.sleep(args.baseline_seconds)
            phases.append(summarize("none (baseline)", load.since(start), start, None, start, start))
            log(f"baseline: {phases[-1]['requests']} requests, {phases[-1]['unexpected']} unexpected")

            faults = [
                ("Redis killed, then restarted (empty)", redis.kill, redis.start),
                ("Redis paused (SIGSTOP, then SIGCONT)", redis.pause, redis.resume),
                ("service killed, then restarted", service.kill, service.start),
            ]
            for name, inject, lift in faults:
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
                phases.append(summarize(name, load.since(start), start, fault_at, lifted, recovered))
                p = phases[-1]
                log(f"{name}: {p['requests']} requests, {p['unexpected']} unexpected, worst {p['worst_ms']:.0f} ms, "
                    f"recovered in {p['recover_s'] if p['recover_s'] is not None else 'never'} s")
                # Let the emergency buckets fill again before the next fault.
                time.sleep(1.0)
            load.stop()
            counters = [rl.wasm_counters(e) for e in envoys]
        finally:
            if load:
                load.stop()
            for envoy in envoys:
                envoy.stop()
            if service:
                service.stop()
            redis.stop()
    signal.alarm(0)
    if args.json:
        rl.dump_json(args.json, {"info": info, "phases": phases, "counters": counters})
    lines = report(info, args, phases, counters)
    print("\n".join(lines))
    log(f"wrote the chaos section of {rl.REPORT.relative_to(rl.ROOT)}")
    bad = [p["name"] for p in phases if p["unexpected"] or p["worst_ms"] > TIMEOUT_MS + args.margin_ms
           or not all(e["within"] for e in p["emergency"].values()) or p["recover_s"] is None]
    if bad:
        log(f"FAILED: {', '.join(bad)}")
        sys.exit(1)


def report(info, args, phases, counters):
    bound = TIMEOUT_MS + args.margin_ms
    rows = []
    for p in phases:
        e = p["emergency"]
        emergency = "; ".join(
            f"E{i + 1}: {e[i]['admitted']} ≤ {e[i]['budget']:.0f}" if e[i]["admitted"] or e[i]["span"] else f"E{i + 1}: 0"
            for i in (0, 1)
        )
        within = "yes" if all(x["within"] for x in e.values()) else "**no**"
        statuses = ", ".join(f"{s}: {n:,}" for s, n in p["status"].items())
        rows.append([
            p["name"],
            f"{p['fault_seconds']:.1f} s" if p["fault_seconds"] else "–",
            f"{p['requests']:,}",
            f"{p['answered']:,} ({statuses})",
            f"{p['unexpected']}" if not p["unexpected"] else f"**{p['unexpected']}**",
            f"{p['global_open_admitted']:,} · {p['open_emergency_admitted']:,} · {p['open_429']:,}",
            f"{p['closed_503']:,}",
            f"{p['worst_ms']:.0f} ms" + ("" if p["worst_ms"] <= bound else " **over**"),
            f"{p['p99_ms']:.1f} ms",
            f"{emergency} ({within})",
            "–" if p["name"].startswith("none") else
            ("**never**" if p["recover_s"] is None else f"{p['recover_s']:.2f} s"),
        ])
    totals = {k: sum(c.get(k, 0) for c in counters) for k in counters[0]} if counters else {}
    lines = ["## Chaos (`make chaos`, bench/chaos.py)", ""]
    lines += rl.facts_lines(info, "python3 bench/chaos.py" + "".join(" " + x for x in sys.argv[1:]))
    lines += [
        "",
        "redis-server, sluice-service and two Envoys (E1, E2; 2 workers each) on 127.0.0.1. "
        f"`shared-open` (/api/open, per `x-user-id`): global {GLOBAL_RATE}/s burst {GLOBAL_BURST} across both "
        f"Envoys (never low under this load), failure_mode open, emergency {EMERGENCY_RATE}/s burst "
        f"{EMERGENCY_BURST} per Envoy. "
        f"`tenant-closed` (/api/closed, per `x-tenant`): global {CLOSED_RATE_LIMIT}/s, failure_mode closed. "
        f"Callout timeout {TIMEOUT_MS} ms. Load: Python clients on keep-alive connections, per Envoy "
        f"{OPEN_RATE}/s of one user to /api/open and {CLOSED_RATE}/s of one tenant to "
        f"/api/closed, every request timed. Each fault lasts {args.fault_seconds:g} s; a phase runs from 1 s "
        f"before the fault until {args.quiet_seconds:g} s of only global decisions on both Envoys.",
        "",
        "- *Unexpected*: a connection error, a status other than 200 or 429, a 503 not from "
        "`tenant-closed`, or an open-policy answer without a known limit.",
        f"- *Worst latency* must be ≤ the callout timeout + {args.margin_ms:g} ms = {bound:g} ms "
        "(client-side, Python: includes the client's own scheduling).",
        f"- *Emergency*: per Envoy, open-policy requests admitted by the emergency budget (a 200 with "
        f"fewer than {EMERGENCY_BURST} tokens left; healthy answers leave over 100) against "
        f"{EMERGENCY_BURST} + {EMERGENCY_RATE}/s × the time between its first and last degraded decision.",
        "- *Recovered after*: from lifting the fault to the last degraded answer (a 503 of the closed "
        "policy or an emergency decision) on either Envoy.",
        "",
        *rl.table(
            ["Fault", "Lasted", "Requests", "Answered (by status)", "Unexpected",
             "Open: global 200 · emergency 200 · 429", "503 (closed)",
             "Worst latency", "p99", "Emergency admits (within)", "Recovered after"],
            rows,
        ),
        "",
        "Filter counters over the run (both Envoys): "
        + ", ".join(f"`{k}` {v:,}" for k, v in sorted(totals.items()) if k.startswith("sluice.")) + ".",
    ]
    rl.write_section("chaos", lines)
    return lines


if __name__ == "__main__":
    try:
        main()
    except rl.Stop as stop:
        sys.exit(f"chaos: {stop}")
