//! Leaky bucket as a meter that shapes rather than polices (nginx `limit_req` with `burst`):
//! requests leave at one per `interval`. A request that would have to wait at most `max_delay`
//! for its turn is admitted with that delay (the filter holds it); one that would wait longer
//! is denied at once. State: the time the queue drains (a GCRA TAT).

use std::num::NonZeroU64;

use super::{interval, period, Decision, Invalid, Param};

/// Requests leave one per `interval`; none waits longer than `max_delay` for its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drain {
    pub interval: NonZeroU64,
    pub max_delay: u64,
}

impl Drain {
    /// `requests` per `per_nanos`, none held longer than `max_delay` (at most 365 days).
    pub fn new(requests: u64, per_nanos: u64, max_delay: u64) -> Result<Drain, Invalid> {
        Ok(Drain {
            interval: interval(requests, per_nanos)?,
            max_delay: period(Param::MaxDelay, max_delay)?,
        })
    }

    /// Requests that can be admitted at once: one now and one per interval within `max_delay`.
    pub fn capacity(&self) -> u64 {
        self.max_delay / self.interval + 1
    }
}

pub fn admit(drain: &Drain, tat: &mut u64, now: u64, cost: u64) -> Decision {
    let (interval, max_delay) = (drain.interval.get(), drain.max_delay);
    let turn = (*tat).max(now);
    let delay = turn - now;
    let drained = turn.saturating_add(cost.saturating_mul(interval));
    if delay > max_delay {
        return Decision {
            allowed: false,
            remaining: 0,
            reset_after: delay,
            retry_after: delay - max_delay,
            delay: 0,
        };
    }
    *tat = drained;
    Decision {
        allowed: true,
        // Cost-1 requests that could still queue behind this one within `max_delay`.
        remaining: ((max_delay - delay) / drain.interval + 1).saturating_sub(cost),
        reset_after: drained - now,
        retry_after: 0,
        delay,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::duration::NANOS_PER_SEC as SEC;
    use proptest::prelude::*;

    fn drain(interval: u64, max_delay: u64) -> Drain {
        Drain::new(1, interval, max_delay).unwrap()
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn spaces_a_burst_at_the_rate_and_refuses_what_would_wait_too_long() {
        let mut tat = 0;
        let now = 50 * SEC;
        let delays: Vec<Option<u64>> = (0..5)
            .map(|_| {
                let d = admit(&drain(100 * MS, 250 * MS), &mut tat, now, 1);
                d.allowed.then_some(d.delay)
            })
            .collect();
        assert_eq!(
            delays,
            [Some(0), Some(100 * MS), Some(200 * MS), None, None]
        );
        let denied = admit(&drain(100 * MS, 250 * MS), &mut tat, now, 1);
        assert_eq!(denied.retry_after, 50 * MS);
    }

    #[test]
    fn remaining_counts_what_could_still_queue_behind_a_costly_request() {
        let mut tat = 0;
        let first = admit(&drain(100 * MS, 500 * MS), &mut tat, SEC, 3);
        assert_eq!(first.remaining, 3);
        let queued = (0..10)
            .filter(|_| admit(&drain(100 * MS, 500 * MS), &mut tat, SEC, 1).allowed)
            .count();
        assert_eq!(queued, 3);
    }

    proptest! {
        /// Released requests are never closer together than the interval, and never held longer
        /// than `max_delay`.
        #[test]
        fn releases_at_the_rate_within_the_delay_bound(
            gaps in prop::collection::vec(0u64..300 * MS, 1..200),
        ) {
            let (interval, max_delay) = (100 * MS, 500 * MS);
            let mut tat = 0;
            let mut now = 10 * SEC;
            let mut releases = Vec::new();
            for gap in gaps {
                now += gap;
                let d = admit(&drain(interval, max_delay), &mut tat, now, 1);
                if d.allowed {
                    prop_assert!(d.delay <= max_delay);
                    releases.push(now + d.delay);
                }
            }
            prop_assert!(releases.windows(2).all(|w| w[1] - w[0] >= interval));
        }
    }
}
