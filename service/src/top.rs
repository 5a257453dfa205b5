//! The heaviest keys of each policy, live, in fixed memory: by refusals and by consumption
//! (tokens granted by checks and charged by settlements), over the last minute and the last
//! hour, for `/v1/check`'s policies (the filter's global ones, merged over every Envoy that
//! calls) and the RLS's limits. Read through `/admin/v1/top` (`admin::top`) and logged once a
//! minute per policy that refused anything (`log_every`). Kept only with the admin API
//! (`--admin-token-file`): without it nothing is recorded.
//!
//! Each policy has two rings of `sluice::core::top_keys` sketches (`KEPT` keys each): seven slots of
//! 10 s for the minute, thirteen of 5 min for the hour. A record updates the current slot of
//! each; a read merges the live slots, so "the last minute" is the last 60 to 70 s and "the last
//! hour" the last 60 to 65 min. A count is never below the key's true count in that span and at
//! most `W / KEPT` above it (`W`: the span's refusals or tokens for that policy); the answer
//! gives each key's own `error`.
//!
//! Memory: at most `MAX_POLICIES` policies × 20 slots (both rings) × 2 measures × `2 × KEPT`
//! entries: 327,680 entries, measured at 26 MiB filled (`examples/top_cost.rs`), plus for the
//! RLS a shown text of at most `MAX_SHOWN_BYTES` per key. Policies past the bound are not
//! recorded (`untracked` counts their records), except those `--metric-policies` lists, which
//! are always recorded (5,120 entries more each), so that a caller sending made-up policy names
//! cannot crowd them out.
//!
//! What a key shows as: the service never sees a `/v1/check` key's value, only its hash
//! (`<policy>/<16 hex digits>`, the hash the filter's access log and `bypass.key_hash` write), so
//! that is all it shows; a key of another form is not recorded. An RLS key is the hash of its
//! descriptor's entries (`key`, the one `sluice keys show --namespace rls` takes); the values of
//! the entries named by `--rls-top-show` are shown too, every other entry as its key alone.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use sluice::core::top_keys::{
    shown_text, Counted, Ring, Slot, TopKeys, HOUR_SLOTS, HOUR_SLOT_S, MINUTE_SLOTS, MINUTE_SLOT_S,
};
pub use sluice::core::top_keys::{By, Totals, Window};
use tracing::info;

use crate::stores::{Algorithm, Check, Decision, Namespace, SettleOp, Settled, Settlement};

/// Keys each sketch keeps (it counts up to twice as many).
pub const KEPT: usize = sluice::core::top_keys::KEPT_LIVE;
/// Policies recorded, both namespaces together.
pub const MAX_POLICIES: usize = 64;
pub use sluice::core::top_keys::MAX_SHOWN_BYTES;
/// The most keys one answer lists.
pub const MAX_LIMIT: usize = KEPT;
/// Keys a minute's log record names.
pub const LOGGED_KEYS: usize = 5;
/// The limits a policy's checks used that it keeps (`Summary::limits`), the latest.
pub const LIMITS_KEPT: usize = 4;

/// How an RLS key shows: the hash that names it, and its entries as the operator lets them be
/// shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown {
    pub key: Box<str>,
    pub parts: Box<str>,
}

fn sketch(slot: &Slot<Arc<Shown>>, by: By) -> &TopKeys<Arc<Shown>> {
    match by {
        By::Refused => &slot.refused,
        By::Consumed => &slot.consumed,
    }
}

fn totals(ring: &Ring<Arc<Shown>>, now_s: u64) -> Totals {
    Totals::of(ring, now_s)
}

/// One policy's rings.
#[derive(Debug)]
struct Policy {
    namespace: Namespace,
    name: String,
    minute: Ring<Arc<Shown>>,
    hour: Ring<Arc<Shown>>,
    /// The limits its checks used, each with when it was last used: where its keys' states
    /// are (`store::state_key`), so an operator can reset a key it ranks without knowing them.
    limits: Vec<(Algorithm, u64)>,
}

impl Policy {
    fn ring(&self, window: Window) -> &Ring<Arc<Shown>> {
        match window {
            Window::Minute => &self.minute,
            Window::Hour => &self.hour,
        }
    }

