//! The status path (`status_path`) in a real Envoy (two workers): a client asks for its own
//! quota and sees only its own keys, the numbers its requests' rate-limit headers give, and
//! asking changes nothing and reaches no upstream.

// Helpers report an unexpected response by panicking, as assertions do.
#![allow(clippy::panic, clippy::indexing_slicing)]

use serde_json::{json, Value};
use sluice_testkit::envoy::Envoy;
use sluice_testkit::http::{send_body, Response};
use sluice_testkit::llm::LlmUpstream;
use std::time::{SystemTime, UNIX_EPOCH};

const STATUS: &str = "/api/ratelimit/status";

fn config() -> String {
    json!({"headers": "legacy", "status_path": STATUS, "policies": [
        {"name": "per-user", "match": {"path_prefix": "/api/"}, "key": ["header:x-user-id"],
         "requests": 5, "per": "1h"},
        {"name": "per-user-daily", "match": {"path_prefix": "/api/"},
         "key": ["header:x-user-id"], "requests": 100, "per": "1d"},
    ]})
    .to_string()
}

fn user(id: &str) -> [(&str, &[u8]); 1] {
    [("x-user-id", id.as_bytes())]
}

fn now_secs() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    since.map(|d| d.as_secs()).unwrap_or_default()
}

/// The status of `who`: its policies by name.
fn status(envoy: &Envoy, headers: &[(&str, &[u8])]) -> Vec<Value> {
    let r = envoy.get(STATUS, headers);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    let body = r.json();
    body["policies"].as_array().cloned().unwrap_or_default()
}

fn header(r: &Response, name: &str) -> u64 {
    let value = r.header(name).unwrap_or_else(|| panic!("no {name}: {r:?}"));
    value
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {value}: {e}"))
}

#[test]
fn each_client_sees_its_own_quota_as_its_headers_give_it_and_asking_charges_nothing() {
    let upstream = LlmUpstream::start();
    let envoy = Envoy::options(&config()).upstream(upstream.addr()).start();
    let mut last = None;
    for _ in 0..3 {
        let r = envoy.get("/api/hello", &user("alice"));
        assert_eq!(r.status, 200, "{}", r.text());
        last = Some(r);
    }
    let last = last.unwrap_or_else(|| panic!("three requests"));
    assert_eq!(envoy.get("/api/hello", &user("bob")).status, 200);

    let alice = status(&envoy, &user("alice"));
    let names: Vec<&str> = alice.iter().filter_map(|p| p["policy"].as_str()).collect();
    assert_eq!(names, ["per-user", "per-user-daily"]);
    let per_user = &alice[0];
    assert_eq!(per_user["limit"], header(&last, "x-ratelimit-limit"));
    assert_eq!(
        per_user["remaining"],
        header(&last, "x-ratelimit-remaining")
    );
    assert_eq!(per_user["remaining"], 2);
    let reset_at = now_secs() + per_user["reset"].as_u64().unwrap_or_default();
    assert!(
        reset_at.abs_diff(header(&last, "x-ratelimit-reset")) <= 2,
        "reset {per_user} against {:?}",
        last.header("x-ratelimit-reset")
    );
    assert_eq!(
        (&per_user["unit"], &per_user["window"], &per_user["source"]),
        (&json!("requests"), &json!(3600), &json!("local"))
    );
    assert_eq!(alice[1]["remaining"], 97);

    // Asked again and again, over both workers' connections: nothing is charged.
    for _ in 0..10 {
        assert_eq!(status(&envoy, &user("alice")), alice);
    }
    let bob = status(&envoy, &user("bob"));
    assert_eq!(
        (&bob[0]["remaining"], &bob[1]["remaining"]),
        (&json!(4), &json!(99))
    );
    assert!(
        status(&envoy, &[]).is_empty(),
        "without a key no policy applies"
    );

    let head = envoy.request("HEAD", STATUS, &user("alice"));
    assert_eq!((head.status, head.body.len()), (200, 0));
    let post = envoy.request("POST", STATUS, &user("alice"));
    assert_eq!(
        (post.status, post.header("allow")),
        (405, Some("GET, HEAD"))
    );

    // Another spelling is an ordinary request: forwarded and charged.
    let query = format!("{STATUS}?user=bob");
    let forwarded = envoy.get(&query, &user("alice"));
    assert_eq!(header(&forwarded, "x-ratelimit-remaining"), 1);
    let next = envoy.get("/api/hello", &user("alice"));
    assert_eq!(
        header(&next, "x-ratelimit-remaining"),
        0,
        "the statuses charged nothing"
    );

    let paths: Vec<String> = upstream.calls().into_iter().map(|c| c.path).collect();
    assert_eq!(
        paths,
        [
            "/api/hello",
            "/api/hello",
            "/api/hello",
            "/api/hello",
            &query,
            "/api/hello"
        ],
        "no status request reached the upstream"
    );
}

/// A policy that reads the request body makes Envoy hold a request until its body comes: the
/// status path is answered from its headers all the same, body or not, and never charged.
#[test]
fn the_status_path_is_answered_from_the_headers_when_policies_read_bodies() {
    let upstream = LlmUpstream::start();
    let config = json!({"status_path": "/v1/ratelimit/status", "policies": [
        {"name": "per-model", "key": ["body:model"], "requests": 2, "per": "1h"},
        {"name": "per-user", "key": ["header:x-user-id"], "requests": 3, "per": "1h"},
    ]})
    .to_string();
    let envoy = Envoy::options(&config).upstream(upstream.addr()).start();
    let body = br#"{"model": "small", "messages": []}"#;
    for method in ["GET", "POST", "PUT"] {
        let r = send_body(
            envoy.addr(),
            method,
            "/v1/ratelimit/status",
            "application/json",
            body,
        );
        let expected = if method == "GET" { 200 } else { 405 };
        assert_eq!(r.status, expected, "{method}: {}", r.text());
        if method == "GET" {
            assert_eq!(
                r.json(),
                json!({"policies": []}),
                "no key: neither the body's (not read) nor x-user-id"
            );
        }
    }
    let asked = send_body(
        envoy.addr(),
        "POST",
        "/v1/chat/completions",
        "application/json",
        body,
    );
    assert_eq!(asked.status, 200, "{}", asked.text());
    let paths: Vec<String> = upstream.calls().into_iter().map(|c| c.path).collect();
    assert_eq!(paths, ["/v1/chat/completions"]);
}
