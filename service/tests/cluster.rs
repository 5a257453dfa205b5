//! Redis Cluster: three real primaries made into a cluster by `redis-cli --cluster create`,
//! and the service started with --redis-cluster.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::clock::{redis_time_us, window_around};
use common::post_check;
use common::{bucket, checks_body, leaky, window};
use serde_json::Value;
use sluice_testkit::http::{get, send_with};
use sluice_testkit::redis::RedisCluster;
use sluice_testkit::service::Service;

const MINUTE_MS: u64 = 60_000;

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("per-user/{i:016x}")).collect()
}

/// Sends one request per chunk of up to 16 keys (so one request spans many slots and nodes)
/// and counts the allowed checks per key.
fn round(service: &Service, keys: &[String], burst: u64, allowed: &mut BTreeMap<String, u64>) {
    round_of(service, keys, allowed, |_, key| {
        bucket(key, 1, MINUTE_MS, burst, 1, 1)
    });
}

/// As `round`, with the check of the i-th key made by `check(i, key)`.
fn round_of(
    service: &Service,
    keys: &[String],
    allowed: &mut BTreeMap<String, u64>,
    check: impl Fn(usize, &str) -> Value,
) {
    for (n, chunk) in keys.chunks(16).enumerate() {
        let checks: Vec<Value> = (chunk.iter().enumerate())
            .map(|(i, key)| check(n * 16 + i, key))
            .collect();
        let response = post_check(service.addr, &checks_body(&checks));
        assert_eq!(response.status, 200, "{response:?}");
        let results = response.json()["results"].as_array().unwrap().clone();
        assert_eq!(results.len(), chunk.len());
        for (key, result) in chunk.iter().zip(results) {
            *allowed.entry(key.clone()).or_default() += u64::from(result["allowed"] == true);
        }
    }
}

#[test]
fn cluster_checks_are_exact_for_keys_in_different_slots() {
    let cluster = RedisCluster::start();
    let service = Service::start_cluster(&cluster.urls());
    let redis = &service.listening["store"];
    assert_eq!(*redis, format!("cluster {}", cluster.urls()));
    assert_eq!(get(service.addr, "/healthz").status, 200);
    let keys = keys(20);
    let mut allowed = BTreeMap::new();
    for _ in 0..5 {
        round(&service, &keys, 3, &mut allowed);
    }
    assert!(
        allowed.values().all(|&n| n == 3),
        "allowed per key: {allowed:?}"
    );
    assert_eq!(allowed.len(), 20);
    // The keys really are spread: every primary holds some.
    for node in &cluster.nodes {
        let held = node.client().cmd(&["DBSIZE"]).int();
        assert!(held > 0, "node {} holds no bucket", node.port);
    }
}

#[test]
fn cluster_checks_survive_a_script_flush_on_every_node() {
    let cluster = RedisCluster::start();
    let service = Service::start_cluster(&cluster.urls());
    let now = redis_time_us(&mut cluster.nodes[0].client());
    let per_ms = window_around(now, 120_000..240_000, 30_000);
    let keys = keys(20);
    let mut allowed = BTreeMap::new();
    round_of(&service, &keys, &mut allowed, every_algorithm(per_ms));
    for node in &cluster.nodes {
        assert_eq!(node.client().cmd(&["SCRIPT", "FLUSH"]).text(), "OK");
    }
    for _ in 0..3 {
        round_of(&service, &keys, &mut allowed, every_algorithm(per_ms));
    }
    assert!(
        allowed.values().all(|&n| n == 3),
        "allowed per key: {allowed:?}"
    );
}

