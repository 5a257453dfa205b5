//! The local reply to a request sluice refuses, in the client's protocol: over plain HTTP a
//! status and body (a JSON 429 unless the policy's `denial` says otherwise), to a gRPC client
//! a trailers-only answer whose `grpc-status` is `RESOURCE_EXHAUSTED` (or the policy's own) and
//! whose `grpc-message` names the policy. Also the response code details that Envoy's access
//! log shows for each kind of refusal.

use crate::config::{Api, Denial, GrpcStatus};
use crate::core::text::{push_decimal, push_json_string};
use crate::limiter::{Applied, Basis};
use smallvec::SmallVec;
use std::ops::Range;

/// `%RESPONSE_CODE_DETAILS%` of a request a policy denied.
pub const RATE_LIMITED: &str = "sluice_rate_limited";
/// `%RESPONSE_CODE_DETAILS%` of a request refused because a policy that fails closed could not
/// ask the rate-limit service.
pub const UNAVAILABLE: &str = "sluice_unavailable";
/// `%RESPONSE_CODE_DETAILS%` of a request refused because a policy needs its body, which is not
/// one JSON document the filter can read.
pub const UNREADABLE_BODY: &str = "sluice_unreadable_body";
/// `%RESPONSE_CODE_DETAILS%` of a request refused because it names a model that a spend budget
/// has no price for (`unknown_model: "refuse"`).
pub const MODEL_NOT_PRICED: &str = "sluice_model_not_priced";
/// `%RESPONSE_CODE_DETAILS%` of a request whose body is larger than the filter reads.
pub const BODY_TOO_LARGE: &str = "sluice_body_too_large";
/// `%RESPONSE_CODE_DETAILS%` of a request the filter answered at the status path (`status_path`),
/// with the client's quota or, to a method other than GET and HEAD, a 405.
pub const STATUS: &str = "sluice_status";
/// `%RESPONSE_CODE_DETAILS%` of a request the filter answered at its admin path (`admin`).
pub const ADMIN: &str = "sluice_admin";
/// `%RESPONSE_CODE_DETAILS%` of a request refused for want of a configuration.
pub const NOT_CONFIGURED: &str = "sluice_not_configured";

/// What a refusal tells the client besides its policy: how long to wait (nobody knows, for a
/// concurrency policy that sets no `retry_after`), and for a policy that reads its cost from the
/// response, the tokens the request would have reserved.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Said<'a> {
    pub retry_secs: Option<u64>,
    pub reserve: Option<u64>,
    /// The policy is a spend budget: its reservation is in micro-units of the currency.
    pub spend: bool,
    /// When more than one enforcing policy refused the request: each of them, the deciding one
    /// first. Empty otherwise.
    pub refused: &'a [Refused<'a>],
}

/// An enforcing policy that refused a request: what it has left, and how long it asks to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused<'a> {
    pub policy: &'a str,
    pub remaining: u64,
    pub retry_secs: Option<u64>,
}

/// Why a request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A policy's limit (or its slot stayed contended): the policy's `denial`.
    RateLimited,
    /// A policy that fails closed could not ask the service: 503, `UNAVAILABLE`.
    Unavailable,
}

impl Refusal {
    /// Why `denial` refuses its request.
    pub fn of(denial: &Applied) -> Refusal {
        match denial.basis {
            Basis::Unavailable => Refusal::Unavailable,
            _ => Refusal::RateLimited,
        }
    }

    /// The HTTP status of the refusal, the policy's `denial` being `denial`.
    pub fn status(self, denial: &Denial) -> u32 {
        match self {
            Refusal::RateLimited => denial.status,
            Refusal::Unavailable => 503,
        }
    }

    /// What `%RESPONSE_CODE_DETAILS%` shows of it.
    pub fn details(self) -> &'static str {
        match self {
            Refusal::RateLimited => RATE_LIMITED,
            Refusal::Unavailable => UNAVAILABLE,
        }
    }
}

/// Whether a request's `content-type` makes it a gRPC request, as Envoy decides it:
/// `application/grpc`, alone or followed by `+` (`application/grpc+proto`). gRPC-Web is not.
pub fn is_grpc(content_type: &[u8]) -> bool {
    content_type
        .strip_prefix(b"application/grpc")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(b"+"))
}

