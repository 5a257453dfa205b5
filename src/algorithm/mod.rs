//! The rate-limit algorithms, each a pure function of (parameters, state, now, cost). State is a
//! few u64 words per key ("columns") that the caller keeps in shared data and updates with CAS;
//! an algorithm changes the state only when it admits the request. None reads a clock.
//!
//! | algorithm      | state per key              | bursts                                  |
//! |----------------|----------------------------|-----------------------------------------|
//! | token_bucket   | 1 word (GCRA TAT)          | up to `burst`, then the sustained rate  |
//! | fixed_window   | 2 words (window, count)    | up to 2 × limit across a window boundary |
//! | sliding_window | 3 words (window, cur, prev)| estimates the last `per`: caps even bursts |
//! | sliding_log    | `requests` words (times)   | exact over any span of `per`            |
//! | leaky_bucket   | 1 word (GCRA TAT)          | none: requests are delayed to the rate  |

pub mod fixed_window;
pub mod leaky_bucket;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

use std::num::NonZeroU64;

use serde::{Deserialize, Serialize};

pub use leaky_bucket::Drain;
pub use token_bucket::Rate;

/// What one check found. Durations are nanoseconds from `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Decision {
    pub allowed: bool,
    /// Whole requests (tokens) left after this one.
    pub remaining: u64,
    /// Until the key's state is back to its idle best (bucket full, window over).
    pub reset_after: u64,
    /// Until the request could pass (0 when allowed).
    pub retry_after: u64,
    /// How long an admitted request must be held first (leaky bucket only).
    pub delay: u64,
}

/// The algorithms by name, as the configuration and the service's wire format spell them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    #[default]
    TokenBucket,
    FixedWindow,
    SlidingWindow,
    SlidingLog,
    LeakyBucket,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::TokenBucket => "token_bucket",
            Kind::FixedWindow => "fixed_window",
            Kind::SlidingWindow => "sliding_window",
            Kind::SlidingLog => "sliding_log",
            Kind::LeakyBucket => "leaky_bucket",
        }
    }
}

/// At most `limit` tokens per window of `length` nanoseconds: the three window algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub limit: u64,
    pub length: NonZeroU64,
}

impl Window {
    /// `None` for a zero limit or a zero length.
    pub fn new(limit: u64, length: u64) -> Option<Window> {
        Some(Window {
            limit: (limit > 0).then_some(limit)?,
            length: NonZeroU64::new(length)?,
        })
    }
}

/// An algorithm with its validated numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    TokenBucket(Rate),
    FixedWindow(Window),
    SlidingWindow(Window),
    SlidingLog(Window),
    LeakyBucket(Drain),
}

impl Algorithm {
    pub fn kind(&self) -> Kind {
        match self {
            Algorithm::TokenBucket(_) => Kind::TokenBucket,
            Algorithm::FixedWindow(_) => Kind::FixedWindow,
            Algorithm::SlidingWindow(_) => Kind::SlidingWindow,
            Algorithm::SlidingLog(_) => Kind::SlidingLog,
            Algorithm::LeakyBucket(_) => Kind::LeakyBucket,
        }
    }

    /// The name used in the configuration and on the wire.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// Words of state per key.
    pub fn columns(&self) -> usize {
        match self {
            Algorithm::TokenBucket(_) | Algorithm::LeakyBucket(_) => 1,
            Algorithm::FixedWindow(_) => fixed_window::COLUMNS,
            Algorithm::SlidingWindow(_) => sliding_window::COLUMNS,
            Algorithm::SlidingLog(window) => usize::try_from(window.limit).unwrap_or(usize::MAX),
        }
    }

    /// The most requests a key can make at once: the limit headers report.
    pub fn capacity(&self) -> u64 {
        match self {
            Algorithm::TokenBucket(rate) => rate.burst,
            Algorithm::FixedWindow(window)
            | Algorithm::SlidingWindow(window)
            | Algorithm::SlidingLog(window) => window.limit,
            Algorithm::LeakyBucket(drain) => drain.capacity(),
        }
    }

