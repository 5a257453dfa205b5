//! The draft RateLimit fields (draft-ietf-httpapi-ratelimit-headers-11) as a client reads them,
//! with an independent RFC 9651 parser (`sfv`). For every algorithm: the remaining quota never
//! exceeds the advertised quota; the quota over its window is the policy's sustained rate; a
//! 429's effective window is its `retry-after`; and waiting that long admits a request of the
//! same cost. First the pure core (the filter over fake hosts, two workers sharing one store),
//! then a real Envoy.
#![cfg(not(target_arch = "wasm32"))]
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use proptest::prelude::*;
use serde_json::{json, Value};
use sluice::filter::{Admitted, Filter, Verdict};
use sluice::state::store::MemoryStore;
use sluice::testing::{FakeHost, FakeRequest};
use sluice_testkit::envoy::Envoy;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SEC: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;
const T0: u64 = 1_800_000_000 * SEC;

/// The two draft fields of one response, as parsed.
#[derive(Debug)]
struct Fields {
    policy: String,
    /// `ratelimit-policy`: quota and window (seconds).
    q: i64,
    w: i64,
    /// `ratelimit`: remaining quota and effective window (seconds).
    r: i64,
    t: i64,
}

/// Parses a field that must be a list of one String item with integer parameters.
fn item(value: &str) -> (String, Vec<(String, i64)>) {
    let list: sfv::List = sfv::Parser::new(value)
        .parse()
        .unwrap_or_else(|e| panic!("{value:?} is not a structured-field list: {e}"));
    let [sfv::ListEntry::Item(item)] = &list[..] else {
        panic!("{value:?} is not a list of one item");
    };
    let name = item.bare_item.as_string().expect("the policy is a String");
    let params = item.params.iter().map(|(key, value)| {
        let n = value.as_integer().expect("integer parameters");
        (key.as_str().to_string(), i64::from(n))
    });
    (name.as_str().to_string(), params.collect())
}

fn param(params: &[(String, i64)], key: &str) -> i64 {
    let found = params.iter().find(|(k, _)| k == key);
    found.unwrap_or_else(|| panic!("no {key} in {params:?}")).1
}

fn fields(header: impl Fn(&str) -> Option<String>) -> Fields {
    let (policy, limits) = item(&header("ratelimit-policy").expect("ratelimit-policy"));
    let (name, state) = item(&header("ratelimit").expect("ratelimit"));
    assert_eq!(policy, name, "both fields name the same policy");
    Fields {
        q: param(&limits, "q"),
        w: param(&limits, "w"),
        r: param(&state, "r"),
        t: param(&state, "t"),
        policy,
    }
}

/// What a client can rely on, whatever the algorithm: `requests` per `per_ms` is the rate.
fn assert_consistent(f: &Fields, requests: u64, per_ms: u64) {
    assert!(f.q >= 1 && f.w >= 1, "{f:?}");
    assert!(f.r <= f.q, "remaining above the quota: {f:?}");
    assert_eq!(
        i128::from(f.q) * i128::from(per_ms),
        i128::from(f.w) * 1000 * i128::from(requests),
        "the quota over its window is not {requests} per {per_ms} ms: {f:?}"
    );
}

// --- The pure core.

/// A policy of the given algorithm, valid whatever the numbers.
fn policy(
    algorithm: usize,
    requests: u64,
    per_ms: u64,
    extra: u64,
    cost: u64,
    lease: u64,
) -> Value {
    let algorithm = [
        "token_bucket",
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "leaky_bucket",
    ][algorithm];
    let mut p = json!({"name": "per-user", "key": ["header:x-user-id"], "algorithm": algorithm,
        "requests": requests.max(cost), "per": format!("{per_ms}ms"), "cost": cost, "max_keys": 4});
    match algorithm {
        "token_bucket" => {
            p["burst"] = json!(cost + extra);
            if lease > 0 {
                p["lease"] = json!((cost + lease).min(cost + extra));
            }
        }
        // Room for at least `cost` at once: the capacity is one plus the intervals in max_delay.
        "leaky_bucket" => {
            let max_delay = ((cost - 1 + extra) * per_ms).div_ceil(requests.max(cost)) + 1;
            p["max_delay"] = json!(format!("{max_delay}ms"));
        }
        _ => {}
    }
    p
}

/// A worker: its filter and host, over the shared store.
fn worker(config: &Value, store: &Arc<MemoryStore>) -> (Filter, FakeHost) {
    let host = FakeHost::new(store.clone(), T0);
    let json = config.to_string();
    let filter = Filter::configure(json.as_bytes(), "fields", &host, &host, &host).unwrap();
    (filter, host)
}

