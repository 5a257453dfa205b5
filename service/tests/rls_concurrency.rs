//! Concurrency limits over the RLS protocol (gRPC), through the real service and Redis, as
//! Envoy's ratelimit filter uses them: a request-path call whose hits each take a slot, and a
//! call when the stream is done whose `is_negative_hits` gives it back; a −1 that never comes
//! costs a slot until its lease ends.
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

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use rls::{ask, connect, request, Rls};
use sluice_testkit::redis::RedisServer;

const STREAMS: &str = "domain: d
descriptors:
  - key: user
    rate_limit: {algorithm: concurrency, requests_per_unit: 3}
  - key: short
    rate_limit: {algorithm: concurrency, requests_per_unit: 1, lease: 4s}
";

fn start(redis: &RedisServer) -> Rls {
    Rls::start(&["--redis", &redis.url()], STREAMS, &[])
}

/// Envoy's request-path call: `hits` slots for `key`'s value `alice`.
fn take(key: &str, hits: u64) -> RateLimitRequest {
    let mut call = request("d", &[&[(key, "alice")]], 0);
    call.descriptors[0].hits_addend = Some(UInt64Value { value: hits });
    call
}

/// Envoy's call when the stream is done: `hits_addend: {number: hits, is_negative_hits: true}`.
fn give_back(key: &str, hits: u64) -> RateLimitRequest {
    let mut call = take(key, hits);
    call.descriptors[0].is_negative_hits = true;
    call
}

fn status(answer: &RateLimitResponse) -> (Code, u32) {
    let status = &answer.statuses[0];
    (Code::try_from(status.code).unwrap(), status.limit_remaining)
}

#[tokio::test(flavor = "multi_thread")]
async fn hits_take_slots_up_to_the_limit_and_negative_hits_give_them_back() {
    let redis = RedisServer::start();
    let rls = start(&redis);
    let mut client = connect(&rls).await;
    let mut answers = Vec::new();
    for _ in 0..4 {
        answers.push(status(&ask(&mut client, take("user", 1)).await));
    }
    let over = Code::OverLimit;
    assert_eq!(
        answers,
        [(Code::Ok, 2), (Code::Ok, 1), (Code::Ok, 0), (over, 0)]
    );
    let freed = ask(&mut client, give_back("user", 1)).await;
    assert_eq!(status(&freed), (Code::Ok, 1));
    assert_eq!(
        status(&ask(&mut client, take("user", 1)).await),
        (Code::Ok, 0)
    );
    // Two at once need two free slots; a refusal adds none.
    assert_eq!(
        status(&ask(&mut client, give_back("user", 1)).await).0,
        Code::Ok
    );
    assert_eq!(status(&ask(&mut client, take("user", 2)).await), (over, 1));
    // More given back than are held frees them all, and no more.
    assert_eq!(
        status(&ask(&mut client, give_back("user", 9)).await),
        (Code::Ok, 3)
    );
    assert_eq!(
        status(&ask(&mut client, take("user", 3)).await),
        (Code::Ok, 0)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refusal_gives_no_retry_and_the_time_until_the_newest_lease_ends() {
    let redis = RedisServer::start();
    let rls = Rls::start(
        &["--redis", &redis.url()],
        STREAMS,
        &["--rls-headers", "both"],
    );
    let mut client = connect(&rls).await;
    ask(&mut client, take("short", 1)).await;
    let refused = ask(&mut client, take("short", 1)).await;
    assert_eq!(status(&refused).0, Code::OverLimit);
    let until = refused.statuses[0].duration_until_reset.unwrap();
    let ms = until.seconds * 1000 + i64::from(until.nanos) / 1_000_000;
    assert!((3_000..=4_000).contains(&ms), "{until:?}");
    let retry = refused
        .response_headers_to_add
        .iter()
        .find(|h| h.key == "retry-after");
    assert!(retry.is_none(), "nobody knows when a slot frees: {retry:?}");
    let headers = &refused.response_headers_to_add;
    assert!(!headers.is_empty(), "the limit's headers are there");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_negative_hit_costs_its_slot_only_until_the_lease_ends() {
    let redis = RedisServer::start();
    let rls = start(&redis);
    let mut client = connect(&rls).await;
    let taken = Instant::now();
    assert_eq!(
        status(&ask(&mut client, take("short", 1)).await).0,
        Code::Ok
    );
    let mut freed = None;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if status(&ask(&mut client, take("short", 1)).await).0 == Code::Ok {
            freed = Some(taken.elapsed());
            break;
        }
    }
    let freed = freed.expect("the slot frees itself within 8 s");
    assert!(freed >= Duration::from_secs(4), "freed after {freed:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_negative_hit_for_a_window_still_only_asks() {
    let redis = RedisServer::start();
    let yaml = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";
    let rls = Rls::start(&["--redis", &redis.url()], yaml, &[]);
    let mut client = connect(&rls).await;
    assert_eq!(
        status(&ask(&mut client, take("user", 2)).await),
        (Code::Ok, 0)
    );
    let back = ask(&mut client, give_back("user", 1)).await;
    assert_eq!(
        status(&back),
        (Code::Ok, 0),
        "the window gives nothing back"
    );
    assert_eq!(
        status(&ask(&mut client, take("user", 1)).await).0,
        Code::OverLimit
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn hits_beyond_the_limit_are_refused_and_take_no_slot() {
    let redis = RedisServer::start();
    let rls = start(&redis);
    let mut client = connect(&rls).await;
    let refused = ask(&mut client, take("user", 4)).await;
    assert_eq!(status(&refused).0, Code::OverLimit, "four of three slots");
    assert_eq!(
        status(&ask(&mut client, take("user", 3)).await),
        (Code::Ok, 0)
    );
}
