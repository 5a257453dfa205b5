//! `GET /admin/v1/top` (issue 35) on the real service: a heavy key among many light ones is on
//! top of its policy's refusals and consumption, over Redis and through the RLS, as its hash
//! only (an RLS entry's value only where `--rls-top-show` names it); the minute's log record;
//! the tokens (401 without one, the read-only token enough); and hostile queries refused
//! naming the parameter.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;
#[path = "rls/client.rs"]
mod rls;

use std::net::SocketAddr;
use std::time::Duration;

use common::bucket;
use rls::{connect, overall_codes, request, Rls};
use serde_json::{json, Value};
use sluice_testkit::http::{send_with, Response};
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::{AdminTokens, Service};
use sluice_testkit::TempDir;

const HEAVY: &str = "api/00000000000000aa";

fn start(store: &[&str], dir: &TempDir, extra: &[&str]) -> Service {
    let tokens = AdminTokens::write(dir);
    let mut args: Vec<&str> = store.to_vec();
    args.extend(tokens.args());
    args.extend(extra);
    Service::start_with(&args, &[])
}

fn call(addr: SocketAddr, method: &str, path: &str, token: Option<&str>) -> Response {
    let authorization = token.map(|t| format!("Bearer {t}"));
    let mut headers: Vec<(&str, &[u8])> = Vec::new();
    if let Some(authorization) = &authorization {
        headers.push(("authorization", authorization.as_bytes()));
    }
    send_with(addr, method, path, &headers, b"")
}

fn top(addr: SocketAddr, query: &str) -> Value {
    let response = call(
        addr,
        "GET",
        &format!("/admin/v1/top?{query}"),
        Some("rEad-token"),
    );
    assert_eq!(response.status, 200, "{query}: {response:?}");
    response.json()
}

/// 200 light keys one check each, and the heavy key 30 checks of a bucket of 5: how many of
/// those were allowed.
fn flood(service: &Service) -> u64 {
    for i in 0..200u64 {
        let light = format!("api/{:016x}", 0x1000 + i);
        service.check(&[bucket(&light, 1, 60_000, 5, 1, 1)]);
    }
    let heavy = (0..30).map(|_| service.check(&[bucket(HEAVY, 1, 60_000, 5, 1, 1)]));
    heavy
        .filter(|results| results[0]["allowed"] == true)
        .count() as u64
}

fn a_heavy_key_is_on_top(store: &[&str]) {
    let dir = TempDir::new("top-heavy");
    let service = start(store, &dir, &[]);
    let allowed = flood(&service);
    assert!((5..=6).contains(&allowed), "{allowed}");
    let refused = top(service.addr, "policy=api&by=refused&window=1m&limit=3");
    assert_eq!(refused["keys"][0]["key"], "00000000000000aa", "{refused}");
    assert_eq!(refused["keys"][0]["count"], 30 - allowed, "{refused}");
    assert_eq!(refused["keys"][0]["error"], 0, "{refused}");
    assert_eq!(refused["keys"].as_array().unwrap().len(), 1, "{refused}");
    assert_eq!(refused["totals"]["refused"], 30 - allowed);
    assert_eq!(refused["totals"]["allowed"], 200 + allowed);
    let consumed = top(service.addr, "policy=api&by=consumed&window=1h");
    assert_eq!(consumed["keys"][0]["key"], "00000000000000aa", "{consumed}");
    // 201 keys in a sketch that keeps 64: counts are within their stated error.
    let (count, error) = (&consumed["keys"][0]["count"], &consumed["keys"][0]["error"]);
    let (count, error) = (count.as_u64().unwrap(), error.as_u64().unwrap());
    assert!(count >= allowed && count - error <= allowed, "{consumed}");
    assert!(
        error <= consumed["error_bound"].as_u64().unwrap(),
        "{consumed}"
    );
    assert!(consumed["error_bound"].as_u64().unwrap() <= (200 + allowed) / 64);
    assert_eq!(consumed["keys"].as_array().unwrap().len(), 10);
    assert_eq!(consumed["totals"]["consumed"], 200 + allowed);
    let all = top(service.addr, "");
    assert_eq!(all["policies"][0]["policy"], "api", "{all}");
    assert_eq!(all["policies"][0]["1m"]["refused"], 30 - allowed, "{all}");
    // Over time, slot by slot: 7 of 10 s and 13 of 5 min, their refusals the window's.
    let history = &all["policies"][0]["history"];
    for (window, slot_s, slots) in [("1m", 10, 7), ("1h", 300, 13)] {
        let series = history[window]["slots"].as_array().unwrap();
        assert_eq!(history[window]["slot_s"], slot_s, "{all}");
        assert_eq!(series.len(), slots, "{all}");
        let refused: u64 = series.iter().map(|s| s["refused"].as_u64().unwrap()).sum();
        assert_eq!(refused, 30 - allowed, "{all}");
    }
    assert_eq!(all["max_policies"], 64);
    // The limit its checks used, as the keys API takes it: a reset by it forgets the key's
    // refusals here, and the key is whole again.
    let limits = &all["policies"][0]["limits"];
    let limit = json!({"algorithm": "token_bucket", "requests": 1, "per_ms": 60_000, "burst": 5});
    assert_eq!(limits, &json!([limit]), "{all}");
    let mut reset = limit;
    reset["key"] = json!(HEAVY);
    reset["reason"] = json!("ticket 12");
    let body = reset.to_string();
    let headers: &[(&str, &[u8])] = &[
        ("authorization", b"Bearer adm1n-token"),
        ("content-type", b"application/json"),
    ];
    let path = "/admin/v1/keys/reset";
    let done = send_with(service.addr, "POST", path, headers, body.as_bytes());
    assert_eq!(done.json()["outcome"], "done", "{done:?}");
    let refused = top(service.addr, "policy=api&by=refused&window=1h");
    assert_eq!(refused["keys"], json!([]), "{refused}");
    assert_eq!(
        refused["totals"]["refused"],
        30 - allowed,
        "the totals keep them"
    );
    let again = service.check(&[bucket(HEAVY, 1, 60_000, 5, 1, 1)]);
    assert_eq!(again[0]["remaining"], 4, "{again:?}");
}

