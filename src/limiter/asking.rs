//! Asking the service about a request's global members: the checks of those that wait, the
//! answers recorded on them, the slots they name, and what the service may hold of a request
//! that keeps none of it, to give back.

use super::global::slot_name;
use super::member::{Member, Service};
use super::work::Work;
use super::{Basis, Progress};
use crate::config::{key_check, Plan, Policy, Scope};
use crate::core::algorithm::Kind;
use crate::limiter::tab::{Entry, Held, Tab};
use crate::wire::protocol::{Answer, Check};

/// Records the service's answers (`None`: the call failed) on the members that asked.
pub(super) fn record(progress: &mut Progress, answers: Option<&[Answer]>) {
    let asked = std::mem::take(&mut progress.asked);
    for (i, (w, m)) in asked.into_iter().enumerate() {
        let member = progress.works.get_mut(w).and_then(|w| w.members.get_mut(m));
        if let Some(member) = member {
            let answer = answers.and_then(|a| a.get(i)).copied();
            member.service = answer.map_or(Service::Failed, Service::Answered);
        }
    }
}

/// Prepares the next call: a check for every member that waits for the service.
pub(super) fn ask(plan: &Plan, progress: &mut Progress) {
    progress.round += 1;
    progress.asked.clear();
    progress.checks.clear();
    for (w, work) in progress.works.iter().enumerate() {
        let waiting = work.members.iter().zip(&work.verdicts).enumerate();
        for (m, (member, _)) in waiting.filter(|(_, (_, verdict))| verdict.is_none()) {
            let policy = plan.policies.get(member.policy);
            if let Some(policy) = policy.filter(|p| matches!(p.scope, Scope::Global(_))) {
                progress.asked.push((w, m));
                progress.checks.push(check(policy, member, work));
            }
        }
    }
}

/// The question about one member's key, named by its shared hash: the same in every Envoy (and,
/// for an RLS, by its descriptor).
fn check(policy: &Policy, member: &Member, work: &Work) -> Check {
    let capacity = member.tier.algorithm.capacity();
    let entries = work.entries.as_deref();
    Check {
        // A reservation of nothing asks whether a token is left, and takes none.
        cost: member.cost.max(1),
        // A metered policy's reservation is taken exactly: settled against the usage later, a
        // grant beyond it would be spent without the service.
        take: Some(match member.cost {
            0 => 0,
            cost if policy.metered.is_some() => cost.min(capacity),
            cost => policy.take.max(cost).min(capacity),
        }),
        slot: member.slot.map(slot_name),
        entries: entries.map_or_else(Vec::new, |e| crate::wire::rls::descriptor(&policy.name, e)),
        ..key_check(policy, &member.tier, work.key.unwrap_or(work.hash))
    }
}

/// Names the slots of the concurrency members asked about that have none yet, with `next`.
pub(super) fn name_slots(progress: &mut Progress, mut next: impl FnMut() -> u64) {
    for (i, &(w, m)) in progress.asked.iter().enumerate() {
        let member = progress.works.get_mut(w).and_then(|w| w.members.get_mut(m));
        let Some(member) = member.filter(|m| m.tier.algorithm.kind() == Kind::Concurrency) else {
            continue;
        };
        let id = *member.slot.get_or_insert_with(&mut next);
        if let Some(check) = progress.checks.get_mut(i) {
            check.slot = Some(slot_name(id));
        }
    }
}

/// The slots named for a request's members (`name_slots`) that the service may hold for it
/// and that `kept` (its tab, if admitted) does not: every named slot but those the service
/// refused, as leases to give back. A request refused by another policy, one whose call failed
/// or timed out, one abandoned while it waited: the service may have taken the slot (or may yet
/// take it, when a late check comes, which the release it gets first then refuses).
pub(super) fn unkept_slots(works: &[Work], kept: Option<&Tab>, now: u64) -> Vec<Entry> {
    let leased = |id: u64| {
        kept.is_some_and(|tab| {
            (tab.entries.iter())
                .any(|e| matches!(e.held, Held::Lease { id: held, .. } if held == id))
        })
    };
    let mut unkept = Vec::new();
    for work in works {
        for member in &work.members {
            let refused = matches!(member.service, Service::Answered(a) if !a.allowed);
            let Some(id) = member.slot.filter(|&id| !refused && !leased(id)) else {
                continue;
            };
            unkept.push(Entry {
                policy: member.policy,
                table: work.table,
                hash: work.hash,
                key: work.key,
                tier: member.tier,
                basis: Basis::Service,
                held: Held::Lease { id, renewed: now },
            });
        }
    }
    unkept
}

/// What the service holds for a request that keeps none of it: `unkept_slots`, and for a refused
/// request the reservations of metered policies the service admitted it on, to refund (kept as
/// a grant they would never be spent: a metered policy pays from none).
pub(super) fn unkept(plan: &Plan, works: &[Work], kept: Option<&Tab>, now: u64) -> Vec<Entry> {
    let mut unkept = unkept_slots(works, kept, now);
    if kept.is_some() {
        return unkept;
    }
    for work in works {
        for member in &work.members {
            let metered = plan
                .policies
                .get(member.policy)
                .is_some_and(|p| p.metered.is_some());
            let admitted = matches!(member.service, Service::Answered(a) if a.allowed);
            if metered && admitted && member.cost > 0 {
                unkept.push(Entry {
                    policy: member.policy,
                    table: work.table,
                    hash: work.hash,
                    key: work.key,
                    tier: member.tier,
                    basis: Basis::Service,
                    held: Held::Reserved {
                        tokens: member.cost,
                        at: now,
                    },
                });
            }
        }
    }
    unkept
}

/// After the last call: members still waiting for the service count it as failed.
pub(super) fn give_up_asking(plan: &Plan, progress: &mut Progress) {
    for work in &mut progress.works {
        for member in &mut work.members {
            if member.service == Service::Ask {
                member.service = Service::Failed;
            }
        }
        work.judge(plan);
    }
}
