//! Fixed window: at most `limit` requests per window, windows aligned to the Unix epoch
//! (window index = floor(now / window)) so every Envoy and Redis agree on the boundaries. Cheap
//! and exact within a window, but a client can pass up to 2 × limit across a boundary. A window
//! on a calendar (`Window::calendar`) takes the calendar's periods instead, indexed by their
//! start in seconds.

use super::{Debt, Decision, Window};

/// State: the window index and the count in it.
pub const COLUMNS: usize = 2;

pub fn admit(window: &Window, state: &mut [u64], now: u64, cost: u64) -> Decision {
    let limit = window.limit;
    let (index, end) = span(window, now);
    let count = count_in(state, index);
    let reset_after = end.saturating_sub(now);
    if count.saturating_add(cost) > limit {
        return Decision {
            allowed: false,
            remaining: limit.saturating_sub(count),
            reset_after,
            retry_after: reset_after,
            delay: 0,
        };
    }
    if let [stored, stored_count] = state {
        (*stored, *stored_count) = (index, count + cost);
    }
    Decision {
        allowed: true,
        remaining: limit - count - cost,
        reset_after,
        ..Decision::default()
    }
}

/// Charges up to `cost` tokens that `admit` refused, the window counting at most `limit +
/// max_debt`; the debt ends with the window, as any count. Returns the tokens charged.
pub fn owe(window: &Window, state: &mut [u64], now: u64, cost: u64, max_debt: u64) -> u64 {
    let index = span(window, now).0;
    let count = count_in(state, index);
    let ceiling = window.limit.saturating_add(max_debt);
    let after = count.saturating_add(cost).min(ceiling).max(count);
    if let [stored, stored_count] = state {
        if after > count {
            (*stored, *stored_count) = (index, after);
        }
    }
    after - count
}

/// Gives back `tokens` taken at `taken_at`, if that window is still the current one: an ended
/// window's count means nothing any more. Returns the tokens given back.
pub fn refund(window: &Window, state: &mut [u64], now: u64, tokens: u64, taken_at: u64) -> u64 {
    let index = span(window, now).0;
    match state {
        [stored, count] if *stored == index && span(window, taken_at).0 == index => {
            let back = tokens.min(*count);
            *count -= back;
            back
        }
        _ => 0,
    }
}

/// The index of the window that holds `now`, and when it ends.
fn span(window: &Window, now: u64) -> (u64, u64) {
    match window.calendar {
        None => {
            let index = now / window.length;
            (index, (index + 1).saturating_mul(window.length.get()))
        }
        Some(calendar) => {
            let period = calendar.period(now);
            (calendar.index(&period), period.end)
        }
    }
}

/// When window `index` ends.
pub fn end_of(window: &Window, index: u64) -> u64 {
    match window.calendar {
        None => index.saturating_add(1).saturating_mul(window.length.get()),
        Some(calendar) => calendar.end_of(index),
    }
}

/// The count of window `index`: the stored one if it is that window's.
fn count_in(state: &[u64], index: u64) -> u64 {
    match state {
        [stored, count] if *stored == index => *count,
        _ => 0,
    }
}