#[test]
fn a_heavy_key_is_on_top_of_its_policys_refusals_and_consumption_on_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    a_heavy_key_is_on_top(&["--redis", &url]);
}

#[test]
fn a_heavy_key_is_on_top_of_its_policys_refusals_and_consumption_in_memory() {
    a_heavy_key_is_on_top(&["--memory"]);
}

#[test]
fn a_policy_that_refused_gets_a_log_record_with_its_top_keys() {
    let dir = TempDir::new("top-log");
    let service = start(&["--memory"], &dir, &["--top-log-every", "1"]);
    let allowed = flood(&service);
    let event = service
        .event("top refused keys", Duration::from_secs(5))
        .expect("a top refused keys record");
    assert_eq!(event["policy"], "api", "{event}");
    assert_eq!(event["namespace"], "http");
    assert_eq!(event["refused"], 30 - allowed);
    assert_eq!(event["allowed"], 200 + allowed);
    let logged = format!("00000000000000aa={}", 30 - allowed);
    assert_eq!(event["top"], logged.as_str(), "{event}");
}

#[test]
fn without_a_token_top_is_401_the_read_only_token_reads_it_and_writes_nothing_open_it() {
    let dir = TempDir::new("top-auth");
    let check_token = dir.path().join("check");
    std::fs::write(&check_token, "ch3ck-token\n").unwrap();
    let service = start(
        &["--memory"],
        &dir,
        &["--token-file", check_token.to_str().unwrap()],
    );
    for token in [None, Some("wrong"), Some("ch3ck-token"), Some("alice")] {
        let response = call(service.addr, "GET", "/admin/v1/top?policy=api", token);
        assert_eq!(response.status, 401, "{token:?}: {response:?}");
    }
    for token in ["rEad-token", "adm1n-token"] {
        let response = call(service.addr, "GET", "/admin/v1/top", Some(token));
        assert_eq!(response.status, 200, "{token}: {response:?}");
    }
    let response = call(service.addr, "POST", "/admin/v1/top", Some("adm1n-token"));
    assert_eq!(response.status, 405, "{response:?}");
}

#[test]
fn without_an_admin_token_file_nothing_is_recorded_and_there_is_no_top() {
    let service = Service::start_memory();
    service.check(&[bucket(HEAVY, 1, 60_000, 5, 1, 1)]);
    let response = call(service.addr, "GET", "/admin/v1/top", Some("rEad-token"));
    assert_eq!(response.status, 404, "{response:?}");
}

#[test]
fn hostile_queries_are_refused_naming_the_parameter() {
    let dir = TempDir::new("top-hostile");
    let service = start(&["--memory"], &dir, &[]);
    flood(&service);
    let long = "p".repeat(301);
    let huge = format!("policy=api&limit={}", "9".repeat(5_000));
    let cases: Vec<(String, u16, &str)> = vec![
        (
            "policy=api&by=denied".into(),
            400,
            "by: must be refused or consumed",
        ),
        (
            "policy=api&window=5m".into(),
            400,
            "window: must be 1m or 1h",
        ),
        ("policy=api&limit=65".into(), 400, "limit: must be 1 to 64"),
        ("policy=api&limit=-1".into(), 400, "limit: must be 1 to 64"),
        (huge, 400, "limit: must be 1 to 64"),
        (
            "policy=api&limit=18446744073709551616".into(),
            400,
            "limit: ",
        ),
        (
            "policy=api&namespace=grpc".into(),
            400,
            "namespace: must be http or rls",
        ),
        ("policy=".into(), 400, "policy: must be 1 to 300 bytes"),
        (
            format!("policy={long}"),
            400,
            "policy: must be 1 to 300 bytes",
        ),
        (
            "policy=a%00b".into(),
            400,
            "policy: must hold no control characters",
        ),
        (
            "policy=%E0%A4".into(),
            400,
            "policy: must be percent-encoded UTF-8",
        ),
        (
            "policy=%".into(),
            400,
            "policy: must be percent-encoded UTF-8",
        ),
        (
            "policy=api&policy=api".into(),
            400,
            "policy: given more than once",
        ),
        (
            "policy=api&key=00000000000000aa".into(),
            400,
            "key: unknown parameter",
        ),
        (
            "policy=nobody".into(),
            404,
            "policy: \"nobody\" has recorded nothing",
        ),
        (
            "policy=api&namespace=rls".into(),
            404,
            "policy: \"api\" has recorded nothing",
        ),
    ];
    for (query, status, detail) in cases {
        let path = format!("/admin/v1/top?{query}");
        let response = call(service.addr, "GET", &path, Some("rEad-token"));
        assert_eq!(response.status, status, "{query}: {response:?}");
        let got = response.json()["detail"].as_str().unwrap().to_string();
        assert!(got.starts_with(detail), "{query}: {got}");
        assert!(
            got.len() < 200,
            "{query}: a detail that echoes the input: {got}"
        );
    }
    // Made-up keys of a /v1/check caller are not recorded: only `<policy>/<16 hex digits>`.
    service.check(&[bucket("api/sk-live-secret", 1, 60_000, 1, 1, 1)]);
    let listed = call(
        service.addr,
        "GET",
        "/admin/v1/top?policy=api&by=consumed&limit=64",
        Some("rEad-token"),
    );
    assert!(!listed.text().contains("sk-live"), "{listed:?}");
}

