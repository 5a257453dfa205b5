//! sluice-service's decisions without the service: every key's state in one map, decided by the
//! filter's own algorithms, answered in the service's units. The service's Lua scripts compute
//! the same in Redis (its tests check them against these algorithms); this stands in for it in
//! the filter's tests and in `sluice-replay`, where one exact global store is wanted.

use crate::algorithm::{Algorithm, Debt, Decision};
use crate::protocol::{Check, CheckResult};
use std::collections::HashMap;

/// Every key's state, by check key.
#[derive(Debug, Default)]
pub struct ExactStore {
    keys: HashMap<String, State>,
}

/// A key's words, and the limit they were last decided by.
#[derive(Debug)]
struct State {
    limit: Algorithm,
    words: Vec<u64>,
}

impl ExactStore {
    /// Decides one check at `now` (Unix nanoseconds), granting up to its `take`, as the service
    /// does; `None` when its numbers make no limit (the service refuses such a check). A key
    /// last decided by another algorithm starts afresh, as in the service.
    pub fn check(&mut self, check: &Check, now: u64) -> Option<CheckResult> {
        let limit = check.limit()?;
        let (decision, granted) = self.decide(&check.key, limit, now, check.cost, check.take());
        let ms = |nanos: u64| nanos.div_ceil(1_000_000);
        Some(CheckResult {
            allowed: decision.allowed,
            granted,
            remaining: decision.remaining,
            reset_ms: ms(decision.reset_after),
            retry_after_ms: ms(decision.retry_after),
            delay_ms: matches!(limit, Algorithm::LeakyBucket(_)).then(|| ms(decision.delay)),
        })
    }

    /// Grants `key` between `cost` and `take` tokens of `limit` at `now`, in whatever unit the
    /// limit and `now` share.
    pub fn decide(
        &mut self,
        key: &str,
        limit: Algorithm,
        now: u64,
        cost: u64,
        take: u64,
    ) -> (Decision, u64) {
        let state = match self.keys.get_mut(key) {
            Some(state) => state,
            None => self.keys.entry(key.to_string()).or_insert(State {
                limit,
                words: Vec::new(),
            }),
        };
        if state.limit.kind() != limit.kind() || state.words.len() != limit.columns() {
            state.words = vec![0; limit.columns()];
        }
        state.limit = limit;
        limit.grant(&mut state.words, now, cost, take)
    }

    /// Forgets the keys whose state owes nothing at `now`: nothing is lost, and memory holds
    /// only keys still being limited.
    pub fn forget_idle(&mut self, now: u64) {
        self.keys
            .retain(|_, state| state.limit.debt(&state.words, now) != Debt::default());
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Kind;

    const T0: u64 = 1_800_000_000 * 1_000_000_000;

    fn check(algorithm: Kind, take: u64) -> Check {
        Check {
            key: "per-user/00000000000000ff".into(),
            algorithm,
            requests: 10,
            per_ms: 1_000,
            burst: 10,
            cost: 1,
            take: Some(take),
            max_delay_ms: None,
            slot: None,
            entries: Vec::new(),
        }
    }

    #[test]
    fn a_check_is_granted_up_to_its_take_then_what_is_left() {
        let mut store = ExactStore::default();
        let granted: Vec<u64> = (0..4)
            .map(|_| {
                store
                    .check(&check(Kind::TokenBucket, 4), T0)
                    .unwrap()
                    .granted
            })
            .collect();
        assert_eq!(granted, [4, 4, 2, 0]);
        let denied = store.check(&check(Kind::TokenBucket, 4), T0).unwrap();
        assert_eq!((denied.allowed, denied.retry_after_ms), (false, 100));
    }

    #[test]
    fn a_key_decided_by_another_algorithm_starts_afresh() {
        let mut store = ExactStore::default();
        store.check(&check(Kind::TokenBucket, 10), T0).unwrap();
        let window = store.check(&check(Kind::FixedWindow, 1), T0).unwrap();
        assert_eq!((window.allowed, window.remaining), (true, 9));
    }

    #[test]
    fn idle_keys_are_forgotten_and_limited_ones_kept() {
        let mut store = ExactStore::default();
        store.check(&check(Kind::TokenBucket, 1), T0).unwrap();
        store.forget_idle(T0);
        assert_eq!(store.len(), 1, "one token short of full");
        store.forget_idle(T0 + 100_000_000);
        assert!(store.is_empty(), "full again after 100 ms");
    }
}
