//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over a `Store`: plan, one store
//! call for every limit of the request, answer. Requests envoyproxy/ratelimit refuses get its
//! errors; a store that fails or does not answer within its bound (1 s) gets `UNAVAILABLE`, so
//! that Envoy's `failure_mode_deny` decides.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice::headers::HeaderStyle;
use tonic::{Request, Response, Status};

use super::answer::{answer, plan, Invalid};
use super::metrics::{Failure, RlsMetrics};
use super::watch::SharedConfig;
use crate::store::Store;

pub struct RlsService<S> {
    store: S,
    config: SharedConfig,
    headers: HeaderStyle,
    metrics: Arc<RlsMetrics>,
}

impl<S: Store> RlsService<S> {
    /// Answers from `config` as it is at each call, with the rate-limit `headers` asked for.
    pub fn new(
        store: S,
        config: SharedConfig,
        headers: HeaderStyle,
        metrics: Arc<RlsMetrics>,
    ) -> Self {
        RlsService {
            store,
            config,
            headers,
            metrics,
        }
    }

    async fn decide(&self, request: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        let config = self.config.current();
        let plan = plan(&config, request).map_err(|Invalid(reason)| {
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
            self.store.check(&plan.checks).await.map_err(|failure| {
                self.metrics.record_failure(Failure::Redis);
                Status::unavailable(format!("redis: {failure}"))
            })?
        };
        let answer = answer(&plan, &decisions, self.headers, now_ns());
        self.metrics.record(&request.domain, &answer.tallies);
        if !answer.hold.is_zero() {
            tokio::time::sleep(answer.hold).await;
        }
        Ok(answer.response)
    }
}

#[tonic::async_trait]
impl<S: Store> RateLimitService for RlsService<S> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.decide(request.get_ref()).await.map(Response::new)
    }
}

/// For the legacy `x-ratelimit-reset` header (a Unix time); the limits use Redis `TIME`.
fn now_ns() -> u64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since_epoch.as_nanos()).unwrap_or(u64::MAX)
}
