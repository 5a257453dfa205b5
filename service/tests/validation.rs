//! Every kind of bad request gets a 400 naming the field, before Redis is touched. Each test
//! runs against a service whose Redis has been killed: a request that reached Redis would get
//! a 503 instead. The last test checks a live Redis stays empty and never ran the script.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use common::{bucket, checks_body, leaky, window};
use common::{post_check, Refusal};
use serde_json::json;
use sluice_testkit::http::{send_body, send_raw, Response};
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::Service;

/// A service whose Redis is gone (the server handle keeps its temp dir until the test ends).
struct WithoutRedis {
    service: Service,
    _redis: RedisServer,
}

fn service_without_redis() -> WithoutRedis {
    let mut redis = RedisServer::start();
    let service = Service::start(&redis.url());
    redis.stop();
    WithoutRedis {
        service,
        _redis: redis,
    }
}

fn rejected(body: &str) -> Response {
    post_check(service_without_redis().service.addr, body)
}

fn one(check: serde_json::Value) -> String {
    checks_body(&[check])
}

#[test]
fn malformed_json_is_rejected() {
    rejected(r#"{"checks": [{"key": "k","#).assert_bad_request("body: EOF while parsing");
}

#[test]
fn a_missing_field_is_rejected() {
    let mut check = bucket("k", 1, 1000, 5, 1, 1);
    check.as_object_mut().unwrap().remove("burst");
    rejected(&one(check)).assert_bad_request("checks[0]: missing field `burst`");
}

#[test]
fn an_unknown_field_is_rejected() {
    let mut check = bucket("k", 1, 1000, 5, 1, 1);
    check["window"] = json!(3);
    rejected(&one(check)).assert_bad_request("checks[0].window: unknown field `window`");
    rejected(r#"{"checks": [], "extra": true}"#).assert_bad_request("extra: unknown field");
}

#[test]
fn zero_requests_is_rejected() {
    rejected(&one(bucket("k", 0, 1000, 5, 1, 1)))
        .assert_bad_request("checks[0].requests: 0 is not in 1..=1000000000");
}

#[test]
fn a_zero_period_is_rejected() {
    rejected(&one(bucket("k", 1, 0, 5, 1, 1))).assert_bad_request("checks[0].per_ms: 0 is not in");
}

#[test]
fn absurd_numbers_are_rejected() {
    let service = service_without_redis();
    let addr = service.service.addr;
    let more_than_a_year = one(bucket("k", 1, 31_536_000_001, 5, 1, 1));
    post_check(addr, &more_than_a_year)
        .assert_bad_request("checks[0].per_ms: 31536000001 is not in");
    post_check(addr, &one(bucket("k", 1, 1000, 1_000_000_001, 1, 1)))
        .assert_bad_request("checks[0].burst:");
    let huge =
        r#"{"checks": [{"key": "k", "requests": 1e40, "per_ms": 1000, "burst": 5, "cost": 1}]}"#;
    post_check(addr, huge).assert_bad_request("checks[0].requests: invalid type: floating point");
    let negative =
        r#"{"checks": [{"key": "k", "requests": 1, "per_ms": 1000, "burst": 5, "cost": -1}]}"#;
    post_check(addr, negative).assert_bad_request("checks[0].cost: invalid value: integer `-1`");
    let too_slow_to_fill = one(bucket("k", 1, 31_536_000_000, 1_000, 1, 1));
    post_check(addr, &too_slow_to_fill)
        .assert_bad_request("checks[0].burst: the bucket takes too long to fill");
}

#[test]
fn a_cost_above_burst_is_rejected() {
    rejected(&one(bucket("k", 1, 1000, 5, 6, 6)))
        .assert_bad_request("checks[0].cost: 6 is not in 1..=5");
}

#[test]
fn a_take_below_cost_is_rejected() {
    rejected(&one(bucket("k", 1, 1000, 5, 3, 2)))
        .assert_bad_request("checks[0].take: 2 is not in 3..=5");
}

#[test]
fn a_take_above_burst_is_rejected() {
    rejected(&one(bucket("k", 1, 1000, 5, 1, 6)))
        .assert_bad_request("checks[0].take: 6 is not in 1..=5");
}

#[test]
fn more_than_sixteen_checks_are_rejected() {
    let checks: Vec<_> = (0..17)
        .map(|i| bucket(&format!("k{i}"), 1, 1000, 5, 1, 1))
        .collect();
    rejected(&checks_body(&checks)).assert_bad_request("checks: must hold 1 to 16 checks, got 17");
}

#[test]
fn no_checks_is_rejected() {
    rejected(&checks_body(&[])).assert_bad_request("checks: must hold 1 to 16 checks, got 0");
}

#[test]
fn a_body_over_64_kib_is_rejected() {
    let padding = " ".repeat(64 * 1024);
    let body = format!("{}{padding}", one(bucket("k", 1, 1000, 5, 1, 1)));
    rejected(&body).assert_bad_request("body: larger than 65536 bytes");
}

#[test]
fn a_chunked_body_over_64_kib_is_rejected() {
    let chunk = " ".repeat(16 * 1024);
    let mut raw = String::from("POST /v1/check HTTP/1.1\r\nhost: sluice\r\nconnection: close\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n");
    for _ in 0..5 {
        raw.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
    }
    raw.push_str("0\r\n\r\n");
    let service = service_without_redis();
    send_raw(service.service.addr, raw.as_bytes())
        .assert_bad_request("body: larger than 65536 bytes");
}

#[test]
fn bad_key_characters_are_rejected() {
    let service = service_without_redis();
    for key in ["per user/1", "tag{x}", "per-user/é", "a\nb"] {
        let response = post_check(service.service.addr, &one(bucket(key, 1, 1000, 5, 1, 1)));
        response.assert_bad_request("checks[0].key: character");
    }
}

#[test]
fn keys_longer_than_200_bytes_are_rejected() {
    let key = "k".repeat(201);
    rejected(&one(bucket(&key, 1, 1000, 5, 1, 1)))
        .assert_bad_request("checks[0].key: must be 1 to 200 bytes");
}

#[test]
fn an_unknown_algorithm_is_rejected() {
    let mut check = bucket("k", 1, 1000, 5, 1, 1);
    check["algorithm"] = json!("gcra");
    rejected(&one(check)).assert_bad_request("checks[0].algorithm: unknown variant `gcra`");
}

#[test]
fn max_delay_ms_is_required_for_the_leaky_bucket_and_refused_for_the_others() {
    let service = service_without_redis();
    let addr = service.service.addr;
    let mut check = leaky("k", 10, 1000, 500, 1);
    check.as_object_mut().unwrap().remove("max_delay_ms");
    post_check(addr, &one(check))
        .assert_bad_request("checks[0].max_delay_ms: required for leaky_bucket");
    for algorithm in ["fixed_window", "sliding_window", "sliding_log"] {
        let mut check = window(algorithm, "k", 5, 1000, 1, 1);
        check["max_delay_ms"] = json!(100);
        post_check(addr, &one(check)).assert_bad_request(&format!(
            "checks[0].max_delay_ms: only for leaky_bucket, not {algorithm}"
        ));
    }
    let mut check = bucket("k", 1, 1000, 5, 1, 1);
    check["max_delay_ms"] = json!(100);
    post_check(addr, &one(check))
        .assert_bad_request("checks[0].max_delay_ms: only for leaky_bucket, not token_bucket");
    post_check(addr, &one(leaky("k", 1, 1000, 31_536_000_001, 1)))
        .assert_bad_request("checks[0].max_delay_ms: 31536000001 is not in 0..=31536000000");
}

#[test]
fn a_leaky_bucket_takes_exactly_its_cost() {
    let mut check = leaky("k", 10, 1000, 500, 1);
    check["take"] = json!(2);
    rejected(&one(check))
        .assert_bad_request("checks[0].take: must equal cost (1) for leaky_bucket, got 2");
}

#[test]
fn a_window_s_burst_is_its_limit() {
    let mut check = window("fixed_window", "k", 5, 1000, 1, 1);
    check["burst"] = json!(6);
    rejected(&one(check))
        .assert_bad_request("checks[0].burst: must equal requests (5) for fixed_window, got 6");
}

#[test]
fn window_costs_and_leases_are_bounded_by_the_limit() {
    let service = service_without_redis();
    let addr = service.service.addr;
    post_check(addr, &one(window("sliding_window", "k", 5, 1000, 6, 6)))
        .assert_bad_request("checks[0].cost: 6 is not in 1..=5 (requests)");
    post_check(addr, &one(window("sliding_log", "k", 5, 1000, 2, 6)))
        .assert_bad_request("checks[0].take: 6 is not in 2..=5");
}

#[test]
fn a_sliding_log_of_more_than_a_thousand_is_rejected() {
    rejected(&one(window("sliding_log", "k", 1001, 1000, 1, 1)))
        .assert_bad_request("checks[0].requests: 1001 is not in 1..=1000");
}

#[test]
fn a_body_that_is_not_json_content_is_rejected() {
    let service = service_without_redis();
    let body = one(bucket("k", 1, 1000, 5, 1, 1));
    let response = send_body(
        service.service.addr,
        "POST",
        "/v1/check",
        "text/plain",
        body.as_bytes(),
    );
    response.assert_bad_request("content-type: must be application/json");
}

#[test]
fn bad_requests_leave_a_live_redis_untouched() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let mut without_max_delay = leaky("good", 1, 1000, 100, 1);
    without_max_delay
        .as_object_mut()
        .unwrap()
        .remove("max_delay_ms");
    let bad_bodies = [
        "not json".to_string(),
        one(bucket("k", 0, 1000, 5, 1, 1)),
        one(bucket("k", 1, 1000, 5, 6, 6)),
        // One bad check spoils the request: the good one before it is not charged either.
        checks_body(&[
            bucket("good", 1, 1000, 5, 1, 1),
            bucket("bad key", 1, 1000, 5, 1, 1),
        ]),
        checks_body(&[
            window("sliding_log", "good", 5, 1000, 1, 1),
            without_max_delay,
        ]),
    ];
    for body in &bad_bodies {
        assert_eq!(post_check(service.addr, body).status, 400, "{body}");
    }
    let mut client = redis.client();
    assert_eq!(client.cmd(&["DBSIZE"]).int(), 0);
    let stats = client.cmd(&["INFO", "commandstats"]).text();
    assert!(
        !stats.contains("cmdstat_evalsha") && !stats.contains("cmdstat_eval:"),
        "{stats}"
    );
    let metrics = sluice_testkit::http::get(service.addr, "/metrics").text();
    let bad = r#"sluice_service_http_requests_total{path="/v1/check",status="400"} 5"#;
    assert!(metrics.lines().any(|l| l == bad), "{metrics}");
    assert!(
        !metrics.contains("sluice_service_checks_total{"),
        "{metrics}"
    );
}
