//! Local rate limiting in a real Envoy (`--concurrency 2`): what clients see, what the
//! counters say, and what Envoy refuses to start with.
//!
//! Every test starts its own Envoy on free loopback ports (see `sluice_testkit::envoy`). Limits that must not
//! refill during a test are written "per 1h"; the tests that depend on refill say how long they
//! wait and why that is enough.

// The helpers here are not #[test] fns, so clippy's in-tests allowances miss them; like
// assertions, they report an unexpected response by panicking.
#![allow(clippy::panic, clippy::indexing_slicing)]

use sluice::limiter::PolicyOutcome::{Allowed, Denied, ShadowDenied};
use sluice::output::metrics::requests_counter;
use sluice_testkit::envoy::{envoy_binary, Envoy};
use sluice_testkit::http::{Connection, Response};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Barrier;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The rate-limit headers the filter can add, in the order it adds them.
const RATE_LIMIT_HEADERS: [&str; 5] = [
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "ratelimit-policy",
    "ratelimit",
];

fn user(id: &str) -> [(&str, &[u8]); 1] {
    [("x-user-id", id.as_bytes())]
}

/// `n` requests one after the other, each on a fresh connection; their statuses.
fn statuses(envoy: &Envoy, path: &str, headers: &[(&str, &[u8])], n: usize) -> Vec<u16> {
    (0..n).map(|_| envoy.get(path, headers).status).collect()
}

/// The rate-limit headers of a response, as (name, value) pairs.
fn rate_limit_headers(r: &Response) -> Vec<(String, String)> {
    r.headers
        .iter()
        .filter(|(name, _)| RATE_LIMIT_HEADERS.contains(&name.as_str()))
        .cloned()
        .collect()
}

/// The policy a 429 names in its JSON body.
fn denying_policy(r: &Response) -> String {
    assert_eq!(r.status, 429, "not a denial: {r:?}");
    let body: serde_json::Value = serde_json::from_slice(&r.body)
        .unwrap_or_else(|e| panic!("429 body is not JSON ({e}): {:?}", r.text()));
    body["policy"].as_str().unwrap_or_default().to_string()
}

// --- The reference behaviour.

const ONE_PER_SECOND_BURST_5: &str = r#"{"policies": [
  {"name": "per-user", "key": ["header:x-user-id"], "requests": 1, "per": "1s", "burst": 5}
]}"#;

#[test]
fn eight_rapid_requests_give_five_200s_then_three_429s_and_two_seconds_later_two_more_pass() {
    let envoy = Envoy::start(ONE_PER_SECOND_BURST_5);

    // The eight must reach Envoy within a second of the first (else a token comes back
    // mid-burst), and the last three at least two but under three seconds after the first.
    // A machine too slow for that gets another go with a fresh user; wrong statuses never do.
    for attempt in 1..=3 {
        let alice = format!("alice-{attempt}");
        let start = Instant::now();
        let mut burst = statuses(&envoy, "/api/hello", &user(&alice), 1);
        let first_answered = Instant::now();
        burst.extend(statuses(&envoy, "/api/hello", &user(&alice), 7));
        let burst_took = start.elapsed();

        std::thread::sleep((first_answered + Duration::from_secs(2)) - Instant::now());
        let later = statuses(&envoy, "/api/hello", &user(&alice), 3);
        let all_took = start.elapsed();

        if burst_took < Duration::from_millis(900) && all_took < Duration::from_millis(2900) {
            assert_eq!(burst, [200, 200, 200, 200, 200, 429, 429, 429]);
            assert_eq!(later, [200, 200, 429], "two tokens refill in two seconds");
            return;
        }
        eprintln!("attempt {attempt}: too slow (burst {burst_took:?}, all {all_took:?})");
    }
    panic!("three attempts were all too slow to check the timing");
}

// --- Keys are isolated.

const ONE_PER_HOUR_BURST_3: &str = r#"{"policies": [
  {"name": "per-user", "key": ["header:x-user-id"], "requests": 1, "per": "1h", "burst": 3}
]}"#;

#[test]
fn alice_using_up_her_burst_leaves_bob_his_whole_burst() {
    let envoy = Envoy::start(ONE_PER_HOUR_BURST_3);

    let alice = statuses(&envoy, "/api/x", &user("alice"), 4);
    let bob = statuses(&envoy, "/api/x", &user("bob"), 4);

    assert_eq!(alice, [200, 200, 200, 429]);
    assert_eq!(bob, [200, 200, 200, 429]);
}

// --- Layered limits.

/// The `ratelimit` header starts with `prefix` (the policy and tokens left; the seconds to
/// full depend on when the earlier requests came).
fn assert_reports(r: &Response, prefix: &str) {
    let ratelimit = r.header("ratelimit").unwrap_or_default();
    assert!(
        ratelimit.starts_with(prefix),
        "ratelimit: {ratelimit:?}, expected {prefix}..."
    );
}

const LAYERED: &str = r#"{"headers": "both", "policies": [
  {"name": "per-second", "key": ["header:x-user-id"], "requests": 2, "per": "1s"},
  {"name": "per-minute", "key": ["header:x-user-id"], "requests": 3, "per": "1m"},
  {"name": "per-ip", "key": ["ip"], "requests": 4, "per": "1h"}
]}"#;

