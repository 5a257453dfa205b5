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
use crate::core::usage::price::PricedAs;
use crate::limiter::{Basis, Outcome, PolicyOutcome};
use std::cell::Cell;

/// The label naming a counter's policy.
pub const POLICY_LABEL: &str = "sluice_policy";
/// The label naming what the policy did with the requests a counter counts.
pub const OUTCOME_LABEL: &str = "sluice_outcome";
/// The label naming why a concurrency policy's slot was given back.
pub const REASON_LABEL: &str = "sluice_reason";
/// Every label of sluice's counters: each needs a `stats_tags` entry in the bootstrap.
pub const LABELS: [&str; 3] = [POLICY_LABEL, OUTCOME_LABEL, REASON_LABEL];

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

/// The name of the gauge of `policy`'s slots in use in this Envoy (`sluice_slots_in_use`).
pub fn slots_in_use_gauge(policy: &str) -> String {
    labelled_name(&[(POLICY_LABEL, policy)], "slots_in_use")
}

/// The name of the gauge of `policy`'s keys in debt in this Envoy (`sluice_keys_in_debt`).
pub fn keys_in_debt_gauge(policy: &str) -> String {
    labelled_name(&[(POLICY_LABEL, policy)], "keys_in_debt")
}

/// Why a slot stopped being in use: its request ended, or nobody gave it back in time; or, for
/// a global policy, it was never used: the service's slot for a request that did not run on it
/// (refused by another policy, its check failed or timed out, or the request ended while its
/// check was under way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotEnd {
    Completed,
    Reset,
    Expired,
    Unused,
}

impl SlotEnd {
    pub const ALL: [SlotEnd; 4] = [
        SlotEnd::Completed,
        SlotEnd::Reset,
        SlotEnd::Expired,
        SlotEnd::Unused,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SlotEnd::Completed => "completed",
            SlotEnd::Reset => "reset",
            SlotEnd::Expired => "expired",
            SlotEnd::Unused => "unused",
        }
    }
}

/// The name of the counter of `policy`'s slots that ended for `reason`
/// (`sluice_slots_released_total{sluice_policy, sluice_reason}`).
pub fn slots_released_counter(policy: &str, reason: SlotEnd) -> String {
    labelled_name(
        &[(POLICY_LABEL, policy), (REASON_LABEL, reason.as_str())],
        "slots_released_total",
    )
}

/// Why a metered policy could not read what a response used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageUnknown {
    /// The response ended without it.
    Missing,
    /// What it said was not a count (malformed, negative, huge).
    Invalid,
    /// The stream was reset before it came.
    Reset,
}

impl UsageUnknown {
    pub const ALL: [UsageUnknown; 3] = [
        UsageUnknown::Missing,
        UsageUnknown::Invalid,
        UsageUnknown::Reset,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            UsageUnknown::Missing => "missing",
            UsageUnknown::Invalid => "invalid",
            UsageUnknown::Reset => "reset",
        }
    }
}

/// The name of the counter of tokens `policy`'s responses were charged in the end, with `base`:
/// `tokens_charged_total` (what they used, or what `on_unknown` charges), `tokens_refunded_total`
/// (reserved and not used), `tokens_owed_total` (charged past the limit: the debt run up),
/// `tokens_unknown_total` (charged to responses whose usage never came).
pub fn tokens_counter(policy: &str, base: &str) -> String {
    labelled_name(&[(POLICY_LABEL, policy)], base)
}

/// The name of the counter of `policy`'s responses whose usage never came, by why
/// (`sluice_usage_unknown_total{sluice_policy, sluice_reason}`).
pub fn usage_unknown_counter(policy: &str, why: UsageUnknown) -> String {
    labelled_name(
        &[(POLICY_LABEL, policy), (REASON_LABEL, why.as_str())],
        "usage_unknown_total",
    )
}

/// The name of the counter of `policy`'s responses (and refused requests) whose model no price
/// lists, by what the policy did (`sluice_unknown_model_total{sluice_policy, sluice_outcome}`:
/// `refused`, `dearest`, `default_price`, `free`).
pub fn unknown_model_counter(policy: &str, priced_as: PricedAs) -> String {
    labelled_name(
        &[(POLICY_LABEL, policy), (OUTCOME_LABEL, priced_as.as_str())],
        "unknown_model_total",
    )
}

/// Counter and gauge registration and updates (proxy-wasm metrics, shown in Envoy's stats).
pub trait Metrics {
    fn define_counter(&self, name: &str) -> Option<u32>;
    fn increment(&self, id: u32, by: u64);
    fn define_gauge(&self, name: &str) -> Option<u32>;
    /// Moves a gauge by `by`, up or down: every worker's moves add up in Envoy's one gauge.
    fn adjust(&self, id: u32, by: i64);
    /// Sets a gauge to `value`: for a value every worker reads alike (the overrides' age).
    fn set(&self, id: u32, value: u64);
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

/// A gauge this worker moves, its moves handed to the host in batches as counts are.
#[derive(Debug, Default)]
pub struct Gauge {
    id: Option<u32>,
    pending: Cell<i64>,
}

impl Gauge {
    fn define(metrics: &impl Metrics, name: &str) -> Self {
        Gauge {
            id: metrics.define_gauge(name),
            pending: Cell::new(0),
        }
    }

