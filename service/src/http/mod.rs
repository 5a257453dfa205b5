//! The HTTP side: routes, the bearer token, the body limit, JSON responses, and the accept loop
//! (through the connection `Gate`) with its graceful shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, ETAG, IF_NONE_MATCH};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use serde::Serialize;
use tokio::net::TcpListener;
use tracing::{debug, warn};

use crate::admin::overrides::OverrideTable;
use crate::admin::{Admin, PREFIX};
use crate::auth::Guard;
use crate::connections::{Gate, Server};
use crate::decision::check::{self, BadRequest, Bounds, CheckResponse, CheckResult};
use crate::decision::settle::{self, SettleResponse};
use crate::decision::slot_watch::SlotWatch;
use crate::fleet::{self, Announcement};
use crate::health::{NotReady, Readiness};
use crate::logging::Throttle;
use crate::metrics::{self, Metrics};
use crate::stores::{Check, Store, StoreError};
use crate::web::{error, json, read_body, reply, unauthorized, Limits, Reply};

/// `--max-request-bytes`'s default: the largest body of a check, and of an RLS call.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 64 * 1024;
/// The most bytes hyper buffers of a request's head (and of a body between reads).
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// How long a client may take to send a body once the headers are in.
const WARN_EVERY: Duration = Duration::from_secs(10);
/// The paths served; any other counts as `other` in the metrics.
const PATHS: [&str; 6] = [
    "/v1/check",
    "/v1/settle",
    "/v1/overrides",
    "/healthz",
    "/readyz",
    "/metrics",
];

pub struct App<S> {
    store: Arc<S>,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    guard: Guard,
    limits: Limits,
    redis_warnings: Throttle,
    /// Settlements refused one by one (`settle::Parsed::rejected`).
    rejection_warnings: Throttle,
    /// The keys of the slots granted lately, looked at for renewals.
    watch: Arc<SlotWatch>,
    /// The admin API (`/admin/...`), with `--admin-token-file`.
    admin: Option<Admin<S>>,
}

impl<S: Store> App<S> {
    pub fn new(
        store: Arc<S>,
        metrics: Arc<Metrics>,
        readiness: Arc<Readiness>,
        guard: Guard,
        limits: Limits,
        watch: Arc<SlotWatch>,
    ) -> Self {
        App {
            store,
            metrics,
            readiness,
            guard,
            limits,
            redis_warnings: Throttle::new(WARN_EVERY),
            rejection_warnings: Throttle::new(WARN_EVERY),
            watch,
            admin: None,
        }
    }

    /// Serves the admin API too.
    pub fn with_admin(mut self, admin: Admin<S>) -> Self {
        self.admin = Some(admin);
        self
    }