/// What the current window has counted; a window's count means nothing once it is over.
pub fn debt(window: &Window, state: &[u64], now: u64) -> Debt {
    let count = count_in(state, span(window, now).0);
    Debt::of(count.into(), window.limit.into(), 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raised_limit_keeps_the_count_of_its_window() {
        // 1,500 counted of 1,000 (500 owed), raised to 2,000 in the same window: 500 left.
        let hour = 3_600_000_000_000;
        let (before, raised) = (
            Window::new(1000, hour).unwrap(),
            Window::new(2000, hour).unwrap(),
        );
        let now = 10 * hour + 7;
        let mut state = [0; COLUMNS];
        assert!(admit(&before, &mut state, now, 1000).allowed);
        assert_eq!(owe(&before, &mut state, now, 500, 500), 500);
        assert_eq!(admit(&raised, &mut state.clone(), now, 0).remaining, 500);
        assert!(admit(&raised, &mut state, now, 500).allowed);
        assert!(!admit(&raised, &mut state, now, 1).allowed);
        let lowered = Window::new(1200, hour).unwrap();
        assert_eq!(admit(&lowered, &mut state, now, 0).remaining, 0);
    }
    use crate::core::duration::NANOS_PER_SEC as SEC;
    use proptest::prelude::*;

    fn per(limit: u64, length: u64) -> Window {
        Window::new(limit, length).unwrap()
    }

    #[test]
    fn counts_within_a_window_and_starts_over_at_the_next() {
        let mut state = [0; COLUMNS];
        let t = 100 * SEC;
        let allowed: Vec<bool> = (0..4)
            .map(|_| admit(&per(3, SEC), &mut state, t, 1).allowed)
            .collect();
        assert_eq!(allowed, [true, true, true, false]);
        let denied = admit(&per(3, SEC), &mut state, t + SEC / 4, 1);
        assert_eq!(
            (denied.retry_after, denied.reset_after),
            (3 * SEC / 4, 3 * SEC / 4)
        );
        assert!(admit(&per(3, SEC), &mut state, t + SEC, 1).allowed);
    }

    #[test]
    fn a_boundary_lets_twice_the_limit_through_in_a_short_span() {
        let mut state = [0; COLUMNS];
        let end_of_window = 10 * SEC - 1;
        let late = (0..5)
            .filter(|_| admit(&per(5, SEC), &mut state, end_of_window, 1).allowed)
            .count();
        let early = (0..5)
            .filter(|_| admit(&per(5, SEC), &mut state, end_of_window + 2, 1).allowed)
            .count();
        assert_eq!(late + early, 10, "2 × limit within 2 ns");
    }

    #[test]
    fn a_refused_cost_is_counted_up_to_the_debt_and_keeps_the_window_over() {
        let mut state = [0; COLUMNS];
        let t = 100 * SEC;
        assert!(admit(&per(10, SEC), &mut state, t, 8).allowed);
        assert!(!admit(&per(10, SEC), &mut state, t, 5).allowed);
        assert_eq!(owe(&per(10, SEC), &mut state, t, 5, 10), 5);
        assert_eq!(state, [100, 13]);
        assert!(
            !admit(&per(10, SEC), &mut state, t, 0).allowed,
            "over: even 0"
        );
        assert_eq!(owe(&per(10, SEC), &mut state, t, 30, 10), 7, "at most 20");
        assert!(admit(&per(10, SEC), &mut state, t + SEC, 10).allowed);
    }

    #[test]
    fn owes_its_count_until_the_window_is_over() {
        let mut state = [0; COLUMNS];
        admit(&per(4, SEC), &mut state, 5 * SEC + 1, 1);
        let owed = debt(&per(4, SEC), &state, 6 * SEC - 1);
        assert_eq!((owed.tokens, owed.share), (1, super::super::FULL_SHARE / 4));
        assert_eq!(debt(&per(4, SEC), &state, 6 * SEC), Debt::default());
    }

    #[test]
    fn a_corrupt_count_or_a_clock_at_its_end_denies_without_overflow() {
        let mut state = [u64::MAX / SEC, u64::MAX];
        assert!(!admit(&per(3, SEC), &mut state, u64::MAX, u64::MAX).allowed);
    }

    fn berlin_month(limit: u64) -> Window {
        use crate::core::calendar::{Calendar, Starts, Unit};
        let month = Calendar::new("Europe/Berlin", Unit::Month, Starts::midnight()).unwrap();
        Window::calendar(limit, month).unwrap()
    }

    fn at(text: &str) -> u64 {
        crate::core::time::parse_rfc3339(text).unwrap()
    }

    #[test]
    fn a_monthly_window_in_berlin_resets_at_local_midnight_across_summer_time() {
        let window = berlin_month(3);
        let mut state = [0; COLUMNS];
        // March 2026 in Berlin ends at 2026-03-31T22:00Z, summer time having begun on the 29th.
        let late_march = at("2026-03-31T21:59:59Z");
        for _ in 0..3 {
            assert!(admit(&window, &mut state, late_march, 1).allowed);
        }
        let refused = admit(&window, &mut state, late_march, 1);
        assert!(!refused.allowed);
        assert_eq!((refused.retry_after, refused.reset_after), (SEC, SEC));
        assert!(admit(&window, &mut state, at("2026-03-31T22:00:00Z"), 3).allowed);
        // October the other way: the month ends at 2026-10-31T23:00Z, winter time again.
        let late_october = at("2026-10-31T22:30:00Z");
        assert!(admit(&window, &mut state, late_october, 3).allowed);
        let refused = admit(&window, &mut state, late_october, 1);
        assert_eq!(refused.retry_after, 30 * 60 * SEC);
        assert!(!admit(&window, &mut state, at("2026-10-31T22:59:59Z"), 1).allowed);
        assert!(admit(&window, &mut state, at("2026-10-31T23:00:00Z"), 1).allowed);
    }

    #[test]
    fn a_token_budget_on_a_calendar_window_owes_until_the_month_ends() {
        let (window, month_end) = (berlin_month(100), at("2026-06-30T22:00:00Z"));
        let mut state = [0; COLUMNS];
        let mid_june = at("2026-06-15T10:00:00Z");
        assert!(admit(&window, &mut state, mid_june, 80).allowed);
        assert_eq!(owe(&window, &mut state, mid_june, 50, 1000), 50);
        assert_eq!(
            refund(&window, &mut state, mid_june + SEC, 10, mid_june),
            10
        );
        assert_eq!(debt(&window, &state, mid_june).tokens, 100);
        let over = admit(&window, &mut state, mid_june, 1);
        assert_eq!(over.reset_after, month_end - mid_june);
        let window_algorithm = super::super::Algorithm::FixedWindow(window);
        assert_eq!(window_algorithm.idle_at(&state, mid_june), month_end);
        // Taken in June, given back in July: June's count is gone, nothing to give.
        assert_eq!(refund(&window, &mut state, month_end, 10, mid_june), 0);
        assert!(admit(&window, &mut state, month_end, 100).allowed);
    }

    proptest! {
        /// Against the obvious model: a map from window index to count.
        #[test]
        fn matches_a_count_per_window(
            limit in 1u64..20,
            steps in prop::collection::vec((0u64..SEC / 2, 1u64..4), 1..200),
        ) {
            let mut state = [0; COLUMNS];
            let mut counts = std::collections::HashMap::new();
            let mut now = 1_000 * SEC;
            for (gap, cost) in steps {
                now += gap;
                let cost = cost.min(limit);
                let count = counts.entry(now / SEC).or_insert(0u64);
                let expected = *count + cost <= limit;
                if expected {
                    *count += cost;
                }
                prop_assert_eq!(admit(&per(limit, SEC), &mut state, now, cost).allowed, expected);
            }
        }
    }
}
