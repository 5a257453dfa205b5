//! Global members: decided by the rate-limit service, unless this Envoy can answer for it. A key
//! the service said is over its limit stays denied until the time it gave (the over-limit mark),
//! and tokens the service granted this Envoy beyond a request's cost (a global policy's `lease`)
//! are spent here until `GRANT_TTL` passes. When the service cannot answer, the policy's failure
//! mode decides: a local emergency budget, or a 503.
//!
//! A request paid from a grant reports what the client can still do as this Envoy knows it: the
//! remaining the service last reported plus the granted tokens still here, and the time to full
//! the service gave, counted down.
//!
//! A global policy's words in a key's slot: the granted tokens left, when they lapse, until when
//! the key is over its limit, the remaining the service last reported and when it said the key
//! would be full again (`GLOBAL_COLUMNS` in all), then its emergency algorithm's state.

use super::member::{Member, Service, Verdict};
use super::{local, Basis};
use crate::config::{OnFailure, Policy, GLOBAL_COLUMNS};
use crate::core::algorithm::{Algorithm, Debt, Decision, Kind, Window, FULL_SHARE};
use crate::core::duration::NANOS_PER_SEC;
use crate::wire::protocol::Answer;

/// How long tokens granted by the service stay spendable here: unused ones are lost
/// (under-admission), never spent twice.
pub const GRANT_TTL: u64 = NANOS_PER_SEC;

/// A global policy's marks in a slot.
struct Marks<'a> {
    granted: &'a mut u64,
    expiry: &'a mut u64,
    blocked: &'a mut u64,
    /// The service's last word on an admitted request: tokens left beyond what it granted, and
    /// when the key's bucket is full again.
    remaining: &'a mut u64,
    reset_at: &'a mut u64,
}

impl<'a> Marks<'a> {
    /// The marks and the emergency state, from the policy's words.
    fn split(state: &'a mut [u64]) -> Option<(Marks<'a>, &'a mut [u64])> {
        let (marks, emergency) = state.split_at_mut_checked(GLOBAL_COLUMNS)?;
        let [granted, expiry, blocked, remaining, reset_at] = marks else {
            return None;
        };
        Some((
            Marks {
                granted,
                expiry,
                blocked,
                remaining,
                reset_at,
            },
            emergency,
        ))
    }

    /// Granted tokens still spendable at `now`.
    fn spendable(&self, now: u64) -> u64 {
        if *self.expiry > now {
            *self.granted
        } else {
            0
        }
    }
}

/// Judges a global member on its words of the slot. `None`: only the service can answer.
///
/// `from_grant`: whether tokens granted earlier may pay for the request. A metered policy's may
/// not: what its request takes is only a reservation against a usage not known yet, which only
/// the service can settle, so every such request is asked about (and its usage reaches the
/// service).
pub(super) fn judge(
    on_failure: OnFailure,
    (cost, from_grant): (u64, bool),
    member: &Member,
    state: &mut [u64],
    now: u64,
) -> Verdict {
    let (marks, emergency) = Marks::split(state)?;
    let spendable = marks.spendable(now);
    match member.service {
        Service::Answered(answer) if answer.allowed => {
            let answer = on_boundary(&member.tier.algorithm, answer, now);
            // Words from shared data and numbers from the service: saturating, whatever they say.
            *marks.granted = spendable
                .saturating_add(answer.granted)
                .saturating_sub(cost);
            // A fixed window's tokens are good only until its end: spent in the next window
            // they would come on top of that window's limit.
            let ttl = match member.tier.algorithm {
                Algorithm::FixedWindow(_) => GRANT_TTL.min(answer.reset_after),
                _ => GRANT_TTL,
            };
            *marks.expiry = now.saturating_add(ttl);
            *marks.remaining = answer.remaining;
            *marks.reset_at = now.saturating_add(answer.reset_after);
            let decision = Decision {
                delay: answer.delay,
                ..allowed(
                    answer.remaining.saturating_add(*marks.granted),
                    answer.reset_after,
                )
            };
            Some((decision, Basis::Service))
        }
        Service::Answered(answer) => {
            let answer = on_boundary(&member.tier.algorithm, answer, now);
            *marks.blocked = now.saturating_add(answer.retry_after);
            let decision = denied(answer.retry_after, answer.reset_after);
            Some((decision, Basis::Service))
        }
        _ if *marks.blocked > now => {
            let wait = *marks.blocked - now;
            Some((denied(wait, wait), Basis::OverLimit))
        }
        _ if from_grant && spendable >= cost => {
            *marks.granted = spendable - cost;
            let reset_after = marks.reset_at.saturating_sub(now);
            let decision = allowed(marks.remaining.saturating_add(*marks.granted), reset_after);
            Some((decision, Basis::Grant))
        }
        Service::Ask => None,
        Service::Failed => match on_failure {
            OnFailure::Open { .. } => {
                let decision = local::admit(&member.emergency, cost, emergency, now)?;
                Some((decision, Basis::Emergency))
            }
            OnFailure::Closed => Some((denied(NANOS_PER_SEC, 0), Basis::Unavailable)),
        },
    }
}

