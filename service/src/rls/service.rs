//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over a `Store`: the token,
//! plan, one store call for every limit of the request (two with
//! `--stop-cache-key-increment-when-overlimit`), answer. Requests envoyproxy/ratelimit
//! refuses get its errors; a call without a valid token (with `--token-file`) `UNAUTHENTICATED`;
//! a store that fails or does not answer within its bound (1 s) `UNAVAILABLE`, so that Envoy's
//! `failure_mode_deny` decides.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice::config::HeaderStyle;
use sluice::core::key::HashSecret;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use super::answer::{answer, plan, Invalid, Plan, Tally};
use super::metrics::{Failure, RlsMetrics};
use crate::admin::overrides::OverrideTable;
use crate::auth::Guard;
use crate::connections::Activity;
use crate::rules::config::Rate;
use crate::rules::watch::SharedConfig;
use crate::stores::{Decision, Namespace, Store, StoreError};
use crate::top::{self, Record, TopRecorder, What};

/// Answers from `config` as it is at each call, with the rate-limit `headers` asked for, its
/// keys hashed under `secret`.
pub struct RlsService<S> {
    pub store: S,
    pub config: SharedConfig,
    pub headers: HeaderStyle,
    pub metrics: Arc<RlsMetrics>,
    pub guard: Guard,
    pub secret: HashSecret,
    /// `--stop-cache-key-increment-when-overlimit`: a call that takes some limits over charges
    /// only those.
    pub stop_increments: bool,
    /// Where the heaviest keys are recorded (`crate::top`), with the entries whose values show.
    pub top: Option<Arc<TopRecorder>>,
    pub top_show: Vec<String>,
    /// The operators' overrides (with the admin API), shared with `/admin/v1/overrides`.
    pub overrides: Option<Arc<OverrideTable>>,
}

impl<S: Store> RlsService<S> {
    /// The bearer token of `authorization` metadata, as HTTP's header carries it (Envoy's
    /// `grpc_service.initial_metadata` sends it).
    fn authorized(&self, metadata: &MetadataMap) -> Result<(), Status> {
        let authorization = metadata.get("authorization").map(|v| v.as_bytes());
        if self.guard.admits(authorization) {
            return Ok(());
        }
        self.metrics.record_failure(Failure::Unauthenticated);
        Err(Status::unauthenticated("a valid bearer token is required"))
    }

    async fn decide(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        let config = self.config.current();
        let current = self.overrides.as_ref().map(|table| table.current());
        let overrides = |key: &str| {
            let found = current.as_ref()?.find(Namespace::Rls, key)?;
            Some(Rate::overridden(
                found.algorithm,
                found.requests,
                found.per_ms,
            ))
        };
        let plan =
            plan(&config, request, &self.secret, &overrides).map_err(|Invalid(reason)| {
                self.metrics.record_failure(Failure::Request);
                // What envoyproxy/ratelimit's Go gRPC server makes of its plain errors.
                Status::unknown(reason)
            })?;
        if plan.unknown_domain {
            self.metrics.record_unknown_domain();
        }
        let decisions = if plan.checks.is_empty() {
            Vec::new()
        } else {
            self.run(&plan).await.map_err(|failure| {
                self.metrics.record_failure(Failure::Redis);
                Status::unavailable(format!("redis: {failure}"))
            })?
        };
        // Only the legacy reset header reads the clock here.
        let now = match self.headers {
            HeaderStyle::None => 0,
            _ => now_ns(),
        };
        let answer = answer(&plan, &decisions, self.headers, now);
        self.metrics.record(&request.domain, &answer.tallies);
        if let Some(recorder) = &self.top {
            record_top(recorder, &self.top_show, request, &plan, &answer.tallies);
        }
        if !answer.hold.is_zero() {
            tokio::time::sleep(answer.hold).await;
        }
        Ok(answer.response)
    }

    /// The plan's checks; with `stop_increments`, a read of every limit at the call's hits
    /// first, then the checks that charge only the limits this call takes over (with a single
    /// limit the read would change nothing, and is not made).
    async fn run(&self, plan: &Plan<'_>) -> Result<Vec<Decision>, StoreError> {
        if !self.stop_increments || plan.checks.len() < 2 {
            return self.store.check(&plan.checks).await;
        }
        let peeks = self.store.check(&plan.peeks()).await?;
        self.store.check(&plan.stopping_increments(&peeks)).await
    }
}

#[tonic::async_trait]
impl<S: Store> RateLimitService for RlsService<S> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let _answering = request
            .extensions()
            .get::<Activity>()
            .map(Activity::answering);
        self.authorized(request.metadata())?;
        self.decide(request.get_ref()).await.map(Response::new)
    }
}

/// Records each limit's decision in the top keys: its key the hash of its store key, shown as
/// the descriptor's entries (values only of the entries `show` names).
fn record_top(
    recorder: &TopRecorder,
    show: &[String],
    request: &RateLimitRequest,
    plan: &Plan<'_>,
    tallies: &[Tally<'_>],
) {
    let now_s = recorder.now_s();
    for tally in tallies {
        let Some(check) = plan.checks.get(tally.check) else {
            continue;
        };
        let Some(key) = top::rls_key(&check.key) else {
            continue;
        };
        let record = Record {
            namespace: Namespace::Rls,
            policy: (&request.domain, tally.policy),
            key,
            what: if tally.over_limit {
                What::Refused
            } else {
                What::Allowed
            },
            consumed: tally.granted,
            limit: None,
        };
        let shown = || {
            let descriptor = request.descriptors.get(tally.descriptor)?;
            let entries = (descriptor.entries.iter()).map(|e| (e.key.as_str(), e.value.as_str()));
            Some(Arc::new(top::rls_shown(&check.key, entries, show)))
        };
        recorder.record_at(now_s, &record, shown);
    }
}

/// For the legacy `x-ratelimit-reset` header (a Unix time); the limits use Redis `TIME`.
fn now_ns() -> u64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since_epoch.as_nanos()).unwrap_or(u64::MAX)
}
