"""`make soak`, part (b) (bench/soak.py tells the design): mixed local and global traffic through
redis-server, sluice-service and one Envoy for SOAK_MINUTES; the RSS of all three every 10 s,
every status counted."""

import time

from .builds import service_binary
from .envoy import sluice_envoy
from .envoy_config import service_cluster, service_settings
from .load import wrk_script
from .measure import Sampler
from .processes import log
from .services import redis_and_service

MIXED_LUA = r"""
-- Mixed traffic, paced: each connection sends one request every DELAY_MS. Users u0..u19 (u0 is
-- hot: a third of all requests, so it is often denied), tenants t0..t3, and a path without
-- policies now and then. Counts every status.
mixed_200, mixed_429, mixed_503, mixed_5xx, mixed_other = 0, 0, 0, 0, 0
local delay_ms = tonumber(os.getenv("DELAY_MS"))

function init(args)
  math.randomseed(1000 + id)
end

function delay()
  return delay_ms
end

function request()
  local r = math.random(30)
  local user = (r <= 10) and "u0" or ("u" .. math.random(19))
  local tenant = "t" .. math.random(0, 3)
  local path = (r == 30) and "/health" or "/api/items"
  return wrk.format("GET", path, {["x-user-id"] = user, ["x-tenant"] = tenant})
end

function response(status, headers, body)
  if status == 200 then mixed_200 = mixed_200 + 1
  elseif status == 429 then mixed_429 = mixed_429 + 1
  elseif status == 503 then mixed_503 = mixed_503 + 1
  elseif status >= 500 then mixed_5xx = mixed_5xx + 1
  else mixed_other = mixed_other + 1 end
end

function done(summary, latency, requests)
  print_totals({"mixed_200", "mixed_429", "mixed_503", "mixed_5xx", "mixed_other"})
end
"""


def mixed_config():
    return {
        "version": "soak-mixed",
        "headers": "legacy",
        "global": service_settings("100ms"),
        "policies": [
            {"name": "local-user", "match": {"path_prefix": "/api/"}, "key": ["header:x-user-id"],
             "requests": 40, "per": "1s", "burst": 40},
            {"name": "global-user", "scope": "global", "match": {"path_prefix": "/api/"},
             "key": ["header:x-user-id"], "requests": 30, "per": "1s", "burst": 30, "lease": 5,
             "failure_mode": "open"},
            {"name": "global-tenant", "scope": "global", "match": {"path_prefix": "/api/"},
             "key": ["header:x-tenant"], "requests": 1000, "per": "1s", "burst": 1000,
             "failure_mode": "closed"},
        ],
    }


def mixed(envoy_bin, workdir, args):
    seconds = int(args.minutes * 60)
    with redis_and_service(workdir, service_binary()) as (redis, service), \
            sluice_envoy(envoy_bin, "mixed", mixed_config(), workdir, [service_cluster(service.port)]) as envoy:
        envoy.start()
        time.sleep(1)

        def probe():
            http = envoy.downstream_counts()
            return {"envoy": envoy.rss_mib(), "service": service.rss_mib(), "redis": redis.rss_mib(),
                    "5xx": http["5xx"], "completed": http["completed"]}

        with Sampler(probe, 10.0, time.monotonic() + seconds + 120) as sampler:
            log(f"mixed: {seconds}s of wrk -t2 -c{args.mixed_connections}, one request per connection every "
                f"{args.delay_ms} ms; RSS every 10 s")
            load = wrk_script(envoy.port, seconds, args.mixed_connections, 2, MIXED_LUA, workdir,
                              env={"DELAY_MS": str(args.delay_ms)})
            time.sleep(1.5)
            sampler.take()
        counters, http = envoy.wasm_counters(), envoy.downstream_counts()
    samples = [s for s in sampler.samples if "envoy" in s]
    return {
        "config": mixed_config(),
        "seconds": seconds,
        "load": {k: v for k, v in load.items() if k != "stdout"},
        "counters": counters,
        "http": http,
        "samples": samples,
        "after_warmup": next((s for s in samples if s["t"] >= args.warmup_seconds), samples[0]),
        "end": samples[-1],
    }
