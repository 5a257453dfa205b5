//! The five algorithms through POST /v1/check: the real binary and a real redis-server, with
//! Redis TIME read first where the position in an epoch-aligned window matters.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::time::Duration;

use common::clock::{redis_time_us, window_around, window_with_left};
use common::{bucket, leaky, window};
use serde_json::Value;
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::Service;

const MINUTE_MS: u64 = 60_000;

fn field(results: &[Value], name: &str) -> Vec<u64> {
    results.iter().map(|r| r[name].as_u64().unwrap()).collect()
}

fn allowed(results: &[Value]) -> usize {
    results.iter().filter(|r| r["allowed"] == true).count()
}

#[test]
fn a_fixed_window_passes_twice_its_limit_across_a_boundary_and_the_sliding_ones_do_not() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let mut client = redis.client();
    // A window of 10 to 20 s that ends in 0.7 to 1 s.
    let per_ms = window_with_left(redis_time_us(&mut client), 10_000..20_000, 700..1_000);
    let late: Vec<Value> = ["fixed_window", "sliding_window", "sliding_log"]
        .iter()
        .flat_map(|algorithm| {
            vec![window(algorithm, &format!("edge/{algorithm}"), 5, per_ms, 1, 1); 5]
        })
        .collect();
    let before = service.check(&late);
    assert_eq!(allowed(&before), 15, "{before:?}");
    let to_boundary = before[0]["reset_ms"].as_u64().unwrap();
    assert!(to_boundary <= 1_000, "the window ends in {to_boundary} ms");
    std::thread::sleep(Duration::from_millis(to_boundary + 100));
    let after = service.check(&late);
    let (fixed, sliding, log) = (&after[..5], &after[5..10], &after[10..]);
    assert_eq!(
        allowed(fixed),
        5,
        "a fresh window: 2 × limit in about a second"
    );
    assert_eq!(
        allowed(sliding),
        0,
        "the last window's 5 still weigh about 5"
    );
    assert_eq!(allowed(log), 0, "all 5 entries are younger than the window");
    // Sliding window: the previous 5 fade to 4 after a fifth of the window.
    for retry in field(sliding, "retry_after_ms") {
        assert!(
            (per_ms / 5 - 1_000..=per_ms / 5).contains(&retry),
            "{retry}"
        );
    }
    // Sliding log: the oldest entry leaves one window after the first batch.
    for retry in field(log, "retry_after_ms") {
        assert!((per_ms - 2_000..=per_ms).contains(&retry), "{retry}");
    }
    let sixth = service.check(&late[..1]).remove(0);
    assert_eq!(sixth["allowed"], false);
    let retry = sixth["retry_after_ms"].as_u64().unwrap();
    assert_eq!(
        retry,
        sixth["reset_ms"].as_u64().unwrap(),
        "until the window ends"
    );
    assert!((per_ms - 1_000..per_ms).contains(&retry), "{retry}");
}

#[test]
fn window_leases_grant_what_is_left_up_to_take() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let mut client = redis.client();
    // A window that neither started nor ends within 30 s of now.
    let per_ms = window_around(redis_time_us(&mut client), 120_000..240_000, 30_000);
    for algorithm in ["fixed_window", "sliding_window", "sliding_log"] {
        let lease = window(algorithm, &format!("lease/{algorithm}"), 30, per_ms, 1, 20);
        let results: Vec<Value> = (0..3)
            .map(|_| service.check(std::slice::from_ref(&lease)).remove(0))
            .collect();
        assert_eq!(field(&results, "granted"), [20, 10, 0], "{algorithm}");
        assert_eq!(field(&results, "remaining"), [10, 0, 0], "{algorithm}");
        // A lease needs at least `cost` left: 2 do not fit in what a third lease would leave.
        let costly = window(algorithm, &format!("costly/{algorithm}"), 30, per_ms, 2, 30);
        let first = service.check(&[window(
            algorithm,
            &format!("costly/{algorithm}"),
            30,
            per_ms,
            29,
            29,
        )]);
        assert_eq!(field(&first, "granted"), [29], "{algorithm}");
        let denied = service.check(&[costly]).remove(0);
        assert_eq!(
            (denied["allowed"].clone(), denied["remaining"].clone()),
            (false.into(), 1.into()),
            "{algorithm}"
        );
    }
}

#[test]
fn a_leaky_bucket_delays_each_request_one_interval_more_and_denies_beyond_max_delay() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    // One request per 10 s, held at most 25 s: the queue takes 3.
    let queued = leaky("shape/1", 1, 10_000, 25_000, 1);
    let results = service.check(&vec![queued; 5]);
    assert_eq!(allowed(&results), 3);
    assert_eq!(field(&results, "granted"), [1, 1, 1, 0, 0]);
    assert_eq!(field(&results, "remaining"), [2, 1, 0, 0, 0]);
    let delays = field(&results, "delay_ms");
    assert_eq!(delays[0], 0);
    assert!((9_990..=10_000).contains(&delays[1]), "{delays:?}");
    assert!((19_990..=20_000).contains(&delays[2]), "{delays:?}");
    assert_eq!(delays[3..], [0, 0], "a denied request is not held");
    let resets = field(&results, "reset_ms");
    assert!(
        (29_990..=30_000).contains(&resets[2]),
        "the queue drains in 30 s: {resets:?}"
    );
    for retry in field(&results[3..], "retry_after_ms") {
        // Its turn would be in 30 s, 5 s more than it may wait.
        assert!((4_990..=5_000).contains(&retry), "{retry}");
    }
}

