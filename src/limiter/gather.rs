//! The first step of a request: the policies that apply to it, grouped into works by the table
//! their key shares, with the key's hash and the tier each member runs at. With `route_metadata`
//! the selected route says first which policies may apply there (`route`). Policies whose key is
//! missing drop out, unless they share one bucket for all such requests; so do policies the key
//! has a bypass for (recorded in the outcome). The `default` policy applies to every request that
//! no enforcing policy applied to: none matched, each that did lacked its key or exempted it, or
//! only shadow policies did.

use super::member::{Member, Service};
use super::overrides::Lookup;
use super::work::Work;
use super::{Applied, Outcome, Progress, Step, Works};
use crate::config::{Plan, Policy};
use crate::core::key::{hash_key, Keying, MISSING_KEY};
use crate::core::request::{Attributes, RequestSource};
use crate::core::route::{self, RouteScope};
use crate::state::store::Store;
use crate::state::table::TableSpec;

pub(super) fn works<R: RequestSource + ?Sized, S: Store>(
    (plan, keying): (&Plan, &Keying),
    request: &mut Attributes<R>,
    service_up: bool,
    overrides: Option<Lookup<'_, S>>,
    progress: &mut Progress,
) {
    let Progress {
        works,
        outcome,
        now,
        ..
    } = progress;
    let mut gathered = Gathered {
        keying,
        overrides,
        works,
        service: if service_up {
            Service::Ask
        } else {
            Service::Failed
        },
        now: *now,
    };
    let scope = route_scope(plan, request, outcome);
    let in_scope = || {
        let policies = plan.policies.iter().enumerate();
        policies.filter(|(i, _)| scope.includes(*i))
    };
    let mut enforced = false;
    for (index, policy) in in_scope() {
        if !policy.fallback && policy.matcher.matches(request) {
            let joined = gathered.join(plan, index, policy, request, outcome);
            enforced |= joined == Some(true);
        }
    }
    if !enforced {
        for (index, policy) in in_scope().filter(|(_, p)| p.fallback) {
            gathered.join(plan, index, policy, request, outcome);
        }
    }
}

/// The policies the selected route lets apply: all of them unless `route_metadata` is on.
fn route_scope<R: RequestSource + ?Sized>(
    plan: &Plan,
    request: &mut Attributes<R>,
    outcome: &mut Outcome,
) -> RouteScope {
    let Some(attr) = plan.route_metadata else {
        return RouteScope::All;
    };
    let (scope, ignored) = route::scope(request.get(attr), |name| plan.policy_index(name));
    outcome.ignored_route_metadata = ignored;
    scope
}

/// The works of a request so far, the secrets its keys are hashed under, and where overrides
/// are looked up.
struct Gathered<'k, S> {
    keying: &'k Keying,
    overrides: Option<Lookup<'k, S>>,
    works: &'k mut Works,
    service: Service,
    now: u64,
}

impl<S: Store> Gathered<'_, S> {
    /// Adds the policy to the work of its table, unless its key is missing (and not shared) or
    /// exempt. Returns whether it enforces for the key, if it applies.
    fn join<R: RequestSource + ?Sized>(
        &mut self,
        plan: &Plan,
        index: usize,
        policy: &Policy,
        request: &mut Attributes<R>,
        outcome: &mut Outcome,
    ) -> Option<bool> {
        let existing = self.works.iter().position(|w| w.table == policy.table);
        let (hash, mut key) = match existing.and_then(|i| self.works.get(i)) {
            Some(work) => (work.hash, work.key),
            None => hashes_of(plan, self.keying, policy, request),
        };
        if hash == MISSING_KEY && !policy.share_missing_key {
            return None;
        }
        if key.is_some_and(|key| exempt(plan, index, key, self.now, outcome)) {
            return None;
        }
        let mut tier = policy.tier_of(request);
        // Only a policy that has overrides pays for them: a read, and a second hash where the
        // key has no shared one yet.
        if let Some(lookup) = self.overrides.filter(|l| l.covers(index, policy)) {
            if key.is_none() {
                let table = plan.tables.get(policy.table);
                key = table.and_then(|t| shared_hash(t, request, self.keying));
            }
            if let Some(key) = key.filter(|&k| k != MISSING_KEY) {
                tier = lookup.tier(index, policy, tier, key, self.now);
            }
        }
        let pricing = policy.metered.as_ref().and_then(|m| m.source.pricing());
        if let Some((_, model)) = pricing.filter(|_| outcome.asked_model.is_none()) {
            outcome.asked_model = request.get(model).map(<[u8]>::to_vec);
        }
        let cost = match &policy.metered {
            Some(metered) => metered.reservation(&tier, request),
            None => policy.cost,
        };
        let enforced = policy.enforces(key);
        let member = Member {
            policy: index,
            tier,
            emergency: policy.emergency().unwrap_or(tier),
            service: self.service,
            enforced,
            slot: None,
            cost,
        };
        let work = match existing.and_then(|i| self.works.get_mut(i)) {
            Some(work) => {
                work.members.push(member);
                work.key = work.key.or(key);
                work
            }
            None => {
                self.works
                    .push(Work::new(policy.table, (hash, key), member));
                self.works.last_mut()?
            }
        };
        let table = plan.tables.get(policy.table);
        if let Some(table) =
            table.filter(|_| policy.asks_rls(plan.global.as_ref()) && work.entries.is_none())
        {
            work.entries = Some(crate::wire::rls::key_entries(&table.key, request));
        }
        Some(enforced)
    }
}

