//! The admin API's overrides through real Envoys (two, two workers each), the real
//! sluice-service and a real Redis: an override set on the service changes what both Envoys
//! decide for one tenant at once, with no configuration push, keeping what it used; other
//! tenants keep the policy's limit.

// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use serde_json::json;
use sluice_testkit::envoy::Envoy;
use sluice_testkit::http::send_with;
use sluice_testkit::redis::RedisServer;
use sluice_testkit::resp::Reply;
use sluice_testkit::service::Service;
use sluice_testkit::TempDir;

const ALICE: &[(&str, &[u8])] = &[("x-user-id", b"alice")];
const BOB: &[(&str, &[u8])] = &[("x-user-id", b"bob")];

fn config() -> String {
    json!({
        "global": {"cluster": "sluice_service", "authority": "sluice-service", "timeout": "500ms"},
        "policies": [{"name": "global-user", "scope": "global", "key": ["header:x-user-id"],
                      "requests": 1, "per": "1h", "burst": 10}],
    })
    .to_string()
}

#[test]
fn a_global_override_raises_one_tenants_limit_in_every_envoy_at_once() {
    let redis = RedisServer::start();
    let dir = TempDir::new("envoy-admin");
    let tokens = dir.path().join("admin");
    std::fs::write(&tokens, "oncall s3cret\n").unwrap();
    let args = [
        "--redis",
        &redis.url(),
        "--admin-token-file",
        tokens.to_str().unwrap(),
    ];
    let service = Service::start_with(&args, &[]);
    let envoys: Vec<Envoy> = (0..2)
        .map(|_| Envoy::options(&config()).service(&[service.addr]).start())
        .collect();

    // Alice's first request names her key in Redis: the policy and her key's hash.
    assert_eq!(envoys[0].get("/api/x", ALICE).status, 200);
    let keys = match redis.client().cmd(&["KEYS", "sluice:{global-user/*"]) {
        Reply::Array(keys) => keys.iter().map(Reply::text).collect::<Vec<_>>(),
        other => panic!("KEYS: {other:?}"),
    };
    assert_eq!(keys.len(), 1, "{keys:?}");
    let key = keys[0]
        .split_once('{')
        .unwrap()
        .1
        .split_once('}')
        .unwrap()
        .0
        .to_string();

    // 20 an hour for alice, at the policy's rate per token: her one request stays counted.
    let body = json!({"key": key, "requests": 2, "per_ms": 7_200_000, "burst": 20,
                      "owner": "accounts", "reason": "premium plan"})
    .to_string();
    let headers: &[(&str, &[u8])] = &[
        ("authorization", b"Bearer s3cret"),
        ("content-type", b"application/json"),
    ];
    let set = send_with(
        service.addr,
        "POST",
        "/admin/v1/overrides",
        headers,
        body.as_bytes(),
    );
    assert_eq!(set.status, 200, "{set:?}");

    let alice: Vec<u16> = (0..30)
        .map(|i| envoys[i % 2].get("/api/x", ALICE).status)
        .collect();
    assert_eq!(alice.iter().filter(|&&s| s == 200).count(), 19, "{alice:?}");
    let bob: Vec<u16> = (0..30)
        .map(|i| envoys[i % 2].get("/api/x", BOB).status)
        .collect();
    assert_eq!(bob.iter().filter(|&&s| s == 200).count(), 10, "{bob:?}");
}
