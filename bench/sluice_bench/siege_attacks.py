"""`make siege` (bench/siege.py tells the design): sluice-service, under `ulimit -n 1024`, and a
Redis with a small maxmemory, under every attack of issue 20 at once while two legitimate clients
call it; what they got, and what the service and Redis held meanwhile.

The attackers and the clients are threads of this process, each bounded by the run's end: they
speak HTTP/1.1 and HTTP/2 by hand (slowloris, a bare preface, half-sent streams) and gRPC through
grpcio (the Python of the repo's .venv) with messages encoded here, so nothing is generated."""

import http.client
import json
import resource
import socket
import struct
import threading
import time
from pathlib import Path

import grpc

from .processes import Child, free_ports, log, rss_mib
from .services import Redis

FD_LIMIT = 1024
METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
GRPC_OPTIONS = [("grpc.enable_http_proxy", 0), ("grpc.max_send_message_length", 1 << 24)]
# A legitimate call's bar (issue 20): answered within this, on a new connection if need be.
ANSWERED_WITHIN_S = 10
LEGIT_LIMIT = 1_000_000
LEGIT_EVERY_S = 0.1


# ---- the wire ---------------------------------------------------------------------------------

def varint(n):
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number, payload):
    """A length-delimited protobuf field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def rate_limit_request(domain, entries, override=None):
    """envoy.service.ratelimit.v3.RateLimitRequest of one descriptor of `entries` (key, value),
    with a limit override (requests_per_unit, unit) if given."""
    descriptor = b"".join(field(1, field(1, k.encode()) + field(2, v.encode())) for k, v in entries)
    if override:
        requests, unit = override
        descriptor += field(2, varint(1 << 3) + varint(requests) + varint(2 << 3) + varint(unit))
    return field(1, domain.encode()) + field(2, descriptor)


def fields(message):
    """(number, value) of a protobuf message's varint and length-delimited fields."""
    at = 0
    while at < len(message):
        key, at = read_varint(message, at)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, at = read_varint(message, at)
        elif kind == 2:
            size, at = read_varint(message, at)
            value, at = message[at:at + size], at + size
        else:
            return
        yield number, value


def read_varint(data, at):
    n = shift = 0
    while True:
        byte = data[at]
        at += 1
        n |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return n, at


def overall_and_remaining(response):
    """A RateLimitResponse's overall code (1 OK, 2 OVER_LIMIT) and its first status's
    limit_remaining."""
    overall, remaining = 0, None
    for number, value in fields(response):
        if number == 1:
            overall = value
        elif number == 2 and remaining is None:
            remaining = dict(fields(value)).get(3, 0)
    return overall, remaining


H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def h2_frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def hpack_literal(name, value):
    """A header field as a literal without indexing, names and values not Huffman-coded."""
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def half_sent_call(stream, declared, sent):
    """HEADERS of an RLS call on `stream`, then a DATA frame whose gRPC message says `declared`
    bytes and holds `sent` of them, the stream left open."""
    headers = b"".join(hpack_literal(n, v) for n, v in [
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", METHOD.encode()),
        (b":authority", b"sluice"), (b"content-type", b"application/grpc"), (b"te", b"trailers")])
    body = b"\x00" + struct.pack(">I", declared) + b"x" * sent
    return h2_frame(1, 0x4, stream, headers) + h2_frame(0, 0, stream, body)


# ---- the processes ----------------------------------------------------------------------------

class SmallRedis(Redis):
    """A Redis that forgets its least frequently used keys past `maxmemory`."""

    def __init__(self, workdir, maxmemory_mb):
        super().__init__(workdir)
        self.maxmemory_mb = maxmemory_mb

    def command(self):
        return super().command() + ["--maxmemory", f"{self.maxmemory_mb}mb", "--maxmemory-policy", "allkeys-lfu"]

    def info(self, section):
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
            s.sendall(f"INFO {section}\r\n".encode())
            data = b""
            while b"\r\n" not in data or len(data) < int(data.split(b"\r\n")[0][1:]) + 2:
                data += s.recv(65536)
        lines = data.decode().split("\r\n")[1:]
        return dict(line.split(":", 1) for line in lines if ":" in line)

    def time_ms(self):
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
            s.sendall(b"TIME\r\n")
            parts = s.recv(256).split(b"\r\n")
        return int(parts[2]) * 1000 + int(parts[4]) // 1000


