//! One decision for one request: which policies apply, their keys, and their state, read and
//! updated with compare-and-swap so every worker shares one budget.
//!
//! Local policies are decided by their bucket in shared data. Global policies are decided by
//! the rate-limit service, unless this Envoy can answer for it: a key the service said is over
//! its limit stays denied until the time it gave (the over-limit cache), and tokens the service
//! leased to this Envoy are spent locally. When a request needs the service, `evaluate` returns
//! the checks to send and `resume` finishes with the answers.
//!
//! A local policy with a `lease` takes that many tokens from its bucket at a time and this worker
//! spends the rest by itself (see `ledger`): a request whose every policy on a key can be paid
//! from this worker's leases touches no shared data.
//!
//! Layered limits: all applicable policies are decided against one snapshot first; if any
//! enforcing policy denies, no bucket is charged (what the service said is still remembered,
//! and tokens it granted for the denied request go to the lease). Otherwise each table's slot is
//! written with CAS. When a CAS loses a race, that table is read and decided again; if it now
//! denies, the tables written before it keep their charge (a race can over-charge a request
//! once, never over-admit).

use crate::algorithm::{token_bucket, Algorithm, Decision};
use crate::config::{GlobalPolicy, Plan, Policy, Tier, GLOBAL_COLUMNS};
use crate::duration::NANOS_PER_SEC;
use crate::key::{hash_key, MISSING_KEY};
use crate::ledger::{Lease, Ledger, LEASE_TTL as WORKER_LEASE_TTL};
use crate::protocol::{self, Answer, Check};
use crate::request::{Attributes, RequestSource};
use crate::store::{Store, StoreError};
use crate::table::{find, write, Slot, Words};
use smallvec::{smallvec, SmallVec};

/// Attempts per table before giving up on a contended slot.
pub const MAX_ATTEMPTS: u32 = 8;
/// Calls to the service per request (a second only when a lease ran dry in a race).
pub const MAX_CALLOUTS: u32 = 2;
/// How long tokens leased from the service stay spendable here: unused ones are lost
/// (under-admission), never spent twice.
pub const LEASE_TTL: u64 = NANOS_PER_SEC;

/// What a decision rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// A local bucket.
    Bucket,
    /// Tokens leased earlier: by the service to this Envoy, or by a local bucket to this worker.
    Lease,
    /// The service said earlier that this key is over its limit until a known time.
    OverLimit,
    /// The service, for this request.
    Service,
    /// The service could not answer; the policy fails open to its local emergency budget.
    Emergency,
    /// The service could not answer; the policy fails closed.
    Unavailable,
}

/// A policy that applied to the request, with its verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub policy: usize,
    /// The key's hash: what logs may show of the key.
    pub key: u64,
    pub tier: Tier,
    pub decision: Decision,
    pub basis: Basis,
}

/// Everything the glue needs to answer, count and log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub applied: Vec<Applied>,
    /// The enforcing policy whose denial stands (the longest wait), if any.
    pub denied_by: Option<Applied>,
    pub cas_retries: u32,
    pub evictions: u32,
    /// Tables whose key found no slot of its own and shared the overflow slot.
    pub overflowed: u32,
    /// A slot stayed contended (or the store failed) through every attempt: the request is
    /// denied rather than let through unmetered.
    pub exhausted: bool,
    /// Bypass entries (indices into `Plan::bypass`) that exempted this request...
    pub bypassed: Vec<usize>,
    /// ...and those that would have, had they not expired.
    pub expired_bypass: Vec<usize>,
}

impl Outcome {
    pub fn is_denied(&self) -> bool {
        self.denied_by.is_some() || self.exhausted
    }
}

/// A request waiting for the service.
#[derive(Debug)]
pub struct Pending {
    works: Vec<Work>,
    now: u64,
    round: u32,
    /// The (work, member) of each check, in the order sent.
    asked: Vec<(usize, usize)>,
    checks: Vec<Check>,
    outcome: Outcome,
}

impl Pending {
    pub fn checks(&self) -> &[Check] {
        &self.checks
    }
}

/// Where a request stands.
#[derive(Debug)]
pub enum Step {
    Done(Outcome),
    /// Send `checks()` to the service, then `resume`.
    Callout(Pending),
}

/// What a global policy knows from the service for this request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Service {
    Ask,
    Answered(Answer),
    Failed,
}

