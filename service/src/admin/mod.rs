//! The admin API, `/admin/v1/...`: JSON over the HTTP server's listener, behind tokens of its own
//! (`auth`: an admin token writes, a read-only token only reads). Every path is a `Route` of a
//! resource module (`keys`, `overrides`, `top`, `rlqs`, `envoys`); a write needs a `reason` and is audited (`Audit`: the log line
//! `admin write` and the metric `sluice_service_admin_writes`), whatever its outcome. Served only
//! with `--admin-token-file`; without it every `/admin/` path is 404. `console` is the
//! operators' web page over it (`/admin/console`, the one path served without a token: it holds
//! no data).

pub mod auth;
pub mod console;
pub mod envoys;
pub mod keys;
pub mod overrides;
pub mod rlqs;
pub mod top;

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION};
use hyper::{Method, Request, StatusCode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tracing::info;

use crate::decision::check::BadRequest;
use crate::fleet::Fleet;
use crate::rlqs::metrics::RlqsMetrics;
use crate::stores::Store;
use crate::top::TopRecorder;
use crate::web::{self, error, forbidden, read_body, unauthorized, Limits, Reply};

use self::auth::{AdminTokens, Caller, Role};
use self::overrides::OverrideTable;

/// Every admin path starts so; the HTTP server hands them all here.
pub const PREFIX: &str = "/admin/";
/// The longest `reason` of a write: it goes into the audit line whole.
pub const MAX_REASON_BYTES: usize = 500;

/// One path of the API: its method, whether it changes state (then it needs the admin role, a
/// `reason`, and is audited), and the action's name in the audit line and the metric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub method: Method,
    pub path: &'static str,
    pub action: &'static str,
    pub writes: bool,
}

/// Every route, resource by resource: a new resource adds its module's list here and its
/// module's `serve` to `Admin::dispatch`.
fn routes() -> impl Iterator<Item = &'static Route> {
    (keys::ROUTES.iter())
        .chain(overrides::ROUTES.iter())
        .chain(top::ROUTES.iter())
        .chain(rlqs::ROUTES.iter())
        .chain(envoys::ROUTES.iter())
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabels {
    action: &'static str,
    outcome: &'static str,
}

/// The audit trail of writes: one log line and one count each.
pub struct Audit {
    writes: Family<WriteLabels, Counter>,
}

impl Audit {
    /// Registers `sluice_service_admin_writes` in `registry`.
    pub fn new(registry: &mut Registry) -> Audit {
        let writes = Family::<WriteLabels, Counter>::default();
        registry.register(
            "admin_writes",
            "Writes through the admin API, by action and outcome (done, unchanged, refused, failed); \
             each is also the log line `admin write`",
            writes.clone(),
        );
        Audit { writes }
    }

    /// The log line and the count of one write: who (the token's name), what, on which target,
    /// why, and how it ended. The time is the log line's.
    pub fn record(
        &self,
        caller: &Caller,
        action: &'static str,
        target: &str,
        reason: &str,
        outcome: &'static str,
    ) {
        let who = caller.name.as_str();
        info!(
            who,
            action,
            state_key = target,
            reason,
            outcome,
            "admin write"
        );
        self.writes
            .get_or_create(&WriteLabels { action, outcome })
            .inc();
    }
}

/// The admin API over one store.
pub struct Admin<S> {
    pub(crate) store: Arc<S>,
    tokens: Arc<AdminTokens>,
    pub(crate) audit: Audit,
    pub(crate) limits: Limits,
    /// The overrides this replica applies to its checks.
    pub overrides: Arc<OverrideTable>,
    /// `--max-overrides`.
    pub max_overrides: u64,
    /// The heaviest keys (`/admin/v1/top`), recorded by the checks and the RLS.
    pub top: Option<Arc<TopRecorder>>,
    /// The RLQS's series (`/admin/v1/rlqs`), where it is served.
    pub rlqs: Option<Arc<RlqsMetrics>>,
    /// The Envoys that said who they are (`/admin/v1/envoys`).
    pub fleet: Arc<Fleet>,
}

impl<S: Store> Admin<S> {
    pub fn new(store: Arc<S>, tokens: Arc<AdminTokens>, audit: Audit, limits: Limits) -> Self {
        Admin {
            store,
            tokens,
            audit,
            limits,
            overrides: Arc::default(),
            max_overrides: overrides::MAX_OVERRIDES,
            top: Some(Arc::default()),
            rlqs: None,
            fleet: Arc::default(),
        }
    }

    /// Shows the RLQS this replica serves (`/admin/v1/rlqs`).
    pub fn with_rlqs(mut self, metrics: Option<Arc<RlqsMetrics>>) -> Self {
        self.rlqs = metrics;
        self
    }

