//! The rate-limit algorithms, each a pure function of (parameters, state, now, cost). State is a
//! few u64 words per key ("columns") that the caller keeps in shared data and updates with CAS;
//! an algorithm changes the state only when it admits the request. None reads a clock.
//!
//! Parameters are validated when they are built (`Rate::new`, `Window::new`, `Drain::new`,
//! `Algorithm::check_cost`): within the bounds below, no arithmetic on them can overflow, whatever
//! the clock says (up to the year 2500) and whatever a corrupt state word holds.
//!
//! | algorithm      | state per key              | bursts                                  |
//! |----------------|----------------------------|-----------------------------------------|
//! | token_bucket   | 1 word (GCRA TAT)          | up to `burst`, then the sustained rate  |
//! | fixed_window   | 2 words (window, count)    | up to 2 × limit across a window boundary |
//! | sliding_window | 3 words (window, cur, prev)| estimates the last `per`: caps even bursts |
//! | sliding_log    | `requests` words (times)   | exact over any span of `per`            |
//! | leaky_bucket   | 1 word (GCRA TAT)          | none: requests are delayed to the rate  |
//! | concurrency    | 4 words (epoch, 2 counts, birth) | none: at most `requests` in flight |
//!
//! All but the leaky bucket can also be charged past their limit (`owe`: a refused hit that
//! envoyproxy/ratelimit counts anyway, what a response used beyond what its request reserved),
//! up to a bound of debt; and refunded what a request reserved and did not use (`refund`).

pub mod concurrency;
pub mod fixed_window;
pub mod leaky_bucket;
mod periods;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

use std::fmt;
use std::num::NonZeroU64;

use serde::{Deserialize, Serialize};

use crate::core::calendar::Calendar;
use crate::core::duration::NANOS_PER_SEC;

pub use concurrency::Slots;
pub use leaky_bucket::Drain;
pub use token_bucket::Rate;

/// The most requests per `per`, tokens of `burst`, or `cost`: a million a second for 30 days is
/// 2.6 × 10^12; sums of two stay far inside u64. (sluice-service takes up to 10^9 for a global
/// policy.)
pub const MAX_COUNT: u64 = 1_000_000_000_000_000;
/// The longest `per` or `max_delay`: 365 days, as sluice-service accepts.
pub const MAX_PERIOD: u64 = 365 * 86_400 * NANOS_PER_SEC;
/// The most nanoseconds a bucket holds (`burst` × interval), or one request queues a leaky bucket
/// for (`cost` × interval): about 146 years.
pub const MAX_CAPACITY: u64 = 1 << 62;
/// `Debt::share` of a state that owes its whole capacity.
pub const FULL_SHARE: u64 = 1 << 32;

/// A parameter of a limit, as the configuration names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    Requests,
    Per,
    Burst,
    Cost,
    MaxDelay,
    Lease,
}

impl Param {
    /// The configuration field.
    pub fn field(self) -> &'static str {
        match self {
            Param::Requests => "requests",
            Param::Per => "per",
            Param::Burst => "burst",
            Param::Cost => "cost",
            Param::MaxDelay => "max_delay",
            Param::Lease => "lease",
        }
    }
}

/// Numbers that make no limit: which parameter, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub param: Param,
    pub reason: String,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}: {}", self.param.field(), self.reason)
    }
}

fn invalid(param: Param, reason: impl Into<String>) -> Invalid {
    Invalid {
        param,
        reason: reason.into(),
    }
}

/// `value` of `param` if it lies in `1..=max`.
fn within(param: Param, value: u64, max: u64) -> Result<u64, Invalid> {
    match value {
        0 => Err(invalid(param, "must be at least 1")),
        v if v > max => Err(invalid(param, format!("must be at most {max}"))),
        v => Ok(v),
    }
}

/// A period (`per`, `max_delay`) of at most `MAX_PERIOD`.
fn period(param: Param, nanos: u64) -> Result<u64, Invalid> {
    if nanos > MAX_PERIOD {
        return Err(invalid(param, "must be at most 365d"));
    }
    Ok(nanos)
}