#[derive(Debug)]
struct Member {
    policy: usize,
    tier: Tier,
    /// The limit enforced locally while the service cannot answer (global fail-open policies).
    emergency: Tier,
    service: Service,
}

/// The policies of one table that apply to this request, the key they share, the slot as read,
/// the state to write and each member's verdict (`None`: the service must be asked).
#[derive(Debug)]
struct Work {
    table: usize,
    hash: u64,
    members: SmallVec<[Member; 2]>,
    slot: Slot,
    next: Words,
    verdicts: SmallVec<[Option<(Decision, Basis)>; 2]>,
    /// Paid from this worker's leases: no slot is read or written.
    on_lease: bool,
    /// This worker's leases on the slot's buckets, taken out of the ledger: handed back to the
    /// buckets with the write, or put back in the ledger when nothing is written.
    withdrawn: SmallVec<[Lease; 1]>,
    /// The leases the write takes for this worker: its leasing members' (empty ones mark a key
    /// as seen).
    granted: SmallVec<[Lease; 1]>,
}

/// Decides the request at `now` (Unix nanoseconds). `prefix` namespaces the shared-data keys;
/// `service_up` is false while the service is known to be failing (global policies then apply
/// their failure mode without calling).
pub fn evaluate<R: RequestSource + ?Sized>(
    plan: &Plan,
    prefix: &str,
    request: &mut Attributes<R>,
    store: &impl Store,
    ledger: &mut Ledger,
    now: u64,
    service_up: bool,
) -> Step {
    let mut outcome = Outcome::default();
    let mut pending = Pending {
        works: gather(plan, request, service_up, now, &mut outcome),
        now,
        round: 0,
        asked: Vec::new(),
        checks: Vec::new(),
        outcome,
    };
    for work in &mut pending.works {
        if !spend_leases(work, plan, ledger, now) {
            reload(work, plan, prefix, store, ledger, now);
        }
    }
    advance(plan, prefix, store, ledger, pending)
}

/// Continues a request with the service's answers (`None`: the call failed).
pub fn resume(
    plan: &Plan,
    prefix: &str,
    store: &impl Store,
    ledger: &mut Ledger,
    mut pending: Pending,
    answers: Option<Vec<Answer>>,
) -> Step {
    let asked = std::mem::take(&mut pending.asked);
    for (i, (w, m)) in asked.into_iter().enumerate() {
        if let Some(member) = pending.works.get_mut(w).and_then(|w| w.members.get_mut(m)) {
            let answer = answers.as_ref().and_then(|a| a.get(i)).copied();
            member.service = answer.map_or(Service::Failed, Service::Answered);
        }
    }
    for work in &mut pending.works {
        decide(work, plan, pending.now);
    }
    advance(plan, prefix, store, ledger, pending)
}

/// Calls the service if a member needs it and no enforcing policy denies; otherwise writes.
fn advance(
    plan: &Plan,
    prefix: &str,
    store: &impl Store,
    ledger: &mut Ledger,
    mut p: Pending,
) -> Step {
    loop {
        if p.works.iter().any(Work::asks) && strictest_denial(plan, &p.works).is_none() {
            if p.round < MAX_CALLOUTS {
                p.round += 1;
                (p.asked, p.checks) = checks(plan, &p.works);
                return Step::Callout(p);
            }
            give_up_asking(&mut p.works, plan, p.now);
            continue;
        }
        if settle(plan, prefix, store, ledger, &mut p) {
            p.outcome.applied = applied(&p.works);
            p.outcome.denied_by = strictest(plan, p.outcome.applied.iter().copied());
            if p.outcome.is_denied() {
                refund_leases(&p.works, plan, ledger);
            }
            p.outcome.overflowed = p.works.iter().filter(|w| w.slot.is_overflow()).count() as u32;
            return Step::Done(p.outcome);
        }
    }
}

