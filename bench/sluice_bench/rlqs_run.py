"""`bench/rlqs.py` (make bench-rlqs): Envoy's `rate_limit_quota` filter against sluice-service
--rlqs (issue 36), beside Envoy's ratelimit filter calling sluice-service --rls (a call per
request), Envoy's native `local_ratelimit` and no rate-limit filter at all, for the same traffic
(wrk, an `x-user-id` at random among 1,000), in three parts:

1. cost per request: each setup one Envoy (one worker) whose route leads to a second listener
   of the same Envoy, under closed-loop wrk, with a limit that refuses nothing; interleaved
   rounds, medians;
2. the service's CPU against the request rate: the RLS and the RLQS at two paced rates (wrk
   with a Lua `delay`), the same Envoy and buckets;
3. exactness: three Envoys sharing one budget, offered twice it split 70/20/10 (paced clients),
   through the RLQS, the RLS, and a static per-Envoy assignment (each Envoy a native
   local_ratelimit of the whole budget, what jukie/rlqs's static strategy amounts to).

Cores: Envoy and the service measured on SERVER_CORE (as in rls_run); wrk and Redis on LOAD_CORE.
Each service has a Redis of its own, so that each Redis's CPU is its service's."""

import contextlib
import json
import signal
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

from .builds import service_binary
from .envoy import Envoy, find_envoy
from .envoy_config import native_ratelimit_bootstrap, static_cluster
from .facts import command_line, facts
from .load import users_lua, Pacer, PacedClients, wrk_script
from .processes import (ENVOY_CORE, LOAD_CORE, Child, Failure, cpu_seconds, free_ports, install_signal_handlers,
                        log, machine_busy_seconds, require, run)
from .services import Redis

SERVER_CORE = ENVOY_CORE
DOMAIN = "bench"
KEY = "user"
# Part 1 and 2: a limit per user that refuses nothing; wrk's users.
HIGH_LIMIT = 1_000_000_000
KEYS = 1000
CONNECTIONS = 32
# Part 3: one budget (user=shared) for three Envoys, offered twice it split 70/20/10.
SHARED = "shared"
BUDGET_PER_MIN = 3000
SHARES = (0.7, 0.2, 0.1)
OFFERED_PER_S = [2 * BUDGET_PER_MIN / 60 * s for s in SHARES]
REPORTING_INTERVAL = "5s"

# The shared budget is a token bucket of 2 s of burst for the RLS, as the static assignment's and
# as the RLQS's assignments are (a fixed window would pass up to twice the budget in a window
# across its end), refused requests charging nothing (charged, as by default, a demand of twice
# the rate keeps the bucket in debt and refuses nearly everything); the RLQS reads the rule's
# requests per period whatever its algorithm.
LIMITS = f"""# sluice-service --rls-config (the RLS's and the RLQS's).
domain: {DOMAIN}
descriptors:
  - key: {KEY}
    value: {SHARED}
    rate_limit: {{algorithm: token_bucket, unit: minute, requests_per_unit: {BUDGET_PER_MIN}, burst: {BUDGET_PER_MIN // 30}, charge_refused: false}}
  - key: {KEY}
    rate_limit: {{unit: minute, requests_per_unit: {HIGH_LIMIT}}}
"""

USERS_LUA = users_lua(KEYS)

SETUPS = {
    "rls": "RLS: Envoy's `ratelimit` filter, sluice-service --rls",
    "rlqs": "RLQS: Envoy's `rate_limit_quota` filter, sluice-service --rlqs",
    "rlqs1": "RLQS, one bucket for every request (a constant bucket id)",
    "local": "Envoy's native `local_ratelimit`",
    "none": "no rate-limit filter",
}
# The service each setup asks (part 1's "rlqs1": the RLQS's, a constant bucket id).
SERVICE_OF = {"rls": "rls", "rlqs": "rlqs", "rlqs1": "rlqs"}
# Part 2's paced rates: wrk connections, each waiting DELAY_MS before its next request.
RATES = {"1x": 8, "4x": 32}
DELAY_MS = 16
EXACT_SETUPS = {
    "rlqs": "RLQS (shares of one budget)",
    "rls": "RLS (a call per request, Redis)",
    "static": "static: each Envoy a local_ratelimit of the whole budget",
}


