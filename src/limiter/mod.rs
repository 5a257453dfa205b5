//! One decision for one request: which policies apply, their keys, and their state, read and
//! updated with compare-and-swap so every worker shares one budget.
//!
//! The path of a request, top to bottom (`Limiter::evaluate`, then `resume` after each call to
//! the service):
//! 1. `gather`: the policies that apply, grouped by the table their key shares (a `Work`), with
//!    the key's hash and the tier each runs at. Bypassed keys drop out.
//! 2. Each work is judged: from this worker's loans when they cover it (`local`), else from its
//!    slot as read (`write`). A local member is judged by its algorithm (`local`); a global one by
//!    what the service answered, or what it left here: an over-limit mark, tokens granted to this
//!    Envoy, or, when it cannot answer, the failure mode (`global`).
//! 3. While a member needs the service and no enforcing policy denies, the service is asked, at
//!    most `MAX_CALLOUTS` times.
//! 4. `write`: every slot is written with CAS, judged again after a lost race.
//!
//! Layered limits: all applicable policies are judged against one snapshot first; if any
//! enforcing policy denies, no bucket is charged (what the service said is still remembered, and
//! tokens it granted for the denied request stay granted). When a CAS loses a race, that table is
//! read and judged again; if it now denies, the tables written before it keep their charge (a race
//! can over-charge a request once, never over-admit).

pub mod admin;
mod asking;
mod gather;
mod global;
mod local;
mod member;
pub mod overrides;
mod settle;
mod status;
pub mod tab;
mod work;
mod write;

pub use global::{slot_name, GRANT_TTL};
pub use settle::Settled;
pub use status::Standing;

use crate::config::{Plan, Tier};
use crate::core::algorithm::Decision;
use crate::core::key::Keying;
use crate::core::request::{Attributes, RequestSource};
use crate::limiter::tab::Tab;
use crate::state::ledger::Ledger;
use crate::state::overrides::View;
use crate::state::store::Store;
use crate::wire::protocol::{Answer, Check};
use smallvec::SmallVec;
use work::Work;

/// Attempts per table before giving up on a contended slot.
pub const MAX_ATTEMPTS: u32 = 8;
/// Calls to the service per request (a second only when a grant ran dry in a race).
pub const MAX_CALLOUTS: u32 = 2;

/// What a decision rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// A local bucket.
    Bucket,
    /// Tokens this worker borrowed from a local bucket earlier.
    Loan,
    /// Tokens the service granted this Envoy earlier.
    Grant,
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
    /// The key's hash as logs, the access log, bypass entries and the service know it (see
    /// `Work::key`): under the operator's secret, else the public key. `None` only for a policy
    /// that let the request through without needing it (a local policy without bypass entries,
    /// under no operator's secret): refusals are always named.
    pub key: Option<u64>,
    /// The limit that decided (a global policy's emergency budget when it decided).
    pub tier: Tier,
    pub decision: Decision,
    pub basis: Basis,
    /// Whether the policy enforces for this key: not a shadow policy, the key within its
    /// rollout. A verdict that does not is counted and logged, never answered.
    pub enforced: bool,
    /// Tokens the request takes under the policy (a metered policy's reservation).
    pub cost: u64,
}

/// Everything the glue needs to answer, count and log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub applied: Vec<Applied>,
    /// The enforcing policy whose denial stands (the longest wait), if any.
    pub denied_by: Option<Applied>,
    pub cas_retries: u32,
    /// Other keys' states this request's keys took slots from, forgetting what they owed...
    pub evictions: u32,
    /// ...and the tokens those keys owed: what forgetting forgave them.
    pub forgiven: u64,
    /// A slot stayed contended (or the store failed) through every attempt: the request is
    /// denied rather than let through unmetered.
    pub exhausted: bool,
    /// Bypass entries (indices into `Plan::bypass`) that exempted this request...
    pub bypassed: Vec<usize>,
    /// ...and those that would have, had they not expired.
    pub expired_bypass: Vec<usize>,
    /// Why the selected route's sluice metadata was ignored (every policy applied), if it was.
    pub ignored_route_metadata: Option<&'static str>,
    /// What an admitted request still owes its policies when it ends (`tab`).
    pub tab: Option<Tab>,
    /// Slots of concurrency policies its writes found forgotten, by policy: releases that never
    /// came.
    pub expired_slots: Vec<(usize, u64)>,
    /// What the service may hold for this request that it does not keep (a refused request's
    /// slots and the reservations the service took, a failed call's slots): to give back at
    /// once (`global::unkept`).
    pub unkept: Vec<crate::limiter::tab::Entry>,
    /// The model the request body named, read when a spend budget applies (`Tab::model`).
    pub asked_model: Option<Vec<u8>>,
}