#[test]
fn a_denial_by_one_layered_policy_charges_none_of_the_others_and_names_the_denier() {
    let envoy = Envoy::start(LAYERED);

    // per-second lets two through and denies two; per-minute and per-ip are not charged.
    // (per-second refills a token every 500 ms: the four must come within that.)
    let start = Instant::now();
    let alice: Vec<Response> = (0..4).map(|_| envoy.get("/", &user("alice"))).collect();
    let first_four_took = start.elapsed();
    let codes: Vec<u16> = alice.iter().map(|r| r.status).collect();
    assert_eq!(codes, [200, 200, 429, 429], "in {first_four_took:?}");
    for denied in &alice[2..] {
        assert_eq!(denying_policy(denied), "per-second");
        assert_eq!(denied.header("x-ratelimit-limit"), Some("2"));
        assert_eq!(
            denied.header("ratelimit-policy"),
            Some(r#""per-second";q=2;w=1"#)
        );
    }

    // A second on, per-second is full again. per-minute has exactly the one token the two
    // denials did not take: one 200 (reporting it as the tightest, 0 left), then its 429.
    std::thread::sleep(Duration::from_millis(1100));
    let refilled = envoy.get("/", &user("alice"));
    assert_eq!(
        refilled.status, 200,
        "the denials charged per-minute: {refilled:?}"
    );
    assert_reports(&refilled, r#""per-minute";r=0;t="#);
    let refilled_again = envoy.get("/", &user("alice"));
    assert_eq!(denying_policy(&refilled_again), "per-minute");
    assert_eq!(refilled_again.header("x-ratelimit-limit"), Some("3"));
    assert_eq!(
        refilled_again.header("ratelimit-policy"),
        Some(r#""per-minute";q=3;w=60"#)
    );

    // per-ip took a token for each of alice's three 200s only, so bob (same IP) gets the
    // fourth and then per-ip's 429 while his own per-user buckets are nearly full.
    let bob = envoy.get("/", &user("bob"));
    assert_eq!(bob.status, 200, "the denials charged per-ip: {bob:?}");
    assert_reports(&bob, r#""per-ip";r=0;t="#);
    let bob_again = envoy.get("/", &user("bob"));
    assert_eq!(denying_policy(&bob_again), "per-ip");
    assert_eq!(
        bob_again.header("ratelimit-policy"),
        Some(r#""per-ip";q=4;w=3600"#)
    );

    for (policy, outcome, expected) in [
        ("per-second", Allowed, 4),
        ("per-second", Denied, 2),
        ("per-minute", Allowed, 4),
        ("per-minute", Denied, 1),
        ("per-ip", Allowed, 4),
        ("per-ip", Denied, 1),
    ] {
        let name = requests_counter(policy, outcome);
        assert_eq!(
            envoy.wait_for_wasm_counter(&name, expected),
            expected,
            "{name}"
        );
    }
}

// --- Shadow mode.

const SHADOW_TRIAL: &str = r#"{"headers": "both", "policies": [
  {"name": "trial", "key": ["header:x-user-id"], "requests": 1, "per": "1h", "burst": 1, "mode": "shadow"},
  {"name": "per-user", "match": {"path_prefix": "/api/"}, "key": ["header:x-user-id"], "requests": 10, "per": "1h"}
]}"#;

#[test]
fn a_shadow_policy_never_denies_adds_no_headers_and_counts_would_be_denials() {
    let envoy = Envoy::start(SHADOW_TRIAL);

    // Only the shadow policy applies outside /api/: five 200s, no rate-limit headers at all.
    let bob: Vec<Response> = (0..5).map(|_| envoy.get("/home", &user("bob"))).collect();
    for r in &bob {
        assert_eq!(r.status, 200);
        assert_eq!(rate_limit_headers(r), [], "shadow added headers: {r:?}");
        assert_eq!(r.header("retry-after"), None);
    }

    // On /api/ the headers are the enforcing policy's, never the shadow one's.
    let alice: Vec<Response> = (0..3)
        .map(|_| envoy.get("/api/x", &user("alice")))
        .collect();
    for (r, remaining) in alice.iter().zip(["9", "8", "7"]) {
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-ratelimit-remaining"), Some(remaining));
        assert_eq!(
            r.header("ratelimit-policy"),
            Some(r#""per-user";q=10;w=3600"#)
        );
    }

    // bob would have been denied 4 times, alice twice.
    assert_eq!(
        envoy.wait_for_wasm_counter(&requests_counter("trial", ShadowDenied), 6),
        6
    );
    assert_eq!(
        envoy.wait_for_wasm_counter(&requests_counter("trial", Allowed), 2),
        2
    );
    assert_eq!(
        envoy.wasm_counter(&requests_counter("trial", Denied)),
        Some(0)
    );
}

// --- Tiers.

const TIERED: &str = r#"{"headers": "both", "policies": [
  {"name": "per-user", "key": ["header:x-user-id"], "requests": 2, "per": "1h",
   "tiers": {"by": "header:x-plan", "values": {"premium": {"requests": 5, "per": "1h"}}}}
]}"#;

#[test]
fn a_premium_plan_gets_its_tier_burst_and_other_plans_the_default_tier() {
    let envoy = Envoy::start(TIERED);
    let premium = [("x-user-id", &b"carol"[..]), ("x-plan", b"premium")];
    let unknown_plan = [("x-user-id", &b"dave"[..]), ("x-plan", b"gold")];

    let carol: Vec<Response> = (0..6).map(|_| envoy.get("/", &premium)).collect();
    let alice = statuses(&envoy, "/", &user("alice"), 3);
    let dave = statuses(&envoy, "/", &unknown_plan, 3);

    let codes: Vec<u16> = carol.iter().map(|r| r.status).collect();
    assert_eq!(codes, [200, 200, 200, 200, 200, 429]);
    assert_eq!(carol[0].header("x-ratelimit-limit"), Some("5"));
    assert_eq!(
        carol[0].header("ratelimit-policy"),
        Some(r#""per-user";q=5;w=3600"#)
    );
    assert_eq!(alice, [200, 200, 429], "no x-plan: the default tier");
    assert_eq!(dave, [200, 200, 429], "an unknown plan: the default tier");
}

// --- Cost.

#[test]
fn requests_costing_2_tokens_get_two_200s_from_a_burst_of_5() {
    let envoy = Envoy::start(
        r#"{"policies": [{"name": "upload", "key": ["header:x-user-id"], "requests": 1, "per": "1s", "burst": 5, "cost": 2}]}"#,
    );

    let r: Vec<Response> = (0..3).map(|_| envoy.get("/", &user("alice"))).collect();

    let codes: Vec<u16> = r.iter().map(|r| r.status).collect();
    assert_eq!(codes, [200, 200, 429]);
    let remaining: Vec<Option<&str>> = r
        .iter()
        .map(|r| r.header("x-ratelimit-remaining"))
        .collect();
    assert_eq!(remaining, [Some("3"), Some("1"), Some("1")]);
    assert_eq!(
        r[2].header("retry-after"),
        Some("1"),
        "one more token: a second"
    );
}

// --- Response headers and the 429.

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

fn epoch_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Three rapid requests use up a burst of 3 (one token per 6 s); the fourth is denied.
fn three_allowed_then_denied(headers_style: &str) -> (Response, Response, u64, u64) {
    let envoy = Envoy::start(&format!(
        r#"{{"headers": "{headers_style}", "policies": [
          {{"name": "per-user", "key": ["header:x-user-id"], "requests": 10, "per": "1m", "burst": 3}}
        ]}}"#
    ));
    let before = epoch_secs();
    let first = envoy.get("/", &user("alice"));
    statuses(&envoy, "/", &user("alice"), 2);
    let denied = envoy.get("/", &user("alice"));
    let after = epoch_secs();
    assert_eq!((first.status, denied.status), (200, 429));
    (first, denied, before, after)
}

