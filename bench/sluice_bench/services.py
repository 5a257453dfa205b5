"""The services global policies need, as children of ours: redis-server (no persistence: a
restart empties it) and sluice-service in front of it, each on a port of its own."""

import contextlib
import socket

from .load import http_get
from .processes import Child


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
    """sluice-service in front of a Redis (started once Redis answers)."""

    name = "service"

    def __init__(self, workdir, redis, binary, port=None, core=None):
        super().__init__(workdir, port, core)
        self.redis, self.binary = redis, binary

    def command(self):
        return [str(self.binary), "--listen", f"127.0.0.1:{self.port}", "--redis", self.redis.url]

    def ready(self):
        """Ready once it reaches Redis (it serves, with 503s, before that)."""
        try:
            return http_get(self.port, "/readyz")[0] == 200
        except OSError:
            return False


@contextlib.contextmanager
def redis_and_service(workdir, binary, port=None, core=None, timeout=15):
    """redis-server and sluice-service in front of it, started; both stopped on the way out."""
    with Redis(workdir, core=core) as redis, Service(workdir, redis, binary, port, core) as service:
        redis.start(timeout)
        service.start(timeout)
        yield redis, service
