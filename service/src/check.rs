//! The body of `POST /v1/check`: strict parsing and validation into `Bucket`s, and the response.
//! Everything here happens before any storage is touched; a rejection names the field at fault.

use serde::{Deserialize, Serialize};

use crate::store::{Bucket, Decision};

pub const MAX_CHECKS: usize = 16;
pub const MAX_KEY_BYTES: usize = 200;
const MAX_REQUESTS: u64 = 1_000_000_000;
const MAX_BURST: u64 = 1_000_000_000;
/// One year.
const MAX_PER_MS: u64 = 31_536_000_000;
/// Largest bucket (burst × interval). The Lua script computes in doubles, exact only below 2^53;
/// with this bound, `now + capacity` stays below 2^53 µs until past the year 2100. It is the filter's
/// own bound (2^62 ns), so every bucket the filter accepts is accepted here.
pub const MAX_CAPACITY_US: u64 = (1 << 62) / 1000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequest {
    checks: Vec<RawCheck>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCheck {
    key: String,
    #[serde(default)]
    algorithm: Algorithm,
    requests: u64,
    per_ms: u64,
    burst: u64,
    cost: u64,
    take: Option<u64>,
}

/// Only the token bucket exists so far; other names are refused by serde as unknown variants.
#[derive(Deserialize, Default)]
#[serde(rename_all = "snake_case")]
enum Algorithm {
    #[default]
    TokenBucket,
}

/// Why a request was refused: `detail` is `"<field>: <reason>"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRequest {
    pub detail: String,
}

impl BadRequest {
    pub fn new(field: &str, reason: impl std::fmt::Display) -> Self {
        BadRequest {
            detail: format!("{field}: {reason}"),
        }
    }
}

/// Parses and validates a request body into the buckets to check, in request order.
pub fn parse(body: &[u8]) -> Result<Vec<Bucket>, BadRequest> {
    let raw = deserialize(body)?;
    if !(1..=MAX_CHECKS).contains(&raw.checks.len()) {
        let reason = format!(
            "must hold 1 to {MAX_CHECKS} checks, got {}",
            raw.checks.len()
        );
        return Err(BadRequest::new("checks", reason));
    }
    raw.checks
        .into_iter()
        .enumerate()
        .map(|(i, check)| validate(check, &format!("checks[{i}]")))
        .collect()
}

/// JSON to `RawRequest`; a serde error is reported at the path where it happened.
fn deserialize(body: &[u8]) -> Result<RawRequest, BadRequest> {
    let mut json = serde_json::Deserializer::from_slice(body);
    let raw: RawRequest = serde_path_to_error::deserialize(&mut json).map_err(|error| {
        let path = error.path().to_string();
        // Broken JSON is reported for the body (its message has line and column); wrong
        // content at the field's path, "." being the body itself.
        let field = if error.inner().is_data() && path != "." {
            path.as_str()
        } else {
            "body"
        };
        BadRequest::new(field, error.inner())
    })?;
    json.end().map_err(|error| BadRequest::new("body", error))?;
    Ok(raw)
}

fn validate(raw: RawCheck, at: &str) -> Result<Bucket, BadRequest> {
    // The only algorithm so far; the others will turn this into a match.
    let Algorithm::TokenBucket = raw.algorithm;
    let field = |name: &str| format!("{at}.{name}");
    validate_key(&raw.key).map_err(|reason| BadRequest::new(&field("key"), reason))?;
    let requests = within(&field("requests"), raw.requests, 1, MAX_REQUESTS, "")?;
    let per_ms = within(&field("per_ms"), raw.per_ms, 1, MAX_PER_MS, "")?;
    let burst = within(&field("burst"), raw.burst, 1, MAX_BURST, "")?;
    let cost = within(&field("cost"), raw.cost, 1, burst, " (burst)")?;
    let take = raw.take.unwrap_or(cost);
    let take = within(&field("take"), take, cost, burst, " (cost..=burst)")?;
    let interval_us = interval_us(requests, per_ms);
    check_capacity(&field("burst"), interval_us, burst)?;
    Ok(Bucket {
        key: raw.key,
        interval_us,
        burst,
        cost,
        take,
    })
}

/// µs per token, at least 1: rates above one token per µs are capped there (the contract).
fn interval_us(requests: u64, per_ms: u64) -> u64 {
    (per_ms * 1000 / requests).max(1)
}

fn check_capacity(field: &str, interval_us: u64, burst: u64) -> Result<(), BadRequest> {
    let fits = interval_us
        .checked_mul(burst)
        .is_some_and(|capacity| capacity <= MAX_CAPACITY_US);
    if fits {
        return Ok(());
    }
    let max_ms = MAX_CAPACITY_US / 1000;
    let reason = format!(
        "the bucket takes too long to fill: burst × per_ms / requests must be at most {max_ms} ms"
    );
    Err(BadRequest::new(field, reason))
}

/// `value` if it is in `min..=max`; `bounds_note` says where the bounds come from.
fn within(
    field: &str,
    value: u64,
    min: u64,
    max: u64,
    bounds_note: &str,
) -> Result<u64, BadRequest> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(BadRequest::new(
            field,
            format!("{value} is not in {min}..={max}{bounds_note}"),
        ))
    }
}

fn validate_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "must be 1 to {MAX_KEY_BYTES} bytes, got {}",
            key.len()
        ));
    }
    match key.chars().find(|&c| !is_key_char(c)) {
        Some(c) => Err(format!(
            "character {c:?} is not allowed (only A-Z a-z 0-9 _ . : / -)"
        )),
        None => Ok(()),
    }
}

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '/' | '-')
}

/// The 200 body: one result per check, in request order.
#[derive(Serialize, Debug)]
pub struct CheckResponse {
    pub results: Vec<CheckResult>,
}

