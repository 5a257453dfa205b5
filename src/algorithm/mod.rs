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

/// An algorithm with its validated numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    TokenBucket(Rate),
    FixedWindow { limit: u64, window: u64 },
    SlidingWindow { limit: u64, window: u64 },
    SlidingLog { limit: u64, window: u64 },
    LeakyBucket { interval: u64, max_delay: u64 },
}

impl Algorithm {
    /// The name used in the configuration and on the wire.
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::TokenBucket(_) => "token_bucket",
            Algorithm::FixedWindow { .. } => "fixed_window",
            Algorithm::SlidingWindow { .. } => "sliding_window",
            Algorithm::SlidingLog { .. } => "sliding_log",
            Algorithm::LeakyBucket { .. } => "leaky_bucket",
        }
    }

    /// Words of state per key.
    pub fn columns(&self) -> usize {
        match self {
            Algorithm::TokenBucket(_) | Algorithm::LeakyBucket { .. } => 1,
            Algorithm::FixedWindow { .. } => fixed_window::COLUMNS,
            Algorithm::SlidingWindow { .. } => sliding_window::COLUMNS,
            Algorithm::SlidingLog { limit, .. } => *limit as usize,
        }
    }

    /// The most requests a key can make at once: the limit headers report.
    pub fn capacity(&self) -> u64 {
        match self {
            Algorithm::TokenBucket(rate) => rate.burst,
            Algorithm::FixedWindow { limit, .. }
            | Algorithm::SlidingWindow { limit, .. }
            | Algorithm::SlidingLog { limit, .. } => *limit,
            Algorithm::LeakyBucket {
                interval,
                max_delay,
            } => max_delay / interval + 1,
        }
    }

    /// How long a request may be held for its turn (leaky bucket only).
    pub fn max_delay(&self) -> Option<u64> {
        match self {
            Algorithm::LeakyBucket { max_delay, .. } => Some(*max_delay),
            _ => None,
        }
    }

    /// Admits `cost` at `now` if the state allows, updating it; leaves it alone otherwise.
    pub fn decide(&self, state: &mut [u64], now: u64, cost: u64) -> Decision {
        match (self, state) {
            (Algorithm::TokenBucket(rate), [tat]) => token_bucket::decide(rate, tat, now, cost),
            (Algorithm::FixedWindow { limit, window }, state) => {
                fixed_window::decide(*limit, *window, state, now, cost)
            }
            (Algorithm::SlidingWindow { limit, window }, state) => {
                sliding_window::decide(*limit, *window, state, now, cost)
            }
            (Algorithm::SlidingLog { limit, window }, state) => {
                sliding_log::decide(*limit, *window, state, now, cost)
            }
            (
                Algorithm::LeakyBucket {
                    interval,
                    max_delay,
                },
                [tat],
            ) => leaky_bucket::decide(*interval, *max_delay, tat, now, cost),
            _ => Decision::default(),
        }
    }

    /// From when the state is as good as empty: a slot idle since then may be reused without
    /// losing anything.
    pub fn idle_at(&self, state: &[u64]) -> u64 {
        match self {
            Algorithm::TokenBucket(_) | Algorithm::LeakyBucket { .. } => {
                state.first().copied().unwrap_or(0)
            }
            Algorithm::FixedWindow { window, .. } => fixed_window::idle_at(*window, state),
            Algorithm::SlidingWindow { window, .. } => sliding_window::idle_at(*window, state),
            Algorithm::SlidingLog { window, .. } => sliding_log::idle_at(*window, state),
        }
    }
}
