#!/usr/bin/env python3
"""`make soak`: does sluice hold its memory bound and its limits over time? Two parts, each
through a real Envoy with 2 workers; writes the "soak" section of docs/reliability.md.

(a) Flood: wrk sends at least 1,000,000 requests, each with a new x-user-id and x-api-key, to
    two tables of max_keys 10,000 each (per-user: fast refill; per-api-key: slow refill, so its
    slots stay busy and get evicted). Meanwhile two legitimate clients, each on its own
    connection, send at a fixed rate: `steady` under its limits (every request should pass),
    `greedy` at twice per-user's rate (it should get exactly burst + rate x time). Envoy's RSS is
    sampled every second; the filter's counters tell evictions and denials.
(b) Mixed: redis-server, sluice-service and Envoy with local and global policies (one of them
    failure_mode closed), wrk pacing requests over several keys (allowed and denied) for
    SOAK_MINUTES (default 10). RSS of Envoy, the service and Redis every 10 s; every 5xx counted.

  python3 bench/soak.py                       # both parts, 10 minutes of mixed traffic
  SOAK_MINUTES=2 python3 bench/soak.py        # a shorter mixed part
  python3 bench/soak.py --flood-keys 200000 --skip-mixed

Every loop is bounded; every child (Envoy, wrk, Redis, the service) is stopped by PID in a
finally block; only 127.0.0.1 and free ports are used.
"""

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reliability as rl  # noqa: E402
from reliability import bench  # noqa: E402

log = rl.logger("soak")

MAX_KEYS = 10_000
# per-user: 10/s, burst 10 (a token back every 100 ms: a one-request key is idle again soon).
USER_RATE, USER_BURST = 10, 10
# per-api-key: 2000/h, burst 2000 (a token back every 1.8 s: flood slots stay busy, so new keys
# evict or overflow).
KEY_RATE_PER_H, KEY_BURST = 2000, 2000
STEADY_RATE, GREEDY_RATE = 5, 20
LEGIT_LEAD = 2.0  # seconds the legitimate clients run before and after the flood

FLOOD_LUA = r"""
-- Each request a new x-user-id and x-api-key; each thread stops after FLOOD_PER_THREAD.
-- Globals, so that done() can read them from every thread.
sent, ok, denied, other = 0, 0, 0, 0
local threads = {}
local limit = tonumber(os.getenv("FLOOD_PER_THREAD"))

function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end

function request()
  sent = sent + 1
  local key = id .. "-" .. sent
  return wrk.format("GET", "/api/items", {["x-user-id"] = "fu" .. key, ["x-api-key"] = "fk" .. key})
end

function response(status, headers, body)
  if status == 200 then ok = ok + 1 elseif status == 429 then denied = denied + 1 else other = other + 1 end
  if sent >= limit then wrk.thread:stop() end
end

function done(summary, latency, requests)
  local t = {sent = 0, ok = 0, denied = 0, other = 0}
  for _, thread in ipairs(threads) do
    for name, _ in pairs(t) do t[name] = t[name] + (thread:get(name) or 0) end
  end
  io.write(string.format("flood_sent %d\nflood_200 %d\nflood_429 %d\nflood_other %d\n",
                         t.sent, t.ok, t.denied, t.other))
end
"""

MIXED_LUA = r"""
-- Mixed traffic, paced: each connection sends one request every DELAY_MS. Users u0..u19 (u0 is
-- hot: a third of all requests, so it is often denied), tenants t0..t3, and a path without
-- policies now and then. Counts every status.
c200, c429, c503, c5xx, cother, n = 0, 0, 0, 0, 0, 0
local threads = {}
local delay_ms = tonumber(os.getenv("DELAY_MS"))

function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end

function init(args)
  math.randomseed(1000 + id)
end

function delay()
  return delay_ms
end

function request()
  n = n + 1
  local r = math.random(30)
  local user = (r <= 10) and "u0" or ("u" .. math.random(19))
  local tenant = "t" .. math.random(0, 3)
  local path = (r == 30) and "/health" or "/api/items"
  return wrk.format("GET", path, {["x-user-id"] = user, ["x-tenant"] = tenant})
end

function response(status, headers, body)
  if status == 200 then c200 = c200 + 1
  elseif status == 429 then c429 = c429 + 1
  elseif status == 503 then c503 = c503 + 1
  elseif status >= 500 then c5xx = c5xx + 1
  else cother = cother + 1 end
end

function done(summary, latency, requests)
  local t = {c200 = 0, c429 = 0, c503 = 0, c5xx = 0, cother = 0}
  for _, thread in ipairs(threads) do
    for name, _ in pairs(t) do t[name] = t[name] + (thread:get(name) or 0) end
  end
  io.write(string.format("mixed_200 %d\nmixed_429 %d\nmixed_503 %d\nmixed_5xx %d\nmixed_other %d\n",
                         t.c200, t.c429, t.c503, t.c5xx, t.cother))
end
"""


