//! How fast `sluice-replay` goes and how much memory it holds
//! (`cargo run --release -p sluice-replay --example throughput [CASE]`; the figures are in
//! BENCHMARKS.md). Not a timed test: a shared machine's timings say little. An example rather than
//! a bench so that it is built as the tool is, in one build of the filter's crate.
//!
//! A synthetic access log as Envoy writes it with `--print-log-format`'s format: 10,000 requests
//! a second from 5,000 users (a few of them heavy), each line about 260 bytes. Speed is lines per
//! second of CPU time of the replaying thread, over a log held in memory (parsing, reordering,
//! deciding and counting; no disk). Memory is the process's peak resident size while a generated
//! log streams through, for three log lengths: it must not grow with the length.

// A measuring program: it panics with the reason when its set-up is broken.
#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)]

use sluice_replay::log::{Parser, Record, Wanted};
use sluice_replay::run::{run, Options};
use std::io::{BufRead, Read};
use std::time::Instant;

const SIMPLE: &str = r#"{"policies": [{"name": "per-user", "key": ["header:x-user-id"],
    "requests": 10, "per": "1s", "burst": 20, "max_keys": 50000}]}"#;
const LAYERED: &str = r#"{"policies": [
    {"name": "per-user", "match": {"path_prefix": "/api/"}, "key": ["header:x-user-id"],
     "requests": 10, "per": "1s", "burst": 20, "max_keys": 50000,
     "tiers": {"by": "header:x-plan", "values": {"gold": {"requests": 50, "per": "1s"}}}},
    {"name": "per-user-minute", "key": ["header:x-user-id"], "requests": 300, "per": "1m",
     "algorithm": "sliding_window", "max_keys": 50000},
    {"name": "per-ip", "key": ["ip"], "requests": 1000, "per": "1m", "mode": "shadow"}]}"#;

/// Users of the synthetic log; every 64th request comes from one of 8 heavy users.
const USERS: u64 = 5_000;
/// Log time between two requests: 10,000 a second.
const GAP_MICROS: u64 = 100;

/// Line `i` of the synthetic log.
fn line(i: u64, out: &mut Vec<u8>) {
    let micros = 1_800_000_000_000_000 + i * GAP_MICROS;
    let (secs, sub) = (micros / 1_000_000, micros % 1_000_000);
    let time = sluice::core::time::format_rfc3339(secs * 1_000_000_000);
    let time = time.trim_end_matches('Z');
    let hash = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 20;
    let user = if i.is_multiple_of(64) {
        hash % 8
    } else {
        hash % USERS
    };
    let plan = if user % 10 == 0 { "gold" } else { "free" };
    let ip = format!("10.{}.{}.{}", user % 7, user / 256 % 256, user % 256);
    let _ = std::io::Write::write_fmt(
        out,
        format_args!(
            concat!(
                r#"{{"start_time":"{}.{:06}Z","method":"GET","path":"/api/v1/items/{}?page=2","#,
                r#""authority":"api.example.com","remote_address":"{}","route_name":"api","#,
                r#""headers":{{"x-user-id":"user-{:05}","x-plan":"{}"}},"metadata":{{}},"#,
                r#""response_code":200}}"#,
                "\n"
            ),
            time,
            sub,
            i % 1000,
            ip,
            user,
            plan
        ),
    );
}

/// The log of `lines` lines, generated as it is read: no more than one chunk in memory.
struct Streamed {
    next: u64,
    lines: u64,
    chunk: Vec<u8>,
    at: usize,
}

impl Read for Streamed {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.fill_buf()?.read(buf)?;
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for Streamed {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        if self.at == self.chunk.len() {
            self.chunk.clear();
            self.at = 0;
            while self.next < self.lines && self.chunk.len() < 1 << 16 {
                line(self.next, &mut self.chunk);
                self.next += 1;
            }
        }
        Ok(self.chunk.get(self.at..).unwrap_or_default())
    }

    fn consume(&mut self, n: usize) {
        self.at += n;
    }
}