    /// Notes that a check used `limit` at `now_s`: `limits` is kept least recent first, and
    /// past `LIMITS_KEPT` the least recent is forgotten.
    fn saw(&mut self, limit: Algorithm, now_s: u64) {
        if let Some(last) = self.limits.last_mut().filter(|(l, _)| *l == limit) {
            last.1 = now_s;
            return;
        }
        if let Some(index) = self.limits.iter().position(|(l, _)| *l == limit) {
            self.limits.remove(index);
        } else if self.limits.len() >= LIMITS_KEPT {
            self.limits.remove(0);
        }
        self.limits.push((limit, now_s));
    }

    /// The limits used in the hour before `now_s`, the latest first.
    fn limits(&self, now_s: u64) -> Vec<Algorithm> {
        let hour_s = HOUR_SLOT_S * (HOUR_SLOTS as u64 - 1);
        (self.limits.iter().rev())
            .filter(|(_, at)| now_s.saturating_sub(*at) <= hour_s)
            .map(|(limit, _)| *limit)
            .collect()
    }
}

/// What is recorded of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    /// A check allowed.
    Allowed,
    /// A check refused.
    Refused,
    /// A settlement's charge after admission (an LLM call's usage beyond its reservation):
    /// consumption only.
    Charged,
}

/// One decision (or charge) to record.
pub struct Record<'a> {
    pub namespace: Namespace,
    /// `/v1/check`: the policy; the RLS: `<domain>/<limit's policy name>`, given in two parts
    /// so that nothing is allocated unless the policy is new.
    pub policy: (&'a str, &'a str),
    pub key: u64,
    pub what: What,
    /// Tokens granted (for a refusal that owes, those charged; for a charge, its tokens).
    pub consumed: u64,
    /// The limit whose state the check or charge used (`Check::state_of`, else its own).
    pub limit: Option<Algorithm>,
}

/// The ranking asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranking {
    pub totals: Totals,
    /// The bound of every key's `error`: the sum of the live slots' floors (≤ W / `KEPT`).
    pub error_bound: u64,
    pub keys: Vec<Counted<Arc<Shown>>>,
}

/// A policy recorded, with its counts over both windows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub namespace: Namespace,
    pub policy: String,
    pub minute: Totals,
    pub hour: Totals,
    /// Each window's totals slot by slot, oldest first (`Totals::series`).
    pub minute_slots: Vec<Totals>,
    pub hour_slots: Vec<Totals>,
    /// The limits its checks used in the last hour, the latest first (at most `LIMITS_KEPT`).
    pub limits: Vec<Algorithm>,
}

/// Every policy's rings, behind one lock to find a policy and one per policy.
pub struct TopRecorder {
    policies: RwLock<HashMap<u64, Arc<Mutex<Policy>>>>,
    seed: u64,
    epoch: Instant,
    untracked: std::sync::atomic::AtomicU64,
    /// `/v1/check` policies always recorded (`--metric-policies`), past `MAX_POLICIES` too: a
    /// caller sending made-up policy names cannot crowd them out.
    listed: Vec<String>,
    /// Policies recorded that are not `listed`: at most `MAX_POLICIES`.
    unlisted: std::sync::atomic::AtomicUsize,
}

impl Default for TopRecorder {
    fn default() -> Self {
        TopRecorder {
            policies: RwLock::default(),
            seed: std::collections::hash_map::RandomState::new().hash_one(0xcbf2_9ce4_8422_2325u64),
            epoch: Instant::now(),
            untracked: std::sync::atomic::AtomicU64::new(0),
            listed: Vec::new(),
            unlisted: std::sync::atomic::AtomicUsize::new(0),
        }
    }
}

fn name_of(namespace: Namespace, (first, second): (&str, &str)) -> String {
    match namespace {
        Namespace::Http => first.to_string(),
        Namespace::Rls => format!("{first}/{second}"),
    }
}

fn is_name(policy: &Policy, namespace: Namespace, (first, second): (&str, &str)) -> bool {
    policy.namespace == namespace
        && match namespace {
            Namespace::Http => policy.name == first,
            Namespace::Rls => {
                let rest = policy.name.strip_prefix(first);
                rest.and_then(|r| r.strip_prefix('/')) == Some(second)
            }
        }
}

