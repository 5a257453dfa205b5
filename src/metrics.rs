//! The filter's counters. They are counted in VM memory and handed to the host in batches: a
//! hostcall per request per counter would cost more than the rate-limit decision itself.
//!
//! Per-policy counters carry their labels in their names, as `<label>=.=<value>;.;` (the form
//! Istio's `extraStatTags` reads): `sluice.sluice_policy=.=per-user;.;sluice_outcome=.=denied;.;requests_total`.
//! A bootstrap's `stats_config.stats_tags` with `tag_regex` of each label in `LABELS` takes them
//! out of the name, so Prometheus shows `sluice_requests_total{sluice_policy="per-user",
//! sluice_outcome="denied"}`. Policy names never hold `;` or `=`, so a value always ends at the
//! first `;.;`: no two policies share a series, whatever their dots, dashes and underscores.
//! Another label is one more pair in the names and one more entry in `LABELS`.

use crate::config::Plan;
use crate::limiter::{Basis, Outcome, PolicyOutcome};
use std::cell::Cell;

/// The label naming a counter's policy.
pub const POLICY_LABEL: &str = "sluice_policy";
/// The label naming what the policy did with the requests a counter counts.
pub const OUTCOME_LABEL: &str = "sluice_outcome";
/// Every label of sluice's counters: each needs a `stats_tags` entry in the bootstrap.
pub const LABELS: [&str; 2] = [POLICY_LABEL, OUTCOME_LABEL];

/// The `stats_tags` regex that takes `label` out of a counter's name into a tag: what Istio
/// generates for a name listed in `extraStatTags`.
pub fn tag_regex(label: &str) -> String {
    format!(r"({label}=\.=(.*?);\.;)")
}

/// A counter's name: `sluice.`, each label as `<label>=.=<value>;.;`, then `base`.
pub fn labelled_name(labels: &[(&str, &str)], base: &str) -> String {
    let mut name = String::from("sluice.");
    for (label, value) in labels {
        for part in [label, "=.=", value, ";.;"] {
            name.push_str(part);
        }
    }
    name.push_str(base);
    name
}

/// The name of the counter of `policy`'s requests with `outcome`
/// (`sluice_requests_total{sluice_policy, sluice_outcome}`).
pub fn requests_counter(policy: &str, outcome: PolicyOutcome) -> String {
    labelled_name(
        &[(POLICY_LABEL, policy), (OUTCOME_LABEL, outcome.as_str())],
        "requests_total",
    )
}

/// The name of the counter of `policy`'s decisions taken without the rate-limit service
/// (`sluice_degraded_total{sluice_policy}`): they also count in `requests_counter`.
pub fn degraded_counter(policy: &str) -> String {
    labelled_name(&[(POLICY_LABEL, policy)], "degraded_total")
}

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
        self.pending.set(self.pending.get().saturating_add(by));
    }

    fn flush(&self, metrics: &impl Metrics) {
        if let (Some(id), by @ 1..) = (self.id, self.pending.take()) {
            metrics.increment(id, by);
        }
    }
}

#[derive(Debug, Default)]
struct PolicyCounters {
    /// By `PolicyOutcome`, in the order of `PolicyOutcome::ALL` (`canary_shadow_denied` defined
    /// only for a policy with a rollout).
    requests: [Counter; PolicyOutcome::ALL.len()],
    /// Decisions taken without the service because it could not answer.
    degraded: Counter,
}

