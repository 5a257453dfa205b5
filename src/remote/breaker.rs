//! Stops calling a failing rate-limit service for a while, so that a recovering Redis is not
//! met by every waiting request at once: after a few failures in a row, one worker sends one
//! probe per back-off period until a call succeeds.

use crate::core::duration::NANOS_PER_SEC;
use std::cell::Cell;

/// Consecutive failed calls that open the breaker.
pub const FAILURES_TO_OPEN: u32 = 3;
/// How long an open breaker waits before the next probe.
pub const BACKOFF: u64 = NANOS_PER_SEC;

#[derive(Debug, Default)]
pub struct Breaker {
    failures: Cell<u32>,
    /// While open: when the next probe may go.
    next_probe: Cell<u64>,
}

impl Breaker {
    /// Whether a request may call the service at `now`. When the breaker is open and a probe
    /// is due, this request is the probe and the next one waits a full back-off again.
    pub fn allows(&self, now: u64) -> bool {
        if self.failures.get() < FAILURES_TO_OPEN {
            return true;
        }
        if now < self.next_probe.get() {
            return false;
        }
        self.next_probe.set(now.saturating_add(BACKOFF));
        true
    }

    /// Records how a call ended.
    pub fn record(&self, succeeded: bool, now: u64) {
        if succeeded {
            self.failures.set(0);
            return;
        }
        let failures = self.failures.get().saturating_add(1);
        self.failures.set(failures);
        if failures == FAILURES_TO_OPEN {
            self.next_probe.set(now.saturating_add(BACKOFF));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_000 * NANOS_PER_SEC;

    #[test]
    fn stays_closed_through_isolated_failures() {
        let breaker = Breaker::default();
        breaker.record(false, T);
        breaker.record(false, T);
        breaker.record(true, T);
        breaker.record(false, T);
        assert!(breaker.allows(T));
    }

    #[test]
    fn opens_after_three_failures_then_probes_once_per_backoff() {
        let breaker = Breaker::default();
        (0..3).for_each(|_| breaker.record(false, T));
        assert!(!breaker.allows(T + 1));
        assert!(breaker.allows(T + BACKOFF), "the probe");
        assert!(!breaker.allows(T + BACKOFF + 1), "one probe at a time");
        breaker.record(false, T + BACKOFF + 2);
        assert!(!breaker.allows(T + 2 * BACKOFF - 1));
        assert!(breaker.allows(T + 2 * BACKOFF));
        breaker.record(true, T + 2 * BACKOFF);
        assert!(breaker.allows(T + 2 * BACKOFF + 1), "closed again");
    }
}
