"""The soak's sections of docs/reliability.md: "soak-flood" for part (a) and "soak-mixed" for
part (b), each rewritten only by a run of its part (--skip-mixed, --skip-flood leave the other's
figures in place)."""

from .envoy_config import policy_counter
from .facts import facts_lines
from .markdown import table, write_section
from .paths import RELIABILITY_MD
from .soak_flood import (CLIENT_BURST, CLIENT_RATE_PER_H, DRAINED, GREEDY_RATE, KEY_BURST, KEY_RATE_PER_H,
                         LEGIT_LEAD, MAX_KEYS, NEWCOMERS, STEADY_RATE, USER_BURST, USER_RATE)


def report(info, args, a, b):
    """Writes the sections of the parts that ran (`a`, `b`: their results, or None); their lines."""
    printed = []
    if a:
        lines = flood_section(facts_lines(info), args, a)
        write_section(RELIABILITY_MD, "soak-flood", lines)
        printed += lines
    if b:
        lines = mixed_section(facts_lines(info), args, b)
        write_section(RELIABILITY_MD, "soak-mixed", lines)
        printed += [""] + lines
    return printed


def flood_section(facts, args, a):
    return [
        "### (a) A flood of new keys against max_keys 10,000",
        "",
        *facts,
        "",
        f"One Envoy, 2 workers (`--concurrency 2`, not pinned), `GET /api/items`. Policies: `per-user` "
        f"(`x-user-id`, {USER_RATE}/s, burst {USER_BURST}: a token back every 100 ms), `per-api-key` "
        f"(`x-api-key`, {KEY_RATE_PER_H}/h, burst {KEY_BURST}: a token back every 1.8 s) and `per-client` "
        f"(`x-client-id`, {CLIENT_RATE_PER_H}/h, burst {CLIENT_BURST}: a token back every 6 minutes), each "
        f"`max_keys` {MAX_KEYS:,}: three tables of up to {MAX_KEYS:,} keys. wrk (`-t2 -c{args.connections}`, a "
        f"Lua script) sent every request with a new `x-user-id`, `x-api-key` and `x-client-id`, stopping "
        f"after {args.flood_keys:,}; two legitimate clients on their own keep-alive connections ran from "
        f"{LEGIT_LEAD:.0f} s before to {LEGIT_LEAD:.0f} s after it; {NEWCOMERS} newcomers sent "
        f"{CLIENT_BURST + 3} requests each (`x-client-id` only, a connection each) at points spread over "
        f"the flood; {DRAINED} `x-client-id`s drained before it ({CLIENT_BURST + 1} requests each) asked "
        f"again half-way through and after it.",
        "",
        *flood_table(a),
        "",
        *table(["Envoy RSS", "MiB"], [
            ["same filter with max_keys 1 (control)", f"{a['rss']['control']:.1f}"],
            ["before the flood (three tables holding the drained keys)", f"{a['rss']['before']:.1f}"],
            ["largest sample during the flood (every 1 s)", f"{a['rss']['max_during']:.1f}"],
            ["at the end of the flood", f"{a['rss']['end_of_flood']:.1f}"],
            [f"{LEGIT_LEAD + 1.5:.1f} s later", f"{a['rss']['after']:.1f}"],
        ]),
        "",
        "RSS samples during the flood (MiB, every second): "
        + " ".join(f"{x:.1f}" for x in a["rss"]["samples"]) + ".",
        "",
        *legit_table(a["legit"]),
        "",
        *newcomer_table(a["newcomers"], a["drained"]),
        "",
        key_bound(a["key_bytes"]),
    ]


def flood_table(a):
    load, c, s = a["load"], a["counters"], a["load"]["script"]

    def both(x, y):
        return f"{c.get(x, 0):,} / {c.get(y, 0):,}"

    def outcomes(p):
        return both(policy_counter(p, "allowed"), policy_counter(p, "denied"))

    return table(["Flood", "Value"], [
        ["requests sent (each a new key)", f"{s.get('flood_sent', load['requests']):,}"],
        ["took", f"{a['flood_seconds']:.1f} s ({load['rps']:,.0f} requests/s)"],
        ["200 / 429 / other", f"{s.get('flood_200', 0):,} / {s.get('flood_429', 0):,} / {s.get('flood_other', 0):,}"],
        ["socket errors", f"{load['socket_errors']:,}"],
        ["Envoy 5xx (`downstream_rq_5xx`)", f"{a['http']['5xx']:,}"],
        ["`sluice.evictions` / `sluice.forgiven` (tokens)", both("sluice.evictions", "sluice.forgiven")],
        ["`per-user` allowed / denied", outcomes("per-user")],
        ["`per-api-key` allowed / denied", outcomes("per-api-key")],
        ["`per-client` allowed / denied", outcomes("per-client")],
        ["`cas_retries` / `cas_exhausted`", both("sluice.cas_retries", "sluice.cas_exhausted")],
    ])


def legit_table(legit):
    steady, greedy = legit["steady"], legit["greedy"]
    return table(
        ["Legitimate client", "Rate", "Requests", "200", "429 (by policy)", "Errors / other", "Expected",
         "Worst latency"],
        [
            ["`steady` (`x-user-id` and `x-api-key`, under both limits)", f"{STEADY_RATE}/s", *outcome(steady),
             f"all {steady['requests']} 200", f"{steady['max_latency_ms']:.0f} ms"],
            ["`greedy` (`x-user-id` only, twice per-user's rate)", f"{GREEDY_RATE}/s", *outcome(greedy),
             f"{USER_BURST} + {USER_RATE} x {greedy['span_s']:.2f} s = {greedy['ideal']:.1f} 200",
             f"{greedy['max_latency_ms']:.0f} ms"],
        ],
    )


