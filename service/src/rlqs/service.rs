//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`: each usage
//! report of a stream is entered in the shared ledger (demand measured by the service's clock),
//! and answered at once with the stream's share of each reported bucket that has a budget. A
//! bucket without one gets no action, so Envoy's `no_assignment_behavior` applies to it. The
//! shares are in this replica's memory only (see docs/rlqs.md for what is missing).

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use futures_util::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::action::assign;
use super::budget::budget;
use super::ledger::Ledger;
use crate::rules::watch::SharedConfig;

/// How long an assignment lives, and how long a silent Envoy keeps its share: three of Envoy
/// 1.40's reports, so one lost report does not let an assignment lapse.
pub const ASSIGNMENT_TTL: Duration = Duration::from_secs(15);

/// The service: one ledger for every stream of this replica.
pub struct RlqsService {
    config: SharedConfig,
    ledger: Arc<Mutex<Ledger>>,
    streams: AtomicU64,
    started: Instant,
}

impl RlqsService {
    pub fn new(config: SharedConfig) -> RlqsService {
        RlqsService {
            config,
            ledger: Arc::default(),
            streams: AtomicU64::new(0),
            started: Instant::now(),
        }
    }
}

/// One stream's own memory: when it last reported each bucket, by the service's clock.
struct StreamState {
    id: u64,
    last: HashMap<String, Duration>,
}

/// A bucket's name in the ledger: the domain and its entries in key order.
fn bucket_name(domain: &str, bucket: &HashMap<String, String>) -> String {
    let sorted: BTreeMap<&String, &String> = bucket.iter().collect();
    let mut name = domain.to_owned();
    for (key, value) in sorted {
        name.push('\u{1f}');
        name.push_str(key);
        name.push('=');
        name.push_str(value);
    }
    name
}

/// The answer to one message of reports.
fn answer(
    config: &SharedConfig,
    ledger: &Mutex<Ledger>,
    state: &mut StreamState,
    reports: &RateLimitQuotaUsageReports,
    now: Duration,
) -> RateLimitQuotaResponse {
    let config = config.current();
    let mut ledger = ledger.lock().unwrap_or_else(PoisonError::into_inner);
    ledger.expire(now, ASSIGNMENT_TTL);
    let mut actions = Vec::new();
    for usage in &reports.bucket_quota_usages {
        let Some(id) = &usage.bucket_id else { continue };
        let Some(limit) = budget(&config, &reports.domain, &id.bucket) else {
            continue;
        };
        let name = bucket_name(&reports.domain, &id.bucket);
        let elapsed = state
            .last
            .insert(name.clone(), now)
            .map_or(Duration::ZERO, |before| now.saturating_sub(before));
        let requests = usage
            .num_requests_allowed
            .saturating_add(usage.num_requests_denied);
        ledger.report(&name, state.id, requests, elapsed, limit.period, now);
        if let Some((share, _envoys)) = ledger.share(&name, state.id, limit.requests) {
            actions.push(assign(id.clone(), share, limit.period, ASSIGNMENT_TTL));
        }
    }
    RateLimitQuotaResponse {
        bucket_action: actions,
    }
}

type Answers = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = Answers;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Answers>, Status> {
        let inbound = request.into_inner();
        let state = StreamState {
            id: self.streams.fetch_add(1, Ordering::Relaxed),
            last: HashMap::new(),
        };
        let (config, ledger, started) =
            (self.config.clone(), Arc::clone(&self.ledger), self.started);
        let answers = inbound
            .scan(state, move |state, reports| {
                let reply = reports
                    .map(|reports| answer(&config, &ledger, state, &reports, started.elapsed()));
                // A broken inbound stream ends the answers too.
                std::future::ready(reply.ok().map(Ok))
            })
            .filter(|reply| {
                std::future::ready(!matches!(reply, Ok(r) if r.bucket_action.is_empty()))
            });
        Ok(Response::new(Box::pin(answers)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::check::Bounds;
    use crate::rules::config::Config;
    use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
    use std::path::PathBuf;

    const LIMITS: &str = "\
domain: api
descriptors:
  - key: name
    rate_limit: {unit: minute, requests_per_unit: 600}
";

    fn shared() -> SharedConfig {
        let files = vec![(PathBuf::from("api.yaml"), LIMITS.to_owned())];
        SharedConfig::new(Config::from_files(&files, &Bounds::default()).unwrap())
    }

    fn reports(requests: u64) -> RateLimitQuotaUsageReports {
        let bucket = HashMap::from([("name".to_owned(), "b".to_owned())]);
        RateLimitQuotaUsageReports {
            domain: "api".to_owned(),
            bucket_quota_usages: vec![BucketQuotaUsage {
                bucket_id: Some(BucketId { bucket }),
                time_elapsed: None,
                num_requests_allowed: requests,
                num_requests_denied: 0,
            }],
        }
    }

    fn tokens(response: &RateLimitQuotaResponse) -> Option<u32> {
        match response.bucket_action.first()?.bucket_action {
            Some(Action::QuotaAssignmentAction(a)) => match a.rate_limit_strategy?.strategy? {
                Strategy::TokenBucket(bucket) => {
                    // Per minute.
                    let fill = u32::try_from(bucket.fill_interval?.seconds).ok()?;
                    Some(bucket.tokens_per_fill?.value * 60 / fill)
                }
                _ => Some(0),
            },
            _ => None,
        }
    }

    #[test]
    fn two_streams_busy_and_idle_share_600_a_minute_by_demand() {
        let (config, ledger) = (shared(), Mutex::new(Ledger::default()));
        let mut busy = StreamState {
            id: 1,
            last: HashMap::new(),
        };
        let mut idle = StreamState {
            id: 2,
            last: HashMap::new(),
        };
        let at = Duration::from_secs;
        answer(&config, &ledger, &mut busy, &reports(0), at(0));
        answer(&config, &ledger, &mut idle, &reports(0), at(0));
        // 5 s later the idle one saw 1 request (12 a minute): the busy one has not yet said
        // otherwise, so what nobody claims is split as headroom.
        let to_idle = answer(&config, &ledger, &mut idle, &reports(1), at(5));
        // 12 + 294 = 306 a minute, refilled as 5 a second.
        assert_eq!(tokens(&to_idle), Some(300));
        // The busy one saw 200 (2,400 a minute): it gets all the idle one does not use.
        let to_busy = answer(&config, &ledger, &mut busy, &reports(200), at(5));
        assert_eq!(tokens(&to_busy), Some(588));
        let to_idle = answer(&config, &ledger, &mut idle, &reports(1), at(10));
        assert_eq!(tokens(&to_idle), Some(12));
        // Both busy: half each.
        let to_idle = answer(&config, &ledger, &mut idle, &reports(200), at(15));
        assert_eq!(tokens(&to_idle), Some(300));
    }

    #[test]
    fn a_bucket_without_a_budget_gets_no_action() {
        let (config, ledger) = (shared(), Mutex::new(Ledger::default()));
        let mut stream = StreamState {
            id: 1,
            last: HashMap::new(),
        };
        let mut other = reports(5);
        other.domain = "web".to_owned();
        let response = answer(&config, &ledger, &mut stream, &other, Duration::ZERO);
        assert!(response.bucket_action.is_empty());
    }
}