class LimitedService(Child):
    """sluice-service with HTTP and the RLS, under `ulimit -n FD_LIMIT`."""

    name = "service"

    def __init__(self, workdir, redis, binary, config):
        port, self.rls_port = free_ports(2)
        super().__init__(workdir, port)
        self.redis, self.binary, self.config = redis, binary, config

    def command(self):
        return ["sh", "-c", f'ulimit -n {FD_LIMIT} && exec "$@"', "sh", str(self.binary),
                "--redis", self.redis.url, "--listen", f"127.0.0.1:{self.port}",
                "--rls", f"127.0.0.1:{self.rls_port}", "--rls-config", str(self.config)]

    def ready(self):
        try:
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
            connection.request("GET", "/readyz")
            return connection.getresponse().status == 200
        except OSError:
            return False

    def open_fds(self):
        return len(list(Path(f"/proc/{self.pid}/fd").iterdir()))

    def warnings(self, message):
        """The events of its log with this message."""
        events = (json.loads(line) for line in self.log_path.read_text().splitlines() if line.startswith("{"))
        return [event for event in events if event.get("message") == message]


# ---- the attackers ----------------------------------------------------------------------------

class Swarm(threading.Thread):
    """`n` connections to `port` held open until `stop`: each tick, a connection the service closed
    is opened again (and counted), the others get `touch` (one more byte of a slow request)."""

    def __init__(self, name, port, n, opening, touch=b"", every_s=1.0):
        super().__init__(name=name, daemon=True)
        self.port, self.n, self.opening, self.touch, self.every_s = port, n, opening, touch, every_s
        self.stop, self.closed_by_service, self.failed_connects = threading.Event(), 0, 0
        self.held = []

    def connect(self):
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=0.5)
            s.sendall(self.opening)
            s.setblocking(False)
            return s
        except OSError:
            self.failed_connects += 1
            return None

    def run(self):
        sockets = [self.connect() for _ in range(self.n)]
        while not self.stop.wait(self.every_s):
            for i, s in enumerate(sockets):
                if s is None or closed(s):
                    if s is not None:
                        self.closed_by_service += 1
                        s.close()
                    sockets[i] = self.connect()
                elif self.touch:
                    try:
                        s.send(self.touch)
                    except OSError:
                        pass
            self.held.append(sum(s is not None for s in sockets))
        for s in sockets:
            if s is not None:
                s.close()


def closed(s):
    """Whether the peer closed `s` (what it sent is read and dropped)."""
    try:
        while True:
            if not s.recv(65536):
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


class HalfSentStreams(Swarm):
    """Connections that each open `streams` calls declaring 4 MB and sending `sent` bytes of it,
    never finished; opened again when the service closes them."""

    def __init__(self, port, n, streams, sent):
        opening = H2_PREFACE + h2_frame(4, 0, 0)
        calls = b"".join(half_sent_call(2 * i + 1, 4_000_000, sent) for i in range(streams))
        super().__init__("half-sent-streams", port, n, opening)
        self.calls = calls

    def connect(self):
        s = super().connect()
        if s is not None:
            # After the server's SETTINGS and its connection window, as a client would wait.
            time.sleep(0.02)
            try:
                s.setblocking(True)
                s.sendall(self.calls)
                s.setblocking(False)
            except OSError:
                pass
        return s


def key_flood(port, flooder, stop, counts, keys_per_request=16):
    """Checks of 16 new keys each (a fixed window of 30 days, so each key would stay a month), as
    fast as one keep-alive connection goes, until `stop`."""
    connection, request = None, 0
    while not stop.is_set():
        checks = [{"key": f"flood/{flooder}/{request}-{i}", "algorithm": "fixed_window", "requests": 1,
                   "per_ms": 30 * 86_400_000, "burst": 1, "cost": 1} for i in range(keys_per_request)]
        request += 1
        try:
            connection = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("POST", "/v1/check", json.dumps({"checks": checks}),
                               {"content-type": "application/json"})
            response = connection.getresponse()
            response.read()
            counts[response.status] = counts.get(response.status, 0) + 1
        except (OSError, http.client.HTTPException):
            counts["error"] = counts.get("error", 0) + 1
            connection = None