impl Outcome {
    /// Every enforcing policy that refused the request, the longest wait first (the first is
    /// `denied_by`): a client must wait out all of them.
    pub fn refusals(&self) -> SmallVec<[Applied; 2]> {
        let mut refusals: SmallVec<[Applied; 2]> = (self.applied.iter())
            .filter(|a| a.enforced && !a.decision.allowed)
            .copied()
            .collect();
        refusals.sort_by_key(|a| std::cmp::Reverse(a.decision.retry_after));
        refusals
    }

    pub fn is_denied(&self) -> bool {
        self.denied_by.is_some() || self.exhausted
    }

    /// The denial a refused request is answered with: the strictest enforcing denial or, when a
    /// contended slot could not be written, the first enforcing policy with a one-second wait.
    pub fn refused_by(&self) -> Option<Applied> {
        self.denied_by.or_else(|| {
            let first_enforcing = self.applied.iter().find(|a| a.enforced);
            first_enforcing.filter(|_| self.exhausted).map(|a| Applied {
                decision: Decision {
                    allowed: false,
                    retry_after: crate::core::duration::NANOS_PER_SEC,
                    ..a.decision
                },
                ..*a
            })
        })
    }

    /// Each policy's part in the request: the policy, the key's hash (see `Applied::key`), what
    /// it did. A policy that allowed a request another one denied has none.
    pub fn by_policy<'a>(
        &'a self,
        plan: &'a Plan,
    ) -> impl Iterator<Item = (usize, Option<u64>, PolicyOutcome)> + 'a {
        let denied = self.is_denied();
        let applied = self.applied.iter().filter_map(move |a| {
            let shadow = plan.policies.get(a.policy).is_some_and(|p| p.shadow);
            let what = match (a.decision.allowed, a.enforced, shadow) {
                (false, true, _) => PolicyOutcome::Denied,
                (false, false, true) => PolicyOutcome::ShadowDenied,
                (false, false, false) => PolicyOutcome::CanaryShadowDenied,
                (true, ..) if !denied => PolicyOutcome::Allowed,
                (true, ..) => return None,
            };
            Some((a.policy, a.key, what))
        });
        let bypassed = self.bypassed.iter().filter_map(|&i| plan.bypass.get(i));
        applied.chain(bypassed.map(|b| (b.policy, Some(b.key), PolicyOutcome::Bypassed)))
    }
}

/// What a policy did with a request, as the counters (`sluice_outcome`) and the access log
/// (`outcome`) name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyOutcome {
    Allowed,
    Denied,
    /// A shadow policy would have denied it.
    ShadowDenied,
    /// A bypass entry exempted its key from the policy.
    Bypassed,
    /// A policy with a rollout would have denied a key outside its enforced share.
    CanaryShadowDenied,
}

impl PolicyOutcome {
    pub const ALL: [PolicyOutcome; 5] = [
        PolicyOutcome::Allowed,
        PolicyOutcome::Denied,
        PolicyOutcome::ShadowDenied,
        PolicyOutcome::Bypassed,
        PolicyOutcome::CanaryShadowDenied,
    ];

    /// Its position in `ALL`.
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyOutcome::Allowed => "allowed",
            PolicyOutcome::Denied => "denied",
            PolicyOutcome::ShadowDenied => "shadow_denied",
            PolicyOutcome::Bypassed => "bypassed",
            PolicyOutcome::CanaryShadowDenied => "canary_shadow_denied",
        }
    }
}

/// The works of a request: one per table its policies' keys take, so most often one, kept
/// inline.
type Works = SmallVec<[Work; 1]>;

/// A request on its way: its works, and the checks sent to the service for it. Kept where the
/// limiter works on it until it waits for the service (`Pending`).
#[derive(Debug)]
struct Progress {
    works: Works,
    now: u64,
    /// Calls to the service so far.
    round: u32,
    /// The (work, member) of each check, in the order sent.
    asked: Vec<(usize, usize)>,
    checks: Vec<Check>,
    outcome: Outcome,
}

