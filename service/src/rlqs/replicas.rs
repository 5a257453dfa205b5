//! Which replicas of the RLQS are alive, so that a crashed one's streams stop holding shares:
//! each replica beats in the store every `BEAT_EVERY` (`Store::beat_replica`), which answers
//! with the replicas that stopped beating (`quota::DEAD_AFTER_MS`); a report then forgets their
//! streams' entries of its bucket (`QuotaReport::dead`). Without it, an Envoy whose replica
//! crashed and that opened its stream again on another would run on a newcomer's share until
//! its old stream's entry ran out of time to live (15 s).

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use tracing::warn;

use crate::logging::Throttle;
use crate::stores::Store;

/// How often a replica beats.
pub const BEAT_EVERY: Duration = Duration::from_secs(1);

/// The replicas found dead at the last beat.
#[derive(Default)]
pub struct Replicas {
    dead: RwLock<Arc<[String]>>,
}

impl Replicas {
    /// The replicas found dead at the last beat (none before the first, or while the store is
    /// away: their entries then run out of time to live).
    pub fn dead(&self) -> Arc<[String]> {
        Arc::clone(&self.dead.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Beats as `replica` every `BEAT_EVERY`, keeping the dead found, for as long as it runs.
    pub async fn keep_beating<S: Store>(self: Arc<Self>, store: Arc<S>, replica: String) {
        let warnings = Throttle::new(Duration::from_secs(60));
        loop {
            match store.beat_replica(&replica).await {
                Ok(dead) => {
                    *self.dead.write().unwrap_or_else(PoisonError::into_inner) = dead.into();
                }
                Err(failure) => {
                    if let Some(others) = warnings.pass() {
                        warn!(error = %failure, others, "rlqs: the store did not take this replica's heartbeat");
                    }
                }
            }
            tokio::time::sleep(BEAT_EVERY).await;
        }
    }
}