class GrpcService(Child):
    """sluice-service serving the RLS (`mode` "rls") or the RLQS ("rlqs") over its own Redis."""

    def __init__(self, workdir, mode, redis, binary, limits):
        super().__init__(workdir, core=SERVER_CORE)
        self.mode, self.redis, self.binary, self.limits = mode, redis, binary, limits
        self.name = f"service-{mode}"

    def command(self):
        return [str(self.binary), f"--{self.mode}", f"127.0.0.1:{self.port}", "--rls-config", str(self.limits),
                "--redis", self.redis.url, "--log", "warn"]

    def ready(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False


def rlqs_filter(cluster, per_user=True):
    """Envoy's rate_limit_quota filter: a bucket per `x-user-id` value, `{user: <value>}`, or
    (`per_user` False) one bucket, `{user: all}`, for every request."""
    user = ({"custom_value": {
        "name": "user",
        "typed_config": {"@type": "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput",
                         "header_name": "x-user-id"}}} if per_user else {"string_value": "all"})
    settings = {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings",
        "bucket_id_builder": {"bucket_id_builder": {KEY: user}},
        "reporting_interval": REPORTING_INTERVAL,
        "no_assignment_behavior": {"fallback_rate_limit": {"blanket_rule": "ALLOW_ALL"}},
        "expired_assignment_behavior": {"expired_assignment_behavior_timeout": "60s",
                                        "fallback_rate_limit": {"blanket_rule": "ALLOW_ALL"}},
    }
    return {
        "name": "envoy.filters.http.rate_limit_quota",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig",
            "domain": DOMAIN,
            "rlqs_server": {"envoy_grpc": {"cluster_name": cluster}},
            "bucket_matchers": {"on_no_match": {"action": {"name": "bucket", "typed_config": settings}}},
        },
    }


def local_filter(per_s, burst):
    """Envoy's native local_ratelimit: `per_s` tokens a second, at most `burst`; no response headers."""
    percent = {"numerator": 100, "denominator": "HUNDRED"}
    return {
        "name": "envoy.filters.http.local_ratelimit",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
            "stat_prefix": "bench_local",
            "token_bucket": {"max_tokens": burst, "tokens_per_fill": per_s, "fill_interval": "1s"},
            "filter_enabled": {"runtime_key": "bench_local_enabled", "default_value": percent},
            "filter_enforced": {"runtime_key": "bench_local_enforced", "default_value": percent},
        },
    }


def setup_bootstrap(setup, port, admin_port, backend_port, service_port, static_per_s=None):
    """The same two listeners for every setup (rls_run's: the front one's route leads to a second
    listener that answers "ok"); only the front's rate-limit filter differs."""
    config = native_ratelimit_bootstrap(port, admin_port, backend_port, service_port or 1, DOMAIN, KEY)
    if setup == "rls":
        return config
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    route = hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    route.pop("rate_limits")
    router = hcm["http_filters"][-1]
    clusters = config["static_resources"]["clusters"]
    if setup in ("rlqs", "rlqs1"):
        hcm["http_filters"] = [rlqs_filter("rls", per_user=setup == "rlqs"), router]
    elif setup == "local":
        hcm["http_filters"] = [local_filter(HIGH_LIMIT, HIGH_LIMIT), router]
    elif setup == "static":
        hcm["http_filters"] = [local_filter(static_per_s, 2 * static_per_s), router]
    else:
        hcm["http_filters"] = [router]
    if setup not in ("rlqs", "rlqs1"):
        config["static_resources"]["clusters"] = [c for c in clusters if c["name"] != "rls"]
    return config


class SetupEnvoy(Envoy):
    """An Envoy (one worker) of `setup`, pinned to SERVER_CORE unless `pin` is False."""

    def __init__(self, envoy_bin, setup, service, workdir, pin=True, name=None, static_per_s=None):
        super().__init__(envoy_bin, name or setup, [], workdir, pin=pin)
        self.setup, self.service, self.static_per_s = setup, service, static_per_s

    def command(self):
        backend_port = free_ports(1)[0]
        config = self.workdir / f"{self.name}.json"
        config.write_text(json.dumps(setup_bootstrap(self.setup, self.port, self.admin_port, backend_port,
                                                     self.service.port if self.service else None,
                                                     self.static_per_s)))
        return [self.envoy, "-c", str(config), "--concurrency", "1", "--disable-hot-restart", "-l", "warn"]


