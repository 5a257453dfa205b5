//! The HTTP side: routes, the body limit, JSON responses, and the accept loop.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use tokio::net::TcpListener;

use crate::check::{self, BadRequest, CheckResponse, CheckResult};
use crate::metrics::Metrics;
use crate::store::{Check, Store, StoreError};

pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// How long a client may take to send a request's headers. hyper starts this timer when it
/// waits for the next request, so it is also how long an idle keep-alive connection stays
/// open: long, so that Envoy's pooled connections are not closed under it (its upstream
/// idle_timeout should be shorter than this).
const HEADER_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a client may take to send a body once the headers are in.
const BODY_TIMEOUT: Duration = Duration::from_secs(5);

type Reply = Response<Full<Bytes>>;

pub struct App<S> {
    store: S,
    metrics: Metrics,
}

impl<S: Store> App<S> {
    pub fn new(store: S) -> Self {
        App::with_metrics(store, Metrics::default())
    }

    /// With `metrics` holding the series other parts registered.
    pub fn with_metrics(store: S, metrics: Metrics) -> Self {
        App { store, metrics }
    }

    pub async fn handle(&self, request: Request<Incoming>) -> Reply {
        match (request.method(), request.uri().path()) {
            (&Method::POST, "/v1/check") => self.check(request).await,
            (&Method::GET, "/healthz") => self.healthz().await,
            (&Method::GET, "/metrics") => text(StatusCode::OK, self.metrics.render()),
            (_, "/v1/check" | "/healthz" | "/metrics") => error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                request.method().as_str(),
            ),
            (_, path) => error(StatusCode::NOT_FOUND, "not_found", path),
        }
    }

    /// Validation first: a bad request never reaches the store.
    async fn check(&self, request: Request<Incoming>) -> Reply {
        let checks = match read_checks(request).await {
            Ok(checks) => checks,
            Err(bad) => {
                self.metrics.record_bad_request();
                return error(StatusCode::BAD_REQUEST, "bad_request", &bad.detail);
            }
        };
        let started = Instant::now();
        let decided = self.store.check(&checks).await;
        self.metrics.record_latency(started.elapsed());
        match decided {
            Ok(decisions) => {
                self.metrics.record_decisions(&decisions);
                let results = decisions.into_iter().map(CheckResult::from).collect();
                json(StatusCode::OK, &CheckResponse { results })
            }
            Err(failure) => self.redis_unavailable(&failure),
        }
    }

    async fn healthz(&self) -> Reply {
        match self.store.ping().await {
            Ok(()) => json(StatusCode::OK, &Status { status: "ok" }),
            Err(failure) => self.redis_unavailable(&failure),
        }
    }

    /// 503: the filter applies the policy's failure mode.
    fn redis_unavailable(&self, failure: &StoreError) -> Reply {
        self.metrics.record_redis_error();
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "redis_unavailable",
            &failure.0,
        )
    }
}

/// Content type, size (declared, then actual), then the JSON itself.
async fn read_checks(request: Request<Incoming>) -> Result<Vec<Check>, BadRequest> {
    let headers = request.headers();
    if !is_json(headers.get(CONTENT_TYPE)) {
        return Err(BadRequest::new("content-type", "must be application/json"));
    }
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > MAX_BODY_BYTES as u64) {
        return Err(too_large());
    }
    let body = Limited::new(request.into_body(), MAX_BODY_BYTES).collect();
    match tokio::time::timeout(BODY_TIMEOUT, body).await {
        Ok(Ok(collected)) => check::parse(&collected.to_bytes()),
        Ok(Err(failure)) if failure.is::<http_body_util::LengthLimitError>() => Err(too_large()),
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

fn too_large() -> BadRequest {
    BadRequest::new("body", format!("larger than {MAX_BODY_BYTES} bytes"))
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
struct Status {
    status: &'static str,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    detail: &'a str,
}

fn error(status: StatusCode, error: &str, detail: &str) -> Reply {
    json(status, &ErrorBody { error, detail })
}

fn json(status: StatusCode, body: &impl Serialize) -> Reply {
    match serde_json::to_vec(body) {
        Ok(bytes) => reply(status, "application/json", bytes.into()),
        Err(_) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            "application/json",
            Bytes::from_static(br#"{"error":"internal","detail":"response encoding failed"}"#),
        ),
    }
}

fn text(status: StatusCode, body: String) -> Reply {
    reply(status, "text/plain; version=0.0.4", body.into())
}

fn reply(status: StatusCode, content_type: &'static str, body: Bytes) -> Reply {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// Serves HTTP/1.1 on `listener` until `shutdown` completes; each connection is its own task.
pub async fn serve<S: Store>(
    listener: TcpListener,
    app: Arc<App<S>>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => return,
        };
        match accepted {
            Ok((stream, _)) => {
                tokio::spawn(serve_connection(TokioIo::new(stream), Arc::clone(&app)));
            }
            // Usually out of file descriptors: pause instead of spinning.
            Err(failure) => {
                eprintln!("sluice-service: accept failed: {failure}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn serve_connection<S: Store>(io: TokioIo<tokio::net::TcpStream>, app: Arc<App<S>>) {
    let service = hyper::service::service_fn(move |request| {
        let app = Arc::clone(&app);
        async move { Ok::<_, Infallible>(app.handle(request).await) }
    });
    // Errors here are clients going away mid-request; nothing to do about them.
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(io, service)
        .await;
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
