//! The token bucket, as GCRA: the whole state of a bucket is one timestamp, its "theoretical
//! arrival time" (TAT). A bucket is full when its TAT is not after `now`; every token taken pushes
//! the TAT one emission interval further. This is the same math as a bucket refilled continuously
//! at `requests / per` up to `burst` tokens, but it fits one compare-and-swapped integer.
//! The caller supplies `now`: this module never reads a clock.

use std::num::NonZeroU64;

use super::{interval, invalid, within, Decision, Invalid, Param, MAX_CAPACITY, MAX_COUNT};

/// A validated rate: `interval` nanoseconds per token, `burst` tokens of capacity.
/// `capacity` (= burst × interval) is at most `MAX_CAPACITY`, so `now + capacity` fits a u64.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub interval: NonZeroU64,
    pub burst: u64,
    pub capacity: u64,
}

impl Rate {
    /// `requests` per `per_nanos`, `burst` capacity; refused when the numbers make no bucket
    /// (a zero, more than one token per nanosecond, or a bucket that takes a century to fill).
    pub fn new(requests: u64, per_nanos: u64, burst: u64) -> Result<Rate, Invalid> {
        let interval = interval(requests, per_nanos)?;
        let burst = within(Param::Burst, burst, MAX_COUNT)?;
        let capacity = interval
            .get()
            .checked_mul(burst)
            .filter(|&c| c <= MAX_CAPACITY)
            .ok_or_else(|| {
                invalid(
                    Param::Burst,
                    "the bucket would take over a century to fill (burst × per / requests)",
                )
            })?;
        Ok(Rate {
            interval,
            burst,
            capacity,
        })
    }
}

/// The TAT of the same usage under another rate: the tokens the bucket still counts at `now`
/// (its debt in tokens of `from`, rounded up: what was used stays used) pushed at `to`'s
/// interval. A limit raised or lowered keeps the usage so far: 1,500 tokens used of 1,000,
/// raised to 2,000, leave 500, whatever the new rate. The same interval keeps the TAT as it is
/// (as the service's scripts do). At most `to`'s capacity past `now` plus
/// the debt it had, so a corrupt TAT stays bounded.
pub fn carry(tat: u64, now: u64, from: &Rate, to: &Rate) -> u64 {
    if from.interval == to.interval {
        return tat;
    }
    let used = tat.saturating_sub(now).div_ceil(from.interval.get());
    now.saturating_add(used.saturating_mul(to.interval.get()))
}

/// Takes `cost` tokens from the bucket whose TAT is `tat`, if it has them at `now`.
pub fn admit(rate: &Rate, tat: &mut u64, now: u64, cost: u64) -> Decision {
    let start = (*tat).max(now);
    let after = start.saturating_add(cost.saturating_mul(rate.interval.get()));
    let debt_after = after - now;
    if debt_after <= rate.capacity {
        *tat = after;
        Decision {
            allowed: true,
            remaining: (rate.capacity - debt_after) / rate.interval,
            reset_after: debt_after,
            ..Decision::default()
        }
    } else {
        let debt_now = start - now;
        Decision {
            allowed: false,
            remaining: rate.capacity.saturating_sub(debt_now) / rate.interval,
            reset_after: debt_now,
            retry_after: debt_after - rate.capacity,
            delay: 0,
        }
    }
}

/// Charges up to `cost` tokens that `admit` refused, the bucket owing at most `max_debt` tokens
/// past empty: the TAT moves by whole tokens and never past `now + (burst + max_debt) ×
/// interval`, so the debt is refilled at the rate like any spent token. Returns the tokens
/// charged.
pub fn owe(rate: &Rate, tat: &mut u64, now: u64, cost: u64, max_debt: u64) -> u64 {
    let interval = rate.interval.get();
    let start = (*tat).max(now);
    let ceiling =
        (now.saturating_add(rate.capacity)).saturating_add(max_debt.saturating_mul(interval));
    let charged = cost.min(ceiling.saturating_sub(start) / interval);
    if charged > 0 {
        *tat = start + charged * interval;
    }
    charged
}