def run_rlqs(args):
    require("redis-server", "taskset", "wrk", hint=" (apt-get install redis-server wrk util-linux)")
    install_signal_handlers()
    started = time.monotonic()
    binary = service_binary()
    envoy_bin = find_envoy()
    info = facts(envoy_bin, command_line("rlqs.py"))
    info["redis"] = run(["redis-server", "--version"], timeout=30).strip()
    info["service"] = str(binary)
    info["service_version"] = run([str(binary), "--version"], timeout=30).strip()
    bound = (args.rounds * len(SETUPS) * (args.warmup + args.duration + 5)
             + args.rate_rounds * 4 * (args.rate_warmup + args.rate_duration + 5)
             + len(EXACT_SETUPS) * (args.exact_warmup + args.exact_window + 20) + 300)
    signal.alarm(int(bound))
    try:
        with tempfile.TemporaryDirectory(prefix="sluice-rlqs-") as tmp:
            result = measure(Path(tmp), binary, envoy_bin, args)
    finally:
        signal.alarm(0)
    info["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    return {"info": info, "args": vars(args), "limits": LIMITS, **result,
            "elapsed_s": time.monotonic() - started}


def measure(workdir, binary, envoy_bin, args):
    (workdir / "limits").mkdir()
    (workdir / "limits" / "limits.yaml").write_text(LIMITS)
    with contextlib.ExitStack() as stack:
        services, redises = {}, {}
        for mode in ("rls", "rlqs"):
            (workdir / mode).mkdir()
            redises[mode] = stack.enter_context(Redis(workdir / mode, core=LOAD_CORE))
            redises[mode].start(30)
            services[mode] = stack.enter_context(GrpcService(workdir, mode, redises[mode], binary,
                                                             workdir / "limits"))
            services[mode].start(30)
        envoys = {}
        for setup in SETUPS:
            envoys[setup] = stack.enter_context(SetupEnvoy(envoy_bin, setup, services.get(SERVICE_OF.get(setup)),
                                                           workdir))
            envoys[setup].start()
        cost = {}
        for r in range(1, args.rounds + 1):
            for setup in SETUPS:
                mode = SERVICE_OF.get(setup)
                sample = measure_load(envoys[setup], services.get(mode), redises.get(mode), workdir,
                                      args.warmup, args.duration, CONNECTIONS, None)
                cost.setdefault(setup, []).append(sample)
                log_sample(f"cost round {r}/{args.rounds} {setup}", sample)
        rates = {}
        for r in range(1, args.rate_rounds + 1):
            for setup in ("rls", "rlqs"):
                for rate, connections in RATES.items():
                    sample = measure_load(envoys[setup], services[setup], redises[setup], workdir,
                                          args.rate_warmup, args.rate_duration, connections, DELAY_MS)
                    rates.setdefault(f"{setup}/{rate}", []).append(sample)
                    log_sample(f"rate round {r}/{args.rate_rounds} {setup} {rate}", sample)
        for envoy in envoys.values():
            envoy.stop()
        exact = {}
        for setup in EXACT_SETUPS:
            exact[setup] = measure_exact(setup, envoy_bin, services, redises, workdir, args, stack)
            log(f"exact {setup}: admitted {exact[setup]['admitted']} of {exact[setup]['sent']} "
                f"({exact[setup]['admitted_over_limit']:.3f} of the limit) per Envoy {exact[setup]['per_envoy']}")
    return {"cost": cost, "rates": rates, "exact": exact, "summary": summarize(cost, rates)}


def measure_load(envoy, service, redis, workdir, warmup, duration, connections, delay_ms):
    """wrk through `envoy` (closed loop, or each connection waiting `delay_ms` between requests):
    requests/s, latency, and the CPU of Envoy, the service and its Redis."""
    lua = USERS_LUA + (f"\nfunction delay()\n  return {delay_ms}\nend\n" if delay_ms else "")
    if warmup:
        wrk_script(envoy.port, warmup, connections, 1, lua, workdir, core=LOAD_CORE)
    pids = [envoy.pid] + ([service.pid, redis.pid] if service else [])
    machine = machine_busy_seconds()
    before = [cpu_seconds(p) for p in pids]
    result = wrk_script(envoy.port, duration, connections, 1, lua, workdir, core=LOAD_CORE)
    used = [cpu_seconds(p) - b for p, b in zip(pids, before)]
    busy = machine_busy_seconds() - machine
    result.pop("stdout", None)
    result.pop("script", None)
    requests, seconds = max(result["requests"], 1), result["seconds"]
    envoy_cpu = used[0]
    service_cpu, redis_cpu = (used[1], used[2]) if service else (None, None)
    result.update(
        envoy_cpu_us_per_request=envoy_cpu / requests * 1e6,
        envoy_cpu_share=envoy_cpu / seconds,
        service_cpu_us_per_request=service_cpu / requests * 1e6 if service else None,
        service_cpu_share=service_cpu / seconds if service else None,
        redis_cpu_us_per_request=redis_cpu / requests * 1e6 if service else None,
        redis_cpu_share=redis_cpu / seconds if service else None,
        machine_busy_cores=busy / seconds,
        loadavg=Path("/proc/loadavg").read_text().split()[:3],
    )
    return result


