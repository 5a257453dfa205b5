//! What a replay found, per policy and per tier: requests matched, allowed, denied, shadow-denied
//! and bypassed, counted from the limiter's outcome exactly as the filter's counters count them
//! (`Outcome::by_policy`); for a policy with a rollout, the same for the keys it enforces
//! for and the rest; the busiest second; the keys denied most; requests and denials over time;
//! for a token budget, what its settlements charged and refunded (`engine::TokenTally`); for a
//! concurrency limit, the most requests of a key it held in flight at once. Memory does not grow
//! with the log: counters, one `TopKeys` and one `Timeline` per policy and tier.

use crate::engine::{Decided, Engine, TokenTally};
use crate::log::Record;
use crate::timeline::{Counts, Timeline};
use sluice::config::{Plan, Policy};
use sluice::core::algorithm::Algorithm;
use sluice::core::duration::NANOS_PER_SEC;
use sluice::core::key::MISSING_KEY;
use sluice::core::request::Attributes;
use sluice::core::top_keys::TopKeys;
use sluice::limiter::PolicyOutcome;
use smallvec::SmallVec;

/// Skipped lines listed in the report; the rest are only counted.
pub const SKIPPED_LISTED: usize = 20;
/// What the tier of a request at the policy's own limit is called.
pub const OWN_LIMIT: &str = "(own limit)";

/// A replay's findings.
#[derive(Debug)]
pub struct Report {
    pub policies: Vec<PolicyReport>,
    /// Lines read, skipped ones included.
    pub lines: u64,
    pub skipped: u64,
    /// The first `SKIPPED_LISTED` skipped lines: number and reason.
    pub skipped_lines: Vec<(u64, String)>,
    /// Lines that came later than the reordering window allowed (see `order`).
    pub late: u64,
    /// Requests on routes that switch the filter off: passed undecided (they count in
    /// `requests`).
    pub filter_off: u64,
    /// Requests replayed, and those denied (a 429 from sluice).
    pub requests: u64,
    pub denied: u64,
    /// Requests admitted with something to give back at their end (a slot, a reservation)
    /// whose line has no `duration`: they ended when they started. `None` when no policy holds
    /// anything until a request's end.
    pub no_duration: Option<u64>,
    /// Whether top keys carry their values (`--show-keys`), not only their hashes.
    pub show_keys: bool,
    /// Whether some policy is a concurrency limit (its requests in flight are counted).
    in_flight: bool,
}

/// One policy's findings, overall and per tier.
#[derive(Debug)]
pub struct PolicyReport {
    pub name: String,
    pub all: Stats,
    /// For a policy with tiers: each tier's value (sorted), then `OWN_LIMIT`.
    pub tiers: Vec<(String, Stats)>,
    /// For a policy with a rollout.
    pub rollout: Option<RolloutReport>,
    pub timeline: Option<Timeline>,
    /// For a token budget: its settlements (`Report::settled`).
    pub tokens: Option<TokenTally>,
    /// For a concurrency limit: its requests in flight.
    pub slots: Option<SlotStats>,
}

/// A concurrency policy's requests in flight: the most of one key at once, over all keys and
/// for the keys where it was highest.
#[derive(Debug, Default)]
pub struct SlotStats {
    pub peak: u64,
    /// Keys by their peak (`TopKeys::raise`).
    pub top: TopKeys<KeyValue>,
}

#[derive(Debug, Default)]
pub struct Stats {
    pub tally: Tally,
    pub busiest: Busiest,
    pub top: TopKeys<KeyValue>,
}

/// A key's value (`--show-keys`) as a bypass entry's `key` takes it: one string per key part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyValue {
    Parts(Vec<String>),
    /// The one bucket of the requests that have no value for the key (`missing_key`).
    Missing,
}