impl TopRecorder {
    /// A recorder that always records the `/v1/check` policies `listed`.
    pub fn with_listed(listed: &[String]) -> TopRecorder {
        TopRecorder {
            listed: listed.to_vec(),
            ..TopRecorder::default()
        }
    }

    fn is_listed(&self, namespace: Namespace, (first, _): (&str, &str)) -> bool {
        namespace == Namespace::Http && self.listed.iter().any(|l| l == first)
    }

    /// Seconds since the recorder was made: the rings' clock.
    pub fn now_s(&self) -> u64 {
        self.epoch.elapsed().as_secs()
    }

    /// FNV-1a of the names under a seed of this process: policy names are few (at most
    /// `MAX_POLICIES` are kept, and a lookup compares the name), so a short hash is enough.
    fn id(&self, namespace: Namespace, (first, second): (&str, &str)) -> u64 {
        let bytes = (first.bytes())
            .chain([0xff, namespace as u8])
            .chain(second.bytes());
        bytes.fold(self.seed, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    }

    fn policy(&self, namespace: Namespace, name: (&str, &str)) -> Option<Arc<Mutex<Policy>>> {
        let id = self.id(namespace, name);
        let policies = self.policies.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(policy) = policies.get(&id) {
            return Some(Arc::clone(policy));
        }
        let listed = self.is_listed(namespace, name);
        drop(policies);
        let unlisted = &self.unlisted;
        if !listed && unlisted.load(std::sync::atomic::Ordering::Relaxed) >= MAX_POLICIES {
            return None;
        }
        let mut policies = (self.policies.write()).unwrap_or_else(PoisonError::into_inner);
        if !policies.contains_key(&id) && !listed {
            if unlisted.load(std::sync::atomic::Ordering::Relaxed) >= MAX_POLICIES {
                return None;
            }
            unlisted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let made = policies.entry(id).or_insert_with(|| {
            Arc::new(Mutex::new(Policy {
                namespace,
                name: name_of(namespace, name),
                minute: Ring::new(MINUTE_SLOT_S, MINUTE_SLOTS, KEPT),
                hour: Ring::new(HOUR_SLOT_S, HOUR_SLOTS, KEPT),
                limits: Vec::new(),
            }))
        });
        Some(Arc::clone(made))
    }

    /// Records one decision now; `shown` is asked only for a key new to a sketch.
    pub fn record(&self, record: &Record, shown: impl Fn() -> Option<Arc<Shown>>) {
        self.record_at(self.now_s(), record, shown);
    }

    /// `record` at `now_s` (seconds on the recorder's clock).
    pub fn record_at(&self, now_s: u64, record: &Record, shown: impl Fn() -> Option<Arc<Shown>>) {
        let id = self.id(record.namespace, record.policy);
        let policies = self.policies.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(policy) = policies.get(&id) {
            let mut policy = policy.lock().unwrap_or_else(PoisonError::into_inner);
            Self::record_in(&mut policy, now_s, record, shown);
            return;
        }
        drop(policies);
        let Some(policy) = self.policy(record.namespace, record.policy) else {
            self.untracked
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return;
        };
        let mut policy = policy.lock().unwrap_or_else(PoisonError::into_inner);
        Self::record_in(&mut policy, now_s, record, shown);
    }

    fn record_in(
        policy: &mut Policy,
        now_s: u64,
        record: &Record,
        shown: impl Fn() -> Option<Arc<Shown>>,
    ) {
        if !is_name(policy, record.namespace, record.policy) {
            return;
        }
        if let Some(limit) = record.limit {
            policy.saw(limit, now_s);
        }
        let Policy { minute, hour, .. } = policy;
        for ring in [minute, hour] {
            let Some(slot) = ring.at(now_s) else {
                continue;
            };
            match record.what {
                What::Refused => slot.refused.add(record.key, &shown),
                What::Allowed => slot.allowed += 1,
                What::Charged => {}
            }
            slot.consumed
                .add_weighted(record.key, record.consumed, &shown);
        }
    }

    /// Keys counted now, in every sketch of every policy: at most `MAX_POLICIES` × 20 slots × 2
    /// measures × `2 × KEPT` (plus the listed policies').
    pub fn entries(&self) -> usize {
        let policies = self.policies.read().unwrap_or_else(PoisonError::into_inner);
        (policies.values())
            .map(|policy| {
                let policy = policy.lock().unwrap_or_else(PoisonError::into_inner);
                (policy.minute.slots().iter().chain(policy.hour.slots()))
                    .map(|slot| slot.refused.len() + slot.consumed.len())
                    .sum::<usize>()
            })
            .sum()
    }

    /// Forgets `key`'s refusals (`Ring::forget_refusals`) in the policies of `namespace` that
    /// `policy` names (every one, for `None`): its state was reset. Its consumption stays.
    pub fn forget_refusals(&self, namespace: Namespace, policy: Option<&str>, key: u64) -> bool {
        let policies = self.policies.read().unwrap_or_else(PoisonError::into_inner);
        let mut forgot = false;
        for policy_rings in policies.values() {
            let mut rings = policy_rings.lock().unwrap_or_else(PoisonError::into_inner);
            if rings.namespace != namespace || policy.is_some_and(|p| p != rings.name) {
                continue;
            }
            forgot |= rings.minute.forget_refusals(key);
            forgot |= rings.hour.forget_refusals(key);
        }
        forgot
    }

    /// Records not kept because `MAX_POLICIES` policies were recorded already.
    pub fn untracked(&self) -> u64 {
        self.untracked.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The `limit` keys of `policy` ranked `by` over `window`; `None` for a policy never
    /// recorded.
    pub fn ranking(
        &self,
        now_s: u64,
        namespace: Namespace,
        policy: &str,
        by: By,
        window: Window,
        limit: usize,
    ) -> Option<Ranking> {
        let name = match namespace {
            Namespace::Http => (policy, ""),
            Namespace::Rls => policy.rsplit_once('/').unwrap_or((policy, "")),
        };
        let policies = self.policies.read().unwrap_or_else(PoisonError::into_inner);
        let policy = Arc::clone(policies.get(&self.id(namespace, name))?);
        drop(policies);
        let policy = policy.lock().unwrap_or_else(PoisonError::into_inner);
        if !is_name(&policy, namespace, name) {
            return None;
        }
        let ring = policy.ring(window);
        let sketches: Vec<&TopKeys<Arc<Shown>>> =
            ring.live(now_s).map(|slot| sketch(slot, by)).collect();
        Some(Ranking {
            totals: totals(ring, now_s),
            error_bound: sketches.iter().map(|s| s.floor()).sum(),
            keys: TopKeys::merge(&sketches, limit),
        })
    }

    /// Every policy recorded, sorted by namespace and name.
    pub fn summaries(&self, now_s: u64) -> Vec<Summary> {
        let policies: Vec<Arc<Mutex<Policy>>> = (self.policies.read())
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        let mut all: Vec<Summary> = (policies.iter())
            .map(|policy| {
                let policy = policy.lock().unwrap_or_else(PoisonError::into_inner);
                Summary {
                    namespace: policy.namespace,
                    policy: policy.name.clone(),
                    minute: totals(&policy.minute, now_s),
                    hour: totals(&policy.hour, now_s),
                    minute_slots: Totals::series(&policy.minute, now_s),
                    hour_slots: Totals::series(&policy.hour, now_s),
                    limits: policy.limits(now_s),
                }
            })
            .collect();
        all.sort_by(|a, b| {
            (namespace_name(a.namespace), &a.policy).cmp(&(namespace_name(b.namespace), &b.policy))
        });
        all
    }

    /// The log record of each policy that refused anything in the last minute: `top refused
    /// keys`, with its counts and its most refused keys as `KEY=COUNT` (key hashes only).
    pub fn log_minute(&self, now_s: u64) {
        for summary in self.summaries(now_s) {
            if summary.minute.refused == 0 {
                continue;
            }
            let namespace = namespace_name(summary.namespace);
            let ranking = self.ranking(
                now_s,
                summary.namespace,
                &summary.policy,
                By::Refused,
                Window::Minute,
                LOGGED_KEYS,
            );
            let Some(ranking) = ranking else {
                continue;
            };
            let top: Vec<String> = (ranking.keys.iter())
                .map(|c| format!("{}={}", key_text(summary.namespace, c), c.count))
                .collect();
            let Totals {
                allowed,
                refused,
                consumed,
            } = summary.minute;
            info!(
                namespace,
                policy = summary.policy.as_str(),
                window = "1m",
                allowed,
                refused,
                consumed,
                error_bound = ranking.error_bound,
                top = top.join(" ").as_str(),
                "top refused keys"
            );
        }
    }
}

/// Records `/v1/check`'s decisions: those of keys the filter writes (`http_key`).
pub fn record_checks(recorder: &TopRecorder, checks: &[Check], decisions: &[Decision]) {
    let now_s = recorder.now_s();
    for (check, decision) in checks.iter().zip(decisions) {
        let Some((policy, key)) = http_key(&check.key) else {
            continue;
        };
        let record = Record {
            namespace: Namespace::Http,
            policy: (policy, ""),
            key,
            what: if decision.allowed {
                What::Allowed
            } else {
                What::Refused
            },
            consumed: decision.granted,
            limit: Some(check.state_of.unwrap_or(check.algorithm)),
        };
        recorder.record_at(now_s, &record, || None);
    }
}

/// Records what `/v1/settle`'s charges took: consumption beyond the checks' grants. Refunds are
/// not taken off (a sketch only adds), so a key whose reservations exceed its use shows what
/// it reserved.
pub fn record_settlements(recorder: &TopRecorder, settlements: &[Settlement], done: &[Settled]) {
    let now_s = recorder.now_s();
    for (settlement, done) in settlements.iter().zip(done) {
        let (SettleOp::Charge { .. }, Settled::Applied(tokens)) = (&settlement.op, done) else {
            continue;
        };
        let Some((policy, key)) = http_key(&settlement.key) else {
            continue;
        };
        let record = Record {
            namespace: Namespace::Http,
            policy: (policy, ""),
            key,
            what: What::Charged,
            consumed: *tokens,
            limit: Some(settlement.algorithm),
        };
        recorder.record_at(now_s, &record, || None);
    }
}

/// Writes `log_minute` every `every` (a minute, but for tests), for ever.
pub async fn log_every(recorder: Arc<TopRecorder>, every: Duration) {
    let mut every = tokio::time::interval(every);
    every.tick().await;
    loop {
        every.tick().await;
        recorder.log_minute(recorder.now_s());
    }
}

pub fn namespace_name(namespace: Namespace) -> &'static str {
    match namespace {
        Namespace::Http => "http",
        Namespace::Rls => "rls",
    }
}

/// How a counted key is named: its hash as the filter's logs write it (16 hex digits), or the
/// RLS key's hash.
pub fn key_text(namespace: Namespace, counted: &Counted<Arc<Shown>>) -> String {
    match (namespace, &counted.value) {
        (Namespace::Rls, Some(shown)) => shown.key.to_string(),
        _ => format!("{:016x}", counted.key),
    }
}

/// A `/v1/check` key's policy and hash, if it is `<policy>/<16 hex digits>` as the filter writes
/// it (`sluice::wire::protocol::key`).
pub fn http_key(key: &str) -> Option<(&str, u64)> {
    let (policy, hash) = key.rsplit_once('/')?;
    if hash.len() != 16 || policy.is_empty() {
        return None;
    }
    let hash = u64::from_str_radix(hash, 16).ok()?;
    Some((policy, hash))
}

/// An RLS key (the 32 hex digits of `store::hashed_key_of`) as a sketch's key: its first 64 bits.
pub fn rls_key(key: &str) -> Option<u64> {
    u64::from_str_radix(key.get(..16)?, 16).ok()
}

/// The text an RLS key shows (`shown_text`, the filter's rule too): each entry as `key=value`
/// when `show` names it, else its key alone with `=#` (hashed, never shown).
pub fn rls_shown<'e>(
    key: &str,
    entries: impl Iterator<Item = (&'e str, &'e str)>,
    show: &[String],
) -> Shown {
    let entries = entries.map(|(name, value)| {
        let shown = show.iter().any(|s| s == name);
        (name, shown.then_some(value.as_bytes()))
    });
    let parts = shown_text(entries);
    Shown {
        key: key.into(),
        parts: parts.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http<'a>(policy: &'a str, key: u64, refused: bool, consumed: u64) -> Record<'a> {
        Record {
            namespace: Namespace::Http,
            policy: (policy, ""),
            key,
            what: if refused {
                What::Refused
            } else {
                What::Allowed
            },
            consumed,
            limit: None,
        }
    }