def measure_exact(setup, envoy_bin, services, redises, workdir, args, stack):
    """Three Envoys of `setup` sharing the budget of `user=shared`, paced at OFFERED_PER_S: what
    they admitted in a window of `args.exact_window` s after `args.exact_warmup` s."""
    kind = "static" if setup == "static" else setup
    service = services.get(setup)
    envoys = []
    for i in range(len(SHARES)):
        envoy = stack.enter_context(SetupEnvoy(envoy_bin, kind, service, workdir, pin=False,
                                               name=f"exact-{setup}-{i}", static_per_s=BUDGET_PER_MIN // 60))
        envoy.start()
        envoys.append(envoy)
    records = [[] for _ in envoys]
    lock = threading.Lock()

    def recorder(i):
        def record(sent_at, result):
            with lock:
                records[i].append((sent_at, result[0]))
        return record

    start = time.monotonic()
    total = args.exact_warmup + args.exact_window
    pids = [e.pid for e in envoys] + ([service.pid, redises[setup].pid] if service else [])
    before = None
    pacers = [Pacer(e.port, rate, "/api/items", {"x-user-id": SHARED}, recorder(i), start + total + 0.5)
              for i, (e, rate) in enumerate(zip(envoys, OFFERED_PER_S))]
    with PacedClients(pacers):
        time.sleep(args.exact_warmup)
        before = [cpu_seconds(p) for p in pids]
        time.sleep(args.exact_window)
        used = [cpu_seconds(p) - b for p, b in zip(pids, before)]
        time.sleep(0.6)
    lo, hi = start + args.exact_warmup, start + total
    per_envoy = []
    for rows in records:
        window = [status for at, status in rows if lo <= at < hi]
        per_envoy.append({"sent": len(window), "admitted": sum(1 for s in window if s == 200),
                          "refused": sum(1 for s in window if s == 429),
                          "other": sum(1 for s in window if s not in (200, 429)),
                          "warmup_admitted": sum(1 for at, s in rows if at < lo and s == 200),
                          "warmup_sent": sum(1 for at, _ in rows if at < lo)})
    for envoy in envoys:
        envoy.stop()
    limit = BUDGET_PER_MIN * args.exact_window / 60
    admitted = sum(e["admitted"] for e in per_envoy)
    return {
        "limit": limit,
        "admitted": admitted,
        "sent": sum(e["sent"] for e in per_envoy),
        "admitted_over_limit": admitted / limit,
        "per_envoy": per_envoy,
        "envoy_cpu_s": sum(used[:len(envoys)]),
        "service_cpu_s": used[len(envoys)] if service else None,
        "redis_cpu_s": used[len(envoys) + 1] if service else None,
    }


FIGURES = ("rps", "p50_ms", "p99_ms", "envoy_cpu_us_per_request", "envoy_cpu_share", "service_cpu_us_per_request",
           "service_cpu_share", "redis_cpu_us_per_request", "redis_cpu_share", "non2xx", "socket_errors",
           "machine_busy_cores")


def median_of(samples):
    out = {}
    for name in FIGURES:
        values = [s[name] for s in samples if s.get(name) is not None]
        out[name] = statistics.median(values) if values else None
    return out


def summarize(cost, rates):
    return {"cost": {k: median_of(v) for k, v in cost.items()},
            "rates": {k: median_of(v) for k, v in rates.items()}}


def log_sample(where, s):
    service = (f" + service {s['service_cpu_us_per_request']:.1f} µs/req ({100 * s['service_cpu_share']:.1f}% "
               f"of a core) + Redis {s['redis_cpu_us_per_request']:.1f}" if s["service_cpu_share"] is not None else "")
    log(f"{where}: {s['rps']:>8,.0f} req/s p50 {s['p50_ms']:.3f} p99 {s['p99_ms']:.3f} ms  Envoy "
        f"{s['envoy_cpu_us_per_request']:.1f} µs/req{service}  non-2xx {s['non2xx']}  machine "
        f"{s['machine_busy_cores']:.2f} cores busy")
