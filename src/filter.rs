//! The filter's behaviour for one HTTP request, written against the `Host` seam so it runs
//! natively in tests; `wasm` implements `Host` over proxy-wasm and only maps the verdict to
//! Envoy's actions.

use crate::config::{self, ConfigError, Plan};
use crate::headers::{denial_body, rate_limit_headers, retry_after_secs, Quota};
use crate::limiter::{self, Applied, Outcome};
use crate::request::{Attributes, RequestSource};
use crate::store::Store;
use crate::table;
use std::cell::Cell;

/// What the filter needs from the proxy.
pub trait Host: RequestSource + Store {
    /// Wall-clock time, Unix nanoseconds.
    fn now(&self) -> u64;
    /// Sends a local reply instead of forwarding the request.
    fn send_response(&self, status: u32, headers: &[(&str, &str)], body: &[u8]);
}

/// Counter registration and updates (proxy-wasm metrics, shown in Envoy's stats).
pub trait Metrics {
    fn define_counter(&self, name: &str) -> Option<u32>;
    fn increment(&self, id: u32, by: u64);
}

/// A counter counted in VM memory and handed to the host in batches: a hostcall per request
/// per counter would cost more than the rate-limit decision itself.
#[derive(Debug, Default)]
pub struct Counter {
    id: Option<u32>,
    pending: Cell<u64>,
}

impl Counter {
    fn define(metrics: &impl Metrics, name: &str) -> Self {
        Counter {
            id: metrics.define_counter(name),
            pending: Cell::new(0),
        }
    }

    fn add(&self, by: u64) {
        self.pending.set(self.pending.get() + by);
    }

    fn flush(&self, metrics: &impl Metrics) {
        if let (Some(id), by @ 1..) = (self.id, self.pending.take()) {
            metrics.increment(id, by);
        }
    }
}

#[derive(Debug, Default)]
struct PolicyCounters {
    allowed: Counter,
    denied: Counter,
    shadow_denied: Counter,
}

#[derive(Debug, Default)]
struct Counters {
    policies: Vec<PolicyCounters>,
    cas_retries: Counter,
    cas_exhausted: Counter,
    evictions: Counter,
}

impl Counters {
    fn define(metrics: &impl Metrics, plan: &Plan) -> Self {
        let policies = plan
            .policies
            .iter()
            .map(|p| PolicyCounters {
                allowed: Counter::define(metrics, &format!("sluice.{}.allowed", p.name)),
                denied: Counter::define(metrics, &format!("sluice.{}.denied", p.name)),
                shadow_denied: Counter::define(
                    metrics,
                    &format!("sluice.{}.shadow_denied", p.name),
                ),
            })
            .collect();
        Counters {
            policies,
            cas_retries: Counter::define(metrics, "sluice.cas_retries"),
            cas_exhausted: Counter::define(metrics, "sluice.cas_exhausted"),
            evictions: Counter::define(metrics, "sluice.evictions"),
        }
    }

    fn all(&self) -> impl Iterator<Item = &Counter> {
        self.policies
            .iter()
            .flat_map(|p| [&p.allowed, &p.denied, &p.shadow_denied])
            .chain([&self.cas_retries, &self.cas_exhausted, &self.evictions])
    }
}

/// Counts a refused configuration, for operators who watch stats rather than logs.
pub fn count_config_error(metrics: &impl Metrics) {
    if let Some(id) = metrics.define_counter("sluice.config_errors") {
        metrics.increment(id, 1);
    }
}

/// What to do with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Forward it; the response gets the rate-limit headers of this policy, if any.
    Continue(Option<Reported>),
    /// A 429 has been sent.
    Denied,
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
    prefix: String,
    counters: Counters,
    /// The latest time seen: the wall clock may step back, this worker's time does not.
    latest: Cell<u64>,
}