/// The 429 every header style shares: JSON body naming the policy, `retry-after` = its
/// `retry_after`. Four requests within a second of a 6 s interval: a 6 s wait.
fn assert_is_the_documented_429(denied: &Response) {
    assert_eq!(denied.status, 429);
    let content_types: Vec<&(String, String)> = denied
        .headers
        .iter()
        .filter(|(n, _)| n == "content-type")
        .collect();
    assert_eq!(
        content_types,
        [&("content-type".to_string(), "application/json".to_string())]
    );
    assert_eq!(denied.header("retry-after"), Some("6"));
    assert_eq!(
        denied.text(),
        r#"{"error":"too_many_requests","policy":"per-user","retry_after":6}"#
    );
}

/// `x-ratelimit-reset` is the epoch second at which the bucket is full again, `full_in` after
/// a request made between `before` and `after` (whole seconds, rounded up).
fn assert_reset_is(r: &Response, before: u64, after: u64, full_in: u64) {
    let reset: u64 = r
        .header("x-ratelimit-reset")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no numeric x-ratelimit-reset: {r:?}"));
    assert!(
        (before + full_in..=after + full_in + 1).contains(&reset),
        "x-ratelimit-reset {reset} is not {full_in} s after [{before}, {after}]"
    );
}

#[test]
fn legacy_headers_give_limit_remaining_and_reset_epoch_seconds() {
    let (first, denied, before, after) = three_allowed_then_denied("legacy");

    let names = |r: &Response| -> Vec<String> {
        rate_limit_headers(r).into_iter().map(|(n, _)| n).collect()
    };
    assert_eq!(names(&first), RATE_LIMIT_HEADERS[..3]);
    assert_eq!(first.header("x-ratelimit-limit"), Some("3"));
    assert_eq!(first.header("x-ratelimit-remaining"), Some("2"));
    assert_reset_is(&first, before, after, 6);

    assert_is_the_documented_429(&denied);
    assert_eq!(names(&denied), RATE_LIMIT_HEADERS[..3]);
    assert_eq!(denied.header("x-ratelimit-limit"), Some("3"));
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
    assert_reset_is(&denied, before, after, 18);
}