/// The policy's key hashed for its slot and, where other Envoys or operators name the table's
/// keys (a global or bypassed policy), as it is known beyond this Envoy: see `Work`.
/// `MISSING_KEY` for both when a part of it is missing. Under one secret the one hash serves
/// both; otherwise the shared one costs a second hash only where it is needed (and `name_keys`
/// adds it where a request turns out to need it).
fn hashes_of<R: RequestSource + ?Sized>(
    plan: &Plan,
    keying: &Keying,
    policy: &Policy,
    request: &mut Attributes<R>,
) -> (u64, Option<u64>) {
    let Some(table) = plan.tables.get(policy.table) else {
        return (MISSING_KEY, Some(MISSING_KEY));
    };
    let Some(hash) = hash_key(&table.key, request, &keying.slots) else {
        return (MISSING_KEY, Some(MISSING_KEY));
    };
    let key = if keying.is_one() {
        Some(hash)
    } else if table.shares_key {
        shared_hash(table, request, keying)
    } else {
        None
    };
    (hash, key)
}

/// The key's hash as it is known beyond this Envoy, where that is another hash than its slot's.
/// Out of line: most requests need none.
#[inline(never)]
fn shared_hash<R: RequestSource + ?Sized>(
    table: &TableSpec,
    request: &mut Attributes<R>,
    keying: &Keying,
) -> Option<u64> {
    hash_key(&table.key, request, &keying.shared)
}

