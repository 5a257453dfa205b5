//! Per-route scope in a real Envoy with several named routes: a policy's `match.routes`, a
//! route's own `filter_metadata.sluice` (read with `route_metadata`), and Envoy's
//! `typed_per_filter_config` switching the filter off on a route.

// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::panic, clippy::indexing_slicing, clippy::unwrap_used)]

use sluice::limiter::PolicyOutcome::Allowed;
use sluice::output::metrics::requests_counter;
use sluice_testkit::envoy::{Envoy, EnvoyOptions};
use sluice_testkit::http::Response;

fn user(id: &str) -> [(&str, &[u8]); 1] {
    [("x-user-id", id.as_bytes())]
}

/// Status and the policy each response reports or names: `200 per-ip`, `429 per-user`, `200 -`.
fn seen(envoy: &Envoy, path: &str, id: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| {
            let r = envoy.get(path, &user(id));
            format!("{} {}", r.status, policy_of(&r))
        })
        .collect()
}

/// The policy a response's draft headers report, or `-` when it has none.
fn policy_of(r: &Response) -> String {
    let header = r.header("ratelimit").unwrap_or("\"-\"");
    header.split('"').nth(1).unwrap_or("?").to_string()
}

fn strings(expected: &[&str]) -> Vec<String> {
    expected.iter().map(|s| s.to_string()).collect()
}

/// per-user (burst 2) on the routes named `checkout` and `search`; per-ip (burst 20) everywhere.
const ON_ROUTES: &str = r#"{"headers": "draft", "policies": [
  {"name": "per-user", "match": {"routes": ["checkout", "search"]}, "key": ["header:x-user-id"],
   "requests": 1, "per": "1h", "burst": 2},
  {"name": "per-ip", "key": ["ip"], "requests": 1, "per": "1h", "burst": 20}
]}"#;

#[test]
fn a_policy_applies_only_on_the_routes_it_names() {
    let envoy = EnvoyOptions::new(ON_ROUTES)
        .route("checkout", "/checkout/", &[])
        .route("search", "/search/", &[])
        .start();

    let checkout = seen(&envoy, "/checkout/cart", "alice", 3);
    let search = seen(&envoy, "/search/q", "alice", 1);
    let api = seen(&envoy, "/api/x", "alice", 1);

    assert_eq!(
        checkout,
        strings(&["200 per-user", "200 per-user", "429 per-user"])
    );
    assert_eq!(
        search,
        strings(&["429 per-user"]),
        "one policy, one bucket, two routes"
    );
    assert_eq!(
        api,
        strings(&["200 per-ip"]),
        "per-user does not apply on api"
    );
}

/// per-user (burst 2) and per-ip (burst 3) everywhere, unless a route says otherwise.
const EVERYWHERE: &str = r#"{"headers": "draft", "route_metadata": true, "policies": [
  {"name": "per-user", "key": ["header:x-user-id"], "requests": 1, "per": "1h", "burst": 2},
  {"name": "per-ip", "key": ["ip"], "requests": 1, "per": "1h", "burst": 3}
]}"#;

fn with_metadata(config: &str) -> EnvoyOptions {
    EnvoyOptions::new(config)
        .route(
            "search",
            "/search/",
            &["metadata: { filter_metadata: { sluice: { policies: [per-user] } } }"],
        )
        .route(
            "health",
            "/health/",
            &["metadata: { filter_metadata: { sluice: { disabled: true } } }"],
        )
        .route(
            "typo",
            "/typo/",
            &["metadata: { filter_metadata: { sluice: { policies: [per-usr] } } }"],
        )
}

#[test]
fn a_route_narrows_the_policies_or_turns_sluice_off_through_its_metadata() {
    let envoy = with_metadata(EVERYWHERE).start();

    let health = seen(&envoy, "/health/live", "alice", 5);
    let search = seen(&envoy, "/search/q", "bob", 3);
    let api = seen(&envoy, "/api/x", "carol", 1);
    let erin = envoy.get("/api/x", &user("erin"));
    let typo = seen(&envoy, "/typo/x", "dave", 3);

    assert_eq!(health, strings(&["200 -"; 5]), "sluice is off on health");
    assert_eq!(
        search,
        strings(&["200 per-user", "200 per-user", "429 per-user"]),
        "only per-user on search: per-ip was not charged"
    );
    // per-ip has given two tokens, carol's and erin's: the search requests took none.
    assert_eq!(
        api,
        strings(&["200 per-user"]),
        "carol's own bucket is the tightest"
    );
    assert_eq!(erin.header("ratelimit"), Some(r#""per-ip";r=1;t=7200"#));
    // An entry naming no policy is ignored whole: both apply, and the log says why.
    assert_eq!(typo, strings(&["200 per-ip", "429 per-ip", "429 per-ip"]));
    assert!(
        envoy.log().contains("names a policy that does not exist"),
        "{}",
        envoy.log()
    );
}

#[test]
fn without_route_metadata_no_route_is_read() {
    let envoy = with_metadata(&EVERYWHERE.replace(r#""route_metadata": true, "#, "")).start();

    let health = seen(&envoy, "/health/live", "alice", 3);

    assert_eq!(
        health,
        strings(&["200 per-user", "200 per-user", "429 per-user"])
    );
}

#[test]
fn envoys_typed_per_filter_config_switches_the_filter_off_on_a_route() {
    let envoy = EnvoyOptions::new(EVERYWHERE)
        .route(
            "static",
            "/static/",
            &[r#"typed_per_filter_config: { envoy.filters.http.wasm: { "@type": type.googleapis.com/envoy.config.route.v3.FilterConfig, disabled: true } }"#],
        )
        .start();

    let assets = seen(&envoy, "/static/app.js", "alice", 5);
    let api = seen(&envoy, "/api/x", "alice", 3);

    assert_eq!(assets, strings(&["200 -"; 5]), "the filter never ran");
    assert_eq!(
        api,
        strings(&["200 per-user", "200 per-user", "429 per-user"])
    );
    assert_eq!(
        envoy.wait_for_wasm_counter(&requests_counter("per-user", Allowed), 2),
        2
    );
}
