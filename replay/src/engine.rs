//! One Envoy worker's decisions, replayed: the filter's `Limiter` over shared data held in
//! memory (`LocalStore`, Envoy's semantics, its slots created up front as `Filter::configure`
//! does), this worker's ledger, and the worker's clock, which never goes back. Global policies
//! are decided as if by one exact global store (`ExactStore`, the service's algorithms), asked
//! whenever the limiter calls out.
//!
//! Memory: the tables' pages (up to `max_keys` keys per table), the ledger (16 loans), and the global store's
//! keys that are not idle, which it forgets every `FORGET_EVERY` of log time.

use crate::log::Record;
use sluice::config::{ConfigError, Plan};
use sluice::duration::NANOS_PER_SEC;
use sluice::exact::ExactStore;
use sluice::key::{HashSecret, Keying};
use sluice::ledger::Ledger;
use sluice::limiter::{Limiter, Outcome, Step};
use sluice::protocol::Answer;
use sluice::request::Attributes;
use sluice::store::LocalStore;
use sluice::time::WorkerClock;

/// Namespaces the slots, as the plugin name does in Envoy.
const PREFIX: &str = "sluice/replay/";
/// How often (in log time) the global store drops keys that are as good as new.
const FORGET_EVERY: u64 = 10 * NANOS_PER_SEC;

/// A replay of one configuration.
pub struct Engine {
    pub plan: Plan,
    store: LocalStore,
    /// One secret for slots and names, so every policy's key is named by the hash Envoy's access
    /// log and logs show: the operator's (`hash_secret_env`), else the public key.
    keying: Keying,
    global: ExactStore,
    ledger: Ledger,
    clock: WorkerClock,
    next_forget: u64,
}

/// A request's outcome, and the worker's time it was decided at.
#[derive(Debug)]
pub struct Decided {
    pub outcome: Outcome,
    pub now: u64,
}

impl Engine {
    /// Compiles the configuration; its tables start empty, as in a new Envoy.
    pub fn new(json: &[u8]) -> Result<Engine, ConfigError> {
        let plan = plan(json)?;
        let store = LocalStore::default();
        let secret = plan.hash_secret.unwrap_or(HashSecret::PUBLIC);
        Ok(Engine {
            keying: Keying {
                slots: secret,
                shared: secret,
            },
            plan,
            store,
            global: ExactStore::default(),
            ledger: Ledger::default(),
            clock: WorkerClock::default(),
            next_forget: 0,
        })
    }

    /// Decides the request of `record` at its start time (or the worker's, if later).
    pub fn decide(&mut self, record: &Record) -> Decided {
        let now = self.clock.now(record.time);
        if now >= self.next_forget {
            self.global.forget_idle(now);
            self.next_forget = now.saturating_add(FORGET_EVERY);
        }
        let mut request = Attributes::new(record, &self.plan.attrs);
        let mut limiter = Limiter {
            plan: &self.plan,
            keying: &self.keying,
            prefix: PREFIX,
            store: &self.store,
            ledger: &mut self.ledger,
        };
        let mut step = limiter.evaluate(&mut request, now, true);
        loop {
            match step {
                Step::Done(outcome) => return Decided { outcome, now },
                Step::Callout(pending) => {
                    let global = &mut self.global;
                    let answers = pending
                        .checks()
                        .iter()
                        .map(|check| global.check(check, now).map(Answer::from))
                        .collect();
                    step = limiter.resume(pending, answers);
                }
            }
        }
    }
}

