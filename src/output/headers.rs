//! What clients see: the rate-limit response headers and the 429 body.
//!
//! The draft fields follow draft-ietf-httpapi-ratelimit-headers-11 (May 2026): one Structured
//! Fields list item per field, the policy name as a String, `q`uota and `w`indow in the policy,
//! `r`emaining quota and effective window `t` in seconds in the service limit.

use crate::config::{Api, HeaderStyle};
use crate::core::duration::{ceil_secs, NANOS_PER_SEC};
use crate::core::text::push_decimal;
use crate::core::time::format_rfc3339;

/// The state of one policy's bucket for one request, as the headers report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota<'a> {
    pub policy: &'a str,
    /// The most requests a key can make at once (a token bucket's `burst`).
    pub limit: u64,
    /// `requests` per `per_nanos`: the sustained rate.
    pub requests: u64,
    pub per_nanos: u64,
    pub remaining: u64,
    /// Nanoseconds until the bucket is full again.
    pub reset_after: u64,
    /// A denial's wait: nanoseconds until a request of the same cost can pass.
    pub retry_after: Option<u64>,
    pub unit: QuotaUnit,
}

/// What a policy's quota counts, as the draft's `qu` names it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum QuotaUnit {
    /// Requests over a window (the draft's default unit).
    #[default]
    Requests,
    /// Requests in flight at once: no window, and no time to wait but the one a policy sets.
    ConcurrentRequests,
    /// Tokens a policy reads from responses (`"cost": {"from_response": ...}`). The draft
    /// registers no such unit (requests, content-bytes, concurrent-requests only), so the
    /// policy item says it with a parameter of sluice's own, as the draft has vendors do:
    /// `sluice-unit="tokens"`.
    Tokens,
    /// Money a spend budget charges (`cost.price`), in micro-units of its currency:
    /// `sluice-unit="micro-units"`. No provider header reports it.
    MicroUnits,
}

impl Quota<'_> {
    /// What is left, never more than the most the key can have: tokens a worker or an Envoy
    /// still holds can come on top of a bucket that refilled meanwhile.
    pub fn left(&self) -> u64 {
        self.remaining.min(self.limit)
    }

    /// The draft's effective window: on a denial the wait `retry-after` gives, else the time
    /// until the bucket is full again, whole seconds rounded up.
    fn window_secs(&self) -> u64 {
        match self.retry_after {
            Some(wait) => retry_after_secs(wait),
            None => ceil_secs(self.reset_after),
        }
    }
}

/// The draft's quota and window (whole seconds) for a policy that allows `limit` requests at
/// once and `requests` per `per_nanos` over time. The quota over the window is exactly that
/// rate: `limit` over the time a full refill takes when that is whole seconds, else the smallest
/// whole-second window over which the rate gives a whole number of requests, at least `limit`.
/// A policy of no `requests` (the RLS's `requests_per_unit: 0`, which refuses everything) has a
/// quota of 0 over its `per`.
pub fn quota_and_window(limit: u64, requests: u64, per_nanos: u64) -> (u64, u64) {
    if requests == 0 {
        return (0, ceil_secs(per_nanos).max(1));
    }
    let per_second = u128::from(requests) * u128::from(NANOS_PER_SEC);
    let per = u128::from(per_nanos.max(1));
    let common = gcd(per_second, per);
    // The rate in lowest terms: `quota` requests every `window` seconds.
    let (quota, window) = (per_second / common, per / common);
    let times = u128::from(limit).div_ceil(quota).max(1);
    let saturate = |n: u128| u64::try_from(n).unwrap_or(u64::MAX);
    (
        saturate(quota.saturating_mul(times)),
        saturate(window.saturating_mul(times)),
    )
}

/// Binary GCD: no division, which u128 makes costly on wasm32.
fn gcd(mut a: u128, mut b: u128) -> u128 {
    if a == 0 || b == 0 {
        return a | b;
    }
    let shift = (a | b).trailing_zeros();
    a >>= a.trailing_zeros();
    while b != 0 {
        b >>= b.trailing_zeros();
        if a > b {
            std::mem::swap(&mut a, &mut b);
        }
        b -= a;
    }
    a << shift
}