    /// Routes a request, then counts and (at debug level) logs it.
    pub async fn handle(&self, request: Request<Incoming>) -> Reply {
        let started = Instant::now();
        let method = request.method().clone();
        let path = PATHS.into_iter().find(|&p| p == request.uri().path());
        let admin = (self.admin.as_ref()).filter(|_| request.uri().path().starts_with(PREFIX));
        let path = path.or(admin.map(|_| "/admin"));
        if matches!(path, Some("/v1/check" | "/v1/settle" | "/v1/overrides")) {
            self.note_caller(&request);
        }
        let reply = match (&method, path) {
            (_, Some("/admin")) => match admin {
                Some(admin) => admin.handle(request).await,
                None => error(StatusCode::NOT_FOUND, "not_found", "/admin"),
            },
            (&Method::POST, Some("/v1/check")) => self.check(request).await,
            (&Method::POST, Some("/v1/settle")) => self.settle(request).await,
            (&Method::GET, Some("/v1/overrides")) => self.overrides(&request),
            (&Method::GET, Some("/healthz")) => json(StatusCode::OK, &Status { status: "ok" }),
            (&Method::GET, Some("/readyz")) => self.readyz(),
            (&Method::GET, Some("/metrics")) => reply(
                StatusCode::OK,
                metrics::CONTENT_TYPE,
                self.metrics.render().into(),
            ),
            (_, Some(_)) => error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                method.as_str(),
            ),
            (_, None) => error(StatusCode::NOT_FOUND, "not_found", request.uri().path()),
        };
        let path = path.unwrap_or("other");
        let status = reply.status().as_u16();
        self.metrics.record_http(path, status);
        let micros = started.elapsed().as_micros();
        debug!(method = method.as_str(), path, status, micros, "request");
        reply
    }

    /// Keeps who a filter's call says it is (`crate::fleet`), when it says so (once in 10 s per
    /// worker) with the service's token, and the admin API is served.
    fn note_caller(&self, request: &Request<Incoming>) {
        let (Some(admin), headers) = (&self.admin, request.headers()) else {
            return;
        };
        let value = |name: &str| headers.get(name).map(HeaderValue::as_bytes);
        if value(fleet::WORKER).is_none() || !self.guard.admits(value(AUTHORIZATION.as_str())) {
            return;
        }
        let said = Announcement::of(
            value(fleet::ENVOY),
            value(fleet::WORKER),
            value(fleet::DROPPED),
        );
        if let Some(said) = said {
            admin.fleet.note(admin.fleet.now_s(), &said);
        }
    }

    /// The token first, then validation: neither an unauthorized nor a bad request reaches the
    /// store.
    async fn check(&self, request: Request<Incoming>) -> Reply {
        let mut checks = match self.admit(request, check::parse).await {
            Ok(checks) => checks,
            Err(reply) => return reply,
        };
        if let Some(admin) = &self.admin {
            admin.overrides.apply(&mut checks);
        }
        let started = Instant::now();
        let decided = self.store.check(&checks).await;
        self.metrics.observe_check_duration(started.elapsed());
        match decided {
            Ok(decisions) => {
                self.metrics.record_decisions(&checks, &decisions);
                self.watch.note(&checks, &decisions);
                if let Some(recorder) = self.admin.as_ref().and_then(|a| a.top.as_deref()) {
                    crate::top::record_checks(recorder, &checks, &decisions);
                }
                let results = decisions.into_iter().map(CheckResult::from).collect();
                json(StatusCode::OK, &CheckResponse { results })
            }
            Err(failure) => self.redis_unavailable(&checks, &failure),
        }
    }

    /// As `check`: the same token, body limits and strictness. Settlements are not on a
    /// request's path: no latency is observed, and the filter retries a 503.
    async fn settle(&self, request: Request<Incoming>) -> Reply {
        let parsed = match self.admit(request, settle::parse).await {
            Ok(parsed) => parsed,
            Err(reply) => return reply,
        };
        let rejected = parsed.rejected.len() as u64;
        self.metrics
            .record_rejected(parsed.rejected.iter().map(|(op, _)| *op));
        if let Some((op, error)) = parsed.rejected.first() {
            if let Some(others) = self.rejection_warnings.pass() {
                let error = error.detail.as_str();
                warn!(op, error, rejected, others, "settlements rejected");
            }
        }
        if let Some(refusal) = parsed.refusal() {
            return error(StatusCode::BAD_REQUEST, "bad_request", &refusal.detail);
        }
        let settlements = parsed.settlements;
        match self.store.settle(&settlements).await {
            Ok(done) => {
                self.metrics.record_settlements(&settlements, &done);
                if let Some(recorder) = self.admin.as_ref().and_then(|a| a.top.as_deref()) {
                    crate::top::record_settlements(recorder, &settlements, &done);
                }
                let settled = done.iter().filter(|d| d.changed()).count() as u64;
                json(StatusCode::OK, &SettleResponse { settled, rejected })
            }
            Err(failure) => {
                self.metrics
                    .record_settle_failure(&settlements, failure.kind);
                self.warn_redis(&failure);
                redis_unavailable(&failure)
            }
        }
    }

    /// The bearer token, then the body parsed by `parse` under the limits: what a POST to the
    /// API must pass before it reaches the store; the reply that refuses it otherwise.
    async fn admit<T>(
        &self,
        request: Request<Incoming>,
        parse: impl FnOnce(&[u8], &Bounds) -> Result<T, BadRequest>,
    ) -> Result<T, Reply> {
        let authorization = request.headers().get(AUTHORIZATION);
        if !self.guard.admits(authorization.map(HeaderValue::as_bytes)) {
            return Err(unauthorized());
        }
        (read_body(request, &self.limits, parse).await)
            .map_err(|bad| error(StatusCode::BAD_REQUEST, "bad_request", &bad.detail))
    }

    /// The overrides for the filters to pull: the `http` ones this replica applies, with the
    /// filters' token; a bodiless 304 when the caller holds this version (`If-None-Match`).
    /// Read from the replica's own table, never from the store: a pull costs Redis nothing.
    fn overrides(&self, request: &Request<Incoming>) -> Reply {
        let authorization = request.headers().get(AUTHORIZATION);
        if !self.guard.admits(authorization.map(HeaderValue::as_bytes)) {
            return unauthorized();
        }
        let listed = match &self.admin {
            Some(admin) => admin.overrides.listing(),
            None => OverrideTable::default().listing(),
        };
        let held = request.headers().get(IF_NONE_MATCH);
        let unchanged = held.is_some_and(|v| v.as_bytes() == listed.version.as_bytes());
        let mut answer = if unchanged {
            reply(StatusCode::NOT_MODIFIED, "application/json", Bytes::new())
        } else {
            reply(StatusCode::OK, "application/json", listed.body.clone())
        };
        if let Ok(etag) = HeaderValue::from_str(&listed.version) {
            answer.headers_mut().insert(ETAG, etag);
        }
        answer
    }

    fn readyz(&self) -> Reply {
        match self.readiness.check() {
            Ok(()) => json(StatusCode::OK, &Status { status: "ready" }),
            Err(NotReady::Redis(detail)) => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "redis_unavailable",
                &detail,
            ),
            Err(NotReady::ShuttingDown) => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "the service is stopping",
            ),
        }
    }

    /// 503: the filter applies the policy's failure mode.
    fn redis_unavailable(&self, checks: &[Check], failure: &StoreError) -> Reply {
        self.metrics.record_failure(checks, failure.kind);
        self.warn_redis(failure);
        redis_unavailable(failure)
    }

    fn warn_redis(&self, failure: &StoreError) {
        if let Some(others) = self.redis_warnings.pass() {
            let (kind, error) = (failure.kind.name(), failure.detail.as_str());
            warn!(kind, error, others, "checks failed on Redis (503)");
        }
    }
}

