//! One Envoy worker's decisions, replayed: the filter's `Limiter` over shared data held in
//! memory (`LocalStore`, Envoy's semantics, its slots created up front as `Filter::configure`
//! does), this worker's ledger, and the worker's clock, which never goes back. Global policies
//! are decided as if by one exact global store (`ExactStore`, the service's algorithms), asked
//! whenever the limiter calls out.
//!
//! A request admitted with a tab (a concurrency policy's slot, a token budget's reservation) is
//! in flight until its start plus its duration (`flights`): then its slots are given back and
//! its reservations settled against the usage its line records, priced by this configuration's
//! meters (`sluice::response::cost`), through the filter's own settlement (`Limiter::settle`;
//! a global policy's, as the service applies it, on the exact store), in the order the filter
//! does it when a request ends. Every end and renewal due by a request's start is handled first.
//!
//! Memory: the tables' pages (up to `max_keys` keys per table), the ledger (16 loans), the
//! global store's keys that are not idle, which it forgets every `FORGET_EVERY` of log time, and
//! the requests in flight.

use crate::flights::{Charge, Flight, Flights, Unknown};
use crate::log::Record;
use sluice::config::key_check;
use sluice::config::{ConfigError, Metered, Plan};
use sluice::core::algorithm::Algorithm;
use sluice::core::duration::NANOS_PER_SEC;
use sluice::core::key::{HashSecret, Keying};
use sluice::core::request::Attributes;
use sluice::core::time::WorkerClock;
use sluice::limiter::tab::{Ending, Entry, Held, Op, Tab};
use sluice::limiter::{Basis, Limiter, Outcome, Settled, Step};
use sluice::output::metrics::UsageUnknown;
use sluice::response::{charge_of, cost, settle_op, BodyUsage, Models};
use sluice::state::ledger::Ledger;
use sluice::state::store::{LocalStore, Store, StoreError};
use sluice::wire::exact::ExactStore;
use sluice::wire::protocol::Answer;
use smallvec::SmallVec;

/// Namespaces the slots, as the plugin name does in Envoy.
const PREFIX: &str = "sluice/replay/";
/// How often (in log time) the global store drops keys that are as good as new.
const FORGET_EVERY: u64 = 10 * NANOS_PER_SEC;

/// A replay of one configuration.
pub struct Engine {
    pub plan: Plan,
    worker: Worker,
    clock: WorkerClock,
    next_forget: u64,
    flights: Flights,
    /// What settling found, per policy (by index).
    pub tokens: Vec<TokenTally>,
    /// Requests admitted with a tab whose line has no `duration`: they end when they start.
    pub no_duration: u64,
    /// Whether some policy is metered: its refusals are looked at for debt.
    metered: bool,
}

/// What one worker decides with: its shared data, its loans, and the one global store.
struct Worker {
    store: LocalStore,
    /// One secret for slots and names, so every policy's key is named by the hash Envoy's access
    /// log and logs show: the operator's (`hash_secret_env`), else the public key.
    keying: Keying,
    global: ExactStore,
    ledger: Ledger,
    /// The name of the next slot of a global concurrency policy.
    next_slot: u64,
}

impl Worker {
    /// What happens to requests after their decision, through the limiter: settling what they
    /// owe when they end (`Limiter::settle`), or finding a key's debt (`Limiter::owes`).
    fn after<T>(&mut self, plan: &Plan, run: impl FnOnce(&mut Limiter<'_, Settling>) -> T) -> T {
        let store = Settling(&self.store);
        run(&mut Limiter {
            plan,
            keying: &self.keying,
            prefix: PREFIX,
            store: &store,
            ledger: &mut self.ledger,
            overrides: None,
        })
    }
}

/// The worker's shared data as the limiter sees it after a decision: the same store, under a
/// type of its own, so that the limiter's code for settling is compiled apart from its code for
/// deciding. Sharing one copy, the compiler no longer inlined the slot lookup into decisions,
/// whose slot then came back as a copy of a few hundred bytes, read at once: a replay without a
/// single settlement took 10 to 20 per cent more CPU time on the benchmark VM.
struct Settling<'a>(&'a LocalStore);

