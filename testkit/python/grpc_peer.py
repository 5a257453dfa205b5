"""A real gRPC server and client (grpcio) for sluice's tests, with no generated code: one unary
method, /sluice.test.Echo/Echo, whose messages are raw bytes.

  grpc_peer.py serve
      Serves on a free port of 127.0.0.1, prints the port on a line, and serves until killed.
  grpc_peer.py call HOST:PORT N [KEY=VALUE ...]
      Makes N calls one after the other, each with the metadata given, and prints one JSON line
      per call: {"code": "OK", "details": "...", "metadata": {...}}, the metadata being the
      initial and trailing metadata the client received (a trailers-only answer has only the
      latter).
"""

import json
import sys
from concurrent import futures

import grpc

METHOD = "/sluice.test.Echo/Echo"
# Never through a proxy from the environment: the tests talk to loopback only.
OPTIONS = [("grpc.enable_http_proxy", 0)]
CALL_TIMEOUT_S = 5


def serve():
    handler = grpc.method_handlers_generic_handler(
        "sluice.test.Echo",
        {"Echo": grpc.unary_unary_rpc_method_handler(lambda request, context: request)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    server.wait_for_termination()


def call(target, n, pairs):
    metadata = [tuple(pair.split("=", 1)) for pair in pairs]
    with grpc.insecure_channel(target, options=OPTIONS) as channel:
        echo = channel.unary_unary(METHOD)
        for _ in range(n):
            try:
                _, done = echo.with_call(b"ping", metadata=metadata, timeout=CALL_TIMEOUT_S)
                code, details = grpc.StatusCode.OK, ""
            except grpc.RpcError as error:
                done, code, details = error, error.code(), error.details() or ""
            received = list(done.initial_metadata() or []) + list(done.trailing_metadata() or [])
            print(json.dumps({"code": code.name, "details": details,
                              "metadata": {k: v for k, v in received if isinstance(v, str)}}),
                  flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve()
    elif sys.argv[1:2] == ["call"] and len(sys.argv) >= 4:
        call(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    else:
        sys.exit(__doc__)