#[test]
fn only_leaky_bucket_answers_carry_delay_ms() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let results = service.check(&[
        bucket("shape/tb", 1, MINUTE_MS, 5, 1, 1),
        window("fixed_window", "shape/fw", 5, MINUTE_MS, 1, 1),
        window("sliding_window", "shape/sw", 5, MINUTE_MS, 1, 1),
        window("sliding_log", "shape/sl", 5, MINUTE_MS, 1, 1),
        leaky("shape/lb", 1, 1_000, 0, 1),
    ]);
    assert_eq!(allowed(&results), 5);
    for result in &results[..4] {
        assert!(result.get("delay_ms").is_none(), "{result}");
    }
    assert_eq!(results[4]["delay_ms"], 0);
}

#[test]
fn every_algorithm_keeps_one_hash_tagged_key_with_a_ttl() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let mut client = redis.client();
    let per_ms = window_around(redis_time_us(&mut client), 120_000..240_000, 30_000);
    let results = service.check(&[
        bucket("ttl/tb", 1, 1_000, 5, 3, 3),
        window("fixed_window", "ttl/fw", 5, per_ms, 1, 1),
        window("sliding_window", "ttl/sw", 5, per_ms, 1, 1),
        window("sliding_log", "ttl/sl", 5, per_ms, 2, 2),
        leaky("ttl/lb", 1, 1_000, 5_000, 3),
    ]);
    assert_eq!(allowed(&results), 5);
    let reset = field(&results, "reset_ms");
    // Token bucket: until full again; fixed window: to its end; sliding window: to the end of
    // the next window (reset is to the end of this one); sliding log: one window; leaky bucket:
    // until the queue drains. Each plus a second.
    // Each key names its algorithm and numbers after the hash-tagged caller key.
    let window_us = per_ms * 1000;
    let expected = [
        (
            "sluice:{ttl/tb}:token_bucket/1000000/5".to_string(),
            reset[0],
        ),
        (
            format!("sluice:{{ttl/fw}}:fixed_window/{window_us}/5"),
            reset[1],
        ),
        (
            format!("sluice:{{ttl/sw}}:sliding_window/{window_us}/5"),
            reset[2],
        ),
        (
            format!("sluice:{{ttl/sl}}:sliding_log/{window_us}/5"),
            per_ms,
        ),
        (
            "sluice:{ttl/lb}:leaky_bucket/1000000/5000000".to_string(),
            reset[4],
        ),
    ];
    for (key, until_ms) in &expected {
        let (key, until_ms) = (key.as_str(), *until_ms);
        let pttl = client.cmd(&["PTTL", key]).int() as u64;
        let ttl = until_ms + 1_000;
        assert!(
            (ttl - 500..=ttl).contains(&pttl),
            "{key}: PTTL {pttl}, expected about {ttl}"
        );
    }
    let mut keys: Vec<String> = match client.cmd(&["KEYS", "*"]) {
        sluice_testkit::resp::Reply::Array(keys) => keys.iter().map(|k| k.text()).collect(),
        other => panic!("{other:?}"),
    };
    keys.sort();
    let mut names: Vec<&str> = expected.iter().map(|(key, _)| key.as_str()).collect();
    names.sort();
    assert_eq!(keys, names, "one key per check, nothing else");
}

#[test]
fn the_new_scripts_are_loaded_again_after_a_script_flush() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let checks = [
        window("fixed_window", "flush/fw", 5, MINUTE_MS, 1, 1),
        window("sliding_log", "flush/sl", 5, MINUTE_MS, 1, 1),
        leaky("flush/lb", 1, 60_000, 120_000, 1),
    ];
    service.check(&checks);
    let mut client = redis.client();
    assert_eq!(client.cmd(&["SCRIPT", "FLUSH"]).text(), "OK");
    let results = service.check(&checks);
    assert_eq!(allowed(&results), 3);
    // The log kept its first entry; the leaky bucket its queue.
    assert_eq!(results[1]["remaining"], 3);
    assert_eq!(results[2]["remaining"], 1, "(120 s - 60 s) / 60 s");
    let delay = results[2]["delay_ms"].as_u64().unwrap();
    assert!((59_000..=60_000).contains(&delay), "{delay}");
    // Each EVALSHA met NOSCRIPT, the scripts were loaded again, and each ran once more: the
    // batch's one (the fixed window and the leaky bucket) and the sliding log's.
    let errors = client.cmd(&["INFO", "errorstats"]).text();
    assert!(errors.contains("errorstat_NOSCRIPT:count=2"), "{errors}");
}

#[test]
fn a_sliding_window_lets_the_previous_window_fade() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let mut client = redis.client();
    // 10 admitted at the end of an 8 to 16 s window; then, a quarter into the next, 10 × 3/4
    // still weigh: room for 2 of 10 (3 only if the sleep overshot by a twentieth of the window).
    let per_ms = window_with_left(redis_time_us(&mut client), 8_000..16_000, 300..500);
    let full = window("sliding_window", "fade/1", 10, per_ms, 1, 1);
    let first = service.check(&vec![full.clone(); 10]);
    assert_eq!(allowed(&first), 10);
    // An admission's reset is when its count has faded: the end of the next window.
    let left = first[0]["reset_ms"].as_u64().unwrap() - per_ms;
    std::thread::sleep(Duration::from_millis(left + per_ms / 4 + 50));
    let results = service.check(&vec![full; 4]);
    assert_eq!(allowed(&results), 2, "{results:?}");
}
