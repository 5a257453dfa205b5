//! Limits kept in this process, decided by the filter's own algorithms (`sluice::exact`) in
//! microseconds of the system clock: what the Redis scripts answer, debt included
//! (`Check::debt`, `sluice::algorithm::Algorithm::owe`), for one service and without Redis. For trying sluice out and for testing the service's logic without a Redis; one replica
//! only, and the state goes with the process.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use sluice::algorithm::{self as filter, Drain, Rate, Window};
use sluice::exact::ExactStore;

use crate::store::{state_key, Algorithm, Check, Decision, FailureKind, Store, StoreError};

/// Checks between two sweeps of the keys that are as good as empty.
const SWEEP_EVERY: u64 = 4096;

#[derive(Default)]
pub struct MemoryStore {
    keys: Mutex<ExactStore>,
    checks: AtomicU64,
}

impl MemoryStore {
    fn decide(&self, checks: &[Check], now_us: u64) -> Result<Vec<Decision>, StoreError> {
        let mut keys = self
            .keys
            .lock()
            .map_err(|_| failure("the store's lock is poisoned"))?;
        if self
            .checks
            .fetch_add(1, Relaxed)
            .is_multiple_of(SWEEP_EVERY)
        {
            keys.forget_idle(now_us);
        }
        checks
            .iter()
            .map(|check| {
                let limit = limit(&check.algorithm).ok_or_else(|| failure("no such limit"))?;
                let key = state_key(check);
                let cost = (check.cost, check.take);
                let (d, granted) = keys.decide_owing(&key, limit, now_us, cost, check.debt);
                Ok(Decision {
                    allowed: d.allowed,
                    granted,
                    remaining: d.remaining,
                    reset_us: d.reset_after,
                    retry_after_us: d.retry_after,
                    delay_us: matches!(check.algorithm, Algorithm::LeakyBucket { .. })
                        .then_some(d.delay),
                })
            })
            .collect()
    }
}

impl Store for MemoryStore {
    async fn check(&self, checks: &[Check]) -> Result<Vec<Decision>, StoreError> {
        let now_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|_| failure("the clock is before 1970"))?
            .as_micros();
        self.decide(checks, u64::try_from(now_us).unwrap_or(u64::MAX))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// The filter's algorithm for the store's numbers, in microseconds (the algorithms do not mind
/// the unit), through its validating constructors; `check::parse` has already bounded them.
fn limit(algorithm: &Algorithm) -> Option<filter::Algorithm> {
    match *algorithm {
        Algorithm::TokenBucket { interval_us, burst } => {
            Rate::new(1, interval_us, burst).map(filter::Algorithm::TokenBucket)
        }
        Algorithm::FixedWindow { limit, window_us } => {
            Window::new(limit, window_us).map(filter::Algorithm::FixedWindow)
        }
        Algorithm::SlidingWindow { limit, window_us } => {
            Window::new(limit, window_us).map(filter::Algorithm::SlidingWindow)
        }
        Algorithm::SlidingLog { limit, window_us } => {
            Window::new(limit, window_us).map(filter::Algorithm::SlidingLog)
        }
        Algorithm::LeakyBucket {
            interval_us,
            max_delay_us,
        } => Drain::new(1, interval_us, max_delay_us).map(filter::Algorithm::LeakyBucket),
    }
    .ok()
}

fn failure(detail: &str) -> StoreError {
    StoreError {
        kind: FailureKind::Other,
        detail: detail.to_string(),
    }
}