    pub fn add(&self, by: i64) {
        self.pending.set(self.pending.get().saturating_add(by));
    }

    fn flush(&self, metrics: &impl Metrics) {
        if let (Some(id), by) = (self.id, self.pending.take()) {
            if by != 0 {
                metrics.adjust(id, by);
            }
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
    /// A concurrency policy's slots.
    slots: Option<SlotCounters>,
    /// A metered policy's tokens.
    tokens: Option<TokenCounters>,
}

/// A metered policy's tokens, and its responses whose usage never came.
#[derive(Debug, Default)]
struct TokenCounters {
    charged: Counter,
    refunded: Counter,
    owed: Counter,
    /// Keys this Envoy's charges put in debt that still owe (`response::Debtors`).
    in_debt: Gauge,
    /// Of `charged`: what responses whose usage never came were charged (`on_unknown`).
    charged_unknown: Counter,
    /// By `UsageUnknown`, in the order of `UsageUnknown::ALL`.
    unknown: [Counter; UsageUnknown::ALL.len()],
    /// A spend budget's unpriced models, by `PricedAs`, in the order of `PricedAs::UNKNOWN`.
    unknown_models: Option<[Counter; PricedAs::UNKNOWN.len()]>,
}

/// A concurrency policy's slots: in use here, and how they ended, by `SlotEnd`.
#[derive(Debug, Default)]
struct SlotCounters {
    in_use: Gauge,
    ended: [Counter; SlotEnd::ALL.len()],
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
    /// Settlements the service took, and those given up (`outbox`).
    settlements_delivered: Counter,
    settlements_dropped: Counter,
    /// Settlements the service refused: dropped, never sent again.
    settlements_rejected: Counter,
    /// The overrides pulled from the service, when they are (`global.overrides`).
    overrides: Option<OverrideCounters>,
    /// The admin path's writes (`sluice.admin_writes`, every one whatever its outcome), and its
    /// calls refused for their token (`sluice.admin_unauthorized`: 401 and 403), when it is on.
    pub admin_writes: Counter,
    pub admin_unauthorized: Counter,
}

/// The overrides' pulls: the failed ones, and the age and number of the overrides held.
#[derive(Debug, Default)]
struct OverrideCounters {
    pull_failures: Counter,
    age_seconds: Option<u32>,
    held: Option<u32>,
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
                slots: p.holds_slots().then(|| SlotCounters {
                    in_use: Gauge::define(metrics, &slots_in_use_gauge(&p.name)),
                    ended: SlotEnd::ALL.map(|e| counter(slots_released_counter(&p.name, e))),
                }),
                tokens: p.metered.is_some().then(|| TokenCounters {
                    charged: counter(tokens_counter(&p.name, "tokens_charged_total")),
                    refunded: counter(tokens_counter(&p.name, "tokens_refunded_total")),
                    owed: counter(tokens_counter(&p.name, "tokens_owed_total")),
                    in_debt: Gauge::define(metrics, &keys_in_debt_gauge(&p.name)),
                    charged_unknown: counter(tokens_counter(&p.name, "tokens_unknown_total")),
                    unknown: UsageUnknown::ALL.map(|w| counter(usage_unknown_counter(&p.name, w))),
                    unknown_models: p
                        .metered
                        .as_ref()
                        .and_then(|m| m.source.pricing())
                        .map(|_| {
                            PricedAs::UNKNOWN.map(|o| counter(unknown_model_counter(&p.name, o)))
                        }),
                }),
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
            settlements_delivered: counter("sluice.settlements_delivered".into()),
            settlements_dropped: counter("sluice.settlements_dropped".into()),
            settlements_rejected: counter("sluice.settlements_rejected".into()),
            overrides: (plan.global.as_ref())
                .and_then(|g| g.overrides.as_ref())
                .map(|_| OverrideCounters {
                    pull_failures: counter("sluice.overrides_pull_failures".into()),
                    age_seconds: metrics.define_gauge("sluice.overrides_age_seconds"),
                    held: metrics.define_gauge("sluice.overrides_held"),
                }),
            admin_writes: match plan.admin {
                Some(_) => counter("sluice.admin_writes".into()),
                None => Counter::default(),
            },
            admin_unauthorized: match plan.admin {
                Some(_) => counter("sluice.admin_unauthorized".into()),
                None => Counter::default(),
            },
        }
    }

    /// Counts a pull of the overrides that left them as they were.
    pub fn overrides_pull_failed(&self) {
        if let Some(overrides) = &self.overrides {
            overrides.pull_failures.add(1);
        }
    }