#[test]
fn draft_headers_give_the_burst_over_a_full_refill_remaining_and_seconds_to_full_or_to_retry() {
    let (first, denied, _, _) = three_allowed_then_denied("draft");

    assert_eq!(
        rate_limit_headers(&first),
        pairs(&[
            ("ratelimit-policy", r#""per-user";q=3;w=18"#),
            ("ratelimit", r#""per-user";r=2;t=6"#),
        ])
    );
    assert_is_the_documented_429(&denied);
    assert_eq!(
        rate_limit_headers(&denied),
        pairs(&[
            ("ratelimit-policy", r#""per-user";q=3;w=18"#),
            ("ratelimit", r#""per-user";r=0;t=6"#),
        ])
    );
}

#[test]
fn both_gives_the_legacy_and_the_draft_headers() {
    let (first, denied, before, after) = three_allowed_then_denied("both");

    let reset = first
        .header("x-ratelimit-reset")
        .unwrap_or_default()
        .to_string();
    assert_reset_is(&first, before, after, 6);
    assert_eq!(
        rate_limit_headers(&first),
        pairs(&[
            ("x-ratelimit-limit", "3"),
            ("x-ratelimit-remaining", "2"),
            ("x-ratelimit-reset", &reset),
            ("ratelimit-policy", r#""per-user";q=3;w=18"#),
            ("ratelimit", r#""per-user";r=2;t=6"#),
        ])
    );
    assert_is_the_documented_429(&denied);
    let reset = denied
        .header("x-ratelimit-reset")
        .unwrap_or_default()
        .to_string();
    assert_reset_is(&denied, before, after, 18);
    assert_eq!(
        rate_limit_headers(&denied),
        pairs(&[
            ("x-ratelimit-limit", "3"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", &reset),
            ("ratelimit-policy", r#""per-user";q=3;w=18"#),
            ("ratelimit", r#""per-user";r=0;t=6"#),
        ])
    );
}

#[test]
fn none_gives_no_rate_limit_headers_but_the_429_keeps_retry_after_and_body() {
    let (first, denied, _, _) = three_allowed_then_denied("none");

    assert_eq!(rate_limit_headers(&first), []);
    assert_eq!(rate_limit_headers(&denied), []);
    assert_is_the_documented_429(&denied);
}

// --- The `ip` key is the address Envoy computed; trusting X-Forwarded-For is Envoy's config.

const PER_IP_BURST_3: &str = r#"{"policies": [
  {"name": "per-ip", "key": ["ip"], "requests": 1, "per": "1h", "burst": 3}
]}"#;

#[test]
fn with_no_trusted_hops_a_rotating_x_forwarded_for_does_not_escape_the_ip_bucket() {
    let envoy = Envoy::options(PER_IP_BURST_3)
        .use_remote_address(true)
        .xff_num_trusted_hops(0)
        .start();

    let spoofed: Vec<u16> = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"]
        .iter()
        .map(|xff| {
            envoy
                .get("/", &[("x-forwarded-for", xff.as_bytes())])
                .status
        })
        .collect();

    assert_eq!(spoofed, [200, 200, 200, 429, 429], "all are 127.0.0.1");
}

#[test]
fn with_one_trusted_hop_the_x_forwarded_for_address_is_the_ip_key() {
    let envoy = Envoy::options(PER_IP_BURST_3)
        .use_remote_address(true)
        .xff_num_trusted_hops(1)
        .start();
    let from = |ip: &'static str| [("x-forwarded-for", ip.as_bytes())];

    let first_client = statuses(&envoy, "/", &from("10.0.0.7"), 4);
    let second_client = statuses(&envoy, "/", &from("10.0.0.8"), 1);
    let no_xff = statuses(&envoy, "/", &[], 1);

    assert_eq!(first_client, [200, 200, 200, 429]);
    assert_eq!(second_client, [200], "another XFF address, another bucket");
    assert_eq!(no_xff, [200], "no XFF: the TCP peer, another bucket");
}

// --- A missing key part.

#[test]
fn a_policy_skips_requests_without_its_key_header_by_default() {
    let envoy = Envoy::start(
        r#"{"policies": [{"name": "per-user", "key": ["header:x-user-id"], "requests": 1, "per": "1h", "burst": 1}]}"#,
    );

    let anonymous: Vec<Response> = (0..3).map(|_| envoy.get("/", &[])).collect();
    let empty = statuses(&envoy, "/", &[("x-user-id", b"")], 2);
    let alice = statuses(&envoy, "/", &user("alice"), 2);

    for r in &anonymous {
        assert_eq!(r.status, 200);
        assert_eq!(rate_limit_headers(r), [], "the policy did not apply");
    }
    assert_eq!(empty, [200, 200], "an empty value is missing");
    assert_eq!(alice, [200, 429], "requests with the key are limited");
}

#[test]
fn with_missing_key_shared_requests_without_the_key_share_one_bucket() {
    let envoy = Envoy::start(
        r#"{"policies": [{"name": "per-user", "key": ["header:x-user-id"], "missing_key": "shared", "requests": 1, "per": "1h", "burst": 2}]}"#,
    );

    let anonymous = statuses(&envoy, "/", &[], 2);
    let empty = statuses(&envoy, "/", &[("x-user-id", b"")], 1);
    let anonymous_again = statuses(&envoy, "/", &[("x-other", b"1")], 1);
    let alice = statuses(&envoy, "/", &user("alice"), 1);

    assert_eq!(anonymous, [200, 200]);
    assert_eq!(
        empty,
        [429],
        "an empty value is missing too: the same bucket"
    );
    assert_eq!(anonymous_again, [429]);
    assert_eq!(alice, [200], "a keyed request has its own bucket");
}

// --- The default policy.

const API_WITH_DEFAULT: &str = r#"{"policies": [
  {"name": "api", "match": {"path_prefix": "/api/"}, "key": ["header:x-user-id"], "requests": 1, "per": "1h", "burst": 2}
], "default": {"name": "baseline", "key": ["ip"], "requests": 1, "per": "1h", "burst": 3}}"#;

#[test]
fn the_default_policy_applies_only_to_requests_no_policy_matched() {
    let envoy = Envoy::start(API_WITH_DEFAULT);

    // The query string is not part of the path: /api/x?y=1 is under /api/.
    let api: Vec<Response> = (0..3)
        .map(|_| envoy.get("/api/x?y=1", &user("alice")))
        .collect();
    // Not under /api/, even with /api/ in the query: the default, untouched by the above.
    let other: Vec<Response> = ["/static/x", "/?next=/api/", "/apix", "/static/y"]
        .iter()
        .map(|path| envoy.get(path, &user("alice")))
        .collect();

    let codes = |rs: &[Response]| -> Vec<u16> { rs.iter().map(|r| r.status).collect() };
    assert_eq!(codes(&api), [200, 200, 429]);
    assert_eq!(denying_policy(&api[2]), "api");
    assert_eq!(codes(&other), [200, 200, 200, 429]);
    assert_eq!(other[0].header("x-ratelimit-limit"), Some("3"));
    assert_eq!(denying_policy(&other[3]), "baseline");
    assert_eq!(
        envoy.wait_for_wasm_counter(&requests_counter("baseline", Allowed), 3),
        3
    );
    assert_eq!(
        envoy.wait_for_wasm_counter(&requests_counter("api", Allowed), 2),
        2
    );
}

#[test]
fn requests_a_policy_skips_for_want_of_its_key_fall_to_the_default() {
    let envoy = Envoy::start(API_WITH_DEFAULT);

    // /api/ matches `api`, but without x-user-id `api` skips them: the baseline catches them,
    // on the same per-ip bucket as every other unlimited request.
    let anonymous: Vec<Response> = (0..2).map(|_| envoy.get("/api/x", &[])).collect();
    let elsewhere = statuses(&envoy, "/static/x", &[], 1);
    let denied = envoy.get("/api/x", &[("x-user-id", b"")]);

    assert_eq!(anonymous[0].status, 200);
    assert_eq!(anonymous[0].header("x-ratelimit-limit"), Some("3"));
    assert_eq!(elsewhere, [200]);
    assert_eq!(denying_policy(&denied), "baseline");
    assert_eq!(
        envoy.wait_for_wasm_counter(&requests_counter("baseline", Denied), 1),
        1
    );
}

// --- Both workers share every bucket.

/// `listener.<addr>.worker_<n>.downstream_cx_total` for each worker: who accepted connections.
fn connections_per_worker(envoy: &Envoy) -> Vec<u64> {
    let stats = envoy.admin_stats(r"^listener\..*\.worker_[0-9]+\.downstream_cx_total$");
    let mut by_worker: Vec<(String, u64)> = stats.into_iter().collect();
    by_worker.sort();
    by_worker.into_iter().map(|(_, count)| count).collect()
}

#[test]
fn eight_parallel_clients_on_both_workers_get_exactly_the_burst_through() {
    const THREADS: usize = 8;
    const REQUESTS_EACH: usize = 25;
    let envoy = Envoy::start(
        r#"{"policies": [{"name": "per-user", "key": ["header:x-user-id"], "requests": 1, "per": "1h", "burst": 20}]}"#,
    );

    let start = Barrier::new(THREADS);

    // Every request has its own TCP connection, so the kernel spreads them over the workers.
    let per_thread: Vec<Vec<u16>> = std::thread::scope(|s| {
        let clients: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    statuses(&envoy, "/api/x", &user("shared"), REQUESTS_EACH)
                })
            })
            .collect();
        clients
            .into_iter()
            .map(|c| c.join().expect("client thread"))
            .collect()
    });

    let all: Vec<u16> = per_thread.into_iter().flatten().collect();
    let ok = all.iter().filter(|&&s| s == 200).count();
    let denied = all.iter().filter(|&&s| s == 429).count();
    assert_eq!((ok, denied), (20, THREADS * REQUESTS_EACH - 20));
    let workers = connections_per_worker(&envoy);
    assert!(
        workers.len() == 2 && workers.iter().all(|&n| n > 0),
        "both workers served: {workers:?}"
    );
    assert_eq!(
        envoy.wait_for_wasm_counter(&requests_counter("per-user", Allowed), 20),
        20
    );
    assert_eq!(
        envoy.wait_for_wasm_counter(&requests_counter("per-user", Denied), 180),
        180
    );
    // Both workers have flushed everything they counted; the races they lost are in here.
    let retries = envoy.wasm_counter("sluice.cas_retries");
    eprintln!(
        "sluice.cas_retries after {} parallel requests: {retries:?}",
        all.len()
    );
    assert!(retries.is_some(), "sluice.cas_retries is not in /stats");
}

#[test]
fn a_fresh_key_hit_by_two_clients_at_once_admits_exactly_one() {
    const KEYS: usize = 30;
    let envoy = Envoy::start(
        r#"{"policies": [{"name": "per-user", "key": ["header:x-user-id"], "requests": 1, "per": "1h", "burst": 1}]}"#,
    );
    let together = Barrier::new(2);

    // For each fresh key, two clients connect first and then send at the same instant. When
    // the kernel put the two connections on different workers, the workers race to create
    // the key's bucket; the worker connection counts say whether they did.
    let mut statuses_per_key = Vec::new();
    let mut split_pairs = 0;
    for key in 0..KEYS {
        let id = format!("fresh-{key}");
        let before = connections_per_worker(&envoy);
        let pair: Vec<u16> = std::thread::scope(|s| {
            let clients: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        let connection = envoy.connect();
                        together.wait();
                        connection.request("GET", "/", &user(&id))
                    })
                })
                .collect();
            clients
                .into_iter()
                .map(|c| c.join().expect("client thread").expect(&id).status)
                .collect()
        });
        let after = connections_per_worker(&envoy);
        let accepted: Vec<Option<u64>> = after
            .iter()
            .zip(&before)
            .map(|(a, b)| a.checked_sub(*b))
            .collect();
        if accepted == [Some(1), Some(1)] {
            split_pairs += 1;
        }
        statuses_per_key.push(pair);
    }

    let over_or_under: Vec<&Vec<u16>> = statuses_per_key
        .iter()
        .filter(|pair| !matches!(pair[..], [200, 429] | [429, 200]))
        .collect();
    assert_eq!(over_or_under, [] as [&Vec<u16>; 0], "not one 200 per key");
    assert!(split_pairs > 0, "no pair reached both workers");
    assert_eq!(
        envoy.wait_for_wasm_counter(&requests_counter("per-user", Allowed), 30),
        30
    );
    assert_eq!(
        envoy.wait_for_wasm_counter(&requests_counter("per-user", Denied), 30),
        30
    );
    let retries = envoy.wasm_counter("sluice.cas_retries");
    eprintln!(
        "sluice.cas_retries after {KEYS} racing pairs ({split_pairs} on both workers): {retries:?}"
    );
    assert!(retries.is_some(), "sluice.cas_retries is not in /stats");
}