/// Puts back `tokens` taken earlier at `interval` nanoseconds each and not spent. A bucket that
/// refilled meanwhile stays full: `admit` never counts time before `now`.
pub fn hand_back(tat: &mut u64, tokens: u64, interval: NonZeroU64) {
    *tat = tat.saturating_sub(tokens.saturating_mul(interval.get()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::duration::NANOS_PER_SEC as SEC;
    use proptest::prelude::*;

    fn per_second(requests: u64, burst: u64) -> Rate {
        Rate::new(requests, SEC, burst).unwrap()
    }

    /// Runs requests of cost 1 at the given times, returning which were allowed.
    fn run(rate: &Rate, times: &[u64]) -> Vec<bool> {
        let mut tat = 0;
        times
            .iter()
            .map(|&now| admit(rate, &mut tat, now, 1).allowed)
            .collect()
    }

    /// Decides without keeping the new state.
    fn check(rate: &Rate, tat: u64, now: u64, cost: u64) -> (Decision, u64) {
        let mut after = tat;
        (admit(rate, &mut after, now, cost), after)
    }

    #[test]
    fn a_raised_limit_keeps_the_usage_so_far() {
        // 1,000 an hour, 1,500 used (500 owed): raised to 2,000 an hour, 500 are left.
        let hour = 3600 * SEC;
        let (before, raised) = (
            Rate::new(1000, hour, 1000).unwrap(),
            Rate::new(2000, hour, 2000).unwrap(),
        );
        let now = 10 * hour;
        let mut tat = 0;
        assert!(admit(&before, &mut tat, now, 1000).allowed);
        assert_eq!(owe(&before, &mut tat, now, 500, 500), 500);
        let mut carried = carry(tat, now, &before, &raised);
        assert_eq!(check(&raised, carried, now, 500).0.remaining, 0);
        assert!(admit(&raised, &mut carried, now, 500).allowed);
        assert!(
            !admit(&raised, &mut carried, now, 1).allowed,
            "500 left, not 2,000"
        );
        // Lowered to 1,200: 1,500 used, nothing left, 300 still owed.
        let lowered = Rate::new(1200, hour, 1200).unwrap();
        let carried = carry(tat, now, &before, &lowered);
        let refused = check(&lowered, carried, now, 1).0;
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after, 301 * lowered.interval.get());
        // The same rate carries the TAT as it is; a full bucket stays full.
        assert_eq!(carry(tat, now, &before, &before), tat);
        assert_eq!(carry(now - 5, now, &before, &raised), now);
    }

    #[test]
    fn eight_rapid_requests_with_burst_five_give_five_then_three_denials() {
        let rate = per_second(1, 5);
        let t0 = 1_700_000_000 * SEC;
        let allowed = run(&rate, &[t0; 8]);
        assert_eq!(allowed, [true, true, true, true, true, false, false, false]);
    }

    #[test]
    fn two_seconds_later_two_tokens_are_back() {
        let rate = per_second(1, 5);
        let t0 = 1_700_000_000 * SEC;
        let mut times = vec![t0; 8];
        times.extend([t0 + 2 * SEC; 3]);
        let allowed = run(&rate, &times);
        assert_eq!(&allowed[8..], [true, true, false]);
    }

    #[test]
    fn denial_says_when_to_retry_and_what_is_left() {
        let rate = per_second(1, 2);
        let now = 10 * SEC;
        let (first, tat1) = check(&rate, 0, now, 1);
        assert_eq!((first.remaining, first.reset_after), (1, SEC));
        let (second, tat2) = check(&rate, tat1, now, 1);
        assert_eq!((second.remaining, second.reset_after), (0, 2 * SEC));
        let (third, tat3) = check(&rate, tat2, now, 1);
        assert!(!third.allowed);
        assert_eq!(tat3, tat2);
        assert_eq!((third.remaining, third.retry_after), (0, SEC));
        assert_eq!(third.reset_after, 2 * SEC);
    }

    #[test]
    fn a_cost_larger_than_what_is_left_is_denied_without_charge() {
        let rate = per_second(1, 5);
        let (d, tat) = check(&rate, 0, 100 * SEC, 3);
        assert_eq!(d.remaining, 2);
        let (denied, _) = check(&rate, tat, 100 * SEC, 3);
        assert!(!denied.allowed);
        assert_eq!(denied.remaining, 2);
        assert_eq!(denied.retry_after, SEC);
    }

    #[test]
    fn a_refused_cost_is_owed_up_to_the_debt_and_refilled_at_the_rate() {
        let rate = per_second(1, 5);
        let now = 100 * SEC;
        let mut tat = 0;
        assert!(admit(&rate, &mut tat, now, 3).allowed);
        assert!(!admit(&rate, &mut tat, now, 4).allowed);
        assert_eq!(owe(&rate, &mut tat, now, 4, 5), 4, "2 left, 2 owed");
        assert_eq!(tat, now + 7 * SEC);
        let after = check(&rate, tat, now, 4).0;
        assert_eq!((after.remaining, after.retry_after), (0, 6 * SEC));
        assert_eq!(owe(&rate, &mut tat, now, 9, 5), 3, "at most 5 owed");
        assert_eq!(tat, now + 10 * SEC);
        assert_eq!(owe(&rate, &mut tat, now, 1, 5), 0, "nothing more");
        assert!(
            check(&rate, tat, now + 6 * SEC, 1).0.allowed,
            "refilled at 1/s"
        );
        assert!(!check(&rate, tat, now + 6 * SEC - 1, 1).0.allowed);
    }

    #[test]
    fn rates_that_make_no_bucket_are_refused_naming_the_number() {
        let refused = |requests, per, burst| Rate::new(requests, per, burst).unwrap_err().param;
        assert_eq!(refused(0, SEC, 1), Param::Requests);
        assert_eq!(
            refused(2_000_000_000, SEC, 1),
            Param::Requests,
            "faster than 1/ns"
        );
        assert_eq!(
            refused(1, 86_400 * SEC, u64::MAX),
            Param::Burst,
            "overflows"
        );
        assert_eq!(
            refused(1, 365 * 86_400 * SEC, 200),
            Param::Burst,
            "takes centuries"
        );
        assert_eq!(refused(1, SEC, 0), Param::Burst);
        assert_eq!(refused(1, 366 * 86_400 * SEC, 1), Param::Per);
        assert_eq!(
            refused(super::super::MAX_COUNT + 1, 366 * SEC, 1),
            Param::Requests
        );
    }

    #[test]
    fn the_interval_is_rounded_up_so_the_rate_is_never_exceeded() {
        // 0.6 requests per nanosecond: rounded down, 1 ns per token would admit 1.67 times that.
        let rate = Rate::new(600_000_000, SEC, 1).unwrap();
        assert_eq!(rate.interval.get(), 2);
        let exact = Rate::new(3, SEC, 1).unwrap();
        assert_eq!(exact.interval.get(), 333_333_334);
        let admitted = run(&rate, &(0..1_000).map(|i| 1_000 + i).collect::<Vec<_>>());
        assert!(
            admitted.iter().filter(|&&a| a).count() <= 1 + 600,
            "0.6 per ns"
        );
    }

    #[test]
    fn a_corrupt_far_future_tat_denies_without_overflow() {
        let rate = per_second(1, 5);
        let (d, _) = check(&rate, u64::MAX, 5 * SEC, 1);
        assert!(!d.allowed);
    }

    /// The reference model: a bucket holding `level` token-nanoseconds, refilled one per
    /// nanosecond up to `capacity`, from which a request takes `cost × interval`.
    struct Reference {
        level: u64,
        last: u64,
    }

    impl Reference {
        fn take(&mut self, rate: &Rate, now: u64, cost: u64) -> (bool, u64) {
            self.level = (self.level + (now - self.last)).min(rate.capacity);
            self.last = now;
            let need = cost * rate.interval.get();
            let allowed = self.level >= need;
            if allowed {
                self.level -= need;
            }
            (allowed, self.level / rate.interval)
        }
    }

    proptest! {
        #[test]
        fn matches_a_continuously_refilled_bucket(
            requests in 1u64..50,
            burst in 1u64..20,
            steps in prop::collection::vec((0u64..3 * SEC, 1u64..4), 1..200),
        ) {
            let rate = per_second(requests, burst);
            let start = 1_000 * SEC;
            let mut reference = Reference { level: rate.capacity, last: start };
            let (mut tat, mut now) = (0, start);
            for (gap, cost) in steps {
                now += gap;
                let cost = cost.min(burst);
                let (d, after) = check(&rate, tat, now, cost);
                let (allowed, remaining) = reference.take(&rate, now, cost);
                prop_assert_eq!(d.allowed, allowed);
                prop_assert_eq!(d.remaining, remaining);
                if !d.allowed {
                    prop_assert!(d.retry_after > 0);
                    prop_assert!(check(&rate, tat, now + d.retry_after, cost).0.allowed);
                    prop_assert!(!check(&rate, tat, now + d.retry_after - 1, cost).0.allowed);
                }
                tat = after;
            }
        }

        #[test]
        fn never_admits_more_than_burst_plus_refill(
            burst in 1u64..50,
            gaps in prop::collection::vec(0u64..SEC / 10, 1..300),
        ) {
            let rate = per_second(10, burst);
            let start = 50 * SEC;
            let (mut tat, mut now, mut admitted) = (0, start, 0u64);
            for gap in gaps {
                now += gap;
                let d = admit(&rate, &mut tat, now, 1);
                admitted += u64::from(d.allowed);
            }
            prop_assert!(admitted <= burst + (now - start) / rate.interval);
        }
    }
}
