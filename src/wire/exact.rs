//! sluice-service's decisions without the service: every key's state in one map, decided by the
//! filter's own algorithms, answered in the service's units. The service's Lua scripts compute
//! the same in Redis (its tests check them against these algorithms); this stands in for it in
//! the filter's tests and in `sluice-replay`, where one exact global store is wanted.

use crate::core::algorithm::{concurrency, Algorithm, Debt, Decision};
use crate::wire::protocol::{Check, CheckResult};
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

impl State {
    /// The words for `limit`: afresh if another algorithm (or other numbers of its words) wrote
    /// them; a sliding log grows to hold the entries it may owe. A bucket whose rate changed
    /// keeps its usage (`token_bucket::carry`); a window's count is kept as it is.
    fn fit(&mut self, limit: Algorithm, max_debt: u64, now: u64) -> &mut Vec<u64> {
        let needed = limit.columns_owing(max_debt);
        let log = matches!(limit, Algorithm::SlidingLog(_));
        if self.limit.kind() != limit.kind() || (!log && self.words.len() != needed) {
            self.words = vec![0; needed];
        } else if self.words.len() < needed {
            self.words.resize(needed, 0);
        }
        if let (Algorithm::TokenBucket(from), Algorithm::TokenBucket(to), [tat]) =
            (self.limit, limit, self.words.as_mut_slice())
        {
            if from != to {
                *tat = crate::core::algorithm::token_bucket::carry(*tat, now, &from, &to);
            }
        }
        self.limit = limit;
        &mut self.words
    }
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
        self.decide_owing(key, limit, now, (cost, take), 0)
    }

    /// As `decide`, and a request refused is charged anyway, the key owing at most `max_debt`
    /// tokens past its limit (`Algorithm::owe`): then the decision is the refusal as the state
    /// stands after the charge, with the tokens charged.
    pub fn decide_owing(
        &mut self,
        key: &str,
        limit: Algorithm,
        now: u64,
        (cost, take): (u64, u64),
        max_debt: u64,
    ) -> (Decision, u64) {
        if !self.keys.contains_key(key) {
            let fresh = State {
                limit,
                words: Vec::new(),
            };
            self.keys.insert(key.to_string(), fresh);
        }
        let Some(state) = self.keys.get_mut(key) else {
            return (Decision::default(), 0);
        };
        let words = state.fit(limit, max_debt, now);
        let (decision, granted) = if take < cost {
            admit_taking_less(limit, words, now, cost, take)
        } else {
            limit.grant(words, now, cost, take)
        };
        if decision.allowed || max_debt == 0 || cost == 0 {
            return (decision, granted);
        }
        match limit.owe(words, now, cost, max_debt) {
            0 => (decision, 0),
            charged => (limit.admit(&mut words.clone(), now, cost), charged),
        }
    }

    /// Gives back `tokens` of `key` taken at `taken_at` and not used, as far as its state still
    /// counts them (`Algorithm::refund`); 0 when the key holds no state of `limit`.
    pub fn refund(
        &mut self,
        key: &str,
        limit: Algorithm,
        now: u64,
        tokens: u64,
        taken_at: u64,
    ) -> u64 {
        match self.keys.get_mut(key) {
            Some(state) if state.limit == limit => {
                limit.refund(&mut state.words, now, tokens, taken_at)
            }
            _ => 0,
        }
    }

    /// Gives back the slot of `key` taken (or last renewed) at `taken_at` under the concurrency
    /// `limit`: the service's release of a named slot, here counted in `limit`'s epochs as the
    /// filter counts its own. False when it had expired, or the key holds no state of `limit`.
    pub fn release_slot(&mut self, key: &str, limit: Algorithm, now: u64, taken_at: u64) -> bool {
        match (self.keys.get_mut(key), limit) {
            (Some(state), Algorithm::Concurrency(slots)) if state.limit == limit => {
                let taken = concurrency::taken(&slots, &state.words, taken_at);
                concurrency::release(&slots, &mut state.words, now, taken)
            }
            _ => false,
        }
    }

    /// Renews that slot: counted from `now` on, as the service starts its lease again. False
    /// when it had expired and none was free to take again.
    pub fn renew_slot(&mut self, key: &str, limit: Algorithm, now: u64, taken_at: u64) -> bool {
        match (self.keys.get_mut(key), limit) {
            (Some(state), Algorithm::Concurrency(slots)) if state.limit == limit => {
                let taken = concurrency::taken(&slots, &state.words, taken_at);
                concurrency::renew(&slots, &mut state.words, now, taken).is_some()
            }
            _ => false,
        }
    }

    /// Forgets the keys whose state owes nothing at `now`: nothing is lost, and memory holds
    /// only keys still being limited.
    pub fn forget_idle(&mut self, now: u64) {
        self.keys
            .retain(|_, state| state.limit.debt(&state.words, now) != Debt::default());
    }

    /// `key`'s words, if it has a state.
    pub fn words(&self, key: &str) -> Option<&[u64]> {
        self.keys.get(key).map(|state| state.words.as_slice())
    }

    /// Forgets `key`'s state: its next check finds a full bucket, an empty window. Whether it
    /// had any.
    pub fn forget(&mut self, key: &str) -> bool {
        self.keys.remove(key).is_some()
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// A check whose `take` is below its `cost` (a reservation of less than it needs, 0: of
/// nothing): admitted if `cost` fits, and then `take` taken, as the service's scripts do.
fn admit_taking_less(
    limit: Algorithm,
    words: &mut [u64],
    now: u64,
    cost: u64,
    take: u64,
) -> (Decision, u64) {
    let fits = limit.admit(&mut words.to_vec(), now, cost);
    if !fits.allowed {
        return (fits, 0);
    }
    (limit.admit(words, now, take), take)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::algorithm::Kind;

    const T0: u64 = 1_800_000_000 * 1_000_000_000;

    fn check(algorithm: Kind, take: u64) -> Check {
        Check {
            calendar: None,
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
    fn a_key_whose_limit_is_raised_keeps_its_usage_so_far() {
        use crate::core::algorithm::{Rate, Window};
        let hour = 3_600_000_000_000;
        let mut store = ExactStore::default();
        let limits = [
            (
                Algorithm::TokenBucket(Rate::new(1000, hour, 1000).unwrap()),
                Algorithm::TokenBucket(Rate::new(2000, hour, 2000).unwrap()),
            ),
            (
                Algorithm::FixedWindow(Window::new(1000, hour).unwrap()),
                Algorithm::FixedWindow(Window::new(2000, hour).unwrap()),
            ),
            (
                Algorithm::SlidingWindow(Window::new(1000, hour).unwrap()),
                Algorithm::SlidingWindow(Window::new(2000, hour).unwrap()),
            ),
        ];
        for (before, raised) in limits {
            let key = format!("{:?}", before.kind());
            // 1,500 used of 1,000: 1,000 admitted, 500 more charged as debt.
            assert!(store.decide(&key, before, T0, 1000, 1000).0.allowed);
            assert_eq!(store.decide_owing(&key, before, T0, (500, 500), 500).1, 500);
            let (shown, _) = store.decide(&key, raised, T0, 0, 0);
            assert_eq!(shown.remaining, 500, "{before:?} raised to {raised:?}");
            assert!(store.decide(&key, raised, T0, 500, 500).0.allowed);
            assert!(!store.decide(&key, raised, T0, 1, 1).0.allowed);
        }
    }

    #[test]
    fn a_slot_given_back_or_renewed_frees_or_keeps_its_place() {
        let mut store = ExactStore::default();
        let mut slots = check(Kind::Concurrency, 1);
        (slots.requests, slots.per_ms, slots.burst) = (1, 10_000, 1);
        let limit = slots.limit().unwrap();
        let key = slots.key.clone();
        assert!(store.check(&slots, T0).unwrap().allowed);
        assert!(!store.check(&slots, T0).unwrap().allowed, "one in flight");
        let sec = 1_000_000_000;
        assert!(store.renew_slot(&key, limit, T0 + 6 * sec, T0));
        assert!(
            !store.check(&slots, T0 + 12 * sec).unwrap().allowed,
            "renewed"
        );
        assert!(store.release_slot(&key, limit, T0 + 12 * sec, T0 + 6 * sec));
        assert!(store.check(&slots, T0 + 12 * sec).unwrap().allowed);
        assert!(
            !store.release_slot(&key, limit, T0 + 60 * sec, T0 + 12 * sec),
            "expired"
        );
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
    fn a_take_below_the_cost_admits_if_the_cost_fits_and_takes_only_the_take() {
        let mut store = ExactStore::default();
        let peek = Check {
            cost: 4,
            ..check(Kind::FixedWindow, 0)
        };
        let asked = store.check(&peek, T0).unwrap();
        assert_eq!(
            (asked.allowed, asked.granted, asked.remaining),
            (true, 0, 10)
        );
        store.check(&check(Kind::FixedWindow, 7), T0).unwrap();
        let short = store.check(&peek, T0).unwrap();
        assert_eq!(
            (short.allowed, short.granted),
            (false, 0),
            "3 left, 4 needed"
        );
    }

    #[test]
    fn a_refund_gives_back_what_the_window_that_took_it_still_counts() {
        let mut store = ExactStore::default();
        let reserved = check(Kind::FixedWindow, 10);
        store.check(&reserved, T0).unwrap();
        let limit = reserved.limit().unwrap();
        let key = &reserved.key;
        assert_eq!(store.refund(key, limit, T0, 4, T0), 4);
        assert_eq!(store.check(&reserved, T0).unwrap().granted, 4);
        let next_window = T0 + 1_000_000_000;
        assert_eq!(
            store.refund(key, limit, next_window, 4, T0),
            0,
            "that window is over"
        );
        assert_eq!(
            store.refund("other", limit, T0, 4, T0),
            0,
            "no state, nothing to give"
        );
    }

    #[test]
    fn a_key_decided_by_another_algorithm_starts_afresh() {
        let mut store = ExactStore::default();
        store.check(&check(Kind::TokenBucket, 10), T0).unwrap();
        let window = store.check(&check(Kind::FixedWindow, 1), T0).unwrap();
        assert_eq!((window.allowed, window.remaining), (true, 9));
    }

    #[test]
    fn a_refused_check_is_charged_up_to_the_debt_and_answered_refused() {
        let mut store = ExactStore::default();
        let window =
            Algorithm::FixedWindow(crate::core::algorithm::Window::new(10, 1_000).unwrap());
        let (first, _) = store.decide_owing("k", window, 5_000, (8, 8), 10);
        assert!(first.allowed);
        let (refused, charged) = store.decide_owing("k", window, 5_000, (5, 5), 10);
        assert_eq!((refused.allowed, refused.remaining, charged), (false, 0, 5));
        let (asking, charged) = store.decide_owing("k", window, 5_000, (0, 0), 10);
        assert_eq!((asking.allowed, charged), (false, 0), "13 of 10: over");
        let log = Algorithm::SlidingLog(crate::core::algorithm::Window::new(2, 1_000).unwrap());
        store.decide("l", log, 5_000, 2, 2);
        let (_, charged) = store.decide_owing("l", log, 5_000, (3, 3), 2);
        assert_eq!(charged, 2, "the log grows to hold what it owes");
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