#[derive(Debug, Default)]
pub struct Counters {
    policies: Vec<PolicyCounters>,
    cas_retries: Counter,
    cas_exhausted: Counter,
    evictions: Counter,
    forgiven: Counter,
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
                requests: PolicyOutcome::ALL.map(|o| match (o, p.rollout) {
                    (PolicyOutcome::CanaryShadowDenied, None) => Counter::default(),
                    _ => counter(requests_counter(&p.name, o)),
                }),
                degraded: counter(degraded_counter(&p.name)),
            })
            .collect();
        Counters {
            policies,
            cas_retries: counter("sluice.cas_retries".into()),
            cas_exhausted: counter("sluice.cas_exhausted".into()),
            evictions: counter("sluice.evictions".into()),
            forgiven: counter("sluice.forgiven".into()),
            callouts: counter("sluice.callouts".into()),
            callout_failures: counter("sluice.callout_failures".into()),
        }
    }

    /// Counts a finished request: each policy's part in it, and the store's contention.
    pub fn count(&self, plan: &Plan, outcome: &Outcome) {
        for (policy, _, what) in outcome.by_policy(plan) {
            let counter = self.policies.get(policy);
            if let Some(counter) = counter.and_then(|p| p.requests.get(what.index())) {
                counter.add(1);
            }
            if matches!(
                what,
                PolicyOutcome::ShadowDenied | PolicyOutcome::CanaryShadowDenied
            ) {
                log::debug!(
                    "policy {} would deny in shadow, version {}",
                    plan.policies.get(policy).map_or("", |p| p.name.as_str()),
                    plan.version
                );
            }
        }
        let degraded = outcome
            .applied
            .iter()
            .filter(|a| matches!(a.basis, Basis::Emergency | Basis::Unavailable));
        for applied in degraded {
            if let Some(counters) = self.policies.get(applied.policy) {
                counters.degraded.add(1);
            }
        }
        self.cas_retries.add(u64::from(outcome.cas_retries));
        self.evictions.add(u64::from(outcome.evictions));
        self.forgiven.add(outcome.forgiven);
        self.cas_exhausted.add(u64::from(outcome.exhausted));
    }

    /// Hands the counts gathered since the last flush to the host.
    pub fn flush(&self, metrics: &impl Metrics) {
        self.policies
            .iter()
            .flat_map(|p| p.requests.iter().chain([&p.degraded]))
            .chain([
                &self.cas_retries,
                &self.cas_exhausted,
                &self.evictions,
                &self.forgiven,
                &self.callouts,
                &self.callout_failures,
            ])
            .for_each(|c| c.flush(metrics));
    }
}

/// Counts a refused configuration, for operators who watch stats rather than logs.
pub fn count_config_error(metrics: &impl Metrics) {
    if let Some(id) = metrics.define_counter("sluice.config_errors") {
        metrics.increment(id, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_name_carries_its_labels_between_sluice_and_its_base() {
        assert_eq!(
            requests_counter("per-user", PolicyOutcome::ShadowDenied),
            "sluice.sluice_policy=.=per-user;.;sluice_outcome=.=shadow_denied;.;requests_total"
        );
        assert_eq!(
            degraded_counter("global.user"),
            "sluice.sluice_policy=.=global.user;.;degraded_total"
        );
    }

    /// What Envoy's tag extraction with `tag_regex(label)` makes of `name`: the first
    /// `label=.=` up to the first `;.;` after it is the tag's value and leaves the name.
    fn extract(name: &str, label: &str) -> (String, String) {
        let start = name.find(&format!("{label}=.=")).unwrap();
        let value_start = start + label.len() + 3;
        let value_len = name[value_start..].find(";.;").unwrap();
        let rest = format!("{}{}", &name[..start], &name[value_start + value_len + 3..]);
        (name[value_start..value_start + value_len].to_string(), rest)
    }

    proptest::proptest! {
        /// Any policy name (`[A-Za-z0-9_.-]`, which Prometheus would flatten to `_`) comes out of
        /// its counters' names whole, and leaves the same name for every policy.
        #[test]
        fn every_policy_name_comes_back_whole_as_its_label(policy in "[A-Za-z0-9_.-]{1,64}") {
            for outcome in PolicyOutcome::ALL {
                let (value, rest) = extract(&requests_counter(&policy, outcome), POLICY_LABEL);
                proptest::prop_assert_eq!(&value, &policy);
                let (value, rest) = extract(&rest, OUTCOME_LABEL);
                proptest::prop_assert_eq!(value, outcome.as_str());
                proptest::prop_assert_eq!(rest, "sluice.requests_total");
            }
            let (value, rest) = extract(&degraded_counter(&policy), POLICY_LABEL);
            proptest::prop_assert_eq!(&value, &policy);
            proptest::prop_assert_eq!(rest, "sluice.degraded_total");
        }
    }

    #[test]
    fn tag_regexes_are_those_istio_generates_for_extra_stat_tags() {
        assert_eq!(tag_regex("sluice_policy"), r"(sluice_policy=\.=(.*?);\.;)");
    }
}