/// Writes every table, re-deciding after each lost race. Returns false when a re-read needs
/// the service again.
fn settle(
    plan: &Plan,
    prefix: &str,
    store: &impl Store,
    ledger: &mut Ledger,
    p: &mut Pending,
) -> bool {
    let mut denied = strictest_denial(plan, &p.works).is_some();
    for work in p.works.iter_mut().filter(|w| !w.on_lease) {
        let mut charged = false;
        for attempt in 1..=MAX_ATTEMPTS {
            if denied {
                work.undo_charges(plan);
            }
            if work.next == work.slot.state && !work.slot.needs_touch(p.now) {
                break;
            }
            match write(store, &work.slot, &work.next, p.now) {
                Ok(()) => {
                    p.outcome.evictions += u32::from(work.slot.evicts);
                    charged = !denied;
                    break;
                }
                Err(StoreError::CasMismatch) if attempt < MAX_ATTEMPTS => {
                    p.outcome.cas_retries += 1;
                    reload(work, plan, prefix, store, ledger, p.now);
                    if work.asks() && !denied {
                        return false;
                    }
                    denied |= strictest_denial(plan, std::slice::from_ref(work)).is_some();
                }
                Err(_) => {
                    p.outcome.exhausted = true;
                    denied = true;
                    break;
                }
            }
        }
        work.settle_leases(ledger, charged, p.now);
    }
    true
}