    fn keys(ranking: &Ranking) -> Vec<(u64, u64)> {
        ranking.keys.iter().map(|c| (c.key, c.count)).collect()
    }

    #[test]
    fn a_heavy_key_tops_refusals_and_a_big_spender_tops_consumption() {
        let top = TopRecorder::default();
        for i in 0..10_000u64 {
            top.record_at(5, &http("api", 1_000 + i, false, 1), || None);
            top.record_at(5, &http("api", 7, true, 0), || None);
        }
        top.record_at(6, &http("api", 9, false, 50_000), || None);
        let refused = top
            .ranking(6, Namespace::Http, "api", By::Refused, Window::Minute, 3)
            .unwrap();
        assert_eq!(keys(&refused), [(7, 10_000)]);
        assert_eq!(refused.totals.refused, 10_000);
        assert_eq!(refused.totals.allowed, 10_001);
        let consumed = top
            .ranking(6, Namespace::Http, "api", By::Consumed, Window::Hour, 1)
            .unwrap();
        let best = &consumed.keys[0];
        assert_eq!(best.key, 9);
        assert!(best.count >= 50_000 && best.count - best.error <= 50_000);
        assert!(best.error <= consumed.error_bound);
        assert!(consumed.error_bound <= consumed.totals.consumed / KEPT as u64);
    }

