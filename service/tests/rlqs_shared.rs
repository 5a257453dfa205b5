//! The RLQS's shares live in Redis: two replicas of the service against one redis-server divide
//! one budget between the Envoys whose streams they hold, a replica killed mid-interval loses no
//! Envoy's demand (another replica still counts it), and while Redis is away a replica answers
//! nothing (Envoy keeps its last assignment) and answers again once Redis is back.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "rlqs/client.rs"]
mod rlqs;

use std::time::Duration;

use futures_util::StreamExt;
use rlqs::{bucket, open, per_minute, reports, Rlqs};
use sluice_testkit::redis::RedisServer;
use sluice_testkit::resp::Reply;

const LIMITS: &str = "\
domain: api
descriptors:
  - key: name
    rate_limit: {unit: minute, requests_per_unit: 600}
";
const PORT: [&str; 2] = ["--rlqs", "127.0.0.1:0"];

#[tokio::test]
async fn two_replicas_divide_one_budget_and_a_killed_replica_loses_nothing() {
    let redis = RedisServer::start();
    let url = redis.url();
    let store = ["--redis", url.as_str()];
    let one = Rlqs::start(&store, LIMITS, &PORT, &[]);
    let two = Rlqs::start(&store, LIMITS, &PORT, &[]);
    // Each first report counts over 5 s: 100 requests are 1,200 a minute, 10 are 120.
    let mut heavy = open(one.address(), None).await.unwrap();
    let alone = heavy.report(reports("api", bucket("b"), 90, 10)).await;
    assert_eq!(per_minute(&alone), Some(600), "{alone:?}");
    // Through the other replica, which knows the heavy Envoy only from Redis: the light one's
    // fair share is its 120, but the heavy one holds all until it reports again (a fiftieth
    // at once); once the heavy one has shrunk, the light one gets all it asks, and 5% more
    // (slack for requests that come unevenly).
    let mut light = open(two.address(), None).await.unwrap();
    let answer = light.report(reports("api", bucket("b"), 10, 0)).await;
    assert_eq!(per_minute(&answer), Some(12), "{answer:?}");
    let answer = heavy.report(reports("api", bucket("b"), 100, 0)).await;
    assert_eq!(per_minute(&answer), Some(474), "{answer:?}");
    let answer = light.report(reports("api", bucket("b"), 2, 0)).await;
    assert_eq!(per_minute(&answer), Some(126), "{answer:?}");
    // A second heavy one splits the rest with the first, as the first shrinks.
    let mut second = open(two.address(), None).await.unwrap();
    let answer = second.report(reports("api", bucket("b"), 100, 0)).await;
    assert_eq!(per_minute(&answer), Some(12), "{answer:?}");
    let answer = heavy.report(reports("api", bucket("b"), 100, 0)).await;
    assert_eq!(per_minute(&answer), Some(237), "{answer:?}");
    let answer = second.report(reports("api", bucket("b"), 100, 0)).await;
    assert_eq!(per_minute(&answer), Some(237), "{answer:?}");
    // Replica one is killed under the first heavy Envoy's stream: its demand and its share
    // stay in Redis until the replica is found dead (3 s without a heartbeat,
    // `service/tests/rlqs_replicas.rs`), so a third heavy Envoy at once finds the whole budget
    // held and gets a fiftieth, not the 237 a forgotten share would leave.
    drop(one);
    drop(heavy);
    let mut third = open(two.address(), None).await.unwrap();
    let answer = third.report(reports("api", bucket("b"), 100, 0)).await;
    assert_eq!(per_minute(&answer), Some(12), "{answer:?}");
    // One hash for the bucket, a field per live Envoy, expiring with the last report's ttl.
    let keys = redis.client().cmd(&["KEYS", "sluice:rlqs:{*"]);
    let Reply::Array(keys) = keys else {
        panic!("{keys:?}")
    };
    assert_eq!(keys.len(), 1, "{keys:?}");
    let key = keys[0].text();
    assert_eq!(redis.client().cmd(&["HLEN", &key]).int(), 4);
    let ttl = redis.client().cmd(&["PTTL", &key]).int();
    assert!((1..=15_000).contains(&ttl), "{ttl}");
}

#[tokio::test]
async fn while_redis_is_away_a_replica_answers_nothing_and_answers_again_after() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let service = Rlqs::start(&["--redis", &url], LIMITS, &PORT, &[]);
    let mut envoy = open(service.address(), None).await.unwrap();
    // 120 a minute (126 with the slack), and as much again as headroom.
    let answer = envoy.report(reports("api", bucket("b"), 10, 0)).await;
    assert_eq!(per_minute(&answer), Some(252), "{answer:?}");
    redis.stop();
    envoy.send(reports("api", bucket("b"), 10, 0)).await;
    let silent = tokio::time::timeout(Duration::from_secs(3), envoy.answers.next()).await;
    assert!(silent.is_err(), "answered without Redis: {silent:?}");
    redis.restart();
    let mut answered = None;
    for _ in 0..10 {
        envoy.send(reports("api", bucket("b"), 10, 0)).await;
        let next = tokio::time::timeout(Duration::from_secs(2), envoy.answers.next()).await;
        if let Ok(Some(Ok(answer))) = next {
            answered = Some(answer);
            break;
        }
    }
    let answer = answered.expect("no answer once Redis was back");
    assert!(per_minute(&answer).is_some(), "{answer:?}");
}