// --- Leases: a worker takes several tokens of a key's bucket at once and spends them itself.

/// Keep-alive connections, `per_worker` accepted by each of the two workers, by worker. They
/// are opened one at a time, each answering a request without `x-user-id` (no bucket applies
/// to it) before the next, so the worker connection counts tell which worker took each.
fn keep_alive_connections_on_both_workers(
    envoy: &Envoy,
    per_worker: usize,
) -> [Vec<Connection>; 2] {
    let mut by_worker: [Vec<Connection>; 2] = Default::default();
    // The kernel hands each connection to either worker with about even odds: 20 tries per
    // connection wanted practically never run out.
    for _ in 0..per_worker * 2 * 20 {
        if by_worker.iter().all(|c| c.len() >= per_worker) {
            return by_worker;
        }
        let before = connections_per_worker(envoy);
        let mut connection = envoy.connect();
        let r = connection
            .send("GET", "/", &[])
            .unwrap_or_else(|e| panic!("a request without x-user-id: {e}"));
        assert_eq!(r.status, 200, "{r:?}");
        let after = connections_per_worker(envoy);
        let took: Vec<usize> = (0..after.len())
            .filter(|&w| after[w] > before.get(w).copied().unwrap_or(0))
            .collect();
        match took[..] {
            [w] if w < 2 => {
                if by_worker[w].len() < per_worker {
                    by_worker[w].push(connection);
                }
            }
            _ => panic!("not one worker accepted the connection: {before:?} -> {after:?}"),
        }
    }
    let counts = by_worker.map(|c| c.len());
    panic!("the workers did not both get {per_worker} connections: {counts:?}");
}