impl Progress {
    fn new(now: u64) -> Progress {
        Progress {
            works: Works::new(),
            now,
            round: 0,
            asked: Vec::new(),
            checks: Vec::new(),
            outcome: Outcome::default(),
        }
    }
}

/// A request waiting for the service's answers, its progress on the heap meanwhile.
#[derive(Debug)]
pub struct Pending(Box<Progress>);

impl Pending {
    /// The checks to send to the service before `resume`.
    pub fn checks(&self) -> &[Check] {
        &self.0.checks
    }

    /// Names the slots its checks ask for (global concurrency policies), each with `next`: the
    /// names by which the request gives them back, unique in the worker and across workers.
    pub fn name_slots(&mut self, next: impl FnMut() -> u64) {
        asking::name_slots(&mut self.0, next);
    }

    /// The slots the service may take for this request, which nobody will renew if it is
    /// abandoned while it waits (the stream reset, the worker stopping): to give back.
    pub fn abandon(self) -> Vec<crate::limiter::tab::Entry> {
        asking::unkept_slots(&self.0.works, None, self.0.now)
    }
}

/// Where a request stands.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // Done is nearly every request's: boxed, one more allocation.
pub enum Step {
    Done(Outcome),
    /// Send `Pending::checks` to the service, then `resume`.
    Callout(Pending),
}

/// What a decision works with: the plan, the secrets of its key hashes, this plugin's shared
/// data, and this worker's loans.
pub struct Limiter<'a, S> {
    pub plan: &'a Plan,
    pub keying: &'a Keying,
    /// Namespaces this plugin's shared-data keys.
    pub prefix: &'a str,
    pub store: &'a S,
    pub ledger: &'a mut Ledger,
    /// This worker's copy of the overrides' index (`global.overrides`), if they are pulled.
    pub overrides: Option<&'a View>,
}

impl<S: Store> Limiter<'_, S> {
    /// Every policy's work for `request`, with its tier and any override the key has.
    fn gather<R: RequestSource + ?Sized>(
        &self,
        request: &mut Attributes<R>,
        service_up: bool,
        progress: &mut Progress,
    ) {
        let overrides = self.overrides.map(|view| overrides::Lookup {
            view,
            store: self.store,
            prefix: self.prefix,
        });
        gather::works(
            (self.plan, self.keying),
            request,
            service_up,
            overrides,
            progress,
        );
    }

    /// Decides the request at `now` (Unix nanoseconds). `service_up` is false while the service
    /// is known to be failing: global policies then apply their failure mode without calling.
    pub fn evaluate<R: RequestSource + ?Sized>(
        &mut self,
        request: &mut Attributes<R>,
        now: u64,
        service_up: bool,
    ) -> Step {
        let mut progress = Progress::new(now);
        self.gather(request, service_up, &mut progress);
        for work in &mut progress.works {
            if !work::pay_from_loans(work, self.plan, self.ledger, now) {
                self.read(work, now);
            }
        }
        let mut step = if self.advance(&mut progress) {
            Step::Callout(Pending(Box::new(progress)))
        } else {
            Step::Done(self.finish(&mut progress))
        };
        gather::name_keys(self.plan, self.keying, &mut step, request);
        step
    }

    /// Continues a request with the service's answers (`None`: the call failed).
    pub fn resume(&mut self, mut pending: Pending, answers: Option<Vec<Answer>>) -> Step {
        let progress = &mut pending.0;
        asking::record(progress, answers.as_deref());
        for work in &mut progress.works {
            work.judge(self.plan);
        }
        if self.advance(progress) {
            Step::Callout(pending)
        } else {
            Step::Done(self.finish(progress))
        }
    }

    /// Asks the service while a member needs it and no enforcing policy denies; then writes.
    /// Returns true when the service is to be asked now (the checks are ready), false once the
    /// slots are written.
    fn advance(&mut self, progress: &mut Progress) -> bool {
        loop {
            let asks = progress.works.iter().any(Work::asks);
            if asks && strictest_denial(&progress.works).is_none() {
                if progress.round < MAX_CALLOUTS {
                    asking::ask(self.plan, progress);
                    return true;
                }
                asking::give_up_asking(self.plan, progress);
            } else if self.write(progress) {
                return false;
            }
        }
    }

    /// The outcome of a request whose slots are written. A denied request gives back the
    /// tokens it spent from this worker's loans.
    fn finish(&mut self, progress: &mut Progress) -> Outcome {
        let mut outcome = std::mem::take(&mut progress.outcome);
        outcome.applied = progress.works.iter().flat_map(Work::applied).collect();
        outcome.denied_by = strictest(outcome.applied.iter().copied());
        if outcome.is_denied() {
            work::refund_loans(&progress.works, self.plan, self.ledger);
        } else {
            outcome.tab = work::open_tab(&progress.works, self.plan);
            if let Some(tab) = &mut outcome.tab {
                tab.model = outcome.asked_model.take();
            }
        }
        let kept = outcome.tab.as_ref();
        outcome.unkept = asking::unkept(self.plan, &progress.works, kept, progress.now);
        outcome
    }
}

