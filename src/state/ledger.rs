//! One worker's loans from local buckets: tokens it took from a key's shared bucket in one go
//! (a local policy's `lease`) and spends by itself, so a hot key costs no shared-data read or
//! CAS until they run out. Lent tokens are real debits of the shared bucket: the bucket's limit
//! over time stays exact. Tokens a worker still holds when it next visits the bucket are handed
//! back in the same CAS; a worker spends them only for `LOAN_TTL`, so a key's short burst can
//! exceed `burst` by no more than what the workers hold.
//!
//! (A global policy's `lease` is another thing: tokens the service grants a whole Envoy, kept in
//! shared data; see `limiter::global`.)
//!
//! Only a hot key borrows: one back at this worker's bucket within `LOAN_TTL` of its last visit.
//! A first visit leaves an empty loan that marks the key as seen. So a key too cold to spend a
//! loan in time never takes one, and tokens are lost (an under-admission) only when a key stops
//! coming back right after a loan and its lapsed loan is pushed out of a full ledger.

use crate::core::algorithm::Decision;
use crate::core::duration::NANOS_PER_SEC;
use smallvec::SmallVec;
use std::num::NonZeroU64;

/// How long a worker spends borrowed tokens; afterwards it hands them back on its next visit.
/// Meanwhile the key's slot still owes the lent tokens: it is not given to another key for free.
pub const LOAN_TTL: u64 = NANOS_PER_SEC / 4;
/// Loans one worker holds at most: its hottest keys.
pub const CAPACITY: usize = 16;

/// Tokens of one policy's bucket for one key, held by this worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loan {
    pub policy: usize,
    pub key: u64,
    pub tokens: u64,
    /// Bucket time per token when taken: what handing a token back returns.
    pub interval: NonZeroU64,
    /// Until when the tokens may be spent.
    pub expires: u64,
    /// What the shared bucket had left after the loan, and when it would have been full:
    /// what the rate-limit headers report while the loan lasts.
    pub remaining: u64,
    pub reset_at: u64,
}

impl Loan {
    /// Whether `cost` of its tokens can be spent at `now`.
    fn covers(&self, cost: u64, now: u64) -> bool {
        self.expires > now && self.tokens >= cost
    }
}

/// A worker's loans. Small and scanned linearly: it only ever holds a few hot keys.
#[derive(Debug, Default)]
pub struct Ledger {
    loans: SmallVec<[Loan; CAPACITY]>,
}

impl Ledger {
    /// Holds no loan (always, unless a local policy lends): requests then skip the ledger.
    pub fn is_empty(&self) -> bool {
        self.loans.is_empty()
    }

    /// Whether `cost` tokens of the policy's bucket for `key` can be spent here at `now`.
    pub fn can_spend(&self, policy: usize, key: u64, cost: u64, now: u64) -> bool {
        self.find(policy, key).is_some_and(|l| l.covers(cost, now))
    }

    /// Spends `cost` borrowed tokens, if `can_spend`; the decision reports the bucket as the loan
    /// left it plus the tokens still held.
    pub fn spend(&mut self, policy: usize, key: u64, cost: u64, now: u64) -> Option<Decision> {
        let loan = self.find_mut(policy, key).filter(|l| l.covers(cost, now))?;
        loan.tokens -= cost;
        Some(Decision {
            allowed: true,
            remaining: loan.remaining + loan.tokens,
            reset_after: loan.reset_at.saturating_sub(now),
            ..Decision::default()
        })
    }

    /// The tokens of the policy's bucket for `key` this worker may still spend at `now`: what a
    /// status request adds to the bucket's own remaining.
    pub fn held(&self, policy: usize, key: u64, now: u64) -> u64 {
        self.find(policy, key)
            .filter(|l| l.expires > now)
            .map_or(0, |l| l.tokens)
    }

    /// Gives back tokens spent for a request that was denied after all.
    pub fn refund(&mut self, policy: usize, key: u64, tokens: u64) {
        if let Some(loan) = self.find_mut(policy, key) {
            loan.tokens += tokens;
        }
    }

    /// Takes the loan out, expired or not: its tokens go back to the bucket with the next write.
    pub fn withdraw(&mut self, policy: usize, key: u64) -> Option<Loan> {
        let at = self
            .loans
            .iter()
            .position(|l| l.policy == policy && l.key == key)?;
        Some(self.loans.swap_remove(at))
    }

