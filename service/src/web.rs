//! The HTTP plumbing every HTTP front shares (`http`, `admin`): a JSON body read within its
//! bounds, JSON replies, and the one error shape, `{"error", "detail"}`.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Request, Response, StatusCode};
use serde::Serialize;

use crate::decision::check::{BadRequest, Bounds};

/// A reply to an HTTP request.
pub type Reply = Response<Full<Bytes>>;

const BODY_TIMEOUT: Duration = Duration::from_secs(5);
/// At most one warning per this long about failed checks.
/// What every check is bounded by: `--max-key-ttl`, `--max-request-bytes`.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub bounds: Bounds,
    pub max_body_bytes: usize,
}

/// Content type, size (declared, then actual), then the JSON itself, by `parse`.
pub async fn read_body<T>(
    request: Request<Incoming>,
    limits: &Limits,
    parse: impl FnOnce(&[u8], &Bounds) -> Result<T, BadRequest>,
) -> Result<T, BadRequest> {
    let headers = request.headers();
    if !is_json(headers.get(CONTENT_TYPE)) {
        return Err(BadRequest::new("content-type", "must be application/json"));
    }
    let max = limits.max_body_bytes;
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > max as u64) {
        return Err(too_large(max));
    }
    let body = Limited::new(request.into_body(), max).collect();
    match tokio::time::timeout(BODY_TIMEOUT, body).await {
        Ok(Ok(collected)) => parse(&collected.to_bytes(), &limits.bounds),
        Ok(Err(failure)) if failure.is::<http_body_util::LengthLimitError>() => Err(too_large(max)),
        Ok(Err(failure)) => Err(BadRequest::new(
            "body",
            format!("could not be read: {failure}"),
        )),
        Err(_) => Err(BadRequest::new(
            "body",
            format!("not received within {BODY_TIMEOUT:?}"),
        )),
    }
}

fn too_large(max: usize) -> BadRequest {
    BadRequest::new("body", format!("larger than {max} bytes"))
}

/// `application/json`, parameters (`; charset=utf-8`) allowed.
fn is_json(content_type: Option<&HeaderValue>) -> bool {
    let Some(value) = content_type.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json")
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    detail: &'a str,
}

pub fn error(status: StatusCode, error: &str, detail: &str) -> Reply {
    json(status, &ErrorBody { error, detail })
}

pub fn json(status: StatusCode, body: &impl Serialize) -> Reply {
    match serde_json::to_vec(body) {
        Ok(bytes) => reply(status, "application/json", bytes.into()),
        Err(_) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            "application/json",
            Bytes::from_static(br#"{"error":"internal","detail":"response encoding failed"}"#),
        ),
    }
}

/// 403: a valid token that may not do this.
pub fn forbidden(detail: &str) -> Reply {
    error(StatusCode::FORBIDDEN, "forbidden", detail)
}

/// 401, with the challenge RFC 6750 asks for.
pub fn unauthorized() -> Reply {
    let detail = "a valid bearer token is required";
    let mut response = error(StatusCode::UNAUTHORIZED, "unauthorized", detail);
    (response.headers_mut()).insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

pub fn reply(status: StatusCode, content_type: &'static str, body: Bytes) -> Reply {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_content_types_may_carry_parameters() {
        let accepted = [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
        ];
        for value in accepted {
            assert!(is_json(Some(&HeaderValue::from_static(value))), "{value}");
        }
        for value in ["text/plain", "application/jsonx", ""] {
            assert!(!is_json(Some(&HeaderValue::from_static(value))), "{value}");
        }
        assert!(!is_json(None));
    }
}
