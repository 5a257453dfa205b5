//! The filter as a client of Envoy's Rate Limit Service protocol (`"global": {"protocol": "rls"}`)
//! through a real Envoy (`--concurrency 2`): against an independent RLS written for the tests
//! (`testkit/python/rls_peer.py`, a fixed window per descriptor as envoyproxy/ratelimit's
//! examples have it, its protobuf read and written apart from sluice's), and against
//! `sluice-service --rls` over a real Redis. What each sees of a request: one descriptor per
//! global policy, `generic_key` the policy's name, then its key parts, `hits_addend` its cost.

// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use serde_json::{json, Value};
use sluice_testkit::envoy::Envoy;
use sluice_testkit::grpc::RlsPeer;
use sluice_testkit::http::Response;
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::Rls;

/// A global policy per `x-user-id` asking the RLS of cluster `rls` about domain `edge`: 3 a
/// minute, as the RLS's own limits say (the policy's numbers are its headers' and, failing
/// open, its emergency budget's).
fn config(policy: Value) -> String {
    let mut per_user = json!({"name": "per-user", "scope": "global", "key": ["header:x-user-id"],
        "requests": 3, "per": "1m"});
    for (field, value) in policy.as_object().unwrap() {
        per_user[field] = value.clone();
    }
    json!({"headers": "both",
        "global": {"protocol": "rls", "cluster": "rls", "domain": "edge", "timeout": "500ms"},
        "policies": [per_user]})
    .to_string()
}

fn get(envoy: &Envoy, user: &str) -> Response {
    envoy.get("/api/x", &[("x-user-id", user.as_bytes())])
}

fn statuses(envoy: &Envoy, user: &str, n: usize) -> Vec<u16> {
    (0..n).map(|_| get(envoy, user).status).collect()
}

#[test]
fn an_independent_rls_decides_each_request_and_its_over_limit_answer_becomes_the_429() {
    let rls = RlsPeer::start(3, "minute", "ok");
    let envoy = Envoy::options(&config(json!({"cost": 1})))
        .rls(rls.addr())
        .start();
    let allowed: Vec<Response> = (0..3).map(|_| get(&envoy, "alice")).collect();
    let remaining: Vec<&str> = allowed
        .iter()
        .map(|r| r.header("x-ratelimit-remaining").unwrap_or("?"))
        .collect();
    assert_eq!(
        (
            allowed.iter().map(|r| r.status).collect::<Vec<_>>(),
            remaining
        ),
        (vec![200; 3], vec!["2", "1", "0"]),
        "the RLS's limit_remaining"
    );
    let refused = get(&envoy, "alice");
    assert_eq!(refused.status, 429);
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "duration_until_reset: {retry}");
    assert_eq!(refused.json()["policy"], "per-user");
    assert_eq!(get(&envoy, "bob").status, 200, "another descriptor");

    let calls = rls.calls();
    let first = &calls[0];
    assert_eq!(first["domain"], "edge");
    assert_eq!(first["hits_addend"], 1);
    assert_eq!(
        first["descriptors"],
        json!([{"entries": [["generic_key", "per-user"], ["x-user-id", "alice"]], "hits_addend": 1}])
    );
    // Over its limit, alice is refused here until the reset: the RLS is not asked again.
    assert_eq!(calls.len(), 5, "3 allowed, 1 over, bob: {calls:?}");
    assert_eq!(get(&envoy, "alice").status, 429);
    assert!(rls.calls().is_empty(), "the over-limit mark answered");
}

#[test]
fn a_requests_cost_is_its_descriptors_hits_addend() {
    let rls = RlsPeer::start(5, "minute", "ok");
    let envoy = Envoy::options(&config(json!({"cost": 2, "requests": 5})))
        .rls(rls.addr())
        .start();
    assert_eq!(statuses(&envoy, "alice", 3), [200, 200, 429]);
    let hits: Vec<Value> = rls
        .calls()
        .iter()
        .map(|c| c["descriptors"][0]["hits_addend"].clone())
        .collect();
    assert_eq!(hits, [2, 2, 2]);
}

#[test]
fn an_rls_that_fails_or_times_out_leaves_the_decision_to_the_policys_failure_mode() {
    let down = RlsPeer::start(3, "minute", "unavailable");
    let closed = Envoy::options(&config(json!({"failure_mode": "closed"})))
        .rls(down.addr())
        .start();
    let answer = get(&closed, "alice");
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.json()["error"], "rate_limit_unavailable");

    // A cluster Envoy does not have fails the call as a failed call does.
    let nowhere = config(json!({"failure_mode": "closed"}))
        .replace(r#""cluster":"rls""#, r#""cluster":"nowhere""#);
    let lost = Envoy::start(&nowhere);
    assert_eq!(get(&lost, "alice").status, 503);
    assert_eq!(get(&lost, "alice").status, 503, "the VM lives on");

    let slow = RlsPeer::start(3, "minute", "slow");
    let emergency = json!({"failure_mode": "open", "emergency": {"requests": 2, "per": "1h"}});
    let open = Envoy::options(&config(emergency)).rls(slow.addr()).start();
    assert_eq!(
        statuses(&open, "alice", 3),
        [200, 200, 429],
        "the emergency budget, 2 an hour"
    );
}

/// sluice-service's RLS over Redis, with the same limits in envoyproxy/ratelimit's format.
#[test]
fn sluice_service_in_rls_mode_answers_the_filter_as_it_answers_envoys_own_filter() {
    let redis = RedisServer::start();
    let edge = "domain: edge\ndescriptors:\n  - key: generic_key\n    value: per-user\n    descriptors:\n      - key: x-user-id\n        rate_limit: {unit: minute, requests_per_unit: 3}\n";
    let rls = Rls::start(&["--redis", &redis.url()], edge, &[]);
    let envoy = Envoy::options(&config(json!({})))
        .rls(rls.address())
        .start();
    let answers: Vec<Response> = (0..4).map(|_| get(&envoy, "alice")).collect();
    let statuses: Vec<u16> = answers.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
    assert_eq!(answers[2].header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(get(&envoy, "bob").status, 200);
}