impl Store for Settling<'_> {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        self.0.get(key)
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        self.0.set(key, value, cas)
    }
}

/// A request's outcome, and the worker's time it was decided at.
#[derive(Debug)]
pub struct Decided {
    pub outcome: Outcome,
    pub now: u64,
}

/// A token budget's settlements, counted as the filter's counters count them
/// (`sluice_tokens_*_total`, `sluice_usage_unknown_total`), and its refusals for debt.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TokenTally {
    /// Requests settled.
    pub settled: u64,
    pub reserved: u64,
    /// What responses were charged in all: their usage, or what `on_unknown` charged.
    pub charged: u64,
    /// Reserved and not used.
    pub refunded: u64,
    /// Charged past the limit: the debt run up (local policies).
    pub owed: u64,
    /// Usage beyond what `max_debt` lets a key owe, not charged.
    pub forgiven: u64,
    /// Responses whose usage was not known, by why (`UsageUnknown::ALL`'s order)...
    pub unknown: [u64; 3],
    /// ...and those whose line does not say (the Envoy that wrote it did not read it).
    pub not_logged: u64,
    /// Refusals by the policy of a key that owed: its usage had taken it past its limit.
    pub refused_in_debt: u64,
}

impl Engine {
    /// Compiles the configuration; its tables start empty, as in a new Envoy.
    pub fn new(json: &[u8]) -> Result<Engine, ConfigError> {
        let plan = plan(json)?;
        let secret = plan.hash_secret.unwrap_or(HashSecret::PUBLIC);
        let worker = Worker {
            store: LocalStore::default(),
            keying: Keying {
                slots: secret,
                shared: secret,
            },
            global: ExactStore::default(),
            ledger: Ledger::default(),
            next_slot: 0,
        };
        Ok(Engine {
            tokens: vec![TokenTally::default(); plan.policies.len()],
            metered: plan.policies.iter().any(|p| p.metered.is_some()),
            plan,
            worker,
            clock: WorkerClock::default(),
            next_forget: 0,
            flights: Flights::default(),
            no_duration: 0,
        })
    }

    /// Decides the request of `record` at its start time (or the worker's, if later), once the
    /// requests in flight that ended by then have been settled.
    pub fn decide(&mut self, record: &Record) -> Decided {
        let now = self.clock.now(record.time);
        if !self.flights.is_empty() {
            self.land(now);
        }
        if now >= self.next_forget {
            self.worker.global.forget_idle(now);
            self.next_forget = now.saturating_add(FORGET_EVERY);
        }
        if self.is_status(record) {
            return Decided {
                outcome: Outcome::default(),
                now,
            };
        }
        self.evaluate(record, now)
    }

    /// Whether the record is a request for the status path (`status_path`), which the filter
    /// answers without charging anything: no policy applies to it here either.
    fn is_status(&self, record: &Record) -> bool {
        use sluice::core::request::RequestSource;
        let Some(path) = &self.plan.status_path else {
            return false;
        };
        record.header(":path").as_deref() == Some(path.as_bytes())
    }