impl Filter {
    /// Parses the configuration, creates the shared-data slots and the counters.
    /// `plugin` namespaces the shared data, which Envoy shares per VM id.
    pub fn configure(
        json: &[u8],
        plugin: &str,
        store: &impl Store,
        metrics: &impl Metrics,
    ) -> Result<Filter, ConfigError> {
        let plan = config::parse(json)?;
        let prefix = format!("sluice/{plugin}/");
        for spec in &plan.tables {
            table::create_slots(store, &prefix, spec).map_err(|e| ConfigError {
                field: "max_keys".into(),
                reason: format!("could not create shared-data slots: {e:?}"),
            })?;
        }
        let counters = Counters::define(metrics, &plan);
        Ok(Filter {
            plan,
            prefix,
            counters,
            latest: Cell::new(0),
        })
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Decides a request from its headers; sends the 429 itself.
    pub fn on_request_headers(&self, host: &impl Host) -> Verdict {
        let now = self.latest.get().max(host.now());
        self.latest.set(now);
        let mut request = Attributes::new(host, &self.plan.attrs);
        let outcome = limiter::evaluate(&self.plan, &self.prefix, &mut request, host, now);
        self.count(&outcome);
        match self.denial(&outcome) {
            Some(denial) => {
                self.deny(host, &denial, now);
                Verdict::Denied
            }
            None => Verdict::Continue(
                self.most_restrictive(&outcome)
                    .map(|applied| Reported { applied, now }),
            ),
        }
    }

    /// The rate-limit headers to add to the response.
    pub fn response_headers(&self, reported: &Reported) -> Vec<(&'static str, String)> {
        match self.quota(&reported.applied) {
            Some(quota) => rate_limit_headers(self.plan.headers, &quota, reported.now),
            None => Vec::new(),
        }
    }

    /// Hands the counts gathered since the last flush to the host.
    pub fn flush_counters(&self, metrics: &impl Metrics) {
        self.counters.all().for_each(|c| c.flush(metrics));
    }

    fn count(&self, outcome: &Outcome) {
        let denied = outcome.is_denied();
        for applied in &outcome.applied {
            let (Some(counters), Some(policy)) = (
                self.counters.policies.get(applied.policy),
                self.plan.policies.get(applied.policy),
            ) else {
                continue;
            };
            match (applied.decision.allowed, policy.shadow) {
                (false, true) => {
                    log::debug!(
                        "shadow policy {} would deny, version {}",
                        policy.name,
                        self.plan.version
                    );
                    counters.shadow_denied.add(1);
                }
                (false, false) => counters.denied.add(1),
                (true, _) if !denied => counters.allowed.add(1),
                (true, _) => {}
            }
        }
        self.counters
            .cas_retries
            .add(u64::from(outcome.cas_retries));
        self.counters.evictions.add(u64::from(outcome.evictions));
        self.counters
            .cas_exhausted
            .add(u64::from(outcome.exhausted));
    }

    /// The denial to answer with: the strictest enforcing denial or, when a contended slot
    /// could not be written, the first enforcing policy with a one-second wait.
    fn denial(&self, outcome: &Outcome) -> Option<Applied> {
        outcome.denied_by.or_else(|| {
            let first_enforcing = outcome.applied.iter().find(|a| self.is_enforcing(a.policy));
            first_enforcing
                .filter(|_| outcome.exhausted)
                .map(|a| Applied {
                    decision: crate::gcra::Decision {
                        allowed: false,
                        retry_after: crate::duration::NANOS_PER_SEC,
                        ..a.decision
                    },
                    ..*a
                })
        })
    }

    fn deny(&self, host: &impl Host, denial: &Applied, now: u64) {
        let name = self
            .plan
            .policies
            .get(denial.policy)
            .map_or("", |p| p.name.as_str());
        log::debug!(
            "denied by policy {name}, version {}, key {:016x}",
            self.plan.version,
            denial.key
        );
        let retry = retry_after_secs(denial.decision.retry_after).to_string();
        let mut headers = vec![
            ("content-type", "application/json".to_string()),
            ("retry-after", retry),
        ];
        headers.extend(self.response_headers(&Reported {
            applied: *denial,
            now,
        }));
        let pairs: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let body = denial_body(name, retry_after_secs(denial.decision.retry_after));
        host.send_response(429, &pairs, body.as_bytes());
    }

    /// The enforcing policy with the fewest tokens left: the limit the client meets first.
    fn most_restrictive(&self, outcome: &Outcome) -> Option<Applied> {
        outcome
            .applied
            .iter()
            .filter(|a| self.is_enforcing(a.policy))
            .min_by_key(|a| {
                (
                    a.decision.remaining,
                    std::cmp::Reverse(a.decision.reset_after),
                )
            })
            .copied()
    }

    fn is_enforcing(&self, policy: usize) -> bool {
        self.plan.policies.get(policy).is_some_and(|p| !p.shadow)
    }

    fn quota(&self, applied: &Applied) -> Option<Quota<'_>> {
        let policy = self.plan.policies.get(applied.policy)?;
        Some(Quota {
            policy: &policy.name,
            limit: applied.tier.rate.burst,
            requests: applied.tier.requests,
            window_secs: applied.tier.window_secs,
            remaining: applied.decision.remaining,
            reset_after: applied.decision.reset_after,
        })
    }
}
