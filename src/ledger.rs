//! One worker's leases on local buckets: tokens it took from a key's shared bucket in one go
//! (a local policy's `lease`) and spends by itself, so a hot key costs no shared-data read or
//! CAS until they run out. Leased tokens are real debits of the shared bucket: the bucket's limit
//! over time stays exact. Tokens a worker still holds when it next visits the bucket are handed
//! back in the same CAS; a worker spends them only for `LEASE_TTL`, so a key's short burst can
//! exceed `burst` by no more than what the workers hold.
//!
//! Only a hot key leases: one back at this worker's bucket within `LEASE_TTL` of its last visit.
//! A first visit leaves an empty lease that marks the key as seen. So a key too cold to spend a
//! lease in time never takes one, and tokens are lost (an under-admission) only when a key stops
//! coming back right after a lease and its lapsed lease is pushed out of a full ledger.

use crate::algorithm::Decision;
use crate::duration::NANOS_PER_SEC;
use smallvec::SmallVec;

/// How long a worker spends leased tokens; afterwards it hands them back on its next visit.
/// Well under `table::RECENT`, so the slot of a key served from leases stays in active use.
pub const LEASE_TTL: u64 = NANOS_PER_SEC / 4;
/// Leases one worker holds at most: its hottest keys.
pub const CAPACITY: usize = 16;

/// Tokens of one policy's bucket for one key, held by this worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub policy: usize,
    pub key: u64,
    pub tokens: u64,
    /// Bucket time per token when taken: what handing a token back returns.
    pub interval: u64,
    /// Until when the tokens may be spent.
    pub expires: u64,
    /// What the shared bucket had left after the lease, and when it would have been full:
    /// what the rate-limit headers report while the lease lasts.
    pub remaining: u64,
    pub reset_at: u64,
}

impl Lease {
    /// Whether `cost` of its tokens can be spent at `now`.
    fn covers(&self, cost: u64, now: u64) -> bool {
        self.expires > now && self.tokens >= cost
    }
}

/// A worker's leases. Small and scanned linearly: it only ever holds a few hot keys.
#[derive(Debug, Default)]
pub struct Ledger {
    leases: SmallVec<[Lease; CAPACITY]>,
}

impl Ledger {
    /// Holds no lease (always, unless a local policy leases): requests then skip the ledger.
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// Whether `cost` tokens of the policy's bucket for `key` can be spent here at `now`.
    pub fn can_spend(&self, policy: usize, key: u64, cost: u64, now: u64) -> bool {
        self.find(policy, key).is_some_and(|l| l.covers(cost, now))
    }

    /// Spends `cost` leased tokens, if `can_spend`; the decision reports the bucket as the lease
    /// left it plus the tokens still held.
    pub fn spend(&mut self, policy: usize, key: u64, cost: u64, now: u64) -> Option<Decision> {
        let lease = self.find_mut(policy, key).filter(|l| l.covers(cost, now))?;
        lease.tokens -= cost;
        Some(Decision {
            allowed: true,
            remaining: lease.remaining + lease.tokens,
            reset_after: lease.reset_at.saturating_sub(now),
            ..Decision::default()
        })
    }

    /// Gives back tokens spent for a request that was denied after all.
    pub fn refund(&mut self, policy: usize, key: u64, tokens: u64) {
        if let Some(lease) = self.find_mut(policy, key) {
            lease.tokens += tokens;
        }
    }

    /// Takes the lease out, expired or not: its tokens go back to the bucket with the next write.
    pub fn withdraw(&mut self, policy: usize, key: u64) -> Option<Lease> {
        let at = self
            .leases
            .iter()
            .position(|l| l.policy == policy && l.key == key)?;
        Some(self.leases.swap_remove(at))
    }

    /// Keeps a lease. A full ledger makes room from a lease that holds no tokens, else from one
    /// that lapsed (its tokens are lost); full of live tokens, it leaves the newcomer out. A
    /// lease the ledger already holds for the same bucket wins. (Both only lose tokens when a
    /// request waited for the service meanwhile: otherwise the key's own lease was withdrawn.)
    pub fn deposit(&mut self, lease: Lease, now: u64) {
        if self.find(lease.policy, lease.key).is_some() {
            return;
        }
        if self.leases.len() >= CAPACITY {
            let room = (self.leases.iter().position(|l| l.tokens == 0))
                .or_else(|| self.leases.iter().position(|l| l.expires <= now));
            let Some(at) = room else {
                return;
            };
            self.leases.swap_remove(at);
        }
        self.leases.push(lease);
    }

    fn find(&self, policy: usize, key: u64) -> Option<&Lease> {
        self.leases
            .iter()
            .find(|l| l.policy == policy && l.key == key)
    }

    fn find_mut(&mut self, policy: usize, key: u64) -> Option<&mut Lease> {
        self.leases
            .iter_mut()
            .find(|l| l.policy == policy && l.key == key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(key: u64, tokens: u64, expires: u64) -> Lease {
        Lease {
            policy: 0,
            key,
            tokens,
            interval: 10,
            expires,
            remaining: 5,
            reset_at: 1_000,
        }
    }

    #[test]
    fn spends_until_the_tokens_or_the_time_run_out() {
        let mut ledger = Ledger::default();
        ledger.deposit(lease(7, 2, 100), 0);
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
        ledger.deposit(lease(7, 3, 100), 0);
        assert_eq!(ledger.withdraw(0, 7).map(|l| l.tokens), Some(3));
        assert_eq!(ledger.withdraw(0, 7), None);
    }

    #[test]
    fn a_full_ledger_makes_room_from_empty_then_lapsed_leases_never_live_tokens() {
        let mut ledger = Ledger::default();
        for key in 0..CAPACITY as u64 {
            ledger.deposit(lease(key, 1, 1_000 + key), 0);
        }
        ledger.deposit(lease(99, 1, 5_000), 500);
        assert!(
            !ledger.can_spend(0, 99, 1, 500),
            "all hold live tokens: left out"
        );
        ledger.spend(0, 3, 1, 500).unwrap();
        ledger.deposit(lease(99, 1, 5_000), 500);
        assert!(
            ledger.can_spend(0, 99, 1, 500),
            "took the room of key 3's empty lease"
        );
        ledger.deposit(lease(98, 1, 5_000), 1_000);
        assert!(
            ledger.can_spend(0, 98, 1, 1_000),
            "took the room of key 0's lapsed lease"
        );
        assert_eq!(ledger.withdraw(0, 0), None);
    }

    #[test]
    fn the_lease_already_held_wins() {
        let mut ledger = Ledger::default();
        ledger.deposit(lease(7, 1, 100), 0);
        ledger.deposit(lease(7, 50, 100), 0);
        assert_eq!(ledger.withdraw(0, 7).map(|l| l.tokens), Some(1));
    }

    #[test]
    fn refunds_go_back_to_the_lease() {
        let mut ledger = Ledger::default();
        ledger.deposit(lease(7, 1, 100), 0);
        ledger.spend(0, 7, 1, 0).unwrap();
        ledger.refund(0, 7, 1);
        assert!(ledger.can_spend(0, 7, 1, 0));
    }
}