/// Names by their shared hash the keys a request ended up needing it for, which `hashes_of` left
/// unnamed: those of policies that refused it (or would have, in shadow mode; every one when a
/// contended slot refused it), which the access log and the logs show; with the admin path on,
/// every local policy's, which its top keys record; those a metered policy
/// admitted, whose charge the access log shows when the request ends; and, for a request that
/// waits for the service, every one, since the request will not be at hand when it resumes.
pub(super) fn name_keys<R: RequestSource + ?Sized>(
    plan: &Plan,
    keying: &Keying,
    step: &mut Step,
    request: &mut Attributes<R>,
) {
    if keying.is_one() {
        return;
    }
    let mut shared = |table: Option<usize>| shared_hash(plan.tables.get(table?)?, request, keying);
    match step {
        Step::Done(outcome) => {
            let exhausted = outcome.exhausted;
            // With the admin path on, every local policy's key is recorded among its top keys
            // (`state::top`), allowed or not: a second hash, no hostcall.
            let top = plan.admin.is_some();
            let local = |a: &Applied| {
                let policy = plan.policies.get(a.policy);
                top && policy.is_some_and(|p| p.scope == crate::config::Scope::Local)
            };
            let applied = outcome.applied.iter_mut().chain(outcome.denied_by.as_mut());
            let named = |a: &&mut Applied| exhausted || !a.decision.allowed || local(a);
            for a in applied.filter(|a| a.key.is_none()).filter(named) {
                a.key = shared(plan.policies.get(a.policy).map(|p| p.table));
            }
            // A metered policy's charge gets an access-log record when the request ends, which
            // names the key it charged.
            let tab = outcome
                .tab
                .iter_mut()
                .flat_map(|tab| tab.entries.iter_mut());
            for entry in tab.filter(|e| e.key.is_none()) {
                let metered = plan.policies.get(entry.policy).map(|p| p.metered.is_some());
                if metered == Some(true) {
                    entry.key = shared(Some(entry.table));
                }
            }
        }
        Step::Callout(pending) => {
            for work in pending.0.works.iter_mut().filter(|w| w.key.is_none()) {
                work.key = shared(Some(work.table));
            }
        }
    }
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
    use crate::core::key::HashSecret;
    use crate::core::route::envoy_list;
    use crate::testing::FakeRequest;
    use serde_json::json;

    fn gather(plan: &Plan, headers: &[(&str, &str)], now: u64) -> (Works, Outcome) {
        gather_from(plan, &request(headers), now)
    }

    fn gather_from(plan: &Plan, source: &FakeRequest, now: u64) -> (Works, Outcome) {
        let mut progress = Progress::new(now);
        let mut attributes = Attributes::new(source, &plan.attrs);
        let no_overrides: Option<Lookup<crate::state::store::MemoryStore>> = None;
        works(
            (plan, &keying()),
            &mut attributes,
            true,
            no_overrides,
            &mut progress,
        );
        (progress.works, progress.outcome)
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
    fn the_default_applies_to_every_request_no_enforcing_policy_applied_to() {
        let bypass = json!([{"key": ["bob"], "policies": ["api"], "owner": "oncall",
            "reason": "INC-1", "expires": "2030-01-01T00:00:00Z"}]);
        let trial = json!({"match": {"path_prefix": "/trial/"}, "mode": "shadow"});
        let config = json!({"policies": [
                per_user("api", 1, json!({"match": {"path_prefix": "/api/"}})),
                per_user("trial", 1, trial),
            ],
            "default": {"name": "baseline", "key": ["ip"], "requests": 1, "per": "1s"},
            "bypass": bypass});
        let plan = plan(config);
        let gathered = |headers: &[(&str, &str)]| members(&gather(&plan, headers, T0).0);
        let alice = ("x-user-id", "alice");
        assert_eq!(gathered(&[(":path", "/api/x"), alice]), [vec![0]]);
        assert_eq!(
            gathered(&[(":path", "/static/x")]),
            [vec![2]],
            "none matched"
        );
        assert_eq!(
            gathered(&[(":path", "/api/x")]),
            [vec![2]],
            "api matched but skipped the request without its key"
        );
        assert_eq!(
            gathered(&[(":path", "/api/x"), ("x-user-id", "bob")]),
            [vec![2]],
            "bob is exempt from api, not from the default"
        );
        assert_eq!(
            gathered(&[(":path", "/trial/x"), alice]),
            [vec![1], vec![2]],
            "a shadow policy limits nothing"
        );
    }

    #[test]
    fn the_selected_route_narrows_the_policies_or_turns_them_off_when_asked_to() {
        let config = |route_metadata: bool| {
            plan(json!({"route_metadata": route_metadata, "policies": [
                per_user("per-user", 1, json!({})),
                {"name": "per-ip", "key": ["ip"], "requests": 1, "per": "1s"}],
                "default": {"name": "baseline", "key": ["global"], "requests": 1, "per": "1s"}}))
        };
        let (on, off) = (config(true), config(false));
        let on_route = |plan: &Plan, headers, metadata: &[(&str, &[u8])]| {
            let source = request(headers).with_route_metadata(metadata);
            let (works, outcome) = gather_from(plan, &source, T0);
            (
                members(&works),
                outcome.ignored_route_metadata,
                source.reads.get(),
            )
        };
        let per_ip = envoy_list(&["per-ip"]);
        let listed: &[(&str, &[u8])] = &[("policies", &per_ip)];
        assert_eq!(on_route(&on, ALICE, listed).0, [vec![1]]);
        assert_eq!(
            on_route(&on, ALICE, &[("disabled", &[1])]).0,
            Vec::<Vec<usize>>::new()
        );
        assert_eq!(on_route(&on, ALICE, &[]).0, [vec![0], vec![1]]);
        let with_baseline = envoy_list(&["per-user", "baseline"]);
        let anonymous = on_route(&on, &[], &[("policies", &with_baseline)]);
        assert_eq!(
            anonymous.0,
            [vec![2]],
            "the listed default catches what per-user skips"
        );
        let typo = envoy_list(&["per-usr"]);
        let ignored = on_route(&on, ALICE, &[("policies", &typo)]);
        assert_eq!(ignored.0, [vec![0], vec![1]]);
        assert_eq!(
            ignored.1,
            Some("policies names a policy that does not exist")
        );
        let unasked = on_route(&off, ALICE, &[("disabled", &[1])]);
        assert_eq!(unasked.0, [vec![0], vec![1]]);
        assert_eq!(
            unasked.2,
            on_route(&on, ALICE, &[]).2 - 1,
            "the route was not read"
        );
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
    fn without_an_operators_secret_slots_and_shared_keys_hash_apart() {
        let bypass = json!([{"key": ["alice"], "policies": ["bypassed"], "owner": "oncall",
            "reason": "INC-1", "expires": "2030-01-01T00:00:00Z"}]);
        let plan = plan(json!({"policies": [
            per_user("bypassed", 1, json!({})),
            {"name": "per-ip", "key": ["ip"], "requests": 1, "per": "1s"},
        ], "bypass": bypass}));
        let (works, _) = gather(&plan, &[("x-user-id", "bob")], T0);
        let public = crate::core::key::hash_values(&["bob".into()], &HashSecret::PUBLIC);
        assert_eq!(
            works[0].key,
            Some(public),
            "named by a bypass entry: the public hash"
        );
        assert_ne!(works[0].hash, public, "its slot: this Envoy's secret");
        assert_eq!(
            works[1].key, None,
            "a local key no one names is hashed once"
        );
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