/// The applicable policies, grouped by table, with their keys and tiers. Policies whose key is
/// missing drop out, unless they share one bucket for all such requests; so do policies the key
/// has a bypass for (recorded in `outcome`).
fn gather<R: RequestSource + ?Sized>(
    plan: &Plan,
    request: &mut Attributes<R>,
    service_up: bool,
    now: u64,
    outcome: &mut Outcome,
) -> Vec<Work> {
    let mut matched: SmallVec<[(usize, &Policy); 8]> = plan
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
        let existing = works.iter().position(|w| w.table == policy.table);
        let hash = match existing.and_then(|i| works.get(i)) {
            Some(work) => work.hash,
            None => plan
                .tables
                .get(policy.table)
                .and_then(|t| hash_key(&t.key, request))
                .unwrap_or(MISSING_KEY),
        };
        if hash == MISSING_KEY && !policy.share_missing_key {
            continue;
        }
        if let Some((entry, bypass)) = plan.bypass_of(index, hash) {
            if bypass.expires > now {
                outcome.bypassed.push(entry);
                continue;
            }
            outcome.expired_bypass.push(entry);
        }
        let tier = tier_of(policy, request);
        let emergency = policy.global.and_then(|g| g.fail_open.flatten());
        let member = Member {
            policy: index,
            tier,
            emergency: emergency.unwrap_or(tier),
            service: if service_up {
                Service::Ask
            } else {
                Service::Failed
            },
        };
        match existing.and_then(|i| works.get_mut(i)) {
            Some(work) => work.members.push(member),
            None => works.push(Work {
                table: policy.table,
                hash,
                members: smallvec![member],
                slot: Slot::default(),
                next: Words::new(),
                verdicts: SmallVec::new(),
                on_lease: false,
                withdrawn: SmallVec::new(),
                granted: SmallVec::new(),
            }),
        }
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

/// Pays the work from this worker's leases when every member is a local policy that holds
/// enough of its bucket here.
fn spend_leases(work: &mut Work, plan: &Plan, ledger: &mut Ledger, now: u64) -> bool {
    if ledger.is_empty() {
        return false;
    }
    let cost = |m: &Member| plan.policies.get(m.policy).map(|p| p.cost);
    let payable = work
        .members
        .iter()
        .all(|m| cost(m).is_some_and(|cost| ledger.can_spend(m.policy, work.hash, cost, now)));
    if !payable {
        return false;
    }
    work.verdicts = work
        .members
        .iter()
        .map(|m| {
            let decision = ledger.spend(m.policy, work.hash, cost(m)?, now)?;
            Some((decision, Basis::Lease))
        })
        .collect();
    work.on_lease = true;
    true
}

/// For a denied request: the tokens its works spent from this worker's leases go back to them.
fn refund_leases(works: &[Work], plan: &Plan, ledger: &mut Ledger) {
    for work in works.iter().filter(|w| w.on_lease) {
        for member in &work.members {
            if let Some(policy) = plan.policies.get(member.policy) {
                ledger.refund(member.policy, work.hash, policy.cost);
            }
        }
    }
}

/// Reads the table's slot and decides every member against it. The leases this worker holds on
/// the key's own slot are withdrawn, to be handed back with the write.
fn reload(
    work: &mut Work,
    plan: &Plan,
    prefix: &str,
    store: &impl Store,
    ledger: &mut Ledger,
    now: u64,
) {
    if let Some(spec) = plan.tables.get(work.table) {
        let idle_at = |state: &[u64]| {
            let policies = plan.policies.iter().filter(|p| p.table == work.table);
            policies.map(|p| idle_at(p, state)).max().unwrap_or(0)
        };
        work.slot = find(store, prefix, spec, work.hash, idle_at, now);
    }
    if !work.slot.is_overflow() && !ledger.is_empty() {
        for member in &work.members {
            if work.withdrawn.iter().any(|l| l.policy == member.policy) {
                continue;
            }
            if let Some(lease) = ledger.withdraw(member.policy, work.hash) {
                work.withdrawn.push(lease);
            }
        }
    }
    decide(work, plan, now);
}

/// Decides every member against the slot as read, computing the state to write.
fn decide(work: &mut Work, plan: &Plan, now: u64) {
    if work.on_lease {
        return;
    }
    work.next = work.slot.state.clone();
    let shared = work.slot.is_overflow();
    work.granted.clear();
    let (next, granted) = (&mut work.next, &mut work.granted);
    work.verdicts = work
        .members
        .iter()
        .map(|member| {
            let decided = plan.policies.get(member.policy).and_then(|policy| {
                let end = policy.column + policy.columns();
                let state = next.get_mut(policy.column..end)?;
                let held = work.withdrawn.iter().find(|l| l.policy == member.policy);
                decide_member(policy, member, state, shared, held, work.hash, now)
            });
            let (verdict, grant) = decided.unzip();
            granted.extend(grant.flatten());
            verdict
        })
        .collect();
}

/// `shared`: the state is the overflow slot's, shared by keys that found no slot of their own,
/// so a global policy keeps neither leases nor over-limit marks in it (they are one key's), and
/// a local policy lends nothing from it. `held`: this worker's lease on the policy's bucket for
/// `key`, handed back before deciding. Also returns the lease the decision takes for this worker.
fn decide_member(
    policy: &Policy,
    member: &Member,
    state: &mut [u64],
    shared: bool,
    held: Option<&Lease>,
    key: u64,
    now: u64,
) -> Option<((Decision, Basis), Option<Lease>)> {
    match &policy.global {
        None if policy.lease > policy.cost && !shared => {
            let (decision, lease) = lend(policy, member, key, state, held, now)?;
            Some(((decision, Basis::Bucket), lease))
        }
        None => {
            let decision = decide_local(&member.tier, policy.cost, state, now)?;
            Some(((decision, Basis::Bucket), None))
        }
        Some(global) => {
            let (marks, emergency) = state.split_at_mut(GLOBAL_COLUMNS);
            let [lease, expiry, blocked] = marks else {
                return None;
            };
            let mut state = GlobalState {
                lease,
                expiry,
                blocked,
                emergency,
            };
            let decision = state.decide(global, policy.cost, member, now);
            if shared {
                (*state.lease, *state.blocked) = (0, 0);
            }
            decision.map(|d| (d, None))
        }
    }
}

/// A leasing local policy (a token bucket): hands back what this worker still holds, then, for a
/// key back within a lease's time of its last visit here, takes the whole lease if the bucket
/// has it. Tokens beyond the cost become this worker's lease, reported as remaining. A colder key
/// takes just the cost (its lease would lapse, or be pushed out of the ledger, unspent) and is
/// marked as seen, with an empty lease.
fn lend(
    policy: &Policy,
    member: &Member,
    key: u64,
    state: &mut [u64],
    held: Option<&Lease>,
    now: u64,
) -> Option<(Decision, Option<Lease>)> {
    let (Algorithm::TokenBucket(rate), Some(tat)) = (member.tier.algorithm, state.first_mut())
    else {
        return decide_local(&member.tier, policy.cost, state, now).map(|d| (d, None));
    };
    let hot = held.is_some_and(|h| h.expires > now);
    if let Some(held) = held {
        token_bucket::hand_back(tat, held.tokens, held.interval);
    }
    // A denied take leaves the bucket as it was.
    let lent = hot
        .then(|| token_bucket::decide(&rate, tat, now, policy.lease))
        .filter(|lent| lent.allowed);
    let (decision, tokens) = match lent {
        Some(lent) => (lent, policy.lease - policy.cost),
        None => (token_bucket::decide(&rate, tat, now, policy.cost), 0),
    };
    let lease = Lease {
        policy: member.policy,
        key,
        tokens,
        interval: rate.interval,
        expires: now + WORKER_LEASE_TTL,
        remaining: decision.remaining,
        reset_at: now.saturating_add(decision.reset_after),
    };
    let reported = Decision {
        remaining: decision.remaining + tokens,
        ..decision
    };
    Some((reported, decision.allowed.then_some(lease)))
}

/// Runs the tier's algorithm on its words of the policy's state.
fn decide_local(tier: &Tier, cost: u64, state: &mut [u64], now: u64) -> Option<Decision> {
    let words = state.get_mut(..tier.algorithm.columns())?;
    Some(tier.algorithm.decide(words, now, cost))
}

/// From when a policy's words in a slot are as good as empty, whichever tier wrote them.
fn idle_at(policy: &Policy, slot: &[u64]) -> u64 {
    let Some(state) = slot.get(policy.column..policy.column + policy.columns()) else {
        return 0;
    };
    let (marks, local) = match policy.global {
        Some(_) => state.split_at(GLOBAL_COLUMNS.min(state.len())),
        None => (&[][..], state),
    };
    let tiers = policy.tiers.iter().flat_map(|(_, values)| values.values());
    let emergency = policy.global.and_then(|g| g.fail_open.flatten());
    let local_idle = tiers
        .chain([&policy.tier])
        .chain(emergency.as_ref())
        .filter_map(|t| {
            local
                .get(..t.algorithm.columns())
                .map(|w| t.algorithm.idle_at(w))
        })
        .max()
        .unwrap_or(0);
    match marks {
        [lease, expiry, blocked] => {
            let lease_idle = if *lease > 0 { *expiry } else { 0 };
            local_idle.max(lease_idle).max(*blocked)
        }
        _ => local_idle,
    }
}

/// A global policy's words in a slot: the leased tokens left and when they lapse, until when
/// the service said the key is over its limit, and the emergency state of its algorithm.
struct GlobalState<'a> {
    lease: &'a mut u64,
    expiry: &'a mut u64,
    blocked: &'a mut u64,
    emergency: &'a mut [u64],
}

