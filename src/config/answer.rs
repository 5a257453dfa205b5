//! How a policy answers, as the configuration says: the local reply to the requests it denies
//! (status, body, gRPC status, whose API shape) and the rate-limit headers responses carry.
//! `reply` and `headers` build what these describe.

use serde::Deserialize;

/// The gRPC status codes a refusal can carry (every one but OK), by their names in the
/// configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrpcStatus {
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl GrpcStatus {
    /// The numeric code, as `grpc-status` carries it.
    pub fn code(self) -> i32 {
        self as i32
    }
}

/// The API a route speaks (`api`, on a policy or at the top of the configuration): a provider's
/// answers carry its error shape and its rate-limit headers, so that its SDK reads them as the
/// provider's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// sluice's own JSON body and the `headers` style alone.
    #[default]
    Generic,
    /// OpenAI's `{"error":{"message","type","param","code"}}` and `x-ratelimit-*-requests|tokens`.
    Openai,
    /// Anthropic's `{"type":"error","error":{"type","message"}}` and `anthropic-ratelimit-*`.
    Anthropic,
    /// Google's `{"error":{"code","message","status"}}`; Gemini sends no rate-limit headers.
    Gemini,
}

/// How a policy answers the requests it denies: its `denial` settings over the top-level ones
/// over these defaults (429, the JSON body, `RESOURCE_EXHAUSTED`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// 400-599.
    pub status: u32,
    /// `None`: the JSON body naming the policy and the wait.
    pub body: Option<String>,
    pub content_type: String,
    pub grpc_status: GrpcStatus,
    /// Whose error shape the default body takes.
    pub api: Api,
}

impl Default for Denial {
    fn default() -> Self {
        Denial {
            status: 429,
            body: None,
            content_type: "application/json".into(),
            grpc_status: GrpcStatus::ResourceExhausted,
            api: Api::Generic,
        }
    }
}

/// Which rate-limit headers responses carry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HeaderStyle {
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset` (Unix epoch seconds).
    #[default]
    Legacy,
    /// IETF httpapi-ratelimit-headers draft 11: `RateLimit-Policy` and `RateLimit`.
    Draft,
    Both,
    None,
}
