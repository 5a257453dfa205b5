//! A work's slot: read (finding the key's slot in its table, taking this worker's loans on it out
//! of the ledger) and written back with compare-and-swap, judged again after every lost race.

use super::work::Work;
use super::{global, strictest_denial, Limiter, Pending, MAX_ATTEMPTS};
use crate::config::{Policy, Scope, GLOBAL_COLUMNS};
use crate::store::{Store, StoreError};
use crate::table;

impl<S: Store> Limiter<'_, S> {
    /// Reads the work's slot and judges every member against it. The loans this worker holds on
    /// the key's own slot are withdrawn, to be handed back with the write.
    pub(super) fn read(&mut self, work: &mut Work, now: u64) {
        let plan = self.plan;
        if let Some(spec) = plan.tables.get(work.table) {
            let idle_at = |state: &[u64]| {
                let policies = plan.policies.iter().filter(|p| p.table == work.table);
                policies.map(|p| idle_at(p, state)).max().unwrap_or(0)
            };
            work.slot = table::find(self.store, self.prefix, spec, work.hash, idle_at, now);
        }
        if !work.slot.is_overflow() && !self.ledger.is_empty() {
            for member in &work.members {
                if work.withdrawn.iter().any(|l| l.policy == member.policy) {
                    continue;
                }
                if let Some(loan) = self.ledger.withdraw(member.policy, work.hash) {
                    work.withdrawn.push(loan);
                }
            }
        }
        work.judge(plan, now);
    }

    /// Writes every work's slot, judging it again after each lost race. A denied request writes
    /// no charges. Returns false when a work read again needs the service.
    pub(super) fn write(&mut self, p: &mut Pending) -> bool {
        let mut denied = strictest_denial(&p.works).is_some();
        for work in p.works.iter_mut().filter(|w| !w.on_loan) {
            let mut charged = false;
            for attempt in 1..=MAX_ATTEMPTS {
                if denied {
                    work.undo_charges(self.plan);
                }
                if work.next == work.slot.state && !work.slot.needs_touch(p.now) {
                    break;
                }
                match table::write(self.store, &work.slot, &work.next, p.now) {
                    Ok(()) => {
                        p.outcome.evictions += u32::from(work.slot.evicts);
                        charged = !denied;
                        break;
                    }
                    Err(StoreError::CasMismatch) if attempt < MAX_ATTEMPTS => {
                        p.outcome.cas_retries += 1;
                        self.read(work, p.now);
                        if work.asks() && !denied {
                            return false;
                        }
                        denied |= strictest_denial(std::slice::from_ref(work)).is_some();
                    }
                    Err(_) => {
                        p.outcome.exhausted = true;
                        denied = true;
                        break;
                    }
                }
            }
            work.settle_loans(self.ledger, charged, p.now);
        }
        true
    }
}

