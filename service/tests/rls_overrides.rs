//! An operator's override (`/admin/v1/overrides`, namespace `rls`) applies to the RLS's
//! decisions at once, as it does to `/v1/check`'s: the key named by its hash (as
//! `/admin/v1/top` shows it) runs at the override's rate, keeping the usage so far, while every
//! other key keeps the configured limit; deleted, the configured limit applies again to the same
//! state.
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

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use rls::{ask, connect, oks_then_over, overall_codes, request, Rls};
use serde_json::{json, Value};
use sluice_testkit::http::send_with;
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::AdminTokens;
use sluice_testkit::TempDir;

const KEYED: &str = "domain: api
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 3}
";

fn admin(addr: SocketAddr, method: &str, path: &str, token: &str, body: &Value) -> Value {
    let authorization = format!("Bearer {token}");
    let headers: [(&str, &[u8]); 2] = [
        ("authorization", authorization.as_bytes()),
        ("content-type", b"application/json"),
    ];
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let response = send_with(addr, method, path, &headers, body.as_bytes());
    assert_eq!(response.status, 200, "{path}: {response:?}");
    response.json()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_override_of_an_rls_key_applies_at_once_keeping_its_usage() {
    let redis = RedisServer::start();
    let dir = TempDir::new("rls-overrides");
    let tokens = AdminTokens::write(&dir);
    let mut extra = tokens.args().to_vec();
    extra.extend(["--listen", "127.0.0.1:0"]);
    let rls = Rls::start(&["--redis", &redis.url()], KEYED, &extra);
    let addr = rls.service.addr;
    let mut client = connect(&rls).await;
    let acme = request("api", &[&[("user", "acme")]], 0);
    let other = request("api", &[&[("user", "other")]], 0);
    // 5 of 3 used: the refused hits are charged too (envoyproxy/ratelimit's counting).
    assert_eq!(
        overall_codes(&mut client, &acme, 5).await,
        oks_then_over(3, 2)
    );

    let top = admin(
        addr,
        "GET",
        "/admin/v1/top?namespace=rls&policy=api%2Fuser&limit=1",
        "rEad-token",
        &json!(null),
    );
    let key = top["keys"][0]["key"].as_str().unwrap().to_owned();
    let premium = json!({"namespace": "rls", "key": key, "algorithm": "fixed_window",
        "requests": 10, "per_ms": 86_400_000, "burst": 10,
        "owner": "accounts@example.com", "reason": "premium plan"});
    admin(addr, "POST", "/admin/v1/overrides", "adm1n-token", &premium);

    // Raised to 10 with 5 used: 5 left, at once, not 10 and not 0.
    assert_eq!(
        overall_codes(&mut client, &acme, 6).await,
        oks_then_over(5, 1)
    );
    let status = ask(&mut client, acme.clone()).await.statuses[0].clone();
    let limit = status.current_limit.unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (10, Unit::Day.into()),
        "the answer names the override's limit"
    );
    // Another key keeps the configured limit.
    assert_eq!(
        overall_codes(&mut client, &other, 4).await,
        oks_then_over(3, 1)
    );

    let delete = json!({"namespace": "rls", "key": key, "reason": "plan cancelled"});
    admin(
        addr,
        "POST",
        "/admin/v1/overrides/delete",
        "adm1n-token",
        &delete,
    );
    let status = ask(&mut client, acme).await.statuses[0].clone();
    let limit = status.current_limit.unwrap();
    assert_eq!(
        (status.code, limit.requests_per_unit),
        (2, 3),
        "the configured limit again, over the same usage: refused"
    );
}
