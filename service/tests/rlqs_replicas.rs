//! A crashed RLQS replica's streams stop holding shares once it is found dead: every replica
//! beats in Redis each second, and a replica silent for 3 s has its streams' entries forgotten
//! by the next report of their buckets. An Envoy that moved to a live replica then gets its
//! fair share within seconds, not after its old stream's time to live (15 s).
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

use rlqs::{bucket, open, per_minute, reports, Rlqs};
use sluice_testkit::redis::RedisServer;

const LIMITS: &str = "\
domain: api
descriptors:
  - key: name
    rate_limit: {unit: minute, requests_per_unit: 600}
";
const PORT: [&str; 2] = ["--rlqs", "127.0.0.1:0"];

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
