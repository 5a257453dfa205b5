//! A key's override, for a local policy that has overrides: "default plus override", the
//! override winning over the policy's limit and its tiers'. It is looked up with one read of
//! shared data (`state::overrides::lookup`), only for the policies this worker's copy of the
//! index lists; any other policy pays nothing. The override runs on the key's own state, so the
//! usage so far carries over when it is set, changed, deleted or expires.

use crate::config::{Policy, Scope, Tier};
use crate::core::algorithm::{Algorithm, Drain, Rate, Slots, Window};
use crate::state::overrides::{lookup, Entry, View};
use crate::state::store::Store;

/// What a limiter looks overrides up with: this worker's copy of the index, and the store.
#[derive(Debug)]
pub struct Lookup<'a, S> {
    pub view: &'a View,
    pub store: &'a S,
    pub prefix: &'a str,
}

// By hand: a derive would ask `S: Copy`.
impl<S> Clone for Lookup<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for Lookup<'_, S> {}

impl<S: Store> Lookup<'_, S> {
    /// Whether `policy` may have an override (then a lookup costs one read).
    pub fn covers(&self, index: usize, policy: &Policy) -> bool {
        policy.scope == Scope::Local && self.view.pages(index).is_some()
    }

    /// The tier `key` runs at under `policy` at `now` (Unix ns): its override's, if it has a
    /// live one that fits the policy, else `tier`.
    pub fn tier(&self, index: usize, policy: &Policy, tier: Tier, key: u64, now: u64) -> Tier {
        let Some(pages) = self.view.pages(index) else {
            return tier;
        };
        let found = lookup(self.store, self.prefix, pages, key, now / 1_000_000);
        found
            .and_then(|entry| overridden(policy, &tier, &entry))
            .unwrap_or(tier)
    }
}

/// `tier` with the override's numbers, if the override is of the same algorithm and fits the
/// policy: its key's state (as many words for a sliding log) and its cost. A calendar window
/// keeps its calendar and takes the override's `requests`; a leaky bucket without a
/// `max_delay_ms` keeps its own; a concurrency limit keeps its lease.
pub fn overridden(policy: &Policy, tier: &Tier, entry: &Entry) -> Option<Tier> {
    if entry.kind != tier.algorithm.kind() {
        return None;
    }
    let per_nanos = entry.per_ms.checked_mul(1_000_000)?;
    let algorithm = match tier.algorithm {
        Algorithm::TokenBucket(_) => {
            Algorithm::TokenBucket(Rate::new(entry.requests, per_nanos, entry.burst).ok()?)
        }
        Algorithm::FixedWindow(Window {
            calendar: Some(calendar),
            ..
        }) => Algorithm::FixedWindow(Window::calendar(entry.requests, calendar).ok()?),
        Algorithm::FixedWindow(_) => {
            Algorithm::FixedWindow(Window::new(entry.requests, per_nanos).ok()?)
        }
        Algorithm::SlidingWindow(_) => {
            Algorithm::SlidingWindow(Window::new(entry.requests, per_nanos).ok()?)
        }
        Algorithm::SlidingLog(_) => {
            let log = Algorithm::SlidingLog(Window::new(entry.requests, per_nanos).ok()?);
            // Its state is a word per request: no more than the policy's words.
            if log.columns() > policy.words.len() {
                return None;
            }
            log
        }
        Algorithm::LeakyBucket(drain) => {
            let max_delay = match entry.max_delay_ms {
                Some(ms) => ms.checked_mul(1_000_000)?,
                None => drain.max_delay,
            };
            Algorithm::LeakyBucket(Drain::new(entry.requests, per_nanos, max_delay).ok()?)
        }
        Algorithm::Concurrency(slots) => {
            let lease = slots.epoch.get().saturating_mul(2);
            Algorithm::Concurrency(Slots::new(entry.requests, lease).ok()?)
        }
    };
    algorithm.check_cost(policy.cost.max(1)).ok()?;
    let per_nanos = match algorithm {
        Algorithm::FixedWindow(Window {
            calendar: Some(_), ..
        })
        | Algorithm::Concurrency(_) => tier.per_nanos,
        _ => per_nanos,
    };
    Some(Tier {
        algorithm,
        requests: entry.requests,
        per_nanos,
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use crate::core::algorithm::Kind;
    use serde_json::json;

    fn entry(kind: Kind, requests: u64, burst: u64) -> Entry {
        Entry {
            key: 1,
            expires_at_ms: None,
            kind,
            requests,
            per_ms: 60_000,
            burst,
            max_delay_ms: None,
        }
    }

    #[test]
    fn an_override_of_the_policys_algorithm_replaces_its_numbers() {
        let plan = plan_of(json!([per_user("api", 10, json!({"per": "1m"}))]));
        let policy = &plan.policies[0];
        let tier = overridden(policy, &policy.tier, &entry(Kind::TokenBucket, 100, 50)).unwrap();
        assert_eq!(tier.algorithm.capacity(), 50);
        assert_eq!((tier.requests, tier.per_nanos), (100, 60 * SEC));
    }

    #[test]
    fn an_override_of_another_algorithm_or_below_the_cost_is_left_alone() {
        let plan = plan_of(json!([
            per_user("api", 10, json!({})),
            per_user("costly", 10, json!({"cost": 5})),
            per_user("log", 4, json!({"algorithm": "sliding_log"})),
        ]));
        let [api, costly, log] = &plan.policies[..] else {
            panic!("three policies");
        };
        assert_eq!(
            overridden(api, &api.tier, &entry(Kind::FixedWindow, 100, 100)),
            None
        );
        assert_eq!(
            overridden(costly, &costly.tier, &entry(Kind::TokenBucket, 4, 4)),
            None
        );
        assert!(overridden(log, &log.tier, &entry(Kind::SlidingLog, 4, 4)).is_some());
        assert_eq!(
            overridden(log, &log.tier, &entry(Kind::SlidingLog, 5, 5)),
            None,
            "a longer log than the key's state holds"
        );
    }

    #[test]
    fn a_calendar_window_keeps_its_calendar() {
        let plan = plan_of(json!([per_user(
            "monthly",
            1000,
            json!({"algorithm": "fixed_window",
            "per": "1mo", "calendar": {"timezone": "Europe/Berlin"}})
        )]));
        let policy = &plan.policies[0];
        let tier = overridden(policy, &policy.tier, &entry(Kind::FixedWindow, 5000, 5000)).unwrap();
        let Algorithm::FixedWindow(window) = tier.algorithm else {
            panic!("a fixed window");
        };
        assert_eq!(window.limit, 5000);
        assert!(window.calendar.is_some());
        assert_eq!(tier.per_nanos, policy.tier.per_nanos);
    }
}