/// Calls `emit` with each rate-limit header for `quota` at `now` (Unix nanoseconds); the draft
/// fields, which are lists, also carry `also` after it. The values are built in one buffer,
/// without `core::fmt`: this runs for every response. Policy names are restricted to
/// `[A-Za-z0-9_.-]` by the config, so nothing here needs escaping.
pub fn each_rate_limit_header(
    style: HeaderStyle,
    quota: &Quota,
    also: &[Quota],
    now: u64,
    mut emit: impl FnMut(&'static str, &str),
) {
    let mut value = String::with_capacity((quota.policy.len() + 48) * (1 + also.len()));
    if matches!(style, HeaderStyle::Legacy | HeaderStyle::Both) {
        let reset_epoch = ceil_secs(now.saturating_add(quota.reset_after));
        let concurrent = quota.unit == QuotaUnit::ConcurrentRequests;
        let reset = (!concurrent).then_some(("x-ratelimit-reset", reset_epoch));
        let limits = [
            ("x-ratelimit-limit", quota.limit),
            ("x-ratelimit-remaining", quota.left()),
        ];
        for (name, n) in limits.into_iter().chain(reset) {
            value.clear();
            push_decimal(&mut value, n);
            emit(name, &value);
        }
    }
    if matches!(style, HeaderStyle::Draft | HeaderStyle::Both) {
        for (name, field) in [("ratelimit-policy", 0), ("ratelimit", 1)] {
            value.clear();
            for (i, quota) in std::iter::once(quota).chain(also).enumerate() {
                if i > 0 {
                    value.push_str(", ");
                }
                let params = draft_params(quota);
                let params = params.get(field).into_iter().flatten().flatten();
                item(&mut value, quota.policy, params);
            }
            emit(name, &value);
        }
    }
}

/// A quota's parameters in the draft's two fields: `RateLimit-Policy`'s, then `RateLimit`'s.
fn draft_params(quota: &Quota) -> [[Option<(&'static str, Param)>; 3]; 2] {
    let concurrent = quota.unit == QuotaUnit::ConcurrentRequests;
    let (q, w) = quota_and_window(quota.limit, quota.requests, quota.per_nanos);
    let unit = match quota.unit {
        QuotaUnit::Requests => None,
        QuotaUnit::ConcurrentRequests => Some(("qu", Param::Text("concurrent-requests"))),
        QuotaUnit::Tokens => Some(("sluice-unit", Param::Text("tokens"))),
        QuotaUnit::MicroUnits => Some(("sluice-unit", Param::Text("micro-units"))),
    };
    let policy_params = if concurrent {
        [Some(("q", Param::Number(quota.limit))), unit, None]
    } else {
        [
            Some(("q", Param::Number(q))),
            Some(("w", Param::Number(w))),
            unit,
        ]
    };
    let wait = quota.retry_after.map(retry_after_secs);
    let window = if concurrent {
        wait
    } else {
        Some(quota.window_secs())
    };
    let limit_params = [
        Some(("r", Param::Number(quota.left()))),
        window.map(|t| ("t", Param::Number(t))),
        None,
    ];
    [policy_params, limit_params]
}

/// Calls `emit` with each of `api`'s own rate-limit headers: requests from `requests`, the
/// enforcing request-counting policy with the fewest left, tokens from `tokens`, the enforcing
/// metered policy with the fewest left. Either family is left out when no such policy applied.
/// - OpenAI: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, the reset the time until
///   the bucket is full again as Go writes a duration (`1s`, `6m0s`, `1h2m3s`, `250ms`).
/// - Anthropic: `anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`, the reset the
///   instant it is full again in RFC 3339 (`2026-12-05T06:40:59Z`), whole seconds.
/// - Gemini and generic: none.
pub fn each_provider_header(
    api: Api,
    requests: Option<&Quota>,
    tokens: Option<&Quota>,
    now: u64,
    mut emit: impl FnMut(&'static str, &str),
) {
    let names: [[&'static str; 3]; 2] = match api {
        Api::Openai => [
            [
                "x-ratelimit-limit-requests",
                "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests",
            ],
            [
                "x-ratelimit-limit-tokens",
                "x-ratelimit-remaining-tokens",
                "x-ratelimit-reset-tokens",
            ],
        ],
        Api::Anthropic => [
            [
                "anthropic-ratelimit-requests-limit",
                "anthropic-ratelimit-requests-remaining",
                "anthropic-ratelimit-requests-reset",
            ],
            [
                "anthropic-ratelimit-tokens-limit",
                "anthropic-ratelimit-tokens-remaining",
                "anthropic-ratelimit-tokens-reset",
            ],
        ],
        Api::Gemini | Api::Generic => return,
    };
    let mut value = String::with_capacity(24);
    for ([limit, remaining, reset], quota) in names.into_iter().zip([requests, tokens]) {
        let Some(quota) = quota else { continue };
        for (name, n) in [(limit, quota.limit), (remaining, quota.left())] {
            value.clear();
            push_decimal(&mut value, n);
            emit(name, &value);
        }
        value.clear();
        if api == Api::Openai {
            push_go_duration(&mut value, quota.reset_after);
        } else {
            let at = ceil_secs(now.saturating_add(quota.reset_after));
            value.push_str(&format_rfc3339(at.saturating_mul(NANOS_PER_SEC)));
        }
        emit(reset, &value);
    }
}

/// Calls `emit` with Anthropic's input and output token headers,
/// `anthropic-ratelimit-{input,output}-tokens-{limit,remaining,reset}` (Anthropic's rate-limit
/// reference), from `input` and `output`: the enforcing token budgets with the fewest left among
/// those that count input tokens alone and those that count output tokens alone. The reset is
/// the instant the bucket is full again in RFC 3339, as the other families' are. Either family is
/// left out when no such policy applied.
pub fn each_anthropic_side_header(
    input: Option<&Quota>,
    output: Option<&Quota>,
    now: u64,
    mut emit: impl FnMut(&'static str, &str),
) {
    let names = [
        [
            "anthropic-ratelimit-input-tokens-limit",
            "anthropic-ratelimit-input-tokens-remaining",
            "anthropic-ratelimit-input-tokens-reset",
        ],
        [
            "anthropic-ratelimit-output-tokens-limit",
            "anthropic-ratelimit-output-tokens-remaining",
            "anthropic-ratelimit-output-tokens-reset",
        ],
    ];
    let mut value = String::with_capacity(24);
    for ([limit, remaining, reset], quota) in names.into_iter().zip([input, output]) {
        let Some(quota) = quota else { continue };
        for (name, n) in [(limit, quota.limit), (remaining, quota.left())] {
            value.clear();
            push_decimal(&mut value, n);
            emit(name, &value);
        }
        let at = ceil_secs(now.saturating_add(quota.reset_after));
        emit(reset, &format_rfc3339(at.saturating_mul(NANOS_PER_SEC)));
    }
}

/// A duration as Go's `time.Duration` writes it, which OpenAI's reset headers are: under a
/// second in whole milliseconds rounded up (`0s` for none), else whole seconds rounded up with
/// the larger units before them (`34s`, `6m0s`, `1h0m5s`).
fn push_go_duration(value: &mut String, nanos: u64) {
    if nanos == 0 {
        value.push_str("0s");
        return;
    }
    if nanos < NANOS_PER_SEC {
        push_decimal(value, nanos.div_ceil(1_000_000));
        value.push_str("ms");
        return;
    }
    let secs = ceil_secs(nanos);
    let (hours, minutes, seconds) = (secs / 3600, secs / 60 % 60, secs % 60);
    if hours > 0 {
        push_decimal(value, hours);
        value.push('h');
    }
    if hours > 0 || minutes > 0 {
        push_decimal(value, minutes);
        value.push('m');
    }
    push_decimal(value, seconds);
    value.push('s');
}

/// A parameter's value in a draft field: an Integer or a String.
enum Param {
    Number(u64),
    Text(&'static str),
}

/// A structured-field list of one item into `value`: `"<policy>";<name>=<value>...`.
/// Appends one list item: the policy's name, then its parameters.
fn item<'a>(value: &mut String, policy: &str, params: impl Iterator<Item = &'a (&'a str, Param)>) {
    value.push('"');
    value.push_str(policy);
    value.push('"');
    for (name, param) in params {
        value.push(';');
        value.push_str(name);
        value.push('=');
        match param {
            Param::Number(n) => push_decimal(value, *n),
            Param::Text(text) => {
                value.push('"');
                value.push_str(text);
                value.push('"');
            }
        }
    }
}

/// `Retry-After` in whole seconds: rounded up, and at least 1.
pub fn retry_after_secs(retry_after: u64) -> u64 {
    ceil_secs(retry_after).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::duration::NANOS_PER_SEC;

    /// 100 a minute with a burst of 20: a full refill takes 12 s.
    const QUOTA: Quota = Quota {
        policy: "per-user",
        limit: 20,
        requests: 100,
        per_nanos: 60 * NANOS_PER_SEC,
        remaining: 7,
        reset_after: 2_500_000_000,
        retry_after: None,
        unit: QuotaUnit::Requests,
    };
    const NOW: u64 = 1_700_000_000_250_000_000;

    fn rate_limit_headers(
        style: HeaderStyle,
        quota: &Quota,
        now: u64,
    ) -> Vec<(&'static str, String)> {
        let mut headers = Vec::new();
        each_rate_limit_header(style, quota, &[], now, |name, value| {
            headers.push((name, value.to_string()));
        });
        headers
    }

    #[test]
    fn a_concurrency_quota_counts_requests_in_flight_without_a_window() {
        let streams = Quota {
            policy: "streams",
            limit: 4,
            remaining: 1,
            unit: QuotaUnit::ConcurrentRequests,
            ..QUOTA
        };
        let headers = rate_limit_headers(HeaderStyle::Both, &streams, NOW);
        assert_eq!(
            headers,
            [
                ("x-ratelimit-limit", "4".to_string()),
                ("x-ratelimit-remaining", "1".to_string()),
                (
                    "ratelimit-policy",
                    r#""streams";q=4;qu="concurrent-requests""#.to_string()
                ),
                ("ratelimit", r#""streams";r=1"#.to_string()),
            ]
        );
        let refused = Quota {
            remaining: 0,
            retry_after: Some(2 * NANOS_PER_SEC),
            ..streams
        };
        let headers = rate_limit_headers(HeaderStyle::Draft, &refused, NOW);
        assert_eq!(headers[1].1, r#""streams";r=0;t=2"#);
    }

    #[test]
    fn a_token_quota_says_its_unit_with_a_parameter_of_sluices_own() {
        let tokens = Quota {
            unit: QuotaUnit::Tokens,
            ..QUOTA
        };
        let headers = rate_limit_headers(HeaderStyle::Draft, &tokens, NOW);
        assert_eq!(headers[0].1, r#""per-user";q=20;w=12;sluice-unit="tokens""#);
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
    fn draft_headers_give_the_burst_over_a_full_refill_and_the_seconds_to_full() {
        let headers = rate_limit_headers(HeaderStyle::Draft, &QUOTA, NOW);
        assert_eq!(
            headers,
            [
                ("ratelimit-policy", r#""per-user";q=20;w=12"#.to_string()),
                ("ratelimit", r#""per-user";r=7;t=3"#.to_string()),
            ]
        );
    }

    #[test]
    fn a_denial_gives_its_wait_as_the_effective_window() {
        let denied = Quota {
            remaining: 0,
            retry_after: Some(600_000_000),
            ..QUOTA
        };
        let headers = rate_limit_headers(HeaderStyle::Draft, &denied, NOW);
        assert_eq!(headers[1].1, r#""per-user";r=0;t=1"#);
    }

    #[test]
    fn remaining_never_exceeds_the_limit() {
        let over = Quota {
            remaining: 25,
            ..QUOTA
        };
        let headers = rate_limit_headers(HeaderStyle::Both, &over, NOW);
        assert_eq!(headers[1].1, "20");
        assert_eq!(headers[4].1, r#""per-user";r=20;t=3"#);
    }

    #[test]
    fn the_quota_over_its_window_is_the_rate_in_whole_seconds() {
        let sec = NANOS_PER_SEC;
        assert_eq!(quota_and_window(5, 1, sec), (5, 5), "burst 5 at 1/s");
        assert_eq!(quota_and_window(3, 10, 60 * sec), (3, 18));
        assert_eq!(quota_and_window(100, 100, 60 * sec), (100, 60));
        assert_eq!(quota_and_window(5, 3, sec), (6, 2), "5/3 s is not whole");
        assert_eq!(quota_and_window(10, 10, sec / 2), (20, 1), "10 per 500 ms");
        assert_eq!(quota_and_window(1, 1, 86_400 * sec), (1, 86_400));
    }

    proptest::proptest! {
        /// q / w is the rate exactly, q covers the limit, and no smaller window would do.
        #[test]
        fn quota_and_window_are_the_rate_exactly(
            limit in 1u64..1_000_000,
            requests in 1u64..1_000_000,
            per_ms in 1u64..100_000_000,
        ) {
            let per_nanos = per_ms * 1_000_000;
            let (q, w) = quota_and_window(limit, requests, per_nanos);
            proptest::prop_assert!(q >= limit && w >= 1);
            proptest::prop_assert_eq!(
                u128::from(q) * u128::from(per_nanos),
                u128::from(w) * u128::from(requests) * u128::from(NANOS_PER_SEC)
            );
        }
    }

    #[test]
    fn a_policy_that_allows_nothing_has_a_quota_of_zero_over_its_window() {
        assert_eq!(quota_and_window(0, 0, 60 * NANOS_PER_SEC), (0, 60));
        assert_eq!(quota_and_window(0, 0, 1), (0, 1));
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
            let quota = Quota { limit, remaining, reset_after, requests: limit.max(1), ..QUOTA };
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

    fn provider_headers(
        api: Api,
        requests: Option<&Quota>,
        tokens: Option<&Quota>,
    ) -> Vec<(&'static str, String)> {
        let mut headers = Vec::new();
        each_provider_header(api, requests, tokens, NOW, |name, value| {
            headers.push((name, value.to_string()));
        });
        headers
    }

    const TOKENS: Quota = Quota {
        policy: "tokens",
        limit: 10_000,
        requests: 10_000,
        per_nanos: 60 * NANOS_PER_SEC,
        remaining: 9_950,
        reset_after: 300_000_000,
        retry_after: None,
        unit: QuotaUnit::Tokens,
    };

    #[test]
    fn openai_headers_give_requests_and_tokens_apart_with_go_durations() {
        let headers = provider_headers(Api::Openai, Some(&QUOTA), Some(&TOKENS));
        let expected = [
            ("x-ratelimit-limit-requests", "20"),
            ("x-ratelimit-remaining-requests", "7"),
            ("x-ratelimit-reset-requests", "3s"),
            ("x-ratelimit-limit-tokens", "10000"),
            ("x-ratelimit-remaining-tokens", "9950"),
            ("x-ratelimit-reset-tokens", "300ms"),
        ];
        let expected: Vec<_> = expected.iter().map(|(n, v)| (*n, v.to_string())).collect();
        assert_eq!(headers, expected);
    }

    #[test]
    fn anthropic_headers_give_the_reset_as_an_rfc3339_instant() {
        // NOW is 2023-11-14T22:13:20.25Z; the requests bucket is full 2.5 s later.
        let headers = provider_headers(Api::Anthropic, Some(&QUOTA), None);
        let expected = [
            ("anthropic-ratelimit-requests-limit", "20"),
            ("anthropic-ratelimit-requests-remaining", "7"),
            ("anthropic-ratelimit-requests-reset", "2023-11-14T22:13:23Z"),
        ];
        let expected: Vec<_> = expected.iter().map(|(n, v)| (*n, v.to_string())).collect();
        assert_eq!(headers, expected);
    }

    #[test]
    fn anthropic_input_and_output_token_headers_come_from_their_own_budgets() {
        let input = Quota {
            policy: "input",
            remaining: 40_000,
            limit: 80_000,
            ..TOKENS
        };
        let mut headers = Vec::new();
        each_anthropic_side_header(Some(&input), Some(&TOKENS), NOW, |name, value| {
            headers.push((name, value.to_string()));
        });
        // TOKENS is full again 300 ms after NOW (…:20.25Z): at …:20.55Z, whole seconds up.
        let expected = [
            ("anthropic-ratelimit-input-tokens-limit", "80000"),
            ("anthropic-ratelimit-input-tokens-remaining", "40000"),
            (
                "anthropic-ratelimit-input-tokens-reset",
                "2023-11-14T22:13:21Z",
            ),
            ("anthropic-ratelimit-output-tokens-limit", "10000"),
            ("anthropic-ratelimit-output-tokens-remaining", "9950"),
            (
                "anthropic-ratelimit-output-tokens-reset",
                "2023-11-14T22:13:21Z",
            ),
        ];
        let expected: Vec<_> = expected.iter().map(|(n, v)| (*n, v.to_string())).collect();
        assert_eq!(headers, expected);
        let mut none = Vec::new();
        each_anthropic_side_header(None, None, NOW, |name, _| none.push(name));
        assert!(none.is_empty());
    }

    #[test]
    fn gemini_and_generic_have_no_headers_of_their_own() {
        for api in [Api::Gemini, Api::Generic] {
            assert!(provider_headers(api, Some(&QUOTA), Some(&TOKENS)).is_empty());
        }
    }

    #[test]
    fn go_durations_are_written_as_go_writes_them() {
        for (nanos, text) in [
            (0, "0s"),
            (1, "1ms"),
            (12_000_000, "12ms"),
            (NANOS_PER_SEC, "1s"),
            (34 * NANOS_PER_SEC, "34s"),
            (360 * NANOS_PER_SEC, "6m0s"),
            (3_725 * NANOS_PER_SEC - 1, "1h2m5s"),
        ] {
            let mut value = String::new();
            push_go_duration(&mut value, nanos);
            assert_eq!(value, text, "{nanos}");
        }
    }
}