/// What this Envoy knows of a global policy's key from its `state` at `now`, without asking the
/// service (a status request): over its limit until a known time; else the remaining the service
/// last reported plus the granted tokens still here, until the time it said the key would be
/// full again. `None` once that has passed, or when the service never answered for the key here:
/// only the service knows then.
pub(super) fn estimate(state: &[u64], now: u64) -> Option<(Decision, Basis)> {
    let [granted, expiry, blocked, remaining, reset_at, ..] = state else {
        return None;
    };
    if *blocked > now {
        let wait = *blocked - now;
        return Some((denied(wait, wait), Basis::OverLimit));
    }
    let spendable = if *expiry > now { *granted } else { 0 };
    if *reset_at <= now && spendable == 0 {
        return None;
    }
    let decision = allowed(
        remaining.saturating_add(spendable),
        reset_at.saturating_sub(now),
    );
    Some((decision, Basis::Grant))
}

/// For a request denied by another policy: what the service said stays, and the cost it
/// granted for this request is not spent, so it joins this Envoy's grant. Not a slot: it is
/// named, and given back (`unkept_slots`); kept as a grant, it would admit another request
/// without a slot of its own while the service still held this one.
///
/// Nor a metered policy's reservation: it is refunded (`unkept`), as no grant pays for one.
pub(super) fn keep_unspent(policy: &Policy, member: &Member, next: &mut [u64]) {
    let slot = member.tier.algorithm.kind() == Kind::Concurrency;
    let spendable = !slot && policy.metered.is_none();
    let granted_here = spendable && matches!(member.service, Service::Answered(a) if a.allowed);
    if let (true, Some((marks, _))) = (granted_here, Marks::split(next)) {
        *marks.granted = marks.granted.saturating_add(member.cost);
    }
}

/// What forgetting a global policy's marks costs at `now`. A key marked over its limit is being
/// limited (the whole share), though forgetting the mark forgives nothing: the service still
/// decides. Granted tokens forgotten are lost to the key (under-admission), so they weigh their
/// share of `capacity` too.
pub(super) fn debt(marks: &[u64], capacity: u64, now: u64) -> Debt {
    match marks {
        [_, _, blocked, ..] if *blocked > now => Debt {
            share: FULL_SHARE,
            tokens: 0,
        },
        [granted, expiry, ..] if *granted > 0 && *expiry > now => {
            let share = u128::from(*granted) * u128::from(FULL_SHARE) / u128::from(capacity.max(1));
            Debt {
                share: u64::try_from(share).unwrap_or(u64::MAX).min(FULL_SHARE),
                tokens: 0,
            }
        }
        _ => Debt::default(),
    }
}

/// A slot's name on the wire: 16 hex digits.
pub fn slot_name(id: u64) -> String {
    format!("{id:016x}")
}