    /// How long a request may be held for its turn (leaky bucket only).
    pub fn max_delay(&self) -> Option<u64> {
        match self {
            Algorithm::LeakyBucket(drain) => Some(drain.max_delay),
            _ => None,
        }
    }

    /// Admits `cost` at `now` if the state allows, updating it; leaves it alone otherwise.
    pub fn admit(&self, state: &mut [u64], now: u64, cost: u64) -> Decision {
        match (self, state) {
            (Algorithm::TokenBucket(rate), [tat]) => token_bucket::admit(rate, tat, now, cost),
            (Algorithm::FixedWindow(window), state) => {
                fixed_window::admit(window, state, now, cost)
            }
            (Algorithm::SlidingWindow(window), state) => {
                sliding_window::admit(window, state, now, cost)
            }
            (Algorithm::SlidingLog(window), state) => sliding_log::admit(window, state, now, cost),
            (Algorithm::LeakyBucket(drain), [tat]) => leaky_bucket::admit(drain, tat, now, cost),
            _ => Decision::default(),
        }
    }

    /// Admits as many tokens between `cost` and `take` as the state allows, the most first: how
    /// the service grants tokens beyond a request's cost (a global policy's `lease`). Returns the
    /// decision for the tokens taken and how many; when even `cost` does not fit, its denial and 0.
    /// Every algorithm admits `n` tokens whenever it admits more, so the most is found by halving.
    pub fn grant(&self, state: &mut [u64], now: u64, cost: u64, take: u64) -> (Decision, u64) {
        let attempt = |tokens: u64| {
            let mut after = state.to_vec();
            (self.admit(&mut after, now, tokens), after)
        };
        let (mut best, mut after) = attempt(cost);
        if !best.allowed {
            return (best, 0);
        }
        let (mut granted, mut over) = (cost, take.max(cost) + 1);
        while over - granted > 1 {
            let mid = granted + (over - granted) / 2;
            match attempt(mid) {
                (decision, words) if decision.allowed => {
                    (granted, best, after) = (mid, decision, words)
                }
                _ => over = mid,
            }
        }
        state.copy_from_slice(&after);
        (best, granted)
    }

    /// From when the state is as good as empty: a slot idle since then may be reused without
    /// losing anything.
    pub fn idle_at(&self, state: &[u64]) -> u64 {
        match self {
            Algorithm::TokenBucket(_) | Algorithm::LeakyBucket(_) => {
                state.first().copied().unwrap_or(0)
            }
            Algorithm::FixedWindow(window) => fixed_window::idle_at(window, state),
            Algorithm::SlidingWindow(window) => sliding_window::idle_at(window, state),
            Algorithm::SlidingLog(window) => sliding_log::idle_at(window, state),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::duration::NANOS_PER_SEC as SEC;
    use proptest::prelude::*;

    fn algorithms(limit: u64) -> [Algorithm; 4] {
        let window = Window::new(limit, SEC).unwrap();
        [
            Algorithm::TokenBucket(Rate::new(limit, SEC, limit).unwrap()),
            Algorithm::FixedWindow(window),
            Algorithm::SlidingWindow(window),
            Algorithm::SlidingLog(window),
        ]
    }

    proptest! {
        /// `grant` takes what trying every count from `take` down to `cost` would take.
        #[test]
        fn grant_takes_the_most_that_fits(
            limit in 1u64..30,
            steps in prop::collection::vec((0u64..SEC / 4, 1u64..4, 0u64..10), 1..60),
        ) {
            for algorithm in algorithms(limit) {
                let mut state = vec![0; algorithm.columns()];
                let mut now = 100 * SEC;
                for &(gap, cost, extra) in &steps {
                    now += gap;
                    let (cost, take) = (cost.min(limit), (cost + extra).min(limit));
                    let linear = (cost..=take).rev().find(|&n| {
                        algorithm.admit(&mut state.clone(), now, n).allowed
                    });
                    let (decision, granted) = algorithm.grant(&mut state, now, cost, take);
                    prop_assert_eq!(decision.allowed, linear.is_some());
                    prop_assert_eq!(granted, linear.unwrap_or(0));
                }
            }
        }
    }
}
