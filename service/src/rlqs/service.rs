//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`: each usage
//! report of a stream is entered in the store's ledger (`stores::quota`: demand measured by the
//! store's clock, shared by every replica), and answered at once with the stream's share of each
//! reported bucket that has a budget, entered in the ledger as held. A bucket without one gets no
//! action, so Envoy's `no_assignment_behavior` applies to it; so does a bucket whose report the
//! store could not take (Redis away): Envoy keeps its last assignment until that lapses. A
//! bucket the stream reports with no request `ABANDON_AFTER` times running is abandoned: Envoy
//! forgets it, and so does the ledger. When a stream ends, its Envoy is forgotten at once, so
//! the others' next reports share what it held.
//!
//! Bounded against hostile clients: a stream keeps at most `MAX_BUCKETS_PER_STREAM` buckets
//! and a replica `--rlqs-max-buckets` over all its streams (each one a key in the store for
//! its time to live), a replica holds at most `--rlqs-max-streams` streams open (`Bounds`),
//! since the connection bounds (`--max-connections`, `--rls-max-streams` each) multiply, and a
//! stream's reports make at most `REPORTS_PER_SECOND` store calls a second (`Allowance`).

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use futures_util::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};
use tracing::warn;

use super::action::{abandon, assign};
use super::budget::{budget, Budget};
use super::ledger::share;
use super::metrics::{Descriptor, Holdings, RlqsMetrics, StreamOpen};
use super::replicas::Replicas;
use crate::auth::Guard;
use crate::connections::Activity;
use crate::logging::Throttle;
use crate::rules::watch::SharedConfig;
use crate::stores::quota::{quota_key, QuotaReport};
use crate::stores::Store;

/// How long an assignment lives, and how long a silent Envoy keeps its share: three of Envoy
/// 1.40's reports, so one lost report does not let an assignment lapse.
pub const ASSIGNMENT_TTL: Duration = Duration::from_secs(15);
/// The most buckets one stream may report: the reports of others are not entered, and get no
/// action (Envoy's `no_assignment_behavior`).
pub const MAX_BUCKETS_PER_STREAM: usize = 1_000;
/// `--rlqs-max-buckets`' default: the most buckets the streams of one replica may report in
/// all: a new bucket beyond them gets no action (Envoy's `no_assignment_behavior`) until others
/// are abandoned or their streams end. Keeps the replica's memory and the store's keys bounded
/// whatever the number of streams (measured: 50 streams of 1,000 buckets each grew the RSS by
/// 36 MB, `--memory`'s ledger and the decoding of their reports included).
pub const MAX_BUCKETS_PER_REPLICA: usize = 100_000;
/// `--rlqs-max-streams`' default: the most streams one replica holds open: a stream beyond them
/// is refused `RESOURCE_EXHAUSTED`. One stream is one Envoy.
pub const MAX_STREAMS_PER_REPLICA: usize = 10_000;

/// A replica's bounds over all its streams (`--rlqs-max-streams`, `--rlqs-max-buckets`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub max_streams: usize,
    pub max_buckets: usize,
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds {
            max_streams: MAX_STREAMS_PER_REPLICA,
            max_buckets: MAX_BUCKETS_PER_REPLICA,
        }
    }
}
/// A bucket reported with no request this many times running (15 s, the assignment's time to
/// live) is abandoned.
pub const ABANDON_AFTER: u32 = 3;
/// The store calls one message's buckets have in flight at once. Each has its own time limit
/// (the store's `COMMAND_TIMEOUT`, 1 s) from when it starts: started all at once, the last of
/// a thousand queue behind the others on a loaded Redis or service and time out together
/// (seen once in `attacks.rs`: 472 of 500 buckets of one message, on two busy cores).
const STORE_CALLS_IN_FLIGHT: usize = 64;

/// Places counted against a replica-wide bound, taken and given back by the streams.
#[derive(Debug)]
struct Places {
    taken: AtomicUsize,
    max: usize,
}

impl Places {
    fn new(max: usize) -> Places {
        Places {
            taken: AtomicUsize::new(0),
            max,
        }
    }