/// Key i's check: each algorithm in turn, every one of them letting exactly 3 through in a few
/// seconds (windows chosen so that none starts or ends during the test; the leaky bucket queues
/// 3 at one a minute, held at most two minutes).
fn every_algorithm(per_ms: u64) -> impl Fn(usize, &str) -> Value {
    move |i, key| match i % 5 {
        0 => bucket(key, 1, MINUTE_MS, 3, 1, 1),
        1 => window("fixed_window", key, 3, per_ms, 1, 1),
        2 => window("sliding_window", key, 3, per_ms, 1, 1),
        3 => window("sliding_log", key, 3, per_ms, 1, 1),
        _ => leaky(key, 1, MINUTE_MS, 2 * MINUTE_MS, 1),
    }
}

#[test]
fn cluster_checks_of_every_algorithm_are_exact_for_keys_in_different_slots() {
    let cluster = RedisCluster::start();
    let service = Service::start_cluster(&cluster.urls());
    let now = redis_time_us(&mut cluster.nodes[0].client());
    let per_ms = window_around(now, 120_000..240_000, 30_000);
    let keys = keys(40);
    let mut allowed = BTreeMap::new();
    for _ in 0..5 {
        round_of(&service, &keys, &mut allowed, every_algorithm(per_ms));
    }
    assert!(
        allowed.values().all(|&n| n == 3),
        "allowed per key: {allowed:?}"
    );
    assert_eq!(allowed.len(), 40);
    // Every primary holds keys, and of each kind: strings and sorted sets (the sliding logs).
    let mut logs = 0;
    for node in &cluster.nodes {
        let mut client = node.client();
        assert!(
            client.cmd(&["DBSIZE"]).int() > 0,
            "node {} holds no key",
            node.port
        );
        let sluice_testkit::resp::Reply::Array(zsets) =
            client.cmd(&["SCAN", "0", "COUNT", "1000", "TYPE", "zset"])
        else {
            panic!("SCAN")
        };
        let sluice_testkit::resp::Reply::Array(found) = &zsets[1] else {
            panic!("SCAN")
        };
        logs += found.len();
    }
    assert_eq!(logs, 8, "one sorted set per sliding-log key");
}

#[test]
fn a_service_started_while_the_cluster_is_frozen_becomes_ready_once_it_answers() {
    let cluster = RedisCluster::start();
    for node in &cluster.nodes {
        node.freeze();
    }
    let service = Service::spawn(&["--redis-cluster", &cluster.urls()], &[]);
    assert_eq!(get(service.addr, "/healthz").status, 200);
    assert_eq!(get(service.addr, "/readyz").status, 503);
    let one = checks_body(&[bucket("frozen/1", 1, MINUTE_MS, 3, 1, 1)]);
    let started = Instant::now();
    assert_eq!(post_check(service.addr, &one).status, 503);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
    for node in &cluster.nodes {
        node.thaw();
    }
    let ready = sluice_testkit::wait_for(Duration::from_secs(5), || {
        (get(service.addr, "/readyz").status == 200).then_some(())
    });
    assert!(ready.is_some(), "not ready 5 s after the cluster answered");
    let response = post_check(service.addr, &one);
    assert_eq!(response.status, 200, "{response:?}");
    assert_eq!(response.json()["results"][0]["remaining"], 2);
}

/// A concurrency check of key `streams/<key>` with N = 1, for the slot named `slot`.
fn slot(key: &str, slot: &str) -> Value {
    serde_json::json!({"key": key, "algorithm": "concurrency", "requests": 1, "per_ms": 10_000,
        "burst": 1, "cost": 1, "take": 1, "slot": slot})
}

