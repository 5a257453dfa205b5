//! Sliding window, the two-counter estimate: the count of the current epoch-aligned window plus
//! the previous window's count weighted by how much of it the last `window` still covers. No
//! 2 × limit burst at a boundary; the estimate assumes the previous window's requests were
//! spread evenly.

use super::periods::{self, counts};
use super::{Debt, Decision, Window};

/// State: the current window index, its count, and the previous window's count.
pub const COLUMNS: usize = periods::COLUMNS;

/// Admits `cost` if `previous × (1 - elapsed/window) + current + cost <= limit`. Products are
/// taken in u128: counts times nanoseconds overflow u64.
pub fn admit(window: &Window, state: &mut [u64], now: u64, cost: u64) -> Decision {
    let (limit, length) = (window.limit, window.length.get());
    let index = now / window.length;
    let (current, previous) = counts(state, index);
    let elapsed = now - index * length;
    let (w, limit_w) = (u128::from(length), u128::from(limit) * u128::from(length));
    let used_w = weight(current, previous, length, elapsed);
    let need_w = u128::from(cost) * w;
    // Until both counts have faded: the window after the current one if it holds a count.
    let (to_next, to_after_next) = (length - elapsed, 2 * length - elapsed);
    if used_w.saturating_add(need_w) > limit_w {
        return Decision {
            allowed: false,
            remaining: to_u64(limit_w.saturating_sub(used_w) / w),
            reset_after: if current > 0 { to_after_next } else { to_next },
            retry_after: retry_after(limit, length, current, previous, elapsed, cost),
            delay: 0,
        };
    }
    if let [stored, stored_current, stored_previous] = state {
        (*stored, *stored_current, *stored_previous) = (index, current + cost, previous);
    }
    Decision {
        allowed: true,
        remaining: to_u64((limit_w - used_w - need_w) / w),
        reset_after: to_after_next,
        ..Decision::default()
    }
}

/// Charges up to `cost` tokens that `admit` refused to the current window's count, so that the
/// estimate stays at most `limit + max_debt`; the debt fades with the window as any count does.
/// Returns the tokens charged.
pub fn owe(window: &Window, state: &mut [u64], now: u64, cost: u64, max_debt: u64) -> u64 {
    let length = window.length.get();
    let index = now / window.length;
    let (current, previous) = counts(state, index);
    let used_w = weight(current, previous, length, now - index * length);
    let ceiling_w = u128::from(window.limit.saturating_add(max_debt)) * u128::from(length);
    let room = to_u64(ceiling_w.saturating_sub(used_w) / u128::from(length));
    let charged = cost.min(room);
    if let [stored, stored_current, stored_previous] = state {
        if charged > 0 {
            (*stored, *stored_current, *stored_previous) = (index, current + charged, previous);
        }
    }
    charged
}

/// Gives back `tokens` taken at `taken_at` from the window that counted them, the current or the
/// previous one; a count older than that has faded. Returns the tokens given back.
pub fn refund(window: &Window, state: &mut [u64], now: u64, tokens: u64, taken_at: u64) -> u64 {
    let (index, taken) = (now / window.length, taken_at / window.length);
    periods::take_back(state, index, taken, tokens).unwrap_or(0)
}

/// Until the estimate has room for `cost`: later in this window if only the previous window's
/// weight is in the way, otherwise into the next window, where this window's count is the one
/// that fades.
fn retry_after(
    limit: u64,
    window: u64,
    current: u64,
    previous: u64,
    elapsed: u64,
    cost: u64,
) -> u64 {
    // Time into a window (with `fading` as the previous count and `fresh` current) at which
    // fading × (window - t) / window + fresh + cost <= limit, if any.
    let fits_at = |fading: u64, fresh: u64| -> Option<u64> {
        let room = limit.checked_sub(fresh.checked_add(cost)?)?;
        if fading <= room {
            return Some(0);
        }
        let fading_w = u128::from(window) * u128::from(fading - room);
        Some(to_u64(fading_w.div_ceil(u128::from(fading))))
    };
    match fits_at(previous, current) {
        Some(t) => t.saturating_sub(elapsed).max(1),
        None => match fits_at(current, 0) {
            Some(t) => window - elapsed + t,
            None => 2 * window - elapsed,
        },
    }
}

fn to_u64(n: u128) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// The estimate of the last window's count, times the window's length: the previous window's
/// count weighted by how much of it the last `length` still covers, and the current one's.
fn weight(current: u64, previous: u64, length: u64, elapsed: u64) -> u128 {
    let fading = u128::from(previous) * u128::from(length - elapsed);
    fading.saturating_add(u128::from(current) * u128::from(length))
}