fn strictest_denial(works: &[Work]) -> Option<Applied> {
    strictest(works.iter().flat_map(Work::applied))
}

/// Among enforcing denials, the one with the longest wait: the client must wait that long anyway.
fn strictest(applied: impl Iterator<Item = Applied>) -> Option<Applied> {
    applied
        .filter(|a| !a.decision.allowed)
        .filter(|a| a.enforced)
        .max_by_key(|a| a.decision.retry_after)
}

/// What the limiter's unit tests share: plans from JSON, stores with their slots, requests.
#[cfg(test)]
mod testing {
    use super::*;
    use crate::state::store::MemoryStore;
    use crate::testing::FakeRequest;
    use serde_json::{json, Value};

    pub const SEC: u64 = crate::core::duration::NANOS_PER_SEC;
    pub const T0: u64 = 1_800_000_000 * SEC;
    pub const PREFIX: &str = "test/";
    pub const ALICE: &[(&str, &str)] = &[("x-user-id", "alice")];

    /// As in an Envoy without an operator's secret: its own secret for slots, the public key
    /// for what other Envoys see.
    pub fn keying() -> Keying {
        Keying {
            slots: crate::core::key::HashSecret::from_bytes([7; 16]),
            shared: crate::core::key::HashSecret::PUBLIC,
        }
    }

    pub fn plan(config: Value) -> Plan {
        crate::config::parse(config.to_string().as_bytes()).unwrap()
    }

    /// `requests` per second per `x-user-id`, with `extra` fields.
    pub fn per_user(name: &str, requests: u64, extra: Value) -> Value {
        let mut policy = json!({"name": name, "key": ["header:x-user-id"],
            "requests": requests, "per": "1s"});
        for (field, value) in extra.as_object().unwrap() {
            policy[field] = value.clone();
        }
        policy
    }

    /// A plan with these policies and a service to call for global ones.
    pub fn plan_of(policies: Value) -> Plan {
        plan(json!({"global": {"cluster": "c", "authority": "a"}, "policies": policies}))
    }

    /// A store for the plan: empty, as shared data is before the first request.
    pub fn store(_plan: &Plan) -> MemoryStore {
        MemoryStore::default()
    }

    /// A request with these headers, from 10.0.0.1.
    pub fn request(headers: &[(&str, &str)]) -> FakeRequest {
        FakeRequest::new(headers).with_property("source.address", "10.0.0.1:5555")
    }

    /// Evaluates one request at `now`, the service reachable.
    pub fn evaluate<S: Store>(
        plan: &Plan,
        store: &S,
        ledger: &mut Ledger,
        headers: &[(&str, &str)],
        now: u64,
    ) -> Step {
        let source = request(headers);
        let mut attributes = Attributes::new(&source, &plan.attrs);
        let mut limiter = Limiter {
            plan,
            keying: &keying(),
            prefix: PREFIX,
            store,
            ledger,
            overrides: None,
        };
        limiter.evaluate(&mut attributes, now, true)
    }

    /// The outcome of a request that needs no service.
    pub fn decide<S: Store>(plan: &Plan, store: &S, headers: &[(&str, &str)], now: u64) -> Outcome {
        match evaluate(plan, store, &mut Ledger::default(), headers, now) {
            Step::Done(outcome) => outcome,
            Step::Callout(_) => panic!("asked the service"),
        }
    }