    /// Sets the gauges of the overrides held: how long ago they were pulled, and how many.
    pub fn overrides_held(&self, metrics: &impl Metrics, age_seconds: u64, held: u64) {
        let Some(overrides) = &self.overrides else {
            return;
        };
        for (id, value) in [(overrides.age_seconds, age_seconds), (overrides.held, held)] {
            if let Some(id) = id {
                metrics.set(id, value);
            }
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
        for entry in outcome.tab.iter().flat_map(|t| &t.entries) {
            self.slot_taken(entry.policy);
        }
        for &(policy, n) in &outcome.expired_slots {
            self.slots_ended(policy, SlotEnd::Expired, n);
        }
        self.cas_retries.add(u64::from(outcome.cas_retries));
        self.evictions.add(u64::from(outcome.evictions));
        self.forgiven.add(outcome.forgiven);
        self.cas_exhausted.add(u64::from(outcome.exhausted));
    }

    /// Counts settlements the outbox delivered and gave up.
    pub fn settlements(&self, counts: crate::remote::outbox::Counts) {
        self.settlements_delivered.add(counts.delivered);
        self.settlements_dropped.add(counts.dropped);
        self.settlements_rejected.add(counts.rejected);
    }

    fn tokens(&self, policy: usize) -> Option<&TokenCounters> {
        self.policies.get(policy)?.tokens.as_ref()
    }

    /// Counts a metered policy's response settled: `charged` in all, `refunded` of its
    /// reservation.
    pub fn tokens_settled(&self, policy: usize, charged: u64, refunded: u64) {
        if let Some(tokens) = self.tokens(policy) {
            tokens.charged.add(charged);
            tokens.refunded.add(refunded);
        }
    }

    /// Counts tokens a charge put past the limit: the debt a key ran up.
    pub fn tokens_owed(&self, policy: usize, owed: u64) {
        if let Some(tokens) = self.tokens(policy) {
            tokens.owed.add(owed);
        }
    }

    /// Moves the gauge of `policy`'s keys in debt `by`.
    pub fn keys_in_debt(&self, policy: usize, by: i64) {
        if let Some(tokens) = self.tokens(policy) {
            tokens.in_debt.add(by);
        }
    }

    /// Counts a response whose usage never came, for `why`, and the `charged` tokens
    /// `on_unknown` charged it (also counted with the rest by `tokens_settled`).
    pub fn usage_unknown(&self, policy: usize, why: UsageUnknown, charged: u64) {
        let Some(tokens) = self.tokens(policy) else {
            return;
        };
        if let Some(counter) = tokens.unknown.get(why as usize) {
            counter.add(1);
        }
        tokens.charged_unknown.add(charged);
    }

    /// Counts a request or response of a spend budget whose model no price lists, by what the
    /// policy did with it.
    pub fn unknown_model(&self, policy: usize, priced_as: PricedAs) {
        let counters = self.tokens(policy).and_then(|t| t.unknown_models.as_ref());
        let at = PricedAs::UNKNOWN.iter().position(|p| *p == priced_as);
        if let Some(counter) = at.and_then(|at| counters?.get(at)) {
            counter.add(1);
        }
    }

    fn slots(&self, policy: usize) -> Option<&SlotCounters> {
        self.policies.get(policy)?.slots.as_ref()
    }

    fn slot_taken(&self, policy: usize) {
        if let Some(slots) = self.slots(policy) {
            slots.in_use.add(1);
        }
    }

    /// Counts `n` slots of `policy` no longer in use, for `reason`: given back by requests of
    /// this Envoy (completed, reset: they leave its gauge), or found forgotten by a write
    /// (expired: anyone's, whose release never came).
    pub fn slots_ended(&self, policy: usize, reason: SlotEnd, n: u64) {
        let Some(slots) = self.slots(policy) else {
            return;
        };
        if let Some(counter) = slots.ended.get(reason as usize) {
            counter.add(n);
        }
        if matches!(reason, SlotEnd::Completed | SlotEnd::Reset) {
            slots.in_use.add(-i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// A slot a request of this Envoy held that lapsed before the request gave it back or could
    /// renew it: it leaves the gauge (its expiry is counted by the write that forgot it).
    pub fn slot_lost(&self, policy: usize) {
        if let Some(slots) = self.slots(policy) {
            slots.in_use.add(-1);
        }
    }

    /// Hands the counts gathered since the last flush to the host.
    pub fn flush(&self, metrics: &impl Metrics) {
        for slots in self.policies.iter().filter_map(|p| p.slots.as_ref()) {
            slots.in_use.flush(metrics);
            slots.ended.iter().for_each(|c| c.flush(metrics));
        }
        for tokens in self.policies.iter().filter_map(|p| p.tokens.as_ref()) {
            tokens.in_debt.flush(metrics);
            let counters = [
                &tokens.charged,
                &tokens.refunded,
                &tokens.owed,
                &tokens.charged_unknown,
            ];
            counters
                .into_iter()
                .chain(&tokens.unknown)
                .chain(tokens.unknown_models.iter().flatten())
                .for_each(|c| c.flush(metrics));
        }
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
                &self.settlements_delivered,
                &self.settlements_dropped,
                &self.settlements_rejected,
                &self.admin_writes,
                &self.admin_unauthorized,
            ])
            .chain(self.overrides.as_ref().map(|o| &o.pull_failures))
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
