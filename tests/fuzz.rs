//! A fuzz target for the configuration parser and the limiter, written as a property test so
//! that it runs in `make test` with nothing beyond crates.io: configurations with hostile numbers
//! in every numeric field (zero, one, the bounds and one past them, powers of two up to
//! `u64::MAX`) and hostile durations go through the parser; every accepted one is run by 1 to 3
//! workers on one store, with clocks that jump, step back and sit at the end of u64, shared-data
//! slots overwritten with arbitrary words, and the service answering arbitrary numbers. Test
//! builds keep overflow checks on, so arithmetic that would wrap silently in the release wasm
//! panics here.
//!
//! Not `cargo fuzz`: libFuzzer needs a nightly toolchain that `make test` cannot count on, where
//! proptest shrinks what it finds to a small case and keeps its seed in `proptest-regressions/`.
//! `PROPTEST_CASES=200000 cargo test --test fuzz` runs it longer.
#![cfg(not(target_arch = "wasm32"))]
// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use proptest::prelude::*;
use proptest::sample::select;
use serde_json::{json, Value};
use sluice::filter::{Filter, Verdict};
use sluice::state::store::MemoryStore;
use sluice::state::store::Store;
use sluice::state::table::{page_name, prefix};
use sluice::testing::{FakeHost, FakeRequest};
use std::sync::Arc;

/// Cases per run (`PROPTEST_CASES` overrides it): a few seconds in a debug build.
const CASES: u32 = 3_000;

/// Numbers at the edges of every bound the configuration and the arithmetic have.
fn number() -> impl Strategy<Value = u64> {
    let edges = vec![
        0,
        1,
        2,
        999,
        1_000,
        1_001,
        999_999_999,
        1_000_000_000,
        1_000_000_001,
        1_000_000_000_000_000,
        1_000_000_000_000_001,
        1 << 31,
        1 << 32,
        1 << 53,
        (1 << 62) - 1,
        1 << 62,
        1 << 63,
        u64::MAX - 1,
        u64::MAX,
    ];
    prop_oneof![3 => 0u64..20, 3 => select(edges), 1 => any::<u64>()]
}

/// Durations from sane to past the end of u64 nanoseconds, and some that are not durations.
fn duration() -> impl Strategy<Value = String> {
    let odd = vec![
        "1s", "1ms", "365d", "366d", "106752d", "200000d", "213503d", "0s", "1", "s", "-1s",
    ];
    prop_oneof![
        (number(), select(vec!["ms", "s", "m", "h", "d"])).prop_map(|(n, u)| format!("{n}{u}")),
        select(odd).prop_map(String::from),
    ]
}

/// Mostly counts a configuration may hold, up to its largest (10^15), sometimes any.
fn count() -> impl Strategy<Value = u64> {
    let valid = vec![
        1,
        2,
        3,
        10,
        100,
        1_000,
        1_000_000_000,
        1_000_000_000_000_000,
    ];
    prop_oneof![9 => select(valid), 1 => number()]
}

/// Mostly periods a configuration may hold, up to its longest (365 days), sometimes any.
fn period() -> impl Strategy<Value = String> {
    let valid = vec![
        "1ms",
        "1s",
        "1m",
        "1h",
        "1d",
        "365d",
        "8760h",
        "31536000000ms",
    ];
    prop_oneof![9 => select(valid).prop_map(String::from), 1 => duration()]
}

/// `requests` per `per`, with a `burst` if `bursty` (a token bucket's), and, rarely, either way.
fn rate(bursty: bool) -> impl Strategy<Value = Value> {
    let burst = prop::option::weighted(if bursty { 0.8 } else { 0.02 }, count());
    (count(), period(), burst).prop_map(|(requests, per, burst)| {
        let mut rate = json!({"requests": requests, "per": per});
        if let Some(burst) = burst {
            rate["burst"] = json!(burst);
        }
        rate
    })
}

