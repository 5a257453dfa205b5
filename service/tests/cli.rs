//! The binary itself: --help, the JSON log lines, environment variables and start-up failures.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::time::Duration;

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
        "--token-file <PATH>",
        "SLUICE_TOKEN_FILE",
        "--log <FILTER>",
        "SLUICE_LOG",
        "[default: info]",
        "--shutdown-delay <SECONDS>",
        "SLUICE_SHUTDOWN_DELAY",
        "--shutdown-timeout <SECONDS>",
        "SLUICE_SHUTDOWN_TIMEOUT",
        "[default: 5]",
        "--rlqs <ADDR>",
        "SLUICE_RLQS",
    ] {
        assert!(stdout.contains(text), "--help lacks {text:?}:\n{stdout}");
    }
}

#[test]
fn the_listening_event_is_a_json_line_naming_the_address_and_the_store() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let listening = &service.listening;
    assert_eq!(listening["level"], "INFO", "{listening}");
    assert_eq!(
        listening["address"],
        service.addr.to_string(),
        "{listening}"
    );
    assert_eq!(listening["store"], redis.url(), "{listening}");
    assert_eq!(listening["token"], false, "{listening}");
    assert!(listening["timestamp"].is_string(), "{listening}");
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
fn a_malformed_redis_url_stops_the_start_with_a_clear_message() {
    let (status, _, stderr) = run_to_exit(
        &["--listen", "127.0.0.1:0", "--redis", "htp://127.0.0.1:6379"],
        &[],
        Duration::from_secs(10),
    );
    assert_eq!(status.code(), Some(1), "{stderr}");
    let event: serde_json::Value = serde_json::from_str(&stderr).unwrap();
    assert_eq!(event["level"], "ERROR", "{stderr}");
    assert_eq!(event["message"], "sluice-service cannot start", "{stderr}");
    let error = event["error"].as_str().unwrap();
    assert!(error.starts_with("htp://127.0.0.1:6379: "), "{error}");
}

#[test]
fn a_log_filter_that_does_not_parse_is_a_usage_error() {
    let args = ["--redis", "redis://127.0.0.1:1", "--log", "info,[bad"];
    let (status, _, stderr) = run_to_exit(&args, &[], Duration::from_secs(10));
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--log <FILTER>"), "{stderr}");
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