/// Sends alice's request at `now`: admitted or not, and the draft fields and `retry-after`.
fn send(filter: &Filter, host: &FakeHost, now: u64) -> (bool, Fields, Option<i64>) {
    host.now.set(now);
    *host.request.borrow_mut() =
        FakeRequest::new(&[("x-user-id", "alice")]).with_property("source.address", "10.0.0.1:1");
    match filter.on_request_headers(host) {
        Verdict::Continue(Admitted {
            reported: Some(reported),
            ..
        })
        | Verdict::Hold {
            admitted:
                Admitted {
                    reported: Some(reported),
                    ..
                },
            ..
        } => {
            let mut headers = Vec::new();
            filter.each_response_header(&reported, |n, v| headers.push((n, v.to_string())));
            let header = |name: &str| {
                headers
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.clone())
            };
            (true, fields(header), None)
        }
        Verdict::Denied => {
            let reply = host.reply.borrow().clone().unwrap();
            assert_eq!(reply.status, 429);
            let header = |name: &str| reply.header(name).map(String::from);
            let retry = header("retry-after").unwrap().parse().unwrap();
            (false, fields(header), Some(retry))
        }
        other => panic!("no headers to read: {other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Two workers take turns at random moments; after every 429 the same worker comes back
    /// exactly `retry-after` seconds later with the same request.
    #[test]
    fn every_algorithm_gives_fields_a_client_can_trust(
        algorithm in 0usize..5,
        requests in 1u64..12,
        per_ms in prop_oneof![Just(1000u64), Just(1500), Just(60_000), 100u64..5000],
        extra in 0u64..8,
        cost in 1u64..3,
        lease in 0u64..3,
        steps in proptest::collection::vec((0usize..2, 0u64..1500), 1..60),
    ) {
        let config = json!({"headers": "draft",
            "policies": [policy(algorithm, requests, per_ms, extra, cost, lease)]});
        let store = Arc::new(MemoryStore::default());
        let workers = [worker(&config, &store), worker(&config, &store)];
        let requests = requests.max(cost);
        let mut now = T0;
        for (w, ms) in steps {
            now += ms * MS;
            let (filter, host) = &workers[w];
            let (admitted, fields, retry) = send(filter, host, now);
            assert_consistent(&fields, requests, per_ms);
            if admitted {
                continue;
            }
            let retry = retry.unwrap();
            prop_assert_eq!(fields.t, retry, "a 429's effective window is its retry-after");
            now += u64::try_from(retry).unwrap() * SEC;
            let (again, fields, _) = send(filter, host, now);
            prop_assert!(again, "not admitted {retry} s after the 429: {fields:?}");
        }
    }
}

#[test]
fn burst_5_at_1_per_second_advertises_5_per_5_seconds_and_never_more_left() {
    let config = json!({"headers": "draft", "policies": [{"name": "per-user",
        "key": ["header:x-user-id"], "requests": 1, "per": "1s", "burst": 5}]});
    let (filter, host) = worker(&config, &Arc::default());
    let seen: Vec<(i64, i64, i64, i64)> = (0..6)
        .map(|_| {
            let (_, f, _) = send(&filter, &host, T0);
            (f.q, f.w, f.r, f.t)
        })
        .collect();
    assert_eq!(
        seen,
        [
            (5, 5, 4, 1),
            (5, 5, 3, 2),
            (5, 5, 2, 3),
            (5, 5, 1, 4),
            (5, 5, 0, 5),
            (5, 5, 0, 1)
        ]
    );
}

// --- A real Envoy.

/// One policy per algorithm, each on its own path, refilling within a second or two.
fn every_algorithm() -> String {
    let policies: Vec<Value> = [
        ("tb", "token_bucket"),
        ("fw", "fixed_window"),
        ("sw", "sliding_window"),
        ("sl", "sliding_log"),
        ("lb", "leaky_bucket"),
    ]
    .iter()
    .map(|(name, algorithm)| {
        let mut p = json!({"name": name, "algorithm": algorithm, "match": {"path_prefix": format!("/{name}/")},
            "key": ["header:x-user-id"], "requests": 3, "per": "1s"});
        match *algorithm {
            "token_bucket" => p["burst"] = json!(4),
            "leaky_bucket" => p["max_delay"] = json!("200ms"),
            _ => {}
        }
        p
    })
    .collect();
    json!({"headers": "draft", "policies": policies}).to_string()
}

#[test]
fn through_envoy_every_algorithms_fields_hold_and_retry_after_admits() {
    let envoy = Envoy::start(&every_algorithm());
    let alice: &[(&str, &[u8])] = &[("x-user-id", b"alice")];
    let read = |r: &sluice_testkit::http::Response| fields(|n| r.header(n).map(String::from));
    let mut waits = Vec::new();
    for name in ["tb", "fw", "sw", "sl", "lb"] {
        let path = format!("/{name}/x");
        let started = Instant::now();
        let denied = loop {
            let r = envoy.get(&path, alice);
            let f = read(&r);
            assert_eq!(f.policy, name);
            assert_consistent(&f, 3, 1000);
            if r.status == 429 {
                break r;
            }
            assert_eq!(r.status, 200, "{r:?}");
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{name} never denied"
            );
        };
        let retry: i64 = denied.header("retry-after").unwrap().parse().unwrap();
        assert_eq!(read(&denied).t, retry, "{name}: {denied:?}");
        waits.push((
            path,
            Instant::now() + Duration::from_secs(retry.unsigned_abs()),
        ));
    }
    for (path, at) in waits {
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        let again = envoy.get(&path, alice);
        assert_eq!(again.status, 200, "{path} after its retry-after: {again:?}");
    }
}
