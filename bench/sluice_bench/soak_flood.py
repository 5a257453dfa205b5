"""`make soak`, part (a) (bench/soak.py tells the design): requests with new keys flooding three
tables of max_keys 10,000 through one Envoy while two legitimate clients send at fixed rates,
newcomers arrive and drained keys ask again; Envoy's RSS every second, the clients' answers and
the filter's counters."""

import threading
import time

from .envoy import sluice_envoy
from .load import Client, PacedClients, Pacer, wrk_script
from .measure import Sampler
from .processes import log

MAX_KEYS = 10_000
# per-user: 10/s, burst 10 (a token back every 100 ms: a one-request key is idle again soon).
USER_RATE, USER_BURST = 10, 10
# per-api-key: 2000/h, burst 2000 (a token back every 1.8 s: flood slots still owe their token
# when new keys take them).
KEY_RATE_PER_H, KEY_BURST = 2000, 2000
# per-client: 10/h, burst 10 (a token back every 6 minutes, longer than the flood): newcomers
# get exactly their burst, and a drained key stays drained unless it is forgotten.
CLIENT_RATE_PER_H, CLIENT_BURST = 10, 10
NEWCOMERS, DRAINED = 20, 5
STEADY_RATE, GREEDY_RATE = 5, 20
LEGIT_LEAD = 2.0  # seconds the legitimate clients run before and after the flood
FLOOD_THREADS = 2

