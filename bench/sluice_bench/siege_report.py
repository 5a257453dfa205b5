"""The "siege" section of docs/reliability.md, from `siege_attacks.run_siege`'s results, and the
verdict: every legitimate call answered exactly within the bar, the service's RSS and Redis'
used_memory within their bounds."""

from .markdown import table, write_section
from .paths import RELIABILITY_MD
from .siege_attacks import ANSWERED_WITHIN_S, FD_LIMIT, LEGIT_EVERY_S, LEGIT_LIMIT


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))] if ordered else float("nan")


def failures(results, args):
    """What the run failed, as phrases; empty when it passed."""
    bad = []
    for name, client in results["legit"].items():
        if client["failed"] or client["wrong"]:
            bad.append(f"{name}: {client['failed']} unanswered, {len(client['wrong'])} wrong")
        if max(client["latencies_ms"], default=0) > ANSWERED_WITHIN_S * 1000:
            bad.append(f"{name}: over {ANSWERED_WITHIN_S} s")
    rss = max(s["rss_mib"] for s in results["samples"])
    if rss > args.max_rss_mib:
        bad.append(f"service RSS {rss:.1f} MiB over {args.max_rss_mib}")
    used = max(s["redis_used"] for s in results["samples"])
    if used > results["maxmemory_mb"] * 1024 * 1024 * 1.05:
        bad.append(f"Redis used_memory {used} over maxmemory")
    return bad


def report(info_lines, args, results):
    """Writes the section; its lines."""
    samples = results["samples"]
    rss = [s["rss_mib"] for s in samples]
    used = [s["redis_used"] / 1024 / 1024 for s in samples]
    fds = [s["fds"] for s in samples]
    swarms, flood, labels = results["swarms"], results["flood"], results["labels"]
    legit_rows = []
    for name, c in results["legit"].items():
        lat = c["latencies_ms"]
        legit_rows.append([
            name, f"{c['calls']:,}", f"{c['answered']:,}", "yes" if not c["wrong"] and not c["failed"] else "**no**",
            f"{c['retries']:,}", f"{percentile(lat, 0.5):.1f}", f"{percentile(lat, 0.99):.1f}",
            f"{max(lat, default=float('nan')):.1f}"])
    swarm_rows = [[name, f"{s['n']:,}", f"{s['held_min']:,} to {s['held_max']:,}",
                   f"{s['closed_by_service']:,}", f"{s['failed_connects']:,}"] for name, s in swarms.items()]
    closed = {line.split("{")[1].split("}")[0]: line.rsplit(" ", 1)[1] for line in results["closed"]}
    verdict = failures(results, args)
    lines = [
        "## Hostile callers (`make siege`, bench/siege.py)",
        "",
        *info_lines,
        "",
        f"sluice-service (HTTP and `--rls`, every connection flag at its default) under `ulimit -n "
        f"{FD_LIMIT}`, in front of a redis-server with `--maxmemory {results['maxmemory_mb']}mb "
        f"--maxmemory-policy allkeys-lfu`, for {results['seconds']} s of every attack of issue 20 at once, "
        f"each attacker opening again at once whatever the service closed: "
        f"{swarms['slowloris']['n']} slowloris connections to HTTP (a header byte every second), "
        f"{swarms['idle-http2']['n']} idle HTTP/2 connections to the RLS (preface and SETTINGS, nothing "
        f"more), {swarms['half-sent-streams']['n']} HTTP/2 connections of 100 half-sent calls each (each "
        f"declaring 4 MB, sending 8 KiB), {args.flooders} key flooders (16 new keys of a month per check, "
        f"as fast as a connection goes) and RLS calls with {args.label_bytes:,}-byte descriptor values, all "
        f"different, on a `detailed_metric` descriptor and as limit overrides. Meanwhile two legitimate "
        f"clients called every {LEGIT_EVERY_S * 1000:.0f} ms, one `/v1/check` and one RLS, each on its "
        f"own key with a limit of {LEGIT_LIMIT:,} in a window that did not end during the run: *exact* "
        f"means every call was answered, allowed, with exactly one less remaining than the one before; a "
        f"call that failed was tried again on a new connection, its latency counting from the first try.",
        "",
        *table(["Legitimate client", "calls", "answered", "exact", "retries", "p50 ms", "p99 ms", "max ms"],
               legit_rows),
        "",
        *table(["Attacker", "connections", "held open (per second)", "closed by the service", "connects refused"],
               swarm_rows),
        "",
        f"Key flood: {sum(v for k, v in flood.items() if k != 'error'):,} requests "
        f"({', '.join(f'{k}: {v:,}' for k, v in sorted(flood.items(), key=str))}), "
        f"{16 * flood.get(200, 0):,} keys"
        + "".join(f"; {f['count']:,} failed on Redis ({f['kind']}: {f['error']})" for f in results["failed_on_redis"])
        + ". Oversized labels: "
        f"{', '.join(f'{k}: {v:,}' for k, v in sorted(labels.items()))}; `/metrics` was "
        f"{results['metrics_bytes']:,} bytes at the end. Connections the service closed, by reason: "
        + ", ".join(f"`{k}` {v}" for k, v in closed.items()) + ".",
        "",
        *table(["Figure", "start", "max", "end", "bound"], [
            ["sluice-service RSS (MiB)", f"{results['rss_before_mib']:.1f}", f"{max(rss):.1f}", f"{rss[-1]:.1f}",
             f"{args.max_rss_mib}"],
            ["sluice-service open descriptors", "", f"{max(fds)}", f"{fds[-1]}", f"{FD_LIMIT}"],
            ["Redis used_memory (MiB)", f"{results['redis_base'] / 1024 / 1024:.1f}", f"{max(used):.1f}",
             f"{used[-1]:.1f}", f"{results['maxmemory_mb']} (maxmemory)"],
        ]),
        "",
        f"Redis evicted {results['redis_evicted']:,} keys and held {results['redis_keys']:,} at the end. "
        "Service RSS every second (MiB): " + " ".join(f"{x:.1f}" for x in rss) + ".",
        "",
        "Verdict: " + ("**pass**" if not verdict else "**fail**: " + "; ".join(verdict)) + ".",
    ]
    write_section(RELIABILITY_MD, "siege", lines)
    return lines
