//! Settling a tab's entries (`tab`) against this Envoy's shared data: the entry's words of its
//! key's slot, read and written with compare-and-swap as a decision's are, read again after a
//! lost race. A key whose state the table forgot meanwhile has nothing left to give back, but is
//! still charged what its response used.

use super::{Basis, Limiter, MAX_ATTEMPTS};
use crate::config::{Tier, GLOBAL_COLUMNS};
use crate::core::algorithm::{concurrency, Algorithm};
use crate::limiter::tab::{Entry, Held, Op};
use crate::state::store::{Store, StoreError};
use crate::state::table;

/// What settling an entry came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Done: `amount` is the tokens charged or refunded, 1 for a slot released or renewed;
    /// `past_limit`, the tokens of a charge beyond what the key had left (the debt it ran up);
    /// `into_debt`, whether this charge is the one that put the key in debt (it owed nothing
    /// before); `expired`, the slots of others the write found forgotten (`concurrency::expired`).
    Done {
        amount: u64,
        past_limit: u64,
        into_debt: bool,
        expired: u64,
    },
    /// Nothing left to settle: the slot had expired, or the key's state was forgotten.
    Gone,
    /// The slot stayed contended, or the store failed, through every attempt.
    Failed,
}

impl<S: Store> Limiter<'_, S> {
    /// Applies `op` to the entry's state at `now`. A renewal moves the entry's slot to the epoch
    /// it is counted in from now on.
    pub fn settle(&mut self, entry: &mut Entry, op: Op, now: u64) -> Settled {
        let Some(policy) = self.plan.policies.get(entry.policy) else {
            return Settled::Gone;
        };
        let algorithm = entry.tier.algorithm;
        let start = policy.words.start
            + match entry.basis {
                Basis::Emergency => GLOBAL_COLUMNS,
                _ => 0,
            };
        let words = start..start + algorithm.columns();
        for _ in 0..MAX_ATTEMPTS {
            let Some(slot) = self.find(entry.table, entry.hash, now) else {
                return Settled::Gone;
            };
            // A key without a record has nothing to give back; but a charge is owed whatever
            // the table holds (a reservation of 0 left no record to find).
            if slot.takeover.is_some() && !matches!(op, Op::Charge(_)) {
                return Settled::Gone;
            }
            let now = slot.time(now);
            let mut next = slot.state.clone();
            let Some(state) = next.get_mut(words.clone()) else {
                return Settled::Gone;
            };
            let max_debt = policy
                .metered
                .as_ref()
                .map_or(0, |m| m.max_debt(&entry.tier));
            let left = left(&algorithm, state, now);
            let (done, held) = apply(&algorithm, state, now, entry.held, (op, max_debt));
            let Some(amount) = done else {
                return Settled::Gone;
            };
            let past_limit = match op {
                Op::Charge(_) => left.map_or(amount, |left| amount.saturating_sub(left)),
                _ => 0,
            };
            let free_at = slot.free_at(now).max(algorithm.idle_at(state, now));
            let expired = slot
                .state
                .get(words.clone())
                .map_or(0, |read| expired(&algorithm, read, now));
            let settled = Settled::Done {
                amount,
                past_limit,
                into_debt: past_limit > 0 && left.is_some(),
                expired,
            };
            if next == slot.state {
                entry.held = held;
                return settled;
            }
            match table::write(self.store, &slot, &next, now, free_at) {
                Ok(_) => {
                    entry.held = held;
                    return settled;
                }
                Err(StoreError::CasMismatch) => continue,
                Err(_) => return Settled::Failed,
            }
        }
        Settled::Failed
    }
}

impl<S: Store> Limiter<'_, S> {
    /// Whether the key `hash` owes `policy` tokens at `now`, under `tier`: responses were charged
    /// past its limit (`Settled::Done::past_limit`) and refill has not made up for it yet. A
    /// refusal then is for that debt, not for the reservations in flight.
    pub fn owes(&self, policy: usize, hash: u64, tier: &Tier, now: u64) -> bool {
        let Some(policy) = self.plan.policies.get(policy) else {
            return false;
        };
        let Some(slot) = self.find(policy.table, hash, now) else {
            return false;
        };
        let start = policy.words.start;
        let Some(words) = slot.state.get(start..start + tier.algorithm.columns()) else {
            return false;
        };
        let mut probe: crate::state::table::Words = words.iter().copied().collect();
        !tier.algorithm.admit(&mut probe, slot.time(now), 0).allowed
    }
}

