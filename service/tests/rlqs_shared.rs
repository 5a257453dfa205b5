//! The RLQS's shares live in Redis: two replicas of the service against one redis-server divide
//! one budget between the Envoys whose streams they hold, each replica's `/metrics` showing the
//! shares its own streams were sent and the requests they reported, a replica killed
//! mid-interval loses no Envoy's demand (another replica still counts it) until it is found
//! dead (3 s without a heartbeat), when an Envoy moved to a live replica gets its fair share;
//! and while Redis is away a replica answers nothing (Envoy keeps its last assignment) and
//! answers again once Redis is back.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "rlqs/client.rs"]
mod rlqs;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use rlqs::{bucket, metric, open, per_minute, reports, Rlqs};
use sluice_testkit::redis::RedisServer;
use sluice_testkit::resp::Reply;

const LIMITS: &str = "\
domain: api
descriptors:
  - key: name
    rate_limit: {unit: minute, requests_per_unit: 600}
";
const PORT: [&str; 2] = ["--rlqs", "127.0.0.1:0"];
/// With HTTP as well, for /metrics.
const WITH_HTTP: [&str; 2] = ["--listen", "127.0.0.1:0"];

#[tokio::test]
async fn two_replicas_divide_one_budget_and_a_killed_replica_loses_nothing() {
    let redis = RedisServer::start();
    let url = redis.url();
    let store = ["--redis", url.as_str()];
    let one = Rlqs::start(&store, LIMITS, &PORT, &WITH_HTTP);
    let two = Rlqs::start(&store, LIMITS, &PORT, &WITH_HTTP);
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
    // Each replica's series are its own streams', under the descriptor the bucket matched (the
    // limits' `name`, never the bucket's value `b`): replica one sent the heavy Envoy 237 a
    // minute, replica two the light one 126 and the second 237; summed, the budget's 600.
    let series = |replica: &Rlqs, name: &str| {
        let labels = r#"{domain="api",descriptor="name"}"#;
        metric(
            replica.service.addr,
            &format!("sluice_service_rlqs_{name}{labels}"),
        )
    };
    let outcome = |replica: &Rlqs, outcome: &str| {
        let labels = format!(r#"{{domain="api",descriptor="name",outcome="{outcome}"}}"#);
        metric(
            replica.service.addr,
            &format!("sluice_service_rlqs_requests_total{labels}"),
        )
    };
    assert_eq!(series(&one, "assigned"), Some(237));
    assert_eq!(series(&one, "envoys"), Some(1));
    assert_eq!(series(&two, "assigned"), Some(126 + 237));
    assert_eq!(series(&two, "envoys"), Some(2));
    assert_eq!(series(&one, "reports_total"), Some(3));
    assert_eq!(outcome(&one, "allowed"), Some(90 + 100 + 100));
    assert_eq!(outcome(&one, "denied"), Some(10));
    assert_eq!(outcome(&two, "allowed"), Some(10 + 2 + 100 + 100));
    assert_eq!(outcome(&two, "denied"), Some(0));
    let text = sluice_testkit::http::get(two.service.addr, "/metrics").text();
    assert!(
        !text.contains("\"b\""),
        "a bucket's value is a label:\n{text}"
    );
    // Replica one is killed under the first heavy Envoy's stream: its demand and its share
    // stay in Redis until the replica is found dead (3 s without a heartbeat, below), so a
    // third heavy Envoy at once finds the whole budget
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
    // A stream that ends takes its share and itself out of its replica's series: replica two
    // holds the light Envoy's 126 and the third's 12.
    drop(second);
    let mut left = 50;
    while series(&two, "envoys") != Some(2) {
        left -= 1;
        assert!(left > 0, "the ended stream still counted after 5 s");
        // The client's connection closes on this runtime's thread: let it run.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(series(&two, "assigned"), Some(126 + 12));
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

#[tokio::test]
async fn a_killed_replicas_streams_stop_holding_shares_once_it_is_found_dead() {
    let redis = RedisServer::start();
    let url = redis.url();
    let store = ["--redis", url.as_str()];
    let one = Rlqs::start(&store, LIMITS, &PORT, &[]);
    let two = Rlqs::start(&store, LIMITS, &PORT, &[]);
    // Two heavy Envoys, one on each replica, 237 a minute each once both are measured.
    let mut first = open(one.address(), None).await.unwrap();
    let mut second = open(two.address(), None).await.unwrap();
    for _ in 0..2 {
        first.report(reports("api", bucket("b"), 100, 0)).await;
        second.report(reports("api", bucket("b"), 100, 0)).await;
    }
    let answer = first.report(reports("api", bucket("b"), 100, 0)).await;
    assert!(per_minute(&answer).unwrap() < 320, "{answer:?}");
    let beats = redis.client().cmd(&["HLEN", "sluice:rlqs:replicas"]).int();
    assert_eq!(beats, 2, "a heartbeat per replica");

    // Replica one dies; the first Envoy opens its stream again on replica two, a new stream
    // there. At once its old stream's share still counts; once replica one is found dead, the
    // moved Envoy's next report gets a fair share of the budget the dead stream held.
    let killed = Instant::now();
    drop(one);
    drop(first);
    let mut moved = open(two.address(), None).await.unwrap();
    let answer = moved.report(reports("api", bucket("b"), 100, 0)).await;
    assert_eq!(
        per_minute(&answer),
        Some(12),
        "a newcomer's share at once: {answer:?}"
    );
    let fair = loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        second.report(reports("api", bucket("b"), 50, 0)).await;
        let answer = moved.report(reports("api", bucket("b"), 50, 0)).await;
        let share = per_minute(&answer).unwrap();
        if share > 100 {
            break share;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(8),
            "still {share} a minute {:?} after the kill",
            killed.elapsed()
        );
    };
    let after = killed.elapsed();
    eprintln!("the moved Envoy's share {fair} a minute {after:?} after the kill");
    // The dead stream's entry is gone from the bucket: the two live streams are left.
    let keys = redis.client().cmd(&["KEYS", "sluice:rlqs:{*"]);
    let sluice_testkit::resp::Reply::Array(keys) = keys else {
        panic!("{keys:?}")
    };
    let key = keys[0].text();
    assert_eq!(redis.client().cmd(&["HLEN", &key]).int(), 2);
}
