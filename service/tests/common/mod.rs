//! What the service's tests share beyond the workspace harness (`sluice-testkit`): the request
//! bodies the filter sends, the 400s the service answers, Redis's clock, and seeded random numbers.
// Each test binary uses only part of this module.
#![allow(dead_code, clippy::panic, clippy::unwrap_used)]

pub mod clock;
pub mod lcg;

use sluice_testkit::http::{post_json, Response};
use std::net::SocketAddr;

/// POST /v1/check with this body.
pub fn post_check(addr: SocketAddr, body: &str) -> Response {
    post_json(addr, "/v1/check", body)
}

/// The service's error answers.
pub trait Refusal {
    /// Asserts a 400 whose detail starts with `detail_prefix` (the field at fault).
    fn assert_bad_request(&self, detail_prefix: &str);
}

impl Refusal for Response {
    fn assert_bad_request(&self, detail_prefix: &str) {
        assert_eq!(self.status, 400, "{self:?}");
        let json = self.json();
        assert_eq!(json["error"], "bad_request", "{self:?}");
        let detail = json["detail"].as_str().unwrap();
        assert!(
            detail.starts_with(detail_prefix),
            "detail {detail:?} should start with {detail_prefix:?}"
        );
    }
}

/// The JSON body of a request with the given checks.
pub fn checks_body(checks: &[serde_json::Value]) -> String {
    serde_json::json!({ "checks": checks }).to_string()
}

/// One token-bucket check; `take` is left out when equal to `cost` (strict mode).
pub fn bucket(
    key: &str,
    requests: u64,
    per_ms: u64,
    burst: u64,
    cost: u64,
    take: u64,
) -> serde_json::Value {
    let mut check = serde_json::json!({
        "key": key, "requests": requests, "per_ms": per_ms, "burst": burst, "cost": cost,
    });
    if take != cost {
        check["take"] = take.into();
    }
    check
}

/// One check of a window algorithm (`fixed_window`, `sliding_window`, `sliding_log`): `limit`
/// per `per_ms`, sent as the filter does (burst = requests); `take` left out when equal to `cost`.
pub fn window(
    algorithm: &str,
    key: &str,
    limit: u64,
    per_ms: u64,
    cost: u64,
    take: u64,
) -> serde_json::Value {
    let mut check = bucket(key, limit, per_ms, limit, cost, take);
    check["algorithm"] = algorithm.into();
    check
}

/// One leaky-bucket check as the filter sends it: `requests` per `per_ms`, held at most
/// `max_delay_ms`, burst = max_delay / interval + 1, take = cost.
pub fn leaky(
    key: &str,
    requests: u64,
    per_ms: u64,
    max_delay_ms: u64,
    cost: u64,
) -> serde_json::Value {
    let burst = max_delay_ms * requests / per_ms + 1;
    serde_json::json!({
        "key": key, "algorithm": "leaky_bucket", "requests": requests, "per_ms": per_ms,
        "burst": burst, "cost": cost, "take": cost, "max_delay_ms": max_delay_ms,
    })
}