#[test]
fn cluster_settlements_of_many_slots_are_applied_in_order() {
    let cluster = RedisCluster::start();
    let service = Service::start_cluster(&cluster.urls());
    let keys: Vec<String> = (0..32).map(|i| format!("streams/{i:016x}")).collect();
    let (mine, other) = ("00000000000000a1", "00000000000000a2");
    for chunk in keys.chunks(16) {
        let checks: Vec<Value> = chunk.iter().map(|key| slot(key, mine)).collect();
        assert!(service.check(&checks).iter().all(|r| r["allowed"] == true));
    }
    // Each key renewed, then released, in one batch across every node: in that order, each
    // key's slot is free afterwards.
    let settlements: Vec<Value> = (keys.iter())
        .flat_map(|key| {
            let check = slot(key, mine);
            ["renew", "release"].map(|op| {
                serde_json::json!({"key": key, "algorithm": "concurrency", "requests": 1,
                    "per_ms": check["per_ms"], "burst": 1, "op": op, "slot": mine})
            })
        })
        .collect();
    let body = serde_json::json!({ "settlements": settlements }).to_string();
    let response = sluice_testkit::http::post_json(service.addr, "/v1/settle", &body);
    assert_eq!(response.status, 200, "{response:?}");
    assert_eq!(response.json()["settled"], 64);
    for chunk in keys.chunks(16) {
        let checks: Vec<Value> = chunk.iter().map(|key| slot(key, other)).collect();
        assert!(service.check(&checks).iter().all(|r| r["allowed"] == true));
    }
}

#[test]
fn cluster_charges_sent_again_with_their_ids_are_charged_once() {
    let cluster = RedisCluster::start();
    let service = Service::start_cluster(&cluster.urls());
    // Keys in slots on every node: each charge's id is remembered in its key's slot.
    let charges: Vec<Value> = (keys(32).iter().enumerate())
        .map(|(i, key)| {
            serde_json::json!({"key": key, "algorithm": "token_bucket", "requests": 10,
                "per_ms": 10 * MINUTE_MS, "burst": 10, "op": "charge", "tokens": 4,
                "max_debt": 0, "id": format!("{i:016x}")})
        })
        .collect();
    let body = serde_json::json!({ "settlements": charges }).to_string();
    for expected in [32, 0] {
        let response = sluice_testkit::http::post_json(service.addr, "/v1/settle", &body);
        assert_eq!(response.status, 200, "{response:?}");
        assert_eq!(response.json()["settled"], expected);
    }
    for chunk in keys(32).chunks(16) {
        let checks: Vec<Value> = (chunk.iter())
            .map(|key| bucket(key, 10, 10 * MINUTE_MS, 10, 1, 0))
            .collect();
        for result in service.check(&checks) {
            assert_eq!(result["remaining"], 6, "charged once: {result}");
        }
    }
}

/// The overrides' hash lives on one node, which the paged read (`HSCAN`) is routed to: an
/// override set through one replica is listed and applied by another.
#[test]
fn cluster_overrides_are_read_by_every_replica() {
    let cluster = RedisCluster::start();
    let dir = sluice_testkit::TempDir::new("cluster-overrides");
    let tokens = dir.path().join("admin");
    std::fs::write(&tokens, "oncall s3cret\n").unwrap();
    let args = [
        "--redis-cluster",
        &cluster.urls(),
        "--admin-token-file",
        tokens.to_str().unwrap(),
    ];
    let a = Service::start_with(&args, &[]);
    let body = serde_json::json!({"key": "per-user/00000000000000aa", "requests": 1,
        "per_ms": MINUTE_MS, "burst": 7, "owner": "accounts", "reason": "premium plan"});
    let headers: &[(&str, &[u8])] = &[
        ("authorization", b"Bearer s3cret"),
        ("content-type", b"application/json"),
    ];
    let set = send_with(
        a.addr,
        "POST",
        "/admin/v1/overrides",
        headers,
        body.to_string().as_bytes(),
    );
    assert_eq!(set.status, 200, "{set:?}");
    let b = Service::start_with(&args, &[]);
    let key = "per-user/00000000000000aa".to_string();
    let mut allowed = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while allowed.get(&key).copied().unwrap_or(0) < 7 {
        assert!(
            Instant::now() < deadline,
            "the override did not apply: {allowed:?}"
        );
        round(&b, std::slice::from_ref(&key), 3, &mut allowed);
    }
    round(&b, std::slice::from_ref(&key), 3, &mut allowed);
    assert_eq!(allowed[&key], 7, "the override's burst, not the check's 3");
}
