//! Limits kept in this process, decided by the filter's own algorithms (`sluice::wire::exact`) in
//! microseconds of the system clock: what the Redis scripts answer, debt included
//! (`Check::debt`, `sluice::core::algorithm::Algorithm::owe`) and settlements too, for one service and
//! without Redis; concurrency's slots in a `SlotTable`. For trying sluice out and for testing
//! the service's logic without a Redis; one replica only, and the state goes with the process.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use sluice::core::algorithm as filter;
use sluice::wire::exact::ExactStore;

use super::quota::{Demand, QuotaLedger, QuotaReport};
use super::settled_ids::SettledIds;
use crate::stores::memory_slots::{Ask, SlotTable};
use crate::stores::{
    settled_key, write_state_key, Algorithm, Check, Decision, FailureKind, SettleOp, Settled,
    Settlement, Slots, Store, StoreError, Watched,
};

/// Calls between two sweeps of the keys that are as good as empty.
const SWEEP_EVERY: u64 = 4096;

#[derive(Default)]
pub struct MemoryStore {
    state: Mutex<State>,
    /// The admin API's overrides, by name, and how many times they changed.
    overrides: Mutex<std::collections::BTreeMap<String, String>>,
    overrides_version: AtomicU64,
    /// The RLQS's demands.
    quota: Mutex<QuotaLedger>,
    calls: AtomicU64,
}

/// Every key's state: the algorithms' words, and the slots of concurrency limits; the ids of
/// the settlements applied lately.
#[derive(Default)]
struct State {
    words: ExactStore,
    slots: SlotTable,
    settled: SettledIds,
    /// The state key of the check being decided (`write_state_key`), kept for the next.
    key: String,
}

impl MemoryStore {
    /// The state, swept of idle keys every `SWEEP_EVERY` calls.
    fn state(&self, now_us: u64) -> Result<std::sync::MutexGuard<'_, State>, StoreError> {
        let mut state = (self.state.lock()).map_err(|_| failure("the store's lock is poisoned"))?;
        if self.calls.fetch_add(1, Relaxed).is_multiple_of(SWEEP_EVERY) {
            state.words.forget_idle(now_us);
            state.slots.forget_idle(now_us);
        }
        Ok(state)
    }

    fn decide(&self, checks: &[Check], now_us: u64) -> Result<Vec<Decision>, StoreError> {
        let mut state = self.state(now_us)?;
        (checks.iter())
            .map(|check| state.decide(check, now_us))
            .collect()
    }

    fn apply(&self, settlements: &[Settlement], now_us: u64) -> Result<Vec<Settled>, StoreError> {
        let mut state = self.state(now_us)?;
        (settlements.iter())
            .map(|settlement| {
                if !state.settled.first(settlement, now_us) {
                    return Ok(Settled::Duplicate);
                }
                state.settle(settlement, now_us).map(Settled::Applied)
            })
            .collect()
    }
}

impl State {
    fn decide(&mut self, check: &Check, now_us: u64) -> Result<Decision, StoreError> {
        let mut key = std::mem::take(&mut self.key);
        write_state_key(&mut key, check);
        let decision = self.decide_key(&key, check, now_us);
        self.key = key;
        decision
    }

    fn decide_key(
        &mut self,
        key: &str,
        check: &Check,
        now_us: u64,
    ) -> Result<Decision, StoreError> {
        if let Algorithm::Concurrency { limit, lease_us } = check.algorithm {
            return Ok(self.take_slots(key, check, limit, lease_us, now_us));
        }
        let limit = filter_limit(&check.algorithm)?;
        let cost = (check.cost, check.take);
        let (d, granted) = (self.words).decide_owing(key, limit, now_us, cost, check.debt);
        Ok(Decision {
            allowed: d.allowed,
            granted,
            remaining: d.remaining,
            reset_us: d.reset_after,
            retry_after_us: d.retry_after,
            delay_us: matches!(check.algorithm, Algorithm::LeakyBucket { .. }).then_some(d.delay),
        })
    }

    fn take_slots(
        &mut self,
        key: &str,
        check: &Check,
        limit: u64,
        lease_us: u64,
        now_us: u64,
    ) -> Decision {
        let ask = |name| Ask {
            limit,
            lease_us,
            cost: check.cost,
            take: check.take,
            name,
        };
        match &check.slots {
            Slots::GiveBack => self.slots.give_back(key, limit, check.take, now_us),
            Slots::Anonymous => self.slots.acquire(key, ask(None), now_us),
            Slots::Named(name) => self.slots.acquire(key, ask(Some(name)), now_us),
        }
    }

