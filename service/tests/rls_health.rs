//! The gRPC health service on the RLS port, asked by a grpcio client as `grpc_health_probe`
//! asks it: SERVING while Redis answers, NOT_SERVING within a couple of seconds of Redis
//! stopping and SERVING again after it restarts, `Watch` streaming each change, an unknown
//! service name NOT_FOUND, and no token asked even where RLS calls need one.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "rls/client.rs"]
mod rls;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rls::Rls;
use sluice_testkit::grpc::{health_check, HealthWatch};
use sluice_testkit::redis::RedisServer;

const RLS_SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";
const LIMITS: &str =
    "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 3}\n";

/// How long `service`'s status takes to become `expected`, asked every 100 ms for at most
/// `within`; `None` if it never does.
fn becomes(
    address: SocketAddr,
    service: &str,
    expected: &str,
    within: Duration,
) -> Option<Duration> {
    let started = Instant::now();
    for _ in 0..200 {
        if health_check(address, service) == expected {
            return Some(started.elapsed());
        }
        if started.elapsed() > within {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

#[test]
fn health_follows_redis_for_the_server_and_the_rls_and_a_watch_sees_each_change() {
    let mut redis = RedisServer::start();
    let dir = sluice_testkit::TempDir::new("rls-health-token");
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-Token_1\n").unwrap();
    let rls = Rls::start(
        &["--redis", &redis.url()],
        LIMITS,
        &["--token-file", token.to_str().unwrap()],
    );
    let address = rls.service.rls.unwrap();
    let limit = Duration::from_secs(5);
    for service in ["", RLS_SERVICE] {
        assert!(
            becomes(address, service, "SERVING", limit).is_some(),
            "{service:?}"
        );
    }
    assert_eq!(health_check(address, "some.other.Service"), "NOT_FOUND");
    let watch = HealthWatch::start(address, "", 30);
    assert_eq!(watch.next(limit).as_deref(), Some("SERVING"));

    redis.stop();
    let down = becomes(address, RLS_SERVICE, "NOT_SERVING", limit);
    let down = down.expect("NOT_SERVING once Redis stopped");
    assert!(down < Duration::from_secs(3), "NOT_SERVING after {down:?}");
    assert_eq!(health_check(address, ""), "NOT_SERVING");
    assert_eq!(watch.next(limit).as_deref(), Some("NOT_SERVING"));

    redis.restart();
    let up = becomes(address, RLS_SERVICE, "SERVING", limit).expect("SERVING again");
    assert!(up < Duration::from_secs(3), "SERVING after {up:?}");
    assert_eq!(watch.next(limit).as_deref(), Some("SERVING"));
}

#[test]
fn a_watch_of_an_unknown_service_says_so_and_stays_open() {
    let redis = RedisServer::start();
    let rls = Rls::start(&["--redis", &redis.url()], LIMITS, &[]);
    let address = rls.service.rls.unwrap();
    let watch = HealthWatch::start(address, "some.other.Service", 30);
    let limit = Duration::from_secs(5);
    assert_eq!(watch.next(limit).as_deref(), Some("SERVICE_UNKNOWN"));
    assert_eq!(
        watch.next(Duration::from_millis(500)),
        None,
        "no end, no error"
    );
}