    /// Takes one place if fewer than `max` are taken.
    fn take(&self) -> bool {
        let more = |n: usize| (n < self.max).then_some(n + 1);
        self.taken
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, more)
            .is_ok()
    }

    fn give_back(&self, n: usize) {
        let fewer = |taken: usize| Some(taken.saturating_sub(n));
        let _ = self
            .taken
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, fewer);
    }
}

/// A stream's place among the replica's `Bounds::max_streams`, given back when dropped.
struct StreamPlace(Arc<Places>);

impl StreamPlace {
    /// A place among `open`, or `RESOURCE_EXHAUSTED` when they are all taken.
    fn take(open: &Arc<Places>) -> Result<StreamPlace, Status> {
        if !open.take() {
            return Err(Status::resource_exhausted(
                "this replica holds the most RLQS streams it may",
            ));
        }
        Ok(StreamPlace(Arc::clone(open)))
    }
}

impl Drop for StreamPlace {
    fn drop(&mut self) {
        self.0.give_back(1);
    }
}

/// The service: every stream's reports go to one store, shared with the other replicas.
pub struct RlqsService<S> {
    config: SharedConfig,
    guard: Guard,
    store: Arc<S>,
    /// This replica's random name, the first half of its streams' ids.
    replica: u64,
    /// The replicas found dead, whose streams' entries the reports forget.
    replicas: Arc<Replicas>,
    streams: AtomicU64,
    /// The streams open and the buckets they keep, against the replica's bounds.
    open: Arc<Places>,
    buckets: Arc<Places>,
    warnings: Arc<Throttle>,
    metrics: Arc<RlqsMetrics>,
}

impl<S: Store> RlqsService<S> {
    pub fn new(
        config: SharedConfig,
        guard: Guard,
        store: S,
        metrics: Arc<RlqsMetrics>,
        bounds: Bounds,
    ) -> RlqsService<S> {
        let mut random = RandomState::new().build_hasher();
        random.write_u32(std::process::id());
        RlqsService {
            config,
            guard,
            store: Arc::new(store),
            replica: random.finish(),
            replicas: Arc::default(),
            streams: AtomicU64::new(0),
            open: Arc::new(Places::new(bounds.max_streams)),
            buckets: Arc::new(Places::new(bounds.max_buckets)),
            warnings: Arc::new(Throttle::new(Duration::from_secs(10))),
            metrics,
        }
    }
}

impl<S: Store> RlqsService<S> {
    /// This replica's heartbeat, for as long as it serves (`replicas`).
    pub fn beating(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let replica = format!("{:016x}", self.replica);
        Arc::clone(&self.replicas).keep_beating(Arc::clone(&self.store), replica)
    }
}

/// What a stream knows of one bucket it reports.
#[derive(Debug, Default, Clone)]
struct Bucket {
    /// The share it was last sent, and the descriptor it was counted under.
    held: Option<(u64, Descriptor)>,
    /// Its reports with no request, running.
    idle: u32,
    /// The requests of its reports deferred (over the stream's `Allowance`), for its next.
    unreported: u64,
}

/// The bucket reports a stream may have entered a second (a store call each, two with the
/// share held), and at once: an Envoy 1.40 reports each of its buckets every 5 s (at most
/// `MAX_BUCKETS_PER_STREAM`), so only a client that reports faster than any Envoy goes over.
pub const REPORTS_PER_SECOND: u64 = MAX_BUCKETS_PER_STREAM as u64;
pub const REPORTS_AT_ONCE: u64 = 2 * REPORTS_PER_SECOND;

/// A stream's allowance of reports entered: a token bucket of `REPORTS_AT_ONCE` tokens,
/// refilled at `REPORTS_PER_SECOND`. A report over it is deferred (`answer`).
#[derive(Debug, Clone, Copy)]
struct Allowance {
    tokens: u64,
    /// When the tokens were last counted.
    at: Instant,
}

impl Allowance {
    fn new(now: Instant) -> Allowance {
        Allowance {
            tokens: REPORTS_AT_ONCE,
            at: now,
        }
    }