/// One client's keep-alive load: the statuses in order and when it sent and was answered.
struct Load {
    worker: usize,
    statuses: Vec<u16>,
    /// Just before the first request was sent.
    began: Instant,
    first_answered: Instant,
    last_sent: Instant,
    last_answered: Instant,
}

impl Load {
    fn count(&self, status: u16) -> usize {
        self.statuses.iter().filter(|&&s| s == status).count()
    }
}

#[test]
fn leases_keep_a_saturated_key_within_burst_plus_rate_through_both_workers() {
    const BURST: f64 = 20.0;
    const RATE: f64 = 20.0; // tokens per second
    const LEASE: f64 = 5.0;
    const CLIENTS_PER_WORKER: usize = 3;
    const LOAD_FOR: Duration = Duration::from_secs(3);
    // Bounds the run if requests are faster than expected; a few thousand are sent per client.
    const MAX_REQUESTS_EACH: usize = 20_000;
    let envoy = Envoy::start(
        r#"{"policies": [{"name": "per-user", "key": ["header:x-user-id"], "requests": 20, "per": "1s", "burst": 20, "lease": 5}]}"#,
    );
    let connections = keep_alive_connections_on_both_workers(&envoy, CLIENTS_PER_WORKER);
    let start = Barrier::new(2 * CLIENTS_PER_WORKER);

    // Every client sends its next request as soon as the last is answered, all on one key:
    // both workers see the key far more often than a token refills (every 50 ms).
    let loads: Vec<Load> = std::thread::scope(|s| {
        let clients: Vec<_> = connections
            .into_iter()
            .enumerate()
            .flat_map(|(worker, conns)| conns.into_iter().map(move |c| (worker, c)))
            .map(|(worker, mut connection)| {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    let began = Instant::now();
                    let mut statuses = Vec::new();
                    let (mut first_answered, mut last_sent, mut last_answered) =
                        (None, began, began);
                    while began.elapsed() < LOAD_FOR && statuses.len() < MAX_REQUESTS_EACH {
                        let sent = Instant::now();
                        let r = connection
                            .send("GET", "/api/x", &user("hot"))
                            .unwrap_or_else(|e| panic!("worker {worker}: {e}"));
                        let answered = Instant::now();
                        first_answered.get_or_insert(answered);
                        (last_sent, last_answered) = (sent, answered);
                        statuses.push(r.status);
                    }
                    Load {
                        worker,
                        statuses,
                        began,
                        first_answered: first_answered.unwrap_or(began),
                        last_sent,
                        last_answered,
                    }
                })
            })
            .collect();
        clients
            .into_iter()
            .map(|c| c.join().expect("client thread"))
            .collect()
    });

    let sent: usize = loads.iter().map(|l| l.statuses.len()).sum();
    let admitted: usize = loads.iter().map(|l| l.count(200)).sum();
    let denied: usize = loads.iter().map(|l| l.count(429)).sum();
    let mut others: Vec<u16> = loads
        .iter()
        .flat_map(|l| l.statuses.iter().copied())
        .filter(|s| ![200, 429].contains(s))
        .collect();
    others.sort_unstable();
    others.dedup();
    assert_eq!(others, [] as [u16; 0], "statuses other than 200 and 429");
    let admitted_by_worker: Vec<usize> = (0..2)
        .map(|w| {
            loads
                .iter()
                .filter(|l| l.worker == w)
                .map(|l| l.count(200))
                .sum()
        })
        .collect();

    // Every request reached the filter between the first send and the last answer: no run
    // of the bucket can admit more than its burst plus the refill over that span.
    let outer = loads
        .iter()
        .map(|l| l.last_answered)
        .max()
        .expect("clients")
        - loads.iter().map(|l| l.began).min().expect("clients");
    let most = BURST + RATE * outer.as_secs_f64();
    // The bucket was full when the first request reached it (before the first answer), and
    // until the first client stopped, every client kept asking: each token that refilled by
    // then went to a request, except what the workers still hold at the end (at most lease -
    // cost each, never spent) and the one token still refilling when the run ended.
    let inner = loads
        .iter()
        .map(|l| l.last_sent)
        .min()
        .expect("clients")
        .saturating_duration_since(
            loads
                .iter()
                .map(|l| l.first_answered)
                .min()
                .expect("clients"),
        );
    let ideal = BURST + RATE * inner.as_secs_f64();
    let least = ideal - 2.0 * (LEASE - 1.0) - 1.0;
    eprintln!(
        "lease 5 of 20/s: {sent} requests, {admitted} admitted (by worker {admitted_by_worker:?}), \
         {denied} denied; at most {most:.2} over {outer:?}, ideal {ideal:.2} over {inner:?}, \
         at least {least:.2}"
    );
    assert!(
        (admitted as f64) <= most,
        "{admitted} admitted, more than burst + rate * {outer:?} = {most:.2}"
    );
    assert!(
        (admitted as f64) >= least,
        "{admitted} admitted, fewer than {least:.2} ({ideal:.2} over {inner:?}, less what \
         the two workers may hold)"
    );
    assert!(
        admitted_by_worker.iter().all(|&n| n > 0),
        "a worker admitted nothing: {admitted_by_worker:?}"
    );
    let (admitted, denied) = (admitted as u64, denied as u64);
    assert_eq!(
        envoy.wait_for_wasm_counter(&requests_counter("per-user", Allowed), admitted),
        admitted
    );
    assert_eq!(
        envoy.wait_for_wasm_counter(&requests_counter("per-user", Denied), denied),
        denied
    );
}

