//! The five algorithms under one traffic pattern, for `docs/algorithms.md`: one key, limit 10 per
//! second, a steady 5 requests/s for 4 s plus a burst of 40 requests straddling the window
//! boundary at 2 s. Prints a summary per algorithm and writes `docs/algorithms.svg`.
//! Deterministic: simulated time, no randomness, integer nanoseconds throughout.
//!
//! ```sh
//! cargo run --release --example algorithms
//! ```

use std::cmp::Reverse;
use std::error::Error;
use std::fmt::Write as _;
use std::path::Path;

use sluice::core::algorithm::{Algorithm, Drain, Rate, Window};
use sluice::core::duration::NANOS_PER_SEC as SEC;

const MS: u64 = 1_000_000;
/// Every algorithm gets the same limit: `LIMIT` requests per `WINDOW`.
const LIMIT: u64 = 10;
const WINDOW: u64 = SEC;
/// The leaky bucket's longest hold.
const MAX_DELAY: u64 = 500 * MS;
/// Simulated time starts on a whole Unix second, so the epoch-aligned windows start with it.
const START: u64 = 1_700_000_000 * SEC;
/// The steady stream: one request every 200 ms (5/s) for 4 s.
const STEADY_GAP: u64 = 200 * MS;
const STEADY_COUNT: u64 = 20;
/// The burst: 40 requests 2.5 ms apart from 1.950 s, 20 each side of the boundary at 2 s.
const BURST_FROM: u64 = 1_950 * MS;
const BURST_GAP: u64 = 2_500_000;
const BURST_COUNT: u64 = 40;
/// The chart's time axis: the whole run, and the zoom on the burst.
const END: u64 = 5 * SEC;
const ZOOM: (u64, u64) = (1_850 * MS, 2_950 * MS);

/// One request: when it arrives (from the start) and whether it belongs to the burst.
#[derive(Clone, Copy)]
struct Request {
    at: u64,
    burst: bool,
}

/// A request and when it went upstream (`None`: denied). A leaky bucket request goes upstream
/// at its release time, `at + delay`.
type Outcome = (Request, Option<u64>);

/// One algorithm's run: the outcome of every request.
struct Run {
    algorithm: Algorithm,
    color: &'static str,
    outcomes: Vec<Outcome>,
}

impl Run {
    /// Upstream times of the admitted requests, in order.
    fn admitted(&self) -> Vec<u64> {
        let mut times: Vec<u64> = self.outcomes.iter().filter_map(|(_, up)| *up).collect();
        times.sort_unstable();
        times
    }
}

fn traffic() -> Vec<Request> {
    let steady = (0..STEADY_COUNT).map(|k| Request {
        at: k * STEADY_GAP,
        burst: false,
    });
    let burst = (0..BURST_COUNT).map(|i| Request {
        at: BURST_FROM + i * BURST_GAP,
        burst: true,
    });
    let mut requests: Vec<Request> = steady.chain(burst).collect();
    // Stable: at 2.000 s the steady request comes before the burst's.
    requests.sort_by_key(|r| r.at);
    requests
}

/// The traffic in words, from the constants: "steady 5/s for 4 s, 40 in 1.95–2.05 s".
fn describe_traffic() -> String {
    format!(
        "steady {}/s for {} s, plus {BURST_COUNT} in {}–{} s",
        SEC / STEADY_GAP,
        seconds(STEADY_COUNT * STEADY_GAP),
        seconds(BURST_FROM),
        seconds(BURST_FROM + BURST_COUNT * BURST_GAP),
    )
}

fn simulate(algorithm: Algorithm, color: &'static str, requests: &[Request]) -> Run {
    let mut state = vec![0; algorithm.columns()];
    let outcomes = requests
        .iter()
        .map(|&request| {
            let decision = algorithm.admit(&mut state, START + request.at, 1);
            (
                request,
                decision.allowed.then_some(request.at + decision.delay),
            )
        })
        .collect();
    Run {
        algorithm,
        color,
        outcomes,
    }
}

/// The most admitted requests in any span [t, t + 1 s), and the earliest t where that happens.
fn busiest_second(times: &[u64]) -> (usize, u64) {
    times
        .iter()
        .map(|&from| {
            let n = times
                .iter()
                .filter(|&&t| t >= from && t < from + WINDOW)
                .count();
            (n, from)
        })
        .max_by_key(|&(n, from)| (n, Reverse(from)))
        .unwrap_or((0, 0))
}

fn seconds(t: u64) -> String {
    format!("{:.4}", t as f64 / SEC as f64)
        .trim_end_matches('0')
        .trim_end_matches('.')
        .to_string()
}