    /// Takes one report's token, if there is one at `now`.
    fn take(&mut self, now: Instant) -> bool {
        let elapsed_us = u64::try_from(now.saturating_duration_since(self.at).as_micros());
        let earned = elapsed_us
            .unwrap_or(u64::MAX)
            .saturating_mul(REPORTS_PER_SECOND)
            / 1_000_000;
        if earned > 0 {
            self.tokens = self.tokens.saturating_add(earned).min(REPORTS_AT_ONCE);
            // Whole tokens only: the part of one earned stays for the next count.
            self.at += Duration::from_micros(earned * 1_000_000 / REPORTS_PER_SECOND);
        }
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }
}

/// One stream: its id in the ledger (unique across replicas), the buckets it reported (by key).
struct StreamState<S: Store> {
    id: String,
    buckets: HashMap<String, Bucket>,
    /// The replica's count of buckets, one place per entry of `buckets`.
    replica_buckets: Arc<Places>,
    /// Its reports entered, against `REPORTS_PER_SECOND`.
    allowance: Allowance,
    config: SharedConfig,
    store: Arc<S>,
    warnings: Arc<Throttle>,
    metrics: Arc<RlqsMetrics>,
    replicas: Arc<Replicas>,
    /// Its shares, in `sluice_service_rlqs_assigned` and `_envoys` while it lives.
    holdings: Holdings,
    /// Counts the stream in `sluice_service_rlqs_streams` while it lives.
    _open: StreamOpen,
    /// Its place among the replica's `Bounds::max_streams`.
    _place: StreamPlace,
}

