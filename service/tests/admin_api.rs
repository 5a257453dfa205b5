//! The admin API (`/admin/v1/...`, issue 34) on the real service, over a real Redis and over
//! memory: its tokens (401 without one, 403 for a write with a read-only one, 404 when it is not
//! served), a key shown, reset and credited once, every write audited, and hostile input refused
//! naming the field.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::bucket;
use serde_json::{json, Value};
use sluice_testkit::http::{get, send_with, Response};
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::Service;
use sluice_testkit::TempDir;

const ADMIN: &str = "alice adm1n-token\nci-bot adm1n-token-2\n";
const READ: &str = "rEad-token\n";

/// The service over `store` (`["--redis", url]` or `["--memory"]`) with both token files.
fn start(store: &[&str], dir: &TempDir) -> Service {
    let admin = dir.path().join("admin");
    let read = dir.path().join("read");
    std::fs::write(&admin, ADMIN).unwrap();
    std::fs::write(&read, READ).unwrap();
    let (admin, read) = (admin.to_str().unwrap(), read.to_str().unwrap());
    let mut args = store.to_vec();
    args.extend(["--admin-token-file", admin, "--read-token-file", read]);
    Service::start_with(&args, &[])
}

fn call(addr: SocketAddr, method: &str, path: &str, token: Option<&str>, body: &str) -> Response {
    let authorization = token.map(|t| format!("Bearer {t}"));
    let mut headers: Vec<(&str, &[u8])> = vec![("content-type", b"application/json")];
    if let Some(authorization) = &authorization {
        headers.push(("authorization", authorization.as_bytes()));
    }
    send_with(addr, method, path, &headers, body.as_bytes())
}

fn post(addr: SocketAddr, path: &str, token: &str, body: &Value) -> Response {
    call(addr, "POST", path, Some(token), &body.to_string())
}

/// A bucket of 5 refilled at 1 per minute: what is spent stays spent for the test's length.
fn key(name: &str) -> Value {
    json!({"key": name, "requests": 1, "per_ms": 60_000, "burst": 5})
}

fn with(mut body: Value, fields: Value) -> Value {
    for (name, value) in fields.as_object().unwrap() {
        body[name] = value.clone();
    }
    body
}

fn spend(service: &Service, name: &str, n: u64) {
    for _ in 0..n {
        service.check(&[bucket(name, 1, 60_000, 5, 1, 1)]);
    }
}

fn remaining(service: &Service, name: &str, token: &str) -> u64 {
    let shown = post(service.addr, "/admin/v1/keys/show", token, &key(name));
    assert_eq!(shown.status, 200, "{shown:?}");
    shown.json()["remaining"].as_u64().unwrap()
}