FLOOD_LUA = r"""
-- Each request a new x-user-id, x-api-key and x-client-id; each thread stops after
-- FLOOD_PER_THREAD.
-- Globals, so that done() can read them from every thread.
flood_sent, flood_200, flood_429, flood_other = 0, 0, 0, 0
local limit = tonumber(os.getenv("FLOOD_PER_THREAD"))

function request()
  flood_sent = flood_sent + 1
  local key = id .. "-" .. flood_sent
  return wrk.format("GET", "/api/items", {["x-user-id"] = "fu" .. key, ["x-api-key"] = "fk" .. key,
                                          ["x-client-id"] = "fc" .. key})
end

function response(status, headers, body)
  if status == 200 then flood_200 = flood_200 + 1
  elseif status == 429 then flood_429 = flood_429 + 1
  else flood_other = flood_other + 1 end
  if flood_sent >= limit then wrk.thread:stop() end
end

function done(summary, latency, requests)
  print_totals({"flood_sent", "flood_200", "flood_429", "flood_other"})
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
            {"name": "per-client", "match": {"path_prefix": "/api/"}, "key": ["header:x-client-id"],
             "requests": CLIENT_RATE_PER_H, "per": "1h", "burst": CLIENT_BURST, "max_keys": max_keys},
        ],
    }


class Legit:
    """The legitimate clients, `steady` and `greedy`, and what each got: (sent at, status,
    denying policy, latency, error) per request."""

    def __init__(self, port, deadline):
        self.lock = threading.Lock()
        self.results = {"steady": [], "greedy": []}
        steady = {"x-user-id": "steady-user", "x-api-key": "steady-key"}
        greedy = {"x-user-id": "greedy-user"}
        self.clients = PacedClients([
            Pacer(port, STEADY_RATE, "/api/items", steady, self.recorder("steady"), deadline),
            Pacer(port, GREEDY_RATE, "/api/items", greedy, self.recorder("greedy"), deadline),
        ])

    def recorder(self, name):
        def record(sent, result):
            status, _headers, body, latency, error = result
            policy = None
            if status == 429:
                text = body.decode(errors="replace")
                policy = text.split('"policy":"', 1)[-1].split('"', 1)[0] if '"policy"' in text else "?"
            with self.lock:
                self.results[name].append((sent, status, policy, latency, error))

        return record

    def sent(self):
        with self.lock:
            return sum(len(r) for r in self.results.values())

    def summary(self):
        results = {name: client_summary(rows) for name, rows in self.results.items()}
        results["greedy"]["ideal"] = greedy_ideal(self.results["greedy"]) if self.results["greedy"] else 0
        return results


def client_statuses(port, client_id, n):
    """`n` requests of one x-client-id on one keep-alive connection: their statuses."""
    client = Client(port)
    try:
        return [client.get("/api/items", {"x-client-id": client_id})[0] for _ in range(n)]
    finally:
        client.close()


class Newcomers(threading.Thread):
    """Keys never seen before, during the flood: newcomer i sends per-client's burst + 3 requests
    once the flood is (i + 1) / (NEWCOMERS + 2) through (`follow` says how far it is), and the
    keys drained before the flood ask once half-way."""

    def __init__(self, port, deadline):
        super().__init__(daemon=True)
        self.port, self.deadline = port, deadline
        self.progress, self.total = (lambda: 0), 1
        self.newcomers, self.drained = {}, {}

    def follow(self, progress, total):
        self.progress, self.total = progress, total
        self.start()

    def run(self):
        for i in range(NEWCOMERS):
            while self.progress() < self.total * (i + 1) // (NEWCOMERS + 2):
                if time.monotonic() > self.deadline:
                    return
                time.sleep(0.2)
            self.newcomers[f"newcomer-{i}"] = client_statuses(self.port, f"newcomer-{i}", CLIENT_BURST + 3)
            if i == NEWCOMERS // 2:
                self.drained = {k: client_statuses(self.port, k, 1) for k in drained_keys()}


def drained_keys():
    return [f"drained-{k}" for k in range(DRAINED)]


def client_summary(rows):
    statuses = [r[1] for r in rows]
    denied_by = {}
    for r in rows:
        if r[1] == 429:
            denied_by[r[2]] = denied_by.get(r[2], 0) + 1
    return {
        "requests": len(rows),
        "200": statuses.count(200),
        "429": statuses.count(429),
        "other": sum(1 for s in statuses if s not in (200, 429)),
        "errors": sum(1 for r in rows if r[4]),
        "denied_by": denied_by,
        "max_latency_ms": 1000 * max((r[3] for r in rows), default=0),
        "span_s": (max(r[0] for r in rows) - min(r[0] for r in rows)) if rows else 0,
    }


def greedy_ideal(results):
    """burst + rate x (last - first): what a token bucket admits to a client that always wants
    more than it may have, from a full bucket."""
    sent = [r[0] for r in results]
    return USER_BURST + USER_RATE * (max(sent) - min(sent))


def control_rss(envoy_bin, workdir):
    """The RSS of the same filter with max_keys 1, before any request: what Envoy weighs
    without the tables."""
    with sluice_envoy(envoy_bin, "flood-control", flood_config(1), workdir) as control:
        control.start()
        time.sleep(2)
        return control.rss_mib()


def flood(envoy_bin, workdir, args):
    config = flood_config(MAX_KEYS)
    control = control_rss(envoy_bin, workdir)
    with sluice_envoy(envoy_bin, "flood", config, workdir) as envoy:
        envoy.start()
        time.sleep(2)
        drained_before = {k: client_statuses(envoy.port, k, CLIENT_BURST + 1) for k in drained_keys()}
        rss_before, counters_before = envoy.rss_mib(), envoy.wasm_counters()
        log(f"Envoy up: RSS {rss_before:.1f} MiB with three empty tables of {MAX_KEYS:,} keys "
            f"({control:.1f} MiB with max_keys 1)")
        bound = time.monotonic() + args.flood_max_seconds + 120
        legit = Legit(envoy.port, bound)
        newcomers = Newcomers(envoy.port, bound)
        with Sampler(lambda: {"rss": envoy.rss_mib()}, 1.0, bound) as sampler:
            with legit.clients:
                time.sleep(LEGIT_LEAD)
                started = time.monotonic()
                load = send_flood(envoy, workdir, args, legit, newcomers)
                flood_seconds = time.monotonic() - started
                rss_end = envoy.rss_mib()
                newcomers.join(timeout=30)
                drained_after = {k: client_statuses(envoy.port, k, 1) for k in drained_keys()}
                time.sleep(LEGIT_LEAD)
            time.sleep(1.5)  # the filter flushes its counters once a second
            counters, http, rss_after = envoy.wasm_counters(), envoy.downstream_counts(), envoy.rss_mib()
    during = [s["rss"] for s in sampler.samples if "rss" in s]
    return {
        "config": config,
        "load": {k: v for k, v in load.items() if k != "stdout"},
        "flood_seconds": flood_seconds,
        "rss": {"control": control, "before": rss_before, "max_during": max(during, default=float("nan")),
                "end_of_flood": rss_end, "after": rss_after, "samples": during},
        "counters": {k: counters.get(k, 0) - counters_before.get(k, 0) for k in counters},
        "http": http,
        "legit": legit.summary(),
        "newcomers": newcomers.newcomers,
        "drained": {"before": drained_before, "during": newcomers.drained, "after": drained_after},
        "key_bytes": (rss_after - rss_before) * 2**20 / (3 * MAX_KEYS),
    }


def send_flood(envoy, workdir, args, legit, newcomers):
    """wrk's flood: each Lua thread stops sending after its share, but wrk runs its whole -d; it
    is stopped once Envoy has answered the flood (what it completed, less the legitimate
    clients' and the newcomers' requests, which `newcomers` paces by it)."""
    per_thread = -(-args.flood_keys // FLOOD_THREADS)
    log(f"flood: {per_thread * FLOOD_THREADS:,} requests with new keys (wrk -t{FLOOD_THREADS} "
        f"-c{args.connections}, at most {args.flood_max_seconds}s); legitimate: steady {STEADY_RATE}/s, "
        f"greedy {GREEDY_RATE}/s")
    completed_before, legit_before = envoy.downstream_counts()["completed"], legit.sent()

    def answered():
        newcomer_requests = sum(map(len, newcomers.newcomers.values())) + len(newcomers.drained)
        others = legit.sent() - legit_before + newcomer_requests
        return envoy.downstream_counts()["completed"] - completed_before - others

    newcomers.follow(answered, per_thread * FLOOD_THREADS)
    return wrk_script(envoy.port, args.flood_max_seconds, args.connections, FLOOD_THREADS, FLOOD_LUA, workdir,
                      env={"FLOOD_PER_THREAD": str(per_thread)},
                      until=all_answered(answered, per_thread * FLOOD_THREADS, args.connections))


def all_answered(answered, sent, in_flight):
    """wrk_script's `until` for the flood: true once `answered()` reaches `sent`, or once it is
    within `in_flight` (a request a connection) of it and has stopped growing since the last
    poll. A Lua thread that stops itself leaves the requests it had in flight unanswered, and
    it may stop right at its share, so waiting for all `sent` would last the whole -d."""
    last = None

    def done():
        nonlocal last
        now, before = answered(), last
        last = now
        return now >= sent or (now >= sent - in_flight and before is not None and now <= before)

    return done