/// The answer to one message of reports.
async fn answer<S: Store>(
    state: &mut StreamState<S>,
    reports: &RateLimitQuotaUsageReports,
) -> RateLimitQuotaResponse {
    let config = state.config.current();
    let dead = state.replicas.dead();
    let mut entered: Vec<(&BucketId, Budget, Descriptor, QuotaReport)> = Vec::new();
    let mut actions = Vec::new();
    let mut this_message = HashSet::new();
    for usage in &reports.bucket_quota_usages {
        let Some(id) = &usage.bucket_id else { continue };
        let Some(limit) = budget(&config, &reports.domain, &id.bucket) else {
            continue;
        };
        let entries = id.bucket.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        let key = quota_key(&reports.domain, entries);
        if this_message.contains(&key) {
            continue;
        }
        let known = state.buckets.contains_key(&key);
        if !known && state.buckets.len() >= MAX_BUCKETS_PER_STREAM {
            continue;
        }
        let (allowed, denied) = (usage.num_requests_allowed, usage.num_requests_denied);
        let requests = allowed.saturating_add(denied);
        if !state.allowance.take(Instant::now()) {
            // Reported faster than any Envoy does: no action (Envoy keeps what it holds), no
            // store call; a known bucket's requests count at its next report entered.
            this_message.insert(key.clone());
            if let Some(bucket) = state.buckets.get_mut(&key) {
                bucket.unreported = bucket.unreported.saturating_add(requests);
            }
            state.metrics.record_deferred();
            continue;
        }
        if !known && !state.replica_buckets.take() {
            if let Some(others) = state.warnings.pass() {
                warn!(
                    limit = state.replica_buckets.max,
                    others,
                    "rlqs: the replica keeps the most buckets it may; a new one gets no action"
                );
            }
            continue;
        }
        this_message.insert(key.clone());
        let descriptor = Descriptor::new(&reports.domain, limit.label);
        state.metrics.record_report(&descriptor, allowed, denied);
        let bucket = state.buckets.entry(key.clone()).or_default();
        let requests = requests.saturating_add(std::mem::take(&mut bucket.unreported));
        bucket.idle = if requests == 0 { bucket.idle + 1 } else { 0 };
        if bucket.idle >= ABANDON_AFTER {
            // Nobody asks for it here: Envoy drops it (and makes it anew, reporting at once,
            // when a request comes), and its share goes back to the others.
            if let Some(removed) = state.buckets.remove(&key) {
                state.replica_buckets.give_back(1);
                if let Some((share, counted)) = removed.held {
                    state.holdings.change(Some((&counted, share)), None);
                }
            }
            // Not a store error of the metric (the abandon is sent); the entry lapses anyway.
            if let Err(failure) = state.store.hold_quota(&key, &state.id, None).await {
                if let Some(others) = state.warnings.pass() {
                    warn!(error = %failure, others, "rlqs: the store did not forget an abandoned bucket");
                }
            }
            actions.push(abandon(id.clone()));
            continue;
        }
        let period_ms = u64::try_from(limit.period.as_millis()).unwrap_or(u64::MAX);
        let report = QuotaReport {
            key,
            envoy: state.id.clone(),
            requests,
            period_ms,
            ttl_ms: ASSIGNMENT_TTL.as_secs() * 1_000,
            dead: Arc::clone(&dead),
        };
        entered.push((id, limit, descriptor, report));
    }
    let store = &state.store;
    // `STORE_CALLS_IN_FLIGHT` at a time: each call's time limit runs from when it is sent, so a
    // message of many buckets does not time its last ones out behind the first.
    let mut demands = Vec::with_capacity(entered.len());
    for some in entered.chunks(STORE_CALLS_IN_FLIGHT) {
        let ledgers = (some.iter()).map(|(_, _, _, report)| store.report_quota(report));
        demands.extend(futures_util::future::join_all(ledgers).await);
    }
    let mut sent = Vec::new();
    for ((id, limit, descriptor, report), demands) in entered.into_iter().zip(demands) {
        let demands = match demands {
            Ok(demands) => demands,
            Err(failure) => {
                state.metrics.record_store_error();
                if let Some(others) = state.warnings.pass() {
                    warn!(error = %failure, others, "rlqs: the store did not take a report; Envoy keeps its last assignment");
                }
                continue;
            }
        };
        let bucket = state.buckets.get_mut(&report.key);
        let before = bucket.as_ref().and_then(|b| b.held.clone());
        let held = before.as_ref().map(|(share, _)| *share);
        if let Some((share, _envoys)) = share(&demands, &state.id, limit.requests, held) {
            tracing::debug!(envoy = %state.id, ?demands, ?held, share, "rlqs share");
            let was = before.as_ref().map(|(share, counted)| (counted, *share));
            state.holdings.change(was, Some((&descriptor, share)));
            if let Some(bucket) = bucket {
                bucket.held = Some((share, descriptor));
            }
            sent.push((report.key, share));
            actions.push(assign(id.clone(), share, limit.period, ASSIGNMENT_TTL));
        }
    }
    // What each holds now, for the others' shares.
    let mut holds = Vec::with_capacity(sent.len());
    for some in sent.chunks(STORE_CALLS_IN_FLIGHT) {
        let calls =
            (some.iter()).map(|(key, share)| store.hold_quota(key, &state.id, Some(*share)));
        holds.extend(futures_util::future::join_all(calls).await);
    }
    for held in holds {
        // The share is sent all the same; the others see the one held before until the next.
        if let Err(failure) = held {
            if let Some(others) = state.warnings.pass() {
                warn!(error = %failure, others, "rlqs: the store did not take a share sent");
            }
        }
    }
    RateLimitQuotaResponse {
        bucket_action: actions,
    }
}

/// A stream that ends (its Envoy gone, or reconnecting as a new one) is forgotten from the
/// ledger at once, in the background: its share goes back to the others at their next reports.
/// (A replica that dies forgets nothing: its Envoys' entries lapse after their time to live.)
impl<S: Store> Drop for StreamState<S> {
    fn drop(&mut self) {
        self.replica_buckets.give_back(self.buckets.len());
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let keys: Vec<String> = self.buckets.drain().map(|(key, _)| key).collect();
        if keys.is_empty() {
            return;
        }
        let (store, envoy) = (Arc::clone(&self.store), self.id.clone());
        runtime.spawn(async move {
            for key in keys {
                // Best effort: an entry the store keeps lapses after its time to live anyway.
                let _ = store.hold_quota(&key, &envoy, None).await;
            }
        });
    }
}

