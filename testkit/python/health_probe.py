"""grpc.health.v1.Health asked as grpc_health_probe asks it (grpcio, no generated code): the
request is one string (HealthCheckRequest.service, field 1) and the answer one enum
(HealthCheckResponse.status, field 1), both written and read by hand here.

  health_probe.py check HOST:PORT SERVICE
      One Check (a 2 s deadline); prints the status (SERVING, NOT_SERVING, ...) or the call's
      failure code (NOT_FOUND, UNAVAILABLE, ...) on a line.
  health_probe.py watch HOST:PORT SERVICE SECONDS
      One Watch; prints each status the stream sends, a line each as it comes, or the failure
      code, until SECONDS have passed.
"""

import sys

import grpc

OPTIONS = [("grpc.enable_http_proxy", 0)]
CHECK = "/grpc.health.v1.Health/Check"
WATCH = "/grpc.health.v1.Health/Watch"
CHECK_TIMEOUT_S = 2
STATUSES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def request(service):
    name = service.encode()
    return b"\x0a" + bytes([len(name)]) + name if name else b""


def status(message):
    """Field 1, a varint below 128 (the four statuses); absent is 0."""
    if len(message) >= 2 and message[0] == 0x08:
        return STATUSES.get(message[1], str(message[1]))
    return STATUSES[0]


def check(target, service):
    with grpc.insecure_channel(target, options=OPTIONS) as channel:
        try:
            answer = channel.unary_unary(CHECK)(request(service), timeout=CHECK_TIMEOUT_S)
            print(status(answer), flush=True)
        except grpc.RpcError as error:
            print(error.code().name, flush=True)


def watch(target, service, seconds):
    with grpc.insecure_channel(target, options=OPTIONS) as channel:
        try:
            for answer in channel.unary_stream(WATCH)(request(service), timeout=seconds):
                print(status(answer), flush=True)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                print(error.code().name, flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) == 3 and args[0] == "check":
        check(args[1], args[2])
    elif len(args) == 4 and args[0] == "watch":
        watch(args[1], args[2], float(args[3]))
    else:
        sys.exit(__doc__)