fn show_reset_and_credit(service: &Service) {
    let addr = service.addr;
    spend(service, "api/acme", 5);
    let shown = post(addr, "/admin/v1/keys/show", "rEad-token", &key("api/acme"));
    assert_eq!(shown.status, 200, "{shown:?}");
    let state = shown.json();
    assert_eq!(state["remaining"], 0, "{state}");
    assert_eq!(state["capacity"], 5, "{state}");
    assert_eq!(state["algorithm"], "token_bucket", "{state}");
    assert!(state["reset_ms"].as_u64().unwrap() > 290_000, "{state}");
    // Showing charges nothing.
    assert_eq!(remaining(service, "api/acme", "rEad-token"), 0);

    let reset = with(
        key("api/acme"),
        json!({"reason": "INC-42: acme refused by mistake"}),
    );
    let done = post(addr, "/admin/v1/keys/reset", "adm1n-token", &reset);
    assert_eq!(done.status, 200, "{done:?}");
    assert_eq!(done.json()["outcome"], "done", "{done:?}");
    let audit = service
        .event("admin write", Duration::from_secs(5))
        .expect("an audit line");
    assert_eq!(audit["who"], "alice", "{audit}");
    assert_eq!(audit["action"], "keys.reset", "{audit}");
    assert_eq!(
        audit["reason"], "INC-42: acme refused by mistake",
        "{audit}"
    );
    assert_eq!(audit["outcome"], "done", "{audit}");
    assert!(
        audit["state_key"].as_str().unwrap().contains("{api/acme}"),
        "{audit}"
    );
    assert_eq!(remaining(service, "api/acme", "adm1n-token"), 5);

    spend(service, "api/acme", 5);
    let credit = with(
        key("api/acme"),
        json!({"reason": "goodwill", "tokens": 2, "id": "00000000000000c1"}),
    );
    let done = post(addr, "/admin/v1/keys/credit", "adm1n-token-2", &credit);
    assert_eq!(done.json()["outcome"], "done", "{done:?}");
    let audit = service
        .event("admin write", Duration::from_secs(5))
        .expect("an audit line");
    assert_eq!(audit["who"], "ci-bot", "{audit}");
    assert_eq!(remaining(service, "api/acme", "rEad-token"), 2);
    // Delivered twice, applied once.
    let again = post(addr, "/admin/v1/keys/credit", "adm1n-token-2", &credit);
    assert_eq!(again.json()["outcome"], "duplicate", "{again:?}");
    assert_eq!(remaining(service, "api/acme", "rEad-token"), 2);

    // Resetting a key with no state changes nothing, and says so.
    let reset = with(key("api/nobody"), json!({"reason": "check"}));
    let done = post(addr, "/admin/v1/keys/reset", "adm1n-token", &reset);
    assert_eq!(done.json()["outcome"], "unchanged", "{done:?}");

    let metrics = get(addr, "/metrics").text();
    for line in [
        r#"sluice_service_admin_writes_total{action="keys.reset",outcome="done"} 1"#,
        r#"sluice_service_admin_writes_total{action="keys.reset",outcome="unchanged"} 1"#,
        r#"sluice_service_admin_writes_total{action="keys.credit",outcome="done"} 1"#,
        r#"sluice_service_admin_writes_total{action="keys.credit",outcome="unchanged"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
}

#[test]
fn a_key_is_shown_reset_and_credited_once_on_redis() {
    let redis = RedisServer::start();
    let dir = TempDir::new("admin-redis");
    let service = start(&["--redis", &redis.url()], &dir);
    show_reset_and_credit(&service);
}

#[test]
fn a_key_is_shown_reset_and_credited_once_in_memory() {
    let dir = TempDir::new("admin-memory");
    let service = start(&["--memory"], &dir);
    show_reset_and_credit(&service);
}

#[test]
fn without_a_token_every_admin_call_is_401_and_a_read_only_token_cannot_write() {
    let dir = TempDir::new("admin-auth");
    let service = start(&["--memory"], &dir);
    let addr = service.addr;
    let write = with(
        key("api/acme"),
        json!({"reason": "r", "tokens": 1, "id": "00000000000000aa"}),
    );
    let paths = [
        ("POST", "/admin/v1/keys/show"),
        ("POST", "/admin/v1/keys/reset"),
        ("POST", "/admin/v1/keys/credit"),
        ("GET", "/admin/v1/keys/show"),
        ("GET", "/admin/v1/nothing"),
        ("POST", "/admin/"),
    ];
    for (method, path) in paths {
        for token in [None, Some("wrong"), Some("adm1n-toke"), Some("alice")] {
            let response = call(addr, method, path, token, &write.to_string());
            assert_eq!(
                response.status, 401,
                "{method} {path} {token:?}: {response:?}"
            );
            assert_eq!(response.header("www-authenticate"), Some("Bearer"));
        }
    }
    for path in ["/admin/v1/keys/reset", "/admin/v1/keys/credit"] {
        let response = post(addr, path, "rEad-token", &write);
        assert_eq!(response.status, 403, "{path}: {response:?}");
        assert_eq!(response.json()["error"], "forbidden");
    }
    let response = call(addr, "GET", "/admin/v1/keys/show", Some("rEad-token"), "");
    assert_eq!(response.status, 405, "{response:?}");
    let response = call(addr, "POST", "/admin/v1/nothing", Some("rEad-token"), "{}");
    assert_eq!(response.status, 404, "{response:?}");
}

#[test]
fn without_an_admin_token_file_there_is_no_admin_api() {
    let service = Service::start_memory();
    let response = call(
        service.addr,
        "POST",
        "/admin/v1/keys/show",
        None,
        &key("a/b").to_string(),
    );
    assert_eq!(response.status, 404, "{response:?}");
}

#[test]
fn hostile_input_is_refused_naming_the_field_and_never_reaches_the_store() {
    let dir = TempDir::new("admin-hostile");
    let service = start(&["--memory"], &dir);
    let addr = service.addr;
    let long_reason = "x".repeat(501);
    let cases: Vec<(&str, Value, &str)> = vec![
        ("reset", key("api/acme"), "reason: required"),
        (
            "reset",
            with(key("api/acme"), json!({"reason": "  "})),
            "reason: must be 1 to 500 bytes",
        ),
        (
            "reset",
            with(key("api/acme"), json!({"reason": long_reason})),
            "reason: must be 1 to 500",
        ),
        (
            "reset",
            with(key("api/acme"), json!({"reason": "a\nfake log line"})),
            "reason: must hold no control",
        ),
        (
            "reset",
            with(key("api/acme"), json!({"reason": "r", "tokens": 1})),
            "tokens: not taken",
        ),
        (
            "show",
            with(key("api/acme"), json!({"reason": "r"})),
            "reason: not taken",
        ),
        (
            "show",
            with(key("api/acme"), json!({"extra": 1})),
            "unknown field `extra`",
        ),
        (
            "show",
            with(key("api/acme"), json!({"key": "a{b}"})),
            "key: character '{'",
        ),
        (
            "show",
            with(key("api/acme"), json!({"key": ""})),
            "key: must be 1 to 200",
        ),
        (
            "show",
            with(key("api/acme"), json!({"key": "k".repeat(201)})),
            "key: must be 1 to 200",
        ),
        (
            "show",
            with(key("api/acme"), json!({"namespace": "x".repeat(1000)})),
            "namespace: must be http or rls",
        ),
        (
            "show",
            with(key("api/acme"), json!({"requests": 0})),
            "requests: 0 is not in",
        ),
        (
            "show",
            with(key("api/acme"), json!({"per_ms": u64::MAX})),
            "per_ms:",
        ),
        (
            "show",
            with(key("api/acme"), json!({"requests": -1})),
            "requests:",
        ),
        (
            "show",
            with(key("api/acme"), json!({"algorithm": "nope"})),
            "algorithm:",
        ),
        (
            "credit",
            with(
                key("api/acme"),
                json!({"reason": "r", "id": "00000000000000aa"}),
            ),
            "tokens: required",
        ),
        (
            "credit",
            with(
                key("api/acme"),
                json!({"reason": "r", "tokens": 0, "id": "00000000000000aa"}),
            ),
            "tokens: 0 is not in",
        ),
        (
            "credit",
            with(
                key("api/acme"),
                json!({"reason": "r", "tokens": u64::MAX, "id": "00000000000000aa"}),
            ),
            "tokens:",
        ),
        (
            "credit",
            with(key("api/acme"), json!({"reason": "r", "tokens": 1})),
            "id: required",
        ),
        (
            "credit",
            with(
                key("api/acme"),
                json!({"reason": "r", "tokens": 1, "id": "../../etc"}),
            ),
            "id: must be 16",
        ),
        (
            "credit",
            json!({"key": "api/l", "algorithm": "sliding_log", "requests": 5, "per_ms": 1000, "burst": 5, "reason": "r", "tokens": 1, "id": "00000000000000aa"}),
            "algorithm: credit is only for",
        ),
    ];
    for (action, body, expected) in cases {
        let path = format!("/admin/v1/keys/{action}");
        let response = post(addr, &path, "adm1n-token", &body);
        assert_eq!(response.status, 400, "{path} {body}: {response:?}");
        let detail = response.json()["detail"].as_str().unwrap().to_string();
        assert!(
            detail.contains(expected),
            "{path} {body}: {detail:?} lacks {expected:?}"
        );
        assert!(
            detail.len() < 400,
            "an error echoes at most a little: {detail:?}"
        );
    }
    // Not JSON, too large, broken JSON.
    let headers: &[(&str, &[u8])] = &[
        ("authorization", b"Bearer adm1n-token"),
        ("content-type", b"text/plain"),
    ];
    let response = send_with(addr, "POST", "/admin/v1/keys/show", headers, b"{}");
    assert_eq!(response.status, 400);
    assert!(response.json()["detail"]
        .as_str()
        .unwrap()
        .starts_with("content-type"));
    let huge = format!(r#"{{"key":"a/b","reason":"{}"}}"#, "x".repeat(70_000));
    let response = call(
        addr,
        "POST",
        "/admin/v1/keys/reset",
        Some("adm1n-token"),
        &huge,
    );
    assert_eq!(response.status, 400);
    assert!(response.json()["detail"]
        .as_str()
        .unwrap()
        .starts_with("body: larger than"));
    let response = call(
        addr,
        "POST",
        "/admin/v1/keys/show",
        Some("adm1n-token"),
        "{\"key\":",
    );
    assert_eq!(response.status, 400);
    // Nothing was written: no audit line, no count.
    let metrics = get(addr, "/metrics").text();
    assert!(!metrics.contains("admin_writes_total{"), "{metrics}");
}