    pub fn verdicts(outcome: &Outcome) -> Vec<(usize, bool)> {
        let verdicts = outcome.applied.iter();
        verdicts.map(|a| (a.policy, a.decision.allowed)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;
    use serde_json::json;

    fn answer(allowed: bool, granted: u64) -> Answer {
        Answer {
            allowed,
            granted,
            remaining: 3,
            reset_after: SEC,
            retry_after: if allowed { 0 } else { SEC },
            delay: 0,
        }
    }

    #[test]
    fn a_layered_denial_charges_no_other_policy() {
        let plan = plan_of(json!([
            per_user("roomy", 10, json!({})),
            per_user("tight", 1, json!({"per": "1h"})),
        ]));
        let store = store(&plan);
        assert_eq!(
            verdicts(&decide(&plan, &store, ALICE, T0)),
            [(0, true), (1, true)]
        );
        let denied = decide(&plan, &store, ALICE, T0);
        assert_eq!(denied.denied_by.map(|a| a.policy), Some(1));
        let after = decide(&plan, &store, ALICE, T0).applied[0]
            .decision
            .remaining;
        assert_eq!(after, 8, "roomy paid once: its remaining is 10 - 1 - 1");
    }

    #[test]
    fn a_refusal_is_named_by_the_shared_hash_though_an_admission_under_no_secret_is_not() {
        let plan = plan_of(json!([per_user("per-user", 1, json!({"per": "1h"}))]));
        let store = store(&plan);
        let admitted = decide(&plan, &store, ALICE, T0);
        assert_eq!(admitted.applied[0].key, None, "one hash: the slot's");
        let denied = decide(&plan, &store, ALICE, T0);
        let public =
            crate::core::key::hash_values(&["alice".into()], &crate::core::key::HashSecret::PUBLIC);
        assert_eq!(denied.applied[0].key, Some(public));
        assert_eq!(denied.denied_by.and_then(|a| a.key), Some(public));
    }

    #[test]
    fn a_global_member_waits_for_the_service_then_is_written() {
        let plan = plan_of(json!([per_user(
            "global",
            10,
            json!({"scope": "global", "lease": 4})
        )]));
        let store = store(&plan);
        let mut ledger = Ledger::default();
        let Step::Callout(pending) = evaluate(&plan, &store, &mut ledger, ALICE, T0) else {
            panic!("needs the service");
        };
        assert_eq!(pending.checks().len(), 1);
        assert_eq!(pending.checks()[0].take(), 4);
        let mut limiter = Limiter {
            plan: &plan,
            keying: &keying(),
            prefix: PREFIX,
            store: &store,
            ledger: &mut ledger,
            overrides: None,
        };
        let Step::Done(outcome) = limiter.resume(pending, Some(vec![answer(true, 4)])) else {
            panic!("answered");
        };
        assert_eq!(outcome.applied[0].basis, Basis::Service);
        let next = decide(&plan, &store, ALICE, T0 + 1);
        assert_eq!(
            next.applied[0].basis,
            Basis::Grant,
            "three granted tokens are left here"
        );
    }

    #[test]
    fn policy_outcomes_sit_at_their_index_in_all() {
        for (i, outcome) in PolicyOutcome::ALL.iter().enumerate() {
            assert_eq!(outcome.index(), i, "{outcome:?}");
        }
    }

    #[test]
    fn a_failed_call_is_asked_no_more_and_the_failure_mode_decides() {
        let plan = plan_of(json!([per_user(
            "global",
            10,
            json!({"scope": "global", "failure_mode": "closed"})
        )]));
        let store = store(&plan);
        let mut ledger = Ledger::default();
        let Step::Callout(pending) = evaluate(&plan, &store, &mut ledger, ALICE, T0) else {
            panic!("needs the service");
        };
        let mut limiter = Limiter {
            plan: &plan,
            keying: &keying(),
            prefix: PREFIX,
            store: &store,
            ledger: &mut ledger,
            overrides: None,
        };
        let Step::Done(outcome) = limiter.resume(pending, None) else {
            panic!("a failed call is not asked again");
        };
        assert_eq!(outcome.denied_by.map(|a| a.basis), Some(Basis::Unavailable));
    }
}
