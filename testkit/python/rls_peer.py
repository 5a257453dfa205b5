"""An independent Rate Limit Service for sluice's tests (grpcio, no generated code): answers
envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit as envoyproxy/ratelimit's documented
examples do, a fixed window per descriptor, every hit counted (over the limit too), with the
protobuf read and written by hand here, apart from sluice's own encoder.

  rls_peer.py serve LIMIT UNIT [MODE]
      LIMIT hits per UNIT (second, minute or hour) for every descriptor, aligned to the epoch.
      MODE: ok (the default), unavailable (every call fails with UNAVAILABLE), or slow (every
      call answers after 2 s). Serves on a free port of 127.0.0.1, prints the port on a line,
      then one JSON line per call received: {"domain": ..., "hits_addend": N, "descriptors":
      [{"entries": [[key, value], ...], "hits_addend": N or null}]}. Serves until killed.
"""

import json
import sys
import threading
import time
from concurrent import futures

import grpc

OPTIONS = [("grpc.enable_http_proxy", 0)]
UNITS = {"second": (1, 1), "minute": (60, 2), "hour": (3600, 3)}
OK, OVER_LIMIT = 1, 2


def varint(data, at):
    value, shift = 0, 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def fields(data):
    """(field number, wire type, value) of a message: ints for varints, bytes otherwise."""
    at = 0
    while at < len(data):
        tag, at = varint(data, at)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, at = varint(data, at)
        elif wire == 2:
            length, at = varint(data, at)
            value, at = data[at:at + length], at + length
        elif wire == 1:
            value, at = data[at:at + 8], at + 8
        elif wire == 5:
            value, at = data[at:at + 4], at + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield number, wire, value


def put_varint(value):
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def put(number, value):
    if isinstance(value, int):
        return put_varint(number << 3) + put_varint(value)
    return put_varint((number << 3) | 2) + put_varint(len(value)) + value


def parse_request(data):
    request = {"domain": "", "hits_addend": 0, "descriptors": []}
    for number, _, value in fields(data):
        if number == 1:
            request["domain"] = value.decode()
        elif number == 3:
            request["hits_addend"] = value
        elif number == 2:
            descriptor = {"entries": [], "hits_addend": None}
            for n, _, v in fields(value):
                if n == 1:
                    entry = dict((k, x.decode()) for k, _, x in fields(v))
                    descriptor["entries"].append([entry.get(1, ""), entry.get(2, "")])
                elif n == 3:
                    descriptor["hits_addend"] = dict((k, x) for k, _, x in fields(v)).get(1, 0)
            request["descriptors"].append(descriptor)
    return request


class Limiter:
    def __init__(self, limit, unit):
        self.limit, (self.seconds, self.unit) = limit, UNITS[unit]
        self.counts, self.lock = {}, threading.Lock()

    def status(self, descriptor, hits):
        now = time.time()
        window = int(now // self.seconds)
        key = (json.dumps(descriptor["entries"]), window)
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + hits
            count = self.counts[key]
        over = count > self.limit
        until_reset = (window + 1) * self.seconds - now
        limit = put(1, self.limit) + put(2, self.unit)
        duration = put(1, int(until_reset)) + put(2, int((until_reset % 1) * 1e9))
        return (put(1, OVER_LIMIT if over else OK) + put(2, limit)
                + put(3, 0 if over else self.limit - count) + put(4, duration)), over


def serve(limit, unit, mode):
    limiter = Limiter(limit, unit)
    printing = threading.Lock()

    def should_rate_limit(data, context):
        request = parse_request(data)
        with printing:
            print(json.dumps(request), flush=True)
        if mode == "unavailable":
            context.abort(grpc.StatusCode.UNAVAILABLE, "down for the test")
        if mode == "slow":
            time.sleep(2)
        statuses, overall = b"", OK
        for descriptor in request["descriptors"]:
            hits = descriptor["hits_addend"]
            status, over = limiter.status(descriptor, request["hits_addend"] if hits is None else hits)
            statuses += put(2, status)
            overall = OVER_LIMIT if over else overall
        return put(1, overall) + statuses

    handler = grpc.method_handlers_generic_handler(
        "envoy.service.ratelimit.v3.RateLimitService",
        {"ShouldRateLimit": grpc.unary_unary_rpc_method_handler(should_rate_limit)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"] and len(sys.argv) in (4, 5):
        serve(int(sys.argv[2]), sys.argv[3], sys.argv[4] if len(sys.argv) == 5 else "ok")
    else:
        sys.exit(__doc__)
