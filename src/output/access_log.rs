//! What Envoy's access log can show of a decision. A request that a policy denied, that a
//! shadow policy would have denied, or whose key a bypass exempted gets one record in its filter
//! state, `wasm.sluice`, which `%FILTER_STATE(wasm.sluice:PLAIN)%` prints:
//!
//! ```text
//! outcome=denied policy=per-user mode=enforce key=3f5b0c8e21d47a96
//! ```
//!
//! `name=value` pairs separated by spaces (logfmt), in this order; a value never holds a space
//! or a quote. `outcome` is the `sluice_outcome` of the counters, `mode` the policy's (for a
//! policy with a rollout, `canary` or `canary_shadow` as it enforces for the key or not), `key`
//! the hash of its key as the logs and `bypass.key_hash` write it. A request that a policy with a
//! cost read from the response let through gets one when it ends, naming its key, with `tokens=<policy>:<reserved>
//! :<charged>` for each such policy (`response`). Other requests get no record, and cost no
//! hostcall for it. A refusal by more than one enforcing policy ends with `refused=`, each of
//! them as `<policy>:<remaining>:<wait in seconds>`, the longest wait first. A later field is
//! appended after these.
//!
//! What the policies read of a request's body is shown too, for every request decided with its
//! body (`body_states`), and what a response's body said it used (`response::usage_text`): an
//! access log that carries them lets `sluice-replay` key, reserve and charge as the filter did.

use crate::config::{Plan, Policy};
use crate::core::request::{Attr, Attributes, RequestSource};
use crate::core::text::{push_decimal, push_hex16};
use crate::limiter::{Applied, Outcome, PolicyOutcome};
use crate::output::headers::retry_after_secs;

/// The name under which the record is set (Envoy keeps it as filter state `wasm.sluice`).
pub const PROPERTY: &str = "sluice";

/// The record of `outcome`, whose answer was `denial` (if it was refused), or `None` when there
/// is nothing to show: a refusal names the deciding policy; a request that passed names the
/// first shadow policy that would have denied it, else the first policy bypassed. `refusals`:
/// every enforcing policy that refused it (`Outcome::refusals`).
pub fn record(
    plan: &Plan,
    outcome: &Outcome,
    denial: Option<&Applied>,
    refusals: &[Applied],
) -> Option<String> {
    let mut record = decider(plan, outcome, denial)?;
    if denial.is_some() {
        push_refused(&mut record, plan, refusals);
    }
    Some(record)
}

/// ` refused=<policy>:<remaining>:<wait>,...` when more than one enforcing policy refused the
/// request, the longest wait first; the wait in whole seconds, `-` when nobody can say.
fn push_refused(record: &mut String, plan: &Plan, refusals: &[Applied]) {
    if refusals.len() < 2 {
        return;
    }
    for (i, refusal) in refusals.iter().enumerate() {
        let Some(policy) = plan.policies.get(refusal.policy) else {
            continue;
        };
        record.push_str(if i == 0 { " refused=" } else { "," });
        record.push_str(&policy.name);
        record.push(':');
        push_decimal(record, refusal.decision.remaining);
        record.push(':');
        match refusal.decision.retry_after {
            0 => record.push('-'),
            wait => push_decimal(record, retry_after_secs(wait)),
        }
    }
}

/// The record's first fields: the policy that decided, and what it did.
fn decider(plan: &Plan, outcome: &Outcome, denial: Option<&Applied>) -> Option<String> {
    let (policy, key, what) = match denial {
        Some(denial) => (denial.policy, denial.key, PolicyOutcome::Denied),
        None => {
            // The request passed: a policy that said no can only have been in shadow for it.
            let in_shadow = |(_, _, what): &(usize, Option<u64>, PolicyOutcome)| {
                matches!(
                    what,
                    PolicyOutcome::ShadowDenied | PolicyOutcome::CanaryShadowDenied
                )
            };
            let bypassed = |(_, _, what): &(usize, Option<u64>, PolicyOutcome)| {
                *what == PolicyOutcome::Bypassed
            };
            let mut parts = outcome.by_policy(plan);
            parts
                .find(in_shadow)
                .or_else(|| outcome.by_policy(plan).find(bypassed))?
        }
    };
    line(plan.policies.get(policy)?, what, key)
}

/// The record of a request `policy` let through, for what it adds at the request's end (the
/// tokens a metered policy charged: `response`).
pub fn allowed_record(plan: &Plan, policy: usize, key: Option<u64>) -> Option<String> {
    line(plan.policies.get(policy)?, PolicyOutcome::Allowed, key)
}

/// The filter state that shows what the policies read of a request's body: each value the body
/// has of a `body:FIELD` key part or of the output a reservation asks for, under its
/// `BodyField::state_name` (`%FILTER_STATE(wasm.sluice.body.model:PLAIN)%`). Read now if the
/// decision has not read it yet: a replay of another configuration may need it.
pub fn body_states<S: RequestSource + ?Sized>(
    request: &mut Attributes<S>,
) -> Vec<(String, String)> {
    let mut states = Vec::new();
    for index in 0.. {
        let name = match request.attr(index) {
            Some(Attr::Body(field)) => field.state_name(),
            Some(_) => continue,
            None => break,
        };
        if let Some(value) = request.get(index) {
            states.push((name, String::from_utf8_lossy(value).into_owned()));
        }
    }
    states
}

