//! Requests in flight. An admitted request that still owes its policies something (its `Tab`: a
//! concurrency policy's slot, a token budget's reservation) holds it until it ends, at its start
//! plus the `duration` its line records; a slot it holds for longer than an epoch (half a lease)
//! is renewed meanwhile, as the filter's timer renews it. Each request waits here, in a min-heap
//! by the time of its next event (its end, or its next renewal), for the engine to handle the
//! events due before it decides a later request: in time order, in the replay's one clock.
//!
//! Memory: one entry per request in flight, as Envoy holds one per request.

use sluice::core::algorithm::Algorithm;
use sluice::limiter::tab::{Held, Tab};
use sluice::output::metrics::UsageUnknown;
use smallvec::SmallVec;
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

/// An admitted request with a tab.
#[derive(Debug)]
pub struct Flight {
    pub tab: Tab,
    /// When it ends: its start plus its duration (never before the worker's time it was decided).
    pub end: u64,
    /// What each of its reservations is charged when it ends, by policy: priced when it was
    /// admitted, from the usage its line records.
    pub charges: SmallVec<[Charge; 1]>,
}

/// What a metered policy charges a request in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub policy: usize,
    pub tokens: u64,
    /// Why its usage is not known (the charge is then the policy's `on_unknown`), if it is not.
    pub unknown: Option<Unknown>,
}

/// Why a request's usage is not known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unknown {
    /// As the filter found: the response said none, said nonsense, or was cut first.
    Filter(UsageUnknown),
    /// The line does not say: no policy of the Envoy that wrote it read the response's body (it
    /// refused the request, or none of its metered policies admitted it).
    NotLogged,
}

impl Flight {
    /// When its next event is due: its end, or before that the renewal of a slot whose epoch is
    /// over.
    pub fn next_event(&self) -> u64 {
        let renewals = self.tab.entries.iter().filter_map(|entry| {
            let Algorithm::Concurrency(slots) = entry.tier.algorithm else {
                return None;
            };
            let epoch = slots.epoch.get();
            match entry.held {
                // The filter renews a slot once the epoch it is counted in is over...
                Held::Slot(taken) => taken.epoch.checked_add(1)?.checked_mul(epoch),
                // ...and the service's an epoch after its last renewal.
                Held::Lease { renewed, .. } => renewed.checked_add(epoch),
                Held::Reserved { .. } => None,
            }
        });
        renewals.fold(self.end, u64::min)
    }
}

/// The requests in flight, by the time of their next event.
#[derive(Debug, Default)]
pub struct Flights {
    due: BinaryHeap<Reverse<Due>>,
    /// Events at the same time come out in the order they went in.
    pushed: u64,
}

#[derive(Debug)]
struct Due {
    at: u64,
    order: u64,
    flight: Box<Flight>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Due) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Due) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    fn cmp(&self, other: &Due) -> Ordering {
        (self.at, self.order).cmp(&(other.at, other.order))
    }
}

impl Flights {
    /// Holds `flight` until its next event.
    pub fn push(&mut self, flight: Box<Flight>) {
        let at = flight.next_event();
        self.pushed += 1;
        let order = self.pushed;
        self.due.push(Reverse(Due { at, order, flight }));
    }

    /// The flight whose event is next, with its time, if that is at or before `until`.
    pub fn pop_until(&mut self, until: u64) -> Option<(u64, Box<Flight>)> {
        match self.due.peek() {
            Some(Reverse(due)) if due.at <= until => self.pop(),
            _ => None,
        }
    }

    /// The flight whose event is next, with its time.
    pub fn pop(&mut self) -> Option<(u64, Box<Flight>)> {
        let Reverse(due) = self.due.pop()?;
        Some((due.at, due.flight))
    }

    /// Requests in flight.
    pub fn len(&self) -> usize {
        self.due.len()
    }

    pub fn is_empty(&self) -> bool {
        self.due.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flight(end: u64) -> Box<Flight> {
        Box::new(Flight {
            tab: Tab::default(),
            end,
            charges: SmallVec::new(),
        })
    }

    #[test]
    fn flights_come_out_by_time_then_in_the_order_they_went_in() {
        let mut flights = Flights::default();
        for end in [30, 10, 20, 10] {
            flights.push(flight(end));
        }
        assert_eq!(flights.len(), 4);
        assert!(flights.pop_until(9).is_none());
        let (at, first) = flights.pop_until(10).unwrap();
        assert_eq!((at, first.end), (10, 10));
        let ends: Vec<u64> = std::iter::from_fn(|| flights.pop_until(25))
            .map(|(at, _)| at)
            .collect();
        assert_eq!(ends, [10, 20]);
        assert_eq!(flights.pop().map(|(at, _)| at), Some(30));
        assert!(flights.is_empty());
    }
}
