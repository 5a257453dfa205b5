//! The filter's behaviour for one HTTP request, written against the `Host` seam so it runs
//! natively in tests; `wasm` implements `Host` over proxy-wasm and only maps the verdict to
//! Envoy's actions (continue, pause, resume).

use crate::access_log;
use crate::algorithm::Algorithm;
use crate::breaker::Breaker;
use crate::config::{self, ConfigError, GlobalService, Plan, Protocol};
use crate::duration::NANOS_PER_SEC;
use crate::headers::{each_rate_limit_header, retry_after_secs, Quota, QuotaUnit};
use crate::key::{HashSecret, Keying};
use crate::ledger::Ledger;
use crate::limiter::{Applied, Basis, Limiter, Outcome, Pending, Settled, Step};
use crate::metrics::{Counters, Metrics};
use crate::protocol::{self, SettleOp, Settlement};
use crate::reply::{self, Denial, LocalReply, Refusal, Said};
use crate::request::{Attributes, RequestSource, Snapshot};
use crate::rls;
use crate::store::{Store, ABSENT};
use crate::tab::{Entry, Op, Tab};
use crate::table;
use crate::time::WorkerClock;
use std::cell::{Cell, RefCell};

/// The spacing of the log lines that would otherwise repeat with every request.
const MINUTE: u64 = 60 * NANOS_PER_SEC;
/// The gRPC status of a call that succeeded.
pub const GRPC_OK: u32 = 0;

/// What the filter needs from the proxy.
pub trait Host: RequestSource + Store {
    /// Wall-clock time, Unix nanoseconds.
    fn now(&self) -> u64;
    /// Sends a local reply instead of forwarding the request.
    fn send_response(&self, reply: &LocalReply);
    /// Puts the request's record where the access log reads it (`access_log::PROPERTY`).
    fn record(&self, record: &str);
    /// Starts a call to the rate-limit service, as its protocol says (an HTTP POST of the body,
    /// or a gRPC `ShouldRateLimit` carrying it); false if it could not be started. The answer
    /// comes back through `Filter::on_service_response`.
    fn dispatch(&self, service: &GlobalService, body: &[u8]) -> bool;
    /// Hands what a request owes a global policy after its admission to the worker's outbox
    /// (`outbox`), which sends it to the service later, off every request's path.
    fn report(&self, service: &GlobalService, settlement: Settlement);
    /// A header of the response, as it passes through (`response`).
    fn response_header(&self, name: &str) -> Option<Vec<u8>>;
    /// A trailer of the response.
    fn response_trailer(&self, name: &str) -> Option<Vec<u8>>;
    /// Sets filter state other filters and the access log read (`wasm.<name>`).
    fn publish(&self, name: &str, value: &str);
}

/// What the filter reads from the proxy once, when it is configured.
pub trait Environment {
    /// A variable of the VM's environment (Envoy: `vm_config.environment_variables`).
    fn var(&self, name: &str) -> Option<String>;
    /// Random bytes from the host: for a hash secret of this Envoy's own.
    fn random(&self) -> Option<[u8; 16]>;
}

/// What to do with a request.
#[derive(Debug)]
pub enum Verdict {
    /// Forward it.
    Continue(Admitted),
    /// A local reply (429, or 503 for a policy that fails closed) has been sent.
    Denied,
    /// Hold it until the service answers.
    Waiting(Pending),
    /// Forward it after `delay` nanoseconds (a leaky bucket's turn).
    Hold { delay: u64, admitted: Admitted },
}

/// What an admitted request takes with it.
#[derive(Debug, Default)]
pub struct Admitted {
    /// The policy whose rate-limit headers the response gets, if any.
    pub reported: Option<Reported>,
    /// What the request owes its policies when it ends (`tab`), if anything: the glue keeps it
    /// and hands it to `response::Response`.
    pub tab: Option<Tab>,
    /// What the admission put in the access log, which the request's end completes.
    pub record: Option<String>,
}

/// The policy whose state the response headers report, as decided at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported {
    applied: Applied,
    now: u64,
}

/// The configured filter, shared read-only by every request of one worker.
#[derive(Debug)]
pub struct Filter {
    plan: Plan,
    keying: Keying,
    prefix: String,
    counters: Counters,
    breaker: Breaker,
    /// This worker's leases on local buckets.
    ledger: RefCell<Ledger>,
    clock: WorkerClock,
    /// When a degraded decision was last logged: at most one line a second.
    last_degraded_log: Cell<u64>,
    /// When ignored route metadata was last logged: at most one line a minute.
    last_route_metadata_log: Cell<u64>,
    /// Per bypass entry: when its use was last logged (at most once a minute), and whether its
    /// expiry has been.
    bypass_logged: Vec<(Cell<u64>, Cell<bool>)>,
    /// The name of the next slot this worker asks the service for: counting up from a random
    /// start, so that no two workers' names meet.
    next_slot: Cell<u64>,
}