/// A calendar window's boundary is a whole second that the filter knows as well as the service:
/// the service's answer, in whole milliseconds rounded up and read on Redis's clock, lands within
/// a second of it, and is put on it, so that the reset headers name the boundary itself. An
/// answer further off (clocks a period apart) is left as the service gave it.
fn on_boundary(algorithm: &Algorithm, mut answer: Answer, now: u64) -> Answer {
    if let Algorithm::FixedWindow(Window {
        calendar: Some(calendar),
        ..
    }) = algorithm
    {
        let own = calendar.period(now).end.saturating_sub(now);
        let near = |wait: u64| wait.abs_diff(own) <= NANOS_PER_SEC;
        if near(answer.reset_after) {
            answer.reset_after = own;
        }
        if answer.retry_after != 0 && near(answer.retry_after) {
            answer.retry_after = own;
        }
    }
    answer
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

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use crate::config::{Plan, Scope};
    use crate::wire::protocol::Answer;
    use serde_json::{json, Value};

    #[test]
    fn a_calendar_answer_is_put_on_the_boundary_the_filter_knows() {
        use crate::core::calendar::{Calendar, Starts, Unit};
        let month = Calendar::new("Europe/Berlin", Unit::Month, Starts::midnight()).unwrap();
        let algorithm = Algorithm::FixedWindow(Window::calendar(10, month).unwrap());
        // 10 s before April in Berlin; the service says 10.0004 s (whole ms, another clock).
        let now = crate::core::time::parse_rfc3339("2026-03-31T21:59:50Z").unwrap();
        let answer = |wait: u64| Answer {
            allowed: false,
            granted: 0,
            remaining: 0,
            reset_after: wait,
            retry_after: wait,
            delay: 0,
        };
        let near = on_boundary(&algorithm, answer(10_000_400_000), now);
        assert_eq!(
            (near.reset_after, near.retry_after),
            (10 * NANOS_PER_SEC, 10 * NANOS_PER_SEC)
        );
        let far = on_boundary(&algorithm, answer(12 * NANOS_PER_SEC), now);
        assert_eq!(far.reset_after, 12 * NANOS_PER_SEC);
        let epoch = Algorithm::FixedWindow(Window::new(10, 60 * NANOS_PER_SEC).unwrap());
        assert_eq!(
            on_boundary(&epoch, answer(10_000_400_000), now).reset_after,
            10_000_400_000
        );
    }

    fn global(extra: Value) -> Plan {
        let mut fields = json!({"scope": "global", "lease": 5});
        for (k, v) in extra.as_object().unwrap() {
            fields[k] = v.clone();
        }
        plan_of(json!([per_user("global", 10, fields)]))
    }

    fn member(plan: &Plan, service: Service) -> Member {
        let policy = &plan.policies[0];
        Member {
            policy: 0,
            tier: policy.tier,
            emergency: policy.emergency().unwrap_or(policy.tier),
            service,
            enforced: true,
            slot: None,
            cost: 1,
        }
    }

    fn answered(allowed: bool, granted: u64, retry_after: u64) -> Service {
        Service::Answered(Answer {
            allowed,
            granted,
            remaining: 4,
            reset_after: 500 * 1_000_000,
            retry_after,
            delay: 0,
        })
    }

    /// Judges the member on `state` at `now`.
    fn judged(plan: &Plan, service: Service, state: &mut [u64], now: u64) -> Verdict {
        let Scope::Global(on_failure) = plan.policies[0].scope else {
            panic!("a global policy");
        };
        judge(on_failure, (1, true), &member(plan, service), state, now)
    }

    fn basis(verdict: Verdict) -> Option<(bool, Basis)> {
        verdict.map(|(d, b)| (d.allowed, b))
    }

    #[test]
    fn an_answer_leaves_the_rest_of_its_grant_here_for_a_second() {
        let plan = global(json!({}));
        let mut state = [0; 6];
        let verdict = judged(&plan, answered(true, 5, 0), &mut state, T0);
        assert_eq!(basis(verdict), Some((true, Basis::Service)));
        assert_eq!(state[..2], [4, T0 + GRANT_TTL]);
        let next = judged(&plan, Service::Ask, &mut state, T0 + 1);
        assert_eq!(basis(next), Some((true, Basis::Grant)));
        let lapsed = judged(&plan, Service::Ask, &mut state, T0 + GRANT_TTL);
        assert_eq!(lapsed, None, "only the service can answer");
    }

    #[test]
    fn a_grant_reports_the_services_remaining_plus_the_tokens_still_here() {
        let plan = global(json!({}));
        let mut state = [0; 6];
        let reported = |verdict: Verdict| verdict.map(|(d, _)| (d.remaining, d.reset_after));
        let first = judged(&plan, answered(true, 5, 0), &mut state, T0);
        assert_eq!(reported(first), Some((4 + 4, 500 * 1_000_000)));
        let ms = 1_000_000;
        let later = judged(&plan, Service::Ask, &mut state, T0 + 100 * ms);
        assert_eq!(
            reported(later),
            Some((4 + 3, 400 * ms)),
            "one fewer, 100 ms later"
        );
    }

    #[test]
    fn a_fixed_windows_grant_ends_with_its_window() {
        let plan = global(json!({"algorithm": "fixed_window"}));
        let mut state = [0; 7];
        judged(&plan, answered(true, 5, 0), &mut state, T0);
        assert_eq!(state[1], T0 + 500 * 1_000_000);
    }

    #[test]
    fn a_denial_marks_the_key_over_its_limit_until_it_may_retry() {
        let plan = global(json!({}));
        let mut state = [0; 6];
        judged(&plan, answered(false, 0, SEC), &mut state, T0);
        let cached = judged(&plan, Service::Ask, &mut state, T0 + SEC - 1);
        assert_eq!(basis(cached), Some((false, Basis::OverLimit)));
        assert_eq!(judged(&plan, Service::Ask, &mut state, T0 + SEC), None);
    }

    #[test]
    fn without_the_service_a_policy_fails_open_to_its_emergency_budget_or_closed() {
        let open = global(json!({"emergency": {"requests": 1, "per": "1h", "burst": 1}}));
        let mut state = [0; 6];
        let first = judged(&open, Service::Failed, &mut state, T0);
        assert_eq!(basis(first), Some((true, Basis::Emergency)));
        let second = judged(&open, Service::Failed, &mut state, T0);
        assert_eq!(basis(second), Some((false, Basis::Emergency)));
        let closed = global(json!({"failure_mode": "closed"}));
        let verdict = judged(&closed, Service::Failed, &mut [0; 6], T0);
        assert_eq!(basis(verdict), Some((false, Basis::Unavailable)));
    }

    #[test]
    fn a_request_denied_by_another_policy_keeps_the_cost_it_was_granted() {
        let plan = global(json!({}));
        let mut next = [3, T0 + GRANT_TTL, 0, 0, 0, 0];
        let granted = member(&plan, answered(true, 5, 0));
        keep_unspent(&plan.policies[0], &granted, &mut next);
        assert_eq!(
            next[0], 4,
            "the grant, not its expiry, takes the unspent token"
        );
    }

    #[test]
    fn checks_ask_for_waiting_global_members_only() {
        let plan = plan_of(json!([
            per_user("local", 10, json!({})),
            per_user("global", 10, json!({"scope": "global", "lease": 5})),
        ]));
        let store = store(&plan);
        let mut ledger = crate::state::ledger::Ledger::default();
        let super::super::Step::Callout(pending) = evaluate(&plan, &store, &mut ledger, ALICE, T0)
        else {
            panic!("asks the service");
        };
        let checks = pending.checks();
        assert_eq!(checks.len(), 1);
        assert!(checks[0].key.starts_with("global/"));
        assert_eq!((checks[0].cost, checks[0].take()), (1, 5));
    }
}