fn summary(runs: &[Run]) -> String {
    let burst_total = BURST_COUNT;
    let offered = STEADY_COUNT + BURST_COUNT;
    let mut out = format!(
        "limit {LIMIT} per {} s; {offered} requests: {}\n\n",
        seconds(WINDOW),
        describe_traffic()
    );
    out.push_str(&format!(
        "{:<16} {:>8} {:>12} {:>15} {:>10} {:>12}\n",
        "algorithm", "admitted", "of the burst", "most in 1 s", "(span at)", "longest hold"
    ));
    for run in runs {
        let times = run.admitted();
        let in_burst = run
            .outcomes
            .iter()
            .filter(|(r, up)| r.burst && up.is_some())
            .count();
        let (most, from) = busiest_second(&times);
        let hold = run
            .outcomes
            .iter()
            .filter_map(|(r, up)| up.map(|u| u - r.at))
            .max()
            .unwrap_or(0);
        out.push_str(&format!(
            "{:<16} {:>8} {:>12} {:>15} {:>10} {:>12}\n",
            run.algorithm.name(),
            format!("{}/{offered}", times.len()),
            format!("{in_burst}/{burst_total}"),
            most,
            format!("{} s", seconds(from)),
            format!("{:.1} ms", hold as f64 / MS as f64),
        ));
    }
    out.push_str(
        "\nmost in 1 s: most admitted in any span [t, t + 1 s), t = span at (the earliest);\n\
         a leaky bucket request counts when it is released, after its hold.\n",
    );
    out
}

/// Plot geometry: the full-run chart on top, the zoom on the burst below.
const WIDTH: f64 = 1020.0;
const LEFT: f64 = 112.0;
const PLOT_W: f64 = 690.0;
const TOP_A: f64 = 92.0;
const PLOT_H: f64 = 300.0;
const TOP_B: f64 = 500.0;
const ROW_H: f64 = 34.0;
const LEGEND_X: f64 = LEFT + PLOT_W + 24.0;

fn x_at(t: u64, (from, to): (u64, u64)) -> f64 {
    LEFT + PLOT_W * (t.saturating_sub(from)) as f64 / (to - from) as f64
}