/// Whole tokens left in a state at `now`; `None` for one that owes.
fn left(algorithm: &Algorithm, state: &[u64], now: u64) -> Option<u64> {
    let mut probe: crate::state::table::Words = state.iter().copied().collect();
    let decision = algorithm.admit(&mut probe, now, 0);
    decision.allowed.then_some(decision.remaining)
}

/// Slots a state as read counts that are forgotten at `now` (a concurrency policy's).
pub(super) fn expired(algorithm: &Algorithm, read: &[u64], now: u64) -> u64 {
    match algorithm {
        Algorithm::Concurrency(slots) => concurrency::expired(slots, read, now),
        _ => 0,
    }
}

/// `op` on one entry's words (a charge owing at most `max_debt` past the limit): what it did
/// (`None`: nothing to settle), and what the entry holds afterwards.
fn apply(
    algorithm: &Algorithm,
    state: &mut [u64],
    now: u64,
    held: Held,
    (op, max_debt): (Op, u64),
) -> (Option<u64>, Held) {
    match (algorithm, held, op) {
        (Algorithm::Concurrency(slots), Held::Slot(taken), Op::Release) => {
            let released = concurrency::release(slots, state, now, taken);
            (released.then_some(1), held)
        }
        (Algorithm::Concurrency(slots), Held::Slot(taken), Op::Renew) => {
            match concurrency::renew(slots, state, now, taken) {
                Some(taken) => (Some(1), Held::Slot(taken)),
                None => (None, held),
            }
        }
        (algorithm, Held::Reserved { .. }, Op::Charge(tokens)) => {
            (Some(algorithm.owe(state, now, tokens, max_debt)), held)
        }
        (algorithm, Held::Reserved { at, .. }, Op::Refund(tokens)) => {
            (Some(algorithm.refund(state, now, tokens, at)), held)
        }
        _ => (None, held),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use crate::limiter::tab::Held;
    use crate::state::ledger::Ledger;
    use serde_json::json;

    #[test]
    fn a_key_owes_once_a_charge_takes_it_past_its_limit_until_refill_pays_it_back() {
        let cost = json!({"from_response": {"usage": "total_tokens"}});
        let plan = plan_of(json!([per_user(
            "llm",
            10,
            json!({"per": "10s", "cost": cost})
        )]));
        let store = store(&plan);
        let outcome = decide(&plan, &store, ALICE, T0);
        let mut entry = outcome.tab.unwrap().entries[0];
        assert!(matches!(entry.held, Held::Reserved { tokens: 0, .. }));
        let (hash, tier) = (entry.hash, entry.tier);
        let mut ledger = Ledger::default();
        let mut limiter = Limiter {
            plan: &plan,
            keying: &keying(),
            prefix: PREFIX,
            store: &store,
            ledger: &mut ledger,
            overrides: None,
        };
        assert!(!limiter.owes(0, hash, &tier, T0), "nothing spent");
        limiter.settle(&mut entry, Op::Charge(10), T0);
        assert!(!limiter.owes(0, hash, &tier, T0), "empty is not owing");
        let settled = limiter.settle(&mut entry, Op::Charge(3), T0);
        let into_debt = Settled::Done {
            amount: 3,
            past_limit: 3,
            into_debt: true,
            expired: 0,
        };
        assert_eq!(settled, into_debt);
        assert!(limiter.owes(0, hash, &tier, T0));
        let deeper = limiter.settle(&mut entry, Op::Charge(2), T0);
        assert!(
            matches!(
                deeper,
                Settled::Done {
                    past_limit: 2,
                    into_debt: false,
                    ..
                }
            ),
            "{deeper:?}: owing already"
        );
        assert!(limiter.owes(0, hash, &tier, T0 + 2 * SEC));
        assert!(
            !limiter.owes(0, hash, &tier, T0 + 5 * SEC),
            "five tokens refilled"
        );
    }
}
