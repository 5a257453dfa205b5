//! The end of a request's life. Most policies are done with a request once they admit it; two
//! kinds are not: a concurrency policy holds a slot while the request is in flight, and a policy
//! whose cost is read from the response reserved tokens that the usage settles. The `Tab` lists
//! what an admitted request still owes its policies (`Held`); when the request ends, however it
//! ends, each entry is settled once (`Op`): a slot given back, a reservation charged up to what
//! the response used or refunded. While the request lives, its slots are renewed.
//!
//! A tab is made by the limiter with the decision, kept by the glue for the request's life, and
//! settled through the limiter again (`limiter::settle` for state in this Envoy's shared data).

use super::Basis;
use crate::config::Tier;
use crate::core::algorithm::concurrency::Taken;
use smallvec::SmallVec;

/// What an admitted request still owes, one entry per policy that is not done with it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tab {
    pub entries: SmallVec<[Entry; 1]>,
    /// The model the request body named, when a spend budget admitted it: what its response is
    /// priced at when the response names none (`usage::price`).
    pub model: Option<Vec<u8>>,
}

impl Tab {
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether some entry holds a slot: the tab must be renewed while the request lives.
    pub fn holds_slots(&self) -> bool {
        self.entries
            .iter()
            .any(|e| matches!(e.held, Held::Slot(_) | Held::Lease { .. }))
    }
}

/// One policy's claim on a request, and where the state it is settled against lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub policy: usize,
    pub table: usize,
    /// The key's hash under this Envoy's slot secret...
    pub hash: u64,
    /// ...and as other Envoys and the service know it (`limiter::Applied::key`).
    pub key: Option<u64>,
    /// The limit the claim was made under (a tier, or the emergency budget).
    pub tier: Tier,
    /// Where it was decided: the policy's own words of the slot (`Bucket`), or the emergency
    /// words of a global policy the service could not decide for (`Emergency`).
    pub basis: Basis,
    pub held: Held,
}

/// What a policy holds of a request until it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// A slot in this Envoy's shared data, counted where this says (`algorithm::concurrency`).
    Slot(Taken),
    /// A slot the service keeps, by its name, last renewed at `renewed`.
    Lease { id: u64, renewed: u64 },
    /// Tokens reserved at admission, at `at` (Unix nanoseconds, the slot's time).
    Reserved { tokens: u64, at: u64 },
}

/// What to do to an entry's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// The request ended: its slot is free.
    Release,
    /// The request lives on: its slot moves to the current epoch.
    Renew,
    /// The response used this many tokens beyond the reservation.
    Charge(u64),
    /// The response used this many tokens fewer than the reservation.
    Refund(u64),
}

/// How a request ended, as the metrics count the slots given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The response ended normally.
    Completed,
    /// The stream was reset or destroyed first: a client that left, an upstream that failed.
    Reset,
}

impl Ending {
    pub fn as_str(self) -> &'static str {
        match self {
            Ending::Completed => "completed",
            Ending::Reset => "reset",
        }
    }
}
