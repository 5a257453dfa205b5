//! The wire format between the filter and `sluice-service` (`POST /v1/check`): one request
//! carries every global check of one HTTP request, one answer per check comes back in order.

use serde::{Deserialize, Serialize};

const NANOS_PER_MS: u64 = 1_000_000;

/// One global policy's question about one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// `<policy>/<key hash>`: the service never sees the raw key either.
    pub key: String,
    pub algorithm: &'static str,
    pub requests: u64,
    pub per_ms: u64,
    pub burst: u64,
    pub cost: u64,
    /// Tokens to take if at least `cost` are there: more than `cost` leases the rest.
    pub take: u64,
    /// Leaky bucket only: the longest the service may schedule a request ahead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_delay_ms: Option<u64>,
}

#[derive(Serialize)]
struct CheckRequest<'a> {
    checks: &'a [Check],
}

/// The service's answer to one check, durations in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    pub allowed: bool,
    pub granted: u64,
    pub remaining: u64,
    pub reset_after: u64,
    pub retry_after: u64,
    /// How long to hold the admitted request first (leaky bucket).
    pub delay: u64,
}

#[derive(Deserialize)]
struct RawAnswer {
    allowed: bool,
    granted: u64,
    remaining: u64,
    reset_ms: u64,
    retry_after_ms: u64,
    #[serde(default)]
    delay_ms: u64,
}

#[derive(Deserialize)]
struct CheckResponse {
    results: Vec<RawAnswer>,
}

/// Whole milliseconds, rounded up, at least 1: the wire's unit for durations.
pub fn per_ms(per_nanos: u64) -> u64 {
    per_nanos.div_ceil(NANOS_PER_MS).max(1)
}

pub fn encode(checks: &[Check]) -> Vec<u8> {
    serde_json::to_vec(&CheckRequest { checks }).unwrap_or_default()
}

/// The answers, if the body is a well-formed answer to exactly `expected` checks whose grants
/// make sense; `None` otherwise (the caller treats it as a failed call).
pub fn decode(body: &[u8], checks: &[Check]) -> Option<Vec<Answer>> {
    let response: CheckResponse = serde_json::from_slice(body).ok()?;
    if response.results.len() != checks.len() {
        return None;
    }
    response
        .results
        .into_iter()
        .zip(checks)
        .map(|(raw, check)| {
            let sane = if raw.allowed {
                (check.cost..=check.take).contains(&raw.granted)
            } else {
                raw.granted == 0
            };
            sane.then_some(Answer {
                allowed: raw.allowed,
                granted: raw.granted,
                remaining: raw.remaining,
                reset_after: raw.reset_ms.saturating_mul(NANOS_PER_MS),
                retry_after: raw.retry_after_ms.saturating_mul(NANOS_PER_MS),
                delay: raw.delay_ms.saturating_mul(NANOS_PER_MS),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(take: u64) -> Check {
        Check {
            key: "per-user/00000000000000ff".into(),
            algorithm: "token_bucket",
            requests: 100,
            per_ms: 60_000,
            burst: 20,
            cost: 1,
            take,
            max_delay_ms: None,
        }
    }

    #[test]
    fn encodes_the_documented_request() {
        let body = String::from_utf8(encode(&[check(1)])).unwrap();
        assert_eq!(
            body,
            r#"{"checks":[{"key":"per-user/00000000000000ff","algorithm":"token_bucket","requests":100,"per_ms":60000,"burst":20,"cost":1,"take":1}]}"#
        );
    }

    #[test]
    fn decodes_answers_in_order() {
        let body = br#"{"results":[{"allowed":true,"granted":5,"remaining":15,"reset_ms":3000,"retry_after_ms":0}]}"#;
        let answers = decode(body, &[check(5)]).unwrap();
        assert_eq!(
            answers,
            [Answer {
                allowed: true,
                granted: 5,
                remaining: 15,
                reset_after: 3_000_000_000,
                retry_after: 0,
                delay: 0
            }]
        );
    }

    #[test]
    fn refuses_answers_that_do_not_fit_the_question() {
        let one = br#"{"results":[{"allowed":true,"granted":1,"remaining":0,"reset_ms":0,"retry_after_ms":0}]}"#;
        assert!(decode(one, &[check(1), check(1)]).is_none(), "too few");
        let greedy = br#"{"results":[{"allowed":true,"granted":9,"remaining":0,"reset_ms":0,"retry_after_ms":0}]}"#;
        assert!(decode(greedy, &[check(5)]).is_none(), "more than asked");
        let free = br#"{"results":[{"allowed":false,"granted":1,"remaining":0,"reset_ms":0,"retry_after_ms":9}]}"#;
        assert!(
            decode(free, &[check(1)]).is_none(),
            "a denial grants nothing"
        );
        assert!(decode(b"<html>", &[check(1)]).is_none());
    }

    #[test]
    fn per_is_whole_milliseconds() {
        assert_eq!(per_ms(60_000_000_000), 60_000);
        assert_eq!(per_ms(1), 1);
    }
}
