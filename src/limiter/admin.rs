//! The admin path's work on one local key (`filter::admin`): find its policy, its slot and the
//! limit it runs at (the policy's, a tier's, or its override), show its state as the status path
//! reads it (`local::standing`, nothing charged), reset it (a full bucket, an empty window,
//! every slot free) or give tokens back (forgiving debt first), with compare-and-swap as every
//! write of a slot.

use super::overrides::Lookup;
use super::{local, Limiter, MAX_ATTEMPTS};
use crate::config::{Scope, Tier};
use crate::core::algorithm::Algorithm;
use crate::core::key::{hash_values, MISSING_KEY};
use crate::state::store::{Store, StoreError};
use crate::state::table::{self, Words};
use crate::wire::admin::{BadRequest, KeyName, KeyRequest, KeyState};

/// A local key, found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub policy: usize,
    /// The key's hash for its slot, and as the logs show it.
    pub hash: u64,
    pub key: u64,
    pub tier: Tier,
    /// `policy`, `tier` or `override`.
    pub source: &'static str,
    pub tier_name: Option<String>,
}

impl<S: Store> Limiter<'_, S> {
    /// The key a call names, in a local policy of this configuration.
    pub fn admin_target(&self, asked: &KeyRequest, now: u64) -> Result<Target, BadRequest> {
        let plan = self.plan;
        let index = plan.policy_index(asked.policy.as_bytes()).ok_or_else(|| {
            BadRequest::new("policy", format!("no policy {:?} here", asked.policy))
        })?;
        let policy = plan
            .policies
            .get(index)
            .ok_or_else(|| BadRequest::new("policy", "gone"))?;
        if policy.scope != Scope::Local {
            return Err(BadRequest::new(
                "policy",
                format!(
                    "{:?} is global: its state is sluice-service's (POST /admin/v1/keys/... there)",
                    policy.name
                ),
            ));
        }
        let parts = plan.tables.get(policy.table).map_or(0, |t| t.key.len());
        let (hash, key) = match &asked.key {
            KeyName::Values(values) if values.len() != parts => {
                return Err(BadRequest::new(
                    "key",
                    format!("policy {:?} has {parts} key parts, got {}", policy.name, values.len()),
                ))
            }
            KeyName::Values(values) => (
                hash_values(values, &self.keying.slots),
                hash_values(values, &self.keying.shared),
            ),
            KeyName::Hash(hash) if *hash == MISSING_KEY || self.keying.is_one() => (*hash, *hash),
            KeyName::Hash(_) => {
                return Err(BadRequest::new(
                    "key_hash",
                    "this Envoy keys its slots with a secret of its own (no hash_secret_env): name the key by its value (key)",
                ))
            }
        };
        let (mut tier, mut source) = (policy.tier, "policy");
        if let Some(name) = &asked.tier {
            let tiers = policy.tiers.as_ref();
            tier = *tiers
                .and_then(|t| t.values.get(name.as_bytes()))
                .ok_or_else(|| {
                    BadRequest::new(
                        "tier",
                        format!("policy {:?} has no tier {name:?}", policy.name),
                    )
                })?;
            source = "tier";
        }
        if let Some(view) = self.overrides {
            let lookup = Lookup {
                view,
                store: self.store,
                prefix: self.prefix,
            };
            if lookup.covers(index, policy) && key != MISSING_KEY {
                let overridden = lookup.tier(index, policy, tier, key, now);
                if overridden != tier {
                    (tier, source) = (overridden, "override");
                }
            }
        }
        Ok(Target {
            policy: index,
            hash,
            key,
            tier,
            source,
            tier_name: asked.tier.clone(),
        })
    }

    /// The key's state at `now`, read once; nothing written.
    pub fn admin_show(&self, target: &Target, now: u64) -> KeyState {
        let plan = self.plan;
        let policy = plan.policies.get(target.policy);
        let name = policy.map_or("", |p| p.name.as_str());
        let algorithm = target.tier.algorithm;
        let slot = policy.and_then(|p| self.find(p.table, target.hash, now));
        let held = slot.as_ref().is_some_and(|s| s.takeover.is_none());
        let at = slot.as_ref().map_or(now, |s| s.time(now));
        let mut words: Words = match (&slot, policy) {
            (Some(slot), Some(p)) if held => slot
                .state
                .get(p.words.clone())
                .map(Words::from_slice)
                .unwrap_or_default(),
            _ => Words::from_elem(0, algorithm.columns()),
        };
        let debt = algorithm.past_limit(&words, at);
        let decision = local::standing(&target.tier, &mut words, at).unwrap_or_default();
        let lent = self.ledger.held(target.policy, target.hash, at);
        let remaining = decision.remaining.saturating_add(lent);
        let slots_in_use = matches!(algorithm, Algorithm::Concurrency(_))
            .then(|| algorithm.capacity().saturating_sub(remaining));
        let mut key_hash = String::with_capacity(16);
        crate::core::text::push_hex16(&mut key_hash, target.key);
        KeyState {
            key: format!("{name}/{key_hash}"),
            policy: name.to_string(),
            key_hash,
            scope: "local",
            algorithm: algorithm.name(),
            capacity: algorithm.capacity(),
            requests: target.tier.requests,
            per_ms: target.tier.per_nanos / 1_000_000,
            source: target.source,
            tier: target.tier_name.clone(),
            remaining,
            reset_ms: decision.reset_after.div_ceil(1_000_000),
            debt,
            slots_in_use,
            held,
        }
    }

    /// Forgets the key's state under the policy (its other policies' are kept). Returns whether
    /// there was one.
    pub fn admin_reset(&mut self, target: &Target, now: u64) -> Result<bool, StoreError> {
        self.admin_write(target, now, |_, words, _| {
            words.iter_mut().for_each(|w| *w = 0);
            1
        })
        .map(|changed| changed > 0)
    }

    /// Gives `tokens` back to the key (what it owes first). Returns the tokens given back.
    pub fn admin_credit(
        &mut self,
        target: &Target,
        tokens: u64,
        now: u64,
    ) -> Result<u64, StoreError> {
        let algorithm = target.tier.algorithm;
        self.admin_write(target, now, |columns, words, at| {
            words
                .get_mut(..columns)
                .map_or(0, |state| algorithm.refund(state, at, tokens, at))
        })
    }

    /// Applies `change` to the policy's words of the key's slot and writes it, judged again
    /// after a lost race. A key with no state here is left alone (0).
    fn admin_write(
        &mut self,
        target: &Target,
        now: u64,
        change: impl Fn(usize, &mut [u64], u64) -> u64,
    ) -> Result<u64, StoreError> {
        let Some(policy) = self.plan.policies.get(target.policy) else {
            return Ok(0);
        };
        let columns = target.tier.algorithm.columns();
        for _ in 0..MAX_ATTEMPTS {
            let Some(slot) = self.find(policy.table, target.hash, now) else {
                return Ok(0);
            };
            if slot.takeover.is_some() {
                return Ok(0);
            }
            let at = slot.time(now);
            let mut next = slot.state.clone();
            let Some(words) = next.get_mut(policy.words.clone()) else {
                return Ok(0);
            };
            let done = change(columns, words, at);
            if done == 0 || next == slot.state {
                return Ok(0);
            }
            let free_at = slot.free_at(at);
            match table::write(self.store, &slot, &next, at, free_at) {
                Ok(_) => return Ok(done),
                Err(StoreError::CasMismatch) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::CasMismatch)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use crate::state::ledger::Ledger;
    use crate::wire::admin::{parse, Action};
    use serde_json::json;

    fn ask(body: serde_json::Value) -> KeyRequest {
        let action = if body.get("tokens").is_some() {
            Action::Credit
        } else if body.get("reason").is_some() {
            Action::Reset
        } else {
            Action::Show
        };
        parse(action, body.to_string().as_bytes()).unwrap()
    }

    fn with<S: Store, T>(
        plan: &crate::config::Plan,
        store: &S,
        f: impl FnOnce(&mut Limiter<S>) -> T,
    ) -> T {
        let mut ledger = Ledger::default();
        f(&mut Limiter {
            plan,
            keying: &keying(),
            prefix: PREFIX,
            store,
            ledger: &mut ledger,
            overrides: None,
        })
    }

    #[test]
    fn a_show_says_what_the_status_path_says_and_a_reset_gives_the_whole_bucket() {
        let plan = plan_of(json!([per_user(
            "api",
            1,
            json!({"per": "1h", "burst": 5})
        )]));
        let store = store(&plan);
        for _ in 0..3 {
            decide(&plan, &store, ALICE, T0);
        }
        let asked = ask(json!({"policy": "api", "key": ["alice"]}));
        let shown = with(&plan, &store, |l| {
            let target = l.admin_target(&asked, T0).unwrap();
            l.admin_show(&target, T0)
        });
        assert_eq!(
            (shown.remaining, shown.capacity, shown.source),
            (2, 5, "policy")
        );
        assert_eq!(shown.reset_ms, 3 * 3600 * 1000);
        assert_eq!(
            (shown.debt, shown.slots_in_use, shown.held),
            (0, None, true)
        );
        let public = hash_values(&["alice".into()], &crate::core::key::HashSecret::PUBLIC);
        assert_eq!(shown.key_hash, format!("{public:016x}"));
        let reset = with(&plan, &store, |l| {
            let target = l.admin_target(&asked, T0).unwrap();
            (
                l.admin_reset(&target, T0),
                l.admin_reset(&target, T0),
                l.admin_show(&target, T0).remaining,
            )
        });
        assert_eq!(reset, (Ok(true), Ok(false), 5));
        assert_eq!(
            decide(&plan, &store, ALICE, T0).applied[0]
                .decision
                .remaining,
            4
        );
    }

    #[test]
    fn a_credit_forgives_debt_first_and_an_unseen_key_is_left_alone() {
        let cost = json!({"from_response": {"usage": "total_tokens"}, "reserve": 0});
        let plan = plan_of(json!([per_user(
            "llm",
            10,
            json!({"per": "1h", "cost": cost, "algorithm": "fixed_window"})
        )]));
        let store = store(&plan);
        let outcome = decide(&plan, &store, ALICE, T0);
        let mut entry = outcome.tab.unwrap().entries[0];
        with(&plan, &store, |l| {
            l.settle(&mut entry, crate::limiter::tab::Op::Charge(15), T0)
        });
        let asked = ask(json!({"policy": "llm", "key": ["alice"]}));
        let (before, given, after) = with(&plan, &store, |l| {
            let target = l.admin_target(&asked, T0).unwrap();
            let before = l.admin_show(&target, T0);
            let given = l.admin_credit(&target, 7, T0);
            (before, given, l.admin_show(&target, T0))
        });
        assert_eq!((before.remaining, before.debt), (0, 5));
        assert_eq!(given, Ok(7));
        assert_eq!((after.remaining, after.debt), (2, 0));
        let bob = ask(json!({"policy": "llm", "key": ["bob"]}));
        let untouched = with(&plan, &store, |l| {
            let target = l.admin_target(&bob, T0).unwrap();
            (
                l.admin_credit(&target, 3, T0),
                l.admin_show(&target, T0).held,
            )
        });
        assert_eq!(untouched, (Ok(0), false));
    }

    #[test]
    fn a_global_policy_an_unknown_tier_and_a_hash_under_an_envoys_own_secret_are_refused() {
        let plan = plan_of(json!([
            per_user("global", 10, json!({"scope": "global"})),
            per_user("tiered", 10, json!({"tiers": {"by": "header:x-plan", "values": {"gold": {"requests": 100, "per": "1s"}}}})),
            {"name": "slots", "key": ["header:x-user-id"], "algorithm": "concurrency", "requests": 3},
        ]));
        let store = store(&plan);
        let refused = |body: serde_json::Value| {
            with(&plan, &store, |l| {
                l.admin_target(&ask(body), T0).unwrap_err().detail
            })
        };
        assert!(refused(json!({"policy": "global", "key": ["a"]})).starts_with("policy:"));
        assert!(refused(json!({"policy": "nobody", "key": ["a"]})).starts_with("policy:"));
        assert!(refused(json!({"policy": "tiered", "key": ["a", "b"]})).starts_with("key:"));
        assert!(
            refused(json!({"policy": "tiered", "key": ["a"], "tier": "tin"})).starts_with("tier:")
        );
        assert!(
            refused(json!({"policy": "tiered", "key_hash": "0123456789abcdef"}))
                .starts_with("key_hash:")
        );
        let gold = with(&plan, &store, |l| {
            let target = l
                .admin_target(
                    &ask(json!({"policy": "tiered", "key": ["a"], "tier": "gold"})),
                    T0,
                )
                .unwrap();
            l.admin_show(&target, T0)
        });
        assert_eq!(
            (gold.source, gold.capacity, gold.tier.as_deref()),
            ("tier", 100, Some("gold"))
        );
        let slots = with(&plan, &store, |l| {
            let target = l
                .admin_target(&ask(json!({"policy": "slots", "key": ["a"]})), T0)
                .unwrap();
            l.admin_show(&target, T0)
        });
        assert_eq!((slots.slots_in_use, slots.remaining), (Some(0), 3));
    }
}
