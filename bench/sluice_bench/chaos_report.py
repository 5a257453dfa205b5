"""The chaos section of docs/reliability.md: what the faults were, what each column means, a row
per phase, and the filter's counters over the run."""

from .chaos_faults import (CLOSED_RATE, CLOSED_RATE_LIMIT, EMERGENCY_BURST, EMERGENCY_RATE, GLOBAL_BURST,
                           GLOBAL_RATE, OPEN_RATE, TIMEOUT_MS)
from .facts import facts_lines
from .markdown import table, write_section
from .paths import RELIABILITY_MD


def report(info, args, phases, counters):
    """Writes the section; its lines."""
    bound = TIMEOUT_MS + args.margin_ms
    totals = {k: sum(c.get(k, 0) for c in counters) for k in counters[0]} if counters else {}
    lines = [
        "## Chaos (`make chaos`, bench/chaos.py)",
        "",
        *facts_lines(info),
        "",
        "redis-server, sluice-service and two Envoys (E1, E2; 2 workers each) on 127.0.0.1. "
        f"`shared-open` (/api/open, per `x-user-id`): global {GLOBAL_RATE}/s burst {GLOBAL_BURST} across both "
        f"Envoys (never low under this load), failure_mode open, emergency {EMERGENCY_RATE}/s burst "
        f"{EMERGENCY_BURST} per Envoy. "
        f"`tenant-closed` (/api/closed, per `x-tenant`): global {CLOSED_RATE_LIMIT}/s, failure_mode closed. "
        f"Callout timeout {TIMEOUT_MS} ms. Load: Python clients on keep-alive connections, per Envoy "
        f"{OPEN_RATE}/s of one user to /api/open and {CLOSED_RATE}/s of one tenant to "
        f"/api/closed, every request timed. Each fault lasts {args.fault_seconds:g} s; a phase runs from 1 s "
        f"before the fault until {args.quiet_seconds:g} s of only global decisions on both Envoys.",
        "",
        "- *Unexpected*: a connection error, a status other than 200 or 429, a 503 not from "
        "`tenant-closed`, or an open-policy answer without a known limit.",
        f"- *Worst latency* must be ≤ the callout timeout + {args.margin_ms:g} ms = {bound:g} ms "
        "(client-side, Python: includes the client's own scheduling).",
        f"- *Emergency*: per Envoy, open-policy requests admitted by the emergency budget (a 200 with "
        f"fewer than {EMERGENCY_BURST} tokens left; healthy answers leave over 100) against "
        f"{EMERGENCY_BURST} + {EMERGENCY_RATE}/s × the time between its first and last degraded decision.",
        "- *Recovered after*: from lifting the fault to the last degraded answer (a 503 of the closed "
        "policy or an emergency decision) on either Envoy.",
        "",
        *table(
            ["Fault", "Lasted", "Requests", "Answered (by status)", "Unexpected",
             "Open: global 200 · emergency 200 · 429", "503 (closed)",
             "Worst latency", "p99", "Emergency admits (within)", "Recovered after"],
            [phase_row(p, bound) for p in phases],
        ),
        "",
        "Filter counters over the run (both Envoys): "
        + ", ".join(f"`{k}` {v:,}" for k, v in sorted(totals.items()) if k.startswith("sluice.")) + ".",
    ]
    write_section(RELIABILITY_MD, "chaos", lines)
    return lines


def phase_row(p, bound):
    statuses = ", ".join(f"{s}: {n:,}" for s, n in p["status"].items())
    return [
        p["name"],
        f"{p['fault_seconds']:.1f} s" if p["fault_seconds"] else "–",
        f"{p['requests']:,}",
        f"{p['answered']:,} ({statuses})",
        f"{p['unexpected']}" if not p["unexpected"] else f"**{p['unexpected']}**",
        f"{p['global_open_admitted']:,} · {p['open_emergency_admitted']:,} · {p['open_429']:,}",
        f"{p['closed_503']:,}",
        f"{p['worst_ms']:.0f} ms" + ("" if p["worst_ms"] <= bound else " **over**"),
        f"{p['p99_ms']:.1f} ms",
        emergency_cell(p["emergency"]),
        "–" if p["name"].startswith("none") else ("**never**" if p["recover_s"] is None else f"{p['recover_s']:.2f} s"),
    ]


def emergency_cell(e):
    """Each Envoy's emergency admissions against its budget, and whether both kept within."""
    per_envoy = "; ".join(
        f"E{i + 1}: {e[i]['admitted']} ≤ {e[i]['budget']:.0f}" if e[i]["admitted"] or e[i]["span"] else f"E{i + 1}: 0"
        for i in (0, 1)
    )
    return f"{per_envoy} ({'yes' if all(x['within'] for x in e.values()) else '**no**'})"
