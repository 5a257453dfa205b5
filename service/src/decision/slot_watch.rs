//! Leaks made visible (issue 31): the service compares the slots it holds with the slots their
//! requests renew. A filter renews a live request's slot every half lease (from a timer of a
//! second, through its outbox); a slot whose last renewal is older than that plus
//! `RENEWAL_SLACK` (a quarter lease at most) belongs to no running request as far as anyone
//! can tell: a leak, or a filter that cannot reach the service. Each sweep counts them in
//! `sluice_service_slots_unrenewed` and logs each key once while it has some.
//!
//! The keys looked at are those of the named slots this process granted lately (at most
//! `MAX_WATCHED`, each until a lease after its last check: by then any slot taken at it that
//! nobody renewed has expired).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use crate::metrics::Metrics;
use crate::stores::{state_key, Algorithm, Check, Decision, Slots, Store, Watched};

/// How often the watched keys are looked at.
pub const SWEEP_EVERY: Duration = Duration::from_secs(2);
/// Keys watched at most: the ones checked most lately.
pub const MAX_WATCHED: usize = 1_000;
/// How late a renewal may be before its slot counts as unrenewed: the filter's timer (a second),
/// its outbox (20 ms, a second's back-off after a failed call) and a slow network.
pub const RENEWAL_SLACK_US: u64 = 5_000_000;

/// A slot of `lease_us` is unrenewed when its lease ends within this of now: its last renewal
/// is older than half a lease (when the filter renews it) plus the slack (at most a quarter
/// lease).
pub fn stale_within_us(lease_us: u64) -> u64 {
    lease_us - lease_us / 2 - RENEWAL_SLACK_US.min(lease_us / 4)
}

#[derive(Default)]
pub struct SlotWatch {
    /// State key → its lease and when a check last took a slot of it.
    keys: Mutex<HashMap<String, (u64, Instant)>>,
    /// The keys logged as having unrenewed slots, until they have none.
    logged: Mutex<HashSet<String>>,
}

impl SlotWatch {
    /// Watches the keys of the named slots these checks took.
    pub fn note(&self, checks: &[Check], decisions: &[Decision]) {
        let taken = checks
            .iter()
            .zip(decisions)
            .filter(|(c, d)| d.allowed && d.granted > 0 && matches!(c.slots, Slots::Named(_)));
        let Ok(mut keys) = self.keys.lock() else {
            return;
        };
        let now = Instant::now();
        for (check, _) in taken {
            let Algorithm::Concurrency { lease_us, .. } = check.algorithm else {
                continue;
            };
            let key = state_key(check);
            if !keys.contains_key(&key) && keys.len() >= MAX_WATCHED {
                let oldest = keys.iter().min_by_key(|(_, (_, seen))| *seen);
                if let Some(oldest) = oldest.map(|(k, _)| k.clone()) {
                    keys.remove(&oldest);
                }
            }
            keys.insert(key, (lease_us, now));
        }
    }

    /// Counts the unrenewed slots of the watched keys: the gauge, and a log line for each key
    /// that has some and had none at the last sweep.
    pub async fn sweep<S: Store>(&self, store: &S, metrics: &Metrics) {
        let watched: Vec<(Watched, u64)> = {
            let Ok(mut keys) = self.keys.lock() else {
                return;
            };
            keys.retain(|_, (lease_us, seen)| seen.elapsed() < Duration::from_micros(*lease_us));
            (keys.iter())
                .map(|(key, &(lease_us, _))| {
                    let within = stale_within_us(lease_us);
                    let watched = Watched {
                        key: key.clone(),
                        stale_within_us: within,
                    };
                    (watched, lease_us)
                })
                .collect()
        };
        let keys: Vec<Watched> = watched.iter().map(|(w, _)| w.clone()).collect();
        let counts = match store.unrenewed(&keys).await {
            Ok(counts) => counts,
            Err(failure) => {
                debug!(error = %failure, "could not count unrenewed slots");
                return;
            }
        };
        metrics.set_slots_unrenewed(counts.iter().sum());
        let Ok(mut logged) = self.logged.lock() else {
            return;
        };
        let mut still = HashSet::new();
        for ((watched, lease_us), &slots) in watched.iter().zip(&counts) {
            if slots == 0 {
                continue;
            }
            if !logged.contains(&watched.key) {
                let (key, lease_ms) = (watched.key.as_str(), lease_us / 1000);
                warn!(key, slots, lease_ms, "slots not renewed");
            }
            still.insert(watched.key.clone());
        }
        *logged = still;
    }

    /// Sweeps every `SWEEP_EVERY`, for ever.
    pub async fn run<S: Store>(self: Arc<Self>, store: Arc<S>, metrics: Arc<Metrics>) {
        let mut every = tokio::time::interval(SWEEP_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            self.sweep(&store, &metrics).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_unrenewed_a_little_after_its_renewal_was_due() {
        // A minute's lease: renewed every 30 s, unrenewed 35 s after its last renewal.
        assert_eq!(stale_within_us(60_000_000), 25_000_000);
        // The shortest, 4 s: renewed every 2 s, unrenewed after 3 s.
        assert_eq!(stale_within_us(4_000_000), 1_000_000);
    }
}
