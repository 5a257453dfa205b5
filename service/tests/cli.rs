//! The binary itself: --help, the readiness line, environment variables, start-up failures
//! and a clean stop on SIGTERM.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use sluice_testkit::free_port;
use sluice_testkit::http::get;
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::{run_to_exit, Service};

#[test]
fn help_documents_every_option_and_its_environment_variable() {
    let (status, stdout, _) = run_to_exit(&["--help"], &[], Duration::from_secs(10));
    assert!(status.success());
    for text in [
        "--listen",
        "--redis <URL>",
        "--redis-cluster <URLS>",
        "SLUICE_LISTEN",
        "SLUICE_REDIS=",
        "SLUICE_REDIS_CLUSTER",
        "comma-separated",
    ] {
        assert!(stdout.contains(text), "--help lacks {text:?}:\n{stdout}");
    }
}

#[test]
fn the_readiness_line_names_the_address_and_redis() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let expected = format!(
        "sluice-service listening on {}, redis {}",
        service.addr,
        redis.url()
    );
    assert_eq!(service.ready_line, expected);
    assert_eq!(get(service.addr, "/healthz").status, 200);
}

#[test]
fn environment_variables_configure_listen_and_redis() {
    let redis = RedisServer::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let service = Service::start_with(
        &[],
        &[("SLUICE_LISTEN", &listen), ("SLUICE_REDIS", &redis.url())],
    );
    assert_eq!(service.addr.to_string(), listen);
    assert_eq!(get(service.addr, "/healthz").status, 200);
}

#[test]
fn an_unreachable_redis_at_start_exits_non_zero_with_a_clear_message() {
    let nobody = format!("redis://127.0.0.1:{}", free_port());
    let started = Instant::now();
    let (status, _, stderr) = run_to_exit(
        &["--listen", "127.0.0.1:0", "--redis", &nobody],
        &[],
        Duration::from_secs(10),
    );
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("sluice-service: cannot reach Redis at {nobody}")),
        "{stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn an_unreachable_cluster_at_start_exits_non_zero() {
    let nobody = format!("redis://127.0.0.1:{}", free_port());
    let (status, _, stderr) = run_to_exit(
        &["--listen", "127.0.0.1:0", "--redis-cluster", &nobody],
        &[],
        Duration::from_secs(10),
    );
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot reach Redis at cluster "),
        "{stderr}"
    );
}

#[test]
fn redis_is_required_and_only_one_kind() {
    let (status, _, stderr) =
        run_to_exit(&["--listen", "127.0.0.1:0"], &[], Duration::from_secs(10));
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--redis"), "{stderr}");
    let both = [
        "--redis",
        "redis://127.0.0.1:1",
        "--redis-cluster",
        "redis://127.0.0.1:2",
    ];
    let (status, _, stderr) = run_to_exit(&both, &[], Duration::from_secs(10));
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

#[test]
fn sigterm_stops_the_service_cleanly() {
    let redis = RedisServer::start();
    let mut service = Service::start(&redis.url());
    let term = Command::new("kill")
        .args(["-TERM", &service.pid().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let status = service
        .wait_exit(Duration::from_secs(5))
        .expect("still running 5 s after SIGTERM");
    assert!(status.success(), "{status:?}");
    assert_eq!(
        service.next_line(Duration::from_secs(1)).as_deref(),
        Some("sluice-service: stopped")
    );
}
