//! `--svg`: one chart per policy of its requests, denials and shadow denials over the log's time,
//! in requests per second (each point a `timeline` bucket). Plain SVG, no script.

use crate::report::Report;
use crate::timeline::{Counts, Timeline};
use sluice::core::duration::NANOS_PER_SEC;
use sluice::core::time::format_rfc3339;
use std::fmt::Write;

const WIDTH: f64 = 900.0;
const PANEL: f64 = 190.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 30.0;
const PLOT: f64 = 120.0;
const SERIES: [(&str, &str); 3] = [
    ("requests", "#4a6fa5"),
    ("denied", "#c0392b"),
    ("shadow denied", "#e67e22"),
];

pub fn render(report: &Report) -> String {
    let charts: Vec<(&str, &Timeline)> = report
        .policies
        .iter()
        .filter_map(|p| p.timeline.as_ref().map(|t| (p.name.as_str(), t)))
        .collect();
    let height = PANEL * charts.len().max(1) as f64;
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
"#
    );
    if charts.is_empty() {
        let _ = writeln!(
            svg,
            r#"<text x="{LEFT}" y="{TOP}">No policy matched any request.</text>"#
        );
    }
    for (i, (name, timeline)) in charts.into_iter().enumerate() {
        panel(&mut svg, i as f64 * PANEL, name, timeline);
    }
    svg.push_str("</svg>\n");
    svg
}

fn panel(svg: &mut String, y0: f64, name: &str, timeline: &Timeline) {
    let per_second = |n: u64| n as f64 * NANOS_PER_SEC as f64 / timeline.width as f64;
    let peak = timeline
        .buckets
        .iter()
        .map(|b| per_second(b.requests))
        .fold(1.0, f64::max);
    let plot_width = WIDTH - LEFT - RIGHT;
    let step = plot_width / timeline.buckets.len().max(1) as f64;
    let base = y0 + TOP + PLOT;
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="{}" font-weight="bold">{}</text>"#,
        y0 + TOP - 10.0,
        escape(name)
    );
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{}" width="{plot_width}" height="{PLOT}" fill="none" stroke="#999"/>"##,
        y0 + TOP
    );
    let select: [fn(&Counts) -> u64; 3] = [|c| c.requests, |c| c.denied, |c| c.shadow_denied];
    for ((label, color), value) in SERIES.iter().zip(select) {
        let points: Vec<String> = timeline
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let x = LEFT + (i as f64 + 0.5) * step;
                let y = base - PLOT * per_second(value(b)) / peak;
                format!("{x:.1},{y:.1}")
            })
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"><title>{label}</title></polyline>"#,
            points.join(" ")
        );
    }
    let end = timeline.start + timeline.width * timeline.buckets.len() as u64;
    let labels = [
        (LEFT - 5.0, y0 + TOP + 4.0, "end", format!("{peak:.0}/s")),
        (LEFT - 5.0, base, "end", "0".to_string()),
        (LEFT, base + 16.0, "start", format_rfc3339(timeline.start)),
        (WIDTH - RIGHT, base + 16.0, "end", format_rfc3339(end)),
    ];
    for (x, y, anchor, text) in labels {
        let _ = writeln!(
            svg,
            r#"<text x="{x}" y="{y}" text-anchor="{anchor}">{text}</text>"#
        );
    }
    let mut x = LEFT;
    for (label, color) in SERIES {
        let _ = writeln!(
            svg,
            r#"<text x="{x}" y="{}" fill="{color}">■ {label}</text>"#,
            base + 34.0
        );
        x += 130.0;
    }
}

/// Policy names are `[A-Za-z0-9_.-]`, but the chart must not trust that.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
