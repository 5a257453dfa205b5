//! The first step of a request: the policies that apply to it, grouped into works by the table
//! their key shares, with the key's hash and the tier each member runs at. Policies whose key is
//! missing drop out, unless they share one bucket for all such requests; so do policies the key
//! has a bypass for (recorded in the outcome).

use super::global::Service;
use super::work::{Member, Work};
use super::Outcome;
use crate::config::{Plan, Policy};
use crate::key::{hash_key, MISSING_KEY};
use crate::request::{Attributes, RequestSource};
use smallvec::SmallVec;

pub(super) fn works<R: RequestSource + ?Sized>(
    plan: &Plan,
    request: &mut Attributes<R>,
    service_up: bool,
    now: u64,
    outcome: &mut Outcome,
) -> Vec<Work> {
    // One work per table at most: sized for that, not for the four a growing Vec starts with
    // (four works are past the allocator's fast path).
    let mut works: Vec<Work> = Vec::with_capacity(plan.tables.len());
    for (index, policy) in matching(plan, request) {
        let existing = works.iter().position(|w| w.table == policy.table);
        let hash = match existing.and_then(|i| works.get(i)) {
            Some(work) => work.hash,
            None => key_of(plan, policy, request),
        };
        if hash == MISSING_KEY && !policy.share_missing_key {
            continue;
        }
        if exempt(plan, index, hash, now, outcome) {
            continue;
        }
        let tier = policy.tier_of(request);
        let member = Member {
            policy: index,
            tier,
            emergency: policy.emergency().unwrap_or(tier),
            service: if service_up {
                Service::Ask
            } else {
                Service::Failed
            },
        };
        match existing.and_then(|i| works.get_mut(i)) {
            Some(work) => work.members.push(member),
            None => works.push(Work::new(policy.table, hash, member)),
        }
    }
    works
}

/// The policies whose match fits, or the `default` policy when none does.
fn matching<'p, R: RequestSource + ?Sized>(
    plan: &'p Plan,
    request: &mut Attributes<R>,
) -> SmallVec<[(usize, &'p Policy); 8]> {
    let policies = plan.policies.iter().enumerate();
    let matched: SmallVec<[(usize, &Policy); 8]> = policies
        .filter(|(_, p)| !p.fallback && p.matcher.matches(request))
        .collect();
    if !matched.is_empty() {
        return matched;
    }
    let policies = plan.policies.iter().enumerate();
    policies.filter(|(_, p)| p.fallback).collect()
}

/// The hash of the policy's key, or `MISSING_KEY` when a part of it is missing.
fn key_of<R: RequestSource + ?Sized>(
    plan: &Plan,
    policy: &Policy,
    request: &mut Attributes<R>,
) -> u64 {
    let table = plan.tables.get(policy.table);
    let hash = table.and_then(|t| hash_key(&t.key, request));
    hash.unwrap_or(MISSING_KEY)
}

/// Whether a bypass entry exempts the key from the policy at `now`; the entry is recorded,
/// expired or not.
fn exempt(plan: &Plan, policy: usize, key: u64, now: u64, outcome: &mut Outcome) -> bool {
    let Some((entry, bypass)) = plan.bypass_of(policy, key) else {
        return false;
    };
    if bypass.expires > now {
        outcome.bypassed.push(entry);
        true
    } else {
        outcome.expired_bypass.push(entry);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use serde_json::json;

    fn gather(plan: &Plan, headers: &[(&str, &str)], now: u64) -> (Vec<Work>, Outcome) {
        let source = request(headers);
        let mut outcome = Outcome::default();
        let mut attributes = Attributes::new(&source, &plan.attrs);
        let works = works(plan, &mut attributes, true, now, &mut outcome);
        (works, outcome)
    }

    fn members(works: &[Work]) -> Vec<Vec<usize>> {
        let policies = |w: &Work| w.members.iter().map(|m| m.policy).collect();
        works.iter().map(policies).collect()
    }

    #[test]
    fn policies_sharing_a_key_share_one_work() {
        let plan = plan_of(json!([
            per_user("second", 10, json!({})),
            {"name": "ip", "key": ["ip"], "requests": 1, "per": "1s"},
            per_user("minute", 100, json!({"per": "1m"})),
        ]));
        let (works, _) = gather(&plan, ALICE, T0);
        assert_eq!(members(&works), [vec![0, 2], vec![1]]);
    }

    #[test]
    fn the_default_applies_only_when_no_policy_matches() {
        let config = json!({"policies": [per_user("api", 1, json!({"match": {"path_prefix": "/api/"}}))],
            "default": {"name": "baseline", "key": ["ip"], "requests": 1, "per": "1s"}});
        let plan = plan(config);
        let (api, _) = gather(&plan, &[(":path", "/api/x"), ("x-user-id", "a")], T0);
        assert_eq!(members(&api), [vec![0]]);
        let (other, _) = gather(&plan, &[(":path", "/static/x")], T0);
        assert_eq!(members(&other), [vec![1]]);
    }

    #[test]
    fn a_missing_key_drops_the_policy_unless_missing_keys_share_a_bucket() {
        let plan = plan_of(json!([
            per_user("skip", 1, json!({})),
            {"name": "shared", "key": ["header:x-api-key"], "missing_key": "shared", "requests": 1, "per": "1s"},
        ]));
        let (works, _) = gather(&plan, &[], T0);
        assert_eq!(members(&works), [vec![1]]);
        assert_eq!(works[0].hash, MISSING_KEY);
    }

    #[test]
    fn a_bypass_exempts_its_key_until_it_expires_and_is_recorded_either_way() {
        let bypass = json!([{"key": ["alice"], "policies": ["per-user"], "owner": "oncall",
            "reason": "INC-1", "expires": "2030-01-01T00:00:00Z"}]);
        let plan =
            plan(json!({"policies": [per_user("per-user", 1, json!({}))], "bypass": bypass}));
        let (works, outcome) = gather(&plan, ALICE, T0);
        assert!(works.is_empty());
        assert_eq!(outcome.bypassed, [0]);
        let expired = 1_900_000_000 * SEC;
        let (works, outcome) = gather(&plan, ALICE, expired);
        assert_eq!(members(&works), [vec![0]]);
        assert_eq!(outcome.expired_bypass, [0]);
    }

    #[test]
    fn each_member_runs_at_its_tier_and_a_global_one_knows_its_emergency() {
        let tiers =
            json!({"by": "header:x-plan", "values": {"gold": {"requests": 50, "per": "1s"}}});
        let plan = plan_of(json!([
            per_user("tiered", 1, json!({"tiers": tiers})),
            per_user(
                "global",
                10,
                json!({"scope": "global", "emergency": {"requests": 2, "per": "1s"}})
            ),
        ]));
        let (works, _) = gather(&plan, &[("x-user-id", "a"), ("x-plan", "gold")], T0);
        let [tiered, global] = &works[0].members[..] else {
            panic!("two members");
        };
        assert_eq!(tiered.tier.requests, 50);
        assert_eq!((global.tier.requests, global.emergency.requests), (10, 2));
        assert_eq!(global.service, Service::Ask);
    }
}