def oversized_labels(rls_port, stop, counts, value_bytes):
    """RLS calls whose descriptor values are `value_bytes` long and all different, on a
    `detailed_metric` descriptor and with a limit override, until `stop`."""
    with grpc.insecure_channel(f"127.0.0.1:{rls_port}", options=GRPC_OPTIONS) as channel:
        call = channel.unary_unary(METHOD)
        n = 0
        while not stop.is_set():
            value = f"{n:08d}" + "v" * value_bytes
            override = (10, 3) if n % 2 else None
            n += 1
            try:
                call(rate_limit_request("siege", [("labelled", value)], override), timeout=5)
                counts["ok"] = counts.get("ok", 0) + 1
            except grpc.RpcError as error:
                counts[error.code().name] = counts.get(error.code().name, 0) + 1
            stop.wait(0.02)


# ---- the legitimate clients -------------------------------------------------------------------

class Legit(threading.Thread):
    """A client that calls every LEGIT_EVERY_S and must be answered exactly: allowed, with one less
    remaining each time (a limit of LEGIT_LIMIT in a window that does not end during the run).
    A call that fails is tried again on a new connection, within ANSWERED_WITHIN_S."""

    def __init__(self, name):
        super().__init__(name=name, daemon=True)
        self.stop = threading.Event()
        self.latencies_ms, self.wrong, self.failed, self.retries = [], [], 0, 0

    def run(self):
        n = 0
        while not self.stop.wait(LEGIT_EVERY_S):
            started = time.monotonic()
            answer = None
            while answer is None and time.monotonic() - started < ANSWERED_WITHIN_S:
                try:
                    answer = self.call()
                except Exception:  # any failure: a new connection, and again
                    self.retries += 1
                    self.reconnect()
                    time.sleep(0.05)
            if answer is None:
                self.failed += 1
                continue
            self.latencies_ms.append((time.monotonic() - started) * 1000)
            n += 1
            if answer != (True, LEGIT_LIMIT - n):
                self.wrong.append((n, answer))


class LegitHttp(Legit):
    def __init__(self, port, per_ms):
        super().__init__("legit-http")
        self.port, self.connection = port, None
        self.body = json.dumps({"checks": [{"key": "legit/alice", "algorithm": "fixed_window",
                                            "requests": LEGIT_LIMIT, "per_ms": per_ms,
                                            "burst": LEGIT_LIMIT, "cost": 1}]})

    def reconnect(self):
        self.connection = None

    def call(self):
        self.connection = self.connection or http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        self.connection.request("POST", "/v1/check", self.body, {"content-type": "application/json"})
        response = self.connection.getresponse()
        result = json.loads(response.read())["results"][0]
        return result["allowed"], result["remaining"]


class LegitRls(Legit):
    def __init__(self, rls_port):
        super().__init__("legit-rls")
        self.rls_port, self.channel = rls_port, None
        self.request = rate_limit_request("siege", [("legit", "alice")])

    def reconnect(self):
        if self.channel:
            self.channel.close()
        self.channel = None

    def call(self):
        self.channel = self.channel or grpc.insecure_channel(f"127.0.0.1:{self.rls_port}", options=GRPC_OPTIONS)
        response = self.channel.unary_unary(METHOD)(self.request, timeout=5)
        overall, remaining = overall_and_remaining(response)
        return overall == 1, remaining


# ---- the run ----------------------------------------------------------------------------------

def config_yaml(per_ms):
    return f"""domain: siege
descriptors:
  - key: legit
    rate_limit: {{requests_per_unit: {LEGIT_LIMIT}, per: {per_ms}ms}}
  - key: labelled
    detailed_metric: true
    rate_limit: {{unit: hour, requests_per_unit: 1000}}
"""


def window_with_room(now_ms, room_ms):
    """A window length near an hour whose current window has `room_ms` left."""
    return next(length for length in range(3_600_000, 3_700_000) if length - now_ms % length >= room_ms)


