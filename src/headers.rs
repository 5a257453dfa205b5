//! What clients see: the rate-limit response headers and the 429 body.

use crate::duration::ceil_secs;
use crate::text::push_decimal;
use serde::Deserialize;

/// Which rate-limit headers responses carry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HeaderStyle {
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` (Unix epoch seconds).
    #[default]
    Legacy,
    /// IETF httpapi-ratelimit-headers draft 10: `RateLimit-Policy` and `RateLimit`.
    Draft,
    Both,
    None,
}

/// The state of one policy's bucket for one request, as the headers report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota<'a> {
    pub policy: &'a str,
    /// Bucket capacity (`burst`).
    pub limit: u64,
    /// `requests` per `window_secs`: the sustained rate.
    pub requests: u64,
    pub window_secs: u64,
    pub remaining: u64,
    /// Nanoseconds until the bucket is full again.
    pub reset_after: u64,
}

/// Calls `emit` with each rate-limit header for `quota` at `now` (Unix nanoseconds). The values
/// are built in one buffer, without `core::fmt`: this runs for every response. Policy names are
/// restricted to `[A-Za-z0-9_.-]` by the config, so nothing here needs escaping.
pub fn each_rate_limit_header(
    style: HeaderStyle,
    quota: &Quota,
    now: u64,
    mut emit: impl FnMut(&'static str, &str),
) {
    let mut value = String::with_capacity(quota.policy.len() + 48);
    if matches!(style, HeaderStyle::Legacy | HeaderStyle::Both) {
        let reset_epoch = ceil_secs(now.saturating_add(quota.reset_after));
        for (name, n) in [
            ("x-ratelimit-limit", quota.limit),
            ("x-ratelimit-remaining", quota.remaining),
            ("x-ratelimit-reset", reset_epoch),
        ] {
            value.clear();
            push_decimal(&mut value, n);
            emit(name, &value);
        }
    }
    if matches!(style, HeaderStyle::Draft | HeaderStyle::Both) {
        // Both are structured-field lists of one item: "<policy>";<a>=<x>;<b>=<y>.
        for (name, (a, x), (b, y)) in [
            (
                "ratelimit-policy",
                ("q", quota.requests),
                ("w", quota.window_secs),
            ),
            (
                "ratelimit",
                ("r", quota.remaining),
                ("t", ceil_secs(quota.reset_after)),
            ),
        ] {
            value.clear();
            value.push('"');
            value.push_str(quota.policy);
            value.push_str("\";");
            value.push_str(a);
            value.push('=');
            push_decimal(&mut value, x);
            value.push(';');
            value.push_str(b);
            value.push('=');
            push_decimal(&mut value, y);
            emit(name, &value);
        }
    }
}

/// `Retry-After` in whole seconds: rounded up, and at least 1.
pub fn retry_after_secs(retry_after: u64) -> u64 {
    ceil_secs(retry_after).max(1)
}

/// The JSON body of a denial: `error` is `too_many_requests` (429) or `rate_limit_unavailable`
/// (503, a policy that fails closed).
pub fn denial_body(error: &str, policy: &str, retry_after_secs: u64) -> String {
    let mut body = String::with_capacity(error.len() + policy.len() + 64);
    for part in [
        r#"{"error":""#,
        error,
        r#"","policy":""#,
        policy,
        r#"","retry_after":"#,
    ] {
        body.push_str(part);
    }
    push_decimal(&mut body, retry_after_secs);
    body.push('}');
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::duration::NANOS_PER_SEC;

    const QUOTA: Quota = Quota {
        policy: "per-user",
        limit: 20,
        requests: 100,
        window_secs: 60,
        remaining: 7,
        reset_after: 2_500_000_000,
    };
    const NOW: u64 = 1_700_000_000_250_000_000;

    fn rate_limit_headers(
        style: HeaderStyle,
        quota: &Quota,
        now: u64,
    ) -> Vec<(&'static str, String)> {
        let mut headers = Vec::new();
        each_rate_limit_header(style, quota, now, |name, value| {
            headers.push((name, value.to_string()));
        });
        headers
    }

    #[test]
    fn legacy_headers_give_reset_as_epoch_seconds() {
        let headers = rate_limit_headers(HeaderStyle::Legacy, &QUOTA, NOW);
        assert_eq!(
            headers,
            [
                ("x-ratelimit-limit", "20".to_string()),
                ("x-ratelimit-remaining", "7".to_string()),
                ("x-ratelimit-reset", "1700000003".to_string()),
            ]
        );
    }

    #[test]
    fn draft_headers_are_structured_field_lists() {
        let headers = rate_limit_headers(HeaderStyle::Draft, &QUOTA, NOW);
        assert_eq!(
            headers,
            [
                ("ratelimit-policy", r#""per-user";q=100;w=60"#.to_string()),
                ("ratelimit", r#""per-user";r=7;t=3"#.to_string()),
            ]
        );
    }

    #[test]
    fn both_and_none() {
        assert_eq!(rate_limit_headers(HeaderStyle::Both, &QUOTA, NOW).len(), 5);
        assert!(rate_limit_headers(HeaderStyle::None, &QUOTA, NOW).is_empty());
    }

    #[test]
    fn a_full_bucket_resets_now() {
        let full = Quota {
            reset_after: 0,
            ..QUOTA
        };
        let headers = rate_limit_headers(HeaderStyle::Both, &full, 5 * NANOS_PER_SEC);
        assert_eq!(headers[2].1, "5");
        assert_eq!(headers[4].1, r#""per-user";r=7;t=0"#);
    }

    proptest::proptest! {
        /// Any numbers give headers of digits and the policy name only: nothing to inject.
        #[test]
        fn headers_are_digits_and_the_policy_name(
            limit in proptest::arbitrary::any::<u64>(),
            remaining in proptest::arbitrary::any::<u64>(),
            reset_after in proptest::arbitrary::any::<u64>(),
            now in proptest::arbitrary::any::<u64>(),
        ) {
            let quota = Quota { limit, remaining, reset_after, requests: limit, ..QUOTA };
            for (_, value) in rate_limit_headers(HeaderStyle::Both, &quota, now) {
                let rest = value.replace("\"per-user\"", "");
                proptest::prop_assert!(rest.bytes().all(|b| b.is_ascii_digit() || b"qwrt=;".contains(&b)), "{value}");
            }
        }
    }

    #[test]
    fn retry_after_is_whole_seconds_at_least_one() {
        assert_eq!(retry_after_secs(1), 1);
        assert_eq!(retry_after_secs(0), 1);
        assert_eq!(retry_after_secs(1_000_000_001), 2);
    }

    #[test]
    fn denial_body_is_the_documented_json() {
        let body = denial_body("too_many_requests", "per-user", 3);
        assert_eq!(
            body,
            r#"{"error":"too_many_requests","policy":"per-user","retry_after":3}"#
        );
        let parsed: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(parsed["retry_after"], 3);
    }
}