fn svg(runs: &[Run], requests: &[Request]) -> Result<String, std::fmt::Error> {
    let full = (0, END);
    let most = runs
        .iter()
        .map(|run| busiest_second(&run.admitted()).0)
        .max()
        .unwrap_or(0) as f64;
    let y_max = ((most / 5.0).floor() + 1.0) * 5.0;
    let y_at = |n: f64| TOP_A + PLOT_H - PLOT_H * n / y_max;
    let rows = runs.len() + 1;
    let height = TOP_B + ROW_H * rows as f64 + 70.0;
    let mut s = String::new();

    writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">"##
    )?;
    writeln!(
        s,
        r##"<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>"##
    )?;
    writeln!(
        s,
        r##"<text x="{LEFT}" y="26" font-size="17" font-weight="bold">Five rate-limit algorithms, one key, limit {LIMIT} per {} s</text>"##,
        seconds(WINDOW)
    )?;
    writeln!(
        s,
        r##"<text x="{LEFT}" y="46" fill="#444">Traffic: {} (straddling the window boundary at 2 s).</text>"##,
        describe_traffic()
    )?;
    writeln!(
        s,
        r##"<text x="{LEFT}" y="64" fill="#444">Admitted = sent upstream; a leaky bucket request counts at its release time. Windows are aligned to the Unix epoch.</text>"##
    )?;

    // Panel A: admitted requests in the trailing 1 s, over the whole run.
    writeln!(
        s,
        r##"<text x="{LEFT}" y="{}" font-weight="bold">Admitted in the last 1 s</text>"##,
        TOP_A - 10.0
    )?;
    let (burst_x0, burst_x1) = (
        x_at(BURST_FROM, full),
        x_at(BURST_FROM + BURST_COUNT * BURST_GAP, full),
    );
    writeln!(
        s,
        r##"<rect x="{burst_x0:.1}" y="{TOP_A}" width="{:.1}" height="{PLOT_H}" fill="#f2e6c8"/>"##,
        burst_x1 - burst_x0
    )?;
    let mut n = 0.0;
    while n <= y_max {
        let y = y_at(n);
        writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e4e4e4"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#333">{n}</text>"##,
            LEFT + PLOT_W,
            LEFT - 8.0,
            y + 4.0
        )?;
        n += 5.0;
    }
    for tenth in (0..=END / (SEC / 2)).map(|k| k * SEC / 2) {
        let x = x_at(tenth, full);
        let boundary = tenth % WINDOW == 0;
        writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{TOP_A}" x2="{x:.1}" y2="{:.1}" stroke="{}"{}/><text x="{x:.1}" y="{:.1}" text-anchor="middle" fill="#333">{}</text>"##,
            TOP_A + PLOT_H,
            if boundary { "#b8b8b8" } else { "#ececec" },
            if boundary {
                r#" stroke-dasharray="4 3""#
            } else {
                ""
            },
            TOP_A + PLOT_H + 18.0,
            seconds(tenth)
        )?;
    }
    writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#333">time (s); dashed: window boundaries</text>"##,
        LEFT + PLOT_W / 2.0,
        TOP_A + PLOT_H + 38.0
    )?;
    writeln!(
        s,
        r##"<text transform="translate({:.1},{:.1}) rotate(-90)" text-anchor="middle" fill="#333">requests admitted in (t − 1 s, t]</text>"##,
        LEFT - 40.0,
        TOP_A + PLOT_H / 2.0
    )?;
    writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP_A}" width="{PLOT_W}" height="{PLOT_H}" fill="none" stroke="#333"/>"##
    )?;
    let limit_y = y_at(LIMIT as f64);
    writeln!(
        s,
        r##"<line x1="{LEFT}" y1="{limit_y:.1}" x2="{:.1}" y2="{limit_y:.1}" stroke="#000" stroke-width="1.5" stroke-dasharray="7 4"/>"##,
        LEFT + PLOT_W
    )?;

    // One step line per algorithm; each is nudged a little vertically so coinciding lines stay
    // visible (the steady phase is the same for all five).
    for (i, run) in runs.iter().enumerate() {
        let nudge = (i as f64 - 2.0) * 1.6;
        let mut events: Vec<(u64, i64)> = run
            .admitted()
            .into_iter()
            .flat_map(|t| [(t, 1), (t + WINDOW, -1)])
            .collect();
        events.sort_unstable();
        let mut count = 0i64;
        let mut d = format!("M{LEFT:.1},{:.1}", y_at(0.0) + nudge);
        let mut events = events.into_iter().filter(|&(t, _)| t <= END).peekable();
        while let Some((t, step)) = events.next() {
            count += step;
            // A request leaving the span and one entering it at the same instant: one step.
            if events.peek().is_some_and(|&(next, _)| next == t) {
                continue;
            }
            write!(
                d,
                " H{:.1} V{:.1}",
                x_at(t, full),
                y_at(count as f64) + nudge
            )?;
        }
        write!(d, " H{:.1}", LEFT + PLOT_W)?;
        writeln!(
            s,
            r##"<path d="{d}" fill="none" stroke="{}" stroke-width="2" stroke-linejoin="round" opacity="0.9"/>"##,
            run.color
        )?;
    }

    // Legend, right of panel A.
    writeln!(
        s,
        r##"<text x="{LEGEND_X}" y="{}" font-weight="bold">max in any 1 s</text>"##,
        TOP_A + 4.0
    )?;
    for (i, run) in runs.iter().enumerate() {
        let y = TOP_A + 28.0 + 24.0 * i as f64;
        let (most, _) = busiest_second(&run.admitted());
        writeln!(
            s,
            r##"<line x1="{LEGEND_X}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{} <tspan font-weight="bold">{most}</tspan></text>"##,
            LEGEND_X + 24.0,
            run.color,
            LEGEND_X + 32.0,
            y + 4.0,
            run.algorithm.name()
        )?;
    }
    let y = TOP_A + 28.0 + 24.0 * runs.len() as f64;
    writeln!(
        s,
        r##"<line x1="{LEGEND_X}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#000" stroke-width="1.5" stroke-dasharray="7 4"/><text x="{:.1}" y="{:.1}">limit {LIMIT}</text>"##,
        LEGEND_X + 24.0,
        LEGEND_X + 32.0,
        y + 4.0
    )?;
    writeln!(
        s,
        r##"<rect x="{:.1}" y="{:.1}" width="24" height="12" fill="#f2e6c8"/><text x="{:.1}" y="{:.1}">the burst</text>"##,
        LEGEND_X,
        y + 18.0,
        LEGEND_X + 32.0,
        y + 28.0
    )?;

    // Panel B: every request around the burst, one row per algorithm.
    writeln!(
        s,
        r##"<text x="{LEFT}" y="{}" font-weight="bold">Each request, {}–{} s: admitted (tall, colored), denied (short, grey); a leaky bucket hold is a slant from arrival to release</text>"##,
        TOP_B - 16.0,
        seconds(ZOOM.0),
        seconds(ZOOM.1)
    )?;
    let row_top = |row: usize| TOP_B + ROW_H * row as f64;
    let bottom = row_top(rows);
    let ticks = (ZOOM.0.div_ceil(100 * MS)..=ZOOM.1 / (100 * MS)).map(|k| k * 100 * MS);
    for tick in ticks {
        let x = x_at(tick, ZOOM);
        let boundary = tick % WINDOW == 0;
        writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{TOP_B}" x2="{x:.1}" y2="{bottom:.1}" stroke="{}"{}/><text x="{x:.1}" y="{:.1}" text-anchor="middle" fill="#333">{}</text>"##,
            if boundary { "#b8b8b8" } else { "#ececec" },
            if boundary {
                r#" stroke-dasharray="4 3""#
            } else {
                ""
            },
            bottom + 18.0,
            seconds(tick)
        )?;
    }
    writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#333">time (s)</text>"##,
        LEFT + PLOT_W / 2.0,
        bottom + 38.0
    )?;
    let in_zoom = |t: u64| t >= ZOOM.0 && t <= ZOOM.1;
    let offered: Vec<Outcome> = requests.iter().map(|&r| (r, Some(r.at))).collect();
    let mut strips: Vec<(&str, &str, &[Outcome])> = vec![("offered", "#555555", &offered)];
    strips.extend(
        runs.iter()
            .map(|run| (run.algorithm.name(), run.color, run.outcomes.as_slice())),
    );
    for (row, (name, color, outcomes)) in strips.into_iter().enumerate() {
        let top = row_top(row);
        let (tall_top, base) = (top + 5.0, top + ROW_H - 5.0);
        writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{base:.1}" x2="{:.1}" y2="{base:.1}" stroke="#d0d0d0"/><text x="{:.1}" y="{:.1}" text-anchor="end">{name}</text>"##,
            LEFT + PLOT_W,
            LEFT - 8.0,
            top + ROW_H / 2.0 + 4.0
        )?;
        let admitted = outcomes.iter().filter(|(_, up)| up.is_some()).count();
        writeln!(
            s,
            r##"<text x="{LEGEND_X}" y="{:.1}" fill="#333">{admitted} of {} {}</text>"##,
            top + ROW_H / 2.0 + 4.0,
            outcomes.len(),
            if row == 0 { "requests" } else { "admitted" }
        )?;
        for (request, up) in outcomes.iter().copied() {
            match up {
                Some(up) if in_zoom(up) || in_zoom(request.at) => {
                    let (xa, xu) = (x_at(request.at, ZOOM), x_at(up.min(ZOOM.1), ZOOM));
                    if up > request.at {
                        writeln!(
                            s,
                            r##"<line x1="{xa:.1}" y1="{tall_top:.1}" x2="{xu:.1}" y2="{base:.1}" stroke="{color}" stroke-width="1" opacity="0.6"/>"##
                        )?;
                    }
                    if in_zoom(up) {
                        writeln!(
                            s,
                            r##"<line x1="{xu:.1}" y1="{tall_top:.1}" x2="{xu:.1}" y2="{base:.1}" stroke="{color}" stroke-width="1.3"/>"##
                        )?;
                    }
                }
                None if in_zoom(request.at) => {
                    let x = x_at(request.at, ZOOM);
                    writeln!(
                        s,
                        r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{base:.1}" stroke="#9a9a9a" stroke-width="1"/>"##,
                        base - 7.0
                    )?;
                }
                _ => {}
            }
        }
    }
    writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP_B}" width="{PLOT_W}" height="{:.1}" fill="none" stroke="#333"/>"##,
        bottom - TOP_B
    )?;
    writeln!(
        s,
        r##"<text x="{LEFT}" y="{:.1}" fill="#666" font-size="11">Regenerate: cargo run --release --example algorithms. Lines in the upper chart are offset by up to 3 px so that coinciding ones stay visible.</text>"##,
        height - 10.0
    )?;
    writeln!(s, "</svg>")?;
    Ok(s)
}

fn main() -> Result<(), Box<dyn Error>> {
    let rate = Rate::new(LIMIT, WINDOW, LIMIT).map_err(|e| format!("token bucket: {e}"))?;
    let window = Window::new(LIMIT, WINDOW).map_err(|e| format!("window: {e}"))?;
    let drain = Drain::new(LIMIT, WINDOW, MAX_DELAY).map_err(|e| format!("leaky bucket: {e}"))?;
    let algorithms = [
        (Algorithm::TokenBucket(rate), "#0072B2"),
        (Algorithm::FixedWindow(window), "#D55E00"),
        (Algorithm::SlidingWindow(window), "#009E73"),
        (Algorithm::SlidingLog(window), "#CC79A7"),
        (Algorithm::LeakyBucket(drain), "#E69F00"),
    ];
    let requests = traffic();
    let runs: Vec<Run> = algorithms
        .into_iter()
        .map(|(algorithm, color)| simulate(algorithm, color, &requests))
        .collect();

    print!("{}", summary(&runs));
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/algorithms.svg");
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&path, svg(&runs, &requests)?)?;
    println!("\nwrote docs/algorithms.svg");
    Ok(())
}