    fn settle(&mut self, settlement: &Settlement, now_us: u64) -> Result<u64, StoreError> {
        let key = settled_key(settlement);
        let algorithm = settlement.algorithm;
        Ok(match (&settlement.op, algorithm) {
            (&SettleOp::Charge { tokens, max_debt }, _) => {
                let limit = filter_limit(&algorithm)?;
                let cost = (tokens, tokens);
                (self.words)
                    .decide_owing(&key, limit, now_us, cost, max_debt)
                    .1
            }
            (&SettleOp::Refund { tokens, age_us }, _) => {
                let limit = filter_limit(&algorithm)?;
                let taken_at = now_us.saturating_sub(age_us);
                (self.words).refund(&key, limit, now_us, tokens, taken_at)
            }
            (SettleOp::Release { slot }, Algorithm::Concurrency { lease_us, .. }) => {
                self.slots.release(&key, slot, lease_us, now_us)
            }
            (SettleOp::Renew { slot }, Algorithm::Concurrency { lease_us, .. }) => {
                (self.slots).renew(&key, lease_us, slot, now_us)
            }
            (SettleOp::Release { .. } | SettleOp::Renew { .. }, _) => 0,
        })
    }
}

/// Microseconds of the system clock since the epoch.
fn now_us() -> Result<u64, StoreError> {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|_| failure("the clock is before 1970"))?;
    Ok(u64::try_from(since_epoch.as_micros()).unwrap_or(u64::MAX))
}

impl Store for MemoryStore {
    async fn check(&self, checks: &[Check]) -> Result<Vec<Decision>, StoreError> {
        self.decide(checks, now_us()?)
    }

    async fn settle(&self, settlements: &[Settlement]) -> Result<Vec<Settled>, StoreError> {
        self.apply(settlements, now_us()?)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn unrenewed(&self, keys: &[Watched]) -> Result<Vec<u64>, StoreError> {
        let now = now_us()?;
        let state = self.state(now)?;
        Ok((keys.iter())
            .map(|w| state.slots.stale(&w.key, now, w.stale_within_us))
            .collect())
    }

    async fn words(&self, state_key: &str) -> Result<Option<Vec<u64>>, StoreError> {
        let state = self.state(now_us()?)?;
        Ok(state.words.words(state_key).map(<[u64]>::to_vec))
    }

    async fn reset(&self, state_key: &str) -> Result<bool, StoreError> {
        let mut state = self.state(now_us()?)?;
        let words = state.words.forget(state_key);
        let slots = state.slots.forget(state_key);
        Ok(words || slots)
    }

    async fn put_override(&self, name: &str, value: &str, max: u64) -> Result<bool, StoreError> {
        let mut kept =
            (self.overrides.lock()).map_err(|_| failure("the store's lock is poisoned"))?;
        if !kept.contains_key(name) && kept.len() as u64 >= max {
            return Ok(false);
        }
        kept.insert(name.to_string(), value.to_string());
        self.overrides_version.fetch_add(1, Relaxed);
        Ok(true)
    }

    async fn delete_override(&self, name: &str) -> Result<bool, StoreError> {
        let mut kept =
            (self.overrides.lock()).map_err(|_| failure("the store's lock is poisoned"))?;
        let deleted = kept.remove(name).is_some();
        if deleted {
            self.overrides_version.fetch_add(1, Relaxed);
        }
        Ok(deleted)
    }

    async fn overrides_version(&self) -> Result<u64, StoreError> {
        Ok(self.overrides_version.load(Relaxed))
    }

    async fn overrides(&self) -> Result<Vec<(String, String)>, StoreError> {
        let kept = (self.overrides.lock()).map_err(|_| failure("the store's lock is poisoned"))?;
        Ok(kept.iter().map(|(n, v)| (n.clone(), v.clone())).collect())
    }

    async fn report_quota(&self, report: &QuotaReport) -> Result<Vec<Demand>, StoreError> {
        let now_ms = now_us()? / 1_000;
        let mut ledger =
            (self.quota.lock()).map_err(|_| failure("the store's lock is poisoned"))?;
        Ok(ledger.report(report, now_ms))
    }

    async fn hold_quota(
        &self,
        key: &str,
        envoy: &str,
        held: Option<u64>,
    ) -> Result<bool, StoreError> {
        let mut ledger =
            (self.quota.lock()).map_err(|_| failure("the store's lock is poisoned"))?;
        Ok(ledger.hold(key, envoy, held))
    }

    /// One process is one replica: none is dead.
    async fn beat_replica(&self, _replica: &str) -> Result<Vec<String>, StoreError> {
        Ok(Vec::new())
    }
}

/// The filter's algorithm for the store's numbers (`Algorithm::exact`).
fn filter_limit(algorithm: &Algorithm) -> Result<filter::Algorithm, StoreError> {
    algorithm
        .exact()
        .ok_or_else(|| failure("no such limit (or slots, which are not words)"))
}

fn failure(detail: &str) -> StoreError {
    StoreError {
        kind: FailureKind::Other,
        detail: detail.to_string(),
    }
}