    /// The filter's decision, the exact store answering for the service; then what it leaves to
    /// do (`follow`). The outcome goes straight out: each move of it is a copy of 400 bytes.
    fn evaluate(&mut self, record: &Record, now: u64) -> Decided {
        let worker = &mut self.worker;
        let mut request = Attributes::new(record, &self.plan.attrs);
        let mut limiter = Limiter {
            plan: &self.plan,
            keying: &worker.keying,
            prefix: PREFIX,
            store: &worker.store,
            ledger: &mut worker.ledger,
            overrides: None,
        };
        let mut step = limiter.evaluate(&mut request, now, true);
        loop {
            match step {
                // Most requests of most configurations owe nothing: they pass by.
                Step::Done(outcome)
                    if outcome.tab.is_none() && !self.metered && outcome.unkept.is_empty() =>
                {
                    return Decided { outcome, now };
                }
                Step::Done(outcome) => return self.follow(outcome, record, now),
                Step::Callout(mut pending) => {
                    // As the filter names them, for the slots of global concurrency policies.
                    pending.name_slots(|| {
                        worker.next_slot += 1;
                        worker.next_slot
                    });
                    let global = &mut worker.global;
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

    /// What a request's outcome leaves to do: its refusal looked at for debt, or its tab taken
    /// in flight.
    #[inline(never)]
    fn follow(&mut self, mut outcome: Outcome, record: &Record, now: u64) -> Decided {
        // What the service granted a request that does not run on it (another policy refused
        // it), slots and reservations: given back at once, as the filter does.
        for entry in &outcome.unkept {
            let Some((key, limit)) = global_limit(&self.plan, entry) else {
                continue;
            };
            let global = &mut self.worker.global;
            match entry.held {
                Held::Lease { renewed, .. } => {
                    global.release_slot(&key, limit, now, renewed);
                }
                Held::Reserved { tokens, at } => {
                    global.refund(&key, limit, now, tokens, at);
                }
                Held::Slot(_) => {}
            }
        }
        if self.metered && outcome.is_denied() {
            self.count_debts(&outcome, now);
        }
        if let Some(tab) = outcome.tab.take() {
            self.take_off(tab, record, now);
        }
        Decided { outcome, now }
    }

    /// Counts the refusals of metered policies whose key owed (local policies: the service
    /// keeps a global key's state).
    fn count_debts(&mut self, outcome: &Outcome, now: u64) {
        let (plan, worker) = (&self.plan, &mut self.worker);
        for a in outcome.applied.iter().filter(|a| !a.decision.allowed) {
            let metered = plan
                .policies
                .get(a.policy)
                .is_some_and(|p| p.metered.is_some());
            let Some(key) = a.key.filter(|_| metered && a.basis == Basis::Bucket) else {
                continue;
            };
            if worker.after(plan, |l| l.owes(a.policy, key, &a.tier, now)) {
                if let Some(tally) = self.tokens.get_mut(a.policy) {
                    tally.refused_in_debt += 1;
                }
            }
        }
    }

    /// Puts an admitted request in flight until its end, its charges priced now.
    fn take_off(&mut self, tab: Tab, record: &Record, now: u64) {
        let end = match record.duration() {
            Some(duration) => record.time.saturating_add(duration).max(now),
            None => {
                self.no_duration += 1;
                now
            }
        };
        let charges = charges(&self.plan, &tab, record);
        self.flights.push(Box::new(Flight { tab, end, charges }));
    }

    /// Handles every event of the requests in flight due at or before `until`, in time order.
    fn land(&mut self, until: u64) {
        while let Some((at, flight)) = self.flights.pop_until(until) {
            self.event(at, flight);
        }
    }

    /// At the end of the log: every request still in flight ends, when its line says.
    pub fn finish(&mut self) {
        while let Some((at, flight)) = self.flights.pop() {
            self.event(at, flight);
        }
    }

    /// A flight's next event, at `at`: its end, or the renewal of its slots.
    fn event(&mut self, at: u64, mut flight: Box<Flight>) {
        let now = self.clock.now(at);
        if now >= flight.end {
            self.end(&mut flight, now);
        } else {
            self.renew(&mut flight.tab, now);
            self.flights.push(flight);
        }
    }

    /// Renews the flight's slots whose epoch is over, as the filter's timer does
    /// (`response::slots::renew`): a local slot that lapsed and finds none free is lost.
    fn renew(&mut self, tab: &mut Tab, now: u64) {
        let (plan, worker) = (&self.plan, &mut self.worker);
        tab.entries.retain_mut(|entry| {
            let Algorithm::Concurrency(slots) = entry.tier.algorithm else {
                return true;
            };
            match entry.held {
                Held::Lease { id, renewed } if now >= renewed + slots.epoch.get() => {
                    if let Some((key, limit)) = global_limit(plan, entry) {
                        worker.global.renew_slot(&key, limit, now, renewed);
                    }
                    entry.held = Held::Lease { id, renewed: now };
                    true
                }
                Held::Slot(taken) if taken.epoch < slots.epoch_of(now) => {
                    let renewed = worker.after(plan, |l| l.settle(entry, Op::Renew, now));
                    matches!(renewed, Settled::Done { .. })
                }
                _ => true,
            }
        });
    }

    /// The request ended: its slots are given back, then its reservations settled, as the
    /// filter does (`response::Response::end`).
    fn end(&mut self, flight: &mut Flight, now: u64) {
        let (plan, worker) = (&self.plan, &mut self.worker);
        for entry in flight.tab.entries.iter_mut() {
            match entry.held {
                Held::Slot(_) => {
                    worker.after(plan, |l| l.settle(entry, Op::Release, now));
                }
                Held::Lease { renewed, .. } => {
                    if let Some((key, limit)) = global_limit(plan, entry) {
                        worker.global.release_slot(&key, limit, now, renewed);
                    }
                }
                Held::Reserved { .. } => {}
            }
        }
        for entry in flight.tab.entries.iter_mut() {
            if let Some(charge) = flight.charges.iter().find(|c| c.policy == entry.policy) {
                self.settle(entry, *charge, now);
            }
        }
    }

    /// Settles a reservation against what the request is charged: locally through the
    /// limiter, or for a policy the service decided, as the service applies the settlement.
    fn settle(&mut self, entry: &mut Entry, charge: Charge, now: u64) {
        let Held::Reserved {
            tokens: reserved,
            at,
        } = entry.held
        else {
            return;
        };
        let (plan, worker) = (&self.plan, &mut self.worker);
        let Some(tally) = self.tokens.get_mut(entry.policy) else {
            return;
        };
        tally.count(reserved, charge);
        let Some(op) = settle_op(reserved, charge.tokens) else {
            return;
        };
        let Some(metered) = plan
            .policies
            .get(entry.policy)
            .and_then(|p| p.metered.as_ref())
        else {
            return;
        };
        if entry.basis == Basis::Service {
            let charged =
                settle_globally(plan, &mut worker.global, entry, (op, metered), (now, at));
            if let Op::Charge(tokens) = op {
                tally.forgiven += tokens.saturating_sub(charged);
            }
            return;
        }
        let settled = worker.after(plan, |l| l.settle(entry, op, now));
        if let (
            Op::Charge(tokens),
            Settled::Done {
                amount, past_limit, ..
            },
        ) = (op, settled)
        {
            tally.owed += past_limit;
            tally.forgiven += tokens.saturating_sub(amount);
        }
    }
}

impl TokenTally {
    /// Counts a settlement as the filter's counters do.
    fn count(&mut self, reserved: u64, charge: Charge) {
        self.settled += 1;
        self.reserved += reserved;
        self.charged += charge.tokens;
        self.refunded += reserved.saturating_sub(charge.tokens);
        match charge.unknown {
            Some(Unknown::Filter(why)) => {
                let at = UsageUnknown::ALL.iter().position(|w| *w == why);
                if let Some(count) = at.and_then(|at| self.unknown.get_mut(at)) {
                    *count += 1;
                }
            }
            Some(Unknown::NotLogged) => self.not_logged += 1,
            None => {}
        }
    }
}

/// What each reservation of `tab` is charged in all, from the usage `record` logs: priced by the
/// policy's meter, or as its `on_unknown` says when not known. A line without `usage` is a
/// response whose usage is missing.
fn charges(plan: &Plan, tab: &Tab, record: &Record) -> SmallVec<[Charge; 1]> {
    let logged = record.usage();
    let body: BodyUsage = logged.unwrap_or(Err(UsageUnknown::Missing));
    let ending = match body {
        Err(UsageUnknown::Reset) => Ending::Reset,
        _ => Ending::Completed,
    };
    let mut charges = SmallVec::new();
    for entry in &tab.entries {
        let Held::Reserved {
            tokens: reserved, ..
        } = entry.held
        else {
            continue;
        };
        let Some(metered) = plan
            .policies
            .get(entry.policy)
            .and_then(|p| p.metered.as_ref())
        else {
            continue;
        };
        let cost = cost(
            &metered.source,
            body,
            |name| record.response_count(name),
            ending,
            Models {
                served: record.served_model(),
                asked: tab.model.as_deref(),
            },
        );
        let unknown = cost.err().map(|why| match (logged, &metered.source) {
            (None, source) if source.reads_body() => Unknown::NotLogged,
            _ => Unknown::Filter(why),
        });
        charges.push(Charge {
            policy: entry.policy,
            tokens: charge_of(metered, &entry.tier, reserved, cost),
            unknown,
        });
    }
    charges
}

/// A global policy's key on the exact store and its limit, as its checks name them.
fn global_limit(plan: &Plan, entry: &Entry) -> Option<(String, Algorithm)> {
    let policy = plan.policies.get(entry.policy)?;
    let check = key_check(policy, &entry.tier, entry.key.unwrap_or(entry.hash));
    let limit = check.limit()?;
    Some((check.key, limit))
}

/// A global reservation's settlement, as the service applies it to the key's state (a charge
/// owing at most the policy's `max_debt`; a refund of what the window that took it still
/// counts): the tokens it charged or refunded.
fn settle_globally(
    plan: &Plan,
    global: &mut ExactStore,
    entry: &Entry,
    (op, metered): (Op, &Metered),
    (now, reserved_at): (u64, u64),
) -> u64 {
    let Some((key, limit)) = global_limit(plan, entry) else {
        return 0;
    };
    match op {
        Op::Charge(tokens) => {
            let max_debt = metered.max_debt(&entry.tier);
            let cost = (tokens, tokens);
            global.decide_owing(&key, limit, now, cost, max_debt).1
        }
        Op::Refund(tokens) => global.refund(&key, limit, now, tokens, reserved_at),
        Op::Release | Op::Renew => 0,
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
    use sluice::core::request::Attr;

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

    /// An engine for these policies, and the records of its lines: each line a JSON object
    /// whose `start_time` is seconds after T0 (`at`).
    struct Replayed {
        engine: Engine,
        parser: Parser,
    }

    impl Replayed {
        fn new(policies: serde_json::Value) -> Replayed {
            let config = json!({"global": {"cluster": "c"}, "policies": policies});
            let engine = Engine::new(config.to_string().as_bytes()).unwrap();
            let wanted = Wanted::new(&engine.plan.attrs, false).settling(&engine.plan);
            Replayed {
                engine,
                parser: Parser::new(wanted),
            }
        }

        /// Decides the line (`start_time` set from `at`, seconds after T0): whether it passed.
        fn passes(&mut self, at: f64, mut line: serde_json::Value) -> bool {
            let time = T0 + (at * SEC as f64) as u64;
            line["start_time"] = json!(sluice::core::time::format_rfc3339(time));
            let mut record = Record::default();
            let text = line.to_string();
            self.parser.parse(text.as_bytes(), 1, &mut record).unwrap();
            !self.engine.decide(&record).outcome.is_denied()
        }

        fn tally(&mut self) -> TokenTally {
            self.engine.finish();
            self.engine.tokens[0]
        }
    }

    #[test]
    fn a_request_for_the_status_path_is_charged_to_no_policy() {
        let config = json!({"status_path": "/api/ratelimit/status", "policies": [
            {"name": "p", "key": ["header:x-user-id"], "requests": 1, "per": "1h"}]});
        let engine = Engine::new(config.to_string().as_bytes()).unwrap();
        let wanted = Wanted::new(&engine.plan.attrs, false).settling(&engine.plan);
        let mut replayed = Replayed {
            engine,
            parser: Parser::new(wanted),
        };
        let to = |path: &str| alices(1, json!({"path": path}));
        assert!(replayed.passes(0.0, to("/api/ratelimit/status")));
        assert!(replayed.passes(0.1, to("/api/ratelimit/status")));
        assert!(
            replayed.passes(0.2, to("/api/ratelimit/status?again")),
            "charged"
        );
        assert!(
            !replayed.passes(0.3, to("/api/x")),
            "the one token is spent"
        );
    }

    /// A request of alice's that takes `ms` milliseconds, with more fields.
    fn alices(ms: u64, more: serde_json::Value) -> serde_json::Value {
        let mut line = json!({"headers": {"x-user-id": "alice"}, "duration": ms});
        for (field, value) in more.as_object().into_iter().flatten() {
            line[field] = value.clone();
        }
        line
    }

    fn streams(requests: u64, scope: &str) -> serde_json::Value {
        json!([{"name": "streams", "key": ["header:x-user-id"], "algorithm": "concurrency",
            "requests": requests, "lease": "10s", "scope": scope}])
    }

    #[test]
    fn a_slot_is_taken_at_a_requests_start_and_given_back_at_its_end() {
        for scope in ["local", "global"] {
            let mut replay = Replayed::new(streams(2, scope));
            let passed = [
                replay.passes(0.0, alices(10_000, json!({}))),
                replay.passes(1.0, alices(4_000, json!({}))),
                replay.passes(2.0, alices(100, json!({}))),
                replay.passes(4.9, alices(100, json!({}))),
                replay.passes(5.0, alices(100, json!({}))),
                replay.passes(5.2, alices(100, json!({}))),
            ];
            assert_eq!(
                passed,
                [true, true, false, false, true, true],
                "{scope}: two in flight until 5 s, then one"
            );
        }
    }

    #[test]
    fn a_request_longer_than_its_slots_lease_keeps_its_slot() {
        for scope in ["local", "global"] {
            let mut replay = Replayed::new(streams(1, scope));
            assert!(replay.passes(0.0, alices(60_000, json!({}))));
            for second in 1..60 {
                assert!(
                    !replay.passes(f64::from(second), alices(0, json!({}))),
                    "{scope} {second}"
                );
            }
            assert!(replay.passes(60.0, alices(0, json!({}))), "{scope}");
        }
    }

    /// Issue 31: a slot the service granted to a request another policy refuses is given back
    /// at once, as the filter does, not held until its lease ends.
    #[test]
    fn a_global_slot_granted_to_a_refused_request_is_given_back() {
        let policies = json!([
            {"name": "streams", "key": ["header:x-tenant"], "algorithm": "concurrency",
                "requests": 1, "lease": "10s", "scope": "global"},
            {"name": "hourly", "scope": "global", "key": ["header:x-user-id"], "requests": 1,
                "per": "1h"}]);
        let mut replay = Replayed::new(policies);
        let of = |user: &str| json!({"headers": {"x-user-id": user, "x-tenant": "acme"}, "duration": 100});
        assert!(replay.passes(0.0, of("alice")));
        assert!(!replay.passes(1.0, of("alice")), "alice's hour is used");
        assert!(
            replay.passes(1.5, of("bob")),
            "the tenant's one slot is free"
        );
    }

    #[test]
    fn a_line_without_a_duration_ends_as_it_starts_and_is_counted() {
        let mut replay = Replayed::new(streams(1, "local"));
        let line = json!({"headers": {"x-user-id": "alice"}});
        assert!(replay.passes(0.0, line.clone()));
        assert!(replay.passes(0.5, line));
        assert_eq!(replay.engine.no_duration, 2);
    }

    fn budget(extra: serde_json::Value) -> serde_json::Value {
        let mut policy = json!({"name": "llm", "key": ["header:x-user-id", "body:model"],
            "requests": 1000, "per": "1h", "cost": {"from_response": {"usage": "total_tokens"}}});
        for (field, value) in extra.as_object().into_iter().flatten() {
            policy["cost"][field] = value.clone();
        }
        json!([policy])
    }

    fn used(total: u64, model: &str) -> serde_json::Value {
        json!({"usage": format!("input=1 output={} total={total}", total - 1),
            "body": {"model": model}})
    }

    #[test]
    fn usage_is_charged_when_a_request_ends_and_a_key_in_debt_is_refused() {
        let mut replay = Replayed::new(budget(json!({})));
        let passed = [
            replay.passes(0.0, alices(2_000, used(600, "m1"))),
            // Its usage is not charged yet.
            replay.passes(1.0, alices(100, used(600, "m1"))),
            replay.passes(3.0, alices(100, used(5, "m1"))),
            replay.passes(3.5, alices(100, used(5, "m2"))),
        ];
        assert_eq!(
            passed,
            [true, true, false, true],
            "1,200 of 1,000 used by m1"
        );
        let tally = replay.tally();
        assert_eq!(
            (
                tally.settled,
                tally.charged,
                tally.owed,
                tally.refused_in_debt
            ),
            (3, 1205, 200, 1)
        );
    }

    #[test]
    fn a_reservation_comes_from_the_logged_max_tokens_and_the_rest_is_refunded() {
        let reserve = json!({"reserve": {"request": "max_tokens", "default": 50}});
        let mut replay = Replayed::new(budget(reserve));
        let asks = |n: u64| {
            alices(
                1_000,
                json!({"max_output_tokens": n.to_string(),
            "usage": "total=100", "body": {"model": "m"}}),
            )
        };
        let passed: Vec<bool> = (0..3)
            .map(|i| replay.passes(f64::from(i) * 0.1, asks(400)))
            .collect();
        assert_eq!(
            passed,
            [true, true, false],
            "400 reserved each, 1,000 in all"
        );
        assert!(replay.passes(1.5, asks(400)), "two refunds of 300");
        let tally = replay.tally();
        assert_eq!(
            (tally.reserved, tally.charged, tally.refunded),
            (1200, 300, 900)
        );
    }

    #[test]
    fn usage_not_known_is_charged_as_this_configurations_on_unknown_says() {
        let mut replay = Replayed::new(budget(json!({"on_unknown": 700})));
        assert!(replay.passes(
            0.0,
            alices(0, json!({"usage": "unknown=reset", "body": {"model": "m"}}))
        ));
        assert!(replay.passes(1.0, alices(0, json!({"body": {"model": "m"}}))));
        assert!(!replay.passes(2.0, alices(0, json!({"body": {"model": "m"}}))));
        let tally = replay.tally();
        assert_eq!(
            (tally.charged, tally.unknown, tally.not_logged),
            (1400, [0, 0, 1], 1)
        );
    }

    #[test]
    fn a_global_budget_is_settled_on_the_exact_store() {
        let mut policies = budget(json!({"reserve": 100}));
        policies[0]["scope"] = json!("global");
        let mut replay = Replayed::new(policies);
        assert!(replay.passes(0.0, alices(500, used(1100, "m"))));
        assert!(!replay.passes(1.0, alices(500, used(10, "m"))), "owes 100");
        let tally = replay.tally();
        assert_eq!((tally.charged, tally.forgiven), (1100, 0));
    }

    #[test]
    fn usage_read_from_a_header_is_the_trailers_else_the_headers() {
        let mut policies = budget(json!({}));
        policies[0]["cost"]["from_response"] = json!({"header": "x-usage"});
        policies[0]["key"] = json!(["header:x-user-id"]);
        let mut replay = Replayed::new(policies);
        let reported = |header: &str, trailer: Option<&str>| {
            alices(
                0,
                json!({"response_headers": {"X-Usage": header},
                "response_trailers": {"x-usage": trailer}}),
            )
        };
        assert!(replay.passes(0.0, reported("900", Some("10"))));
        assert!(replay.passes(1.0, reported("995", None)));
        assert!(
            !replay.passes(2.0, reported("1", None)),
            "1,005 of 1,000 used"
        );
        assert_eq!(replay.tally().charged, 1005);
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
