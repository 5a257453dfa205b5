"""What bench/soak.py and bench/chaos.py share: redis-server and sluice-service as child
processes, the Envoy pieces for global policies, a paced keep-alive HTTP client, RSS sampling,
and docs/reliability.md, where each script rewrites its own section. Python 3 standard library.

Envoy itself, its bootstrap, the service's Envoy cluster and its release build, wrk's output and
the machine facts come from bench/run.py (the benchmark), imported as `bench`. Everything binds 127.0.0.1 on free ports; every wait has a
deadline; every child is stopped by its PID.
"""

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402  (bench/run.py: Envoy, bootstrap, wrk, facts)

ROOT = bench.ROOT
REPORT = ROOT / "docs" / "reliability.md"


class Stop(Exception):
    """A signal or a deadline: unwind, so that the finally blocks stop every child."""


def on_signal(signum, _frame):
    raise Stop(f"stopped by signal {signal.Signals(signum).name}")


def install_signal_handlers():
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM):
        signal.signal(signum, on_signal)


def logger(name):
    def log(message):
        print(f"[{name} {time.strftime('%H:%M:%S')}] {message}", flush=True)

    return log


def wait_until(probe, timeout, interval=0.05):
    """Polls `probe` until it returns a true value or `timeout` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def free_port():
    return bench.free_ports(1)[0]


def service_binary():
    """$SLUICE_SERVICE, else the benchmark's release build of the service (without LTO: quick to
    compile; built now if out of date)."""
    chosen = os.environ.get("SLUICE_SERVICE")
    if chosen:
        return Path(chosen)
    if not hasattr(service_binary, "built"):
        service_binary.built = bench.build_service()
    return service_binary.built


def rss_mib(pid):
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


# ---------------------------------------------------------------------------------------------
# Child processes: Redis and the service, each restartable on its own port.


class Child:
    """A child process we own, restartable on the same port, stopped by PID."""

    name = "child"

    def __init__(self, workdir):
        self.workdir = workdir
        self.port = free_port()
        self.proc = None
        self.starts = 0

    def command(self):
        raise NotImplementedError

    def ready(self):
        raise NotImplementedError

    def start(self, timeout=15):
        self.starts += 1
        log_path = self.workdir / f"{self.name}-{self.starts}.log"
        with open(log_path, "w") as log_file:
            self.proc = subprocess.Popen(
                self.command(), cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT
            )
        self.log_path = log_path
        if not wait_until(lambda: self.proc.poll() is not None or self.ready(), timeout) or self.proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            self.stop()
            raise RuntimeError(f"{self.name} did not start on port {self.port}:\n{tail}")
        return self

    @property
    def pid(self):
        return self.proc.pid

    def kill(self):
        """SIGKILL: a crash, no goodbye."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def pause(self):
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            # A stopped process must be continued to act on SIGTERM.
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
            except OSError:
                pass
        bench.stop_process(self.proc)

    def rss_mib(self):
        return rss_mib(self.proc.pid) if self.proc and self.proc.poll() is None else float("nan")