def newcomer_table(newcomers, drained):
    """Whether each newcomer got exactly its burst, and each drained key stayed drained."""
    exact = [200] * CLIENT_BURST + [429] * 3
    odd = "".join(f"; {k}: {v}" for k, v in newcomers.items() if v != exact)
    stayed = [k for k in drained["before"] if drained["during"].get(k) == [429] and drained["after"].get(k) == [429]]
    return table(["Keys of `per-client`", "Expected", "Got"], [
        [f"{NEWCOMERS} newcomers during the flood", f"each {CLIENT_BURST} x 200, then 3 x 429",
         f"{sum(1 for v in newcomers.values() if v == exact)} of {len(newcomers)} exactly{odd}"],
        [f"{DRAINED} keys drained before the flood", "429 half-way through and after it",
         f"{len(stayed)} of {len(drained['before'])} stayed drained"],
    ])


def outcome(client):
    """What a legitimate client got: requests, 200s, 429s (by policy), errors / other statuses."""
    return [client["requests"], client["200"], f"{client['429']} {client['denied_by'] or ''}".strip(),
            f"{client['errors']} / {client['other']}"]


def key_bound(key_bytes):
    per_table_mib = MAX_KEYS * key_bytes / 2**20
    return (
        f"**The bound per policy.** A table holds at most `max_keys` keys, whatever the number of keys "
        f"sent: here {MAX_KEYS:,} per key layout, in pages of up to 32 records created as keys arrive "
        f"(a token bucket's record is 26 bytes). Measured here as the growth of Envoy's RSS from before "
        f"the flood to after it, over the {3 * MAX_KEYS:,} keys the three tables then hold, the flood's "
        f"connections and Envoy's per-page overhead included: "
        f"**{key_bytes:.0f} bytes per key**, so about {per_table_mib:.1f} MiB per full table of "
        f"{MAX_KEYS:,} keys."
    )


def mixed_section(facts, args, b):
    return [
        f"### (b) Mixed traffic, {b['seconds'] / 60:g} minutes, with the service and Redis",
        "",
        *facts,
        "",
        "redis-server, sluice-service and one Envoy (2 workers). Policies on `/api/`: `local-user` "
        "(local, 40/s burst 40 per `x-user-id`), `global-user` (global, 30/s burst 30, lease 5, "
        "failure_mode open) and `global-tenant` (global, 1000/s per `x-tenant`, failure_mode "
        "**closed**); callout timeout 100 ms. wrk (`-t2 -c"
        f"{args.mixed_connections}`, a Lua script) paced each connection to one request every "
        f"{args.delay_ms} ms: users u0..u19 (u0 a third of all requests, so often denied), tenants "
        "t0..t3, and 1 in 30 requests to `/health` (no policy). RSS sampled every 10 s; "
        f"\"after warm-up\" is the first sample at or after {args.warmup_seconds} s.",
        "",
        *mixed_table(b),
        "",
        *rss_table(b),
        "",
        "Envoy RSS every 10 s (MiB): " + " ".join(f"{x['envoy']:.1f}" for x in b["samples"]) + ".",
        "",
        "sluice-service RSS every 10 s (MiB): " + " ".join(f"{x['service']:.1f}" for x in b["samples"]) + ".",
    ]


def mixed_table(b):
    load, c, s = b["load"], b["counters"], b["load"]["script"]
    policies = [p["name"] for p in b["config"]["policies"]]
    rows = [
        ["requests", f"{load['requests']:,} ({load['rps']:,.0f}/s)"],
        ["200 / 429", f"{s.get('mixed_200', 0):,} / {s.get('mixed_429', 0):,}"],
        ["503 / other 5xx / other", f"{s.get('mixed_503', 0):,} / {s.get('mixed_5xx', 0):,} / {s.get('mixed_other', 0):,}"],
        ["Envoy `downstream_rq_5xx`", f"{b['http']['5xx']:,}"],
        ["socket errors", f"{load['socket_errors']:,}"],
        ["latency p50 / p99 / max", f"{load['p50_ms']:.2f} / {load['p99_ms']:.2f} / {load['max_ms']:.1f} ms"],
        ["callouts / callout_failures", f"{c.get('sluice.callouts', 0):,} / {c.get('sluice.callout_failures', 0):,}"],
    ]
    rows += [
        [f"`{p}` allowed / denied / degraded",
         " / ".join(f"{c.get(policy_counter(p, what), 0):,}" for what in ("allowed", "denied", "degraded"))]
        for p in policies
    ]
    return table(["Mixed", "Value"], rows)


def rss_table(b):
    warm, end, samples = b["after_warmup"], b["end"], b["samples"]
    return table(["RSS (MiB)", "after warm-up → end (change)", "min", "max"], [
        [name, f"{warm[key]:.1f} → {end[key]:.1f} ({end[key] - warm[key]:+.1f})",
         f"{min(x[key] for x in samples):.1f}", f"{max(x[key] for x in samples):.1f}"]
        for name, key in [("Envoy", "envoy"), ("sluice-service", "service"), ("redis-server", "redis")]
    ])