    /// Keeps a loan. A full ledger makes room from a loan that holds no tokens, else from one
    /// that lapsed (its tokens are lost); full of live tokens, it leaves the newcomer out. A
    /// loan the ledger already holds for the same bucket wins. (Both only lose tokens when a
    /// request waited for the service meanwhile: otherwise the key's own loan was withdrawn.)
    pub fn deposit(&mut self, loan: Loan, now: u64) {
        if self.find(loan.policy, loan.key).is_some() {
            return;
        }
        if self.loans.len() >= CAPACITY {
            let room = (self.loans.iter().position(|l| l.tokens == 0))
                .or_else(|| self.loans.iter().position(|l| l.expires <= now));
            let Some(at) = room else {
                return;
            };
            self.loans.swap_remove(at);
        }
        self.loans.push(loan);
    }

    fn find(&self, policy: usize, key: u64) -> Option<&Loan> {
        self.loans
            .iter()
            .find(|l| l.policy == policy && l.key == key)
    }

    fn find_mut(&mut self, policy: usize, key: u64) -> Option<&mut Loan> {
        self.loans
            .iter_mut()
            .find(|l| l.policy == policy && l.key == key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loan(key: u64, tokens: u64, expires: u64) -> Loan {
        Loan {
            policy: 0,
            key,
            tokens,
            interval: NonZeroU64::new(10).unwrap(),
            expires,
            remaining: 5,
            reset_at: 1_000,
        }
    }

    #[test]
    fn spends_until_the_tokens_or_the_time_run_out() {
        let mut ledger = Ledger::default();
        ledger.deposit(loan(7, 2, 100), 0);
        let first = ledger.spend(0, 7, 1, 10).unwrap();
        assert_eq!((first.remaining, first.reset_after), (6, 990));
        assert!(ledger.spend(0, 7, 2, 10).is_none(), "one token left");
        assert!(ledger.spend(0, 7, 1, 100).is_none(), "expired");
        assert!(ledger.spend(0, 7, 1, 99).is_some());
        assert!(!ledger.can_spend(0, 7, 1, 99));
        assert!(
            ledger.spend(1, 7, 1, 10).is_none(),
            "another policy's bucket"
        );
    }

    #[test]
    fn withdrawing_returns_expired_tokens_too() {
        let mut ledger = Ledger::default();
        ledger.deposit(loan(7, 3, 100), 0);
        assert_eq!(ledger.withdraw(0, 7).map(|l| l.tokens), Some(3));
        assert_eq!(ledger.withdraw(0, 7), None);
    }

    #[test]
    fn a_full_ledger_makes_room_from_empty_then_lapsed_loans_never_live_tokens() {
        let mut ledger = Ledger::default();
        for key in 0..CAPACITY as u64 {
            ledger.deposit(loan(key, 1, 1_000 + key), 0);
        }
        ledger.deposit(loan(99, 1, 5_000), 500);
        assert!(
            !ledger.can_spend(0, 99, 1, 500),
            "all hold live tokens: left out"
        );
        ledger.spend(0, 3, 1, 500).unwrap();
        ledger.deposit(loan(99, 1, 5_000), 500);
        assert!(
            ledger.can_spend(0, 99, 1, 500),
            "took the room of key 3's empty loan"
        );
        ledger.deposit(loan(98, 1, 5_000), 1_000);
        assert!(
            ledger.can_spend(0, 98, 1, 1_000),
            "took the room of key 0's lapsed loan"
        );
        assert_eq!(ledger.withdraw(0, 0), None);
    }

    #[test]
    fn the_loan_already_held_wins() {
        let mut ledger = Ledger::default();
        ledger.deposit(loan(7, 1, 100), 0);
        ledger.deposit(loan(7, 50, 100), 0);
        assert_eq!(ledger.withdraw(0, 7).map(|l| l.tokens), Some(1));
    }

    #[test]
    fn refunds_go_back_to_the_loan() {
        let mut ledger = Ledger::default();
        ledger.deposit(loan(7, 1, 100), 0);
        ledger.spend(0, 7, 1, 0).unwrap();
        ledger.refund(0, 7, 1);
        assert!(ledger.can_spend(0, 7, 1, 0));
    }
}
