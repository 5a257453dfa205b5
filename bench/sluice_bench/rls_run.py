"""`bench/rls.py` (make bench-rls): sluice-service --rls side by side with Limitador, two
implementations of Envoy's Rate Limit Service, each given the same limit (a fixed window of a
billion calls a minute per `user` descriptor value: never refusing) on the same Redis, and in
memory; loaded directly over gRPC by the same load generator (service/examples/rls_load.rs), and
through Envoy's own ratelimit filter under wrk. Every measurement is interleaved (round 1: each
case, sluice then Limitador; round 2: the same ...) and the medians reported; rls.json keeps the
samples.

Cores: the server measured on SERVER_CORE; the load generator (or wrk) and Redis on LOAD_CORE.
Through Envoy, Envoy shares SERVER_CORE with the server, so that the requests/s Envoy reaches
answer for what both spend per request.

Limitador is measured when `LIMITADOR` names a limitador-server binary; without it its rows are
left out, and the report says so."""

import contextlib
import dataclasses
import json
import os
import signal
import socket
import statistics
import tempfile
import time
from pathlib import Path

from .builds import build_rls_load, build_service
from .envoy import Envoy, find_envoy
from .envoy_config import native_ratelimit_bootstrap
from .facts import command_line, facts, machine_facts
from .load import users_lua, wrk_script
from .processes import (ENVOY_CORE, LOAD_CORE, Child, Failure, children_cpu_seconds, cpu_seconds, free_ports,
                        install_signal_handlers, launch_prefix, log, machine_busy_seconds, require, run)
from .services import Redis

# The server measured gets Envoy's core of the other benchmarks.
SERVER_CORE = ENVOY_CORE
DOMAIN = "bench"
DESCRIPTOR_KEY = "user"
# A fixed window of this many calls a minute per descriptor value: never refused.
LIMIT = 1_000_000_000
# wrk's connections through Envoy, and the keys its requests spread over.
ENVOY_CONNECTIONS = 32
ENVOY_KEYS = 1000

SLUICE_LIMITS = f"""# sluice-service --rls-config: envoyproxy/ratelimit's format (a fixed window by default).
domain: {DOMAIN}
descriptors:
  - key: {DESCRIPTOR_KEY}
    rate_limit:
      requests_per_unit: {LIMIT}
      unit: minute
"""

# Limitador's format: a fixed window of `seconds`, a counter per value of `variables`.
LIMITADOR_LIMITS = f"""- namespace: {DOMAIN}
  max_value: {LIMIT}
  seconds: 60
  conditions: []
  variables:
    - "descriptors[0]['{DESCRIPTOR_KEY}']"
"""

# Each x-user-id of ENVOY_KEYS, at random.
USERS_LUA = users_lua(ENVOY_KEYS)


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    label: str
    keys: int
    concurrency: int


CASES = [
    Case("keys", "1,000 keys, 32 in flight", 1000, 32),
    Case("keys128", "1,000 keys, 128 in flight", 1000, 128),
    Case("hot32", "one hot key, 32 in flight", 1, 32),
    Case("hot", "one hot key, 128 in flight", 1, 128),
]
# Where the servers keep their counters.
BACKENDS = {"redis": "Redis", "memory": "in memory"}
SERVERS = {"sluice": "sluice-service --rls", "limitador": "Limitador"}


