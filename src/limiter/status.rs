//! A client's own quota (`status_path`): every enforcing policy that applies to a request, with
//! the key, tier and matching a request would get, judged on its slot as read. One shared-data
//! read per table; nothing is charged, written, lent or asked of the service.
//!
//! A local policy is judged by its algorithm at a cost of nothing (`local::admit`'s probe), plus
//! the tokens this worker holds on loan from the key's bucket (other workers' loans are not seen
//! here: a lending policy's remaining can read up to their loans low). A global policy is told
//! from what this Envoy last heard of the key (`global::estimate`): the service is not asked.

use super::{global, local, Applied, Basis, Limiter, Progress};
use crate::core::algorithm::Decision;
use crate::core::request::{Attributes, RequestSource};
use crate::state::store::Store;
use crate::state::table::Words;

/// A policy's standing for the requesting key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// The policy, its tier for the key, and its state: `Basis::Bucket` for a local policy,
    /// `Basis::Grant` or `Basis::OverLimit` for a global one this Envoy has heard of.
    pub applied: Applied,
    /// Whether anything is known of the key's state: false for a global policy whose key this
    /// Envoy has no live word from the service on (its `decision` is then meaningless).
    pub known: bool,
}

impl<S: Store> Limiter<'_, S> {
    /// The standing of every enforcing policy that applies to `request` at `now`, in the order
    /// of the configuration. Reads each table of the request once and writes nothing.
    pub fn status<R: RequestSource + ?Sized>(
        &mut self,
        request: &mut Attributes<R>,
        now: u64,
    ) -> Vec<Standing> {
        let mut progress = Progress::new(now);
        self.gather(request, true, &mut progress);
        let mut standings = Vec::new();
        for work in &progress.works {
            let Some(slot) = self.find(work.table, work.hash, now) else {
                continue;
            };
            let at = slot.time(now);
            for member in work.members.iter().filter(|m| m.enforced) {
                let Some(policy) = self.plan.policies.get(member.policy) else {
                    continue;
                };
                let mut words: Words = slot
                    .state
                    .get(policy.words.clone())
                    .map(Words::from_slice)
                    .unwrap_or_default();
                let judged = match policy.scope {
                    crate::config::Scope::Local => local::standing(&member.tier, &mut words, at)
                        .map(|d| {
                            let lent = self.ledger.held(member.policy, work.hash, at);
                            let remaining = d.remaining.saturating_add(lent);
                            (Decision { remaining, ..d }, Basis::Bucket)
                        }),
                    crate::config::Scope::Global(_) => global::estimate(&words, at),
                };
                let known = judged.is_some();
                let (decision, basis) = judged.unwrap_or((Decision::default(), Basis::Grant));
                standings.push(Standing {
                    applied: Applied {
                        policy: member.policy,
                        key: None,
                        tier: member.tier,
                        decision,
                        basis,
                        enforced: true,
                        cost: 0,
                    },
                    known,
                });
            }
        }
        standings.sort_unstable_by_key(|s| s.applied.policy);
        standings
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use crate::config::Plan;
    use crate::limiter::Step;
    use crate::state::ledger::Ledger;
    use crate::state::store::{MemoryStore, StoreError};
    use crate::wire::protocol::Answer;
    use serde_json::json;
    use std::cell::Cell;

    /// A store that counts its reads and writes.
    #[derive(Default)]
    struct Watched {
        store: MemoryStore,
        gets: Cell<u32>,
        sets: Cell<u32>,
    }

    impl Store for Watched {
        fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
            self.gets.set(self.gets.get() + 1);
            self.store.get(key)
        }

        fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
            self.sets.set(self.sets.get() + 1);
            self.store.set(key, value, cas)
        }
    }

    fn status<S: Store>(plan: &Plan, store: &S, ledger: &mut Ledger, now: u64) -> Vec<Standing> {
        let source = request(ALICE);
        let mut attributes = Attributes::new(&source, &plan.attrs);
        let mut limiter = Limiter {
            plan,
            keying: &keying(),
            prefix: PREFIX,
            store,
            ledger,
            overrides: None,
        };
        limiter.status(&mut attributes, now)
    }

    fn left(standings: &[Standing]) -> Vec<(usize, Option<u64>)> {
        let left = |s: &Standing| {
            (
                s.applied.policy,
                s.known.then_some(s.applied.decision.remaining),
            )
        };
        standings.iter().map(left).collect()
    }

    #[test]
    fn a_status_reports_what_is_left_and_changes_nothing() {
        let plan = plan_of(json!([
            per_user("second", 5, json!({})),
            {"name": "ip", "key": ["ip"], "requests": 3, "per": "1h"},
            per_user("hour", 100, json!({"per": "1h"})),
        ]));
        let store = Watched::default();
        decide(&plan, &store, ALICE, T0);
        decide(&plan, &store, ALICE, T0);
        let (gets, sets) = (store.gets.get(), store.sets.get());
        let standings = status(&plan, &store, &mut Ledger::default(), T0);
        assert_eq!(
            left(&standings),
            [(0, Some(3)), (1, Some(1)), (2, Some(98))]
        );
        assert_eq!(store.sets.get(), sets, "nothing written");
        assert_eq!(store.gets.get(), gets + 2, "one read per table");
        let again = status(&plan, &store, &mut Ledger::default(), T0);
        assert_eq!(again, standings, "and nothing charged");
        let next = decide(&plan, &store, ALICE, T0);
        assert_eq!(
            next.applied[0].decision.remaining, 2,
            "the next request pays the first"
        );
    }

    #[test]
    fn a_key_at_its_limit_has_none_left_and_the_time_to_wait() {
        let plan = plan_of(json!([per_user("tight", 1, json!({"per": "1h"}))]));
        let store = store(&plan);
        decide(&plan, &store, ALICE, T0);
        let standing = status(&plan, &store, &mut Ledger::default(), T0 + SEC)[0];
        assert_eq!(standing.applied.decision.remaining, 0);
        assert_eq!(standing.applied.decision.reset_after, 3599 * SEC);
    }

    #[test]
    fn the_reset_is_the_one_the_last_requests_headers_gave_counted_down() {
        for algorithm in [
            "token_bucket",
            "fixed_window",
            "sliding_window",
            "sliding_log",
        ] {
            let plan = plan_of(json!([per_user(
                "p",
                5,
                json!({"per": "1h", "algorithm": algorithm})
            )]));
            let store = store(&plan);
            decide(&plan, &store, ALICE, T0);
            let last = decide(&plan, &store, ALICE, T0 + SEC).applied[0].decision;
            let standing = status(&plan, &store, &mut Ledger::default(), T0 + 2 * SEC)[0];
            let decision = standing.applied.decision;
            assert_eq!(
                (decision.remaining, decision.reset_after),
                (last.remaining, last.reset_after - SEC),
                "{algorithm}"
            );
        }
    }

    #[test]
    fn shadow_policies_are_not_shown_and_a_new_key_has_its_whole_limit() {
        let plan = plan_of(json!([
            per_user("enforced", 4, json!({})),
            per_user("trial", 1, json!({"mode": "shadow"})),
        ]));
        let store = Watched::default();
        let standings = status(&plan, &store, &mut Ledger::default(), T0);
        assert_eq!(left(&standings), [(0, Some(4))]);
        assert_eq!(store.sets.get(), 0, "no page created");
    }

    #[test]
    fn a_global_policy_is_told_from_the_services_last_word_here_or_not_at_all() {
        let plan = plan_of(json!([per_user(
            "global",
            10,
            json!({"scope": "global", "lease": 4})
        )]));
        let store = store(&plan);
        let mut ledger = Ledger::default();
        assert_eq!(left(&status(&plan, &store, &mut ledger, T0)), [(0, None)]);
        let Step::Callout(pending) = evaluate(&plan, &store, &mut ledger, ALICE, T0) else {
            panic!("needs the service");
        };
        let mut limiter = Limiter {
            plan: &plan,
            keying: &keying(),
            prefix: PREFIX,
            store: &store,
            ledger: &mut ledger,
            overrides: None,
        };
        let answer = Answer {
            allowed: true,
            granted: 4,
            remaining: 5,
            reset_after: 5 * SEC,
            retry_after: 0,
            delay: 0,
        };
        let Step::Done(admitted) = limiter.resume(pending, Some(vec![answer])) else {
            panic!("answered");
        };
        let headers = admitted.applied[0].decision;
        let standing = status(&plan, &store, &mut ledger, T0)[0];
        assert_eq!(
            (standing.applied.decision.remaining, standing.applied.basis),
            (headers.remaining, Basis::Grant),
            "the service's 5 and the 3 granted tokens still here, as the request's headers said"
        );
        assert_eq!(
            left(&status(&plan, &store, &mut ledger, T0 + 5 * SEC)),
            [(0, None)]
        );
    }

    #[test]
    fn a_lending_policy_counts_this_workers_loan() {
        let plan = plan_of(json!([per_user(
            "lent",
            1,
            json!({"per": "1h", "burst": 10, "lease": 4})
        )]));
        let store = store(&plan);
        let mut ledger = Ledger::default();
        for _ in 0..2 {
            let Step::Done(_) = evaluate(&plan, &store, &mut ledger, ALICE, T0) else {
                panic!("local");
            };
        }
        let Step::Done(last) = evaluate(&plan, &store, &mut ledger, ALICE, T0) else {
            panic!("local");
        };
        let standing = status(&plan, &store, &mut ledger, T0)[0];
        assert_eq!(
            standing.applied.decision.remaining,
            last.applied[0].decision.remaining
        );
        assert_eq!(standing.applied.decision.remaining, 7);
    }
}