#[test]
fn with_a_lease_the_remaining_header_counts_down_by_one_on_one_connection() {
    let envoy = Envoy::start(
        r#"{"policies": [{"name": "per-user", "key": ["header:x-user-id"], "requests": 1, "per": "1h", "burst": 50, "lease": 10}]}"#,
    );
    // One connection: one worker. The first request leases 10 tokens and spends one: 40 left
    // in the bucket and 9 held, reported as 49. Each request spends one held token; every
    // tenth takes the next lease (hands back what is left, takes 10), so the sum still goes
    // down by one. The 51st finds the bucket empty.
    let mut connection = envoy.connect();
    let responses: Vec<Response> = (0..52)
        .map(|i| {
            connection
                .send("GET", "/api/x", &user("alice"))
                .unwrap_or_else(|e| panic!("request {i}: {e}"))
        })
        .collect();

    let codes: Vec<u16> = responses.iter().map(|r| r.status).collect();
    assert_eq!(codes, [vec![200; 50], vec![429; 2]].concat());
    let remaining: Vec<&str> = responses
        .iter()
        .map(|r| r.header("x-ratelimit-remaining").unwrap_or("none"))
        .collect();
    let expected: Vec<String> = (0..50)
        .rev()
        .chain([0, 0])
        .map(|n: u32| n.to_string())
        .collect();
    assert_eq!(remaining, expected);
    assert_eq!(
        envoy.wait_for_wasm_counter(&requests_counter("per-user", Allowed), 50),
        50
    );
}

