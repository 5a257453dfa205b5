//! Readiness follows Redis: /readyz turns 503 within a second of Redis stopping or freezing and
//! 200 within a second of it answering again, while /healthz answers as long as the process
//! lives; a service started with Redis down serves anyway and decides once Redis is up.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{bucket, checks_body, post_check};
use sluice_testkit::http::get;
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::Service;

const WITHIN: Duration = Duration::from_secs(1);

fn one_check() -> String {
    checks_body(&[bucket("ready/1", 1, 60_000, 5, 1, 1)])
}

/// How long until /readyz answers `status`, polling every 20 ms for at most 5 s.
fn until_readyz(addr: SocketAddr, status: u16) -> Duration {
    let started = Instant::now();
    let reached = sluice_testkit::wait_for(Duration::from_secs(5), || {
        (get(addr, "/readyz").status == status).then_some(())
    });
    assert!(reached.is_some(), "/readyz never answered {status}");
    started.elapsed()
}

fn redis_up_gauge(addr: SocketAddr) -> String {
    let metrics = get(addr, "/metrics").text();
    let line = metrics
        .lines()
        .find(|l| l.starts_with("sluice_service_redis_up "));
    line.unwrap_or_else(|| panic!("no redis_up in\n{metrics}"))
        .to_string()
}

#[test]
fn readyz_turns_503_within_a_second_of_redis_stopping_and_200_within_a_second_of_its_start() {
    let mut redis = RedisServer::start();
    let service = Service::start(&redis.url());
    assert_eq!(redis_up_gauge(service.addr), "sluice_service_redis_up 1");

    redis.stop();
    let down_after = until_readyz(service.addr, 503);
    assert!(down_after < WITHIN, "503 after {down_after:?}");
    let body = get(service.addr, "/readyz").json();
    assert_eq!(body["error"], "redis_unavailable", "{body}");
    assert_eq!(get(service.addr, "/healthz").status, 200);
    assert_eq!(redis_up_gauge(service.addr), "sluice_service_redis_up 0");
    let down = service.event("redis is down", WITHIN).unwrap();
    assert_eq!(down["level"], "WARN", "{down}");

    redis.restart();
    let up_after = until_readyz(service.addr, 200);
    assert!(up_after < WITHIN, "200 after {up_after:?}");
    assert_eq!(redis_up_gauge(service.addr), "sluice_service_redis_up 1");
    assert!(service.event("redis is up", WITHIN).is_some());
    assert_eq!(post_check(service.addr, &one_check()).status, 200);
}

#[test]
fn readyz_turns_503_within_a_second_of_redis_freezing() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    redis.freeze();
    let down_after = until_readyz(service.addr, 503);
    redis.thaw();
    assert!(down_after < WITHIN, "503 after {down_after:?}");
    let up_after = until_readyz(service.addr, 200);
    assert!(up_after < WITHIN, "200 after {up_after:?}");
}

#[test]
fn a_service_started_with_redis_down_serves_healthz_fails_checks_fast_and_decides_once_redis_is_up()
{
    let mut redis = RedisServer::start();
    redis.stop();
    let service = Service::spawn(&["--redis", &redis.url()], &[]);
    assert_eq!(get(service.addr, "/healthz").status, 200);
    let ready = get(service.addr, "/readyz");
    assert_eq!(ready.status, 503, "{ready:?}");
    assert_eq!(ready.json()["error"], "redis_unavailable");
    for _ in 0..3 {
        let started = Instant::now();
        let response = post_check(service.addr, &one_check());
        assert_eq!(response.status, 503, "{response:?}");
        assert_eq!(response.json()["error"], "redis_unavailable");
        assert!(started.elapsed() < WITHIN, "took {:?}", started.elapsed());
    }

    redis.restart();
    let up_after = until_readyz(service.addr, 200);
    assert!(up_after < WITHIN, "200 after {up_after:?}");
    let response = post_check(service.addr, &one_check());
    assert_eq!(response.status, 200, "{response:?}");
    assert_eq!(response.json()["results"][0]["remaining"], 4);
}

#[test]
fn a_service_whose_cluster_seeds_are_down_at_start_serves_and_fails_checks_fast() {
    let mut seed = RedisServer::start();
    seed.stop();
    let service = Service::spawn(&["--redis-cluster", &seed.url()], &[]);
    assert_eq!(get(service.addr, "/healthz").status, 200);
    assert_eq!(get(service.addr, "/readyz").status, 503);
    let started = Instant::now();
    let response = post_check(service.addr, &one_check());
    assert_eq!(response.status, 503, "{response:?}");
    assert!(started.elapsed() < WITHIN, "took {:?}", started.elapsed());
}