type Answers = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<S: Store> RateLimitQuotaService for RlqsService<S> {
    type StreamRateLimitQuotasStream = Answers;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Answers>, Status> {
        // The bearer token as the RLS asks it (Envoy's `grpc_service.initial_metadata`).
        let authorization = request.metadata().get("authorization");
        if !self
            .guard
            .admits(authorization.map(|value| value.as_bytes()))
        {
            return Err(Status::unauthenticated("a valid bearer token is required"));
        }
        let place = StreamPlace::take(&self.open)?;
        let activity = request.extensions().get::<Activity>().cloned();
        let inbound = request.into_inner();
        let number = self.streams.fetch_add(1, Ordering::Relaxed);
        let state = StreamState {
            id: format!("{:016x}.{number}", self.replica),
            buckets: HashMap::new(),
            replica_buckets: Arc::clone(&self.buckets),
            allowance: Allowance::new(Instant::now()),
            config: self.config.clone(),
            store: Arc::clone(&self.store),
            warnings: Arc::clone(&self.warnings),
            metrics: Arc::clone(&self.metrics),
            replicas: Arc::clone(&self.replicas),
            holdings: Holdings::new(&self.metrics),
            _open: self.metrics.stream_open(),
            _place: place,
        };
        let answers = futures_util::stream::unfold(
            (inbound, state, activity),
            |(mut inbound, mut state, activity)| async move {
                // A broken inbound stream ends the answers too.
                let reports = inbound.next().await?.ok()?;
                // Each report is a request answered: the connection is not idle, and a stream
                // that never reports leaves it to the idle deadline.
                let answering = activity.as_ref().map(Activity::answering);
                let reply = answer(&mut state, &reports).await;
                drop(answering);
                Some((Ok::<_, Status>(reply), (inbound, state, activity)))
            },
        )
        .filter(|reply| std::future::ready(!matches!(reply, Ok(r) if r.bucket_action.is_empty())));
        Ok(Response::new(Box::pin(answers)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::check::Bounds;
    use crate::rules::config::Config;
    use crate::stores::memory::MemoryStore;
    use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use std::collections::HashMap;
    use std::path::PathBuf;

    const LIMITS: &str = "\
domain: api
descriptors:
  - key: name
    rate_limit: {unit: minute, requests_per_unit: 600}
";

    fn stream(id: &str, store: &Arc<MemoryStore>) -> StreamState<MemoryStore> {
        stream_of(id, store, &Arc::new(Places::new(MAX_BUCKETS_PER_REPLICA)))
    }

    /// A stream of a replica whose buckets are counted in `replica`.
    fn stream_of(
        id: &str,
        store: &Arc<MemoryStore>,
        replica: &Arc<Places>,
    ) -> StreamState<MemoryStore> {
        let metrics = Arc::new(RlqsMetrics::register(&mut Default::default()));
        let files = vec![(PathBuf::from("api.yaml"), LIMITS.to_owned())];
        let config = Config::from_files(&files, &Bounds::default()).unwrap();
        StreamState {
            id: id.to_owned(),
            buckets: HashMap::new(),
            replica_buckets: Arc::clone(replica),
            allowance: Allowance::new(Instant::now()),
            config: SharedConfig::new(config),
            store: Arc::clone(store),
            warnings: Arc::new(Throttle::new(Duration::from_secs(10))),
            metrics: Arc::clone(&metrics),
            replicas: Arc::default(),
            holdings: Holdings::new(&metrics),
            _open: metrics.stream_open(),
            _place: StreamPlace(Arc::new(Places::new(MAX_STREAMS_PER_REPLICA))),
        }
    }

    fn usage(name: &str, allowed: u64, denied: u64) -> BucketQuotaUsage {
        let bucket = HashMap::from([("name".to_owned(), name.to_owned())]);
        BucketQuotaUsage {
            bucket_id: Some(BucketId { bucket }),
            time_elapsed: None,
            num_requests_allowed: allowed,
            num_requests_denied: denied,
        }
    }

    fn reports(domain: &str, usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
        RateLimitQuotaUsageReports {
            domain: domain.to_owned(),
            bucket_quota_usages: usages,
        }
    }

    /// The first action's token bucket, per minute; 0 for deny-all.
    fn per_minute(response: &RateLimitQuotaResponse) -> Option<u64> {
        match response.bucket_action.first()?.bucket_action {
            Some(Action::QuotaAssignmentAction(a)) => match a.rate_limit_strategy?.strategy? {
                Strategy::TokenBucket(bucket) => {
                    let fill = u64::try_from(bucket.fill_interval?.seconds).ok()?;
                    Some(u64::from(bucket.tokens_per_fill?.value) * 60 / fill)
                }
                _ => Some(0),
            },
            _ => None,
        }
    }

    #[tokio::test]
    async fn two_streams_busy_and_light_share_600_a_minute_by_demand() {
        let store = Arc::new(MemoryStore::default());
        let (mut busy, mut light) = (stream("busy", &store), stream("light", &store));
        // First reports count over 5 s: 100 is 1,200 a minute, 10 is 120.
        let alone = answer(&mut busy, &reports("api", vec![usage("b", 90, 10)])).await;
        assert_eq!(per_minute(&alone), Some(600));
        // The light one's fair share is its 120, but the busy one holds all until it reports
        // again: a fiftieth of the budget at once, the rest once the busy one has shrunk.
        let to_light = answer(&mut light, &reports("api", vec![usage("b", 10, 0)])).await;
        assert_eq!(per_minute(&to_light), Some(12));
        let shrunk = answer(&mut busy, &reports("api", vec![usage("b", 90, 10)])).await;
        // The light one's 120 count 5% more (126), slack for requests that come unevenly.
        assert_eq!(per_minute(&shrunk), Some(474));
        let grown = answer(&mut light, &reports("api", vec![usage("b", 2, 0)])).await;
        assert_eq!(per_minute(&grown), Some(126));
    }

    #[tokio::test]
    async fn a_bucket_reported_idle_3_times_running_is_abandoned_and_its_share_freed() {
        let store = Arc::new(MemoryStore::default());
        let (mut idle, mut busy) = (stream("idle", &store), stream("busy", &store));
        answer(&mut idle, &reports("api", vec![usage("b", 1, 0)])).await;
        for _ in 1..ABANDON_AFTER {
            let kept = answer(&mut idle, &reports("api", vec![usage("b", 0, 0)])).await;
            assert!(per_minute(&kept).is_some(), "{kept:?}");
        }
        let dropped = answer(&mut idle, &reports("api", vec![usage("b", 0, 0)])).await;
        assert!(
            matches!(
                dropped
                    .bucket_action
                    .first()
                    .and_then(|a| a.bucket_action.as_ref()),
                Some(Action::AbandonAction(_))
            ),
            "{dropped:?}"
        );
        assert!(idle.buckets.is_empty());
        // The ledger forgot it: the busy one is alone.
        let alone = answer(&mut busy, &reports("api", vec![usage("b", 100, 0)])).await;
        assert_eq!(per_minute(&alone), Some(600));
        // A request again: Envoy makes the bucket anew, and it gets a share.
        let again = answer(&mut idle, &reports("api", vec![usage("b", 1, 0)])).await;
        assert!(
            per_minute(&again).is_some_and(|share| share > 0),
            "{again:?}"
        );
    }

    #[tokio::test]
    async fn a_bucket_without_a_budget_gets_no_action() {
        let store = Arc::new(MemoryStore::default());
        let mut state = stream("1", &store);
        let response = answer(&mut state, &reports("web", vec![usage("b", 5, 0)])).await;
        assert!(response.bucket_action.is_empty());
    }

    #[tokio::test]
    async fn a_stream_reports_a_bounded_number_of_buckets_and_huge_counts_are_bounded() {
        let store = Arc::new(MemoryStore::default());
        let mut state = stream("1", &store);
        let many = (0..MAX_BUCKETS_PER_STREAM + 500)
            .map(|i| usage(&i.to_string(), u64::MAX, u64::MAX))
            .collect();
        let response = answer(&mut state, &reports("api", many)).await;
        assert_eq!(response.bucket_action.len(), MAX_BUCKETS_PER_STREAM);
        assert_eq!(per_minute(&response), Some(600));
        let again = answer(&mut state, &reports("api", vec![usage("late", 1, 0)])).await;
        assert!(again.bucket_action.is_empty());
        // The same bucket twice in one message is entered once.
        let mut other = stream("2", &store);
        let twice = vec![usage("x", 1, 0), usage("x", 1, 0)];
        let response = answer(&mut other, &reports("api", twice)).await;
        assert_eq!(response.bucket_action.len(), 1);
    }

    #[tokio::test]
    async fn a_replica_keeps_a_bounded_number_of_buckets_over_all_its_streams() {
        let store = Arc::new(MemoryStore::default());
        let replica = Arc::new(Places::new(MAX_BUCKETS_PER_REPLICA));
        // Other streams keep all but 5 places.
        (replica.taken).store(MAX_BUCKETS_PER_REPLICA - 5, Ordering::Relaxed);
        let mut state = stream_of("1", &store, &replica);
        let many = (0..10).map(|i| usage(&i.to_string(), 1, 0)).collect();
        let response = answer(&mut state, &reports("api", many)).await;
        assert_eq!(response.bucket_action.len(), 5);
        // The buckets it keeps are still answered; the others get no action.
        let again = (0..10).map(|i| usage(&i.to_string(), 1, 0)).collect();
        let response = answer(&mut state, &reports("api", again)).await;
        assert_eq!(response.bucket_action.len(), 5);
        assert_eq!(
            replica.taken.load(Ordering::Relaxed),
            MAX_BUCKETS_PER_REPLICA
        );
        // A stream that ends gives its places back.
        drop(state);
        assert_eq!(
            replica.taken.load(Ordering::Relaxed),
            MAX_BUCKETS_PER_REPLICA - 5
        );
        let places = Places::new(3);
        assert!((0..3).all(|_| places.take()));
        assert!(!places.take());
        places.give_back(10);
        assert!(places.take());
    }

    #[test]
    fn a_replica_holds_a_bounded_number_of_streams_and_an_ended_one_frees_its_place() {
        let open = Arc::new(Places::new(MAX_STREAMS_PER_REPLICA));
        open.taken
            .store(MAX_STREAMS_PER_REPLICA - 1, Ordering::Relaxed);
        let last = StreamPlace::take(&open).unwrap();
        let refused = StreamPlace::take(&open).err().unwrap();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        drop(last);
        assert!(StreamPlace::take(&open).is_ok());
    }

    #[test]
    fn a_streams_allowance_is_2000_reports_at_once_then_1000_a_second() {
        let start = Instant::now();
        let mut allowance = Allowance::new(start);
        assert!((0..REPORTS_AT_ONCE).all(|_| allowance.take(start)));
        assert!(!allowance.take(start));
        assert!(!allowance.take(start + Duration::from_micros(999)));
        assert!(allowance.take(start + Duration::from_millis(1)));
        assert!(!allowance.take(start + Duration::from_millis(1)));
        // However long a stream waits, it has the burst, no more.
        let later = start + Duration::from_secs(3_600);
        let taken = (0..3 * REPORTS_AT_ONCE)
            .filter(|_| allowance.take(later))
            .count();
        assert_eq!(taken as u64, REPORTS_AT_ONCE);
    }

    #[tokio::test]
    async fn a_report_over_the_allowance_gets_no_action_and_its_requests_count_at_the_next() {
        let store = Arc::new(MemoryStore::default());
        let mut state = stream("1", &store);
        let first = answer(&mut state, &reports("api", vec![usage("b", 10, 0)])).await;
        assert!(per_minute(&first).is_some());
        // A client that has reported faster than any Envoy: nothing left for an hour.
        let spent = Allowance {
            tokens: 0,
            at: Instant::now() + Duration::from_secs(3_600),
        };
        state.allowance = spent;
        let deferred = answer(&mut state, &reports("api", vec![usage("b", 900, 100)])).await;
        assert!(deferred.bucket_action.is_empty(), "{deferred:?}");
        let key = quota_key("api", [("name", "b")].into_iter());
        assert_eq!(state.buckets.get(&key).unwrap().unreported, 1_000);
        state.allowance = Allowance::new(Instant::now());
        // The next report of nothing is entered with the 1,000 deferred: not idle.
        let next = answer(&mut state, &reports("api", vec![usage("b", 0, 0)])).await;
        assert!(per_minute(&next).is_some_and(|share| share > 0), "{next:?}");
        let bucket = state.buckets.get(&key).unwrap();
        assert_eq!((bucket.unreported, bucket.idle), (0, 0));
    }
}
