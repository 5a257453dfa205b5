"""bench/results.svg: bar panels of requests/s, p99 latency and CPU per request (the medians),
one row per setup. Plain SVG, no libraries."""

ROW_H, TOP, LABEL_W, PANEL_W, GAP = 26, 64, 330, 220, 110
PANELS = [
    ("requests/s, higher is better", "rps", lambda v: f"{v:,.0f}", "#4878a8"),
    ("p99 latency (ms), lower is better", "p99_ms", lambda v: f"{v:.2f}", "#c8703c"),
    ("Envoy CPU µs/request, lower is better", "cpu_us_per_request", lambda v: f"{v:.1f}", "#5a9a5a"),
]


def escape(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def svg_chart(order, labels, summary, title):
    height = TOP + ROW_H * len(order) + 30
    width = LABEL_W + len(PANELS) * (PANEL_W + GAP)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="10" y="20" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    for i, panel in enumerate(PANELS):
        out += bar_panel(LABEL_W + i * (PANEL_W + GAP), panel, order, summary)
    for j, sid in enumerate(order):
        y = TOP + j * ROW_H + ROW_H - 12
        out.append(f'<text x="10" y="{y}">{escape(sid + ". " + labels[sid])}</text>')
    out.append(
        f'<text x="10" y="{height - 8}" fill="#555">Regenerate with: make bench '
        f"(bench/run.py). Envoy: 1 worker on core 0; wrk on core 1.</text>"
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def bar_panel(x0, panel, order, summary):
    """One figure's heading, axis and bars (scaled to its largest value) with their values."""
    heading, key, fmt, colour = panel
    peak = max(summary[s][key] for s in order) or 1
    out = [
        f'<text x="{x0}" y="{TOP - 14}" font-weight="bold">{escape(heading)}</text>',
        f'<line x1="{x0}" y1="{TOP - 6}" x2="{x0}" y2="{TOP + ROW_H * len(order)}" stroke="#888"/>',
    ]
    for j, sid in enumerate(order):
        value = summary[sid][key]
        y = TOP + j * ROW_H
        w = max(1.0, PANEL_W * value / peak)
        out.append(f'<rect x="{x0}" y="{y}" width="{w:.1f}" height="{ROW_H - 8}" fill="{colour}"/>')
        out.append(f'<text x="{x0 + w + 4:.1f}" y="{y + ROW_H - 12}">{fmt(value)}</text>')
    return out