class Redis(Child):
    name = "redis"

    def command(self):
        return [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--dir", str(self.workdir),
        ]

    def ready(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"


class Service(Child):
    name = "service"

    def __init__(self, workdir, redis, binary):
        super().__init__(workdir)
        self.redis, self.binary = redis, binary

    def command(self):
        return [str(self.binary), "--listen", f"127.0.0.1:{self.port}", "--redis", self.redis.url]

    def ready(self):
        """Ready once it reaches Redis (it serves, with 503s, before that)."""
        try:
            return bench.http_get(self.port, "/readyz")[0] == 200
        except OSError:
            return False


# ---------------------------------------------------------------------------------------------
# Envoy pieces


def sluice_filter(config):
    """The sluice filter with a whole plugin configuration (bench.sluice() takes policies only)."""
    return bench.wasm_filter(bench.SLUICE_WASM, config, "sluice")


def global_block(timeout="50ms"):
    return {"cluster": bench.SERVICE_CLUSTER, "authority": "sluice-service", "timeout": timeout}


def make_envoy(envoy_bin, name, config, workdir, clusters=(), concurrency=2):
    """An Envoy of bench/run.py's shape (a direct_response route), its workers not pinned; not
    started yet, so that the caller can register it for cleanup first."""
    return bench.Envoy(envoy_bin, name, [sluice_filter(config)], workdir, concurrency=concurrency,
                       pin=False, clusters=list(clusters))


def wasm_counters(envoy):
    """The filter's counters in Envoy, without the `wasmcustom.` prefix."""
    return {k[len("wasmcustom."):]: v for k, v in envoy.stats().items() if k.startswith("wasmcustom.")}


# ---------------------------------------------------------------------------------------------
# A client that keeps one connection and paces its requests


class Client:
    """One keep-alive connection sending GETs, reconnecting after an error. `get` returns
    (status or None, headers dict, body, latency seconds, error or None)."""

    def __init__(self, port, timeout=5.0):
        self.port, self.timeout = port, timeout
        self.conn = None

    def get(self, path, headers):
        started = time.monotonic()
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            self.conn.request("GET", path, headers=headers)
            response = self.conn.getresponse()
            body = response.read()
            got = {k.lower(): v for k, v in response.getheaders()}
            if got.get("connection", "").lower() == "close":
                self.close()
            return response.status, got, body, time.monotonic() - started, None
        except (OSError, http.client.HTTPException) as error:
            self.close()
            return None, {}, b"", time.monotonic() - started, f"{type(error).__name__}: {error}"

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class Pacer(threading.Thread):
    """Sends requests at `rate` per second (a fixed schedule: a late request does not make the
    next one early by more than one interval) until stopped or `deadline` (monotonic), handing
    each result to `record(sent_at, result)`."""

    def __init__(self, port, rate, request, record, deadline):
        super().__init__(daemon=True)
        self.client = Client(port)
        self.interval = 1.0 / rate
        self.request, self.record, self.deadline = request, record, deadline
        self.stopping = threading.Event()

    def run(self):
        next_at = time.monotonic()
        n = 0
        try:
            while not self.stopping.is_set() and time.monotonic() < self.deadline:
                now = time.monotonic()
                if now < next_at:
                    self.stopping.wait(next_at - now)
                    continue
                next_at = max(next_at + self.interval, now - self.interval)
                path, headers = self.request(n)
                n += 1
                sent = time.monotonic()
                self.record(sent, self.client.get(path, headers))
        finally:
            self.client.close()

    def stop(self):
        self.stopping.set()


# ---------------------------------------------------------------------------------------------
# Sampling


class Sampler(threading.Thread):
    """Samples `probe()` (a dict) every `period` seconds until stopped or `deadline`."""

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
        self.join(timeout=self.period + 5)


# ---------------------------------------------------------------------------------------------
# wrk


def wrk(port, seconds, connections, threads, script, env=None, timeout_s="5s", path="/api/items", until=None):
    """wrk with a Lua script for at most `seconds`; its summary, with what the script printed
    (`KEY VALUE` lines). `until()`, polled twice a second, ends the run early when true: wrk
    stops on SIGINT and prints its summary (a Lua thread that stops itself does not end wrk's
    run, which lasts its whole -d)."""
    cmd = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency", "--timeout", timeout_s,
           "-s", str(script), f"http://127.0.0.1:{port}{path}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    try:
        deadline = time.monotonic() + seconds + 60
        interrupted = False
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            if until is not None and not interrupted and until():
                proc.send_signal(signal.SIGINT)
                interrupted = True
        if proc.poll() is None:
            raise Stop(f"wrk ran over {seconds + 60}s")
        stdout, stderr = proc.communicate(timeout=10)
    finally:
        bench.stop_process(proc)
    if proc.returncode != 0:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {stdout[-2000:]}{stderr[-2000:]}")
    # wrk writes a long run's time in minutes ("in 10.00m,"): seconds, for bench.parse_wrk.
    stdout = re.sub(r"requests in ([\d.]+)m,", lambda m: f"requests in {60 * float(m.group(1)):.2f}s,", stdout)
    result = bench.parse_wrk(stdout)
    result["max_ms"] = bench.to_ms(re.search(r"Latency\s+\S+\s+\S+\s+(\S+)", stdout).group(1))
    result["script"] = {
        m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w[\w-]*) (\d+)$", stdout, re.MULTILINE)
    }
    result["stdout"] = stdout
    return result


# ---------------------------------------------------------------------------------------------
# The report


def facts(envoy_bin):
    info = bench.facts(envoy_bin)
    binary = service_binary()
    info["service"] = str(binary.relative_to(ROOT)) if binary.is_relative_to(ROOT) else str(binary)
    info["redis"] = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip()
    return info


def facts_lines(info, command):
    return [
        f"- Date: {info['date']}",
        f"- Machine: {info['cpu']}, {info['cores']} cores, Linux {info['kernel']}; "
        f"load average at the start {' '.join(info['loadavg'])}",
        f"- Commit: {info['commit']}; command: `{command}`",
        f"- Envoy {info['envoy']}; {info['wrk']}; {info['redis'].split(' sha=')[0]}; "
        f"sluice-service `{info['service']}`",
    ]


def write_section(name, lines):
    """Replaces the section between `<!-- NAME:begin -->` and `<!-- NAME:end -->` in
    docs/reliability.md (appending it when absent); the rest of the file is left alone."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = "\n".join([begin, *lines, end])
    text = REPORT.read_text() if REPORT.exists() else "# Reliability\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(text)


def table(header, rows):
    """A Markdown table; numbers right-aligned."""
    out = ["| " + " | ".join(header) + " |",
           "| " + " | ".join("---:" if i else "---" for i in range(len(header))) + " |"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def dump_json(path, data):
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
