#!/usr/bin/env python3
"""Where Redis's time goes (issue 37): the Redis CPU per check of the scripts alone, with no
service in the way. A redis-server of its own (on LOAD_CORE) is sent pipelined EVALSHAs (33 checks
a round trip) by this script, and its utime+stime (`/proc/<pid>/stat`) over 100,000 checks of a
fixed window (a limit never reached) is divided by the checks:

- the one-check script (`FIXED_WINDOW_LUA`), one EVALSHA per check, as the store ran before
  issue 37 (and still runs for the settlements' charges);
- `CHECKS_LUA`, batches of 1 to 128 checks, on 1,000 keys and on one hot key;
- for scale, the pattern of a counter kept by `INCRBY`: an `MGET` of the counter, then a script
  that increments it (and sets its expiry when it is new), two commands per check.

Informative only: the figures that count are bench/rls.py's, with the servers in the way. The
scripts come from the service's source (`cargo run -p sluice-service --example dump_lua`).

  python3 bench/redis_lua.py
"""

import os
import random
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sluice_bench.paths import ROOT  # noqa: E402
from sluice_bench.processes import LOAD_CORE, free_ports, launch_prefix  # noqa: E402

CHECKS = 100_000
DEPTH = 33
WINDOW_US, LIMIT = 60_000_000, 1_000_000_000
# A counter kept by INCRBY: KEYS[1] the counter, ARGV[1] its TTL in s, ARGV[2] the hits.
INCRBY_LUA = """
local count = redis.call('INCRBY', KEYS[1], ARGV[2])
if count == tonumber(ARGV[2]) then
  redis.call('EXPIRE', KEYS[1], ARGV[1])
end
return count
"""


def command(*args):
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        arg = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


class Client:
    def __init__(self, port):
        self.sock, self.buf = socket.create_connection(("127.0.0.1", port)), b""

    def _line(self):
        while b"\r\n" not in self.buf:
            self.buf += self.sock.recv(1 << 20)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _reply(self):
        line = self._line()
        kind = line[:1]
        if kind == b"-":
            raise RuntimeError(line.decode())
        if kind == b"$":
            n = int(line[1:])
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self.buf += self.sock.recv(1 << 20)
            value, self.buf = self.buf[:n], self.buf[n + 2:]
            return value
        if kind == b"*":
            return [self._reply() for _ in range(max(int(line[1:]), 0))]
        return line[1:]

    def send(self, commands):
        self.sock.sendall(b"".join(commands))
        return [self._reply() for _ in commands]


def cpu_seconds(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def state_key(n):
    return f"sluice:rls:{{{n:032x}}}:fixed_window/{WINDOW_US}/{LIMIT}"


def main():
    with tempfile.TemporaryDirectory(prefix="sluice-redis-lua-") as tmp:
        subprocess.run(["cargo", "run", "-q", "-p", "sluice-service", "--example", "dump_lua", "--", tmp],
                       cwd=ROOT, check=True, capture_output=True)
        scripts = {name: (Path(tmp) / f"{name}.lua").read_text() for name in ("fixed_window", "checks")}
    port = free_ports(1)[0]
    redis = subprocess.Popen(launch_prefix(LOAD_CORE) + ["redis-server", "--port", str(port), "--save", "",
                                                         "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                client = Client(port)
                break
            except OSError:
                time.sleep(0.05)
        sha = {name: client.send([command("SCRIPT", "LOAD", text)])[0].decode()
               for name, text in [*scripts.items(), ("incrby", INCRBY_LUA)]}
        print(f"{'':38} {'1,000 keys':>12} {'one key':>12}   (Redis CPU µs per check)")

        def measure(label, round_trip, size):
            row = []
            for keys in (1000, 1):
                rng = random.Random(37)
                client.send([command("FLUSHALL")])
                done, before = 0, cpu_seconds(redis.pid)
                while done < CHECKS:
                    client.send(round_trip(rng, keys))
                    done += DEPTH // size * size
                row.append(1e6 * (cpu_seconds(redis.pid) - before) / done)
            print(f"{label:38} {row[0]:12.2f} {row[1]:12.2f}", flush=True)

        def one_check(rng, keys):
            return [command("EVALSHA", sha["fixed_window"], 1, state_key(rng.randrange(keys)), WINDOW_US, LIMIT, 1,
                            1, LIMIT) for _ in range(DEPTH)]

        def incrby(rng, keys):
            out = []
            for _ in range(DEPTH):
                key = f"counter:{{bench}}:{rng.randrange(keys)}"
                out += [command("MGET", key), command("EVALSHA", sha["incrby"], 1, key, 60, 1)]
            return out

        def batches(size):
            def round_trip(rng, keys):
                out = []
                for _ in range(DEPTH // size):
                    drawn = [state_key(rng.randrange(keys)) for _ in range(size)]
                    unique = list(dict.fromkeys(drawn))
                    records = b"".join(struct.pack("<BHddddd", 2, unique.index(k) + 1, WINDOW_US, LIMIT, 1, 1, LIMIT)
                                       for k in drawn)
                    out.append(command("EVALSHA", sha["checks"], len(unique), *unique, records))
                return out
            return round_trip

        measure("FIXED_WINDOW_LUA, one EVALSHA a check", one_check, 1)
        for size in (1, 4, 11, 16, 33):
            measure(f"CHECKS_LUA, batches of {size}", batches(size), size)
        measure("MGET + INCRBY script, per check", incrby, 1)
    finally:
        redis.terminate()
        redis.wait(timeout=10)


if __name__ == "__main__":
    main()