def service_metric_lines(port, prefix):
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    except OSError:
        return [], 0
    return [line for line in text.splitlines() if line.startswith(prefix)], len(text)


def run_siege(binary, workdir, args):
    """The siege, `args.seconds` long; its raw results."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    with SmallRedis(workdir, args.maxmemory_mb) as redis:
        redis.start()
        per_ms = window_with_room(redis.time_ms(), (args.seconds + 120) * 1000)
        config = workdir / "rls"
        config.mkdir()
        (config / "siege.yaml").write_text(config_yaml(per_ms))
        redis_base = int(redis.info("memory")["used_memory"])
        with LimitedService(workdir, redis, binary, config) as service:
            service.start()
            return siege(redis, service, per_ms, redis_base, args)


def siege(redis, service, per_ms, redis_base, args):
    log(f"Redis :{redis.port} (maxmemory {args.maxmemory_mb} MB), service :{service.port} and rls "
        f":{service.rls_port} under ulimit -n {FD_LIMIT}: {args.seconds} s of attacks")
    rss_before = rss_mib(service.pid)
    stop = threading.Event()
    swarms = [
        Swarm("slowloris", service.port, args.slowloris, b"POST /v1/check HTTP/1.1\r\nhost: s\r\nx-slow: ",
              touch=b"x"),
        Swarm("idle-http2", service.rls_port, args.idle_http2, H2_PREFACE + h2_frame(4, 0, 0)),
        HalfSentStreams(service.rls_port, args.stream_connections, 100, 8192),
    ]
    # One dict per thread: no two threads count into the same one.
    flood_counts, label_counts = [{} for _ in range(args.flooders)], {}
    threads = [threading.Thread(target=key_flood, args=(service.port, n, stop, flood_counts[n]), daemon=True)
               for n in range(args.flooders)]
    threads.append(threading.Thread(target=oversized_labels, daemon=True,
                                    args=(service.rls_port, stop, label_counts, args.label_bytes)))
    legit = [LegitHttp(service.port, per_ms), LegitRls(service.rls_port)]
    for thread in [*swarms, *threads, *legit]:
        thread.start()
    samples = []
    started = time.monotonic()
    while time.monotonic() - started < args.seconds:
        time.sleep(1)
        memory = redis.info("memory")
        samples.append({"t": round(time.monotonic() - started, 1), "rss_mib": rss_mib(service.pid),
                        "fds": service.open_fds(), "redis_used": int(memory["used_memory"])})
    for thread in legit + swarms:
        thread.stop.set()
    stop.set()
    for thread in [*legit, *swarms, *threads]:
        thread.join(timeout=15)
    closed_lines, metrics_bytes = service_metric_lines(service.port, "sluice_service_connections_closed_total")
    failed_on_redis = service.warnings("checks failed on Redis (503)")
    stats = redis.info("stats")
    keyspace = redis.info("keyspace").get("db0", "keys=0").split(",")[0].split("=")[1]
    return {
        "seconds": args.seconds,
        "maxmemory_mb": args.maxmemory_mb,
        "rss_before_mib": rss_before,
        "samples": samples,
        "redis_base": redis_base,
        "redis_evicted": int(stats.get("evicted_keys", 0)),
        "redis_keys": int(keyspace),
        "metrics_bytes": metrics_bytes,
        "closed": closed_lines,
        "swarms": {s.name: {"n": s.n, "closed_by_service": s.closed_by_service,
                            "failed_connects": s.failed_connects,
                            "held_min": min(s.held, default=0), "held_max": max(s.held, default=0)}
                   for s in swarms},
        # Each line stands for itself and the `others` it held back.
        "failed_on_redis": [{"kind": e["kind"], "error": e["error"], "count": 1 + e["others"]}
                            for e in failed_on_redis],
        "flood": {status: sum(c.get(status, 0) for c in flood_counts)
                  for status in {status for c in flood_counts for status in c}},
        "labels": label_counts,
        "legit": {c.name: {"calls": len(c.latencies_ms) + c.failed, "answered": len(c.latencies_ms),
                           "failed": c.failed, "retries": c.retries, "wrong": c.wrong[:5],
                           "latencies_ms": c.latencies_ms} for c in legit},
    }