impl std::fmt::Display for KeyValue {
    /// The parts as a JSON list, as a bypass entry writes them.
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            KeyValue::Parts(parts) => {
                let list = serde_json::to_string(parts).map_err(|_| std::fmt::Error)?;
                f.write_str(&list)
            }
            KeyValue::Missing => f.write_str("(missing key: one bucket for all)"),
        }
    }
}

/// Requests by what the policy did with them. `matched` counts every request the policy applied
/// to (or a bypass exempted from it); one it allowed but another policy denied counts in
/// `matched` only, as in the filter's counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub matched: u64,
    pub allowed: u64,
    pub denied: u64,
    pub shadow_denied: u64,
    /// Would-be denials of keys outside a rollout's enforced share.
    pub canary_shadow_denied: u64,
    pub bypassed: u64,
}

impl Tally {
    fn add(&mut self, what: PolicyOutcome) {
        *match what {
            PolicyOutcome::Allowed => &mut self.allowed,
            PolicyOutcome::Denied => &mut self.denied,
            PolicyOutcome::ShadowDenied => &mut self.shadow_denied,
            PolicyOutcome::CanaryShadowDenied => &mut self.canary_shadow_denied,
            PolicyOutcome::Bypassed => &mut self.bypassed,
        } += 1;
    }

    /// The share of matched requests denied, or that would have been were the policy enforced
    /// for every key (a shadow policy, a key outside a rollout).
    pub fn denied_share(&self) -> f64 {
        let denied = self.denied + self.shadow_denied + self.canary_shadow_denied;
        if self.matched == 0 {
            0.0
        } else {
            denied as f64 / self.matched as f64
        }
    }
}

/// A rollout's two groups of requests: those whose key it enforces for, and the rest, for which
/// it runs in shadow.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct RolloutReport {
    pub enforce_percent: f64,
    pub enforced: Group,
    pub shadowed: Group,
}

/// One group's requests: matched, let through, and denied (for the shadowed group: that would
/// have been).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    pub matched: u64,
    pub allowed: u64,
    pub denied: u64,
}

impl RolloutReport {
    fn group(&mut self, enforced: bool) -> &mut Group {
        if enforced {
            &mut self.enforced
        } else {
            &mut self.shadowed
        }
    }

    fn add(&mut self, enforced: bool, what: PolicyOutcome) {
        let group = self.group(enforced);
        match what {
            PolicyOutcome::Allowed => group.allowed += 1,
            PolicyOutcome::Denied | PolicyOutcome::CanaryShadowDenied => group.denied += 1,
            _ => {}
        }
    }
}

/// The second with the most matched requests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Busiest {
    current: (u64, u64),
    /// The second (Unix seconds) and its requests.
    pub best: (u64, u64),
}

impl Busiest {
    fn add(&mut self, now: u64) {
        let second = now / NANOS_PER_SEC;
        if self.current.0 == second {
            self.current.1 += 1;
        } else {
            self.current = (second, 1);
        }
        if self.current.1 > self.best.1 {
            self.best = self.current;
        }
    }
}

impl Report {
    pub fn new(plan: &Plan, show_keys: bool) -> Report {
        let policies = plan.policies.iter().map(policy_report).collect();
        let holds = |p: &Policy| p.holds_slots() || p.metered.is_some();
        Report {
            policies,
            lines: 0,
            skipped: 0,
            skipped_lines: Vec::new(),
            late: 0,
            filter_off: 0,
            requests: 0,
            denied: 0,
            no_duration: plan.policies.iter().any(holds).then_some(0),
            show_keys,
            in_flight: plan.policies.iter().any(Policy::holds_slots),
        }
    }

    /// Takes what `engine` (the configuration's) settled, once its requests in flight ended.
    pub fn settled(&mut self, engine: &Engine) {
        for (report, tally) in self.policies.iter_mut().zip(&engine.tokens) {
            if report.tokens.is_some() {
                report.tokens = Some(*tally);
            }
        }
        if self.no_duration.is_some() {
            self.no_duration = Some(engine.no_duration);
        }
    }

