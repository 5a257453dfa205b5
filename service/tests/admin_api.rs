//! The admin API (`/admin/v1/...`, issue 34) on the real service, over a real Redis and over
//! memory: its tokens (401 without one, 403 for a write with a read-only one, 404 when it is not
//! served), a key shown, reset and credited once, overrides set, listed, applied on every
//! replica, expired and deleted, every write audited, and hostile input refused naming the field.
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

/// Checks of `name`'s default limit (a bucket of 5, 1 a minute) until one is denied: how many
/// were allowed, up to `most`.
fn allowed(service: &Service, name: &str, most: u64) -> u64 {
    for n in 0..most {
        let result = &service.check(&[bucket(name, 1, 60_000, 5, 1, 1)])[0];
        if result["allowed"] != true {
            return n;
        }
    }
    most
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
    for path in [
        "/admin/v1/nothing",
        "/admin/v1/keys/show/",
        "/admin/v1/KEYS/show",
        "/admin/v1/keys/show%2F",
        "/admin//v1/keys/show",
        "/admin/v1/keys/../keys/show",
        "/admin/v2/keys/show",
    ] {
        let response = call(addr, "POST", path, Some("rEad-token"), "{}");
        assert_eq!(response.status, 404, "{path}: {response:?}");
        assert!(response.json()["detail"].as_str().unwrap().len() <= path.len());
    }
    // A query string is not part of the path.
    let shown = call(
        addr,
        "POST",
        "/admin/v1/keys/show?x=1",
        Some("rEad-token"),
        &key("a/b").to_string(),
    );
    assert_eq!(shown.status, 200, "{shown:?}");
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

fn set_override(service: &Service, name: &str, burst: u64, extra: Value) -> Response {
    let body = with(
        json!({"key": name, "requests": 1, "per_ms": 60_000, "burst": burst,
               "owner": "accounts@example.com", "reason": "premium plan"}),
        extra,
    );
    post(service.addr, "/admin/v1/overrides", "adm1n-token", &body)
}

#[test]
fn an_override_applies_at_once_on_every_replica_survives_a_restart_and_is_deleted() {
    let redis = RedisServer::start();
    let dir = TempDir::new("admin-overrides");
    let a = start(&["--redis", &redis.url()], &dir);
    let b = start(&["--redis", &redis.url()], &dir);
    let done = set_override(&a, "api/premium", 20, json!({}));
    assert_eq!(done.status, 200, "{done:?}");
    let audit = a.event("admin write", Duration::from_secs(5)).unwrap();
    assert_eq!(audit["action"], "overrides.set", "{audit}");
    assert_eq!(audit["who"], "alice", "{audit}");
    // At once on the replica that took it; within the refresh (1 s) on the other.
    assert_eq!(allowed(&a, "api/premium", 30), 20);
    std::thread::sleep(Duration::from_millis(1500));
    let listed = call(b.addr, "GET", "/admin/v1/overrides", Some("rEad-token"), "").json();
    let o = &listed["overrides"][0];
    assert_eq!(o["key"], "api/premium", "{listed}");
    assert_eq!(o["burst"], 20, "{listed}");
    assert_eq!(o["owner"], "accounts@example.com", "{listed}");
    assert_eq!(o["set_by"], "alice", "{listed}");
    assert_eq!(listed["max"], 10_000, "{listed}");
    // b shares a's state under the override: nothing left.
    assert_eq!(allowed(&b, "api/premium", 30), 0);
    // Other keys keep the default.
    assert_eq!(allowed(&b, "api/basic", 30), 5);
    // A read-only token lists, never sets.
    let body = json!({"key": "api/x", "requests": 1, "per_ms": 1000, "burst": 1, "owner": "o", "reason": "r"});
    assert_eq!(
        post(b.addr, "/admin/v1/overrides", "rEad-token", &body).status,
        403
    );

    // Kept in Redis: a new replica applies it from its start.
    drop(a);
    let c = start(&["--redis", &redis.url()], &dir);
    std::thread::sleep(Duration::from_millis(200));
    let listed = call(c.addr, "GET", "/admin/v1/overrides", Some("rEad-token"), "").json();
    assert_eq!(listed["overrides"].as_array().unwrap().len(), 1, "{listed}");

    let delete = json!({"key": "api/premium", "reason": "plan cancelled"});
    let done = post(c.addr, "/admin/v1/overrides/delete", "adm1n-token", &delete);
    assert_eq!(done.json()["outcome"], "done", "{done:?}");
    let again = post(c.addr, "/admin/v1/overrides/delete", "adm1n-token", &delete);
    assert_eq!(again.json()["outcome"], "unchanged", "{again:?}");
    // The default applies again at once, to the same state: the 20 used are still used.
    assert_eq!(allowed(&c, "api/premium", 30), 0);
}

/// More overrides than one page of the read (1,000): a replica reads every one, and one set
/// through the API among them applies.
#[test]
fn a_replica_reads_overrides_of_many_pages() {
    let redis = RedisServer::start();
    let dir = TempDir::new("admin-overrides-pages");
    let max = ["--max-overrides", "5000"];
    let a = start(&[&["--redis", &redis.url()][..], &max].concat(), &dir);
    assert_eq!(set_override(&a, "api/premium", 20, json!({})).status, 200);
    let stored = redis
        .client()
        .cmd(&["HGETALL", "sluice:admin:overrides"])
        .texts();
    let (name, value) = stored
        .chunks(2)
        .find(|pair| pair[0] != "#version")
        .map(|pair| (pair[0].clone(), pair[1].clone()))
        .unwrap();
    let mut command = vec!["HSET".to_string(), "sluice:admin:overrides".to_string()];
    for n in 0..2_499 {
        let other = format!("api/tenant-{n}");
        command.push(name.replace("api/premium", &other));
        command.push(value.replace("api/premium", &other));
    }
    let command: Vec<&str> = command.iter().map(String::as_str).collect();
    redis.client().cmd(&command);

    let b = start(&[&["--redis", &redis.url()][..], &max].concat(), &dir);
    std::thread::sleep(Duration::from_millis(300));
    let listed = call(b.addr, "GET", "/admin/v1/overrides", Some("rEad-token"), "").json();
    assert_eq!(listed["overrides"].as_array().unwrap().len(), 2_500);
    assert_eq!(allowed(&b, "api/premium", 30), 20);
}

#[test]
fn an_override_stops_applying_when_it_expires() {
    let dir = TempDir::new("admin-expiry");
    let service = start(&["--memory"], &dir);
    let done = set_override(&service, "api/trial", 1, json!({"expires_in_ms": 1000}));
    assert_eq!(done.status, 200, "{done:?}");
    assert_eq!(allowed(&service, "api/trial", 10), 1);
    std::thread::sleep(Duration::from_millis(1200));
    // The default again, the one token used still counted.
    assert_eq!(allowed(&service, "api/trial", 10), 4);
    let listed = call(
        service.addr,
        "GET",
        "/admin/v1/overrides",
        Some("adm1n-token"),
        "",
    )
    .json();
    assert_eq!(listed["overrides"], json!([]), "{listed}");
}

#[test]
fn at_the_bound_a_new_override_is_refused_and_a_replaced_one_is_not() {
    let dir = TempDir::new("admin-bound");
    let admin = dir.path().join("admin");
    std::fs::write(&admin, ADMIN).unwrap();
    let args = [
        "--memory",
        "--max-overrides",
        "2",
        "--admin-token-file",
        admin.to_str().unwrap(),
    ];
    let service = Service::start_with(&args, &[]);
    assert_eq!(set_override(&service, "api/one", 10, json!({})).status, 200);
    assert_eq!(set_override(&service, "api/two", 10, json!({})).status, 200);
    let refused = set_override(&service, "api/three", 10, json!({}));
    assert_eq!(refused.status, 409, "{refused:?}");
    assert_eq!(refused.json()["error"], "too_many_overrides");
    let audits: Vec<Value> = (0..3)
        .filter_map(|_| service.event("admin write", Duration::from_secs(5)))
        .collect();
    let audit = audits.last().unwrap().clone();
    assert_eq!(audit["outcome"], "refused", "{audit}");
    assert_eq!(set_override(&service, "api/two", 12, json!({})).status, 200);
    assert_eq!(allowed(&service, "api/two", 30), 12);
}

#[test]
fn hostile_overrides_are_refused_naming_the_field() {
    let dir = TempDir::new("admin-hostile-overrides");
    let service = start(&["--memory"], &dir);
    let cases: Vec<(Value, &str)> = vec![
        (json!({"owner": null}), "owner: required"),
        (json!({"owner": "o".repeat(201)}), "owner:"),
        (json!({"owner": "a\u{1b}[31m"}), "owner:"),
        (json!({"reason": null}), "reason: required"),
        (json!({"requests": null}), "requests: required"),
        (json!({"burst": 0}), "burst:"),
        (json!({"expires_in_ms": 10}), "expires_in_ms: 10 is not in"),
        (json!({"expires_in_ms": u64::MAX}), "expires_in_ms:"),
        (json!({"key": "api/{x}"}), "key: character"),
        (
            json!({"namespace": "redis"}),
            "namespace: must be http or rls",
        ),
        (json!({"set_by": "mallory"}), "unknown field `set_by`"),
    ];
    for (extra, expected) in cases {
        let mut body = json!({"key": "api/h", "requests": 1, "per_ms": 60_000, "burst": 5,
                              "owner": "o", "reason": "r"});
        for (name, value) in extra.as_object().unwrap() {
            if value.is_null() {
                body.as_object_mut().unwrap().remove(name);
            } else {
                body[name] = value.clone();
            }
        }
        let response = post(service.addr, "/admin/v1/overrides", "adm1n-token", &body);
        assert_eq!(response.status, 400, "{body}: {response:?}");
        let detail = response.json()["detail"].as_str().unwrap().to_string();
        assert!(
            detail.contains(expected),
            "{body}: {detail:?} lacks {expected:?}"
        );
    }
    let delete = json!({"key": "api/h", "reason": "r", "burst": 3});
    let response = post(
        service.addr,
        "/admin/v1/overrides/delete",
        "adm1n-token",
        &delete,
    );
    assert!(
        response.json()["detail"]
            .as_str()
            .unwrap()
            .starts_with("burst: not taken"),
        "{response:?}"
    );
    let listed = call(
        service.addr,
        "GET",
        "/admin/v1/overrides",
        Some("adm1n-token"),
        "",
    )
    .json();
    assert_eq!(listed["overrides"], json!([]), "{listed}");
}

/// Charges `tokens` to the limit `limit` (the key may owe up to `max_debt` past it).
fn charge(service: &Service, limit: &Value, tokens: u64, max_debt: u64) {
    let settlement = with(
        limit.clone(),
        json!({"op": "charge", "tokens": tokens, "max_debt": max_debt}),
    );
    let body = json!({"settlements": [settlement]}).to_string();
    let response = sluice_testkit::http::post_json(service.addr, "/v1/settle", &body);
    assert_eq!(response.status, 200, "{response:?}");
}

fn raising_a_limit_keeps_the_usage_so_far(store: &[&str], name: &str) {
    let dir = TempDir::new(name);
    let service = start(store, &dir);
    // 1,500 used of 1,000: a token bucket (refilling one token per 36 s, too slow to matter
    // here) and a fixed window of 10 hours.
    let bucket = json!({"key": "api/bucket", "algorithm": "token_bucket", "requests": 1000, "per_ms": 36_000_000, "burst": 1000});
    let window = json!({"key": "api/window", "algorithm": "fixed_window", "requests": 1000, "per_ms": 36_000_000, "burst": 1000});
    for limit in [&bucket, &window] {
        charge(&service, limit, 1500, 500);
        let shown = post(service.addr, "/admin/v1/keys/show", "rEad-token", limit).json();
        assert_eq!(
            (shown["remaining"].clone(), shown["source"].clone()),
            (json!(0), json!("request")),
            "{shown}"
        );
        assert_eq!(shown["debt"], 500, "{shown}");
    }
    // Raised to 2,000 (the bucket at the same rate per token): 500 left, not 2,000 and not 0.
    let raised = [
        with(
            bucket.clone(),
            json!({"requests": 2000, "per_ms": 72_000_000, "burst": 2000}),
        ),
        with(window.clone(), json!({"requests": 2000, "burst": 2000})),
    ];
    for (limit, raised) in [(&bucket, &raised[0]), (&window, &raised[1])] {
        let body = with(raised.clone(), json!({"owner": "o", "reason": "upgrade"}));
        assert_eq!(
            post(service.addr, "/admin/v1/overrides", "adm1n-token", &body).status,
            200
        );
        let shown = post(service.addr, "/admin/v1/keys/show", "rEad-token", limit).json();
        assert_eq!(shown["source"], "override", "{shown}");
        assert_eq!(shown["capacity"], 2000, "{shown}");
        assert_eq!(shown["remaining"], 500, "{shown}");
        assert_eq!(shown["debt"], 0, "{shown}");
        let mut check = with(limit.clone(), json!({"cost": 500}));
        let results = service.check(std::slice::from_ref(&check));
        assert_eq!(results[0]["allowed"], true, "{results:?}");
        check["cost"] = 1.into();
        assert_eq!(service.check(&[check])[0]["allowed"], false);
    }
    // Lowered to 1,200: 2,000 used, nothing left.
    let lowered = with(
        window.clone(),
        json!({"requests": 1200, "burst": 1200, "owner": "o", "reason": "downgrade"}),
    );
    assert_eq!(
        post(service.addr, "/admin/v1/overrides", "adm1n-token", &lowered).status,
        200
    );
    let shown = post(service.addr, "/admin/v1/keys/show", "rEad-token", &window).json();
    assert_eq!(
        (shown["capacity"].clone(), shown["remaining"].clone()),
        (json!(1200), json!(0)),
        "{shown}"
    );
    assert_eq!(shown["debt"], 800, "{shown}");
}

#[test]
fn raising_a_limit_by_override_keeps_the_usage_so_far_on_redis() {
    let redis = RedisServer::start();
    raising_a_limit_keeps_the_usage_so_far(&["--redis", &redis.url()], "admin-raise-redis");
}

#[test]
fn raising_a_limit_by_override_keeps_the_usage_so_far_in_memory() {
    raising_a_limit_keeps_the_usage_so_far(&["--memory"], "admin-raise-memory");
}

#[test]
fn the_admin_tokens_and_the_check_token_open_nothing_of_each_other() {
    let dir = TempDir::new("admin-apart");
    let (admin, check) = (dir.path().join("admin"), dir.path().join("check"));
    std::fs::write(&admin, "adm1n-token\n").unwrap();
    std::fs::write(&check, "ch3ck-token\n").unwrap();
    let args = [
        "--memory",
        "--token-file",
        check.to_str().unwrap(),
        "--admin-token-file",
        admin.to_str().unwrap(),
    ];
    let service = Service::start_with(&args, &[]);
    let shown = post(
        service.addr,
        "/admin/v1/keys/show",
        "ch3ck-token",
        &key("api/a"),
    );
    assert_eq!(shown.status, 401, "{shown:?}");
    let body = json!({"checks": [bucket("api/a", 1, 60_000, 5, 1, 1)]}).to_string();
    let checked = call(
        service.addr,
        "POST",
        "/v1/check",
        Some("adm1n-token"),
        &body,
    );
    assert_eq!(checked.status, 401, "{checked:?}");
    assert_eq!(
        call(
            service.addr,
            "POST",
            "/v1/check",
            Some("ch3ck-token"),
            &body
        )
        .status,
        200
    );
}

#[test]
fn every_algorithm_is_shown_with_its_debt_or_slots_and_never_charged() {
    let redis = RedisServer::start();
    let dir = TempDir::new("admin-every");
    let service = start(&["--redis", &redis.url()], &dir);
    let limits = [
        json!({"key": "e/tb", "algorithm": "token_bucket", "requests": 3, "per_ms": 60_000, "burst": 3}),
        json!({"key": "e/fw", "algorithm": "fixed_window", "requests": 3, "per_ms": 60_000, "burst": 3}),
        json!({"key": "e/sw", "algorithm": "sliding_window", "requests": 3, "per_ms": 60_000, "burst": 3}),
        json!({"key": "e/sl", "algorithm": "sliding_log", "requests": 3, "per_ms": 60_000, "burst": 3}),
        json!({"key": "e/lb", "algorithm": "leaky_bucket", "requests": 3, "per_ms": 60_000, "burst": 3, "max_delay_ms": 40_000}),
        json!({"key": "e/cc", "algorithm": "concurrency", "requests": 3, "per_ms": 60_000, "burst": 3}),
    ];
    let show = |limit: &Value| {
        let shown = post(service.addr, "/admin/v1/keys/show", "rEad-token", limit);
        assert_eq!(shown.status, 200, "{limit}: {shown:?}");
        shown.json()
    };
    for limit in &limits {
        for _ in 0..3 {
            let shown = show(limit);
            assert_eq!(shown["remaining"], 3, "{limit}: {shown}");
            // A debt where one can be owed, slots for concurrency: none yet.
            let (owes, slots) = match limit["algorithm"].as_str().unwrap() {
                "token_bucket" | "fixed_window" | "sliding_window" => (json!(0), Value::Null),
                "concurrency" => (Value::Null, json!(0)),
                _ => (Value::Null, Value::Null),
            };
            assert_eq!(
                (&shown["debt"], &shown["slots_in_use"]),
                (&owes, &slots),
                "{shown}"
            );
        }
    }
    // 5 charged of 3, 2 of them owed: shown as debt, for each algorithm that owes.
    for limit in &limits[..3] {
        charge(&service, limit, 5, 2);
        let shown = show(limit);
        assert_eq!(
            (&shown["remaining"], &shown["debt"]),
            (&json!(0), &json!(2)),
            "{shown}"
        );
    }
    // Two slots taken: two in use, one left.
    for n in 1..=2u64 {
        let take = with(
            limits[5].clone(),
            json!({"cost": 1, "take": 1, "slot": format!("{n:016x}")}),
        );
        assert_eq!(service.check(&[take])[0]["allowed"], true);
    }
    let shown = show(&limits[5]);
    assert_eq!(
        (&shown["remaining"], &shown["slots_in_use"]),
        (&json!(1), &json!(2)),
        "{shown}"
    );
    // No RLQS on this replica: nothing to show of it.
    let rlqs = call(
        service.addr,
        "GET",
        "/admin/v1/rlqs",
        Some("rEad-token"),
        "",
    );
    assert_eq!(rlqs.status, 404, "{rlqs:?}");
}

#[test]
fn a_rotated_admin_token_file_takes_effect_on_sighup() {
    let dir = TempDir::new("admin-rotate");
    let service = start(&["--memory"], &dir);
    let admin = dir.path().join("admin");
    let shown = |token: &str| post(service.addr, "/admin/v1/keys/show", token, &key("a/b")).status;
    assert_eq!(shown("adm1n-token"), 200);
    std::fs::write(&admin, "bob n3w-token\n").unwrap();
    service.signal(sluice_testkit::SIGHUP);
    let reloaded = service.event("admin token file reloaded", Duration::from_secs(5));
    assert_eq!(reloaded.unwrap()["tokens"], 1);
    assert_eq!(shown("adm1n-token"), 401);
    assert_eq!(shown("n3w-token"), 200);
    // A file that became malformed keeps the tokens read before.
    std::fs::write(&admin, "a b c\n").unwrap();
    service.signal(sluice_testkit::SIGHUP);
    let kept = service.event(
        "admin token file not reloaded: keeping the tokens read before",
        Duration::from_secs(5),
    );
    assert!(kept.unwrap()["error"]
        .as_str()
        .unwrap()
        .starts_with("line 1"));
    assert_eq!(shown("n3w-token"), 200);
}

#[test]
fn the_filters_listing_takes_the_check_token_and_costs_a_304_while_nothing_changed() {
    let dir = TempDir::new("admin-listing");
    let (admin, check) = (dir.path().join("admin"), dir.path().join("check"));
    std::fs::write(&admin, "adm1n-token\n").unwrap();
    std::fs::write(&check, "ch3ck-token\n").unwrap();
    let args = [
        "--memory",
        "--token-file",
        check.to_str().unwrap(),
        "--admin-token-file",
        admin.to_str().unwrap(),
    ];
    let service = Service::start_with(&args, &[]);
    let list = |token: &str, version: Option<&str>| {
        let authorization = format!("Bearer {token}");
        let mut headers: Vec<(&str, &[u8])> = vec![("authorization", authorization.as_bytes())];
        if let Some(version) = version {
            headers.push(("if-none-match", version.as_bytes()));
        }
        send_with(service.addr, "GET", "/v1/overrides", &headers, b"")
    };
    assert_eq!(
        list("adm1n-token", None).status,
        401,
        "the filters' token only"
    );
    let empty = list("ch3ck-token", None);
    assert_eq!(empty.status, 200, "{empty:?}");
    assert_eq!(empty.json()["overrides"], json!([]), "{empty:?}");
    let body = json!({"key": "api/5c0f4b1de6a2b3c4", "requests": 100, "per_ms": 60_000,
        "burst": 100, "owner": "accounts", "reason": "premium plan", "expires_in_ms": 60_000});
    assert_eq!(
        post(service.addr, "/admin/v1/overrides", "adm1n-token", &body).status,
        200
    );
    let listed = list("ch3ck-token", None);
    let json = listed.json();
    assert_eq!(json["overrides"].as_array().unwrap().len(), 1, "{json}");
    let o = &json["overrides"][0];
    assert_eq!(
        (o["key"].as_str(), o["requests"].as_u64()),
        (Some("api/5c0f4b1de6a2b3c4"), Some(100))
    );
    assert!(o["expires_at_ms"].as_u64().is_some(), "{json}");
    assert!(
        o.get("owner").is_none(),
        "no owner, reason or author: {json}"
    );
    let version = json["version"].as_str().unwrap().to_string();
    assert_ne!(Some(version.as_str()), empty.json()["version"].as_str());
    let unchanged = list("ch3ck-token", Some(&version));
    assert_eq!(unchanged.status, 304, "{unchanged:?}");
    assert!(unchanged.body.is_empty());
    // Another version held: the whole listing.
    assert_eq!(list("ch3ck-token", Some("\"0\"")).status, 200);
}

/// A filter's call with who it is (`sluice::remote::announce`), as `token` would send it.
fn announce(addr: SocketAddr, token: Option<&[u8]>, said: [&[u8]; 3]) -> u16 {
    let bearer = token.map(|t| [b"Bearer ".as_slice(), t].concat());
    let mut headers: Vec<(&str, &[u8])> = vec![
        ("content-type", b"application/json"),
        ("x-sluice-envoy", said[0]),
        ("x-sluice-worker", said[1]),
        ("x-sluice-dropped", said[2]),
    ];
    headers.extend(bearer.as_deref().map(|b| ("authorization", b)));
    let body = json!({"checks": [bucket("api/fleet", 1, 60_000, 5, 1, 1)]}).to_string();
    send_with(addr, "POST", "/v1/check", &headers, body.as_bytes()).status
}

#[test]
fn the_envoys_that_call_are_listed_only_from_calls_with_the_services_token() {
    let dir = TempDir::new("admin-envoys");
    let token = dir.path().join("token");
    std::fs::write(&token, "s3rvice-token\n").unwrap();
    let service = start(&["--memory", "--token-file", token.to_str().unwrap()], &dir);
    let worker: &[u8] = b"00000000000000b1";
    assert_eq!(
        announce(service.addr, None, [b"intruder", worker, b"1"]),
        401
    );
    let wrong = Some(b"guess".as_slice());
    assert_eq!(
        announce(service.addr, wrong, [b"intruder", worker, b"1"]),
        401
    );
    let right = Some(b"s3rvice-token".as_slice());
    for said in [
        [b"edge-1".as_slice(), worker, b"4"],
        [b"edge-1", b"00000000000000b2", b"1"],
        [b"edge 2", worker, b"1"],
        [b"edge-3", b"B1", b"1"],
        [b"edge-4", worker, b"many"],
    ] {
        assert_eq!(
            announce(service.addr, right, said),
            200,
            "a check all the same"
        );
    }
    assert_eq!(
        call(service.addr, "GET", "/admin/v1/envoys", None, "").status,
        401
    );
    let fleet = call(
        service.addr,
        "GET",
        "/admin/v1/envoys",
        Some("rEad-token"),
        "",
    )
    .json();
    assert_eq!(fleet["called_last_minute"], 1, "{fleet}");
    assert_eq!(fleet["settlements_dropped"], 5, "{fleet}");
    assert_eq!(fleet["envoys"][0]["envoy"], "edge-1", "{fleet}");
    assert_eq!(fleet["envoys"][0]["workers"], 2, "{fleet}");
    assert_eq!(fleet["max_envoys"], 10_000, "{fleet}");
}
