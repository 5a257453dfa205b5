//! One decision for one request: which policies apply, their keys, and their buckets, read and
//! updated with compare-and-swap so every worker shares one budget.
//!
//! Layered limits: all applicable policies are checked against one snapshot first; if any
//! enforcing policy denies, nothing is written and the request is denied. Otherwise each table's
//! slot is written with CAS. When a CAS loses a race, that table alone is read and decided again;
//! if it now denies, the tables written before it keep their charge (a race can over-charge a
//! request once, never over-admit).

use crate::config::{Plan, Policy, Tier};
use crate::gcra::{check, Decision};
use crate::key::{hash_key, MISSING_KEY};
use crate::request::{Attributes, RequestSource};
use crate::store::{Store, StoreError};
use crate::table::{find, write, Slot};

/// Attempts per table before giving up on a contended slot.
pub const MAX_ATTEMPTS: u32 = 8;

/// A policy that applied to the request, with its verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub policy: usize,
    /// The key's hash: what logs may show of the key.
    pub key: u64,
    pub tier: Tier,
    pub decision: Decision,
}

/// Everything the glue needs to answer, count and log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub applied: Vec<Applied>,
    /// The enforcing policy whose denial stands (the longest wait), if any.
    pub denied_by: Option<Applied>,
    pub cas_retries: u32,
    pub evictions: u32,
    /// A slot stayed contended (or the store failed) through every attempt: the request is
    /// denied rather than let through unmetered.
    pub exhausted: bool,
}

impl Outcome {
    pub fn is_denied(&self) -> bool {
        self.denied_by.is_some() || self.exhausted
    }
}

/// The policies of one table that apply to this request, and the key they share.
struct Work<'p> {
    table: usize,
    hash: u64,
    members: Vec<(usize, &'p Policy, Tier)>,
    slot: Slot,
    decisions: Vec<Decision>,
}

/// Decides the request at `now` (Unix nanoseconds). `prefix` namespaces the shared-data keys.
pub fn evaluate<R: RequestSource + ?Sized>(
    plan: &Plan,
    prefix: &str,
    request: &mut Attributes<R>,
    store: &impl Store,
    now: u64,
) -> Outcome {
    let mut outcome = Outcome::default();
    let mut works = gather(plan, request);
    for work in &mut works {
        reload(work, plan, prefix, store, now);
    }
    if let Some(denial) = strictest_denial(&works) {
        outcome.denied_by = Some(denial);
        outcome.applied = applied(&works);
        return outcome;
    }
    for work in &mut works {
        if let Err(stop) = commit(work, plan, prefix, store, now, &mut outcome) {
            outcome.denied_by = stop;
            outcome.exhausted = stop.is_none();
            break;
        }
    }
    outcome.evictions += works
        .iter()
        .filter(|w| w.slot.evicts && w.decisions.iter().any(|d| d.allowed))
        .count() as u32;
    outcome.applied = applied(&works);
    outcome
}

/// Writes one table, re-deciding after each lost race. `Err(Some(denial))`: the fresh read
/// denies; `Err(None)`: attempts ran out or the store failed.
fn commit(
    work: &mut Work,
    plan: &Plan,
    prefix: &str,
    store: &impl Store,
    now: u64,
    outcome: &mut Outcome,
) -> Result<(), Option<Applied>> {
    for attempt in 1..=MAX_ATTEMPTS {
        if !work.decisions.iter().any(|d| d.allowed) {
            return Ok(());
        }
        let mut slot = work.slot.clone();
        for ((_, policy, _), decision) in work.members.iter().zip(&work.decisions) {
            if let Some(tat) = slot.tats.get_mut(policy.column) {
                *tat = decision.tat;
            }
        }
        match write(store, &slot, work.hash) {
            Ok(()) => return Ok(()),
            Err(StoreError::Failed) => return Err(None),
            Err(StoreError::CasMismatch) if attempt < MAX_ATTEMPTS => {
                outcome.cas_retries += 1;
                reload(work, plan, prefix, store, now);
                if let Some(denial) = strictest_denial(std::slice::from_ref(work)) {
                    return Err(Some(denial));
                }
            }
            Err(StoreError::CasMismatch) => {}
        }
    }
    Err(None)
}

/// The applicable policies, grouped by table, with their keys and tiers. Policies whose key is
/// missing drop out, unless they share one bucket for all such requests.
fn gather<'p, R: RequestSource + ?Sized>(
    plan: &'p Plan,
    request: &mut Attributes<R>,
) -> Vec<Work<'p>> {
    let mut matched: Vec<(usize, &Policy)> = plan
        .policies
        .iter()
        .enumerate()
        .filter(|(_, p)| !p.fallback && p.matcher.matches(request))
        .collect();
    if matched.is_empty() {
        matched = plan
            .policies
            .iter()
            .enumerate()
            .filter(|(_, p)| p.fallback)
            .collect();
    }
    let mut works: Vec<Work> = Vec::new();
    for (index, policy) in matched {
        let member = (index, policy, tier_of(policy, request));
        if let Some(work) = works.iter_mut().find(|w| w.table == policy.table) {
            if work.hash != MISSING_KEY || policy.share_missing_key {
                work.members.push(member);
            }
            continue;
        }
        let key = plan
            .tables
            .get(policy.table)
            .and_then(|t| hash_key(&t.key, request));
        let hash = match key {
            Some(hash) => hash,
            None if policy.share_missing_key => MISSING_KEY,
            None => continue,
        };
        works.push(Work {
            table: policy.table,
            hash,
            members: vec![member],
            slot: Slot::default(),
            decisions: Vec::new(),
        });
    }
    works
}

fn tier_of<R: RequestSource + ?Sized>(policy: &Policy, request: &mut Attributes<R>) -> Tier {
    policy
        .tiers
        .as_ref()
        .and_then(|(by, tiers)| {
            by.resolve(request)
                .and_then(|(_, value)| tiers.get(&value).copied())
        })
        .unwrap_or(policy.tier)
}

/// Reads the table's slot and decides every member policy against it.
fn reload(work: &mut Work, plan: &Plan, prefix: &str, store: &impl Store, now: u64) {
    let Some(spec) = plan.tables.get(work.table) else {
        return;
    };
    work.slot = find(store, prefix, spec, work.hash, now);
    work.decisions = work
        .members
        .iter()
        .map(|(_, policy, tier)| {
            let tat = work.slot.tats.get(policy.column).copied().unwrap_or(0);
            check(&tier.rate, tat, now, policy.cost)
        })
        .collect();
}

impl Work<'_> {
    fn applied(&self) -> impl Iterator<Item = (Applied, bool)> + '_ {
        self.members
            .iter()
            .zip(&self.decisions)
            .map(|(&(policy, p, tier), &decision)| {
                (
                    Applied {
                        policy,
                        key: self.hash,
                        tier,
                        decision,
                    },
                    p.shadow,
                )
            })
    }
}

fn applied(works: &[Work]) -> Vec<Applied> {
    works
        .iter()
        .flat_map(Work::applied)
        .map(|(a, _)| a)
        .collect()
}

/// Among enforcing denials, the one with the longest wait: the client must wait that long anyway.
fn strictest_denial(works: &[Work]) -> Option<Applied> {
    works
        .iter()
        .flat_map(Work::applied)
        .filter(|(a, shadow)| !a.decision.allowed && !shadow)
        .map(|(a, _)| a)
        .max_by_key(|a| a.decision.retry_after)
}
