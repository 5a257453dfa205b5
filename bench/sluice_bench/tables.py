"""`bench/tables.py`: what a key table costs against its `max_keys`: the time an Envoy with it
takes to be ready, and its resident memory per key once the table is full, over the same Envoy
with `max_keys` 1 given the same requests. One build or two (a wasm given as the one before a
change), each through a real Envoy with 2 workers; rewrites the "tables" section of
BENCHMARKS.md."""

import time

from .envoy import Envoy
from .envoy_config import wasm_filter
from .load import wrk_script
from .markdown import figure, table
from .processes import log

SIZES = (1, 10_000, 100_000, 1_000_000)
FILL_THREADS, FILL_CONNECTIONS = 2, 16

FILL_LUA = r"""
-- Each request a new x-user-id; each thread stops after FILL_PER_THREAD.
fill_sent, fill_200 = 0, 0
local limit = tonumber(os.getenv("FILL_PER_THREAD"))

function request()
  fill_sent = fill_sent + 1
  return wrk.format("GET", "/api/items", {["x-user-id"] = "user-" .. id .. "-" .. fill_sent})
end

function response(status, headers, body)
  if status == 200 then fill_200 = fill_200 + 1 end
  if fill_sent >= limit then wrk.thread:stop() end
end

function done(summary, latency, requests)
  print_totals({"fill_sent", "fill_200"})
end
"""


def config(max_keys):
    return {"version": "tables", "headers": "legacy", "policies": [
        {"name": "per-user", "key": ["header:x-user-id"], "requests": 10, "per": "1s", "burst": 10,
         "max_keys": max_keys}]}


def fill(envoy, keys, workdir):
    """One request for each of `keys` new keys (at least `keys`: each thread sends its share)."""
    per_thread = -(-keys // FILL_THREADS)
    completed = envoy.downstream_counts()["completed"]
    target = completed + per_thread * FILL_THREADS

    def answered():
        return envoy.downstream_counts()["completed"] >= target - FILL_CONNECTIONS

    result = wrk_script(envoy.port, 900, FILL_CONNECTIONS, FILL_THREADS, FILL_LUA, workdir,
                        env={"FILL_PER_THREAD": str(per_thread)}, until=answered)
    return result["script"].get("fill_sent", 0)


def one(envoy_bin, wasm, max_keys, keys, workdir):
    """An Envoy with `wasm` and a table of `max_keys`: seconds to ready, and MiB after `keys` keys."""
    name = f"tables-{max_keys}"
    with Envoy(envoy_bin, name, [wasm_filter(wasm, config(max_keys), "sluice")], workdir,
               concurrency=2, pin=False) as envoy:
        started = time.monotonic()
        envoy.start(timeout=120)
        ready = time.monotonic() - started
        sent = fill(envoy, keys, workdir) if keys else 0
        time.sleep(1)
        return ready, envoy.rss_mib(), sent


def measure(envoy_bin, builds, workdir):
    """For each build (label, wasm) and size: ready seconds, RSS and bytes per key over the
    control (max_keys 1, the same keys)."""
    results = {}
    for label, wasm in builds:
        rows = []
        for max_keys in SIZES:
            keys = max_keys if max_keys > 1 else 0
            control_ready, control_rss, _ = one(envoy_bin, wasm, 1, keys, workdir)
            ready, rss, sent = one(envoy_bin, wasm, max_keys, keys, workdir)
            per_key = (rss - control_rss) * 2**20 / max_keys if keys else None
            log(f"{label}: max_keys {max_keys:,}: ready {ready:.2f} s (control {control_ready:.2f} s), "
                f"RSS {rss:.1f} MiB after {sent:,} keys (control {control_rss:.1f}), "
                f"{figure(per_key, '.0f')} bytes a key")
            rows.append({"max_keys": max_keys, "ready_s": ready, "control_ready_s": control_ready,
                         "rss_mib": rss, "control_rss_mib": control_rss, "keys_sent": sent,
                         "bytes_per_key": per_key})
        results[label] = rows
    return results


def report(info_lines, results):
    rows = []
    for label, sizes in results.items():
        for r in sizes:
            rows.append([label, f"{r['max_keys']:,}", f"{r['ready_s']:.2f} s", f"{r['control_ready_s']:.2f} s",
                         f"{r['rss_mib']:.1f}", f"{r['control_rss_mib']:.1f}",
                         figure(r["bytes_per_key"], ".0f")])
    return [
        "## Key tables against `max_keys`",
        "",
        *info_lines,
        "",
        "`python3 bench/tables.py` (`--before OLD.wasm` adds the build before a change). One Envoy "
        "with 2 workers per row, one token bucket per `x-user-id` with `max_keys` as given; wrk "
        f"(`-t{FILL_THREADS} -c{FILL_CONNECTIONS}`) sends one request with each of `max_keys` new keys, "
        "so that the table is full; the control is the same build with `max_keys: 1` given the same "
        "requests. Bytes per key: (RSS − control RSS) / `max_keys`, Envoy's own per-entry "
        "overhead and allocator included. Two Envoys given the same requests differ by about "
        "1 MiB whatever they keep: a table of 10,000 keys (under half a MiB) is within that, so "
        "read its rows as noise.",
        "",
        *table(["Build", "max_keys", "ready", "ready (max_keys 1)", "RSS MiB full", "control RSS MiB",
                "bytes per key"], rows, "llrrrrr"),
    ]
