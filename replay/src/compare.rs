//! `--compare`: the same log through two configurations, side by side. A request changes outcome
//! when one configuration denies it (a 429) and the other does not; the change is counted under
//! the policy that denies it (in the other configuration for a request no longer denied), with
//! the first few requests of each policy as examples.

use crate::engine::Decided;
use crate::log::Record;
use crate::report::{key_value, KeyValue};
use sluice::config::Plan;
use sluice::limiter::Applied;
use std::collections::BTreeMap;

/// Examples kept per policy.
pub const EXAMPLES: usize = 5;

#[derive(Debug, Default)]
pub struct Comparison {
    pub requests: u64,
    pub changed: u64,
    /// By the name of the policy that denies.
    pub policies: BTreeMap<String, Changes>,
}

#[derive(Debug, Default)]
pub struct Changes {
    /// Allowed by the configuration, denied by the other one.
    pub newly_denied: u64,
    /// Denied by the configuration, allowed by the other one.
    pub newly_allowed: u64,
    pub examples: Vec<Example>,
}

/// A request that changed outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    pub line: u64,
    pub time: u64,
    pub method: String,
    pub path: String,
    /// The key's hash, 16 hex digits (empty for a denial of a contended store, which names no
    /// key), and its value with `--show-keys`.
    pub key: String,
    pub value: Option<KeyValue>,
    /// Denied by the other configuration (else: no longer denied).
    pub now_denied: bool,
}

impl Comparison {
    /// Compares one request's outcomes: `before` under the configuration, `after` under the other.
    pub fn add(
        &mut self,
        record: &Record,
        before: (&Plan, &Decided),
        after: (&Plan, &Decided),
        show_keys: bool,
    ) {
        self.requests += 1;
        let (now_denied, (plan, denier)) = match (denial(before), denial(after)) {
            (None, Some(denied)) => (true, denied),
            (Some(denied), None) => (false, denied),
            _ => return,
        };
        self.changed += 1;
        let name = denier
            .and_then(|a| plan.policies.get(a.policy))
            .map_or_else(|| "(contended store)".to_string(), |p| p.name.clone());
        let changes = self.policies.entry(name).or_default();
        if now_denied {
            changes.newly_denied += 1;
        } else {
            changes.newly_allowed += 1;
        }
        if changes.examples.len() < EXAMPLES {
            // Always named: the engine hashes under one secret.
            let key = denier.and_then(|a| Some((a.policy, a.key?)));
            let value = key
                .filter(|_| show_keys)
                .map(|(policy, key)| key_value(plan, policy, key, record));
            let key = key.map_or_else(String::new, |(_, key)| format!("{key:016x}"));
            changes
                .examples
                .push(example(record, key, value, now_denied));
        }
    }
}

/// The plan of a denied request, and the policy that denied it (a contended store denies with
/// none).
fn denial<'p>((plan, decided): (&'p Plan, &Decided)) -> Option<(&'p Plan, Option<Applied>)> {
    let outcome = &decided.outcome;
    let denier = outcome
        .denied_by
        .or_else(|| outcome.applied.first().copied());
    outcome.is_denied().then_some((plan, denier))
}

fn example(record: &Record, key: String, value: Option<KeyValue>, now_denied: bool) -> Example {
    use sluice::core::request::RequestSource;
    let text =
        |name| String::from_utf8_lossy(&record.header(name).unwrap_or_default()).into_owned();
    Example {
        line: record.line,
        time: record.time,
        method: text(":method"),
        path: text(":path"),
        key,
        value,
        now_denied,
    }
}