/// Nanoseconds per request at `requests` per `per_nanos`, rounded up so the rate is never above
/// the one configured (exact to one nanosecond per request: 0.1% at a million a second).
fn interval(requests: u64, per_nanos: u64) -> Result<NonZeroU64, Invalid> {
    let requests = within(Param::Requests, requests, MAX_COUNT)?;
    let per = period(Param::Per, per_nanos)?;
    if requests > per {
        return Err(invalid(
            Param::Requests,
            "more than one request per nanosecond",
        ));
    }
    NonZeroU64::new(per.div_ceil(requests)).ok_or_else(|| invalid(Param::Per, "must not be 0"))
}

/// What a key owes its limit: the tokens it spent and has not earned back yet. Forgetting its
/// state forgives exactly that: the key, coming back, can get at most `tokens` more than its
/// limit allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, PartialOrd, Ord)]
pub struct Debt {
    /// The debt as a share of the capacity, out of `FULL_SHARE` (rounded up: any debt counts).
    pub share: u64,
    /// Whole tokens (rounded up).
    pub tokens: u64,
}

impl Debt {
    /// `owed` out of `capacity`, both in the same unit, `unit` of them to a token. A state owes
    /// its capacity at most, whatever its words say.
    fn of(owed: u128, capacity: u128, unit: u128) -> Debt {
        if owed == 0 {
            return Debt::default();
        }
        let (capacity, unit) = (capacity.max(1), unit.max(1));
        let owed = owed.min(capacity);
        let share = (owed * u128::from(FULL_SHARE)).div_ceil(capacity);
        Debt {
            share: u64::try_from(share).unwrap_or(FULL_SHARE),
            tokens: u64::try_from(owed.div_ceil(unit)).unwrap_or(u64::MAX),
        }
    }

    /// The debts of several policies of one key, as one: the largest share, every token.
    pub fn and(self, other: Debt) -> Debt {
        Debt {
            share: self.share.max(other.share),
            tokens: self.tokens.saturating_add(other.tokens),
        }
    }
}

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
    Concurrency,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::TokenBucket => "token_bucket",
            Kind::FixedWindow => "fixed_window",
            Kind::SlidingWindow => "sliding_window",
            Kind::SlidingLog => "sliding_log",
            Kind::LeakyBucket => "leaky_bucket",
            Kind::Concurrency => "concurrency",
        }
    }

    /// `Algorithm::meters` by name: a request's usage can be charged after it.
    pub fn meters(self) -> bool {
        matches!(
            self,
            Kind::TokenBucket | Kind::FixedWindow | Kind::SlidingWindow
        )
    }
}

/// At most `limit` tokens per window of `length` nanoseconds: the three window algorithms. A
/// fixed window may follow a calendar instead (`calendar`): its windows are the calendar's
/// periods, and `length` only their nominal length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub limit: u64,
    pub length: NonZeroU64,
    pub calendar: Option<Calendar>,
}

impl Window {
    /// `limit` (`requests`) per window of `length` (`per`) nanoseconds.
    pub fn new(limit: u64, length: u64) -> Result<Window, Invalid> {
        let limit = within(Param::Requests, limit, MAX_COUNT)?;
        let length = NonZeroU64::new(period(Param::Per, length)?)
            .ok_or_else(|| invalid(Param::Per, "must not be 0"))?;
        Ok(Window {
            limit,
            length,
            calendar: None,
        })
    }

