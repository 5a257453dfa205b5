//! Micro-benchmarks of sluice's pure core, natively (`cargo bench --bench micro`).
//!
//! No benchmark framework: each case runs in batches timed with `Instant`, and the median
//! batch gives the time per operation (the minimum and maximum batch show the spread). Inputs
//! go through `black_box` so the optimiser cannot fold them away.
//!
//! With `SLUICE_BENCH_JSON=<file>` the results are also written there as JSON, which
//! `bench/run.py` (`make bench`) puts into BENCHMARKS.md.

use sluice::config::{self, Plan};
use sluice::core::algorithm::token_bucket::{self, Rate};
use sluice::core::algorithm::{Algorithm, Drain, Window};
use sluice::core::duration::NANOS_PER_SEC;
use sluice::core::key::{hash_key, HashSecret, Keying};
use sluice::core::request::Attributes;
use sluice::core::usage::{Format, Reading, Scanner};
use sluice::filter::{Admitted, Filter, Verdict};
use sluice::limiter::{Limiter, Step};
use sluice::state::ledger::Ledger;
use sluice::state::store::MemoryStore;
use sluice::state::table;
use sluice::testing::{FakeHost, FakeRequest};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The plugin name Envoy gives the demo and the benchmark: shared-data keys start with it.
const PLUGIN: &str = "sluice";
const T0: u64 = 1_800_000_000 * NANOS_PER_SEC;
/// The case the issue sets a target for (bench/run.py finds it by this name).
const TOKEN_BUCKET: &str = "token_bucket::admit (one token-bucket decision)";

/// One request as the host shows it. Values are cloned out on every read, as the hostcalls do.
fn typical_request() -> FakeRequest {
    FakeRequest::new(&[
        (":path", "/api/v1/items?page=2"),
        (":method", "GET"),
        (":authority", "api.example.com"),
        ("x-user-id", "user-8c2f41"),
        ("x-api-key", "k-3f9a7c21d0e84b6a"),
    ])
    .with_property("source.address", "10.1.2.3:54321")
    .with_property("xds.route_name", "api")
}

/// One request through the whole filter, as Envoy drives it: the request headers, then the
/// rate-limit headers of the response (what `wasm.rs` adds to the response), the clock moving
/// 10 µs per request.
fn bench_filter(name: &str, json: &str) -> Measured {
    let host = FakeHost::new(Arc::default(), T0);
    *host.request.borrow_mut() = typical_request();
    let filter = match Filter::configure(json.as_bytes(), PLUGIN, &host, &host, &host) {
        Ok(filter) => filter,
        Err(e) => {
            eprintln!("bench config refused: {e}");
            std::process::exit(1);
        }
    };
    measure(name, || {
        host.now.set(host.now.get() + 10_000);
        if let Verdict::Continue(Admitted {
            reported: Some(reported),
            ..
        }) = filter.on_request_headers(black_box(&host))
        {
            filter.each_response_header(&reported, |name, value| {
                black_box((name, value));
            });
        }
    })
}

fn plan(json: &str) -> Plan {
    match config::parse(json.as_bytes()) {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("bench config refused: {e}\n{json}");
            std::process::exit(1);
        }
    }
}

struct Measured {
    name: String,
    median_ns: f64,
    min_ns: f64,
    max_ns: f64,
    /// The bytes one operation reads, for cases measured in throughput.
    bytes: Option<usize>,
}

/// Times `op` (one operation per call), after 200 ms of warm-up, in `BATCHES` batches sized to
/// take about 10 ms each.
fn measure(name: &str, mut op: impl FnMut()) -> Measured {
    const BATCHES: usize = 31;
    const BATCH_TIME: Duration = Duration::from_millis(10);
    // Warm caches, the allocator and (under V8) the optimising compiler first.
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_millis(200) {
        for _ in 0..100 {
            op();
        }
    }
    let mut per_batch = 1u64;
    loop {
        let start = Instant::now();
        for _ in 0..per_batch {
            op();
        }
        if start.elapsed() >= BATCH_TIME / 4 || per_batch >= 1 << 30 {
            let elapsed = start.elapsed().as_nanos().max(1) as u64;
            let target = BATCH_TIME.as_nanos() as u64;
            per_batch = (per_batch * target / elapsed).max(1);
            break;
        }
        per_batch *= 2;
    }
    let mut samples: Vec<f64> = (0..BATCHES)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..per_batch {
                op();
            }
            start.elapsed().as_nanos() as f64 / per_batch as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    let result = Measured {
        name: name.to_string(),
        median_ns: samples.get(BATCHES / 2).copied().unwrap_or(f64::NAN),
        min_ns: samples.first().copied().unwrap_or(f64::NAN),
        max_ns: samples.last().copied().unwrap_or(f64::NAN),
        bytes: None,
    };
    println!(
        "{:<52} {:>10.1} ns   (batches {:.1} .. {:.1})",
        result.name, result.median_ns, result.min_ns, result.max_ns
    );
    result
}