    /// Counts a line that could not be replayed.
    pub fn skip(&mut self, line: u64, reason: String) {
        self.skipped += 1;
        if self.skipped_lines.len() < SKIPPED_LISTED {
            self.skipped_lines.push((line, reason));
        }
    }

    /// Counts one replayed request.
    pub fn add(&mut self, plan: &Plan, record: &Record, decided: &Decided) {
        self.requests += 1;
        self.denied += u64::from(decided.outcome.is_denied());
        let tiers = self.add_matched(plan, record, decided);
        self.add_counts(plan, record, decided, &tiers);
    }

    /// Whether some policy is a concurrency limit, whose requests in flight `add_in_flight`
    /// counts.
    pub fn counts_in_flight(&self) -> bool {
        self.in_flight
    }

    /// The requests of its key each concurrency policy that admitted the request holds in
    /// flight, this one included.
    pub fn add_in_flight(&mut self, plan: &Plan, record: &Record, decided: &Decided) {
        if decided.outcome.is_denied() {
            return;
        }
        let show_keys = self.show_keys;
        for a in decided
            .outcome
            .applied
            .iter()
            .filter(|a| a.decision.allowed)
        {
            let Algorithm::Concurrency(slots) = a.tier.algorithm else {
                continue;
            };
            let stats = self
                .policies
                .get_mut(a.policy)
                .and_then(|p| p.slots.as_mut());
            let (Some(stats), Some(key)) = (stats, a.key) else {
                continue;
            };
            let in_flight = slots.limit.saturating_sub(a.decision.remaining);
            stats.peak = stats.peak.max(in_flight);
            let value = || show_keys.then(|| key_value(plan, a.policy, key, record));
            stats.top.raise(key, in_flight, value);
        }
    }

    /// Counts the request for each policy it matched (applied, or a bypass exempted it from):
    /// returns the tier it ran at, per policy.
    fn add_matched(&mut self, plan: &Plan, record: &Record, decided: &Decided) -> RequestTiers {
        let outcome = &decided.outcome;
        let mut attributes = Attributes::new(record, &plan.attrs);
        let mut tiers = RequestTiers::new();
        let bypassed = outcome.bypassed.iter().filter_map(|&b| plan.bypass.get(b));
        let applied = outcome.applied.iter().map(|a| (a.policy, Some(a.enforced)));
        for (policy, enforced) in applied.chain(bypassed.map(|b| (b.policy, None))) {
            let (Some(p), Some(report)) =
                (plan.policies.get(policy), self.policies.get_mut(policy))
            else {
                continue;
            };
            let tier = tier_of(p, report, &mut attributes);
            tiers.push((policy, tier));
            report.each_stats(tier, |stats| {
                stats.tally.matched += 1;
                stats.busiest.add(decided.now);
            });
            if let (Some(rollout), Some(enforced)) = (&mut report.rollout, enforced) {
                rollout.group(enforced).matched += 1;
            }
            let timeline = report
                .timeline
                .get_or_insert_with(|| Timeline::new(decided.now));
            let request = Counts {
                requests: 1,
                ..Counts::default()
            };
            timeline.add(decided.now, request);
        }
        tiers
    }

