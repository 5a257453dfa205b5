"""The requests the runs send: wrk, plain (one fixed client, as the benchmark measures) or driven
by a Lua script (the soak's floods and mixes), each run bounded in time; a plain sequence of
requests over one connection (under valgrind); and paced keep-alive clients that time every
response (the soak's legitimate clients, the chaos load)."""

import http.client
import os
import re
import signal
import subprocess
import threading
import time

from .paths import ROOT
from .processes import LOAD_CORE, Failure, Stop, launch_prefix, stop_process

PATH = "/api/items"
# A fixed client: every request of a benchmark run is the same user with the same API key.
CLIENT_HEADERS = {"x-user-id": "bench-user-1", "x-api-key": "bench-key-1"}
# wrk waits at most this long for an answer before it counts a timeout.
WRK_TIMEOUT = "5s"
# Slack over a wrk run's own duration before it counts as hung.
WRK_SLACK_S = 60

# What every wrk Lua script starts with: each thread registers itself, so that done(), in the
# main Lua state, can add up the counters the threads keep in their globals.
LUA_TOTALS = r"""
local threads = {}

function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end

-- Writes "NAME TOTAL" for each named global, summed over the threads.
function print_totals(names)
  for _, name in ipairs(names) do
    local total = 0
    for _, thread in ipairs(threads) do total = total + (thread:get(name) or 0) end
    io.write(string.format("%s %d\n", name, total))
  end
end
"""

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def http_get(port, path, headers=None, timeout=2.0):
    """One GET on a fresh connection: (status, body text)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        conn.close()


def wrk(port, duration, connections=16, threads=1, core=LOAD_CORE):
    """wrk as the benchmark runs it: the fixed client's `GET /api/items` for `duration` seconds;
    its figures (parse_wrk). `core`: pinned to it (None: not pinned)."""
    headers = [arg for name, value in CLIENT_HEADERS.items() for arg in ("-H", f"{name}: {value}")]
    return parse_wrk(run_wrk(port, duration, connections, threads, headers, core=core))


def users_lua(keys):
    """A wrk `request()` sending each request one `x-user-id` of `keys` (user-0 ...), at random."""
    return f"""
local users = {{}}
for i = 1, {keys} do users[i] = "user-" .. (i - 1) end

function request()
  return wrk.format(nil, nil, {{["x-user-id"] = users[math.random({keys})]}})
end
"""


def wrk_script(port, seconds, connections, threads, lua, workdir, env=None, until=None, core=None):
    """wrk with a Lua script (LUA_TOTALS, then `lua`) for at most `seconds`: parse_wrk's figures,
    the largest latency, and what the script printed (`KEY VALUE` lines) under "script".
    `until()`, polled twice a second, ends the run early when true (a Lua thread that stops
    itself does not end wrk's run, which lasts its whole -d). `core`: pinned to it."""
    script = workdir / "wrk-script.lua"
    script.write_text(LUA_TOTALS + lua)
    stdout = run_wrk(port, seconds, connections, threads, ["-s", str(script)], core=core, env=env, until=until)
    result = parse_wrk(stdout)
    result["max_ms"] = to_ms(re.search(r"Latency\s+\S+\s+\S+\s+(\S+)", stdout).group(1))
    result["script"] = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w[\w-]*) (\d+)$", stdout, re.MULTILINE)}
    result["stdout"] = stdout
    return result


def run_wrk(port, seconds, connections, threads, extra, core=None, env=None, until=None):
    """Runs wrk to its end (or SIGINT once `until()` holds: wrk then prints its summary), at most
    its duration plus some slack; its output, with a long run's "in 10.00m" and a short one's
    "in 997.81ms" given in seconds."""
    cmd = launch_prefix(core) + ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency",
                                 "--timeout", WRK_TIMEOUT, *extra, f"http://127.0.0.1:{port}{PATH}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    try:
        deadline = time.monotonic() + seconds + WRK_SLACK_S
        interrupted = False
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
            if until is not None and not interrupted and until():
                proc.send_signal(signal.SIGINT)
                interrupted = True
        if proc.poll() is None:
            raise Stop(f"wrk ran over {seconds + WRK_SLACK_S}s")
        stdout, stderr = proc.communicate(timeout=10)
    finally:
        stop_process(proc)
    if proc.returncode != 0:
        raise Failure(f"{' '.join(cmd)} failed ({proc.returncode}):\n{stdout[-3000:]}{stderr[-3000:]}")
    scale = {"ms": 0.001, "m": 60}
    return re.sub(r"requests in ([\d.]+)(ms|m),",
                  lambda m: f"requests in {scale[m.group(2)] * float(m.group(1)):.3f}s,", stdout)


def to_ms(text):
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if not match:
        raise ValueError(f"wrk latency {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_wrk(out):
    def find(pattern, cast=float, default=None):
        match = re.search(pattern, out, re.MULTILINE)
        if match is None:
            if default is not None:
                return default
            raise Failure(f"no {pattern!r} in wrk's output:\n{out}")
        return cast(match.group(1))

    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {
        "requests": find(r"^\s*(\d+) requests in", int),
        "seconds": find(r"requests in ([\d.]+)s,"),
        "rps": find(r"^Requests/sec:\s+([\d.]+)"),
        "p50_ms": find(r"^\s+50%\s+(\S+)$", to_ms),
        "p99_ms": find(r"^\s+99%\s+(\S+)$", to_ms),
        "non2xx": find(r"Non-2xx or 3xx responses: (\d+)", int, 0),
        "socket_errors": sum(int(g) for g in errors.groups()) if errors else 0,
    }


def send(port, count):
    """`count` of the fixed client's requests, one after another over one keep-alive connection:
    their statuses, counted."""
    statuses = {}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        for _ in range(count):
            conn.request("GET", PATH, headers=CLIENT_HEADERS)
            response = conn.getresponse()
            response.read()
            statuses[str(response.status)] = statuses.get(str(response.status), 0) + 1
    finally:
        conn.close()
    return statuses


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


class PacedClients:
    """Pacers that run together: a `with` block starts them and stops them on the way out."""

    def __init__(self, pacers):
        self.pacers = pacers

    def __enter__(self):
        for pacer in self.pacers:
            pacer.start()
        return self

    def __exit__(self, *_exc):
        for pacer in self.pacers:
            pacer.stop()
        for pacer in self.pacers:
            pacer.join(timeout=10)


class Pacer(threading.Thread):
    """Sends `path` with `headers` at `rate` per second (a fixed schedule: a late request does not
    make the next one early by more than one interval) until stopped or `deadline` (monotonic),
    handing each result to `record(sent_at, result)`."""

    def __init__(self, port, rate, path, headers, record, deadline):
        super().__init__(daemon=True)
        self.client = Client(port)
        self.interval = 1.0 / rate
        self.path, self.headers, self.record, self.deadline = path, headers, record, deadline
        self.stopping = threading.Event()

    def run(self):
        next_at = time.monotonic()
        try:
            while not self.stopping.is_set() and time.monotonic() < self.deadline:
                now = time.monotonic()
                if now < next_at:
                    self.stopping.wait(next_at - now)
                    continue
                next_at = max(next_at + self.interval, now - self.interval)
                sent = time.monotonic()
                self.record(sent, self.client.get(self.path, self.headers))
        finally:
            self.client.close()

    def stop(self):
        self.stopping.set()
