//! Sliding log: the admission times of the last `limit` tokens, so the limit holds exactly over
//! any span of `window`. State per key is one word per token of the limit (8 × limit bytes),
//! which is why the configuration caps `requests` for this algorithm.

use super::{Debt, Decision, Window};

/// A time is live while it is within the last `window`; 0 marks an unused entry.
fn live(time: u64, now: u64, window: u64) -> bool {
    time > 0 && time.saturating_add(window) > now
}

/// Admits `cost` if fewer than `limit - cost + 1` entries are live, writing `now` over `cost`
/// expired or unused entries.
pub fn admit(window: &Window, state: &mut [u64], now: u64, cost: u64) -> Decision {
    let (limit, window) = (window.limit, window.length.get());
    let mut times: Vec<u64> = state
        .iter()
        .copied()
        .filter(|&t| live(t, now, window))
        .collect();
    times.sort_unstable();
    let count = times.len() as u64;
    // Live times are within the last window: `t + window > now`, so `t + window - now` >= 1.
    let until_gone = |t: &u64| t.saturating_add(window) - now;
    let reset_after = times.last().map_or(0, until_gone);
    let free = (state.len() - times.len()) as u64;
    if count.saturating_add(cost) > limit || cost > free {
        // The oldest `count + cost - limit` entries must expire first.
        let must_expire = count.saturating_add(cost).saturating_sub(limit).max(1);
        let oldest = usize::try_from(must_expire - 1)
            .ok()
            .and_then(|i| times.get(i));
        let retry_after = oldest.map_or(window, until_gone);
        return Decision {
            allowed: false,
            remaining: limit.saturating_sub(count),
            reset_after,
            retry_after,
            delay: 0,
        };
    }
    let mut placed = 0;
    for time in state.iter_mut() {
        if placed < cost && !live(*time, now, window) {
            *time = now;
            placed += 1;
        }
    }
    Decision {
        allowed: true,
        remaining: limit - count - cost,
        reset_after: window,
        ..Decision::default()
    }
}

/// Charges up to `cost` tokens that `admit` refused as entries at `now`, at most `limit +
/// max_debt` of them live (and no more than the state's free slots: a log that owes keeps
/// `limit + max_debt` words). Each leaves the window as any entry does. Returns the tokens charged.
pub fn owe(window: &Window, state: &mut [u64], now: u64, cost: u64, max_debt: u64) -> u64 {
    let length = window.length.get();
    let live_now = state.iter().filter(|&&t| live(t, now, length)).count() as u64;
    let room = (window.limit.saturating_add(max_debt)).saturating_sub(live_now);
    let mut charged = 0;
    for time in state.iter_mut() {
        if charged < cost.min(room) && !live(*time, now, length) {
            *time = now;
            charged += 1;
        }
    }
    charged
}

/// The entries still in the window.
pub fn debt(window: &Window, state: &[u64], now: u64) -> Debt {
    let length = window.length.get();
    let live = state.iter().filter(|&&t| live(t, now, length)).count() as u64;
    Debt::of(live.into(), window.limit.into(), 1)
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
    fn holds_the_limit_over_any_span_of_the_window() {
        let mut log = [0; 5];
        let end_of_window = 10 * SEC - 1;
        let late = (0..5)
            .filter(|_| admit(&per(5, SEC), &mut log, end_of_window, 1).allowed)
            .count();
        let early = (0..5)
            .filter(|_| admit(&per(5, SEC), &mut log, end_of_window + 2, 1).allowed)
            .count();
        assert_eq!((late, early), (5, 0));
        let denied = admit(&per(5, SEC), &mut log, 10 * SEC, 1);
        assert_eq!(
            denied.retry_after,
            SEC - 1,
            "the oldest leaves the window then"
        );
        assert!(admit(&per(5, SEC), &mut log, end_of_window + SEC, 1).allowed);
    }

    #[test]
    fn a_costly_request_waits_for_enough_entries_to_expire() {
        let mut log = [0; 3];
        for t in [1, 2, 3] {
            assert!(admit(&per(3, 10 * SEC), &mut log, t * SEC, 1).allowed);
        }
        let denied = admit(&per(3, 10 * SEC), &mut log, 5 * SEC, 2);
        assert_eq!(
            denied.retry_after,
            7 * SEC,
            "the second-oldest leaves at 12 s"
        );
    }

    #[test]
    fn a_refused_cost_is_logged_up_to_the_debt_and_leaves_with_the_window() {
        let mut log = [0; 4];
        assert!(admit(&per(2, SEC), &mut log, 5 * SEC, 2).allowed);
        assert_eq!(owe(&per(2, SEC), &mut log, 5 * SEC, 1, 2), 1);
        assert_eq!(
            owe(&per(2, SEC), &mut log, 5 * SEC, 3, 2),
            1,
            "4 live at most"
        );
        let refused = admit(&per(2, SEC), &mut log, 5 * SEC, 1);
        assert_eq!((refused.remaining, refused.retry_after), (0, SEC));
        assert!(admit(&per(2, SEC), &mut log, 6 * SEC, 2).allowed);
    }

    #[test]
    fn owes_the_entries_still_in_the_window() {
        assert_eq!(debt(&per(2, SEC), &[0, 0], 9 * SEC), Debt::default());
        let log = [5 * SEC, 7 * SEC];
        assert_eq!(debt(&per(2, SEC), &log, 7 * SEC).tokens, 1);
        assert_eq!(debt(&per(2, SEC), &log, 8 * SEC), Debt::default());
    }

    #[test]
    fn a_corrupt_far_future_entry_denies_without_overflow() {
        let d = admit(&per(1, SEC), &mut [u64::MAX], 5 * SEC, 1);
        assert!(!d.allowed);
    }

    proptest! {
        /// Against the definition: at most `limit` tokens admitted in any window-long span.
        #[test]
        fn matches_the_count_of_the_last_window(
            limit in 1u64..12,
            steps in prop::collection::vec((0u64..SEC / 3, 1u64..3), 1..150),
        ) {
            let mut log = vec![0; limit as usize];
            let mut admitted: Vec<(u64, u64)> = Vec::new();
            let mut now = 1_000 * SEC;
            for (gap, cost) in steps {
                now += gap;
                let cost = cost.min(limit);
                let recent: u64 = admitted.iter().filter(|(t, _)| t + SEC > now).map(|(_, c)| c).sum();
                let expected = recent + cost <= limit;
                let d = admit(&per(limit, SEC), &mut log, now, cost);
                prop_assert_eq!(d.allowed, expected);
                if d.allowed {
                    admitted.push((now, cost));
                } else {
                    let mut probe = log.clone();
                    prop_assert!(admit(&per(limit, SEC), &mut probe, now + d.retry_after, cost).allowed);
                }
            }
        }
    }
}