    #[test]
    fn three_heavy_keys_top_a_flood_of_100_000_within_the_stated_error_and_memory() {
        let top = TopRecorder::default();
        // Each heavy key has more than W / KEPT (111,000 / 64 = 1,734) refusals: what the bound
        // guarantees to be listed, and above every light key.
        let heavy = [(1u64, 5_000u64), (2, 4_000), (3, 2_000)];
        let mut now_s = 0;
        for i in 0..100_000u64 {
            now_s = i / 2_000; // 50 s
            top.record_at(now_s, &http("api", 1_000_000 + i, true, 0), || None);
            for (key, times) in heavy {
                if i % (100_000 / times) == 0 {
                    top.record_at(now_s, &http("api", key, true, 0), || None);
                }
            }
        }
        for window in [Window::Minute, Window::Hour] {
            let ranking = top
                .ranking(now_s, Namespace::Http, "api", By::Refused, window, 3)
                .unwrap();
            assert_eq!(ranking.totals.refused, 111_000);
            assert!(ranking.error_bound <= 111_000 / KEPT as u64, "{ranking:?}");
            for (counted, (key, times)) in ranking.keys.iter().zip(heavy) {
                assert_eq!(counted.key, key);
                assert!(counted.count >= times && counted.count - counted.error <= times);
                assert!(counted.error <= ranking.error_bound);
            }
        }
        assert!(top.entries() <= 20 * 2 * 2 * KEPT, "{}", top.entries());
    }