/// Runs the whole `evaluate` for one request per call, the clock moving 10 µs per request.
/// Every decision must deny (or allow) as `denies` says: checked once, before timing.
fn bench_evaluate(name: &str, json: &str, request: &FakeRequest, denies: bool) -> Measured {
    let plan = plan(json);
    let prefix = table::prefix(PLUGIN);
    let store = MemoryStore::default();
    // As an Envoy without an operator's secret: its own for slots, the public one shared.
    let keying = Keying {
        slots: HashSecret::from_bytes([7; 16]),
        shared: HashSecret::PUBLIC,
    };
    let decide = |now: u64| {
        let mut attrs = Attributes::new(black_box(request), &plan.attrs);
        let mut ledger = Ledger::default();
        let mut limiter = Limiter {
            plan: &plan,
            keying: &keying,
            prefix: &prefix,
            store: &store,
            ledger: &mut ledger,
            overrides: None,
        };
        limiter.evaluate(&mut attrs, black_box(now), true)
    };
    for i in 0..3 {
        decide(T0 + i * 10_000);
    }
    match decide(T0 + 30_000) {
        Step::Done(outcome) if outcome.is_denied() == denies => {}
        other => {
            eprintln!("{name}: not the expected decision: {other:?}");
            std::process::exit(1);
        }
    }
    let mut now = T0 + 40_000;
    measure(name, || {
        now += 10_000;
        black_box(decide(now));
    })
}

fn policies_json(policies: &[String]) -> String {
    format!(
        r#"{{"headers": "legacy", "policies": [{}]}}"#,
        policies.join(",")
    )
}

