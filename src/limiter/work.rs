//! A work: the policies of one table that apply to a request, the key they share, the slot as
//! read, the state to write, and each member's verdict.

use super::member::{Member, Verdict};
use super::{global, local, Applied, Basis};
use crate::config::{Plan, Policy, Scope, GLOBAL_COLUMNS};
use crate::core::algorithm::{concurrency, Algorithm, Decision};
use crate::limiter::tab::{Entry, Held, Tab};
use crate::state::ledger::{Ledger, Loan};
use crate::state::table::{Slot, Words};
use smallvec::{smallvec, SmallVec};

#[derive(Debug)]
pub(super) struct Work {
    pub table: usize,
    /// The key's hash under this Envoy's slot secret: where its state lives.
    pub hash: u64,
    /// The key's hash as other Envoys, the service, bypass entries and logs know it (the same
    /// as `hash` under an operator's secret); `None` where nothing here needs it.
    pub key: Option<u64>,
    pub members: SmallVec<[Member; 2]>,
    pub slot: Slot,
    /// The time the slot is decided at: the request's, or its page's clock (`Slot::time`).
    pub now: u64,
    pub next: Words,
    pub verdicts: SmallVec<[Verdict; 2]>,
    /// Paid from this worker's loans: no slot is read or written.
    pub on_loan: bool,
    /// This worker's loans on the slot's buckets, taken out of the ledger: handed back to the
    /// buckets with the write, or put back in the ledger when nothing is written.
    pub withdrawn: SmallVec<[Loan; 1]>,
    /// The loans the write makes to this worker: its lending members' (empty ones mark a key as
    /// seen).
    pub lent: SmallVec<[Loan; 1]>,
    /// The key's parts as an RLS descriptor names them (`rls::key_entries`): read once a global
    /// member asks an RLS, else `None`.
    pub entries: Option<Vec<(String, String)>>,
}

impl Work {
    pub fn new(table: usize, (hash, key): (u64, Option<u64>), member: Member) -> Work {
        Work {
            table,
            hash,
            key,
            members: smallvec![member],
            slot: Slot::default(),
            now: 0,
            next: Words::new(),
            verdicts: SmallVec::new(),
            on_loan: false,
            withdrawn: SmallVec::new(),
            lent: SmallVec::new(),
            entries: None,
        }
    }

    /// Whether a member waits for the service.
    pub fn asks(&self) -> bool {
        self.verdicts.iter().any(Option::is_none)
    }

    /// Judges every member against the slot as read, computing the state to write.
    pub fn judge(&mut self, plan: &Plan) {
        if self.on_loan {
            return;
        }
        let now = self.now;
        self.next = self.slot.state.clone();
        self.lent.clear();
        let (next, lent, withdrawn) = (&mut self.next, &mut self.lent, &self.withdrawn);
        self.verdicts = self
            .members
            .iter()
            .map(|member| {
                let policy = plan.policies.get(member.policy)?;
                let state = next.get_mut(policy.words.clone())?;
                let held = withdrawn.iter().find(|l| l.policy == member.policy);
                let (verdict, loan) = judge_member(policy, member, state, held, self.hash, now);
                lent.extend(loan);
                verdict
            })
            .collect();
    }

    /// When the state to write will owe nothing: when the last of its members' buckets is full
    /// again or window over.
    pub fn free_at(&self) -> u64 {
        let verdicts = self.verdicts.iter().flatten();
        let longest = verdicts.map(|(d, _)| d.reset_after).max().unwrap_or(0);
        self.now.saturating_add(longest)
    }

    /// The members that have a verdict, as the outcome reports them.
    pub fn applied(&self) -> impl Iterator<Item = Applied> + '_ {
        self.members
            .iter()
            .zip(&self.verdicts)
            .filter_map(|(m, verdict)| {
                verdict.map(|(decision, basis)| Applied {
                    policy: m.policy,
                    key: self.key,
                    tier: if basis == Basis::Emergency {
                        m.emergency
                    } else {
                        m.tier
                    },
                    decision,
                    basis,
                    enforced: m.enforced,
                    cost: m.cost,
                })
            })
    }

    /// After a write of the slot: the slots of others its concurrency members found forgotten,
    /// by policy.
    pub fn count_expired(&self, plan: &Plan, expired: &mut Vec<(usize, u64)>) {
        for member in &self.members {
            let local = plan
                .policies
                .get(member.policy)
                .filter(|p| p.scope == Scope::Local);
            let words = local.map(|p| p.words.clone());
            let read = words.and_then(|w| self.slot.state.get(w));
            let n = read.map_or(0, |r| {
                super::settle::expired(&member.tier.algorithm, r, self.now)
            });
            if n > 0 {
                expired.push((member.policy, n));
            }
        }
    }

    /// For a denied request: keeps what the service said (over-limit marks, and tokens it granted
    /// stay granted), takes back every other charge.
    pub fn undo_charges(&mut self, plan: &Plan) {
        for (member, verdict) in self.members.iter().zip(&self.verdicts) {
            let Some(policy) = plan.policies.get(member.policy) else {
                continue;
            };
            let words = policy.words.clone();
            let (Some(next), Some(read)) =
                (self.next.get_mut(words.clone()), self.slot.state.get(words))
            else {
                continue;
            };
            match verdict {
                Some((_, Basis::Service)) => global::keep_unspent(policy, member, next),
                _ => next.copy_from_slice(read),
            }
        }
    }

    /// After the slot's write (`charged`: it carried this request's charges), this worker keeps
    /// the loans the write made; otherwise the loans it withdrew go back to the ledger.
    pub fn settle_loans(&mut self, ledger: &mut Ledger, charged: bool, now: u64) {
        if charged {
            self.withdrawn.clear();
            for &loan in &self.lent {
                ledger.deposit(loan, now);
            }
        } else {
            for loan in self.withdrawn.drain(..) {
                ledger.deposit(loan, now);
            }
        }
    }
}