class RlsServer(Child):
    """A Rate Limit Service of ours, on SERVER_CORE; ready once a call answers OK."""

    def __init__(self, workdir, server, backend, redis, binary, limits, load_gen):
        super().__init__(workdir, core=SERVER_CORE)
        self.server, self.backend, self.redis, self.binary = server, backend, redis, binary
        self.limits, self.load_gen = limits, load_gen
        self.name = f"{server}-{backend}"

    def ready(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def start(self, timeout=30):
        super().start(timeout)
        run(launch_prefix(LOAD_CORE) + [str(self.load_gen), "--target", f"127.0.0.1:{self.port}", "--domain",
                                        DOMAIN, "--key", DESCRIPTOR_KEY, "--probe", str(timeout)],
            timeout=timeout + 10)
        return self


class SluiceRls(RlsServer):
    def command(self):
        store = ["--redis", self.redis.url] if self.backend == "redis" else ["--memory"]
        return [str(self.binary), "--rls", f"127.0.0.1:{self.port}", "--rls-config", str(self.limits), *store,
                "--log", "warn"]


class Limitador(RlsServer):
    def command(self):
        store = ["redis", self.redis.url] if self.backend == "redis" else ["memory"]
        http_port = free_ports(1)[0]
        return [str(self.binary), "--rls-ip", "127.0.0.1", "--rls-port", str(self.port), "--http-ip", "127.0.0.1",
                "--http-port", str(http_port), str(self.limits), *store]


class RlsEnvoy(Envoy):
    """An Envoy (one worker, on SERVER_CORE) whose own ratelimit filter asks `server`."""

    def __init__(self, envoy_bin, server, workdir):
        super().__init__(envoy_bin, f"rls-{server.name}", [], workdir)
        self.server = server

    def command(self):
        backend_port = free_ports(1)[0]
        config = self.workdir / f"{self.name}.json"
        config.write_text(json.dumps(native_ratelimit_bootstrap(self.port, self.admin_port, backend_port,
                                                                self.server.port, DOMAIN, DESCRIPTOR_KEY)))
        return [self.envoy, "-c", str(config), "--concurrency", "1", "--disable-hot-restart", "-l", "warn"]

    def ratelimit_counts(self):
        """The filter's answers: ok, over_limit, error, failure_mode_allowed."""
        stats = self.stats()
        return {k: stats.get(f"cluster.backend.ratelimit.{k}", 0) for k in ("ok", "over_limit", "error",
                                                                            "failure_mode_allowed")}


def limitador_binary():
    """$LIMITADOR, the limitador-server to compare with, or None."""
    chosen = os.environ.get("LIMITADOR")
    if not chosen:
        return None
    path = Path(chosen).expanduser().resolve()
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise Failure(f"LIMITADOR={chosen} is not an executable file")
    return path


def run_rls(args):
    """Every measurement, interleaved; what rls.json keeps."""
    require("redis-server", "taskset", "wrk", "cargo", hint=" (apt-get install redis-server wrk util-linux)")
    if (os.cpu_count() or 1) < 2:
        raise Failure("needs 2 cores (the server on one, the load and Redis on the other)")
    install_signal_handlers()
    started = time.monotonic()
    limitador = limitador_binary()
    service, load_gen = build_service(), build_rls_load()
    envoy_bin = find_envoy() if args.envoy else None
    info = facts(envoy_bin, command_line("rls.py")) if envoy_bin else machine_facts(command_line("rls.py"))
    info["redis"] = run(["redis-server", "--version"], timeout=30).strip()
    if limitador:
        info["limitador"] = run([str(limitador), "--version"], timeout=30).strip()
    servers = ["sluice"] + (["limitador"] if limitador else [])
    if not limitador:
        log("LIMITADOR is not set: Limitador's rows are left out")
    per_run = args.warmup + args.duration + 3
    runs = len(BACKENDS) * len(servers) * (len(CASES) + (1 if args.envoy else 0))
    signal.alarm(int(args.rounds * runs * per_run + 600))
    try:
        with tempfile.TemporaryDirectory(prefix="sluice-rls-") as tmp:
            rows = measure_rounds(Path(tmp), servers, {"sluice": service, "limitador": limitador}, load_gen,
                                  envoy_bin, args)
    finally:
        signal.alarm(0)
    info["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    return {
        "info": info,
        "args": vars(args),
        "servers": servers,
        "limits": {"sluice": SLUICE_LIMITS, "limitador": LIMITADOR_LIMITS},
        "rows": rows,
        "summary": summarize(rows),
        "elapsed_s": time.monotonic() - started,
    }


def measure_rounds(workdir, servers, binaries, load_gen, envoy_bin, args):
    """The servers (and their Envoys) started once, then `args.rounds` rounds of every
    measurement: rows keyed `backend/case/server` (case `envoy` for the rows through Envoy)."""
    (workdir / "sluice").mkdir()
    (workdir / "sluice" / "limits.yaml").write_text(SLUICE_LIMITS)
    (workdir / "limitador.yaml").write_text(LIMITADOR_LIMITS)
    limits = {"sluice": workdir / "sluice", "limitador": workdir / "limitador.yaml"}
    kinds = {"sluice": SluiceRls, "limitador": Limitador}
    rows = {}
    with contextlib.ExitStack() as stack:
        redis = stack.enter_context(Redis(workdir, core=LOAD_CORE))
        redis.start(30)
        started, envoys = {}, {}
        for backend in BACKENDS:
            for server in servers:
                log(f"starting {SERVERS[server]}, {BACKENDS[backend]}")
                child = stack.enter_context(kinds[server](workdir, server, backend, redis, binaries[server],
                                                          limits[server], load_gen))
                started[backend, server] = child.start()
                if envoy_bin:
                    envoys[backend, server] = stack.enter_context(RlsEnvoy(envoy_bin, child, workdir))
                    envoys[backend, server].start()
        for r in range(1, args.rounds + 1):
            for backend in BACKENDS:
                for case in CASES:
                    for server in servers:
                        result = measure_direct(started[backend, server], redis, case, load_gen, args)
                        rows.setdefault(f"{backend}/{case.id}/{server}", []).append(result)
                        log_direct(f"round {r}/{args.rounds} {backend} {case.id} {server}", result)
                if envoy_bin:
                    for server in servers:
                        result = measure_envoy(envoys[backend, server], started[backend, server], redis, workdir,
                                               args)
                        rows.setdefault(f"{backend}/envoy/{server}", []).append(result)
                        log_envoy(f"round {r}/{args.rounds} {backend} envoy {server}", result)
    return rows


def load(load_gen, server, case, seconds, connections, max_calls=10_000_000):
    """One run of the load generator against `server`: its JSON."""
    cmd = launch_prefix(LOAD_CORE) + [
        str(load_gen), "--target", f"127.0.0.1:{server.port}", "--domain", DOMAIN, "--key", DESCRIPTOR_KEY,
        "--keys", str(case.keys), "--concurrency", str(case.concurrency), "--connections", str(connections),
        "--duration", str(seconds), "--warmup", "0", "--max-calls", str(max_calls),
    ]
    return json.loads(run(cmd, timeout=seconds + 60).strip().splitlines()[-1])


def measure_direct(server, redis, case, load_gen, args):
    """Calls/s, latency and CPU per call of `server` (and of Redis, when it keeps the counters)
    over one run of the load generator, after `args.warmup` seconds of it."""
    if args.warmup:
        load(load_gen, server, case, args.warmup, args.connections)
    others = Others(server.pid, redis.pid)
    before = cpu_seconds(server.pid), cpu_seconds(redis.pid)
    load_before = children_cpu_seconds()
    result = load(load_gen, server, case, args.duration, args.connections)
    # The load generator is the one child waited for meanwhile (RUSAGE_CHILDREN).
    load_cpu = children_cpu_seconds() - load_before
    server_cpu, redis_cpu = (cpu_seconds(p) - b for p, b in zip((server.pid, redis.pid), before))
    calls = max(result["calls"], 1)
    result.update(server_cpu_us_per_call=server_cpu / calls * 1e6, server_cpu_share=server_cpu / result["seconds"],
                  redis_cpu_us_per_call=redis_cpu / calls * 1e6 if server.backend == "redis" else None,
                  redis_cpu_share=redis_cpu / result["seconds"] if server.backend == "redis" else None,
                  load_cpu_us_per_call=load_cpu / calls * 1e6, load_cpu_share=load_cpu / result["seconds"],
                  server_rss_mib=server.rss_mib(), others_share=others.share())
    return result


class Others:
    """What other work on the machine took while we measured, in cores: all the CPU time
    /proc/stat counts, less our processes' (`pids`, and the children we waited for since)."""

    def __init__(self, *pids):
        self.pids, self.started = pids, time.monotonic()
        self.machine, self.children = machine_busy_seconds(), children_cpu_seconds()
        self.ours = sum(cpu_seconds(p) for p in pids)

    def share(self):
        ours = sum(cpu_seconds(p) for p in self.pids) - self.ours + children_cpu_seconds() - self.children
        other = machine_busy_seconds() - self.machine - ours
        return max(other, 0.0) / max(time.monotonic() - self.started, 1e-9)


def measure_envoy(envoy, server, redis, workdir, args):
    """wrk through `envoy` (whose ratelimit filter asks `server`): requests/s, latency, and the
    CPU per request of Envoy, the server and Redis."""
    if args.warmup:
        wrk_script(envoy.port, args.warmup, ENVOY_CONNECTIONS, 1, USERS_LUA, workdir, core=LOAD_CORE)
    pids = envoy.pid, server.pid, redis.pid
    others = Others(*pids)
    before = [cpu_seconds(p) for p in pids]
    answers = envoy.ratelimit_counts()
    result = wrk_script(envoy.port, args.duration, ENVOY_CONNECTIONS, 1, USERS_LUA, workdir, core=LOAD_CORE)
    envoy_cpu, server_cpu, redis_cpu = (cpu_seconds(p) - b for p, b in zip(pids, before))
    after = envoy.ratelimit_counts()
    requests = max(result["requests"], 1)
    result.pop("stdout", None)
    result.pop("script", None)
    result.update(
        envoy_cpu_us_per_request=envoy_cpu / requests * 1e6,
        server_cpu_us_per_request=server_cpu / requests * 1e6,
        redis_cpu_us_per_request=redis_cpu / requests * 1e6 if server.backend == "redis" else None,
        core_share=(envoy_cpu + server_cpu) / result["seconds"],
        ratelimit={k: after[k] - answers[k] for k in after},
        others_share=others.share(),
    )
    return result


# The per-run figures the report takes the medians of.
DIRECT_FIGURES = ("calls_per_s", "p50_ms", "p99_ms", "server_cpu_us_per_call", "server_cpu_share",
                  "redis_cpu_us_per_call", "redis_cpu_share", "load_cpu_us_per_call", "load_cpu_share", "errors", "other_code", "over_limit", "others_share")
ENVOY_FIGURES = ("rps", "p50_ms", "p99_ms", "envoy_cpu_us_per_request", "server_cpu_us_per_request",
                 "redis_cpu_us_per_request", "core_share", "non2xx", "socket_errors", "others_share")


def summarize(rows):
    """Per row, the median of each figure over the rounds (None where a figure is None)."""
    summary = {}
    for key, samples in rows.items():
        figures = ENVOY_FIGURES if "/envoy/" in key else DIRECT_FIGURES
        summary[key] = {}
        for name in figures:
            values = [s[name] for s in samples if s.get(name) is not None]
            summary[key][name] = statistics.median(values) if values else None
        if "/envoy/" in key:
            summary[key]["rls_errors"] = sum(s["ratelimit"]["error"] for s in samples)
    return summary


def log_direct(where, result):
    log(f"{where}: {result['calls_per_s']:>9,.0f} calls/s  p50 {result['p50_ms']:.3f} ms  "
        f"p99 {result['p99_ms']:.3f} ms  server {result['server_cpu_us_per_call']:.1f} µs CPU/call "
        f"({100 * result['server_cpu_share']:.0f}% of a core)"
        + (f"  Redis {result['redis_cpu_us_per_call']:.1f} µs/call" if result["redis_cpu_us_per_call"] else "")
        + f"  load {100 * result['load_cpu_share']:.0f}% of a core"
        + f"  others {result['others_share']:.2f} cores")
    bad = result["errors"] + result["other_code"] + result["over_limit"]
    if bad:
        log(f"warning: {bad} calls not OK (errors {result['errors']}, over limit {result['over_limit']}, "
            f"other {result['other_code']}): {result['first_error']}")


def log_envoy(where, result):
    log(f"{where}: {result['rps']:>9,.0f} req/s  p50 {result['p50_ms']:.3f} ms  p99 {result['p99_ms']:.3f} ms  "
        f"Envoy {result['envoy_cpu_us_per_request']:.1f} + RLS {result['server_cpu_us_per_request']:.1f} µs "
        f"CPU/req  answers {result['ratelimit']}  others {result['others_share']:.2f} cores")
    if result["non2xx"] or result["socket_errors"] or result["ratelimit"]["error"]:
        log(f"warning: non-2xx {result['non2xx']}, socket errors {result['socket_errors']}, "
            f"RLS errors {result['ratelimit']['error']}")