/// A policy of `algorithm`, keyed by `key`, with the optional fields that algorithm and `scope`
/// take (and, rarely, one they refuse).
fn policy_of(
    index: usize,
    algorithm: &'static str,
    key: &'static str,
    scope: &'static str,
) -> impl Strategy<Value = Value> {
    let bucket = algorithm == "token_bucket";
    let leaky = algorithm == "leaky_bucket";
    let global = scope == "global";
    let max_keys = prop_oneof![19 => 1u32..6, 1 => select(vec![0, 1_000_001])];
    let often = |yes: bool| if yes { 0.5 } else { 0.02 };
    let cost = prop_oneof![6 => 1u64..4, 1 => count()];
    (
        rate(bucket),
        max_keys,
        prop::option::weighted(0.3, cost),
        prop::option::weighted(often(bucket || global), count()),
        prop::option::weighted(if leaky { 0.98 } else { 0.02 }, period()),
        prop::option::weighted(often(global), rate(bucket)),
        prop::option::weighted(0.3, rate(bucket)),
        prop::option::weighted(often(global), Just("closed")),
    )
        .prop_map(
            move |(rate, max_keys, cost, lease, max_delay, emergency, tier, closed)| {
                let mut p = rate;
                p["name"] = json!(format!("p{index}"));
                p["key"] = json!([key]);
                (p["algorithm"], p["scope"]) = (json!(algorithm), json!(scope));
                p["max_keys"] = json!(max_keys);
                let gold = tier.map(|t| json!({"by": "header:x-plan", "values": {"gold": t}}));
                let optional = [
                    ("cost", cost.map(|c| json!(c))),
                    ("lease", lease.map(|l| json!(l))),
                    ("max_delay", max_delay.map(|d| json!(d))),
                    ("emergency", emergency),
                    ("tiers", gold),
                    ("failure_mode", closed.map(|c| json!(c))),
                ];
                for (field, value) in optional {
                    if let Some(value) = value {
                        p[field] = value;
                    }
                }
                p
            },
        )
}

fn policy(index: usize) -> impl Strategy<Value = Value> {
    let algorithm = select(vec![
        "token_bucket",
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "leaky_bucket",
    ]);
    let key = select(vec!["header:x-user-id", "header:x-api-key|ip", "global"]);
    let scope = select(vec!["local", "local", "global"]);
    (algorithm, key, scope).prop_flat_map(move |(a, k, s)| policy_of(index, a, k, s))
}

fn config() -> impl Strategy<Value = Value> {
    let policies = (1usize..4).prop_flat_map(|n| (0..n).map(policy).collect::<Vec<_>>());
    (policies, any::<bool>()).prop_map(|(policies, keyed)| {
        let mut config = json!({"policies": policies,
            "global": {"cluster": "c", "authority": "a"}});
        if keyed {
            config["hash_secret_env"] = json!("SLUICE_HASH_SECRET");
        }
        config
    })
}