/// Pays the work from this worker's loans when every member is a local policy that holds
/// enough of its bucket here.
pub(super) fn pay_from_loans(work: &mut Work, plan: &Plan, ledger: &mut Ledger, now: u64) -> bool {
    if ledger.is_empty() {
        return false;
    }
    let cost = |policy: usize| plan.policies.get(policy).map(|p| p.cost);
    let payable = work.members.iter().all(|m| {
        cost(m.policy).is_some_and(|cost| ledger.can_spend(m.policy, work.hash, cost, now))
    });
    if !payable {
        return false;
    }
    work.verdicts = work
        .members
        .iter()
        .map(|m| {
            let decision = ledger.spend(m.policy, work.hash, cost(m.policy)?, now)?;
            Some((decision, Basis::Loan))
        })
        .collect();
    work.on_loan = true;
    true
}

/// For a denied request: the tokens its works spent from this worker's loans go back to them.
pub(super) fn refund_loans(works: &[Work], plan: &Plan, ledger: &mut Ledger) {
    for work in works.iter().filter(|w| w.on_loan) {
        for member in &work.members {
            if let Some(policy) = plan.policies.get(member.policy) {
                ledger.refund(member.policy, work.hash, policy.cost);
            }
        }
    }
}

/// The tab of an admitted request: an entry for each member whose policy is not done with the
/// request once it admits it, where it admitted it here (a slot taken).
pub(super) fn open_tab(works: &[Work], plan: &Plan) -> Option<Tab> {
    let mut tab = Tab::default();
    for work in works {
        for (member, verdict) in work.members.iter().zip(&work.verdicts) {
            let Some((_, basis)) = verdict.filter(|(d, _)| d.allowed) else {
                continue;
            };
            let Some(held) = plan
                .policies
                .get(member.policy)
                .and_then(|policy| held(policy, member, basis, work))
            else {
                continue;
            };
            tab.entries.push(Entry {
                policy: member.policy,
                table: work.table,
                hash: work.hash,
                key: work.key,
                tier: match basis {
                    Basis::Emergency => member.emergency,
                    _ => member.tier,
                },
                basis,
                held,
            });
        }
    }
    (!tab.is_empty()).then_some(tab)
}

/// What a policy that admitted a request of `work` (on `basis`) holds of it until it ends: a
/// metered policy its reservation, a concurrency policy its slot; `None` for the others.
fn held(policy: &Policy, member: &Member, basis: Basis, work: &Work) -> Option<Held> {
    let now = work.now;
    if policy.metered.is_some() {
        return Some(Held::Reserved {
            tokens: member.cost,
            at: now,
        });
    }
    if !policy.holds_slots() {
        return None;
    }
    let (tier, offset) = match (basis, member.slot) {
        (Basis::Service, Some(id)) => return Some(Held::Lease { id, renewed: now }),
        (Basis::Bucket, _) => (member.tier, 0),
        (Basis::Emergency, _) => (member.emergency, GLOBAL_COLUMNS),
        _ => return None,
    };
    let Algorithm::Concurrency(slots) = tier.algorithm else {
        return None;
    };
    let start = policy.words.start + offset;
    let state = work.next.get(start..).unwrap_or_default();
    Some(Held::Slot(concurrency::taken(&slots, state, now)))
}

/// A concurrency policy's refusal waits as long as the policy says, if it says: nobody knows
/// when a slot will free.
fn with_retry_after(policy: &Policy, decision: Decision) -> Decision {
    match policy.retry_after {
        Some(wait) if !decision.allowed => Decision {
            retry_after: wait,
            ..decision
        },
        _ => decision,
    }
}

/// Judges one member on its words of the slot. `held`: this worker's loan on the policy's
/// bucket for `key`, handed back before judging. Also returns the loan the verdict makes to this
/// worker.
fn judge_member(
    policy: &Policy,
    member: &Member,
    state: &mut [u64],
    held: Option<&Loan>,
    key: u64,
    now: u64,
) -> (Verdict, Option<Loan>) {
    match policy.scope {
        // A metered policy lends nothing (`lease` is refused): its reservation, below its
        // `take` when the body asks for less than the default, is taken whole and alone.
        Scope::Local if policy.take > member.cost && policy.metered.is_none() => {
            let (decision, loan) = local::lend(policy, member, key, state, held, now).unzip();
            (decision.map(|d| (d, Basis::Bucket)), loan.flatten())
        }
        Scope::Local => {
            let decision = local::admit(&member.tier, member.cost, state, now);
            let decision = decision.map(|d| with_retry_after(policy, d));
            (decision.map(|d| (d, Basis::Bucket)), None)
        }
        Scope::Global(on_failure) => {
            let from_grant = policy.metered.is_none();
            let verdict = global::judge(on_failure, (member.cost, from_grant), member, state, now);
            (verdict, None)
        }
    }
}