impl GlobalState<'_> {
    fn decide(
        &mut self,
        global: &GlobalPolicy,
        cost: u64,
        member: &Member,
        now: u64,
    ) -> Option<(Decision, Basis)> {
        let leased = if *self.expiry > now { *self.lease } else { 0 };
        match member.service {
            Service::Answered(answer) if answer.allowed => {
                *self.lease = leased + answer.granted - cost;
                // A fixed window's tokens are good only until its end: spent in the next window
                // they would come on top of that window's limit.
                let ttl = match member.tier.algorithm {
                    Algorithm::FixedWindow { .. } => LEASE_TTL.min(answer.reset_after),
                    _ => LEASE_TTL,
                };
                *self.expiry = now + ttl;
                let decision = Decision {
                    delay: answer.delay,
                    ..allowed(answer.remaining, answer.reset_after)
                };
                Some((decision, Basis::Service))
            }
            Service::Answered(answer) => {
                *self.blocked = now.saturating_add(answer.retry_after);
                Some((
                    denied(answer.retry_after, answer.reset_after),
                    Basis::Service,
                ))
            }
            _ if *self.blocked > now => {
                let wait = *self.blocked - now;
                Some((denied(wait, wait), Basis::OverLimit))
            }
            _ if leased >= cost => {
                *self.lease = leased - cost;
                Some((allowed(*self.lease, 0), Basis::Lease))
            }
            Service::Ask => None,
            Service::Failed => match global.fail_open {
                Some(_) => {
                    let decision = decide_local(&member.emergency, cost, self.emergency, now)?;
                    Some((decision, Basis::Emergency))
                }
                None => Some((denied(NANOS_PER_SEC, 0), Basis::Unavailable)),
            },
        }
    }
}

fn allowed(remaining: u64, reset_after: u64) -> Decision {
    Decision {
        allowed: true,
        remaining,
        reset_after,
        ..Decision::default()
    }
}

fn denied(retry_after: u64, reset_after: u64) -> Decision {
    Decision {
        retry_after,
        reset_after,
        ..Decision::default()
    }
}