/// A local reply, as `proxy_send_local_response` takes it. To a gRPC request Envoy answers
/// with `:status` 200, `grpc-status` and the body as `grpc-message`, the headers added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub details: &'static str,
    pub grpc_status: GrpcStatus,
    pub body: String,
    /// Every header value, one after the other: one buffer whatever the number of headers
    /// (a flood of denials makes this a hot path)...
    values: String,
    /// ...and each header's name and the span of its value.
    headers: SmallVec<[(&'static str, Range<usize>); 8]>,
}

impl LocalReply {
    pub fn new(status: u32, details: &'static str, grpc_status: GrpcStatus, body: String) -> Self {
        LocalReply {
            status,
            details,
            grpc_status,
            body,
            values: String::with_capacity(128),
            headers: SmallVec::new(),
        }
    }

    /// The refusal of a request by `policy`, telling the client what `said` holds. The caller
    /// adds the rate-limit headers.
    pub fn refusal(
        refusal: Refusal,
        denial: &Denial,
        policy: &str,
        said: Said<'_>,
        grpc: bool,
    ) -> Self {
        let (status, details) = (refusal.status(denial), refusal.details());
        let (grpc_status, error, content_type) = match refusal {
            Refusal::RateLimited => (
                denial.grpc_status,
                "too_many_requests",
                denial.content_type.as_str(),
            ),
            Refusal::Unavailable => (
                GrpcStatus::Unavailable,
                "rate_limit_unavailable",
                "application/json",
            ),
        };
        let body = match (grpc, refusal, &denial.body) {
            (true, _, _) => grpc_message(error, policy, said),
            (false, Refusal::RateLimited, Some(body)) => body.clone(),
            (false, _, _) => match denial.api {
                Api::Generic => denial_body(error, policy, said),
                api => provider_body(api, refusal, status, policy, said),
            },
        };
        let mut reply = LocalReply::new(status, details, grpc_status, body);
        // A gRPC reply has Envoy's `application/grpc`: a second content-type would break it.
        if !grpc {
            reply.add_header("content-type", content_type);
        }
        if let Some(secs) = said.retry_secs {
            let mut retry = String::with_capacity(20);
            push_decimal(&mut retry, secs);
            reply.add_header("retry-after", &retry);
        }
        reply
    }

    pub fn add_header(&mut self, name: &'static str, value: &str) {
        let start = self.values.len();
        self.values.push_str(value);
        self.headers.push((name, start..self.values.len()));
    }

    pub fn headers(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.headers
            .iter()
            .map(|(name, span)| (*name, self.values.get(span.clone()).unwrap_or_default()))
    }

    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// The headers in the layout of a proxy-wasm header map: their count, each name's and
    /// value's length (32-bit little-endian), then each name and value followed by a NUL.
    pub fn encoded_headers(&self) -> Vec<u8> {
        let count = self.headers.len();
        let mut out = Vec::with_capacity(4 + count * 10 + self.values.len() + 64);
        let len = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes();
        out.extend_from_slice(&len(count));
        for (name, value) in self.headers() {
            out.extend_from_slice(&len(name.len()));
            out.extend_from_slice(&len(value.len()));
        }
        for (name, value) in self.headers() {
            for part in [name, value] {
                out.extend_from_slice(part.as_bytes());
                out.push(0);
            }
        }
        out
    }
}

/// The 400 refusing a request whose `model` the spend budget `policy` has no price for, in
/// `api`'s error shape (an invalid request, naming `model` as the parameter at fault), or
/// sluice's own `{"error":"model_not_priced","policy","model"}`.
pub fn unpriced_model(api: Api, policy: &str, model: &str) -> LocalReply {
    // The model is the client's text: escaped as a JSON string, within the message too.
    let mut quoted = String::with_capacity(model.len() + 2);
    push_json_string(&mut quoted, model);
    let mut message = String::with_capacity(quoted.len() + policy.len() + 48);
    for part in [
        "model ",
        &quoted,
        " has no price in spend budget \"",
        policy,
        "\"",
    ] {
        message.push_str(part);
    }
    let mut text = String::with_capacity(message.len() + 16);
    push_json_string(&mut text, &message);
    let parts: &[&str] = match api {
        Api::Generic => &[
            r#"{"error":"model_not_priced","policy":""#,
            policy,
            r#"","model":"#,
            &quoted,
            "}",
        ],
        Api::Openai => &[
            r#"{"error":{"message":"#,
            &text,
            r#","type":"invalid_request_error","param":"model","code":"model_not_priced"}}"#,
        ],
        Api::Anthropic => &[
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"#,
            &text,
            "}}",
        ],
        Api::Gemini => &[
            r#"{"error":{"code":400,"message":"#,
            &text,
            r#","status":"INVALID_ARGUMENT"}}"#,
        ],
    };
    let mut reply = LocalReply::new(
        400,
        MODEL_NOT_PRICED,
        GrpcStatus::InvalidArgument,
        parts.concat(),
    );
    reply.add_header("content-type", "application/json");
    reply
}

/// A refusal in a provider's error shape, as its SDK parses it, the message naming the policy
/// and the wait (`grpc_message`'s text; policy names need no JSON escaping).
/// - OpenAI: `{"error":{"message","type","param","code"}}`; the SDK's `APIError` takes `type`
///   and `code` from the `error` object. `type` is `tokens` for a metered policy, else
///   `requests`, as OpenAI's own 429s say; `code` is `rate_limit_exceeded`.
/// - Anthropic: `{"type":"error","error":{"type":"rate_limit_error","message"}}`.
/// - Gemini: Google's `{"error":{"code":429,"message","status":"RESOURCE_EXHAUSTED"}}`.
///
/// A policy that fails closed answers 503 in each provider's shape of an unavailable service.
fn provider_body(api: Api, refusal: Refusal, status: u32, policy: &str, said: Said<'_>) -> String {
    let limited = refusal == Refusal::RateLimited;
    let error = if limited {
        "rate limit exceeded"
    } else {
        "rate limit service unavailable"
    };
    let message = grpc_message(error, policy, said);
    let mut body = String::with_capacity(message.len() + 96);
    match api {
        Api::Openai => {
            let (kind, code) = match (limited, said.reserve.is_some()) {
                (true, true) => ("tokens", "rate_limit_exceeded"),
                (true, false) => ("requests", "rate_limit_exceeded"),
                (false, _) => ("server_error", "service_unavailable"),
            };
            for part in [
                r#"{"error":{"message":""#,
                &message,
                r#"","type":""#,
                kind,
                r#"","param":null,"code":""#,
                code,
                r#""}}"#,
            ] {
                body.push_str(part);
            }
        }
        Api::Anthropic => {
            let kind = if limited {
                "rate_limit_error"
            } else {
                "overloaded_error"
            };
            for part in [
                r#"{"type":"error","error":{"type":""#,
                kind,
                r#"","message":""#,
                &message,
                r#""}}"#,
            ] {
                body.push_str(part);
            }
        }
        Api::Gemini | Api::Generic => {
            let google = if limited {
                "RESOURCE_EXHAUSTED"
            } else {
                "UNAVAILABLE"
            };
            body.push_str(r#"{"error":{"code":"#);
            push_decimal(&mut body, u64::from(status));
            for part in [
                r#","message":""#,
                &message,
                r#"","status":""#,
                google,
                r#""}}"#,
            ] {
                body.push_str(part);
            }
        }
    }
    body
}

/// What a gRPC client reads in `grpc-message`: the error, the policy and the wait.
fn grpc_message(error: &str, policy: &str, said: Said<'_>) -> String {
    let mut message = String::with_capacity(error.len() + policy.len() + 48);
    for part in [error, ": policy ", policy] {
        message.push_str(part);
    }
    if let Some(tokens) = said.reserve {
        message.push_str(", reserving ");
        push_decimal(&mut message, tokens);
        message.push_str(if said.spend {
            " micro-units"
        } else {
            " tokens"
        });
    }
    if let Some(secs) = said.retry_secs {
        message.push_str(", retry after ");
        push_decimal(&mut message, secs);
        message.push('s');
    }
    for (i, other) in said.refused.iter().skip(1).enumerate() {
        message.push_str(if i == 0 {
            "; also policy "
        } else {
            ", policy "
        });
        message.push_str(other.policy);
        if let Some(secs) = other.retry_secs {
            message.push_str(" (retry after ");
            push_decimal(&mut message, secs);
            message.push_str("s)");
        }
    }
    message
}

/// The JSON body of a denial: `error` is `too_many_requests` (429) or `rate_limit_unavailable`
/// (503, a policy that fails closed).
pub fn denial_body(error: &str, policy: &str, said: Said<'_>) -> String {
    let mut body = String::with_capacity(error.len() + policy.len() + 64);
    for part in [r#"{"error":""#, error, r#"","policy":""#, policy, "\""] {
        body.push_str(part);
    }
    push_numbers(
        &mut body,
        [("retry_after", said.retry_secs), ("reserve", said.reserve)],
    );
    for (i, refused) in said.refused.iter().enumerate() {
        body.push_str(if i == 0 { r#","policies":["# } else { "," });
        for part in [r#"{"policy":""#, refused.policy, "\""] {
            body.push_str(part);
        }
        let remaining = Some(refused.remaining);
        push_numbers(
            &mut body,
            [
                ("remaining", remaining),
                ("retry_after", refused.retry_secs),
            ],
        );
        body.push('}');
    }
    if !said.refused.is_empty() {
        body.push(']');
    }
    body.push('}');
    body
}

/// `,"name":value` for each number that is there.
fn push_numbers<const N: usize>(body: &mut String, numbers: [(&str, Option<u64>); N]) {
    for (name, value) in numbers {
        if let Some(value) = value {
            body.push_str(",\"");
            body.push_str(name);
            body.push_str("\":");
            push_decimal(body, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(reply: &LocalReply) -> Vec<(&str, &str)> {
        reply.headers().collect()
    }

    #[test]
    fn a_plain_http_denial_is_the_documented_json_429() {
        let reply = LocalReply::refusal(
            Refusal::RateLimited,
            &Denial::default(),
            "per-user",
            Said {
                retry_secs: Some(3),
                reserve: None,
                spend: false,
                refused: &[],
            },
            false,
        );
        assert_eq!((reply.status, reply.details), (429, RATE_LIMITED));
        assert_eq!(
            reply.body,
            r#"{"error":"too_many_requests","policy":"per-user","retry_after":3}"#
        );
        assert_eq!(
            headers(&reply),
            [("content-type", "application/json"), ("retry-after", "3")]
        );
    }

    #[test]
    fn a_grpc_denial_is_resource_exhausted_naming_the_policy_without_a_content_type() {
        let reply = LocalReply::refusal(
            Refusal::RateLimited,
            &Denial::default(),
            "per-user",
            Said {
                retry_secs: Some(2),
                reserve: None,
                spend: false,
                refused: &[],
            },
            true,
        );
        assert_eq!(reply.grpc_status.code(), 8);
        assert_eq!(
            reply.body,
            "too_many_requests: policy per-user, retry after 2s"
        );
        assert_eq!(headers(&reply), [("retry-after", "2")]);
    }

    #[test]
    fn a_policy_that_fails_closed_answers_503_and_unavailable_whatever_its_denial() {
        let denial = Denial {
            status: 418,
            body: Some("teapot".into()),
            content_type: "text/plain".into(),
            grpc_status: GrpcStatus::Aborted,
            api: Api::Generic,
        };
        let http = LocalReply::refusal(
            Refusal::Unavailable,
            &denial,
            "global",
            Said {
                retry_secs: Some(1),
                reserve: None,
                spend: false,
                refused: &[],
            },
            false,
        );
        assert_eq!((http.status, http.details), (503, UNAVAILABLE));
        assert_eq!(
            http.body,
            r#"{"error":"rate_limit_unavailable","policy":"global","retry_after":1}"#
        );
        assert_eq!(http.header("content-type"), Some("application/json"));
        let grpc = LocalReply::refusal(
            Refusal::Unavailable,
            &denial,
            "global",
            Said {
                retry_secs: Some(1),
                reserve: None,
                spend: false,
                refused: &[],
            },
            true,
        );
        assert_eq!(grpc.grpc_status, GrpcStatus::Unavailable);
        assert_eq!(
            grpc.body,
            "rate_limit_unavailable: policy global, retry after 1s"
        );
    }

    #[test]
    fn a_configured_denial_sets_status_body_content_type_and_grpc_status() {
        let denial = Denial {
            status: 503,
            body: Some("slow down".into()),
            content_type: "text/plain; charset=utf-8".into(),
            grpc_status: GrpcStatus::Unavailable,
            api: Api::Generic,
        };
        let http = LocalReply::refusal(
            Refusal::RateLimited,
            &denial,
            "p",
            Said {
                retry_secs: Some(1),
                reserve: None,
                spend: false,
                refused: &[],
            },
            false,
        );
        assert_eq!((http.status, http.body.as_str()), (503, "slow down"));
        assert_eq!(
            http.header("content-type"),
            Some("text/plain; charset=utf-8")
        );
        let grpc = LocalReply::refusal(
            Refusal::RateLimited,
            &denial,
            "p",
            Said {
                retry_secs: Some(1),
                reserve: None,
                spend: false,
                refused: &[],
            },
            true,
        );
        assert_eq!(grpc.grpc_status.code(), 14);
        assert_eq!(grpc.body, "too_many_requests: policy p, retry after 1s");
    }

    #[test]
    fn grpc_is_told_by_the_content_type_as_envoy_tells_it() {
        for grpc in [
            "application/grpc",
            "application/grpc+proto",
            "application/grpc+json",
        ] {
            assert!(is_grpc(grpc.as_bytes()), "{grpc}");
        }
        for other in [
            "application/grpc-web",
            "application/grpc-web+proto",
            "application/json",
            "Application/gRPC",
            "",
        ] {
            assert!(!is_grpc(other.as_bytes()), "{other}");
        }
    }

    #[test]
    fn headers_are_encoded_as_a_proxy_wasm_map() {
        let mut reply = LocalReply::new(429, RATE_LIMITED, GrpcStatus::Unavailable, String::new());
        reply.add_header("a", "xy");
        reply.add_header("bc", "");
        let mut expected = Vec::new();
        for n in [2u32, 1, 2, 2, 0] {
            expected.extend_from_slice(&n.to_le_bytes());
        }
        expected.extend_from_slice(b"a\0xy\0bc\0\0");
        assert_eq!(reply.encoded_headers(), expected);
    }

    #[test]
    fn grpc_status_names_are_the_snake_case_of_grpcs_own() {
        let status: GrpcStatus = serde_json::from_str(r#""resource_exhausted""#).unwrap();
        assert_eq!(status, GrpcStatus::ResourceExhausted);
        let last: GrpcStatus = serde_json::from_str(r#""unauthenticated""#).unwrap();
        assert_eq!(last.code(), 16);
        assert!(serde_json::from_str::<GrpcStatus>(r#""ok""#).is_err());
    }

    fn provider_refusal(api: Api, reserve: Option<u64>) -> LocalReply {
        let denial = Denial {
            api,
            ..Denial::default()
        };
        let said = Said {
            retry_secs: Some(7),
            reserve,
            spend: false,
            refused: &[],
        };
        LocalReply::refusal(Refusal::RateLimited, &denial, "per-key", said, false)
    }

    #[test]
    fn an_openai_refusal_is_openais_error_object_naming_the_policy_and_the_wait() {
        assert_eq!(
            provider_refusal(Api::Openai, None).body,
            r#"{"error":{"message":"rate limit exceeded: policy per-key, retry after 7s","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#
        );
        let tokens = provider_refusal(Api::Openai, Some(500));
        let body: serde_json::Value = serde_json::from_str(&tokens.body).unwrap();
        assert_eq!(body["error"]["type"], "tokens");
        assert_eq!(
            body["error"]["message"],
            "rate limit exceeded: policy per-key, reserving 500 tokens, retry after 7s"
        );
        assert_eq!(tokens.header("retry-after"), Some("7"));
    }

    #[test]
    fn an_anthropic_refusal_is_a_rate_limit_error() {
        assert_eq!(
            provider_refusal(Api::Anthropic, None).body,
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"rate limit exceeded: policy per-key, retry after 7s"}}"#
        );
    }

    #[test]
    fn a_gemini_refusal_is_googles_resource_exhausted() {
        assert_eq!(
            provider_refusal(Api::Gemini, None).body,
            r#"{"error":{"code":429,"message":"rate limit exceeded: policy per-key, retry after 7s","status":"RESOURCE_EXHAUSTED"}}"#
        );
    }

    #[test]
    fn a_provider_refusal_of_a_policy_that_fails_closed_is_the_providers_unavailable() {
        let denial = Denial {
            api: Api::Openai,
            ..Denial::default()
        };
        let reply = LocalReply::refusal(Refusal::Unavailable, &denial, "g", Said::default(), false);
        assert_eq!(reply.status, 503);
        assert_eq!(
            reply.body,
            r#"{"error":{"message":"rate limit service unavailable: policy g","type":"server_error","param":null,"code":"service_unavailable"}}"#
        );
    }

    #[test]
    fn a_configured_body_wins_over_the_providers_shape() {
        let denial = Denial {
            api: Api::Anthropic,
            body: Some("no".into()),
            ..Denial::default()
        };
        let reply = LocalReply::refusal(Refusal::RateLimited, &denial, "p", Said::default(), false);
        assert_eq!(reply.body, "no");
    }

    #[test]
    fn denial_body_is_the_documented_json() {
        let body = denial_body(
            "too_many_requests",
            "per-user",
            Said {
                retry_secs: Some(3),
                reserve: None,
                spend: false,
                refused: &[],
            },
        );
        assert_eq!(
            body,
            r#"{"error":"too_many_requests","policy":"per-user","retry_after":3}"#
        );
        let parsed: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(parsed["retry_after"], 3);
    }
}
