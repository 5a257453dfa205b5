//! Local members: decided by their algorithm on the key's bucket in shared data, and a local
//! token bucket's `lease`: tokens a worker borrows from the bucket in the same CAS and spends by
//! itself (see `ledger`), so a hot key's requests touch no shared data until the loan runs out.

use super::member::Member;
use crate::config::{Policy, Tier};
use crate::core::algorithm::{token_bucket, Algorithm, Decision};
use crate::state::ledger::{Loan, LOAN_TTL};

/// Runs the tier's algorithm on its words of the policy's state. A cost of 0 (a reservation of
/// nothing) passes while a token is left and takes nothing: a key in debt waits.
pub(super) fn admit(tier: &Tier, cost: u64, state: &mut [u64], now: u64) -> Option<Decision> {
    let words = state.get_mut(..tier.algorithm.columns())?;
    if cost > 0 {
        return Some(tier.algorithm.admit(words, now, cost));
    }
    let mut probe: crate::state::table::Words = words.iter().copied().collect();
    let decision = tier.algorithm.admit(&mut probe, now, 1);
    Some(Decision {
        remaining: decision.remaining + u64::from(decision.allowed),
        ..decision
    })
}

/// The key's standing under the tier at `now`, charging nothing (`admit` at a cost of 0): what
/// is left and, while a request would pass, the time until the state owes nothing (the bucket
/// full, the window over), without the token the probe takes.
pub(super) fn standing(tier: &Tier, state: &mut [u64], now: u64) -> Option<Decision> {
    let decision = admit(tier, 0, state, now)?;
    if !decision.allowed {
        return Some(decision);
    }
    let words = state.get(..tier.algorithm.columns())?;
    let idle_at = tier.algorithm.idle_at(words, now);
    Some(Decision {
        reset_after: idle_at.saturating_sub(now),
        ..decision
    })
}

/// A lending policy (a token bucket): takes back what this worker still holds, then, for a key
/// back within a loan's time of its last visit here, takes the whole `take` if the bucket has
/// it. Tokens beyond the cost become this worker's loan, reported as remaining. A colder key
/// takes just the cost (its loan would lapse, or be pushed out of the ledger, unspent) and is
/// marked as seen, with an empty loan.
pub(super) fn lend(
    policy: &Policy,
    member: &Member,
    key: u64,
    state: &mut [u64],
    held: Option<&Loan>,
    now: u64,
) -> Option<(Decision, Option<Loan>)> {
    let (Algorithm::TokenBucket(rate), Some(tat)) = (member.tier.algorithm, state.first_mut())
    else {
        return admit(&member.tier, member.cost, state, now).map(|d| (d, None));
    };
    let hot = held.is_some_and(|h| h.expires > now);
    if let Some(held) = held {
        token_bucket::hand_back(tat, held.tokens, held.interval);
    }
    // A refused loan leaves the bucket as it was.
    let lent = hot
        .then(|| token_bucket::admit(&rate, tat, now, policy.take))
        .filter(|lent| lent.allowed);
    let (decision, tokens) = match lent {
        Some(lent) => (lent, policy.take - policy.cost),
        None => (token_bucket::admit(&rate, tat, now, policy.cost), 0),
    };
    let loan = Loan {
        policy: member.policy,
        key,
        tokens,
        interval: rate.interval,
        expires: now.saturating_add(LOAN_TTL),
        remaining: decision.remaining,
        reset_at: now.saturating_add(decision.reset_after),
    };
    let reported = Decision {
        remaining: decision.remaining + tokens,
        ..decision
    };
    Some((reported, decision.allowed.then_some(loan)))
}

#[cfg(test)]
mod tests {
    use super::super::member::Service;
    use super::super::testing::*;
    use super::super::work::{pay_from_loans, refund_loans, Work};
    use super::super::Basis;
    use super::*;
    use crate::config::Plan;
    use crate::state::ledger::Ledger;
    use serde_json::json;

    /// A policy of burst 10 refilling one token an hour, lending `take`.
    fn lending(take: u64) -> Plan {
        plan_of(json!([per_user(
            "per-user",
            1,
            json!({"per": "1h", "burst": 10, "lease": take})
        )]))
    }

    fn member(plan: &Plan) -> Member {
        Member {
            policy: 0,
            tier: plan.policies[0].tier,
            emergency: plan.policies[0].tier,
            service: Service::Ask,
            enforced: true,
            slot: None,
            cost: plan.policies[0].cost,
        }
    }

    fn loan(tokens: u64, expires: u64, plan: &Plan) -> Loan {
        let Algorithm::TokenBucket(rate) = plan.policies[0].tier.algorithm else {
            panic!("a token bucket");
        };
        Loan {
            policy: 0,
            key: 7,
            tokens,
            interval: rate.interval,
            expires,
            remaining: 0,
            reset_at: 0,
        }
    }

    #[test]
    fn admit_runs_the_tiers_algorithm_on_its_own_words() {
        let plan = lending(1);
        let mut state = [0, 99];
        let decision = admit(&plan.policies[0].tier, 3, &mut state, T0).unwrap();
        assert_eq!((decision.allowed, decision.remaining), (true, 7));
        assert_eq!(state[1], 99, "the next policy's word is untouched");
    }

    #[test]
    fn a_cold_key_borrows_nothing_and_is_marked_as_seen() {
        let plan = lending(5);
        let mut state = [0];
        let (decision, loan) =
            lend(&plan.policies[0], &member(&plan), 7, &mut state, None, T0).unwrap();
        assert_eq!(decision.remaining, 9);
        assert_eq!(loan.map(|l| l.tokens), Some(0));
    }

    #[test]
    fn a_hot_key_borrows_the_whole_lease_after_handing_back_what_it_held() {
        let plan = lending(5);
        let mut state = [0];
        let held = loan(2, T0 + 1, &plan);
        let (_, cold) = lend(&plan.policies[0], &member(&plan), 7, &mut state, None, T0).unwrap();
        assert_eq!(cold.map(|l| l.tokens), Some(0));
        let hour = 3600 * SEC;
        let mut bucket = [state[0] + 2 * hour];
        let (decision, loan) = lend(
            &plan.policies[0],
            &member(&plan),
            7,
            &mut bucket,
            Some(&held),
            T0,
        )
        .unwrap();
        assert_eq!(loan.map(|l| l.tokens), Some(4), "five taken, one spent");
        assert_eq!(
            decision.remaining,
            4 + 4,
            "the bucket's four, and the four held"
        );
    }

    #[test]
    fn loans_pay_a_work_only_when_they_cover_every_member() {
        let plan = lending(5);
        let mut ledger = Ledger::default();
        let mut work = Work::new(0, (7, None), member(&plan));
        assert!(
            !pay_from_loans(&mut work, &plan, &mut ledger, T0),
            "no loan"
        );
        ledger.deposit(loan(1, T0 + 1, &plan), T0);
        assert!(pay_from_loans(&mut work, &plan, &mut ledger, T0));
        assert_eq!(
            work.verdicts[0].map(|(d, b)| (d.allowed, b)),
            Some((true, Basis::Loan))
        );
        let mut again = Work::new(0, (7, None), member(&plan));
        assert!(!pay_from_loans(&mut again, &plan, &mut ledger, T0), "spent");
        refund_loans(&[work], &plan, &mut ledger);
        assert!(
            pay_from_loans(&mut again, &plan, &mut ledger, T0),
            "refunded"
        );
    }
}