    #[test]
    fn the_minute_forgets_after_seventy_seconds_and_the_hour_after_sixty_five_minutes() {
        let top = TopRecorder::default();
        top.record_at(0, &http("api", 7, true, 0), || None);
        let at = |now, window| {
            let r = top.ranking(now, Namespace::Http, "api", By::Refused, window, 5);
            keys(&r.unwrap())
        };
        assert_eq!(at(69, Window::Minute), [(7, 1)]);
        assert_eq!(at(70, Window::Minute), []);
        assert_eq!(at(3_899, Window::Hour), [(7, 1)]);
        assert_eq!(at(3_900, Window::Hour), []);
        // A slot used again is emptied first.
        top.record_at(70, &http("api", 8, true, 0), || None);
        assert_eq!(at(70, Window::Minute), [(8, 1)]);
        assert_eq!(at(70, Window::Hour), [(7, 1), (8, 1)]);
    }

    #[test]
    fn policies_are_bounded_and_unknown_ones_have_no_ranking() {
        let top = TopRecorder::default();
        let names: Vec<String> = (0..MAX_POLICIES + 3).map(|i| format!("p{i}")).collect();
        for name in &names {
            top.record_at(1, &http(name, 1, true, 0), || None);
        }
        assert_eq!(top.summaries(1).len(), MAX_POLICIES);
        assert_eq!(top.untracked(), 3);
        let last = names.last().unwrap();
        assert!(top
            .ranking(1, Namespace::Http, last, By::Refused, Window::Minute, 1)
            .is_none());
        assert!(top
            .ranking(1, Namespace::Rls, "p0", By::Refused, Window::Minute, 1)
            .is_none());
    }

