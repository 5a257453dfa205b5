//! POST /v1/check through the real binary: the API's behaviour on both stores (a real
//! redis-server running the Lua scripts, and `--memory`, the filter's own algorithms in the
//! service), then what only Redis has.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::post_check;
use common::{bucket, checks_body};
use serde_json::{json, Value};
use sluice_testkit::http::Response;
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::Service;
use sluice_testkit::wait_for;

const MINUTE_MS: u64 = 60_000;

/// Runs a test body against a service on a real Redis and one on `--memory`: one contract, two
/// stores.
fn on_each_store(body: impl Fn(&Service)) {
    let redis = RedisServer::start();
    body(&Service::start(&redis.url()));
    body(&Service::start_memory());
}

/// One request with one check; its result.
fn check_one(service: &Service, one: &Value) -> Value {
    service.check(std::slice::from_ref(one)).remove(0)
}

fn allowed(results: &[Value]) -> Vec<bool> {
    results
        .iter()
        .map(|r| r["allowed"].as_bool().unwrap())
        .collect()
}

#[test]
fn eight_rapid_requests_with_burst_five_give_five_allowed_then_three_denied() {
    on_each_store(|service| {
        let per_user = bucket("per-user/7af12e58ae350d9a", 1, 1000, 5, 1, 1);
        let results: Vec<Value> = (0..8).map(|_| check_one(service, &per_user)).collect();
        assert_eq!(
            allowed(&results),
            [true, true, true, true, true, false, false, false]
        );
        let remaining: Vec<u64> = results
            .iter()
            .map(|r| r["remaining"].as_u64().unwrap())
            .collect();
        assert_eq!(remaining, [4, 3, 2, 1, 0, 0, 0, 0]);
        assert_eq!(
            results[0],
            json!({"allowed": true, "granted": 1, "remaining": 4, "reset_ms": 1000, "retry_after_ms": 0})
        );
        for denied in &results[5..] {
            assert_eq!(denied["granted"], 0);
            let retry = denied["retry_after_ms"].as_u64().unwrap();
            assert!((800..=1000).contains(&retry), "retry_after_ms {retry}");
            let reset = denied["reset_ms"].as_u64().unwrap();
            assert!((4800..=5000).contains(&reset), "reset_ms {reset}");
        }
    });
}

#[test]
fn a_lease_grants_the_smaller_of_take_and_what_is_available() {
    on_each_store(|service| {
        let lease = bucket("lease/1", 1, MINUTE_MS, 30, 1, 20);
        let granted: Vec<u64> = (0..3)
            .map(|_| check_one(service, &lease)["granted"].as_u64().unwrap())
            .collect();
        assert_eq!(granted, [20, 10, 0]);
    });
}

#[test]
fn tokens_come_back_with_time_up_to_the_burst() {
    on_each_store(|service| {
        let two_per_second = bucket("refill/1", 2, 1000, 2, 1, 1);
        let drain: Vec<bool> = (0..3)
            .map(|_| check_one(service, &two_per_second)["allowed"] == true)
            .collect();
        assert_eq!(drain, [true, true, false]);
        // 1.6 s refill 3.2 tokens, but the bucket holds 2.
        std::thread::sleep(Duration::from_millis(1600));
        let again: Vec<bool> = (0..3)
            .map(|_| check_one(service, &two_per_second)["allowed"] == true)
            .collect();
        assert_eq!(again, [true, true, false]);
    });
}

#[test]
fn each_check_of_a_request_is_decided_on_its_own_in_order() {
    on_each_store(|service| {
        let tight = bucket("layer/tight", 1, MINUTE_MS, 1, 1, 1);
        check_one(service, &tight);
        let loose = bucket("layer/loose", 1, MINUTE_MS, 10, 1, 1);
        let results = service.check(&[
            tight,
            loose.clone(),
            bucket("layer/other", 1, MINUTE_MS, 3, 2, 2),
        ]);
        assert_eq!(allowed(&results), [false, true, true]);
        // The filter denies this request, yet the other checks were charged (documented semantics).
        assert_eq!(results[1]["remaining"], 9);
        assert_eq!(results[2]["remaining"], 1);
    });
}

