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

use common::http::{get, post_check};
use common::redis::RedisCluster;
use common::service::Service;
use common::{bucket, checks_body};
use serde_json::Value;

const MINUTE_MS: u64 = 60_000;

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("per-user/{i:016x}")).collect()
}

/// Sends one request per chunk of up to 16 keys (so one request spans many slots and nodes)
/// and counts the allowed checks per key.
fn round(service: &Service, keys: &[String], burst: u64, allowed: &mut BTreeMap<String, u64>) {
    for chunk in keys.chunks(16) {
        let checks: Vec<Value> = chunk
            .iter()
            .map(|key| bucket(key, 1, MINUTE_MS, burst, 1, 1))
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
    assert!(
        service
            .ready_line
            .contains(&format!("redis cluster {}", cluster.urls())),
        "{}",
        service.ready_line
    );
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
    let keys = keys(16);
    let mut allowed = BTreeMap::new();
    round(&service, &keys, 2, &mut allowed);
    for node in &cluster.nodes {
        assert_eq!(node.client().cmd(&["SCRIPT", "FLUSH"]).text(), "OK");
    }
    round(&service, &keys, 2, &mut allowed);
    round(&service, &keys, 2, &mut allowed);
    assert!(
        allowed.values().all(|&n| n == 2),
        "allowed per key: {allowed:?}"
    );
}