def flood_config(max_keys):
    return {
        "version": "soak-flood",
        "headers": "legacy",
        "policies": [
            {"name": "per-user", "match": {"path_prefix": "/api/"}, "key": ["header:x-user-id"],
             "requests": USER_RATE, "per": "1s", "burst": USER_BURST, "max_keys": max_keys},
            {"name": "per-api-key", "match": {"path_prefix": "/api/"}, "key": ["header:x-api-key"],
             "requests": KEY_RATE_PER_H, "per": "1h", "burst": KEY_BURST, "max_keys": max_keys},
        ],
    }


def mixed_config():
    return {
        "version": "soak-mixed",
        "headers": "legacy",
        "global": rl.global_block("100ms"),
        "policies": [
            {"name": "local-user", "match": {"path_prefix": "/api/"}, "key": ["header:x-user-id"],
             "requests": 40, "per": "1s", "burst": 40},
            {"name": "global-user", "scope": "global", "match": {"path_prefix": "/api/"},
             "key": ["header:x-user-id"], "requests": 30, "per": "1s", "burst": 30, "lease": 5,
             "failure_mode": "open"},
            {"name": "global-tenant", "scope": "global", "match": {"path_prefix": "/api/"},
             "key": ["header:x-tenant"], "requests": 1000, "per": "1s", "burst": 1000,
             "failure_mode": "closed"},
        ],
    }


# ---------------------------------------------------------------------------------------------
# (a) The flood


class Legit:
    """The legitimate clients' results."""

    def __init__(self):
        self.lock = threading.Lock()
        self.results = {"steady": [], "greedy": []}

    def recorder(self, name):
        def record(sent, result):
            status, headers, body, latency, error = result
            policy = None
            if status == 429:
                text = body.decode(errors="replace")
                policy = text.split('"policy":"', 1)[-1].split('"', 1)[0] if '"policy"' in text else "?"
            with self.lock:
                self.results[name].append((sent, status, policy, latency, error))

        return record


def greedy_ideal(results):
    """burst + rate x (last - first): what a token bucket admits to a client that always wants
    more than it may have, from a full bucket."""
    sent = [r[0] for r in results]
    return USER_BURST + USER_RATE * (max(sent) - min(sent))


