//! Logs: one JSON object per line on stderr, filtered by level (`--log`, `SLUICE_LOG`), and a
//! throttle for events that would otherwise come once per request.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use tracing_subscriber::EnvFilter;

/// Installs the JSON logger for the whole process. `filter` is a level (`info`) or
/// `tracing` directives (`info,sluice_service=debug`), checked by `cli`.
pub fn init(filter: &str) -> Result<(), String> {
    let filter = EnvFilter::try_new(filter).map_err(|error| format!("--log: {error}"))?;
    tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(false)
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init()
        .map_err(|error| format!("cannot install the logger: {error}"))
}

/// Lets one event through per `every`, and counts the ones it held back in between.
pub struct Throttle {
    every: Duration,
    epoch: Instant,
    /// When the next event may pass, in ms since `epoch`.
    next_ms: AtomicU64,
    held: AtomicU64,
}

impl Throttle {
    pub fn new(every: Duration) -> Throttle {
        Throttle {
            every,
            epoch: Instant::now(),
            next_ms: AtomicU64::new(0),
            held: AtomicU64::new(0),
        }
    }

    /// `Some(held back since the last one)` if this event is to be logged, else `None`.
    pub fn pass(&self) -> Option<u64> {
        let now = millis(self.epoch.elapsed());
        let next = self.next_ms.load(Relaxed);
        let due = now >= next
            && (self.next_ms)
                .compare_exchange(
                    next,
                    now.saturating_add(millis(self.every)),
                    Relaxed,
                    Relaxed,
                )
                .is_ok();
        if due {
            Some(self.held.swap(0, Relaxed))
        } else {
            self.held.fetch_add(1, Relaxed);
            None
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttle_passes_one_event_per_period_and_counts_the_rest() {
        let throttle = Throttle::new(Duration::from_millis(200));
        assert_eq!(throttle.pass(), Some(0));
        assert_eq!(throttle.pass(), None);
        assert_eq!(throttle.pass(), None);
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(throttle.pass(), Some(2));
        assert_eq!(throttle.pass(), None);
    }
}