const KEYED: &str = "domain: api
descriptors:
  - key: user
    descriptors:
      - key: api_key
        rate_limit: {unit: day, requests_per_unit: 3}
";

#[tokio::test(flavor = "multi_thread")]
async fn the_rls_shows_the_entries_it_is_told_to_and_never_an_api_key() {
    let redis = RedisServer::start();
    let url = redis.url();
    let dir = TempDir::new("top-rls");
    let tokens = AdminTokens::write(&dir);
    let mut extra = tokens.args().to_vec();
    extra.extend(["--listen", "127.0.0.1:0", "--rls-top-show", "user"]);
    let rls = Rls::start(&["--redis", &url], KEYED, &extra);
    let mut client = connect(&rls).await;
    let heavy = request(
        "api",
        &[&[("user", "alice"), ("api_key", "sk-live-4242")]],
        0,
    );
    overall_codes(&mut client, &heavy, 10).await;
    for i in 0..20 {
        let key = format!("sk-light-{i}");
        let light = request("api", &[&[("user", "bob"), ("api_key", &key)]], 0);
        overall_codes(&mut client, &light, 1).await;
    }
    let addr = rls.service.addr;
    let ranked = top(addr, "namespace=rls&policy=api%2Fuser.api_key&limit=64");
    assert_eq!(
        ranked["keys"][0]["shown"], "user=alice api_key=#",
        "{ranked}"
    );
    assert_eq!(ranked["keys"][0]["count"], 7, "{ranked}");
    assert_eq!(ranked["keys"][0]["key"].as_str().unwrap().len(), 32);
    let consumed = top(
        addr,
        "namespace=rls&policy=api/user.api_key&by=consumed&limit=64",
    );
    assert_eq!(consumed["keys"].as_array().unwrap().len(), 21, "{consumed}");
    for text in [
        ranked.to_string(),
        consumed.to_string(),
        top(addr, "").to_string(),
    ] {
        assert!(!text.contains("sk-"), "an API key shown: {text}");
    }
}

#[test]
fn what_a_settlement_charges_after_admission_counts_as_consumption() {
    let dir = TempDir::new("top-settle");
    let service = start(&["--memory"], &dir, &[]);
    let llm = |key: &str| {
        serde_json::json!({"key": key, "requests": 10_000, "per_ms": 60_000, "burst": 10_000,
                           "cost": 500})
    };
    for key in ["llm/0000000000000001", "llm/0000000000000002"] {
        assert_eq!(service.check(&[llm(key)])[0]["allowed"], true);
    }
    // The first call used 2,100 tokens of its 500 reserved: 1,600 charged after it.
    let charge = serde_json::json!({"settlements": [{"key": "llm/0000000000000001",
        "algorithm": "token_bucket", "requests": 10_000, "per_ms": 60_000, "burst": 10_000,
        "op": "charge", "tokens": 1_600, "max_debt": 0}]});
    let headers: &[(&str, &[u8])] = &[("content-type", b"application/json")];
    let body = charge.to_string();
    let settled = send_with(service.addr, "POST", "/v1/settle", headers, body.as_bytes());
    assert_eq!(settled.status, 200, "{settled:?}");
    let consumed = top(service.addr, "policy=llm&by=consumed");
    let keys: Vec<(&str, u64)> = (consumed["keys"].as_array().unwrap().iter())
        .map(|k| (k["key"].as_str().unwrap(), k["count"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        keys,
        [("0000000000000001", 2_100), ("0000000000000002", 500)]
    );
    assert_eq!(consumed["totals"]["consumed"], 2_600);
    assert_eq!(consumed["totals"]["allowed"], 2, "a charge is no request");
}