#[test]
fn the_same_key_twice_in_one_request_is_charged_twice_in_order() {
    on_each_store(|service| {
        let once = bucket("twice/1", 1, MINUTE_MS, 1, 1, 1);
        assert_eq!(
            allowed(&service.check(&[once.clone(), once])),
            [true, false]
        );
    });
}

#[test]
fn the_redis_key_is_hash_tagged_and_expires_when_the_bucket_is_full_again() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let result = service
        .check(&[bucket("per-user/abc", 1, 1000, 5, 3, 3)])
        .remove(0);
    let reset_ms = result["reset_ms"].as_i64().unwrap();
    assert_eq!(reset_ms, 3000);
    let mut client = redis.client();
    let keys = client.cmd(&["KEYS", "*"]);
    let key = "sluice:{per-user/abc}:token_bucket/1000000/5";
    assert_eq!(format!("{keys:?}"), format!("Array([Bulk(Some({key:?}))])"));
    let pttl = client.cmd(&["PTTL", key]).int();
    assert!(
        (reset_ms + 1000 - 500..=reset_ms + 1000).contains(&pttl),
        "PTTL {pttl}"
    );
}

#[test]
fn checks_survive_a_script_flush() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let checks = [
        bucket("flush/a", 1, MINUTE_MS, 5, 1, 1),
        bucket("flush/b", 1, MINUTE_MS, 5, 1, 1),
    ];
    service.check(&checks);
    let mut client = redis.client();
    assert_eq!(client.cmd(&["SCRIPT", "FLUSH"]).text(), "OK");
    let results = service.check(&checks);
    assert_eq!(allowed(&results), [true, true]);
    assert_eq!(
        (
            results[0]["remaining"].clone(),
            results[1]["remaining"].clone()
        ),
        (json!(3), json!(3))
    );
    // Both checks went in one EVALSHA of the batch script: it met NOSCRIPT, the scripts were
    // loaded again, and it ran once more.
    let errors = client.cmd(&["INFO", "errorstats"]).text();
    assert!(errors.contains("errorstat_NOSCRIPT:count=1"), "{errors}");
}

#[test]
fn checks_resume_after_redis_restarts_empty() {
    let mut redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let user = bucket("restart/1", 1, MINUTE_MS, 5, 1, 1);
    check_one(&service, &user);
    redis.restart();
    // The wait only bounds the test: the first check after the restart is answered (pinned by
    // tests/failures.rs).
    let recovered = wait_for(Duration::from_secs(5), || {
        let response: Response =
            post_check(service.addr, &checks_body(std::slice::from_ref(&user)));
        (response.status == 200).then(|| response.json())
    });
    let result = &recovered.expect("no 200 within 5 s of the restart")["results"][0];
    assert_eq!(
        result["remaining"], 4,
        "a restarted Redis starts from full buckets"
    );
}

/// Reads one response with a content-length from a kept-alive connection; returns the status.
fn read_response(reader: &mut BufReader<TcpStream>) -> u16 {
    let mut line = || {
        let mut line = String::new();
        let read = reader.read_line(&mut line).unwrap();
        assert!(read > 0, "the server closed the connection");
        line
    };
    let status_line = line();
    let mut length = 0;
    for header in std::iter::repeat_with(line).take(100) {
        if header == "\r\n" {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap();
            }
        }
    }
    reader.read_exact(&mut vec![0; length]).unwrap();
    status_line.split(' ').nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_kept_alive_connection_serves_requests_after_six_idle_seconds() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let body = checks_body(&[bucket("keepalive/1", 1, MINUTE_MS, 5, 1, 1)]);
    let request = format!(
        "POST /v1/check HTTP/1.1\r\nhost: sluice\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let stream = TcpStream::connect(service.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut reader = BufReader::new(stream);
    for pause in [0, 0, 6] {
        std::thread::sleep(Duration::from_secs(pause));
        reader.get_mut().write_all(request.as_bytes()).unwrap();
        assert_eq!(read_response(&mut reader), 200, "after {pause} s idle");
    }
}