/// What the estimate still counts: it fades with the previous window's count, and is gone once
/// the window after the current one is over.
pub fn debt(window: &Window, state: &[u64], now: u64) -> Debt {
    let length = window.length.get();
    let index = now / length;
    let (current, previous) = counts(state, index);
    let used_w = weight(current, previous, length, now - index * length);
    Debt::of(
        used_w,
        u128::from(window.limit) * u128::from(length),
        length.into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::duration::NANOS_PER_SEC as SEC;
    use proptest::prelude::*;

    fn per(limit: u64, length: u64) -> Window {
        Window::new(limit, length).unwrap()
    }

    #[test]
    fn caps_the_boundary_burst_that_a_fixed_window_lets_through() {
        let mut state = [0; COLUMNS];
        let end_of_window = 10 * SEC - 1;
        let late = (0..5)
            .filter(|_| admit(&per(5, SEC), &mut state, end_of_window, 1).allowed)
            .count();
        let early = (0..5)
            .filter(|_| admit(&per(5, SEC), &mut state, end_of_window + 2, 1).allowed)
            .count();
        assert_eq!((late, early), (5, 0));
    }

    #[test]
    fn the_previous_window_fades_linearly() {
        let mut state = [0; COLUMNS];
        (0..10).for_each(|_| assert!(admit(&per(10, SEC), &mut state, 10 * SEC, 1).allowed));
        // Half-way through the next window the estimate is 10 × 0.5 = 5: room for 5.
        let half = 11 * SEC + SEC / 2;
        let passed = (0..10)
            .filter(|_| admit(&per(10, SEC), &mut state, half, 1).allowed)
            .count();
        assert_eq!(passed, 5);
    }

    #[test]
    fn reset_is_when_the_admitted_request_has_faded() {
        let mut state = [0; COLUMNS];
        let now = 5 * SEC + 300_000_000;
        let d = admit(&per(3, SEC), &mut state, now, 1);
        assert_eq!(d.reset_after, 1_700_000_000);
        assert_eq!(
            debt(&per(3, SEC), &state, now + d.reset_after),
            Debt::default()
        );
        assert_ne!(
            debt(&per(3, SEC), &state, now + d.reset_after - 1),
            Debt::default()
        );
    }

    #[test]
    fn a_refused_cost_is_owed_up_to_the_debt_and_fades_with_the_window() {
        let mut state = [0; COLUMNS];
        let t = 10 * SEC;
        assert!(admit(&per(4, SEC), &mut state, t, 3).allowed);
        assert!(!admit(&per(4, SEC), &mut state, t, 3).allowed);
        assert_eq!(owe(&per(4, SEC), &mut state, t, 3, 4), 3);
        assert_eq!(state, [10, 6, 0]);
        assert_eq!(
            owe(&per(4, SEC), &mut state, t, 9, 4),
            2,
            "estimate at most 8"
        );
        // Next window, half-way: 8 × 0.5 = 4, the limit: nothing fits until it fades more.
        assert!(!admit(&per(4, SEC), &mut state, 11 * SEC + SEC / 2, 1).allowed);
        assert!(admit(&per(4, SEC), &mut state, 11 * SEC + 3 * SEC / 4, 1).allowed);
    }

    #[test]
    fn owes_what_the_estimate_still_counts() {
        let mut state = [0; COLUMNS];
        (0..4).for_each(|_| assert!(admit(&per(4, SEC), &mut state, 5 * SEC, 1).allowed));
        let full = debt(&per(4, SEC), &state, 5 * SEC + SEC / 2);
        assert_eq!((full.tokens, full.share), (4, super::super::FULL_SHARE));
        let half = debt(&per(4, SEC), &state, 6 * SEC + SEC / 2);
        assert_eq!((half.tokens, half.share), (2, super::super::FULL_SHARE / 2));
        assert_eq!(debt(&per(4, SEC), &state, 7 * SEC), Debt::default());
    }

    #[test]
    fn a_corrupt_window_index_or_count_denies_without_overflow() {
        let mut state = [u64::MAX, u64::MAX, u64::MAX];
        let now = u64::MAX / SEC * SEC;
        assert!(
            admit(&per(3, SEC), &mut state, now, 1).allowed,
            "no window's counts"
        );
        let mut state = [7, u64::MAX, u64::MAX];
        assert!(!admit(&per(3, SEC), &mut state, 7 * SEC + 1, 1).allowed);
    }

    /// Reference: the same estimate in exact rational arithmetic from the full request history.
    fn estimate(history: &[(u64, u64)], now: u64, window: u64) -> (u128, u128) {
        let index = now / window;
        let count_in = |i: u64| -> u128 {
            history
                .iter()
                .filter(|(t, _)| t / window == i)
                .map(|(_, c)| u128::from(*c))
                .sum()
        };
        let elapsed = u128::from(now - index * window);
        let previous = if index == 0 { 0 } else { count_in(index - 1) };
        (
            previous * (u128::from(window) - elapsed) + count_in(index) * u128::from(window),
            u128::from(window),
        )
    }

    proptest! {
        #[test]
        fn matches_the_estimate_over_the_full_history(
            limit in 1u64..20,
            steps in prop::collection::vec((0u64..SEC / 3, 1u64..4), 1..150),
        ) {
            let mut state = [0; COLUMNS];
            let mut history = Vec::new();
            let mut now = 1_000 * SEC;
            for (gap, cost) in steps {
                now += gap;
                let cost = cost.min(limit);
                let (used, w) = estimate(&history, now, SEC);
                let expected = used + u128::from(cost) * w <= u128::from(limit) * w;
                let d = admit(&per(limit, SEC), &mut state, now, cost);
                prop_assert_eq!(d.allowed, expected);
                if d.allowed {
                    history.push((now, cost));
                } else {
                    let mut probe = state;
                    prop_assert!(admit(&per(limit, SEC), &mut probe, now + d.retry_after, cost).allowed);
                    let mut early = state;
                    prop_assert!(d.retry_after == 1 || !admit(&per(limit, SEC), &mut early, now + d.retry_after - 1, cost).allowed);
                }
            }
        }
    }
}
