//! When Redis fails: a quick 503 (never a hang), /healthz still 200, and the metrics.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::time::{Duration, Instant};

use common::post_check;
use common::{bucket, checks_body};
use sluice_testkit::http::{get, send_body, Response};
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::Service;

fn one_check() -> String {
    checks_body(&[bucket("fail/1", 1, 1000, 5, 1, 1)])
}

fn assert_redis_unavailable(response: &Response) {
    assert_eq!(response.status, 503, "{response:?}");
    let json = response.json();
    assert_eq!(json["error"], "redis_unavailable");
    assert!(!json["detail"].as_str().unwrap().is_empty());
}

#[test]
fn healthz_and_readyz_are_ok_while_redis_answers() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let health = get(service.addr, "/healthz");
    assert_eq!(
        (health.status, health.json()),
        (200, serde_json::json!({"status": "ok"}))
    );
    let ready = get(service.addr, "/readyz");
    assert_eq!(
        (ready.status, ready.json()),
        (200, serde_json::json!({"status": "ready"}))
    );
}

#[test]
fn with_redis_down_checks_answer_503_quickly_and_healthz_stays_200() {
    let mut redis = RedisServer::start();
    let service = Service::start(&redis.url());
    redis.stop();
    for _ in 0..3 {
        let started = Instant::now();
        assert_redis_unavailable(&post_check(service.addr, &one_check()));
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "took {:?}",
            started.elapsed()
        );
    }
    assert_eq!(get(service.addr, "/healthz").status, 200);
}

#[test]
fn with_redis_frozen_checks_answer_503_within_two_seconds() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    redis.freeze();
    let started = Instant::now();
    let response = post_check(service.addr, &one_check());
    let elapsed = started.elapsed();
    redis.thaw();
    assert_redis_unavailable(&response);
    assert!(elapsed < Duration::from_secs(2), "took {elapsed:?}");
    let recovered = sluice_testkit::wait_for(Duration::from_secs(5), || {
        (post_check(service.addr, &one_check()).status == 200).then_some(())
    });
    assert!(
        recovered.is_some(),
        "no 200 within 5 s of Redis answering again"
    );
}

#[test]
fn with_redis_down_checks_do_not_wait_for_reconnection_back_offs() {
    let mut redis = RedisServer::start();
    let service = Service::start(&redis.url());
    redis.stop();
    // Checks close together, as a breaker's probes and the requests of several workers are: each
    // must fail at once, not wait for a reconnection started by the one before. The median, so
    // that one slow scheduling of this busy test machine does not decide.
    let mut took: Vec<Duration> = (0..9)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(5));
            let started = Instant::now();
            assert_redis_unavailable(&post_check(service.addr, &one_check()));
            started.elapsed()
        })
        .collect();
    took.sort();
    assert!(took[4] < Duration::from_millis(50), "took {took:?}");
}

#[test]
fn metrics_count_checks_by_policy_and_result_requests_by_status_redis_errors_and_latency() {
    let mut redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let burst_two = checks_body(&[bucket("metrics/1", 1, 60_000, 2, 1, 1)]);
    for _ in 0..3 {
        assert_eq!(post_check(service.addr, &burst_two).status, 200);
    }
    assert_eq!(post_check(service.addr, "{").status, 400);
    redis.stop();
    assert_eq!(post_check(service.addr, &burst_two).status, 503);
    let metrics = get(service.addr, "/metrics");
    assert_eq!(metrics.status, 200);
    assert_eq!(
        metrics.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    let checks = r#"sluice_service_checks_total{policy="metrics",algorithm="token_bucket","#;
    let requests = r#"sluice_service_http_requests_total{path="/v1/check","#;
    for line in [
        format!(r#"{checks}result="allowed"}} 2"#),
        format!(r#"{checks}result="denied"}} 1"#),
        format!(r#"{checks}result="error"}} 1"#),
        format!(r#"{requests}status="200"}} 3"#),
        format!(r#"{requests}status="400"}} 1"#),
        format!(r#"{requests}status="503"}} 1"#),
        r#"sluice_service_redis_errors_total{kind="connection"} 1"#.to_string(),
        "# TYPE sluice_service_check_duration_seconds histogram".to_string(),
        r#"sluice_service_check_duration_seconds_bucket{le="+Inf"} 4"#.to_string(),
        "sluice_service_check_duration_seconds_count 4".to_string(),
        "# EOF".to_string(),
    ] {
        assert!(
            metrics.text().lines().any(|l| l == line),
            "missing {line:?} in\n{}",
            metrics.text()
        );
    }
}

#[test]
fn unknown_paths_and_methods_get_json_errors() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let missing = get(service.addr, "/v2/check");
    assert_eq!(
        (missing.status, missing.json()["error"].as_str()),
        (404, Some("not_found"))
    );
    let wrong_method = get(service.addr, "/v1/check");
    assert_eq!(
        (wrong_method.status, wrong_method.json()["error"].as_str()),
        (405, Some("method_not_allowed"))
    );
    let post_metrics = send_body(service.addr, "POST", "/metrics", "application/json", b"{}");
    assert_eq!(post_metrics.status, 405);
}

#[test]
fn the_first_check_after_a_redis_restart_is_answered() {
    let mut redis = RedisServer::start();
    let service = Service::start(&redis.url());
    assert_eq!(post_check(service.addr, &one_check()).status, 200);
    redis.restart();
    // The service's connection died with the old server; it notices only when it uses it.
    let started = Instant::now();
    let response = post_check(service.addr, &one_check());
    assert_eq!(response.status, 200, "{response:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(
        response.json()["results"][0]["remaining"],
        4,
        "charged once, on the new (empty) server"
    );
}

#[test]
fn the_first_check_after_redis_is_back_is_answered_after_503s_while_it_was_down() {
    let mut redis = RedisServer::start();
    let service = Service::start(&redis.url());
    assert_eq!(post_check(service.addr, &one_check()).status, 200);
    redis.stop();
    // The first meets the dead connection, the second a refused reconnection.
    for _ in 0..2 {
        assert_redis_unavailable(&post_check(service.addr, &one_check()));
    }
    // Each failure starts a reconnection in the background: let the last one fail too, so the
    // service holds a refused reconnection when Redis is back.
    std::thread::sleep(Duration::from_millis(500));
    redis.restart();
    let response = post_check(service.addr, &one_check());
    assert_eq!(response.status, 200, "{response:?}");
    assert_eq!(response.json()["results"][0]["remaining"], 4);
}
