//! Readiness: whether Redis answers (a `PING` every `PROBE_INTERVAL`, in the background) and
//! whether shutdown has begun. `/readyz` reads the last probe's answer and never waits for
//! Redis itself, so probes cannot pile up on a slow Redis.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

use crate::metrics::Metrics;
use crate::stores::Store;

/// How often Redis is probed. With the store's `PING` bound (500 ms), readiness follows a change
/// of Redis within 750 ms.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(250);

/// Why the service is not ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// Redis did not answer the last probe; the detail says how it failed.
    Redis(String),
    /// Shutdown has begun: load balancers should stop sending new requests.
    ShuttingDown,
}

pub struct Readiness {
    /// The last probe's failure, or `None` while Redis answers.
    redis: watch::Sender<Option<String>>,
    shutting_down: AtomicBool,
}

impl Default for Readiness {
    fn default() -> Readiness {
        Readiness::new()
    }
}

impl Readiness {
    /// Not ready until the first probe answers.
    pub fn new() -> Readiness {
        Readiness {
            redis: watch::Sender::new(Some("not probed yet".to_string())),
            shutting_down: AtomicBool::new(false),
        }
    }

    pub fn check(&self) -> Result<(), NotReady> {
        if self.shutting_down.load(Relaxed) {
            return Err(NotReady::ShuttingDown);
        }
        match &*self.redis.borrow() {
            None => Ok(()),
            Some(detail) => Err(NotReady::Redis(detail.clone())),
        }
    }

    pub fn start_shutdown(&self) {
        self.shutting_down.store(true, Relaxed);
    }

    /// Records a probe's answer; true if Redis went up or down with it.
    fn record(&self, answer: Option<String>) -> bool {
        self.redis.send_if_modified(|last| {
            let changed = last.is_none() != answer.is_none();
            *last = answer;
            changed
        })
    }
}

/// Probes Redis forever, keeping `readiness` and the `redis_up` gauge current, and logs each
/// change (not each probe). Each probe is bounded by the store, so a hung Redis cannot stall it.
pub async fn probe_redis<S: Store>(
    store: Arc<S>,
    readiness: Arc<Readiness>,
    metrics: Arc<Metrics>,
) {
    let mut first = true;
    loop {
        let answer = store.ping().await.err().map(|failure| failure.detail);
        let up = answer.is_none();
        if readiness.record(answer.clone()) || first {
            metrics.set_redis_up(up);
            match answer {
                None => info!("redis is up"),
                Some(error) => warn!(error, "redis is down"),
            }
        }
        first = false;
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_while_redis_answers_and_never_once_shutting_down() {
        let readiness = Readiness::new();
        assert!(matches!(readiness.check(), Err(NotReady::Redis(_))));
        assert!(readiness.record(None), "up is a change");
        assert_eq!(readiness.check(), Ok(()));
        assert!(readiness.record(Some("refused".into())), "down is a change");
        assert!(!readiness.record(Some("timed out".into())), "still down");
        assert_eq!(readiness.check(), Err(NotReady::Redis("timed out".into())));
        readiness.record(None);
        readiness.start_shutdown();
        assert_eq!(readiness.check(), Err(NotReady::ShuttingDown));
    }
}
