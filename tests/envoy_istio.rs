//! The filter as Istio runs it. Istio delivers wasm filters through extension config discovery
//! (ECDS): the listener names the filter, a discovery resource carries its config, here a
//! watched file (`EnvoyOptions::ecds_from_file`) where Istio uses its xDS stream. What the tests
//! pin (and docs/istio.md explains):
//!
//! - Updates, and updates the filter refuses, behave as through LDS: tests/envoy_reload.rs runs
//!   its scenarios through both (no request fails; a refused one leaves the last serving; a
//!   changed rate keeps what each key spent).
//! - A first configuration that is refused (a new pod) leaves the filter without any: Envoy
//!   goes live and answers every request with 500, whatever the wasm `failure_policy` (Istio's
//!   `failStrategy`). An ECDS `default_config` serves instead, where one is given.
//! - When Istio's agent cannot fetch the module, it sends an allow-all (`FAIL_OPEN`) or a
//!   deny-all (`FAIL_CLOSE`) RBAC filter in its place. The buckets do not outlive the swap:
//!   Envoy drops a vm_id's shared data with its last VM, so they start full when it returns.
//! - At a sidecar (inbound: `use_remote_address` false, no trusted hops) the `ip` key is the last
//!   `x-forwarded-for` address when there is one, which any caller can write, else the TCP peer.

// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use sluice_testkit::envoy::{Envoy, ECDS_FILTER};
use sluice_testkit::http::Response;
use sluice_testkit::reload::{config, statuses, user, wait_for_config, wait_for_responses};

/// What Istio's agent puts in the filter's place when it cannot fetch the module: RBAC with no
/// rules allows everything (`FAIL_OPEN`); RBAC with an empty rule set denies everything.
const ALLOW_ALL: &str = r#"{ "@type": type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC, rules_stat_prefix: wasm-default-allow }"#;
const DENY_ALL: &str = r#"{ "@type": type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC, rules: {}, rules_stat_prefix: wasm-default-deny }"#;

fn ecds_counter(envoy: &Envoy, name: &str) -> u64 {
    let full = format!("extension_config_discovery.http_filter.{ECDS_FILTER}.{name}");
    let stats = envoy.admin_stats(&format!("^{}$", full.replace('.', "\\.")));
    stats.get(&full).copied().unwrap_or(0)
}

fn without_rate_limit_headers(r: &Response) -> bool {
    r.status == 200 && r.header("x-ratelimit-limit").is_none()
}

#[test]
fn a_refused_first_configuration_gives_500s_whatever_the_failure_policy_until_one_is_accepted() {
    for failure_policy in ["FAIL_CLOSED", "FAIL_OPEN"] {
        let mut envoy = Envoy::options(&config("bad", "per-user", 0))
            .ecds_from_file()
            .wasm_failure_policy(failure_policy)
            .start();
        assert!(envoy
            .log()
            .contains("invalid configuration: policies[0].burst"));
        assert_eq!(
            ecds_counter(&envoy, "update_rejected"),
            1,
            "{failure_policy}"
        );
        let r = envoy.get("/api/x", &user("alice"));
        assert_eq!(
            r.status, 500,
            "{failure_policy}: a filter without configuration: {r:?}"
        );

        envoy.update_plugin(&config("good", "per-user", 2)).unwrap();
        wait_for_config(&envoy, "per-user", 2);
        assert_eq!(
            statuses(&envoy, "alice", 3),
            [200, 200, 429],
            "{failure_policy}"
        );
    }
}

#[test]
fn a_default_config_serves_while_the_first_configuration_is_refused() {
    let mut envoy = Envoy::options(&config("bad", "per-user", 0))
        .ecds_from_file()
        .ecds_default(ALLOW_ALL)
        .start();
    assert_eq!(ecds_counter(&envoy, "update_rejected"), 1);
    let r = envoy.get("/api/x", &user("alice"));
    assert!(
        without_rate_limit_headers(&r),
        "the default did not serve: {r:?}"
    );

    envoy.update_plugin(&config("good", "per-user", 2)).unwrap();
    wait_for_config(&envoy, "per-user", 2);
    assert_eq!(statuses(&envoy, "alice", 3), [200, 200, 429]);
}

#[test]
fn istio_fallbacks_for_an_unfetchable_module_deny_or_allow_all_and_the_buckets_start_over_after() {
    let mut envoy = Envoy::options(&config("v1", "per-user", 3))
        .ecds_from_file()
        .start();
    assert_eq!(statuses(&envoy, "alice", 4), [200, 200, 200, 429]);

    envoy.update_extension(DENY_ALL).unwrap();
    wait_for_responses(&envoy, |r| r.status == 403);

    envoy.update_extension(ALLOW_ALL).unwrap();
    wait_for_responses(&envoy, without_rate_limit_headers);
    assert_eq!(
        statuses(&envoy, "alice", 5),
        [200; 5],
        "unlimited while allow-all serves"
    );

    // The module is back, but with its last VM Envoy dropped the vm_id's shared data: alice
    // starts again from a full bucket.
    envoy.update_plugin(&config("v1", "per-user", 3)).unwrap();
    wait_for_config(&envoy, "per-user", 3);
    assert_eq!(statuses(&envoy, "alice", 4), [200, 200, 200, 429]);
}

#[test]
fn at_a_sidecar_ip_is_the_last_x_forwarded_for_address_which_any_caller_can_write() {
    let per_ip = r#"{"policies": [{"name": "per-ip", "key": ["ip"], "requests": 1, "per": "1h", "burst": 1}]}"#;
    // Istio's sidecar inbound connection manager.
    let envoy = Envoy::options(per_ip).use_remote_address(false).start();
    let from = |xff: &'static str| [("x-forwarded-for", xff.as_bytes())];
    let status = |headers: &[(&str, &[u8])]| envoy.get("/", headers).status;

    assert_eq!(
        [status(&from("203.0.113.7")), status(&from("203.0.113.7"))],
        [200, 429]
    );
    assert_eq!(
        status(&from("198.51.100.1, 203.0.113.7")),
        429,
        "the last entry is the client"
    );
    assert_eq!(
        status(&from("203.0.113.8")),
        200,
        "a made-up address is a fresh bucket"
    );
    assert_eq!(
        [status(&[]), status(&[])],
        [200, 429],
        "without the header, the TCP peer"
    );
}
