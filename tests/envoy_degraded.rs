//! What a client sees from a fail-open global policy while the service cannot answer (a cluster
//! with no endpoints): the emergency budget decides, and the response headers should describe
//! the limit that decided.
//!
//! It pins a bug found here and fixed: the headers of an emergency decision took `remaining`
//! and `reset` from the emergency bucket but the limit from the policy's own (global) tier.

// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use sluice_testkit::envoy::Envoy;

/// Global 100/min, burst 50; while the service cannot answer, 1/h with a burst of 3 per Envoy.
const FAIL_OPEN: &str = r#"{"headers": "both",
  "global": {"cluster": "sluice_service", "authority": "sluice-service", "timeout": "100ms"},
  "policies": [{"name": "global-user", "scope": "global", "key": ["header:x-user-id"],
    "requests": 100, "per": "1m", "burst": 50, "failure_mode": "open",
    "emergency": {"requests": 1, "per": "1h", "burst": 3}}]}"#;

/// What a response says about its limit: status, `x-ratelimit-limit`, `x-ratelimit-remaining`
/// and the draft `ratelimit-policy`.
fn described(status: u16, limit: &str, remaining: &str, policy: &str) -> String {
    format!("{status} limit={limit} remaining={remaining} policy={policy}")
}

#[test]
fn degraded_responses_carry_the_emergency_limit_that_decided_them() {
    let envoy = Envoy::options(FAIL_OPEN).service(&[]).start();
    let seen: Vec<String> = (0..4)
        .map(|_| {
            let r = envoy.get("/api/x", &[("x-user-id", b"alice")]);
            let header = |name: &str| r.header(name).unwrap_or("-").to_string();
            described(
                r.status,
                &header("x-ratelimit-limit"),
                &header("x-ratelimit-remaining"),
                &header("ratelimit-policy"),
            )
        })
        .collect();
    let emergency = r#""global-user";q=3;w=10800"#;
    assert_eq!(
        seen,
        [
            described(200, "3", "2", emergency),
            described(200, "3", "1", emergency),
            described(200, "3", "0", emergency),
            described(429, "3", "0", emergency),
        ]
    );
}