    /// Counts what each policy did with the request, as the filter's counters count it.
    fn add_counts(
        &mut self,
        plan: &Plan,
        record: &Record,
        decided: &Decided,
        tiers: &RequestTiers,
    ) {
        let outcome = &decided.outcome;
        let show_keys = self.show_keys;
        for (policy, key, what) in outcome.by_policy(plan) {
            let tier = tiers
                .iter()
                .find(|(p, _)| *p == policy)
                .and_then(|(_, t)| *t);
            let Some(report) = self.policies.get_mut(policy) else {
                continue;
            };
            let denial = matches!(
                what,
                PolicyOutcome::Denied
                    | PolicyOutcome::ShadowDenied
                    | PolicyOutcome::CanaryShadowDenied
            );
            report.each_stats(tier, |stats| {
                stats.tally.add(what);
                // Always named: the engine hashes under one secret.
                if let (true, Some(key)) = (denial, key) {
                    let value = || show_keys.then(|| key_value(plan, policy, key, record));
                    stats.top.add(key, value);
                }
            });
            let applied = outcome.applied.iter().find(|a| a.policy == policy);
            if let (Some(rollout), Some(a)) = (&mut report.rollout, applied) {
                rollout.add(a.enforced, what);
            }
            let counts = match what {
                PolicyOutcome::Denied => Counts {
                    denied: 1,
                    ..Counts::default()
                },
                PolicyOutcome::ShadowDenied | PolicyOutcome::CanaryShadowDenied => Counts {
                    shadow_denied: 1,
                    ..Counts::default()
                },
                _ => continue,
            };
            if let Some(timeline) = &mut report.timeline {
                timeline.add(decided.now, counts);
            }
        }
    }
}

/// The tier each policy a request matched ran it at (`None`: the policy has no tiers).
type RequestTiers = SmallVec<[(usize, Option<usize>); 4]>;

impl PolicyReport {
    /// Runs `update` on the policy's overall stats and those of the request's tier.
    fn each_stats(&mut self, tier: Option<usize>, mut update: impl FnMut(&mut Stats)) {
        update(&mut self.all);
        if let Some((_, stats)) = tier.and_then(|t| self.tiers.get_mut(t)) {
            update(stats);
        }
    }
}

fn policy_report(policy: &Policy) -> PolicyReport {
    let mut tiers: Vec<(String, Stats)> = policy
        .tiers
        .iter()
        .flat_map(|t| t.values.keys())
        .map(|value| {
            (
                String::from_utf8_lossy(value).into_owned(),
                Stats::default(),
            )
        })
        .collect();
    tiers.sort_by(|a, b| a.0.cmp(&b.0));
    if !tiers.is_empty() {
        tiers.push((OWN_LIMIT.into(), Stats::default()));
    }
    let rollout = policy.rollout.map(|r| RolloutReport {
        enforce_percent: f64::from(r.enforce_per_million) / 10_000.0,
        ..RolloutReport::default()
    });
    PolicyReport {
        name: policy.name.clone(),
        all: Stats::default(),
        tiers,
        rollout,
        timeline: None,
        tokens: policy.metered.is_some().then(TokenTally::default),
        slots: policy.holds_slots().then(SlotStats::default),
    }
}

/// The index of the request's tier in the report: the tier its tier key names, else the
/// policy's own limit (the last); `None` for a policy without tiers.
fn tier_of(
    policy: &Policy,
    report: &PolicyReport,
    request: &mut Attributes<Record>,
) -> Option<usize> {
    let tiers = policy.tiers.as_ref()?;
    let value = tiers.by.resolve(request).map(|(_, value)| value);
    let named = value
        .filter(|v| tiers.values.contains_key(*v))
        .and_then(|v| {
            report
                .tiers
                .iter()
                .position(|(name, _)| name.as_bytes() == v)
        });
    named.or(report.tiers.len().checked_sub(1))
}

/// The key's value as a bypass entry would name it.
pub(crate) fn key_value(plan: &Plan, policy: usize, key: u64, record: &Record) -> KeyValue {
    let parts = plan
        .policies
        .get(policy)
        .and_then(|p| plan.tables.get(p.table))
        .map(|t| t.key.as_slice())
        .unwrap_or_default();
    if key == MISSING_KEY {
        return KeyValue::Missing;
    }
    let mut request = Attributes::new(record, &plan.attrs);
    let values: Vec<String> = parts
        .iter()
        .map(|part| {
            let value = part
                .resolve(&mut request)
                .map(|(_, v)| v)
                .unwrap_or_default();
            String::from_utf8_lossy(value).into_owned()
        })
        .collect();
    KeyValue::Parts(values)
}
