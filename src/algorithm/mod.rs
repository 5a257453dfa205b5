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
