//! The filter in a real Envoy: the reference behaviour, end to end.

use sluice::limiter::PolicyOutcome::{Allowed, Denied};
use sluice::output::metrics::requests_counter;
use sluice_testkit::envoy::{Envoy, EnvoyOptions};

const ONE_PER_SECOND_BURST_5: &str = r#"{
  "policies": [
    {"name": "per-user", "key": ["header:x-user-id"], "requests": 1, "per": "1s", "burst": 5}
  ]
}"#;

#[test]
fn eight_rapid_requests_with_burst_5_give_five_200s_then_three_429s() {
    let envoy = Envoy::start(ONE_PER_SECOND_BURST_5);

    let statuses: Vec<u16> = (0..8)
        .map(|_| envoy.get("/api/hello", &[("x-user-id", b"alice")]).status)
        .collect();

    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429]);
}

#[test]
fn allowed_and_denied_requests_are_counted_per_policy() {
    let envoy = Envoy::start(ONE_PER_SECOND_BURST_5);

    for _ in 0..8 {
        envoy.get("/api/hello", &[("x-user-id", b"alice")]);
    }

    assert_eq!(
        envoy.wait_for_wasm_counter(&requests_counter("per-user", Allowed), 5),
        5
    );
    assert_eq!(
        envoy.wait_for_wasm_counter(&requests_counter("per-user", Denied), 3),
        3
    );
}

#[test]
fn a_refused_configuration_keeps_envoy_from_starting() {
    let bad = r#"{"policies": [{"name": "p", "key": ["ip"], "requests": 1, "per": "1s", "burst": 2, "cost": 3}]}"#;

    let log = match Envoy::try_start(bad) {
        Ok(_) => panic!("Envoy started with burst < cost"),
        Err(log) => log,
    };

    assert!(
        log.contains("sluice: invalid configuration: policies[0].burst"),
        "no configuration error in the log:\n{log}"
    );
}

/// Checks the harness itself, so it needs no filter.
#[test]
fn harness_talks_to_envoy_without_the_filter() {
    let envoy = EnvoyOptions::without_filter()
        .xff_num_trusted_hops(1)
        .start();

    let api = envoy.get("/api/x?q=1", &[("x-odd", b"\xff\xfe raw bytes")]);
    let root = envoy.get("/", &[]);

    assert_eq!((api.status, api.text().as_str()), (200, "ok"));
    assert_eq!((root.status, root.text().as_str()), (200, "ok"));
    let stats = envoy.admin_stats(r"^http\.test\.downstream_rq_2xx$");
    assert_eq!(stats.get("http.test.downstream_rq_2xx"), Some(&2));
    assert!(envoy.log().contains("starting main dispatch loop"));
}