/// What happens next in a run.
#[derive(Debug, Clone)]
enum Step {
    /// A request from `worker` for key `key`, with the tier header when `gold`.
    Request {
        worker: usize,
        key: usize,
        gold: bool,
    },
    /// The clock moves by this much (forward or back), or jumps to this edge.
    Advance(u64),
    Back(u64),
    Jump(u64),
    /// A slot of table `table` is overwritten with these words.
    Corrupt {
        table: usize,
        slot: u32,
        words: Vec<u64>,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let request = (0usize..3, 0usize..4, any::<bool>())
        .prop_map(|(worker, key, gold)| Step::Request { worker, key, gold });
    let edges = select(vec![0, 1 << 62, 1 << 63, u64::MAX - 1_000, u64::MAX]);
    let corrupt = (0usize..3, 0u32..6, prop::collection::vec(number(), 0..8))
        .prop_map(|(table, slot, words)| Step::Corrupt { table, slot, words });
    prop_oneof![
        8 => request,
        3 => number().prop_map(Step::Advance),
        1 => number().prop_map(Step::Back),
        1 => edges.prop_map(Step::Jump),
        1 => corrupt,
    ]
}

/// An answer from the service to `body`: any numbers, well-formed or not.
fn answer(body: &[u8], numbers: &[u64], allowed: bool) -> Vec<u8> {
    let checks = serde_json::from_slice::<Value>(body).unwrap()["checks"]
        .as_array()
        .map_or(0, Vec::len);
    let n = |i: usize| numbers.get(i % numbers.len().max(1)).copied().unwrap_or(0);
    let results: Vec<Value> = (0..checks)
        .map(|i| {
            json!({"allowed": allowed, "granted": n(i), "remaining": n(i + 1),
                "reset_ms": n(i + 2), "retry_after_ms": n(i + 3), "delay_ms": n(i + 4)})
        })
        .collect();
    serde_json::to_vec(&json!({ "results": results })).unwrap()
}

/// Sends one request through `filter`, answering its calls to the service from `numbers`.
fn send(filter: &Filter, host: &FakeHost, key: usize, gold: bool, numbers: &[u64]) {
    let user = ["a", "b", "c", "d"][key];
    let mut headers = vec![("x-user-id", user), ("x-api-key", user)];
    if gold {
        headers.push(("x-plan", "gold"));
    }
    *host.request.borrow_mut() =
        FakeRequest::new(&headers).with_property("source.address", "10.0.0.1:5555");
    let mut verdict = filter.on_request_headers(host);
    for round in 0..3 {
        let Verdict::Waiting(pending) = verdict else {
            return;
        };
        let body = host.call.borrow().clone().unwrap_or_default();
        let reply = (round + key) % 4 != 3;
        let reply = reply.then(|| (200, answer(&body, numbers, numbers.len().is_multiple_of(2))));
        verdict = filter.on_service_response(host, pending, reply);
    }
}

fn run(config: &Value, steps: &[Step], numbers: &[u64]) {
    let store = Arc::new(MemoryStore::default());
    let hosts: Vec<FakeHost> = (0..3)
        .map(|_| {
            FakeHost::new(store.clone(), 1_800_000_000_000_000_000).with_env(
                "SLUICE_HASH_SECRET",
                "a secret of more than 32 bytes, for the fuzzer",
            )
        })
        .collect();
    let json = config.to_string();
    let filters: Vec<Filter> = hosts
        .iter()
        .filter_map(|h| Filter::configure(json.as_bytes(), "fuzz", h, h, h).ok())
        .collect();
    let Some(first) = filters.first() else {
        return;
    };
    let tables = first.plan().tables.clone();
    let mut now = hosts[0].now.get();
    for step in steps {
        match step {
            Step::Request { worker, key, gold } => {
                let w = worker % filters.len();
                hosts[w].now.set(now);
                send(&filters[w], &hosts[w], *key, *gold, numbers);
            }
            Step::Advance(by) => now = now.saturating_add(*by),
            Step::Back(by) => now = now.saturating_sub(*by),
            Step::Jump(to) => now = *to,
            Step::Corrupt { table, slot, words } => {
                let Some(spec) = tables.get(table % tables.len().max(1)) else {
                    continue;
                };
                let name = page_name(&prefix("fuzz"), spec, slot % spec.pages);
                let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                store.set(&name, &bytes, 0).unwrap();
            }
        }
    }
    for (filter, host) in filters.iter().zip(&hosts) {
        filter.flush_counters(host);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(CASES)
    ))]

    /// Whatever the configuration, parsing and running it never panics: every number the
    /// parser accepts keeps the arithmetic within u64.
    #[test]
    fn hostile_numbers_never_overflow_the_parser_or_the_limiter(
        config in config(),
        steps in prop::collection::vec(step(), 1..40),
        numbers in prop::collection::vec(number(), 0..6),
    ) {
        run(&config, &steps, &numbers);
    }

    /// Arbitrary bytes and near-JSON never panic the parser.
    #[test]
    fn arbitrary_bytes_never_panic_the_parser(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = sluice::config::parse(&bytes);
    }
}