/// CPU time of this thread so far, in nanoseconds (Linux: the first field of schedstat).
fn thread_cpu_nanos() -> u64 {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    text.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The process's peak resident memory so far, in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .unwrap_or_default();
    line.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn options(config: &str) -> Options {
    Options {
        config: config.to_string(),
        window: 2_000_000_000,
        ..Options::default()
    }
}

fn main() {
    // An argument selects the cases whose name has it.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with("--"));
    let wanted = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));
    if wanted("memory") {
        memory();
    }
    if ["parse", "simple", "layered"]
        .iter()
        .any(|case| wanted(case))
    {
        speed(&wanted);
    }
    if filter.as_deref() == Some("once") {
        once();
    }
}

fn memory() {
    let memory = |lines| {
        let input = Streamed {
            next: 0,
            lines,
            chunk: Vec::new(),
            at: 0,
        };
        let replay = run(&options(LAYERED), input).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(replay.report.requests, lines);
        peak_rss_kib()
    };
    println!("peak RSS before: {} KiB", peak_rss_kib());
    for lines in [1_000_000, 4_000_000, 16_000_000] {
        println!(
            "peak RSS after a log of {lines} lines (layered configuration): {} KiB",
            memory(lines)
        );
    }
}

/// Lines of the log that the speed cases replay, held in memory.
const LINES: u64 = 1_000_000;

/// `once`: the simple case replayed once over `SLUICE_BENCH_LINES` lines (default `LINES`),
/// timing nothing: for counting instructions under callgrind, which a shared machine's load
/// does not move.
fn once() {
    let lines = std::env::var("SLUICE_BENCH_LINES")
        .ok()
        .and_then(|n| n.parse().ok());
    let lines = lines.unwrap_or(LINES);
    let mut log = Vec::new();
    for i in 0..lines {
        line(i, &mut log);
    }
    let replay = replay_log(SIMPLE, &log);
    assert_eq!(replay.report.requests, lines);
}

/// The whole replay of `log` under `config`: what the speed cases time.
#[inline(never)]
fn replay_log(config: &str, log: &[u8]) -> sluice_replay::run::Replay {
    run(&options(config), log).unwrap_or_else(|e| panic!("{e}"))
}

fn speed(wanted: &dyn Fn(&str) -> bool) {
    let mut log = Vec::with_capacity(LINES as usize * 340);
    for i in 0..LINES {
        line(i, &mut log);
    }
    println!(
        "log: {LINES} lines, {:.0} bytes a line",
        log.len() as f64 / LINES as f64
    );
    if wanted("parse") {
        let lines: Vec<&[u8]> = log
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        // As the simple case reads its lines: keeping what its policy reads.
        let plan = sluice_replay::engine::plan(SIMPLE.as_bytes()).unwrap();
        let mut parser = Parser::new(Wanted::new(&plan.attrs, false));
        let mut record = Record::default();
        let cpu = thread_cpu_nanos();
        for (number, line) in lines.iter().enumerate() {
            parser
                .parse(line, number as u64, &mut record)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let cpu = (thread_cpu_nanos() - cpu) as f64 / 1e9;
        println!(
            "parsing alone: {:.0} lines/s of CPU time",
            LINES as f64 / cpu
        );
    }
    let cases = [
        ("simple (1 policy)", SIMPLE),
        ("layered (3 policies, a tier)", LAYERED),
    ];
    for (name, config) in cases.into_iter().filter(|(name, _)| wanted(name)) {
        let mut runs: Vec<(f64, f64)> = (0..5)
            .map(|_| {
                let (cpu, wall) = (thread_cpu_nanos(), Instant::now());
                let replay = replay_log(config, &log);
                assert_eq!(replay.report.requests, LINES);
                let cpu = (thread_cpu_nanos() - cpu) as f64 / 1e9;
                (
                    LINES as f64 / cpu,
                    LINES as f64 / wall.elapsed().as_secs_f64(),
                )
            })
            .collect();
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let rates: Vec<String> = runs.iter().map(|r| format!("{:.0}", r.0)).collect();
        println!(
            "{name}: median {:.0} lines/s of CPU time ({:.0} by the wall clock); runs: {}",
            runs[2].0,
            runs[2].1,
            rates.join(", ")
        );
    }
}