    #[test]
    fn made_up_policies_cannot_crowd_out_a_listed_one() {
        let top = TopRecorder::with_listed(&["checkout".to_string()]);
        for i in 0..MAX_POLICIES + 10 {
            top.record_at(1, &http(&format!("fake{i}"), 1, true, 0), || None);
        }
        top.record_at(1, &http("checkout", 1, true, 0), || None);
        top.record_at(1, &http("fake-late", 1, true, 0), || None);
        assert_eq!(top.summaries(1).len(), MAX_POLICIES + 1);
        assert!(top
            .ranking(
                1,
                Namespace::Http,
                "checkout",
                By::Refused,
                Window::Minute,
                1
            )
            .is_some());
        assert_eq!(top.untracked(), 11);
    }

    #[test]
    fn a_policy_keeps_the_latest_limits_of_the_hour_and_a_reset_forgets_refusals() {
        let top = TopRecorder::default();
        let bucket = |burst| Algorithm::TokenBucket {
            interval_us: 1_000,
            burst,
        };
        for (now_s, burst) in [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 2)] {
            let record = Record {
                limit: Some(bucket(burst)),
                ..http("api", 7, true, 0)
            };
            top.record_at(now_s, &record, || None);
        }
        let limits = |now_s| top.summaries(now_s)[0].limits.clone();
        assert_eq!(limits(5), [bucket(2), bucket(5), bucket(4), bucket(3)]);
        assert_eq!(limits(3_605), [bucket(2)], "an hour on, the one used since");
        assert_eq!(limits(3_606), []);

        top.record_at(5, &http("api", 8, true, 0), || None);
        assert!(!top.forget_refusals(Namespace::Http, Some("web"), 7));
        assert!(top.forget_refusals(Namespace::Http, Some("api"), 7));
        let refused = top.ranking(5, Namespace::Http, "api", By::Refused, Window::Hour, 3);
        assert_eq!(keys(&refused.unwrap()), [(8, 1)]);
        assert_eq!(top.summaries(5)[0].hour.refused, 7, "the totals keep them");
    }

    #[test]
    fn rls_policies_are_domain_slash_policy_and_show_only_the_entries_named() {
        let top = TopRecorder::default();
        let record = Record {
            namespace: Namespace::Rls,
            policy: ("edge", "per_key"),
            key: 5,
            what: What::Refused,
            consumed: 1,
            limit: None,
        };
        let show = vec!["user".to_string()];
        let entries = [("user", "alice"), ("api_key", "sk-secret")];
        let shown = rls_shown("0123", entries.into_iter(), &show);
        assert_eq!(&*shown.parts, "user=alice api_key=#");
        let shown = Arc::new(shown);
        top.record_at(1, &record, || Some(Arc::clone(&shown)));
        let ranking = top
            .ranking(
                1,
                Namespace::Rls,
                "edge/per_key",
                By::Refused,
                Window::Minute,
                5,
            )
            .unwrap();
        assert_eq!(key_text(Namespace::Rls, &ranking.keys[0]), "0123");
        assert_eq!(top.summaries(1)[0].policy, "edge/per_key");
    }

    #[test]
    fn only_keys_the_filter_writes_are_http_keys() {
        assert_eq!(
            http_key("per-user/3f5b0c8e21d47a96"),
            Some(("per-user", 0x3f5b_0c8e_21d4_7a96))
        );
        assert_eq!(http_key("per-user/alice"), None);
        assert_eq!(http_key("3f5b0c8e21d47a96"), None);
        assert_eq!(
            rls_key("0123456789abcdef0123456789abcdef"),
            Some(0x0123_4567_89ab_cdef)
        );
    }

    #[test]
    fn control_characters_are_not_shown() {
        let value = "alice\u{1b}[2J\n";
        let shown = rls_shown("k", [("user", value)].into_iter(), &["user".into()]);
        assert_eq!(&*shown.parts, "user=alice?[2J?");
    }

    #[test]
    fn the_shown_text_is_cut_on_a_character_boundary() {
        let long = "é".repeat(200);
        let shown = rls_shown("k", [("user", long.as_str())].into_iter(), &["user".into()]);
        assert!(shown.parts.len() <= MAX_SHOWN_BYTES);
    }
}