fn line(policy: &Policy, what: PolicyOutcome, key: Option<u64>) -> Option<String> {
    let mut text = String::with_capacity(policy.name.len() + 64);
    for (name, value) in [
        ("outcome=", what.as_str()),
        (" policy=", &policy.name),
        (" mode=", mode(policy, key)),
    ] {
        text.push_str(name);
        text.push_str(value);
    }
    // Always known for a refusal (the limiter names the keys of refusals), but never made up.
    if let Some(key) = key {
        text.push_str(" key=");
        push_hex16(&mut text, key);
    }
    Some(text)
}

/// The policy's mode for `key`: `enforce` or `shadow`, and for a policy with a rollout,
/// `canary` (it enforces for the key) or `canary_shadow` (it does not).
fn mode(policy: &Policy, key: Option<u64>) -> &'static str {
    match (policy.shadow, policy.rollout, policy.enforces(key)) {
        (true, ..) => "shadow",
        (false, None, _) => "enforce",
        (false, Some(_), true) => "canary",
        (false, Some(_), false) => "canary_shadow",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::algorithm::Decision;
    use crate::limiter::Basis;
    use serde_json::json;

    fn plan() -> Plan {
        let config = json!({"policies": [
            {"name": "per-user", "key": ["header:x-user-id"], "requests": 1, "per": "1s"},
            {"name": "trial.v2", "key": ["ip"], "requests": 1, "per": "1s", "mode": "shadow"},
        ], "bypass": [{"key": ["acme"], "policies": ["per-user"], "owner": "o", "reason": "r",
            "expires": "2030-01-01T00:00:00Z"}]});
        crate::config::parse(config.to_string().as_bytes()).unwrap()
    }

    fn applied(plan: &Plan, policy: usize, allowed: bool) -> Applied {
        Applied {
            policy,
            key: Some(0x3f5b_0c8e_21d4_7a96),
            tier: plan.policies[policy].tier,
            decision: Decision {
                allowed,
                ..Decision::default()
            },
            basis: Basis::Bucket,
            enforced: !plan.policies[policy].shadow,
            cost: 1,
        }
    }

    #[test]
    fn a_denial_names_the_deciding_policy_its_mode_and_key() {
        let plan = plan();
        let denial = applied(&plan, 0, false);
        let outcome = Outcome {
            applied: vec![denial, applied(&plan, 1, false)],
            denied_by: Some(denial),
            ..Outcome::default()
        };
        assert_eq!(
            record(&plan, &outcome, Some(&denial), &[denial]).as_deref(),
            Some("outcome=denied policy=per-user mode=enforce key=3f5b0c8e21d47a96")
        );
    }

    #[test]
    fn the_body_fields_policies_read_are_shown_under_their_names_when_the_body_has_them() {
        let config = json!({"policies": [{"name": "llm", "key": ["body:model", "body:team.id"],
            "requests": 1000, "per": "1h", "cost": {"from_response": {"usage": "total_tokens"},
            "reserve": {"request": "max_tokens", "default": 5}}}]});
        let plan = crate::config::parse(config.to_string().as_bytes()).unwrap();
        let request = crate::testing::FakeRequest::default();
        let body = br#"{"model":"gpt-4o","max_completion_tokens":300,"messages":[]}"#;
        let snapshot = Attributes::new(&request, &plan.attrs).snapshot();
        let mut attributes = Attributes::of_snapshot(&request, &plan.attrs, snapshot, body);
        let mut states = body_states(&mut attributes);
        states.sort();
        let expected = [
            ("sluice.body.model", "gpt-4o"),
            ("sluice.max_output_tokens", "300"),
        ];
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        assert_eq!(states, expected, "team.id is not in the body");
    }

    #[test]
    fn a_passing_request_shows_a_shadow_denial_else_a_bypass_else_nothing() {
        let plan = plan();
        let shadow_denied = Outcome {
            applied: vec![applied(&plan, 1, false)],
            bypassed: vec![0],
            ..Outcome::default()
        };
        assert_eq!(
            record(&plan, &shadow_denied, None, &[]).as_deref(),
            Some("outcome=shadow_denied policy=trial.v2 mode=shadow key=3f5b0c8e21d47a96")
        );
        let bypassed = Outcome {
            applied: vec![applied(&plan, 1, true)],
            bypassed: vec![0],
            ..Outcome::default()
        };
        let bypass_key = plan.bypass[0].key;
        assert_eq!(
            record(&plan, &bypassed, None, &[]),
            Some(format!(
                "outcome=bypassed policy=per-user mode=enforce key={bypass_key:016x}"
            ))
        );
        let plain = Outcome {
            applied: vec![applied(&plan, 0, true), applied(&plan, 1, true)],
            ..Outcome::default()
        };
        assert_eq!(record(&plan, &plain, None, &[]), None);
    }
}