fn redis_unavailable(failure: &StoreError) -> Reply {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "redis_unavailable",
        &failure.detail,
    )
}

#[derive(Serialize)]
struct Status {
    status: &'static str,
}

/// Serves HTTP/1.1 on `listener` until `shutdown` completes, each connection in its own task,
/// every one through `gate`; then stops accepting and lets the requests in flight finish within
/// `drain`. Idle keep-alive connections are closed at once, busy ones after their current
/// response. True if every connection was done within `drain`.
pub async fn serve<S: Store>(
    listener: TcpListener,
    app: Arc<App<S>>,
    gate: Arc<Gate>,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) -> bool {
    let connections = GracefulShutdown::new();
    // The gate's deadlines are the ones that count; hyper's own (which runs from the last
    // answer) only backs up the idle timeout.
    let idle_timeout = gate.limits().idle_timeout;
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            stream = gate.accept(&listener, Server::Http) => stream,
            () = &mut shutdown => break,
        };
        let (app, activity) = (Arc::clone(&app), stream.activity());
        let service = hyper::service::service_fn(move |request| {
            let (app, activity) = (Arc::clone(&app), activity.clone());
            async move {
                let _answering = activity.answering();
                Ok::<_, Infallible>(app.handle(request).await)
            }
        });
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(idle_timeout)
            .max_buf_size(MAX_HEAD_BYTES)
            .serve_connection(TokioIo::new(stream), service);
        // Errors here are clients going away mid-request; nothing to do about them.
        let watched = connections.watch(connection);
        tokio::spawn(async move { drop(watched.await) });
    }
    drop(listener);
    tokio::time::timeout(drain, connections.shutdown())
        .await
        .is_ok()
}