// --- Refused configurations.

#[test]
fn bad_configurations_keep_envoy_from_starting_and_the_log_names_the_field() {
    let policy = |extra: &str| {
        format!(r#"{{"name": "p", "key": ["ip"], "requests": 1, "per": "1s"{extra}}}"#)
    };
    let cases = [
        (
            "an unknown field",
            format!(r#"{{"policies": [{}]}}"#, policy(r#", "brust": 5"#)),
            "policies[0].brust",
        ),
        (
            "a duplicate name",
            format!(r#"{{"policies": [{}, {}]}}"#, policy(""), policy("")),
            "policies[1].name",
        ),
        (
            "a bad duration",
            r#"{"policies": [{"name": "p", "key": ["ip"], "requests": 1, "per": "1 minute"}]}"#
                .to_string(),
            "policies[0].per",
        ),
        (
            "zero requests",
            r#"{"policies": [{"name": "p", "key": ["ip"], "requests": 0, "per": "1s"}]}"#
                .to_string(),
            "policies[0].requests",
        ),
    ];

    // Each Envoy exits within a second; start them side by side.
    std::thread::scope(|s| {
        let starts: Vec<_> = cases
            .iter()
            .map(|(why, json, field)| (why, field, s.spawn(|| Envoy::try_start(json))))
            .collect();
        for (why, field, start) in starts {
            let log = match start.join().expect("starting Envoy") {
                Ok(_) => panic!("Envoy started with {why}"),
                Err(log) => log,
            };
            assert!(
                log.contains(&format!("invalid configuration: {field}: ")),
                "{why}: the log does not name {field}:\n{log}"
            );
            assert!(
                log.contains("[harness] Envoy exited"),
                "{why}: Envoy did not exit:\n{log}"
            );
        }
    });
}

#[test]
fn a_lease_on_a_local_fixed_window_policy_keeps_envoy_from_starting() {
    // Only a token bucket can lend tokens to a worker and take them back.
    let json = r#"{"policies": [{"name": "p", "key": ["ip"], "algorithm": "fixed_window",
        "requests": 10, "per": "1s", "lease": 5}]}"#;

    let log = match Envoy::try_start(json) {
        Ok(_) => panic!("Envoy started with a lease on a fixed window"),
        Err(log) => log,
    };

    assert!(
        log.contains(
            "invalid configuration: policies[0].lease: does not apply to the fixed_window algorithm"
        ),
        "the log does not name policies[0].lease:\n{log}"
    );
    assert!(
        log.contains("[harness] Envoy exited"),
        "Envoy did not exit:\n{log}"
    );
}

// --- The shipped bootstraps.

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Files in `envoy/` that are Envoy bootstraps (they have `static_resources`).
fn shipped_bootstraps() -> Vec<PathBuf> {
    let dir = repo_root().join("envoy");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            let is_config = path
                .extension()
                .is_some_and(|ext| ["yaml", "yml", "json"].contains(&ext.to_str().unwrap_or("")));
            is_config
                && std::fs::read_to_string(path).is_ok_and(|text| text.contains("static_resources"))
        })
        .collect();
    files.sort();
    files
}

fn validate(bootstrap: &Path) -> Result<(), String> {
    // From the repo root: the demo names the wasm by a path relative to it.
    let out = Command::new(envoy_binary())
        .current_dir(repo_root())
        .args(["--mode", "validate", "-l", "warn", "-c"])
        .arg(bootstrap)
        .output()
        .map_err(|e| format!("running {}: {e}", envoy_binary().display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} ({}):\n{}{}",
            bootstrap.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[test]
fn every_shipped_envoy_bootstrap_passes_envoy_validate() {
    let bootstraps = shipped_bootstraps();
    assert!(
        bootstraps.iter().any(|p| p.ends_with("envoy/demo.yaml")),
        "envoy/demo.yaml is not among the bootstraps found: {bootstraps:?}"
    );

    let failures: Vec<String> = bootstraps
        .iter()
        .filter_map(|b| validate(b).err())
        .collect();

    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