impl Filter {
    /// Parses the configuration, creates the shared-data slots and the counters.
    /// `plugin` namespaces the shared data, which Envoy shares per VM id.
    pub fn configure(
        json: &[u8],
        plugin: &str,
        store: &impl Store,
        metrics: &impl Metrics,
        env: &impl Environment,
    ) -> Result<Filter, ConfigError> {
        let plan = config::parse_with_env(json, &|name| env.var(name))?;
        let keying = match plan.hash_secret {
            Some(secret) => Keying {
                slots: secret,
                shared: secret,
            },
            None => Keying {
                slots: own_secret(store, env, plugin)?,
                shared: HashSecret::PUBLIC,
            },
        };
        let prefix = table::prefix(plugin);
        let counters = Counters::define(metrics, &plan);
        let bypass_logged = plan.bypass.iter().map(|_| Default::default()).collect();
        let start = env.random().map_or(0, |bytes| {
            u64::from_le_bytes(bytes.first_chunk().copied().unwrap_or_default())
        });
        Ok(Filter {
            next_slot: Cell::new(start),
            bypass_logged,
            plan,
            keying,
            prefix,
            counters,
            breaker: Breaker::default(),
            ledger: RefCell::default(),
            clock: WorkerClock::default(),
            last_degraded_log: Cell::new(0),
            last_route_metadata_log: Cell::new(0),
        })
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Decides a request from its headers; sends a denial itself.
    pub fn on_request_headers(&self, host: &impl Host) -> Verdict {
        self.decide(host, Attributes::new(host, &self.plan.attrs))
    }

    /// Whether a request with a body is decided once its body has come (`Plan::reads_body`):
    /// the glue then holds its headers and hands over the body's start (`on_request_body`).
    pub fn reads_body(&self) -> bool {
        self.plan.reads_body
    }

    /// What the policies read of the request's headers and properties, read now: the glue
    /// takes it before the headers go on, for `on_request_body`.
    pub fn snapshot(&self, host: &impl Host) -> Snapshot {
        Attributes::new(host, &self.plan.attrs).snapshot()
    }

    /// Whether some policy may rewrite a request's body (`ask_stream_usage`).
    pub fn rewrites_body(&self) -> bool {
        let asks =
            |p: &crate::config::Policy| p.metered.as_ref().is_some_and(|m| m.ask_stream_usage);
        self.plan.policies.iter().any(asks)
    }

    /// Decides a request from its `snapshot` and the start of its body (at most `BODY_BYTES`).
    /// What the policies read of the body is published for the access log first
    /// (`access_log::body_states`), refused or not.
    pub fn on_request_body(&self, host: &impl Host, snapshot: Snapshot, body: &[u8]) -> Verdict {
        let attrs = &self.plan.attrs;
        let mut request = Attributes::of_snapshot(host, attrs, snapshot, body);
        for (name, value) in access_log::body_states(&mut request) {
            host.publish(&name, &value);
        }
        self.decide(host, request)
    }

    /// The body to send upstream instead of `body` (the whole of it), when a policy that admitted
    /// the request asks a stream for its usage (`ask_stream_usage`) and the request does not.
    pub fn stream_usage_body(&self, tab: Option<&Tab>, body: &[u8]) -> Option<Vec<u8>> {
        let asks = |entry: &Entry| {
            let policy = self.plan.policies.get(entry.policy);
            policy
                .and_then(|p| p.metered.as_ref())
                .is_some_and(|m| m.ask_stream_usage)
        };
        if !tab?.entries.iter().any(asks) {
            return None;
        }
        crate::usage::request::ask_stream_usage(body)
    }

    fn decide<H: Host>(&self, host: &H, mut request: Attributes<'_, H>) -> Verdict {
        let now = self.now(host);
        let service_up = self.breaker.allows(now);
        let step = self.limiter(host, |l| l.evaluate(&mut request, now, service_up));
        self.proceed(host, step, now)
    }

    /// Continues a held request with the service's reply: its status (HTTP for sluice-service,
    /// gRPC for an RLS) and body, or `None` when the call failed (timeout, reset, no healthy
    /// endpoint).
    pub fn on_service_response(
        &self,
        host: &impl Host,
        pending: Pending,
        reply: Option<(u32, Vec<u8>)>,
    ) -> Verdict {
        let protocol = self.plan.global.as_ref().map(|s| &s.protocol);
        let answers = match (protocol, reply) {
            (Some(Protocol::Sluice { .. }), Some((200, body))) => {
                protocol::decode(&body, pending.checks())
            }
            (Some(Protocol::Rls { .. }), Some((GRPC_OK, body))) => {
                rls::decode(&body, pending.checks())
            }
            _ => None,
        };
        let now = self.now(host);
        self.record_call(answers.is_some(), now);
        let step = self.limiter(host, |l| l.resume(pending, answers));
        self.proceed(host, step, now)
    }

    /// Calls `emit` with each rate-limit header to add to the response.
    pub fn each_response_header(&self, reported: &Reported, emit: impl FnMut(&'static str, &str)) {
        if let Some(quota) = self.quota(&reported.applied) {
            each_rate_limit_header(self.plan.headers, &quota, reported.now, emit);
        }
    }

    /// Settles one entry of an admitted request's tab (`response`).
    pub fn settle(&self, host: &impl Host, entry: &mut Entry, op: Op) -> Settled {
        let now = self.now(host);
        self.limiter(host, |l| l.settle(entry, op, now))
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// What an entry of a global policy owes its service, with `op`, as the service names it.
    pub fn settlement(&self, entry: &Entry, op: SettleOp) -> Option<(&GlobalService, Settlement)> {
        let service = self.plan.global.as_ref()?;
        let policy = self.plan.policies.get(entry.policy)?;
        let tier = entry.tier;
        let settlement = Settlement {
            key: protocol::key(&policy.name, entry.key.unwrap_or(entry.hash)),
            algorithm: tier.algorithm.kind(),
            requests: tier.requests,
            per_ms: protocol::per_ms(tier.per_nanos),
            burst: tier.algorithm.capacity(),
            op,
        };
        Some((service, settlement))
    }

    /// Hands the counts gathered since the last flush to the host.
    pub fn flush_counters(&self, metrics: &impl Metrics) {
        self.counters.flush(metrics);
    }

    /// Runs `step` with a limiter over this worker's loans and the host's shared data.
    fn limiter<H: Host, T>(&self, host: &H, step: impl FnOnce(&mut Limiter<H>) -> T) -> T {
        let run = |ledger: &mut Ledger| {
            step(&mut Limiter {
                plan: &self.plan,
                keying: &self.keying,
                prefix: &self.prefix,
                store: host,
                ledger,
            })
        };
        match self.ledger.try_borrow_mut() {
            Ok(mut ledger) => run(&mut ledger),
            // Unreachable (a worker runs one callback at a time); lending nothing is safe.
            Err(_) => run(&mut Ledger::default()),
        }
    }

    /// This worker's clock: the host's, never going back.
    pub fn now(&self, host: &impl Host) -> u64 {
        self.clock.now(host.now())
    }

    /// What Envoy does next: wait for the service's answer to the step's checks, or finish.
    fn proceed(&self, host: &impl Host, mut step: Step, now: u64) -> Verdict {
        loop {
            match step {
                Step::Done(outcome) => return self.finish(host, &outcome, now),
                Step::Callout(mut pending) => {
                    self.counters.callouts.add(1);
                    pending.name_slots(|| {
                        let id = self.next_slot.get().wrapping_add(1);
                        self.next_slot.set(id);
                        id
                    });
                    let dispatched = self.plan.global.as_ref().is_some_and(|service| {
                        let body = match &service.protocol {
                            Protocol::Sluice { .. } => protocol::encode(pending.checks()),
                            Protocol::Rls { domain, .. } => rls::encode(domain, pending.checks()),
                        };
                        host.dispatch(service, &body)
                    });
                    if dispatched {
                        return Verdict::Waiting(pending);
                    }
                    self.record_call(false, now);
                    step = self.limiter(host, |l| l.resume(pending, None));
                }
            }
        }
    }

    fn record_call(&self, succeeded: bool, now: u64) {
        self.breaker.record(succeeded, now);
        if !succeeded {
            self.counters.callout_failures.add(1);
        }
    }

    fn finish(&self, host: &impl Host, outcome: &Outcome, now: u64) -> Verdict {
        self.counters.count(&self.plan, outcome);
        self.log_degraded(outcome, now);
        self.log_bypass(outcome, now);
        self.log_route_metadata(outcome, now);
        let denial = outcome.refused_by();
        let record = access_log::record(&self.plan, outcome, denial.as_ref());
        if let Some(record) = &record {
            host.record(record);
        }
        match denial {
            Some(denial) => {
                self.deny(host, &denial, now);
                Verdict::Denied
            }
            None => {
                let reported = self
                    .most_restrictive(outcome)
                    .map(|applied| Reported { applied, now });
                let admitted = Admitted {
                    reported,
                    tab: outcome.tab.clone(),
                    record,
                };
                match self.delay(outcome) {
                    0 => Verdict::Continue(admitted),
                    delay => Verdict::Hold { delay, admitted },
                }
            }
        }
    }

    /// The longest wait an enforcing policy put on an admitted request.
    fn delay(&self, outcome: &Outcome) -> u64 {
        let enforcing = outcome.applied.iter().filter(|a| a.enforced);
        enforcing.map(|a| a.decision.delay).max().unwrap_or(0)
    }

    /// Whether some policy holds requests for their turn, so held ones need releasing.
    pub fn shapes_traffic(&self) -> bool {
        let holds =
            |p: &crate::config::Policy| p.limits().any(|t| t.algorithm.max_delay().is_some());
        self.plan.policies.iter().any(holds)
    }

    fn log_degraded(&self, outcome: &Outcome, now: u64) {
        let degraded = outcome
            .applied
            .iter()
            .find(|a| matches!(a.basis, Basis::Emergency | Basis::Unavailable));
        if let Some(applied) = degraded {
            if now >= self.last_degraded_log.get().saturating_add(NANOS_PER_SEC) {
                self.last_degraded_log.set(now);
                let name = self.policy_name(applied.policy);
                log::warn!(
                    "rate-limit service unavailable: policy {name} decided {:?} (logged at most once a second)",
                    applied.basis
                );
            }
        }
    }

    /// A route whose `filter_metadata.sluice` sluice could not use (every policy applied to it):
    /// at most one warning a minute per worker.
    fn log_route_metadata(&self, outcome: &Outcome, now: u64) {
        let Some(why) = outcome.ignored_route_metadata else {
            return;
        };
        let last = self.last_route_metadata_log.get();
        if last == 0 || now >= last.saturating_add(MINUTE) {
            self.last_route_metadata_log.set(now);
            log::warn!(
                "route metadata filter_metadata.sluice ignored, every policy applies: {why} (logged at most once a minute)"
            );
        }
    }

    /// The audit trail of bypasses: each entry's use at most once a minute (per worker), and
    /// its expiry once.
    fn log_bypass(&self, outcome: &Outcome, now: u64) {
        for &i in &outcome.bypassed {
            let (Some(b), Some((last, _))) = (self.plan.bypass.get(i), self.bypass_logged.get(i))
            else {
                continue;
            };
            if last.get() == 0 || now >= last.get().saturating_add(MINUTE) {
                last.set(now);
                log::info!(
                    "bypass: policy {} not applied to key {:016x} for {} ({}), until {}",
                    self.policy_name(b.policy),
                    b.key,
                    b.owner,
                    b.reason,
                    b.expires / NANOS_PER_SEC
                );
            }
        }
        for &i in &outcome.expired_bypass {
            let (Some(b), Some((_, told))) = (self.plan.bypass.get(i), self.bypass_logged.get(i))
            else {
                continue;
            };
            if !told.replace(true) {
                log::info!(
                    "bypass of policy {} for key {:016x} ({}, {}) expired at {}: ignored",
                    self.policy_name(b.policy),
                    b.key,
                    b.owner,
                    b.reason,
                    b.expires / NANOS_PER_SEC
                );
            }
        }
    }

    /// Refuses the request as the client's protocol expects (gRPC or plain HTTP): a policy's
    /// `denial` with the rate-limit headers, or a 503 when a policy that fails closed could not
    /// ask the service.
    fn deny(&self, host: &impl Host, denial: &Applied, now: u64) {
        let policy = self.plan.policies.get(denial.policy);
        let name = policy.map_or("", |p| p.name.as_str());
        log::debug!(
            "denied by policy {name}, version {}, key {:016x}",
            self.plan.version,
            denial.key.unwrap_or_default()
        );
        let refusal = Refusal::of(denial);
        let grpc = host
            .header("content-type")
            .is_some_and(|value| reply::is_grpc(&value));
        // The policy is the plan's own; the default stands in for it all the same.
        let default;
        let answer = match policy {
            Some(p) => &p.denial,
            None => {
                default = Denial::default();
                &default
            }
        };
        // A wait of 0: nobody can say when (a concurrency policy that sets no `retry_after`).
        let retry = denial.decision.retry_after;
        let said = Said {
            retry_secs: (retry > 0).then(|| retry_after_secs(retry)),
            reserve: policy.and_then(|p| p.metered.as_ref()).map(|_| denial.cost),
        };
        let mut reply = LocalReply::refusal(refusal, answer, name, said, grpc);
        if refusal == Refusal::RateLimited {
            let reported = Reported {
                applied: *denial,
                now,
            };
            self.each_response_header(&reported, |name, value| reply.add_header(name, value));
        }
        host.send_response(&reply);
    }

    /// The enforcing policy with the fewest tokens left: the limit the client meets first.
    fn most_restrictive(&self, outcome: &Outcome) -> Option<Applied> {
        outcome
            .applied
            .iter()
            .filter(|a| a.enforced)
            .min_by_key(|a| {
                (
                    a.decision.remaining,
                    std::cmp::Reverse(a.decision.reset_after),
                )
            })
            .copied()
    }

    fn policy_name(&self, policy: usize) -> &str {
        self.plan
            .policies
            .get(policy)
            .map_or("", |p| p.name.as_str())
    }

    fn quota(&self, applied: &Applied) -> Option<Quota<'_>> {
        let policy = self.plan.policies.get(applied.policy)?;
        let decision = &applied.decision;
        Some(Quota {
            policy: &policy.name,
            limit: applied.tier.algorithm.capacity(),
            requests: applied.tier.requests,
            per_nanos: applied.tier.per_nanos,
            remaining: decision.remaining,
            reset_after: decision.reset_after,
            retry_after: (!decision.allowed && decision.retry_after > 0)
                .then_some(decision.retry_after),
            unit: match applied.tier.algorithm {
                Algorithm::Concurrency(_) => QuotaUnit::ConcurrentRequests,
                _ if policy.metered.is_some() => QuotaUnit::Tokens,
                _ => QuotaUnit::Requests,
            },
        })
    }
}

/// This Envoy's own secret for slot hashes, when the operator gives none: random, made by the
/// first VM configured and kept in shared data, where every worker's VM finds it (created at
/// `ABSENT`, so that of two VMs configured at once, one keeps the other's). It outlives
/// configuration changes, as the tables do.
fn own_secret(
    store: &impl Store,
    env: &impl Environment,
    plugin: &str,
) -> Result<HashSecret, ConfigError> {
    let name = format!("sluice/{plugin}/hash-secret");
    let stored = || {
        let (bytes, cas) = store.get(&name)?;
        Some((
            <[u8; 16]>::try_from(bytes.as_slice())
                .ok()
                .map(HashSecret::from_bytes),
            cas,
        ))
    };
    let cas = match stored() {
        Some((Some(secret), _)) => return Ok(secret),
        Some((None, cas)) => cas,
        None => ABSENT,
    };
    let fresh = env
        .random()
        .map(HashSecret::from_bytes)
        .ok_or_else(|| ConfigError {
            field: "hash_secret_env".into(),
            reason: "not given, and the host gave no random bytes for a secret of this Envoy's own"
                .into(),
        })?;
    let _ = store.set(&name, &fresh.to_bytes(), cas);
    let secret = stored().and_then(|(secret, _)| secret).unwrap_or(fresh);
    if secret == fresh {
        log::warn!(
            "no hash_secret_env: slots are keyed with a random secret of this Envoy's own, but global keys, bypass key_hash entries and log lines use the public key, under which anyone can hash keys (see the README, Key hashing)"
        );
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::duration::NANOS_PER_SEC as SEC;
    use crate::exact::ExactStore;
    use crate::limiter::PolicyOutcome::{
        Allowed, Bypassed, CanaryShadowDenied, Denied, ShadowDenied,
    };
    use crate::metrics::{degraded_counter, requests_counter};
    use crate::protocol::{CheckRequest, CheckResponse};
    use crate::store::MemoryStore;
    use crate::testing::{FakeHost, FakeRequest};
    use serde_json::{json, Value};
    use std::cell::RefCell;
    use std::sync::Arc;

    const T0: u64 = 1_800_000_000 * SEC;

    /// The rate-limit headers the glue would add to the response.
    fn response_headers(filter: &Filter, reported: &Reported) -> Vec<(&'static str, String)> {
        let mut headers = Vec::new();
        filter.each_response_header(reported, |name, value| {
            headers.push((name, value.to_string()));
        });
        headers
    }

    /// A filter on its own worker and store.
    fn setup(config: Value) -> (Filter, FakeHost) {
        let host = FakeHost::new(Arc::default(), T0);
        (configure(&config, &host), host)
    }

    fn configure(config: &Value, host: &FakeHost) -> Filter {
        Filter::configure(config.to_string().as_bytes(), "test", host, host, host).unwrap()
    }

    fn send(filter: &Filter, host: &FakeHost, headers: &[(&str, &str)]) -> Verdict {
        *host.request.borrow_mut() =
            FakeRequest::new(headers).with_property("source.address", "10.0.0.1:5555");
        filter.on_request_headers(host)
    }

    fn statuses(filter: &Filter, host: &FakeHost, n: usize, headers: &[(&str, &str)]) -> Vec<u16> {
        (0..n)
            .map(|_| match send(filter, host, headers) {
                Verdict::Continue(_) => 200,
                Verdict::Denied => 429,
                Verdict::Waiting(_) | Verdict::Hold { .. } => {
                    panic!("only for policies that neither call nor hold")
                }
            })
            .collect()
    }

    fn per_user(burst: u64) -> Value {
        json!({"name": "per-user", "key": ["header:x-user-id"], "requests": 1, "per": "1s", "burst": burst})
    }

    const ALICE: &[(&str, &str)] = &[("x-user-id", "alice")];

    #[test]
    fn eight_rapid_requests_with_burst_five_give_five_200s_then_three_429s() {
        let (filter, host) = setup(json!({"policies": [per_user(5)]}));
        assert_eq!(
            statuses(&filter, &host, 8, ALICE),
            [200, 200, 200, 200, 200, 429, 429, 429]
        );
        host.now.set(T0 + 2 * SEC);
        assert_eq!(statuses(&filter, &host, 3, ALICE), [200, 200, 429]);
    }

    #[test]
    fn a_denial_is_a_json_429_with_retry_after_and_headers() {
        let (filter, host) = setup(json!({"headers": "both", "policies": [per_user(1)]}));
        statuses(&filter, &host, 2, ALICE);
        assert_eq!(host.replies.get(), 1);
        let reply = host.reply.borrow();
        let reply = reply.as_ref().unwrap();
        assert_eq!((reply.status, reply.details), (429, "sluice_rate_limited"));
        assert_eq!(
            reply.body,
            r#"{"error":"too_many_requests","policy":"per-user","retry_after":1}"#
        );
        let header = |name: &str| reply.header(name);
        assert_eq!(header("content-type"), Some("application/json"));
        assert_eq!(header("retry-after"), Some("1"));
        assert_eq!(header("x-ratelimit-remaining"), Some("0"));
        assert_eq!(header("ratelimit"), Some(r#""per-user";r=0;t=1"#));
    }

    #[test]
    fn a_grpc_denial_is_resource_exhausted_with_the_rate_limit_headers_and_no_content_type() {
        let (filter, host) = setup(json!({"headers": "both", "policies": [per_user(1)]}));
        let grpc = &[("x-user-id", "alice"), ("content-type", "application/grpc")];
        assert_eq!(statuses(&filter, &host, 2, grpc), [200, 429]);
        let reply = host.reply.borrow().clone().unwrap();
        assert_eq!(reply.grpc_status.code(), 8);
        assert_eq!(
            reply.body,
            "too_many_requests: policy per-user, retry after 1s"
        );
        assert_eq!(reply.header("content-type"), None);
        assert_eq!(reply.header("retry-after"), Some("1"));
        assert_eq!(reply.header("ratelimit"), Some(r#""per-user";r=0;t=1"#));
    }

    #[test]
    fn a_policys_denial_overrides_the_top_level_one_field_by_field() {
        let mut own = per_user(1);
        own["denial"] = json!({"status": 503, "grpc_status": "unavailable"});
        let mut other = per_user(1);
        other["name"] = json!("other");
        other["key"] = json!(["header:x-other"]);
        let config = json!({"denial": {"status": 420, "body": "calm down", "content_type": "text/plain"},
            "policies": [own, other]});
        let (filter, host) = setup(config);
        assert_eq!(statuses(&filter, &host, 2, ALICE), [200, 429]);
        let reply = host.reply.borrow().clone().unwrap();
        assert_eq!((reply.status, reply.body.as_str()), (503, "calm down"));
        assert_eq!(reply.header("content-type"), Some("text/plain"));
        assert_eq!(reply.grpc_status.code(), 14);
        let other_user = &[("x-other", "o")];
        assert_eq!(statuses(&filter, &host, 2, other_user), [200, 429]);
        let reply = host.reply.borrow().clone().unwrap();
        assert_eq!((reply.status, reply.grpc_status.code()), (420, 8));
    }

    #[test]
    fn denials_shadow_denials_and_bypasses_are_recorded_for_the_access_log_and_nothing_else() {
        let mut shadow = per_user(1);
        (shadow["name"], shadow["mode"]) = (json!("trial"), json!("shadow"));
        let config = json!({"policies": [per_user(2), shadow], "bypass": [{"key": ["carol"],
            "policies": ["per-user"], "owner": "o", "reason": "r", "expires": "2030-01-01T00:00:00Z"}]});
        let (filter, host) = setup(config);
        assert_eq!(statuses(&filter, &host, 3, ALICE), [200, 200, 429]);
        statuses(&filter, &host, 1, &[("x-user-id", "carol")]);
        let records = host.records.borrow().clone();
        let fields = |r: &str| r.rsplit_once(" key=").unwrap().0.to_string();
        let fields: Vec<String> = records.iter().map(|r| fields(r)).collect();
        assert_eq!(
            fields,
            [
                "outcome=shadow_denied policy=trial mode=shadow",
                "outcome=denied policy=per-user mode=enforce",
                "outcome=bypassed policy=per-user mode=enforce",
            ],
            "the first request had nothing to record"
        );
    }

    #[test]
    fn an_allowed_request_reads_no_content_type_and_records_nothing() {
        let (filter, host) = setup(json!({"policies": [per_user(5)]}));
        send(&filter, &host, ALICE);
        assert_eq!(host.request.borrow().reads.get(), 1, "x-user-id only");
        assert!(host.records.borrow().is_empty());
    }

    #[test]
    fn allowed_responses_report_the_most_restrictive_policy() {
        let config = json!({"policies": [
            {"name": "roomy", "key": ["header:x-user-id"], "requests": 100, "per": "1s"},
            {"name": "tight", "key": ["ip"], "requests": 1, "per": "1s", "burst": 3},
        ]});
        let (filter, host) = setup(config);
        let Verdict::Continue(Admitted {
            reported: Some(reported),
            ..
        }) = send(&filter, &host, ALICE)
        else {
            panic!("allowed")
        };
        let headers = response_headers(&filter, &reported);
        assert_eq!(headers[0], ("x-ratelimit-limit", "3".to_string()));
        assert_eq!(headers[1], ("x-ratelimit-remaining", "2".to_string()));
    }

    #[test]
    fn keys_are_isolated() {
        let (filter, host) = setup(json!({"policies": [per_user(2)]}));
        assert_eq!(statuses(&filter, &host, 3, ALICE), [200, 200, 429]);
        assert_eq!(
            statuses(&filter, &host, 2, &[("x-user-id", "bob")]),
            [200, 200]
        );
    }

    #[test]
    fn a_request_without_the_key_passes_unless_missing_keys_share_a_bucket() {
        let (filter, host) = setup(json!({"policies": [per_user(1)]}));
        assert_eq!(statuses(&filter, &host, 3, &[]), [200, 200, 200]);
        let mut shared = per_user(1);
        shared["missing_key"] = json!("shared");
        let (filter, host) = setup(json!({"policies": [shared]}));
        assert_eq!(
            statuses(&filter, &host, 2, &[("x-user-id", "")]),
            [200, 429]
        );
        assert_eq!(statuses(&filter, &host, 1, ALICE), [200]);
    }

    #[test]
    fn a_layered_denial_charges_no_other_policy() {
        let config = json!({"policies": [
            {"name": "per-second", "key": ["header:x-user-id"], "requests": 2, "per": "1s"},
            {"name": "per-minute", "key": ["header:x-user-id"], "requests": 3, "per": "1m"},
            {"name": "per-ip", "key": ["ip"], "requests": 10, "per": "1m"},
        ]});
        let (filter, host) = setup(config);
        assert_eq!(statuses(&filter, &host, 4, ALICE), [200, 200, 429, 429]);
        host.now.set(T0 + 1_100 * SEC / 1000);
        assert_eq!(
            statuses(&filter, &host, 2, ALICE),
            [200, 429],
            "per-minute has one left"
        );
        filter.flush_counters(&host);
        assert_eq!(host.counter(&requests_counter("per-ip", Allowed)), 3);
        let Verdict::Continue(Admitted {
            reported: Some(r), ..
        }) = send(&filter, &host, &[("x-user-id", "bob")])
        else {
            panic!()
        };
        let remaining_ip = response_headers(&filter, &r);
        assert_eq!(
            remaining_ip[1].1, "1",
            "bob's per-second bucket is the tightest"
        );
        assert_eq!(host.counter(&requests_counter("per-minute", Denied)), 1);
    }

    #[test]
    fn shadow_policies_count_but_never_deny_or_report() {
        let mut shadow = per_user(1);
        shadow["mode"] = json!("shadow");
        let (filter, host) = setup(json!({"policies": [shadow]}));
        let verdicts: Vec<Verdict> = (0..3).map(|_| send(&filter, &host, ALICE)).collect();
        assert!(verdicts
            .iter()
            .all(|v| matches!(v, Verdict::Continue(Admitted { reported: None, .. }))));
        filter.flush_counters(&host);
        assert_eq!(host.counter(&requests_counter("per-user", ShadowDenied)), 2);
        assert_eq!(host.counter(&requests_counter("per-user", Allowed)), 1);
        assert_eq!(host.replies.get(), 0);
    }

    /// The first user ids whose keys a rollout of `percent` enforces for, and does not.
    fn canary_and_rest(percent: u32) -> (String, String) {
        let inside = |id: &String| {
            let key =
                crate::key::hash_values(std::slice::from_ref(id), &crate::key::HashSecret::PUBLIC);
            crate::key::rollout_position(key) < percent * 10_000
        };
        let ids = || (0..).map(|i| format!("user-{i}"));
        (
            ids().find(inside).unwrap(),
            ids().find(|id| !inside(id)).unwrap(),
        )
    }

    #[test]
    fn a_rollout_enforces_for_its_keys_and_runs_in_shadow_for_the_rest_which_the_default_limits() {
        let mut canary_policy = per_user(1);
        canary_policy["rollout"] = json!({"enforce_percent": 30});
        let baseline = json!({"name": "baseline", "key": ["header:x-user-id"], "requests": 1,
            "per": "1s", "burst": 3});
        let (filter, host) = setup(json!({"policies": [canary_policy], "default": baseline}));
        let (canary, rest) = canary_and_rest(30);
        assert_eq!(
            statuses(&filter, &host, 3, &[("x-user-id", &canary)]),
            [200, 429, 429]
        );
        assert_eq!(
            statuses(&filter, &host, 4, &[("x-user-id", &rest)]),
            [200, 200, 200, 429],
            "outside the canary the new limit is shadow, and the default still limits"
        );
        filter.flush_counters(&host);
        let count = |policy, outcome| host.counter(&requests_counter(policy, outcome));
        assert_eq!(count("per-user", Denied), 2);
        assert_eq!(count("per-user", CanaryShadowDenied), 3);
        assert_eq!(count("per-user", ShadowDenied), 0);
        assert_eq!(count("baseline", Denied), 1);
        let records = host.records.borrow();
        let modes: Vec<&str> = records
            .iter()
            .map(|r| r.split(' ').nth(2).unwrap())
            .collect();
        assert_eq!(
            modes,
            [
                "mode=canary",
                "mode=canary",
                "mode=canary_shadow",
                "mode=canary_shadow",
                "mode=enforce"
            ],
            "the access log tells the canary from the rest"
        );
    }

    #[test]
    fn tiers_give_premium_keys_their_own_rate() {
        let mut tiered = per_user(1);
        tiered["tiers"] = json!({"by": "header:x-plan", "values": {"premium": {"requests": 10, "per": "1s", "burst": 3}}});
        let (filter, host) = setup(json!({"policies": [tiered]}));
        assert_eq!(statuses(&filter, &host, 2, ALICE), [200, 429]);
        let premium = &[("x-user-id", "carol"), ("x-plan", "premium")];
        assert_eq!(statuses(&filter, &host, 4, premium), [200, 200, 200, 429]);
        let unknown = &[("x-user-id", "dave"), ("x-plan", "gold")];
        assert_eq!(statuses(&filter, &host, 2, unknown), [200, 429]);
    }

    #[test]
    fn cost_takes_several_tokens() {
        let mut costly = per_user(5);
        costly["cost"] = json!(2);
        let (filter, host) = setup(json!({"policies": [costly]}));
        assert_eq!(statuses(&filter, &host, 3, ALICE), [200, 200, 429]);
    }

    #[test]
    fn the_default_policy_applies_only_when_nothing_matched() {
        let mut api = per_user(1);
        api["match"] = json!({"path_prefix": "/api/"});
        let config = json!({"policies": [api], "default": {"name": "baseline", "key": ["ip"], "requests": 1, "per": "1s", "burst": 2}});
        let (filter, host) = setup(config);
        let other = &[(":path", "/static/x"), ("x-user-id", "alice")];
        assert_eq!(statuses(&filter, &host, 3, other), [200, 200, 429]);
        let api = &[(":path", "/api/x"), ("x-user-id", "alice")];
        assert_eq!(statuses(&filter, &host, 2, api), [200, 429]);
    }

    #[test]
    fn each_attribute_is_read_once_per_request() {
        let mut p = per_user(5);
        p["match"] = json!({"path_prefix": "/api/", "methods": ["GET"], "headers": [{"name": "x-user-id", "present": true}]});
        let mut q = p.clone();
        q["name"] = json!("again");
        let (filter, host) = setup(json!({"policies": [p, q]}));
        send(
            &filter,
            &host,
            &[(":path", "/api/x"), (":method", "GET"), ("x-user-id", "a")],
        );
        assert_eq!(host.request.borrow().reads.get(), 3);
    }

    #[test]
    fn a_clock_stepping_back_gives_no_extra_tokens() {
        let (filter, host) = setup(json!({"policies": [per_user(2)]}));
        assert_eq!(statuses(&filter, &host, 2, ALICE), [200, 200]);
        host.now.set(T0 + 5 * SEC);
        assert_eq!(statuses(&filter, &host, 2, ALICE), [200, 200]);
        host.now.set(T0);
        assert_eq!(statuses(&filter, &host, 1, ALICE), [429]);
    }

    #[test]
    fn counters_reach_the_host_only_when_flushed() {
        let (filter, host) = setup(json!({"policies": [per_user(1)]}));
        statuses(&filter, &host, 3, ALICE);
        assert_eq!(host.counter(&requests_counter("per-user", Denied)), 0);
        filter.flush_counters(&host);
        assert_eq!(host.counter(&requests_counter("per-user", Denied)), 2);
        assert_eq!(host.counter(&requests_counter("per-user", Allowed)), 1);
    }

    /// `workers` filters on their own threads and one store, each sending `each` requests for
    /// alice at once; what `report` makes of each one's admitted count and host.
    // wasm32-wasip1 has no threads; Envoy's own workers race in the integration tests.
    #[cfg(not(target_arch = "wasm32"))]
    fn race<T: Send + 'static>(
        config: &Value,
        workers: usize,
        each: usize,
        report: fn(usize, &Filter, &FakeHost) -> T,
    ) -> Vec<T> {
        let store = Arc::new(MemoryStore::default());
        configure(config, &FakeHost::new(store.clone(), T0));
        let threads: Vec<_> = (0..workers)
            .map(|_| {
                let (store, config) = (store.clone(), config.clone());
                std::thread::spawn(move || {
                    let host = FakeHost::new(store, T0);
                    let filter = configure(&config, &host);
                    let statuses = statuses(&filter, &host, each, ALICE);
                    report(
                        statuses.iter().filter(|&&s| s == 200).count(),
                        &filter,
                        &host,
                    )
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    #[cfg(not(target_arch = "wasm32"))]
    #[test]
    fn workers_racing_on_one_fresh_key_never_over_admit() {
        let results = race(
            &json!({"policies": [per_user(50)]}),
            4,
            500,
            |admitted, filter, host| {
                filter.flush_counters(host);
                let counter = |name| host.counter(name);
                (
                    admitted,
                    counter("sluice.cas_retries"),
                    counter("sluice.cas_exhausted"),
                )
            },
        );
        let admitted: usize = results.iter().map(|r| r.0).sum();
        assert_eq!(admitted, 50, "{results:?}");
    }

    /// 64 keys, five tokens an hour per user: no refill gets in the way.
    fn small_table() -> Value {
        json!({"policies": [{"name": "per-user", "key": ["header:x-user-id"], "requests": 1,
            "per": "1h", "burst": 5, "max_keys": 64}]})
    }

    #[test]
    fn a_flood_of_new_keys_frees_no_drained_key_and_gives_every_newcomer_its_burst() {
        let (filter, host) = setup(small_table());
        assert_eq!(
            statuses(&filter, &host, 6, ALICE),
            [200, 200, 200, 200, 200, 429]
        );
        for i in 0..5_000u64 {
            host.now.set(T0 + i * 100_000);
            statuses(
                &filter,
                &host,
                1,
                &[("x-user-id", &format!("attacker-{i}"))],
            );
            if i % 1_000 == 500 {
                let newcomer = format!("newcomer-{i}");
                let got = statuses(&filter, &host, 8, &[("x-user-id", &newcomer)]);
                assert_eq!(
                    got,
                    [200, 200, 200, 200, 200, 429, 429, 429],
                    "newcomer {i}"
                );
            }
        }
        let entries = host.store.entry_count();
        assert_eq!(
            entries,
            2 + 1,
            "two pages of 32 keys whatever the number of keys, and the hash secret"
        );
        assert_eq!(
            statuses(&filter, &host, 1, ALICE),
            [429],
            "alice stays drained"
        );
        filter.flush_counters(&host);
        let evictions = host.counter("sluice.evictions");
        assert!(evictions > 4_000, "{evictions}");
        assert_eq!(
            host.counter("sluice.forgiven"),
            evictions,
            "only attackers were forgotten, each owing its one request"
        );
    }

    #[test]
    fn a_slot_whose_bucket_is_full_again_is_reused_without_counting_an_eviction() {
        let mut one_slot = per_user(1);
        one_slot["max_keys"] = json!(1);
        let (filter, host) = setup(json!({ "policies": [one_slot] }));
        assert_eq!(statuses(&filter, &host, 2, ALICE), [200, 429]);
        host.now.set(T0 + SEC);
        assert_eq!(
            statuses(&filter, &host, 2, &[("x-user-id", "bob")]),
            [200, 429]
        );
        filter.flush_counters(&host);
        assert_eq!(host.counter("sluice.evictions"), 0, "alice owed nothing");
        assert_eq!(
            statuses(&filter, &host, 1, ALICE),
            [200],
            "bob's slot was the only one"
        );
        filter.flush_counters(&host);
        assert_eq!(
            (
                host.counter("sluice.evictions"),
                host.counter("sluice.forgiven")
            ),
            (1, 1)
        );
    }

    #[test]
    fn configure_refuses_bad_json() {
        let host = FakeHost::new(Arc::default(), T0);
        let err = Filter::configure(
            br#"{"policies": [{"name": "x"}]}"#,
            "t",
            &host,
            &host,
            &host,
        )
        .unwrap_err();
        assert!(err.to_string().starts_with("policies[0]"), "{err}");
    }

    /// The rate-limit service, answering in its wire format as the exact store decides.
    #[derive(Default)]
    struct FakeService(RefCell<ExactStore>);

    impl FakeService {
        fn answer(&self, body: &[u8], now: u64) -> Vec<u8> {
            let request: CheckRequest = serde_json::from_slice(body).unwrap();
            let mut store = self.0.borrow_mut();
            let results = request.checks.iter().map(|c| store.check(c, now).unwrap());
            let response = CheckResponse {
                results: results.collect(),
            };
            serde_json::to_vec(&response).unwrap()
        }
    }

    /// Sends one request through the filter, answering its calls from `service` (or failing
    /// them when `service` is `None`). Returns the final status.
    fn serve(
        filter: &Filter,
        host: &FakeHost,
        service: Option<&FakeService>,
        headers: &[(&str, &str)],
    ) -> u16 {
        let mut verdict = send(filter, host, headers);
        loop {
            match verdict {
                Verdict::Continue(_) | Verdict::Hold { .. } => return 200,
                Verdict::Denied => return host.reply.borrow().as_ref().unwrap().status as u16,
                Verdict::Waiting(pending) => {
                    let body = host.call.borrow().clone().unwrap();
                    let reply = service.map(|s| (200, s.answer(&body, host.now.get())));
                    verdict = filter.on_service_response(host, pending, reply);
                }
            }
        }
    }

    fn global(policy: Value) -> Value {
        json!({"global": {"cluster": "ratelimit", "authority": "ratelimit"}, "policies": [policy]})
    }

    fn global_per_user(burst: u64) -> Value {
        let mut p = per_user(burst);
        p["scope"] = json!("global");
        p
    }

    #[test]
    fn a_strict_global_policy_asks_the_service_then_remembers_a_denial() {
        let (filter, host) = setup(global(global_per_user(3)));
        let service = FakeService::default();
        let statuses: Vec<u16> = (0..5)
            .map(|_| serve(&filter, &host, Some(&service), ALICE))
            .collect();
        assert_eq!(statuses, [200, 200, 200, 429, 429]);
        assert_eq!(
            host.calls.get(),
            4,
            "the fifth is denied from the over-limit cache"
        );
        host.now.set(T0 + SEC);
        assert_eq!(serve(&filter, &host, Some(&service), ALICE), 200);
        assert_eq!(host.calls.get(), 5);
    }

    #[test]
    fn envoys_sharing_the_service_admit_exactly_the_global_limit() {
        let service = FakeService::default();
        let envoys: Vec<(Filter, FakeHost)> =
            (0..3).map(|_| setup(global(global_per_user(10)))).collect();
        let admitted = (0..40)
            .filter(|i| {
                let (filter, host) = &envoys[i % 3];
                serve(filter, host, Some(&service), ALICE) == 200
            })
            .count();
        assert_eq!(admitted, 10);
    }

    #[test]
    fn a_lease_serves_a_hot_key_with_one_call_per_lease() {
        let mut p = global_per_user(10);
        p["lease"] = json!(5);
        let (filter, host) = setup(global(p));
        let service = FakeService::default();
        let statuses: Vec<u16> = (0..12)
            .map(|_| serve(&filter, &host, Some(&service), ALICE))
            .collect();
        assert_eq!(statuses, [vec![200; 10], vec![429; 2]].concat());
        assert_eq!(
            host.calls.get(),
            3,
            "two leases of 5, then one denial cached"
        );
    }

    #[test]
    fn leased_tokens_lapse_rather_than_outlive_their_ttl() {
        let mut p = global_per_user(10);
        p["lease"] = json!(5);
        let (filter, host) = setup(global(p));
        let service = FakeService::default();
        assert_eq!(serve(&filter, &host, Some(&service), ALICE), 200);
        host.now.set(T0 + crate::limiter::GRANT_TTL);
        assert_eq!(serve(&filter, &host, Some(&service), ALICE), 200);
        assert_eq!(host.calls.get(), 2, "the lapsed lease was not spent");
    }

    #[test]
    fn a_fixed_window_lease_ends_with_its_window() {
        let mut p = global_per_user(10);
        (p["algorithm"], p["burst"], p["requests"]) =
            (json!("fixed_window"), Value::Null, json!(10));
        p["lease"] = json!(5);
        let (filter, host) = setup(global(p));
        let service = FakeService::default();
        // Half-way through a one-second window: it ends 500 ms later, before the lease's 1 s.
        let ms = 1_000_000;
        host.now.set(T0 + 500 * ms);
        assert_eq!(serve(&filter, &host, Some(&service), ALICE), 200);
        host.now.set(T0 + 900 * ms);
        assert_eq!(serve(&filter, &host, Some(&service), ALICE), 200);
        assert_eq!(host.calls.get(), 1, "spent from the lease");
        host.now.set(T0 + 1_100 * ms);
        assert_eq!(serve(&filter, &host, Some(&service), ALICE), 200);
        assert_eq!(host.calls.get(), 2, "the lease ended with the window");
    }

    #[test]
    fn a_service_that_cannot_be_reached_fails_open_to_the_emergency_budget() {
        let mut p = global_per_user(10);
        p["emergency"] = json!({"requests": 1, "per": "1s", "burst": 2});
        let (filter, host) = setup(global(p));
        host.service_reachable.set(false);
        let statuses: Vec<u16> = (0..3).map(|_| serve(&filter, &host, None, ALICE)).collect();
        assert_eq!(statuses, [200, 200, 429]);
        filter.flush_counters(&host);
        assert_eq!(host.counter(&degraded_counter("per-user")), 3);
        assert_eq!(host.counter("sluice.callout_failures"), 3);
    }

    #[test]
    fn a_policy_that_fails_closed_answers_503() {
        let mut p = global_per_user(10);
        p["failure_mode"] = json!("closed");
        let (filter, host) = setup(global(p));
        assert_eq!(serve(&filter, &host, None, ALICE), 503);
        let reply = host.reply.borrow().clone().unwrap();
        assert_eq!(
            reply.body,
            r#"{"error":"rate_limit_unavailable","policy":"per-user","retry_after":1}"#
        );
        assert_eq!(reply.details, "sluice_unavailable");
        assert_eq!(reply.header("retry-after"), Some("1"));
    }

    #[test]
    fn a_non_200_or_garbled_reply_is_a_failure() {
        let mut p = global_per_user(10);
        p["failure_mode"] = json!("closed");
        let (filter, host) = setup(global(p));
        for reply in [(503, b"{}".to_vec()), (200, b"not json".to_vec())] {
            let Verdict::Waiting(pending) = send(&filter, &host, ALICE) else {
                panic!()
            };
            assert!(matches!(
                filter.on_service_response(&host, pending, Some(reply)),
                Verdict::Denied
            ));
        }
    }

    #[test]
    fn after_repeated_failures_the_service_is_left_alone_for_a_backoff() {
        let (filter, host) = setup(global(global_per_user(100)));
        host.service_reachable.set(false);
        for _ in 0..10 {
            serve(&filter, &host, None, ALICE);
        }
        assert_eq!(host.calls.get(), crate::breaker::FAILURES_TO_OPEN as usize);
        host.service_reachable.set(true);
        host.now.set(T0 + crate::breaker::BACKOFF);
        assert_eq!(
            serve(&filter, &host, Some(&FakeService::default()), ALICE),
            200
        );
        assert_eq!(host.calls.get(), 4, "one probe");
    }

    #[test]
    fn a_local_denial_spares_the_service_a_call() {
        let config = json!({"global": {"cluster": "c", "authority": "a"}, "policies": [
            per_user(1),
            {"name": "global-user", "scope": "global", "key": ["header:x-user-id"], "requests": 10, "per": "1s"},
        ]});
        let (filter, host) = setup(config);
        let service = FakeService::default();
        assert_eq!(serve(&filter, &host, Some(&service), ALICE), 200);
        assert_eq!(serve(&filter, &host, Some(&service), ALICE), 429);
        assert_eq!(host.calls.get(), 1);
    }

    #[test]
    fn a_global_denial_charges_no_local_bucket() {
        let config = json!({"global": {"cluster": "c", "authority": "a"}, "policies": [
            {"name": "per-user", "key": ["header:x-user-id"], "requests": 1, "per": "1m", "burst": 5},
            {"name": "global-user", "scope": "global", "key": ["header:x-user-id"], "requests": 1, "per": "1s", "burst": 1},
        ]});
        let (filter, host) = setup(config);
        let service = FakeService::default();
        assert_eq!(serve(&filter, &host, Some(&service), ALICE), 200);
        assert_eq!(
            serve(&filter, &host, Some(&service), ALICE),
            429,
            "denied by the service"
        );
        host.now.set(T0 + SEC);
        assert_eq!(serve(&filter, &host, Some(&service), ALICE), 200);
        let fresh_service_each_time =
            (0..5).filter(|_| serve(&filter, &host, Some(&FakeService::default()), ALICE) == 200);
        assert_eq!(
            fresh_service_each_time.count(),
            3,
            "the local bucket was charged twice, not three times"
        );
    }

    fn bypassed_alice(expires: &str) -> Value {
        json!({"policies": [per_user(1)], "bypass": [{"key": ["alice"], "policies": ["per-user"],
            "owner": "oncall@example.com", "reason": "INC-42 migration", "expires": expires}]})
    }

    #[test]
    fn a_bypassed_key_passes_and_is_counted_until_the_entry_expires() {
        let (filter, host) = setup(bypassed_alice("2027-06-01T00:00:00Z"));
        assert_eq!(statuses(&filter, &host, 3, ALICE), [200, 200, 200]);
        assert_eq!(
            statuses(&filter, &host, 2, &[("x-user-id", "bob")]),
            [200, 429]
        );
        filter.flush_counters(&host);
        assert_eq!(host.counter(&requests_counter("per-user", Bypassed)), 3);
        let (filter, host) = setup(bypassed_alice("2020-01-01T00:00:00Z"));
        assert_eq!(
            statuses(&filter, &host, 2, ALICE),
            [200, 429],
            "expired: ignored"
        );
    }

    #[test]
    fn a_key_that_takes_another_keys_slot_never_spends_its_grant() {
        let mut p = global_per_user(20);
        (p["lease"], p["max_keys"]) = (json!(5), json!(1));
        let (filter, host) = setup(global(p));
        let service = FakeService::default();
        assert_eq!(serve(&filter, &host, Some(&service), ALICE), 200);
        assert_eq!(host.calls.get(), 1, "alice holds four granted tokens");
        let bob = &[("x-user-id", "bob")];
        assert_eq!(serve(&filter, &host, Some(&service), bob), 200);
        assert_eq!(
            host.calls.get(),
            2,
            "bob took the slot, but not alice's tokens"
        );
        filter.flush_counters(&host);
        assert_eq!(
            (
                host.counter("sluice.evictions"),
                host.counter("sluice.forgiven")
            ),
            (1, 0),
            "forgetting a grant forgives nothing: the service decides"
        );
    }

    /// `per_user(burst)` refilling one token an hour, leasing `lease` tokens to a worker.
    fn leasing(burst: u64, lease: u64) -> Value {
        let mut p = per_user(burst);
        (p["per"], p["lease"]) = (json!("1h"), json!(lease));
        json!({ "policies": [p] })
    }

    fn remaining(filter: &Filter, host: &FakeHost, headers: &[(&str, &str)]) -> String {
        let Verdict::Continue(Admitted {
            reported: Some(reported),
            ..
        }) = send(filter, host, headers)
        else {
            panic!("not admitted");
        };
        let headers = response_headers(filter, &reported);
        headers
            .into_iter()
            .find(|(n, _)| *n == "x-ratelimit-remaining")
            .unwrap()
            .1
    }

    #[test]
    fn a_local_lease_serves_a_hot_key_with_one_read_and_write_per_lease() {
        let (filter, host) = setup(leasing(50, 10));
        assert_eq!(
            remaining(&filter, &host, ALICE),
            "49",
            "a first visit takes no lease"
        );
        host.store_calls.set(0);
        let left: Vec<String> = (0..11).map(|_| remaining(&filter, &host, ALICE)).collect();
        assert_eq!(
            left,
            ["48", "47", "46", "45", "44", "43", "42", "41", "40", "39", "38"]
        );
        assert_eq!(
            host.store_calls.get(),
            4,
            "a read and a CAS per lease of 10"
        );
    }

    #[test]
    fn tokens_a_worker_still_holds_go_back_to_the_bucket() {
        let (filter, host) = setup(leasing(20, 10));
        assert_eq!(
            statuses(&filter, &host, 2, ALICE),
            [200, 200],
            "the second leases 10"
        );
        host.now.set(T0 + crate::ledger::LOAN_TTL);
        let later = statuses(&filter, &host, 25, ALICE);
        assert_eq!(later, [vec![200; 18], vec![429; 7]].concat(), "none lost");
    }

    #[test]
    fn more_hot_keys_than_the_ledger_holds_each_get_exactly_their_burst() {
        let (filter, host) = setup(leasing(10, 5));
        let users: Vec<String> = (0..40).map(|i| format!("user-{i}")).collect();
        let mut admitted = vec![0; users.len()];
        for _ in 0..15 {
            for (user, count) in users.iter().zip(&mut admitted) {
                host.now.set(host.now.get() + 1_000_000);
                if let Verdict::Continue(_) = send(&filter, &host, &[("x-user-id", user)]) {
                    *count += 1;
                }
            }
        }
        assert_eq!(admitted, vec![10; users.len()]);
    }

    #[test]
    fn a_key_that_comes_back_later_than_a_lease_lasts_takes_none() {
        let (filter, host) = setup(leasing(20, 10));
        for left in (15..20).rev() {
            host.store_calls.set(0);
            assert_eq!(remaining(&filter, &host, ALICE), left.to_string());
            assert!(
                host.store_calls.get() >= 2,
                "every request visits the bucket"
            );
            host.now.set(host.now.get() + crate::ledger::LOAN_TTL);
        }
    }

    #[test]
    fn a_request_denied_by_another_policy_gives_its_leased_token_back() {
        let per_key = json!({"name": "per-key", "key": ["header:x-api-key"], "requests": 1,
            "per": "1h", "burst": 2});
        let mut config = leasing(10, 5);
        config["policies"].as_array_mut().unwrap().push(per_key);
        let (filter, host) = setup(config);
        let with_key = &[("x-user-id", "alice"), ("x-api-key", "k1")];
        assert_eq!(statuses(&filter, &host, 3, with_key), [200, 200, 429]);
        // alice's bucket: 10, less 1, then a lease of 5 (one spent; the denied request's token
        // came back): 4 held, 4 left.
        let alone = statuses(&filter, &host, 10, ALICE);
        assert_eq!(alone, [vec![200; 8], vec![429; 2]].concat());
    }

    #[cfg(not(target_arch = "wasm32"))]
    #[test]
    fn workers_racing_with_leases_never_over_admit() {
        let results = race(&leasing(50, 4), 4, 500, |admitted, _, _| admitted);
        let admitted: usize = results.iter().sum();
        assert!((50 - 4 * 3..=50).contains(&admitted), "{results:?}");
    }

    proptest::proptest! {
        /// Workers leasing from one bucket at random moments, handing back what they hold when
        /// leases expire: what they admit never exceeds what the bucket gives (its burst plus the
        /// refill so far). (`workers_racing_with_leases_never_over_admit` bounds the shortfall.)
        #[test]
        fn leasing_workers_admit_what_the_bucket_gives(
            lease in 1u64..8,
            extra in 0u64..20,
            steps in proptest::collection::vec((0usize..3, 0u64..400), 1..300),
        ) {
            let (burst, rate_per_sec) = (lease + extra, 10);
            let mut p = per_user(burst);
            (p["requests"], p["lease"], p["max_keys"]) = (json!(rate_per_sec), json!(lease), json!(4));
            let config = json!({ "policies": [p] });
            let store = Arc::new(MemoryStore::default());
            let workers: Vec<(Filter, FakeHost)> = (0..3)
                .map(|_| {
                    let host = FakeHost::new(store.clone(), T0);
                    (configure(&config, &host), host)
                })
                .collect();
            let (mut now, mut admitted) = (T0, 0);
            for (worker, ms) in steps {
                now += ms * 1_000_000;
                let (filter, host) = &workers[worker];
                host.now.set(now);
                if matches!(send(filter, host, ALICE), Verdict::Continue(_)) {
                    admitted += 1;
                }
                let given = burst + (now - T0) * rate_per_sec / SEC;
                proptest::prop_assert!(admitted <= given, "{admitted} > {given}");
            }
        }
    }
}