def flood(envoy_bin, workdir, args):
    config = flood_config(MAX_KEYS)
    envoy = rl.make_envoy(envoy_bin, "flood", config, workdir)
    control = rl.make_envoy(envoy_bin, "flood-control", flood_config(1), workdir)
    legit = Legit()
    pacers = []
    sampler = None
    try:
        # The same filter with max_keys 1: its RSS against the real one's gives the cost of the
        # 2 x 10,000 slots created up front.
        control.start()
        time.sleep(2)
        control_rss = control.rss_mib()
        control.stop()
        envoy.start()
        time.sleep(2)
        rss_before = envoy.rss_mib()
        stats_before = rl.wasm_counters(envoy)
        log(f"Envoy up: RSS {rss_before:.1f} MiB with 2 x {MAX_KEYS:,} slots "
            f"({control_rss:.1f} MiB with max_keys 1)")

        bound = time.monotonic() + args.flood_max_seconds + 120
        sampler = rl.Sampler(lambda: {"rss": envoy.rss_mib()}, 1.0, bound)
        sampler.start()
        steady = {"x-user-id": "steady-user", "x-api-key": "steady-key"}
        greedy = {"x-user-id": "greedy-user"}
        pacers = [
            rl.Pacer(envoy.port, STEADY_RATE, lambda n: ("/api/items", steady), legit.recorder("steady"), bound),
            rl.Pacer(envoy.port, GREEDY_RATE, lambda n: ("/api/items", greedy), legit.recorder("greedy"), bound),
        ]
        for pacer in pacers:
            pacer.start()
        time.sleep(LEGIT_LEAD)

        script = workdir / "flood.lua"
        script.write_text(FLOOD_LUA)
        threads = 2
        per_thread = -(-args.flood_keys // threads)
        log(f"flood: {per_thread * threads:,} requests with new keys (wrk -t{threads} -c{args.connections}, "
            f"at most {args.flood_max_seconds}s); legitimate: steady {STEADY_RATE}/s, greedy {GREEDY_RATE}/s")
        completed = lambda: envoy.stats().get("http.bench.downstream_rq_completed", 0)  # noqa: E731
        completed_before = completed()
        legit_sent = lambda: sum(len(r) for r in legit.results.values())  # noqa: E731
        legit_before = legit_sent()
        # The Lua threads stop sending after their share; wrk itself ends when Envoy has
        # answered them all.
        flood_done = lambda: completed() - completed_before - (legit_sent() - legit_before) >= per_thread * threads  # noqa: E731
        started = time.monotonic()
        load = rl.wrk(envoy.port, args.flood_max_seconds, args.connections, threads, script,
                      env={"FLOOD_PER_THREAD": str(per_thread)}, until=flood_done)
        flood_seconds = time.monotonic() - started
        rss_end = envoy.rss_mib()
        time.sleep(LEGIT_LEAD)
        for pacer in pacers:
            pacer.stop()
        for pacer in pacers:
            pacer.join(timeout=10)
        time.sleep(1.5)  # the filter flushes its counters once a second
        stats = rl.wasm_counters(envoy)
        http = envoy.stats()
        rss_after = envoy.rss_mib()
        sampler.stop()
    finally:
        for pacer in pacers:
            pacer.stop()
        if sampler:
            sampler.stop()
        control.stop()
        envoy.stop()

    during = [s["rss"] for s in sampler.samples if "rss" in s]
    delta = {k: stats.get(k, 0) - stats_before.get(k, 0) for k in stats}
    results = {}
    for name, rows in legit.results.items():
        statuses = [r[1] for r in rows]
        denied_by = {}
        for r in rows:
            if r[1] == 429:
                denied_by[r[2]] = denied_by.get(r[2], 0) + 1
        results[name] = {
            "requests": len(rows),
            "200": statuses.count(200),
            "429": statuses.count(429),
            "other": sum(1 for s in statuses if s not in (200, 429)),
            "errors": sum(1 for r in rows if r[4]),
            "denied_by": denied_by,
            "max_latency_ms": 1000 * max((r[3] for r in rows), default=0),
            "span_s": (max(r[0] for r in rows) - min(r[0] for r in rows)) if rows else 0,
        }
    results["greedy"]["ideal"] = greedy_ideal(legit.results["greedy"]) if legit.results["greedy"] else 0
    slot_bytes = (rss_before - control_rss) * 2**20 / (2 * MAX_KEYS)
    return {
        "config": config,
        "load": {k: v for k, v in load.items() if k != "stdout"},
        "flood_seconds": flood_seconds,
        "rss": {"control": control_rss, "before": rss_before, "max_during": max(during, default=float("nan")),
                "end_of_flood": rss_end, "after": rss_after, "samples": during},
        "counters": delta,
        "http": {k: http.get(f"http.bench.downstream_rq_{k}", 0) for k in ("2xx", "4xx", "5xx", "completed")},
        "legit": results,
        "slot_bytes": slot_bytes,
    }


# ---------------------------------------------------------------------------------------------
# (b) Mixed traffic with the service and Redis


def mixed(envoy_bin, workdir, args):
    seconds = int(args.minutes * 60)
    redis = rl.Redis(workdir)
    service = None
    envoy = None
    sampler = None
    try:
        redis.start()
        service = rl.Service(workdir, redis, rl.service_binary())
        service.start()
        envoy = rl.make_envoy(envoy_bin, "mixed", mixed_config(), workdir,
                              clusters=[bench.service_cluster(service.port)])
        envoy.start()
        time.sleep(1)

        def probe():
            http = envoy.stats()
            return {"envoy": envoy.rss_mib(), "service": service.rss_mib(), "redis": redis.rss_mib(),
                    "5xx": http.get("http.bench.downstream_rq_5xx", 0),
                    "completed": http.get("http.bench.downstream_rq_completed", 0)}

        sampler = rl.Sampler(probe, 10.0, time.monotonic() + seconds + 120)
        sampler.start()
        script = workdir / "mixed.lua"
        script.write_text(MIXED_LUA)
        log(f"mixed: {seconds}s of wrk -t2 -c{args.mixed_connections}, one request per connection every "
            f"{args.delay_ms} ms; RSS every 10 s")
        load = rl.wrk(envoy.port, seconds, args.mixed_connections, 2, script,
                      env={"DELAY_MS": str(args.delay_ms)})
        time.sleep(1.5)
        sampler.take()
        sampler.stop()
        stats = rl.wasm_counters(envoy)
        http = envoy.stats()
    finally:
        if sampler:
            sampler.stop()
        if envoy:
            envoy.stop()
        if service:
            service.stop()
        redis.stop()

    samples = [s for s in sampler.samples if "envoy" in s]
    warm = args.warmup_seconds
    after_warmup = next((s for s in samples if s["t"] >= warm), samples[0])
    return {
        "config": mixed_config(),
        "seconds": seconds,
        "load": {k: v for k, v in load.items() if k != "stdout"},
        "counters": stats,
        "http": {k: http.get(f"http.bench.downstream_rq_{k}", 0) for k in ("2xx", "4xx", "5xx", "completed")},
        "samples": samples,
        "after_warmup": after_warmup,
        "end": samples[-1],
    }


# ---------------------------------------------------------------------------------------------
# Report


def report(info, args, a, b):
    """Each part has its own section ("soak-flood", "soak-mixed"), so that a run of one part
    (--skip-mixed, --skip-flood) leaves the other's figures in place."""
    facts = rl.facts_lines(info, "python3 bench/soak.py" + "".join(" " + x for x in sys.argv[1:])
                           + (f" (SOAK_MINUTES={os.environ['SOAK_MINUTES']})" if "SOAK_MINUTES" in os.environ else ""))
    printed = []
    if a:
        lines = []
        load, rss, c, legit = a["load"], a["rss"], a["counters"], a["legit"]
        s = load["script"]
        width = 1  # each table holds one token bucket: 1 state word
        name_bytes = len("sluice/bench/") + 16 + 1 + len(str(MAX_KEYS))
        value_bytes = 8 * (2 + width)
        per_table_mib = (MAX_KEYS + 1) * a["slot_bytes"] / 2**20
        lines += [
            "### (a) A flood of new keys against max_keys 10,000",
            "",
            *facts,
            "",
            f"One Envoy, 2 workers (`--concurrency 2`, not pinned), `GET /api/items`. Policies: `per-user` "
            f"(`x-user-id`, {USER_RATE}/s, burst {USER_BURST}: a token back every 100 ms) and `per-api-key` "
            f"(`x-api-key`, {KEY_RATE_PER_H}/h, burst {KEY_BURST}: a token back every 1.8 s), each `max_keys` "
            f"{MAX_KEYS:,}: two tables of {MAX_KEYS + 1:,} slots (with the overflow slot). wrk "
            f"(`-t2 -c{args.connections}`, a Lua script) sent every request with a new `x-user-id` and "
            f"`x-api-key`, stopping after {args.flood_keys:,}; two legitimate clients on their own "
            f"keep-alive connections ran from {LEGIT_LEAD:.0f} s before to {LEGIT_LEAD:.0f} s after it.",
            "",
            *rl.table(
                ["Flood", "Value"],
                [
                    ["requests sent (each a new key)", f"{s.get('flood_sent', load['requests']):,}"],
                    ["took", f"{a['flood_seconds']:.1f} s ({load['rps']:,.0f} requests/s)"],
                    ["200 / 429 / other", f"{s.get('flood_200', 0):,} / {s.get('flood_429', 0):,} / {s.get('flood_other', 0):,}"],
                    ["socket errors", f"{load['socket_errors']:,}"],
                    ["Envoy 5xx (`downstream_rq_5xx`)", f"{a['http']['5xx']:,}"],
                    ["`sluice.evictions`", f"{c.get('sluice.evictions', 0):,}"],
                    ["`per-user` allowed / denied", f"{c.get(bench.policy_counter('per-user', 'allowed'), 0):,} / {c.get(bench.policy_counter('per-user', 'denied'), 0):,}"],
                    ["`per-api-key` allowed / denied", f"{c.get(bench.policy_counter('per-api-key', 'allowed'), 0):,} / {c.get(bench.policy_counter('per-api-key', 'denied'), 0):,}"],
                    ["`cas_retries` / `cas_exhausted`", f"{c.get('sluice.cas_retries', 0):,} / {c.get('sluice.cas_exhausted', 0):,}"],
                ],
            ),
            "",
            *rl.table(
                ["Envoy RSS", "MiB"],
                [
                    ["same filter with max_keys 1 (control)", f"{rss['control']:.1f}"],
                    ["before the flood (2 x 10,001 slots created)", f"{rss['before']:.1f}"],
                    ["largest sample during the flood (every 1 s)", f"{rss['max_during']:.1f}"],
                    ["at the end of the flood", f"{rss['end_of_flood']:.1f}"],
                    [f"{LEGIT_LEAD + 1.5:.1f} s later", f"{rss['after']:.1f}"],
                ],
            ),
            "",
            "RSS samples during the flood (MiB, every second): "
            + " ".join(f"{x:.1f}" for x in rss["samples"]) + ".",
            "",
            *rl.table(
                ["Legitimate client", "Rate", "Requests", "200", "429 (by policy)", "Errors / other", "Expected", "Worst latency"],
                [
                    ["`steady` (`x-user-id` and `x-api-key`, under both limits)", f"{STEADY_RATE}/s",
                     legit["steady"]["requests"], legit["steady"]["200"],
                     f"{legit['steady']['429']} {legit['steady']['denied_by'] or ''}".strip(),
                     f"{legit['steady']['errors']} / {legit['steady']['other']}",
                     f"all {legit['steady']['requests']} 200", f"{legit['steady']['max_latency_ms']:.0f} ms"],
                    ["`greedy` (`x-user-id` only, twice per-user's rate)", f"{GREEDY_RATE}/s",
                     legit["greedy"]["requests"], legit["greedy"]["200"],
                     f"{legit['greedy']['429']} {legit['greedy']['denied_by'] or ''}".strip(),
                     f"{legit['greedy']['errors']} / {legit['greedy']['other']}",
                     f"{USER_BURST} + {USER_RATE} x {legit['greedy']['span_s']:.2f} s = {legit['greedy']['ideal']:.1f} 200",
                     f"{legit['greedy']['max_latency_ms']:.0f} ms"],
                ],
            ),
            "",
            f"**The bound per policy.** A table holds `max_keys` + 1 slots, whatever the number of keys: "
            f"here {MAX_KEYS + 1:,} per key layout. Each slot is a {name_bytes}-byte name and a "
            f"{value_bytes}-byte value (8 x (2 + state words); one token bucket = 1 word), plus Envoy's "
            f"per-entry overhead: measured here as (RSS before − control RSS) / {2 * MAX_KEYS:,} slots = "
            f"**{a['slot_bytes']:.0f} bytes per slot**, so about {per_table_mib:.1f} MiB per table of "
            f"{MAX_KEYS:,} keys, allocated when the filter is configured.",
        ]
        rl.write_section("soak-flood", lines)
        printed += lines
    if b:
        lines = []
        load, c, http = b["load"], b["counters"], b["http"]
        s = load["script"]
        warm, end = b["after_warmup"], b["end"]

        def growth(key):
            return f"{warm[key]:.1f} → {end[key]:.1f} ({end[key] - warm[key]:+.1f})"

        policies = [p["name"] for p in b["config"]["policies"]]
        lines += [
            f"### (b) Mixed traffic, {b['seconds'] / 60:g} minutes, with the service and Redis",
            "",
            *facts,
            "",
            "redis-server, sluice-service and one Envoy (2 workers). Policies on `/api/`: `local-user` "
            "(local, 40/s burst 40 per `x-user-id`), `global-user` (global, 30/s burst 30, lease 5, "
            "failure_mode open) and `global-tenant` (global, 1000/s per `x-tenant`, failure_mode "
            "**closed**); callout timeout 100 ms. wrk (`-t2 -c"
            f"{args.mixed_connections}`, a Lua script) paced each connection to one request every "
            f"{args.delay_ms} ms: users u0..u19 (u0 a third of all requests, so often denied), tenants "
            "t0..t3, and 1 in 30 requests to `/health` (no policy). RSS sampled every 10 s; "
            f"\"after warm-up\" is the first sample at or after {args.warmup_seconds} s.",
            "",
            *rl.table(
                ["Mixed", "Value"],
                [
                    ["requests", f"{load['requests']:,} ({load['rps']:,.0f}/s)"],
                    ["200 / 429", f"{s.get('mixed_200', 0):,} / {s.get('mixed_429', 0):,}"],
                    ["503 / other 5xx / other", f"{s.get('mixed_503', 0):,} / {s.get('mixed_5xx', 0):,} / {s.get('mixed_other', 0):,}"],
                    ["Envoy `downstream_rq_5xx`", f"{http['5xx']:,}"],
                    ["socket errors", f"{load['socket_errors']:,}"],
                    ["latency p50 / p99 / max", f"{load['p50_ms']:.2f} / {load['p99_ms']:.2f} / {load['max_ms']:.1f} ms"],
                    ["callouts / callout_failures", f"{c.get('sluice.callouts', 0):,} / {c.get('sluice.callout_failures', 0):,}"],
                ]
                + [
                    [f"`{p}` allowed / denied / degraded",
                     f"{c.get(bench.policy_counter(p, 'allowed'), 0):,} / {c.get(bench.policy_counter(p, 'denied'), 0):,} / {c.get(bench.policy_counter(p, 'degraded'), 0):,}"]
                    for p in policies
                ],
            ),
            "",
            *rl.table(
                ["RSS (MiB)", "after warm-up → end (change)", "min", "max"],
                [
                    [name, growth(key), f"{min(x[key] for x in b['samples']):.1f}", f"{max(x[key] for x in b['samples']):.1f}"]
                    for name, key in [("Envoy", "envoy"), ("sluice-service", "service"), ("redis-server", "redis")]
                ],
            ),
            "",
            "Envoy RSS every 10 s (MiB): " + " ".join(f"{x['envoy']:.1f}" for x in b["samples"]) + ".",
            "",
            "sluice-service RSS every 10 s (MiB): " + " ".join(f"{x['service']:.1f}" for x in b["samples"]) + ".",
        ]
        rl.write_section("soak-mixed", lines)
        printed += [""] + lines
    return printed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flood-keys", type=int, default=1_000_000, help="distinct keys in the flood")
    parser.add_argument("--flood-max-seconds", type=int, default=600, help="bound on the flood's wrk run")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections of the flood")
    parser.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", "10")),
                        help="mixed traffic duration (default: $SOAK_MINUTES or 10)")
    parser.add_argument("--mixed-connections", type=int, default=8)
    parser.add_argument("--delay-ms", type=int, default=10, help="pause between a connection's requests")
    parser.add_argument("--warmup-seconds", type=int, default=60)
    parser.add_argument("--skip-flood", action="store_true")
    parser.add_argument("--skip-mixed", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args()
    for tool in ("wrk", "redis-server"):
        if not shutil.which(tool):
            sys.exit(f"soak: {tool} not found")
    if not bench.SLUICE_WASM.exists():
        sys.exit("soak: the wasm is missing: make build")

    rl.install_signal_handlers()
    envoy_bin = bench.run([str(rl.ROOT / "scripts" / "find-envoy")], timeout=600).strip()
    info = rl.facts(envoy_bin)
    # A bound on the whole run.
    signal.alarm(int((0 if args.skip_flood else args.flood_max_seconds + 180)
                     + (0 if args.skip_mixed else args.minutes * 60 + 180)))
    a = b = None
    with tempfile.TemporaryDirectory(prefix="sluice-soak-") as tmp:
        workdir = Path(tmp)
        if not args.skip_flood:
            a = flood(envoy_bin, workdir, args)
        if not args.skip_mixed:
            b = mixed(envoy_bin, workdir, args)
    signal.alarm(0)
    if args.json:
        rl.dump_json(args.json, {"info": info, "flood": a, "mixed": b})
    lines = report(info, args, a, b)
    print("\n".join(lines))
    log(f"wrote the soak section of {rl.REPORT.relative_to(rl.ROOT)}")


if __name__ == "__main__":
    try:
        main()
    except rl.Stop as stop:
        sys.exit(f"soak: {stop}")
