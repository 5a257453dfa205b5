//! An RLS call of several descriptors is one round trip to Redis, and one script call: no Redis
//! work per descriptor beyond its own state (issue 37). Counted by Redis itself
//! (`INFO commandstats`).
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;
#[path = "rls/client.rs"]
mod rls;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use rls::{ask, codes, connect, request, Rls};
use sluice_testkit::redis::RedisServer;

const LIMITS: &str = "domain: d
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: route
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 9}
";

/// `calls=<n>` of one command in `INFO commandstats`, 0 if it was never called.
fn calls(stats: &str, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:calls=");
    (stats.lines())
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_of_three_descriptors_is_one_script_call_that_reads_and_writes_each_key_once() {
    let redis = RedisServer::start();
    let rls = Rls::start(&["--redis", &redis.url()], LIMITS, &[]);
    let mut client = connect(&rls).await;
    let call = request(
        "d",
        &[&[("user", "ann")], &[("route", "/a")], &[("tenant", "t1")]],
        1,
    );
    // The first call loads nothing more: the scripts were loaded when Redis first answered.
    ask(&mut client, call.clone()).await;
    let mut admin = redis.client();
    assert_eq!(admin.cmd(&["CONFIG", "RESETSTAT"]).text(), "OK");
    let answers = [
        ask(&mut client, call.clone()).await,
        ask(&mut client, call).await,
    ];
    assert_eq!(codes(&answers[0]), [Code::Ok, Code::Ok, Code::Ok]);
    assert_eq!(codes(&answers[1]), [Code::OverLimit, Code::Ok, Code::Ok]);
    let stats = admin.cmd(&["INFO", "commandstats"]).text();
    // Two calls: two EVALSHAs, each with one TIME, one MGET of the three keys, and a SET of each
    // key it changed (the refused user is charged too: envoyproxy/ratelimit charges every hit).
    assert_eq!(calls(&stats, "evalsha"), 2, "{stats}");
    assert_eq!(calls(&stats, "time"), 2, "{stats}");
    assert_eq!(calls(&stats, "mget"), 2, "{stats}");
    assert_eq!(calls(&stats, "get"), 0, "{stats}");
    assert_eq!(calls(&stats, "set"), 6, "{stats}");
}
