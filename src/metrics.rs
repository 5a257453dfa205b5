//! The filter's counters. They are counted in VM memory and handed to the host in batches: a
//! hostcall per request per counter would cost more than the rate-limit decision itself.

use crate::config::Plan;
use crate::limiter::{Basis, Outcome};
use std::cell::Cell;

/// Counter registration and updates (proxy-wasm metrics, shown in Envoy's stats).
pub trait Metrics {
    fn define_counter(&self, name: &str) -> Option<u32>;
    fn increment(&self, id: u32, by: u64);
}

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

    pub fn add(&self, by: u64) {
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
    /// Would-be denials of keys outside a rollout's enforced share (defined for policies with
    /// a rollout only).
    canary_shadow_denied: Counter,
    /// Decisions taken without the service because it could not answer.
    degraded: Counter,
    /// Requests a bypass entry exempted.
    bypassed: Counter,
}

#[derive(Debug, Default)]
pub struct Counters {
    policies: Vec<PolicyCounters>,
    cas_retries: Counter,
    cas_exhausted: Counter,
    evictions: Counter,
    overflowed: Counter,
    pub callouts: Counter,
    pub callout_failures: Counter,
}

impl Counters {
    pub fn define(metrics: &impl Metrics, plan: &Plan) -> Self {
        let counter = |name: String| Counter::define(metrics, &name);
        let policies = plan
            .policies
            .iter()
            .map(|p| PolicyCounters {
                allowed: counter(format!("sluice.{}.allowed", p.name)),
                denied: counter(format!("sluice.{}.denied", p.name)),
                shadow_denied: counter(format!("sluice.{}.shadow_denied", p.name)),
                canary_shadow_denied: match p.rollout {
                    Some(_) => counter(format!("sluice.{}.canary_shadow_denied", p.name)),
                    None => Counter::default(),
                },
                degraded: counter(format!("sluice.{}.degraded", p.name)),
                bypassed: counter(format!("sluice.{}.bypassed", p.name)),
            })
            .collect();
        Counters {
            policies,
            cas_retries: counter("sluice.cas_retries".into()),
            cas_exhausted: counter("sluice.cas_exhausted".into()),
            evictions: counter("sluice.evictions".into()),
            overflowed: counter("sluice.overflowed".into()),
            callouts: counter("sluice.callouts".into()),
            callout_failures: counter("sluice.callout_failures".into()),
        }
    }

    /// Counts a finished request: each policy's verdict, and the store's contention.
    pub fn count(&self, plan: &Plan, outcome: &Outcome) {
        each_count(plan, outcome, |policy, count| {
            let Some(counters) = self.policies.get(policy) else {
                return;
            };
            match count {
                Count::Allowed => counters.allowed.add(1),
                Count::Denied => counters.denied.add(1),
                Count::ShadowDenied => counters.shadow_denied.add(1),
                Count::CanaryShadowDenied => counters.canary_shadow_denied.add(1),
                Count::Degraded => counters.degraded.add(1),
                Count::Bypassed => counters.bypassed.add(1),
            }
        });
        self.cas_retries.add(u64::from(outcome.cas_retries));
        self.evictions.add(u64::from(outcome.evictions));
        self.overflowed.add(u64::from(outcome.overflowed));
        self.cas_exhausted.add(u64::from(outcome.exhausted));
    }

    /// Hands the counts gathered since the last flush to the host.
    pub fn flush(&self, metrics: &impl Metrics) {
        self.policies
            .iter()
            .flat_map(|p| {
                [
                    &p.allowed,
                    &p.denied,
                    &p.shadow_denied,
                    &p.canary_shadow_denied,
                    &p.degraded,
                    &p.bypassed,
                ]
            })
            .chain([
                &self.cas_retries,
                &self.cas_exhausted,
                &self.evictions,
                &self.overflowed,
                &self.callouts,
                &self.callout_failures,
            ])
            .for_each(|c| c.flush(metrics));
    }
}

/// What a finished request counts for one policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// The policy applied and the request went through.
    Allowed,
    Denied,
    /// A shadow policy would have denied.
    ShadowDenied,
    /// A policy with a rollout would have denied a key outside its enforced share.
    CanaryShadowDenied,
    /// Decided without the service because it could not answer (besides the verdict's count).
    Degraded,
    /// A bypass entry exempted the request from the policy.
    Bypassed,
}

/// Calls `count` with every (policy, count) a finished request makes: the one definition of what
/// the filter's counters, and `sluice-replay`'s report, count. A policy that allowed a request
/// another one denied counts nothing for it.
pub fn each_count(plan: &Plan, outcome: &Outcome, mut count: impl FnMut(usize, Count)) {
    let denied = outcome.is_denied();
    for applied in &outcome.applied {
        let Some(policy) = plan.policies.get(applied.policy) else {
            continue;
        };
        if matches!(applied.basis, Basis::Emergency | Basis::Unavailable) {
            count(applied.policy, Count::Degraded);
        }
        if applied.decision.allowed {
            if !denied {
                count(applied.policy, Count::Allowed);
            }
        } else if applied.enforced {
            count(applied.policy, Count::Denied);
        } else {
            log::debug!(
                "shadow policy {} would deny key {:016x}, version {}",
                policy.name,
                applied.key,
                plan.version
            );
            let shadow = if policy.shadow {
                Count::ShadowDenied
            } else {
                Count::CanaryShadowDenied
            };
            count(applied.policy, shadow);
        }
    }
    for bypass in outcome.bypassed.iter().filter_map(|&i| plan.bypass.get(i)) {
        count(bypass.policy, Count::Bypassed);
    }
}

/// Counts a refused configuration, for operators who watch stats rather than logs.
pub fn count_config_error(metrics: &impl Metrics) {
    if let Some(id) = metrics.define_counter("sluice.config_errors") {
        metrics.increment(id, 1);
    }
}
