//! The keys of local metered policies in debt, as this worker knows them: a key enters when a
//! charge of this worker's takes it past its limit (`Settled::Done::into_debt`), and leaves when
//! a look finds refill has paid its debt back. `sluice_keys_in_debt` is the sum over an Envoy's
//! workers: a key counts once, with the worker whose charge put it in debt.
//!
//! Looking costs a shared-data read per key, so a worker follows at most `MAX_DEBTORS` keys
//! (the rest are not counted) and looks once a second.

use crate::config::Tier;

/// Keys a worker follows at most.
pub const MAX_DEBTORS: usize = 1024;

/// A key in debt: its policy, its hash in the policy's table, the limit it runs at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Debtor {
    pub policy: usize,
    pub hash: u64,
    pub tier: Tier,
}

/// The keys this worker put in debt and has not yet seen pay it back.
#[derive(Debug, Default)]
pub struct Debtors {
    keys: Vec<Debtor>,
}

impl Debtors {
    /// Follows `debtor`; false if it is followed already or there is no room.
    pub fn enter(&mut self, debtor: Debtor) -> bool {
        let known = |d: &Debtor| d.policy == debtor.policy && d.hash == debtor.hash;
        if self.keys.len() >= MAX_DEBTORS || self.keys.iter().any(known) {
            return false;
        }
        self.keys.push(debtor);
        true
    }

    /// Forgets the keys that no longer owe (`owes` false): each one's policy, for the gauge.
    pub fn review(&mut self, mut owes: impl FnMut(&Debtor) -> bool) -> Vec<usize> {
        let mut repaid = Vec::new();
        self.keys.retain(|d| {
            let still = owes(d);
            if !still {
                repaid.push(d.policy);
            }
            still
        });
        repaid
    }

    /// Forgets every key (a new configuration starts following its own): each one's policy.
    pub fn forget(&mut self) -> Vec<usize> {
        self.keys.drain(..).map(|d| d.policy).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::algorithm::{Algorithm, Rate};
    use std::collections::HashSet;

    fn debtor(policy: usize, hash: u64) -> Debtor {
        Debtor {
            policy,
            hash,
            tier: Tier {
                algorithm: Algorithm::TokenBucket(Rate::new(10, 1_000_000_000, 10).unwrap()),
                requests: 10,
                per_nanos: 1_000_000_000,
            },
        }
    }

    #[test]
    fn a_key_is_followed_once_until_it_no_longer_owes() {
        let mut debtors = Debtors::default();
        assert!(debtors.enter(debtor(0, 7)));
        assert!(!debtors.enter(debtor(0, 7)), "followed already");
        assert!(debtors.enter(debtor(1, 7)), "another policy's key");
        assert!(debtors.review(|_| true).is_empty());
        assert_eq!(debtors.review(|d| d.policy == 1), [0]);
        assert_eq!(debtors.forget(), [1]);
        assert!(debtors.is_empty());
    }

    #[test]
    fn at_most_max_debtors_are_followed() {
        let mut debtors = Debtors::default();
        let entered = (0..MAX_DEBTORS as u64 + 5)
            .filter(|&h| debtors.enter(debtor(0, h)))
            .count();
        assert_eq!(entered, MAX_DEBTORS);
        let hashes: HashSet<u64> = debtors.keys.iter().map(|d| d.hash).collect();
        assert_eq!(hashes.len(), MAX_DEBTORS);
    }
}