    /// Records the heaviest keys in `recorder` (shared with the RLS).
    pub fn with_top(mut self, recorder: Arc<TopRecorder>) -> Self {
        self.top = Some(recorder);
        self
    }

    /// Applies and keeps the overrides in `table` (shared with the RLS).
    pub fn with_overrides(mut self, table: Arc<OverrideTable>) -> Self {
        self.overrides = table;
        self
    }

    /// Keeps at most `max` overrides.
    pub fn with_max_overrides(mut self, max: u64) -> Self {
        self.max_overrides = max;
        self
    }

    /// The console's page (no data); for every other path the token first (401 without a valid
    /// one, even on a path that does not exist, so that nobody maps the API without one), then
    /// the route (404, 405), then the role (403).
    pub async fn handle(&self, request: Request<Incoming>) -> Reply {
        // The console is a static page that holds no data: it reads the API with a token.
        if request.uri().path() == console::PATH && request.method() == Method::GET {
            return console::page();
        }
        let authorization = request.headers().get(AUTHORIZATION);
        let Some(caller) = self.tokens.caller(authorization.map(HeaderValue::as_bytes)) else {
            return unauthorized();
        };
        let route = match route(request.method(), request.uri().path(), &caller) {
            Ok(route) => route,
            Err(Miss::NotFound) => {
                return error(StatusCode::NOT_FOUND, "not_found", request.uri().path())
            }
            Err(Miss::Method) => {
                let method = request.method().as_str();
                return error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", method);
            }
            Err(Miss::Forbidden) => {
                return forbidden("a write needs an admin token; this one is read-only")
            }
        };
        self.dispatch(route, &caller, request).await
    }

    async fn dispatch(
        &self,
        route: &'static Route,
        caller: &Caller,
        request: Request<Incoming>,
    ) -> Reply {
        if route.path == "/admin/v1/top" {
            return top::serve(self, request).await;
        }
        if route.path == "/admin/v1/rlqs" {
            return rlqs::serve(self);
        }
        if route.path == "/admin/v1/envoys" {
            return envoys::serve(self);
        }
        if route.path.starts_with("/admin/v1/overrides") {
            return overrides::serve(self, route, caller, request).await;
        }
        keys::serve(self, route, caller, request).await
    }

    /// The body of a request, strictly parsed, under the server's body limits.
    pub(crate) async fn body<T: serde::de::DeserializeOwned>(
        &self,
        request: Request<Incoming>,
    ) -> Result<T, Reply> {
        read_body(request, &self.limits, |body, _| {
            crate::decision::check::deserialize(body)
        })
        .await
        .map_err(|bad| bad_request(&bad))
    }
}

/// Why a request has no route.
enum Miss {
    NotFound,
    Method,
    Forbidden,
}

/// The route of `method` and `path` for `caller`: none on no path (404), on a path with no
/// such method (405), or for a write of a read-only caller (403).
fn route(method: &Method, path: &str, caller: &Caller) -> Result<&'static Route, Miss> {
    if !routes().any(|r| r.path == path) {
        return Err(Miss::NotFound);
    }
    let route = routes().find(|r| r.path == path && r.method == method);
    let route = route.ok_or(Miss::Method)?;
    if route.writes && caller.role != Role::Admin {
        return Err(Miss::Forbidden);
    }
    Ok(route)
}

pub(crate) fn bad_request(bad: &BadRequest) -> Reply {
    error(StatusCode::BAD_REQUEST, "bad_request", &bad.detail)
}

/// Why a write is made: required, 1 to `MAX_REASON_BYTES` bytes (trimmed), no control
/// characters (it is written into a log line).
pub fn validate_reason(reason: Option<&str>, field: &str) -> Result<String, BadRequest> {
    let Some(reason) = reason else {
        return Err(BadRequest::new(
            field,
            "required for a write: why it is made, for the audit log",
        ));
    };
    let reason = reason.trim();
    if reason.is_empty() || reason.len() > MAX_REASON_BYTES {
        let reason = format!(
            "must be 1 to {MAX_REASON_BYTES} bytes, got {}",
            reason.len()
        );
        return Err(BadRequest::new(field, reason));
    }
    if reason.chars().any(char::is_control) {
        return Err(BadRequest::new(field, "must hold no control characters"));
    }
    Ok(reason.to_string())
}

/// The reply of a store that failed.
pub(crate) fn store_unavailable(detail: &str) -> Reply {
    web::error(StatusCode::SERVICE_UNAVAILABLE, "redis_unavailable", detail)
}