/// Compiles the configuration, reading the environment variables it names from this process's
/// environment as the filter reads its VM's. The replay never calls the service, so the service's
/// token (`global.token_env`) may be unset: a stand-in takes its place. The hash secret must be
/// the one Envoy had: without it, the error says where the replay looks for it.
pub fn plan(json: &[u8]) -> Result<Plan, ConfigError> {
    let config: serde_json::Value = serde_json::from_slice(json).unwrap_or_default();
    let token_env = config.pointer("/global/token_env").and_then(|t| t.as_str());
    let secret_env = config.pointer("/hash_secret_env").and_then(|t| t.as_str());
    let unset = |name: &str| std::env::var(name).map_or(true, |v| v.trim().is_empty());
    sluice::config::parse_with_env(json, &|name| {
        let stand_in = || (Some(name) == token_env).then(|| "unused by sluice-replay".to_string());
        std::env::var(name).ok().or_else(stand_in)
    })
    .map_err(|e| match secret_env {
        Some(name) if e.field == "hash_secret_env" && unset(name) => ConfigError {
            reason: format!(
                "environment variable {name:?} is not set or empty: export it, with the secret \
                 the Envoy that wrote the log had, in the shell that runs sluice-replay (Envoy \
                 gives it to the filter when vm_config.environment_variables.host_env_keys, or \
                 a WasmPlugin's vmConfig.env, lists it)"
            ),
            ..e
        },
        _ => e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::{Parser, Wanted};
    use serde_json::json;
    use sluice::request::Attr;

    const SEC: u64 = NANOS_PER_SEC;
    const T0: u64 = 1_800_000_000 * SEC;

    fn alice_at(time: u64) -> Record {
        let mut record = Record::default();
        let line = json!({"start_time": "2027-01-15T08:00:00Z", "headers": {"x-user-id": "alice"}});
        let wanted = Wanted::new(&[Attr::Header("x-user-id".into())], false);
        let mut parser = Parser::new(wanted);
        parser
            .parse(line.to_string().as_bytes(), 1, &mut record)
            .unwrap();
        record.time = time;
        record
    }

    fn denied(engine: &mut Engine, times: &[u64]) -> Vec<bool> {
        let decide = |t: &u64| engine.decide(&alice_at(*t)).outcome.is_denied();
        times.iter().map(decide).collect()
    }

    #[test]
    fn a_global_policy_is_decided_by_the_exact_store_and_its_leases_spent_here() {
        let config = json!({"global": {"cluster": "c", "authority": "a"}, "policies": [
            {"name": "g", "key": ["header:x-user-id"], "requests": 1, "per": "1h", "burst": 3,
             "scope": "global", "lease": 2}]});
        let mut engine = Engine::new(config.to_string().as_bytes()).unwrap();
        assert_eq!(denied(&mut engine, &[T0; 4]), [false, false, false, true]);
    }

    #[test]
    fn the_services_token_is_not_needed_to_replay() {
        let config = json!({"global": {"cluster": "c", "authority": "a",
            "token_env": "SLUICE_REPLAY_TEST_UNSET_TOKEN"}, "policies": [
            {"name": "g", "key": ["header:x-user-id"], "requests": 1, "per": "1s", "scope": "global"}]});
        assert!(Engine::new(config.to_string().as_bytes()).is_ok());
    }

    #[test]
    fn an_unset_hash_secret_is_to_be_exported_for_the_replay_as_envoy_is_to_list_it() {
        let name = "SLUICE_REPLAY_TEST_UNSET_SECRET";
        let config = json!({"hash_secret_env": name, "policies": [
            {"name": "p", "key": ["ip"], "requests": 1, "per": "1s"}]});
        let error = Engine::new(config.to_string().as_bytes()).err().unwrap();
        assert_eq!(error.field, "hash_secret_env");
        for told in [
            "export it",
            "in the shell that runs sluice-replay",
            "host_env_keys",
        ] {
            assert!(error.reason.contains(told), "{error}");
        }
    }

    #[test]
    fn the_clock_never_goes_back() {
        let config = json!({"policies": [{"name": "p", "key": ["header:x-user-id"],
            "requests": 1, "per": "1s", "burst": 1}]});
        let mut engine = Engine::new(config.to_string().as_bytes()).unwrap();
        assert_eq!(
            denied(&mut engine, &[T0, T0 + 2 * SEC, T0 + SEC]),
            [false, false, true]
        );
        assert_eq!(engine.decide(&alice_at(T0)).now, T0 + 2 * SEC);
    }
}