fn policy(name: &str, key: &str, requests: u64, per: &str) -> String {
    format!(r#"{{"name": "{name}", "key": ["{key}"], "requests": {requests}, "per": "{per}"}}"#)
}

/// A 4 KiB OpenAI Chat Completions response, pretty-printed as OpenAI sends it: mostly the
/// answer's text, escapes included. `make bench`'s setup 12 answers with the same file.
const OPENAI_RESPONSE: &[u8] = include_bytes!("fixtures/llm/openai-chat-4k.json");

/// An OpenAI chat stream of 200 events, as with `stream_options.include_usage`: 198 chunks of a
/// word or two, the chunk that finishes, the chunk with the usage, then `[DONE]`. Setup 13
/// answers with the same file.
const OPENAI_EVENT_STREAM: &[u8] = include_bytes!("fixtures/llm/openai-chat-200-events.txt");

/// The stream an event per element, as Envoy hands them over from a streaming upstream.
fn openai_events() -> Vec<Vec<u8>> {
    let mut events = Vec::new();
    let mut rest = OPENAI_EVENT_STREAM;
    while let Some(end) = rest.windows(2).position(|w| w == b"\n\n") {
        let (event, tail) = rest.split_at(end + 2);
        events.push(event.to_vec());
        rest = tail;
    }
    events
}

/// Reads a whole response body per call, fed in `chunks` as the filter feeds them. The body must
/// read as usage found: checked once, before timing.
fn bench_scan(name: &str, format: Format, chunks: &[Vec<u8>]) -> Measured {
    let scan = |chunks: &[Vec<u8>]| {
        let mut scanner = Scanner::new(format);
        for chunk in chunks {
            scanner.feed(chunk);
        }
        scanner.reading()
    };
    if !matches!(scan(chunks), Reading::Found(_)) {
        eprintln!("{name}: no usage read: {:?}", scan(chunks));
        std::process::exit(1);
    }
    let mut measured = measure(name, || {
        black_box(scan(black_box(chunks)));
    });
    let bytes = chunks.iter().map(Vec::len).sum();
    measured.bytes = Some(bytes);
    println!(
        "{:<52} {:>10.2} GiB/s ({bytes} bytes)",
        "",
        gib_per_second(&measured).unwrap_or(f64::NAN),
    );
    measured
}

/// The throughput of a case measured in bytes, at its median.
fn gib_per_second(measured: &Measured) -> Option<f64> {
    let bytes = measured.bytes? as f64;
    Some(bytes / measured.median_ns * 1e9 / f64::from(1u32 << 30))
}

fn main() {
    // cargo-nextest lists a binary's tests first: this one names itself a benchmark, which
    // nextest leaves to `cargo bench`.
    if std::env::args().any(|a| a == "--list") {
        return println!("micro: benchmark");
    }
    // `cargo bench` passes `--bench`; a filter argument selects cases by substring.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with("--"));
    let wanted = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));
    let request = typical_request();
    let mut results = Vec::new();

    println!("{:<52} {:>13}", "case", "median");

    if wanted("token_bucket") {
        let rate = Rate::new(100, NANOS_PER_SEC, 50).unwrap_or_else(|_| std::process::exit(1));
        let (mut tat, mut now) = (0u64, T0);
        results.push(measure(TOKEN_BUCKET, || {
            now += 3_000_000;
            black_box(token_bucket::admit(
                black_box(&rate),
                &mut tat,
                black_box(now),
                1,
            ));
        }));
    }

    // Every algorithm through `Algorithm::admit`, on a key at its limit (100 per second, a
    // request every 10 ms): what one decision costs, its state read and written in place.
    let valid = |algorithm: Option<Algorithm>| algorithm.unwrap_or_else(|| std::process::exit(1));
    let window = Window::new(100, NANOS_PER_SEC).ok();
    for algorithm in [
        valid(
            Rate::new(100, NANOS_PER_SEC, 50)
                .ok()
                .map(Algorithm::TokenBucket),
        ),
        valid(window.map(Algorithm::FixedWindow)),
        valid(window.map(Algorithm::SlidingWindow)),
        valid(window.map(Algorithm::SlidingLog)),
        valid(
            Drain::new(100, NANOS_PER_SEC, NANOS_PER_SEC)
                .ok()
                .map(Algorithm::LeakyBucket),
        ),
    ] {
        let name = format!("Algorithm::admit [{}]", algorithm.name());
        if wanted(&name) {
            let (mut state, mut now) = (vec![0u64; algorithm.columns()], T0);
            results.push(measure(&name, || {
                now += 10_000_000;
                black_box(algorithm.admit(&mut state, black_box(now), 1));
            }));
        }
    }

    if wanted("hash_key") {
        for (label, key) in [
            ("header:x-user-id", r#""header:x-user-id""#),
            (
                "header:x-user-id|ip, route",
                r#""header:x-user-id|ip", "route""#,
            ),
        ] {
            let plan = plan(&format!(
                r#"{{"policies": [{{"name": "p", "key": [{key}], "requests": 1, "per": "1s"}}]}}"#
            ));
            let parts = plan.tables.first().map_or(&[][..], |t| &t.key[..]);
            results.push(measure(&format!("key::hash_key [{label}]"), || {
                let mut attrs = Attributes::new(black_box(&request), &plan.attrs);
                black_box(hash_key(parts, &mut attrs, &HashSecret::PUBLIC));
            }));
        }
    }

    if wanted("match") {
        for n in [1usize, 50] {
            // Each policy matches its own API version; the request is for the last one, so
            // all n are checked and one matches.
            let policies: Vec<String> = (0..n)
                .map(|i| {
                    let path = if i + 1 == n { "/api/v1/".into() } else { format!("/api/v{}/", i + 2) };
                    format!(
                        r#"{{"name": "p{i}", "match": {{"path_prefix": "{path}", "methods": ["GET", "POST"],
                             "headers": [{{"name": "x-user-id", "present": true}}]}},
                             "key": ["header:x-user-id"], "requests": 1, "per": "1s"}}"#
                    )
                })
                .collect();
            let plan = plan(&policies_json(&policies));
            results.push(measure(
                &format!("Matcher::matches, {n} policies (per request)"),
                || {
                    let mut attrs = Attributes::new(black_box(&request), &plan.attrs);
                    let hits = plan
                        .policies
                        .iter()
                        .filter(|p| p.matcher.matches(&mut attrs))
                        .count();
                    black_box(hits);
                },
            ));
        }
    }

    if wanted("evaluate") {
        let big = 1_000_000_000u64;
        results.push(bench_evaluate(
            "limiter::evaluate, 1 policy (setup 4)",
            &policies_json(&[policy("per-user", "header:x-user-id", big, "1s")]),
            &request,
            false,
        ));
        let layered: Vec<String> = [
            ("1s", 1u64),
            ("1m", 60),
            ("1h", 3_600),
            ("1d", 86_400),
            ("30d", 2_592_000),
        ]
        .iter()
        .map(|(per, secs)| {
            policy(
                &format!("per-{per}"),
                "header:x-user-id",
                1_000_000 * secs,
                per,
            )
        })
        .collect();
        results.push(bench_evaluate(
            "limiter::evaluate, 5 layered, one key (setup 5)",
            &policies_json(&layered),
            &request,
            false,
        ));
        let keyed: Vec<String> = [
            "header:x-user-id",
            "header:x-api-key",
            "ip",
            "route",
            "global",
        ]
        .iter()
        .enumerate()
        .map(|(i, key)| policy(&format!("k{i}"), key, big, "1s"))
        .collect();
        results.push(bench_evaluate(
            "limiter::evaluate, 5 keys (setup 5b)",
            &policies_json(&keyed),
            &request,
            false,
        ));
        results.push(bench_evaluate(
            "limiter::evaluate, denying (setup 7)",
            &policies_json(&[policy("per-user", "header:x-user-id", 1, "1h")]),
            &request,
            true,
        ));
    }

    if wanted("usage") {
        results.push(bench_scan(
            "usage::Scanner on a 4 KiB OpenAI JSON response",
            Format::Json,
            &[OPENAI_RESPONSE.to_vec()],
        ));
        results.push(bench_scan(
            "usage::Scanner on a 200-event SSE stream",
            Format::EventStream,
            &openai_events(),
        ));
    }

    if wanted("filter") {
        results.push(bench_filter(
            "Filter: request + response headers, 1 policy (setup 4)",
            &policies_json(&[policy("per-user", "header:x-user-id", 1_000_000_000, "1s")]),
        ));
        let leasing = policy("per-user", "header:x-user-id", 1_000_000_000, "1s")
            .replace(r#""per": "1s""#, r#""per": "1s", "lease": 100"#);
        results.push(bench_filter(
            "Filter: the same on a worker lease of 100 (setup 4L)",
            &policies_json(&[leasing]),
        ));
    }

    println!("\nShared data per key (its record in a page, and the page's name, shared by the keys of the page; Envoy adds its own per-page overhead):");
    let prefix = table::prefix(PLUGIN);
    let mut sizes = Vec::new();
    for (label, n) in [("1 policy", 1usize), ("5 policies, one key", 5)] {
        let ids = (u64::MAX, 0);
        let spec = table::TableSpec::new(Vec::new(), config::DEFAULT_MAX_KEYS, n, false, ids);
        let name = table::page_name(&prefix, &spec, spec.pages - 1).len();
        let value = table::record_size(n);
        let keys = spec.page_capacity(0);
        println!("  {label:<22} {value} B record; a {name} B name per page of {keys} keys");
        sizes.push(format!(
            r#"{{"label": "{label}", "policies": {n}, "record_bytes": {value}, "name_bytes": {name}, "page_keys": {keys}}}"#
        ));
    }

    if let Some(decision) = results.iter().find(|r| r.name == TOKEN_BUCKET) {
        let verdict = if decision.median_ns <= 100.0 {
            "PASS"
        } else {
            "FAIL"
        };
        println!(
            "\nTarget: a token-bucket decision <= 100 ns: {:.1} ns, {verdict}",
            decision.median_ns
        );
    }

    if let Ok(path) = std::env::var("SLUICE_BENCH_JSON") {
        let cases: Vec<String> = results
            .iter()
            .map(|r| {
                let throughput = gib_per_second(r)
                    .map(|gib| format!(r#", "bytes": {}, "gib_per_s": {gib:.3}"#, r.bytes.unwrap_or(0)))
                    .unwrap_or_default();
                format!(
                    r#"{{"name": "{}", "median_ns": {:.2}, "min_ns": {:.2}, "max_ns": {:.2}{throughput}}}"#,
                    r.name, r.median_ns, r.min_ns, r.max_ns
                )
            })
            .collect();
        let json = format!(
            "{{\"cases\": [{}], \"shared_data\": [{}]}}\n",
            cases.join(", "),
            sizes.join(", ")
        );
        if let Err(e) = std::fs::write(&path, json) {
            eprintln!("could not write {path}: {e}");
            std::process::exit(1);
        }
    }
}
