//! A work's slot: read (finding the key's slot in its table, taking this worker's loans on it out
//! of the ledger) and written back with compare-and-swap, judged again after every lost race.

use super::work::Work;
use super::{global, strictest_denial, Limiter, Progress, MAX_ATTEMPTS};
use crate::config::{Policy, Scope, GLOBAL_COLUMNS};
use crate::core::algorithm::Debt;
use crate::state::store::{Store, StoreError};
use crate::state::table;

impl<S: Store> Limiter<'_, S> {
    /// Reads the work's slot and judges every member against it. The loans this worker holds on
    /// the key's own slot are withdrawn, to be handed back with the write.
    pub(super) fn read(&mut self, work: &mut Work, now: u64) {
        if let Some(slot) = self.find(work.table, work.hash, now) {
            work.slot = slot;
        }
        work.now = work.slot.time(now);
        if !self.ledger.is_empty() {
            for member in &work.members {
                if work.withdrawn.iter().any(|l| l.policy == member.policy) {
                    continue;
                }
                if let Some(loan) = self.ledger.withdraw(member.policy, work.hash) {
                    work.withdrawn.push(loan);
                }
            }
        }
        work.judge(self.plan);
    }

    /// The slot of the key `hash` in `table`, as read at `now` (`table::find`).
    pub(super) fn find(&self, table: usize, hash: u64, now: u64) -> Option<table::Slot> {
        let plan = self.plan;
        let spec = plan.tables.get(table)?;
        let debt = |state: &[u64]| {
            let policies = plan.policies.iter().filter(|p| p.table == table);
            policies.fold(Debt::default(), |sum, p| sum.and(debt(p, state, now)))
        };
        Some(table::find(self.store, self.prefix, spec, hash, now, debt))
    }

    /// Writes every work's slot, judging it again after each lost race. A denied request writes
    /// no charges. Returns false when a work read again needs the service.
    pub(super) fn write(&mut self, p: &mut Progress) -> bool {
        let mut denied = strictest_denial(&p.works).is_some();
        for work in p.works.iter_mut().filter(|w| !w.on_loan) {
            let mut charged = false;
            for attempt in 1..=MAX_ATTEMPTS {
                if denied {
                    work.undo_charges(self.plan);
                }
                if !work.slot.needs_write(&work.next, work.now) {
                    break;
                }
                match table::write(self.store, &work.slot, &work.next, work.now, work.free_at()) {
                    Ok(forgot) => {
                        work.count_expired(self.plan, &mut p.outcome.expired_slots);
                        p.outcome.evictions += forgot.keys;
                        p.outcome.forgiven = p.outcome.forgiven.saturating_add(forgot.tokens);
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

/// What a policy's words in a slot owe at `now`: the most any of its limits says they owe
/// (whichever wrote them), and a global policy's marks.
fn debt(policy: &Policy, slot: &[u64], now: u64) -> Debt {
    let Some(state) = slot.get(policy.words.clone()) else {
        return Debt::default();
    };
    let (marks, local) = match policy.scope {
        Scope::Global(_) => state.split_at(GLOBAL_COLUMNS.min(state.len())),
        Scope::Local => (&[][..], state),
    };
    let owed = policy.limits().filter_map(|t| {
        let words = local.get(..t.algorithm.columns())?;
        Some(t.algorithm.debt(words, now))
    });
    let local = owed.max().unwrap_or_default();
    let marks = global::debt(marks, policy.tier.algorithm.capacity(), now);
    Debt {
        share: local.share.max(marks.share),
        tokens: local.tokens,
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use crate::config::Plan;
    use crate::state::store::MemoryStore;
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
        let denied = decide(&plan, &store, ALICE, T0 + table::TOUCH_EVERY);
        assert!(denied.is_denied());
        let roomy = decide(
            &plan,
            &store,
            &[("x-user-id", "alice")],
            T0 + table::TOUCH_EVERY,
        );
        assert_eq!(
            roomy.applied[0].decision.remaining, 3,
            "charged once, not twice"
        );
        assert_eq!(store.entry_count(), before);
    }

    #[test]
    fn a_policy_owes_the_most_any_of_its_limits_says() {
        let tiers =
            json!({"by": "header:x-plan", "values": {"slow": {"requests": 1, "per": "1h"}}});
        let plan = plan_of(json!([per_user("tiered", 1, json!({"tiers": tiers}))]));
        let policy = &plan.policies[0];
        // Half a second of debt: half the default tier's one token, a sliver of the slow tier's.
        let owed = debt(policy, &[T0 + SEC / 2], T0);
        assert_eq!(
            (owed.tokens, owed.share),
            (1, crate::core::algorithm::FULL_SHARE / 2)
        );
        assert_eq!(debt(policy, &[T0], T0), Debt::default());
    }

    #[test]
    fn a_global_policys_over_limit_mark_counts_as_limited_but_forgives_nothing() {
        let global = plan_of(json!([per_user("g", 10, json!({"scope": "global"}))]));
        let marked = [0, 0, T0 + SEC, 0, 0, 0];
        let owed = debt(&global.policies[0], &marked, T0);
        assert_eq!(
            (owed.tokens, owed.share),
            (0, crate::core::algorithm::FULL_SHARE)
        );
        let granted = [5, T0 + SEC, 0, 0, 0, 0];
        let owed = debt(&global.policies[0], &granted, T0);
        assert_eq!(
            (owed.tokens, owed.share),
            (0, crate::core::algorithm::FULL_SHARE / 2)
        );
        assert_eq!(
            debt(&global.policies[0], &granted, T0 + SEC),
            Debt::default()
        );
    }

    /// A key's view of its limit, `rate` per second and `burst`, as an ideal bucket that nothing
    /// forgets; and what the table forgave it.
    #[derive(Default)]
    struct Model {
        first: Option<u64>,
        admitted: u64,
        forgiven: u64,
        evicted: bool,
        level: u64,
        last: u64,
    }

    impl Model {
        /// Whether the ideal bucket admits a request at `now` (and takes it if so).
        fn admits(&mut self, capacity: u64, interval: u64, now: u64) -> bool {
            if self.first.is_none() {
                (self.first, self.level, self.last) = (Some(now), capacity, now);
            }
            self.level = (self.level + (now - self.last)).min(capacity);
            self.last = now;
            let allowed = self.level >= interval;
            self.level -= if allowed { interval } else { 0 };
            allowed
        }
    }

    /// Keys of the model test: more than a page holds, fewer than the larger tables.
    const KEYS: usize = 40;

    proptest::proptest! {
        /// The first requests of a new key, up to its burst, decided at once by workers whose
        /// clocks read a moment apart: each rival, deciding at the latest clock, writes between
        /// this request's read and its write. All pass, as they would for a key the table holds
        /// already: the request is decided at the page's clock, not at its earlier one.
        #[test]
        fn simultaneous_first_requests_up_to_the_burst_all_pass_whatever_the_clocks(
            burst in 2u64..8,
            behind in 1u64..1_000_000,
            rivals in 1u32..8,
        ) {
            let plan = plan_of(json!([per_user("per-user", 1, json!({"burst": burst}))]));
            let rivals = rivals.min(burst as u32 - 1);
            let rival = |store: &MemoryStore| {
                assert!(!decide(&plan, store, ALICE, T0 + behind).is_denied(), "a rival");
            };
            let store = contended(&plan, rivals, &rival);
            let outcome = decide(&plan, &store, ALICE, T0);
            proptest::prop_assert_eq!(outcome.cas_retries, rivals);
            proptest::prop_assert!(!outcome.is_denied(), "{} rivals, burst {}", rivals, burst);
        }

        /// Keys taking turns through a table too small for them, against a model of each key's
        /// ideal bucket: a key's first request always passes (it gets a slot of its own); until
        /// the table forgets its state, every decision is the ideal bucket's; and it never gets
        /// more than its burst, plus its refill since its first request, plus what its
        /// evictions forgave it (`sluice.forgiven`: at most what it owed when forgotten).
        #[test]
        fn a_key_never_gets_more_than_its_burst_and_refill_and_what_forgetting_forgave_it(
            max_keys in 1u32..70,
            burst in 1u64..6,
            rate in 1u64..20,
            steps in proptest::collection::vec((0usize..KEYS, 0u64..300), 1..300),
        ) {
            let policy = json!({"name": "per-user", "key": ["header:x-user-id"],
                "requests": rate, "per": "1s", "burst": burst, "max_keys": max_keys});
            let plan = plan_of(json!([policy]));
            let (store, spec) = (store(&plan), plan.tables[0].clone());
            let crate::core::algorithm::Algorithm::TokenBucket(bucket) = plan.policies[0].tier.algorithm
            else {
                unreachable!("a token bucket");
            };
            let names: Vec<String> = (0..KEYS).map(|i| format!("user-{i}")).collect();
            let hashes: Vec<u64> = names
                .iter()
                .map(|n| crate::core::key::hash_values(std::slice::from_ref(n), &keying().slots))
                .collect();
            let mut models: Vec<Model> = (0..KEYS).map(|_| Model::default()).collect();
            let mut now = T0;
            for (key, gap_ms) in steps {
                now += gap_ms * 1_000_000;
                let before = table::owners(&store, PREFIX, &spec);
                let outcome = decide(&plan, &store, &[("x-user-id", &names[key])], now);
                let after = table::owners(&store, PREFIX, &spec);
                let allowed = !outcome.is_denied();
                let model = &mut models[key];
                let first = model.first.is_none();
                let ideal = model.admits(bucket.capacity, bucket.interval.get(), now);
                proptest::prop_assert!(!first || allowed, "a first request passes");
                if !model.evicted {
                    proptest::prop_assert_eq!(allowed, ideal, "exact until forgotten");
                }
                model.admitted += u64::from(allowed);
                let gone: Vec<usize> = (0..KEYS)
                    .filter(|&k| before.contains(&hashes[k]) && !after.contains(&hashes[k]))
                    .collect();
                // One key at most is forgotten per request; forgetting one that owed nothing
                // (its bucket full again) is no eviction, and changes nothing.
                proptest::prop_assert!(gone.len() <= 1);
                proptest::prop_assert!(outcome.evictions as usize <= gone.len());
                for k in gone.into_iter().filter(|_| outcome.evictions > 0) {
                    models[k].forgiven += outcome.forgiven;
                    models[k].evicted = true;
                }
                for m in &models {
                    let Some(first) = m.first else { continue };
                    let refill = (now - first) * rate / SEC;
                    proptest::prop_assert!(
                        m.admitted <= burst + refill + m.forgiven,
                        "{} > {burst} + {refill} + {}", m.admitted, m.forgiven
                    );
                }
            }
        }
    }
}