#[derive(Serialize, Debug, PartialEq, Eq)]
pub struct CheckResult {
    pub allowed: bool,
    pub granted: u64,
    pub remaining: u64,
    pub reset_ms: u64,
    pub retry_after_ms: u64,
}

impl From<Decision> for CheckResult {
    fn from(decision: Decision) -> Self {
        CheckResult {
            allowed: decision.allowed,
            granted: decision.granted,
            remaining: decision.remaining,
            reset_ms: ceil_ms(decision.reset_us),
            retry_after_ms: ceil_ms(decision.retry_after_us),
        }
    }
}

/// Rounds up: a client that waits `retry_after_ms` must find its tokens there.
fn ceil_ms(us: u64) -> u64 {
    us.div_ceil(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_check(fields: &str) -> String {
        format!(r#"{{"checks": [{{{fields}}}]}}"#)
    }

    const VALID: &str = r#""key": "per-user/7af12e58ae350d9a", "requests": 100, "per_ms": 60000, "burst": 20, "cost": 1"#;

    fn detail(body: &str) -> String {
        parse(body.as_bytes()).unwrap_err().detail
    }

    #[test]
    fn a_valid_check_becomes_a_bucket_with_take_defaulting_to_cost() {
        let buckets = parse(one_check(VALID).as_bytes()).unwrap();
        let expected = Bucket {
            key: "per-user/7af12e58ae350d9a".into(),
            interval_us: 600_000,
            burst: 20,
            cost: 1,
            take: 1,
        };
        assert_eq!(buckets, [expected]);
    }

    #[test]
    fn algorithm_token_bucket_is_accepted_and_others_are_not() {
        let explicit = one_check(&format!(r#"{VALID}, "algorithm": "token_bucket""#));
        assert!(parse(explicit.as_bytes()).is_ok());
        let other = one_check(&format!(r#"{VALID}, "algorithm": "fixed_window""#));
        assert!(detail(&other).starts_with("checks[0].algorithm: unknown variant `fixed_window`"));
    }

    #[test]
    fn the_interval_is_at_least_one_microsecond() {
        let fast =
            one_check(r#""key": "k", "requests": 1000000000, "per_ms": 1, "burst": 1, "cost": 1"#);
        assert_eq!(parse(fast.as_bytes()).unwrap()[0].interval_us, 1);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            ("{", "body: EOF while parsing"),
            (r#"{"checks": []}"#, "checks: must hold 1 to 16"),
            (
                r#"{"checks": [{}], "x": 1}"#,
                "checks[0]: missing field `key`",
            ),
            (
                &one_check(&format!(r#"{VALID}, "extra": 1"#)),
                "checks[0].extra: unknown field `extra`",
            ),
            (
                &one_check(&VALID.replace("\"requests\": 100", "\"requests\": 0")),
                "checks[0].requests: 0 is not in",
            ),
            (
                &one_check(&VALID.replace("\"per_ms\": 60000", "\"per_ms\": -5")),
                "checks[0].per_ms: invalid value: integer `-5`",
            ),
            (
                &one_check(&VALID.replace("\"burst\": 20", "\"burst\": 1e30")),
                "checks[0].burst: invalid type: floating point",
            ),
            (
                &one_check(&VALID.replace("\"cost\": 1", "\"cost\": 21")),
                "checks[0].cost: 21 is not in 1..=20 (burst)",
            ),
            (
                &one_check(
                    &format!(r#"{VALID}, "cost": 2, "take": 1"#).replace("\"cost\": 1,", ""),
                ),
                "checks[0].take: 1 is not in 2..=20",
            ),
            (
                &one_check(&VALID.replace("per-user/", "per user/")),
                "checks[0].key: character ' '",
            ),
            (
                &format!("{} 1", one_check(VALID)),
                "body: trailing characters",
            ),
        ];
        for (body, expected) in cases {
            let got = detail(body);
            assert!(
                got.starts_with(expected),
                "{body}\n  gave {got:?}\n  expected {expected:?}"
            );
        }
    }

    #[test]
    fn keys_are_one_to_two_hundred_bytes() {
        let long = "k".repeat(MAX_KEY_BYTES);
        let ok = one_check(&VALID.replace("per-user/7af12e58ae350d9a", &long));
        assert!(parse(ok.as_bytes()).is_ok());
        let too_long = one_check(&VALID.replace("per-user/7af12e58ae350d9a", &format!("{long}k")));
        assert!(detail(&too_long).starts_with("checks[0].key: must be 1 to 200 bytes, got 201"));
        let empty = one_check(&VALID.replace("per-user/7af12e58ae350d9a", ""));
        assert!(detail(&empty).starts_with("checks[0].key: must be 1 to 200 bytes, got 0"));
    }

    #[test]
    fn buckets_too_large_for_exact_lua_arithmetic_are_refused() {
        let year = r#""key": "k", "requests": 1, "per_ms": 31536000000, "cost": 1"#;
        let largest = MAX_CAPACITY_US / 31_536_000_000_000;
        let fits = one_check(&format!(r#"{year}, "burst": {largest}"#));
        assert!(parse(fits.as_bytes()).is_ok());
        let too_big = one_check(&format!(r#"{year}, "burst": {}"#, largest + 1));
        assert!(detail(&too_big).starts_with("checks[0].burst: the bucket takes too long to fill"));
    }

    #[test]
    fn durations_in_the_response_round_up_to_whole_milliseconds() {
        let decision = Decision {
            allowed: false,
            granted: 0,
            remaining: 0,
            reset_us: 4_000_001,
            retry_after_us: 999_999,
        };
        let result = CheckResult::from(decision);
        assert_eq!((result.reset_ms, result.retry_after_ms), (4001, 1000));
    }
}