impl Work {
    fn asks(&self) -> bool {
        self.verdicts.iter().any(Option::is_none)
    }

    /// After the slot's write (`charged`: it carried this request's charges), this worker keeps
    /// the leases the write took; otherwise the leases it withdrew go back to the ledger.
    fn settle_leases(&mut self, ledger: &mut Ledger, charged: bool, now: u64) {
        if charged {
            self.withdrawn.clear();
            for &lease in &self.granted {
                ledger.deposit(lease, now);
            }
        } else {
            for lease in self.withdrawn.drain(..) {
                ledger.deposit(lease, now);
            }
        }
    }

    /// For a denied request: keeps what the service said (over-limit marks, and tokens it
    /// granted go to the lease), takes back every other charge.
    fn undo_charges(&mut self, plan: &Plan) {
        for (member, verdict) in self.members.iter().zip(&self.verdicts) {
            let Some(policy) = plan.policies.get(member.policy) else {
                continue;
            };
            let columns = policy.column..policy.column + policy.columns();
            match (verdict, member.service) {
                (Some((_, Basis::Service)), Service::Answered(a))
                    if a.allowed && !self.slot.is_overflow() =>
                {
                    if let Some(lease) = self.next.get_mut(policy.column + 1) {
                        *lease += policy.cost;
                    }
                }
                (Some((_, Basis::Service)), _) => {}
                _ => {
                    if let (Some(next), Some(read)) = (
                        self.next.get_mut(columns.clone()),
                        self.slot.state.get(columns),
                    ) {
                        next.copy_from_slice(read);
                    }
                }
            }
        }
    }

    fn applied(&self) -> impl Iterator<Item = Applied> + '_ {
        self.members
            .iter()
            .zip(&self.verdicts)
            .filter_map(|(m, verdict)| {
                verdict.map(|(decision, basis)| Applied {
                    policy: m.policy,
                    key: self.hash,
                    // What the headers report: the limit that decided.
                    tier: if basis == Basis::Emergency {
                        m.emergency
                    } else {
                        m.tier
                    },
                    decision,
                    basis,
                })
            })
    }
}

/// The checks to send for every member that needs the service, and who asked each.
fn checks(plan: &Plan, works: &[Work]) -> (Vec<(usize, usize)>, Vec<Check>) {
    let mut asked = Vec::new();
    let mut checks = Vec::new();
    for (w, work) in works.iter().enumerate() {
        for (m, (member, verdict)) in work.members.iter().zip(&work.verdicts).enumerate() {
            let Some(policy) = plan.policies.get(member.policy) else {
                continue;
            };
            if let (None, Some(_)) = (verdict, &policy.global) {
                asked.push((w, m));
                let algorithm = member.tier.algorithm;
                checks.push(Check {
                    key: format!("{}/{:016x}", policy.name, work.hash),
                    algorithm: algorithm.name(),
                    requests: member.tier.requests,
                    per_ms: protocol::per_ms(member.tier.per_nanos),
                    burst: algorithm.capacity(),
                    cost: policy.cost,
                    take: if work.slot.is_overflow() {
                        policy.cost
                    } else {
                        policy.lease.min(algorithm.capacity())
                    },
                    max_delay_ms: algorithm.max_delay().map(protocol::per_ms),
                });
            }
        }
    }
    (asked, checks)
}

/// After the last call: members still waiting for the service count it as failed.
fn give_up_asking(works: &mut [Work], plan: &Plan, now: u64) {
    for work in works.iter_mut() {
        for member in &mut work.members {
            if member.service == Service::Ask {
                member.service = Service::Failed;
            }
        }
        decide(work, plan, now);
    }
}

fn applied(works: &[Work]) -> Vec<Applied> {
    works.iter().flat_map(Work::applied).collect()
}

fn strictest_denial(plan: &Plan, works: &[Work]) -> Option<Applied> {
    strictest(plan, works.iter().flat_map(Work::applied))
}

/// Among enforcing denials, the one with the longest wait: the client must wait that long anyway.
fn strictest(plan: &Plan, applied: impl Iterator<Item = Applied>) -> Option<Applied> {
    applied
        .filter(|a| !a.decision.allowed)
        .filter(|a| plan.policies.get(a.policy).is_some_and(|p| !p.shadow))
        .max_by_key(|a| a.decision.retry_after)
}