    /// `limit` per period of `calendar` (a fixed window only).
    pub fn calendar(limit: u64, calendar: Calendar) -> Result<Window, Invalid> {
        let window = Window::new(limit, calendar.unit.nominal_nanos())?;
        Ok(Window {
            calendar: Some(calendar),
            ..window
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
    Concurrency(Slots),
}

impl Algorithm {
    pub fn kind(&self) -> Kind {
        match self {
            Algorithm::TokenBucket(_) => Kind::TokenBucket,
            Algorithm::FixedWindow(_) => Kind::FixedWindow,
            Algorithm::SlidingWindow(_) => Kind::SlidingWindow,
            Algorithm::SlidingLog(_) => Kind::SlidingLog,
            Algorithm::LeakyBucket(_) => Kind::LeakyBucket,
            Algorithm::Concurrency(_) => Kind::Concurrency,
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
            Algorithm::Concurrency(_) => concurrency::COLUMNS,
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
            Algorithm::Concurrency(slots) => slots.limit,
        }
    }

    /// Words of state per key for a key that may owe `max_debt` tokens (`owe`): a sliding log
    /// keeps one word per entry, so it needs one more per token owed.
    pub fn columns_owing(&self, max_debt: u64) -> usize {
        match self {
            Algorithm::SlidingLog(_) => {
                (self.columns()).saturating_add(usize::try_from(max_debt).unwrap_or(usize::MAX))
            }
            _ => self.columns(),
        }
    }

    /// How long a request may be held for its turn (leaky bucket only).
    pub fn max_delay(&self) -> Option<u64> {
        match self {
            Algorithm::LeakyBucket(drain) => Some(drain.max_delay),
            _ => None,
        }
    }

    /// Whether a request may take `cost`: at most the capacity (a token bucket's `burst`, a
    /// window's `requests`), and for a leaky bucket at most `MAX_CAPACITY` of queue.
    pub fn check_cost(&self, cost: u64) -> Result<(), Invalid> {
        within(Param::Cost, cost, MAX_COUNT)?;
        let at_least_cost = |param| invalid(param, format!("must be >= cost ({cost})"));
        match self {
            Algorithm::TokenBucket(rate) if rate.burst < cost => Err(at_least_cost(Param::Burst)),
            Algorithm::FixedWindow(window)
            | Algorithm::SlidingWindow(window)
            | Algorithm::SlidingLog(window)
                if window.limit < cost =>
            {
                Err(at_least_cost(Param::Requests))
            }
            Algorithm::Concurrency(slots) if slots.limit < cost => {
                Err(at_least_cost(Param::Requests))
            }
            Algorithm::LeakyBucket(drain)
                if drain.interval.get().saturating_mul(cost) > MAX_CAPACITY =>
            {
                Err(invalid(
                    Param::Cost,
                    "one request would hold the queue for over a century",
                ))
            }
            _ => Ok(()),
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
            (Algorithm::Concurrency(slots), state) => concurrency::admit(slots, state, now, cost),
            _ => Decision::default(),
        }
    }

    /// Whether a request's usage can be charged after it (`owe`, `refund`): a token bucket and
    /// the fixed and sliding windows. A queue has no room for tokens past its limit, a log keeps
    /// one word per token, and slots are not tokens.
    pub fn meters(&self) -> bool {
        self.kind().meters()
    }

    /// Tokens `state` owes past its limit at `now` (a key's debt as `keys show` gives it, where
    /// `debt` is all it has not earned back): the fewest given back that leave it a whole
    /// token, less that token. 0 for an algorithm that cannot give back (`meters`). For the
    /// admin path's and the service's `keys show`; a search over `refund` and `admit`, not for a
    /// request's path.
    pub fn past_limit(&self, state: &[u64], now: u64) -> u64 {
        const MOST_COLUMNS: usize = 3;
        let columns = self.columns();
        let (true, Some(state)) = (self.meters(), state.get(..columns)) else {
            return 0;
        };
        let passes = |given: u64| {
            let mut probe = [0u64; MOST_COLUMNS];
            let Some(probe) = probe.get_mut(..columns) else {
                return true;
            };
            probe.copy_from_slice(state);
            self.refund(probe, now, given, now);
            self.admit(probe, now, 1).allowed
        };
        if passes(0) {
            return 0;
        }
        let (mut low, mut high) = (0u64, 1u64);
        while !passes(high) {
            low = high;
            match high.checked_mul(2) {
                Some(next) if next <= 1 << 50 => high = next,
                _ => return high,
            }
        }
        while high - low > 1 {
            let mid = low + (high - low) / 2;
            if passes(mid) {
                high = mid;
            } else {
                low = mid;
            }
        }
        high - 1
    }

    /// Gives back `tokens` taken at `taken_at` and not used, as far as the state still counts
    /// them (a window that ended keeps nothing to give back). Returns the tokens given back.
    pub fn refund(&self, state: &mut [u64], now: u64, tokens: u64, taken_at: u64) -> u64 {
        match (self, state) {
            (Algorithm::TokenBucket(rate), [tat]) => {
                let before = *tat;
                token_bucket::hand_back(tat, tokens, rate.interval);
                // A bucket that refilled meanwhile is full: what it had already earned back is
                // not given twice.
                *tat = (*tat).max(now.min(before));
                (before - *tat) / rate.interval
            }
            (Algorithm::FixedWindow(window), state) => {
                fixed_window::refund(window, state, now, tokens, taken_at)
            }
            (Algorithm::SlidingWindow(window), state) => {
                sliding_window::refund(window, state, now, tokens, taken_at)
            }
            _ => 0,
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
        let (mut granted, mut over) = (cost, take.max(cost).saturating_add(1));
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

    /// When the state owes nothing at the latest, as of `now`: the bucket full, the windows over,
    /// the slots expired.
    pub fn idle_at(&self, state: &[u64], now: u64) -> u64 {
        let end_of = |index: u64, windows: u64, length: u64| {
            index.saturating_add(windows).saturating_mul(length)
        };
        let at = match (self, state) {
            (Algorithm::TokenBucket(_) | Algorithm::LeakyBucket(_), [tat]) => *tat,
            (Algorithm::FixedWindow(w), [index, _]) => fixed_window::end_of(w, *index),
            (Algorithm::SlidingWindow(w), [index, ..]) => end_of(*index, 2, w.length.get()),
            (Algorithm::SlidingLog(w), log) => {
                let newest = log.iter().max().copied().unwrap_or(0);
                newest.saturating_add(w.length.get())
            }
            (Algorithm::Concurrency(slots), [epoch, ..]) => end_of(*epoch, 2, slots.epoch.get()),
            _ => now,
        };
        at.max(now)
    }

    /// Charges up to `cost` tokens of a request that `admit` refused, the key owing at most
    /// `max_debt` tokens past its limit (what envoyproxy/ratelimit does with every hit: it counts
    /// the refused ones too). The debt is paid back as the limit refills: a bucket at its rate,
    /// a window when it ends or fades. A leaky bucket never owes: a queue slot it refuses is not
    /// taken. Returns the tokens charged; a later check sees them as spent.
    pub fn owe(&self, state: &mut [u64], now: u64, cost: u64, max_debt: u64) -> u64 {
        match (self, state) {
            (Algorithm::TokenBucket(rate), [tat]) => {
                token_bucket::owe(rate, tat, now, cost, max_debt)
            }
            (Algorithm::FixedWindow(window), state) => {
                fixed_window::owe(window, state, now, cost, max_debt)
            }
            (Algorithm::SlidingWindow(window), state) => {
                sliding_window::owe(window, state, now, cost, max_debt)
            }
            (Algorithm::SlidingLog(window), state) => {
                sliding_log::owe(window, state, now, cost, max_debt)
            }
            _ => 0,
        }
    }

    /// What the key whose state this is owes at `now`: what forgetting the state forgives.
    pub fn debt(&self, state: &[u64], now: u64) -> Debt {
        match self {
            Algorithm::TokenBucket(rate) => {
                let owed = state.first().map_or(0, |tat| tat.saturating_sub(now));
                Debt::of(
                    owed.into(),
                    rate.capacity.into(),
                    rate.interval.get().into(),
                )
            }
            Algorithm::LeakyBucket(drain) => {
                let owed = state.first().map_or(0, |tat| tat.saturating_sub(now));
                let interval = u128::from(drain.interval.get());
                Debt::of(
                    owed.into(),
                    u128::from(drain.capacity()) * interval,
                    interval,
                )
            }
            Algorithm::FixedWindow(window) => fixed_window::debt(window, state, now),
            Algorithm::SlidingWindow(window) => sliding_window::debt(window, state, now),
            Algorithm::SlidingLog(window) => sliding_log::debt(window, state, now),
            Algorithm::Concurrency(slots) => concurrency::debt(slots, state, now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::duration::NANOS_PER_SEC as SEC;
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