/// From when a policy's words in a slot are as good as empty, whichever of its limits wrote them.
fn idle_at(policy: &Policy, slot: &[u64]) -> u64 {
    let Some(state) = slot.get(policy.column..policy.column + policy.columns()) else {
        return 0;
    };
    let (marks, local) = match policy.scope {
        Scope::Global(_) => state.split_at(GLOBAL_COLUMNS.min(state.len())),
        Scope::Local => (&[][..], state),
    };
    let local_idle = policy
        .limits()
        .filter_map(|t| {
            let words = local.get(..t.algorithm.columns())?;
            Some(t.algorithm.idle_at(words))
        })
        .max()
        .unwrap_or(0);
    local_idle.max(global::idle_at(marks))
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use crate::config::Plan;
    use crate::store::MemoryStore;
    use serde_json::json;
    use std::cell::Cell;

    /// A store where another worker's request for the same key lands between this request's read
    /// and its write, `races` times; then it fails each write with `error`, if any.
    struct Contended<'a> {
        store: MemoryStore,
        races: Cell<u32>,
        error: Option<StoreError>,
        rival: &'a dyn Fn(&MemoryStore),
    }

    impl Store for Contended<'_> {
        fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
            self.store.get(key)
        }

        fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
            if self.races.get() > 0 {
                self.races.set(self.races.get() - 1);
                (self.rival)(&self.store);
            }
            match self.error {
                Some(error) => Err(error),
                None => self.store.set(key, value, cas),
            }
        }
    }

    fn burst(n: u64) -> Plan {
        plan_of(json!([per_user(
            "per-user",
            1,
            json!({"per": "1h", "burst": n})
        )]))
    }

    fn contended<'a>(plan: &Plan, races: u32, rival: &'a dyn Fn(&MemoryStore)) -> Contended<'a> {
        Contended {
            store: store(plan),
            races: Cell::new(races),
            error: None,
            rival,
        }
    }

    #[test]
    fn a_lost_race_is_judged_again_on_the_winners_state() {
        let plan = burst(2);
        let rival = |store: &MemoryStore| {
            decide(&plan, store, ALICE, T0);
        };
        let store = contended(&plan, 2, &rival);
        let outcome = decide(&plan, &store, ALICE, T0);
        assert_eq!(outcome.cas_retries, 2, "one read again per lost race");
        assert!(outcome.is_denied(), "the two rivals took the burst");
        assert_eq!(
            decide(&plan, &store.store, ALICE, T0).applied[0]
                .decision
                .remaining,
            0
        );
    }

    #[test]
    fn a_slot_contended_through_every_attempt_denies_rather_than_admit_unmetered() {
        let plan = burst(1_000);
        let rival = |store: &MemoryStore| {
            decide(&plan, store, &[("x-user-id", "alice")], T0);
        };
        let store = contended(&plan, u32::MAX, &rival);
        let outcome = decide(&plan, &store, ALICE, T0);
        assert_eq!(outcome.cas_retries, MAX_ATTEMPTS - 1);
        assert!(outcome.exhausted && outcome.is_denied());
    }

    #[test]
    fn a_store_that_fails_denies() {
        let plan = burst(5);
        let mut store = contended(&plan, 0, &|_| {});
        store.error = Some(StoreError::Failed);
        let outcome = decide(&plan, &store, ALICE, T0);
        assert!(outcome.exhausted && outcome.is_denied());
    }

    #[test]
    fn a_denied_request_writes_no_charge_and_a_denied_key_is_touched_to_stay_in_use() {
        let plan = plan_of(json!([
            per_user("roomy", 1, json!({"per": "1h", "burst": 5})),
            {"name": "per-ip", "key": ["ip"], "requests": 1, "per": "1h", "burst": 1},
        ]));
        let store = store(&plan);
        decide(&plan, &store, ALICE, T0);
        let before = store.entry_count();
        let denied = decide(&plan, &store, ALICE, T0 + RECENT_HALF);
        assert!(denied.is_denied());
        let roomy = decide(&plan, &store, &[("x-user-id", "alice")], T0 + RECENT_HALF);
        assert_eq!(
            roomy.applied[0].decision.remaining, 3,
            "charged once, not twice"
        );
        assert_eq!(store.entry_count(), before);
    }

    const RECENT_HALF: u64 = table::RECENT / 2;

    #[test]
    fn a_policy_is_idle_once_every_limit_it_can_run_at_is() {
        let tiers =
            json!({"by": "header:x-plan", "values": {"slow": {"requests": 1, "per": "1h"}}});
        let plan = plan_of(json!([per_user("tiered", 1, json!({"tiers": tiers}))]));
        let policy = &plan.policies[0];
        assert_eq!(idle_at(policy, &[T0 + 7]), T0 + 7);
        let global = plan_of(json!([per_user("g", 1, json!({"scope": "global"}))]));
        let marks_then_bucket = [2, T0 + 9, T0 + 3, 4, T0 + 20, T0 + 5];
        assert_eq!(idle_at(&global.policies[0], &marks_then_bucket), T0 + 9);
    }
}
