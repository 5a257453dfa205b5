//! The filter's behaviour for one HTTP request, written against the `Host` seam so it runs
//! natively in tests; `wasm` implements `Host` over proxy-wasm and only maps the verdict to
//! Envoy's actions (continue, pause, resume). A request whose policies read its body is decided
//! once the body has come (`body`); its response half is `response`'s.

mod admin;
mod body;
mod status;

pub use admin::Route;

use crate::config::{
    self, key_check, Api, ConfigError, Denial, GlobalService, HeaderStyle, OverridesSync, Plan,
    Protocol, Scope, TokenSide,
};
use crate::core::algorithm::Algorithm;
use crate::core::duration::NANOS_PER_SEC;
use crate::core::key::Source;
use crate::core::key::{HashSecret, Keying};
use crate::core::request::{Attr, Attributes, RequestSource};
use crate::core::time::WorkerClock;
use crate::core::top_keys::{log_fields, rank, shown_text, By, Window, MAX_SHOWN_BYTES};
use crate::host::{Environment, Host};
use crate::limiter::tab::{Entry, Held, Op, Tab};
use crate::limiter::{slot_name, Applied, Basis, Limiter, Outcome, Pending, Settled, Step};
use crate::output::access_log;
use crate::output::headers::{
    each_anthropic_side_header, each_provider_header, each_rate_limit_header, retry_after_secs,
    Quota, QuotaUnit,
};
use crate::output::metrics::{Counters, Metrics, SlotEnd};
use crate::output::reply::{self, LocalReply, Refusal, Refused, Said};
use crate::remote::breaker::Breaker;
use crate::remote::overrides::{Answer, Failure as PullFailure, Poller, Scope as PullScope};
use crate::response::{Books, Debtor, Debtors};
use crate::state::ledger::Ledger;
use crate::state::overrides::View;
use crate::state::store::{Store, ABSENT};
use crate::state::table;
use crate::state::top::Top;
use crate::wire::protocol::{self, SettleOp, Settlement};
use crate::wire::rls;
use smallvec::SmallVec;
use std::cell::{Cell, RefCell};

/// The spacing of the log lines that would otherwise repeat with every request.
const MINUTE: u64 = 60 * NANOS_PER_SEC;
/// The gRPC status of a call that succeeded.
pub const GRPC_OK: u32 = 0;

/// What to do with a request.
#[derive(Debug)]
pub enum Verdict {
    /// Forward it.
    Continue(Admitted),
    /// A local reply has been sent: a refusal (429, or 503 for a policy that fails closed), or
    /// the status path's answer.
    Denied,
    /// Hold it until the service answers.
    Waiting(Pending),
    /// Forward it after `delay` nanoseconds (a leaky bucket's turn).
    Hold { delay: u64, admitted: Admitted },
}

/// What an admitted request takes with it.
#[derive(Debug, Default)]
pub struct Admitted {
    /// The policy whose rate-limit headers the response gets, if any.
    pub reported: Option<Reported>,
    /// What the request owes its policies when it ends (`tab`), if anything: the glue keeps it
    /// and hands it to `response::Response`.
    pub tab: Option<Tab>,
    /// What the admission put in the access log, which the request's end completes.
    pub record: Option<String>,
}

/// The policy whose state the response headers report, as decided at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reported {
    applied: Applied,
    now: u64,
    /// The next enforcing policies with the fewest left, that the draft fields list after
    /// `applied` (`header_policies` above 1).
    also: SmallVec<[Applied; 2]>,
    /// For a provider's headers (`api`): the enforcing policies with the fewest left among
    /// those that count requests over time and those that count tokens.
    requests: Option<Applied>,
    tokens: Option<Applied>,
    /// For Anthropic's: among the token budgets that count input tokens alone, and output.
    input_tokens: Option<Applied>,
    output_tokens: Option<Applied>,
}

/// The configured filter, shared read-only by every request of one worker.
#[derive(Debug)]
pub struct Filter {
    plan: Plan,
    keying: Keying,
    prefix: String,
    counters: Counters,
    breaker: Breaker,
    /// This worker's leases on local buckets.
    ledger: RefCell<Ledger>,
    clock: WorkerClock,
    /// When a degraded decision was last logged: at most one line a second.
    last_degraded_log: Cell<u64>,
    /// When ignored route metadata was last logged: at most one line a minute.
    last_route_metadata_log: Cell<u64>,
    /// Per bypass entry: when its use was last logged (at most once a minute), and whether its
    /// expiry has been.
    bypass_logged: Vec<(Cell<u64>, Cell<bool>)>,
    /// The last name this worker gave a slot it asks the service for, or a settlement it sends
    /// (`settlement_id`): counting up from a random start, so that no two workers' names meet.
    last_id: Cell<u64>,
    /// The keys of local metered policies this worker put in debt (`sluice_keys_in_debt`).
    debtors: RefCell<Debtors>,
    /// This worker's copy of the overrides' index, and its side of their pulls
    /// (`global.overrides`).
    overrides: RefCell<View>,
    poller: RefCell<Poller>,
    /// This worker's first tick: the overrides' age counts from it until the first pull.
    first_tick: Cell<u64>,
    /// When a failed pull was last logged: at most one line a minute.
    last_overrides_log: Cell<u64>,
    /// Where `Attr::Path` is among the plan's attributes, if a policy reads it.
    path_attr: Option<usize>,
    /// This worker's top keys of local policies (`state::top`): kept while the admin path is on.
    top: Option<RefCell<Top>>,
    /// By attribute index: whether `admin.top_show` lets its value show among the top keys.
    top_show: Vec<bool>,
    /// When the minute's `top refused keys` record was last written (seconds).
    last_top_log: Cell<u64>,
}

/// Keys the minute's `top refused keys` record names, as the service's.
const LOGGED_KEYS: usize = 5;

/// A pull of the overrides for the glue to send: `GET path` on the service's cluster, with the
/// service's token and `if-none-match`.
#[derive(Debug)]
pub struct OverridesCall<'a> {
    pub service: &'a GlobalService,
    pub path: &'a str,
    pub if_none_match: Option<String>,
}

impl Filter {
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// This worker's clock: the host's, never going back.
    pub fn now(&self, host: &impl Host) -> u64 {
        self.clock.now(host.now())
    }

    /// Parses the configuration, creates the shared-data slots and the counters.
    /// `plugin` namespaces the shared data, which Envoy shares per VM id.
    pub fn configure(
        json: &[u8],
        plugin: &str,
        store: &impl Store,
        metrics: &impl Metrics,
        env: &impl Environment,
    ) -> Result<Filter, ConfigError> {
        let plan = config::parse_with_env(json, &|name| env.var(name))?;
        let keying = match plan.hash_secret {
            Some(secret) => Keying {
                slots: secret,
                shared: secret,
            },
            None => Keying {
                slots: own_secret(store, env, plugin)?,
                shared: HashSecret::PUBLIC,
            },
        };
        let prefix = table::prefix(plugin);
        let counters = Counters::define(metrics, &plan);
        let bypass_logged = plan.bypass.iter().map(|_| Default::default()).collect();
        let start = env.random().map_or(0, |bytes| {
            u64::from_le_bytes(bytes.first_chunk().copied().unwrap_or_default())
        });
        let me = env.random().map_or(start ^ 1, |bytes| {
            u64::from_le_bytes(bytes.first_chunk().copied().unwrap_or_default())
        });
        let path_attr = (plan.attrs.iter()).position(|a| *a == crate::core::request::Attr::Path);
        let local = plan
            .policies
            .iter()
            .map(|p| (p.name.as_str(), p.scope == Scope::Local));
        let top = (plan.admin.as_ref())
            .and_then(|_| Top::new(local, me))
            .map(RefCell::new);
        let shown = plan
            .admin
            .as_ref()
            .map(|a| a.top_show.as_slice())
            .unwrap_or_default();
        let top_show = plan.attrs.iter().map(|attr| shown.contains(attr)).collect();
        Ok(Filter {
            top,
            top_show,
            last_top_log: Cell::new(0),
            path_attr,
            overrides: RefCell::default(),
            poller: RefCell::new(Poller::new(me)),
            first_tick: Cell::new(0),
            last_overrides_log: Cell::new(0),
            last_id: Cell::new(start),
            debtors: RefCell::default(),
            bypass_logged,
            plan,
            keying,
            prefix,
            counters,
            breaker: Breaker::default(),
            ledger: RefCell::default(),
            clock: WorkerClock::default(),
            last_degraded_log: Cell::new(0),
            last_route_metadata_log: Cell::new(0),
        })
    }

    /// Decides a request from its headers; sends a denial itself, and the answer to a request
    /// for the status path (`status`).
    pub fn on_request_headers(&self, host: &impl Host) -> Verdict {
        self.on_routed_headers(host, self.route(host))
    }

    /// `on_request_headers` for a request already routed (`route`): an admin call is answered
    /// with no body (the glue hands a call with one to `answer_admin` once it has come).
    pub fn on_routed_headers<H: Host>(&self, host: &H, route: Route) -> Verdict {
        match route {
            Route::Status => self.answer_status(host),
            Route::Admin => self.answer_admin(host, &[]),
            Route::Ordinary(path) => self.decide(host, self.attributes(host, path)),
        }
    }

    /// Decides a request from its attributes, the request body's start among them when the
    /// decision waited for it (`body`).
    fn decide<H: Host>(&self, host: &H, mut request: Attributes<'_, H>) -> Verdict {
        let now = self.now(host);
        let service_up = self.breaker.allows(now);
        let step = self.limiter(host, |l| l.evaluate(&mut request, now, service_up));
        if let Step::Done(outcome) = &step {
            self.record_top(outcome, now, &mut |policy| self.shown(policy, &mut request));
        }
        self.proceed(host, step, now)
    }

    /// Continues a held request with the service's reply: its status (HTTP for sluice-service,
    /// gRPC for an RLS) and body, or `None` when the call failed (timeout, reset, no healthy
    /// endpoint).
    pub fn on_service_response(
        &self,
        host: &impl Host,
        pending: Pending,
        reply: Option<(u32, Vec<u8>)>,
    ) -> Verdict {
        let protocol = self.plan.global.as_ref().map(|s| &s.protocol);
        let answers = match (protocol, reply) {
            (Some(Protocol::Sluice { .. }), Some((200, body))) => {
                protocol::decode(&body, pending.checks())
            }
            (Some(Protocol::Rls { .. }), Some((GRPC_OK, body))) => {
                rls::decode(&body, pending.checks())
            }
            _ => None,
        };
        let now = self.now(host);
        self.record_call(answers.is_some(), now);
        let step = self.limiter(host, |l| l.resume(pending, answers));
        if let Step::Done(outcome) = &step {
            self.record_top(outcome, now, &mut |_| None);
        }
        self.proceed(host, step, now)
    }

    /// Calls `emit` with each rate-limit header to add to the response.
    pub fn each_response_header(&self, reported: &Reported, emit: impl FnMut(&'static str, &str)) {
        let mut emit = emit;
        let api = |a: &Applied| self.plan.policies.get(a.policy).map(|p| p.denial.api);
        let provider = [reported.tokens, reported.requests, Some(reported.applied)]
            .iter()
            .flatten()
            .find_map(|a| api(a).filter(|api| *api != Api::Generic));
        let style = match (self.plan.headers, provider) {
            (Some(style), _) => style,
            (None, Some(_)) => HeaderStyle::None,
            (None, None) => HeaderStyle::Legacy,
        };
        let quota = (style != HeaderStyle::None).then(|| self.quota(&reported.applied));
        if let Some(quota) = quota.flatten() {
            let also: SmallVec<[Quota; 2]> =
                reported.also.iter().filter_map(|a| self.quota(a)).collect();
            each_rate_limit_header(style, &quota, &also, reported.now, &mut emit);
        }
        if let Some(api) = provider {
            let requests = reported.requests.and_then(|a| self.quota(&a));
            let tokens = reported.tokens.and_then(|a| self.quota(&a));
            each_provider_header(
                api,
                requests.as_ref(),
                tokens.as_ref(),
                reported.now,
                &mut emit,
            );
            if api == Api::Anthropic {
                let input = reported.input_tokens.and_then(|a| self.quota(&a));
                let output = reported.output_tokens.and_then(|a| self.quota(&a));
                each_anthropic_side_header(input.as_ref(), output.as_ref(), reported.now, emit);
            }
        }
    }

    /// Hands the counts gathered since the last flush to the host.
    pub fn flush_counters(&self, metrics: &impl Metrics) {
        self.counters.flush(metrics);
    }

    /// Looks whether the keys in debt this worker follows still owe (a shared-data read each):
    /// those paid back leave `sluice_keys_in_debt`.
    pub fn review_debts(&self, host: &impl Host) {
        let Ok(mut debtors) = self.debtors.try_borrow_mut() else {
            return;
        };
        if debtors.is_empty() {
            return;
        }
        let now = self.now(host);
        let repaid = self.limiter(host, |limiter| {
            debtors.review(|d| limiter.owes(d.policy, d.hash, &d.tier, now))
        });
        for policy in repaid {
            self.counters.keys_in_debt(policy, -1);
        }
    }

    /// Stops following keys in debt: this configuration is being replaced.
    pub fn forget_debts(&self) {
        let forgotten = self.debtors.try_borrow_mut().map(|mut d| d.forget());
        for policy in forgotten.unwrap_or_default() {
            self.counters.keys_in_debt(policy, -1);
        }
    }

    /// Runs `step` with a limiter over this worker's loans and the host's shared data.
    fn limiter<H: Host, T>(&self, host: &H, step: impl FnOnce(&mut Limiter<H>) -> T) -> T {
        // Only while overrides are pulled, and some policy has any.
        let overrides = (self.plan.global.as_ref())
            .filter(|g| g.overrides.is_some())
            .and_then(|_| self.overrides.try_borrow().ok())
            .filter(|view| view.count > 0);
        let run = |ledger: &mut Ledger| {
            step(&mut Limiter {
                plan: &self.plan,
                keying: &self.keying,
                prefix: &self.prefix,
                store: host,
                ledger,
                overrides: overrides.as_deref(),
            })
        };
        match self.ledger.try_borrow_mut() {
            Ok(mut ledger) => run(&mut ledger),
            // Unreachable (a worker runs one callback at a time); lending nothing is safe.
            Err(_) => run(&mut Ledger::default()),
        }
    }

    /// The policies overrides apply to here, by position: the local ones (the service applies
    /// them to global ones).
    fn overridable(&self) -> Vec<Option<&str>> {
        (self.plan.policies.iter())
            .map(|p| (p.scope == Scope::Local).then_some(p.name.as_str()))
            .collect()
    }

    /// At each tick of the worker's timer, while overrides are pulled: reads the index again if
    /// it changed, sets the overrides' gauges, and returns the pull to send when this worker
    /// pulls and one is due.
    pub fn overrides_tick(
        &self,
        host: &impl Host,
        metrics: &impl Metrics,
    ) -> Option<OverridesCall<'_>> {
        let service = self.plan.global.as_ref()?;
        let sync = service.overrides.as_ref()?;
        let now = self.now(host);
        if self.first_tick.get() == 0 {
            self.first_tick.set(now);
        }
        let names = self.overridable();
        if let Ok(mut view) = self.overrides.try_borrow_mut() {
            view.refresh(host, &self.prefix, &names);
            let pulled = view.pulled_ms.map(|ms| ms.saturating_mul(1_000_000));
            let age = now.saturating_sub(pulled.unwrap_or(self.first_tick.get()));
            self.counters
                .overrides_held(metrics, age / NANOS_PER_SEC, view.count);
        }
        let local: Vec<&str> = names.into_iter().flatten().collect();
        let scope = self.pull_scope(sync, &local);
        let pull = self.poller.try_borrow_mut().ok()?.tick(host, &scope, now)?;
        Some(OverridesCall {
            service,
            path: &sync.path,
            if_none_match: pull.if_none_match,
        })
    }

    fn pull_scope<'a>(&'a self, sync: &OverridesSync, local: &'a [&'a str]) -> PullScope<'a> {
        PullScope {
            prefix: &self.prefix,
            local,
            max: sync.max,
            every: sync.every,
        }
    }

    /// The largest listing of overrides read (`overrides::body_limit`).
    pub fn overrides_body_limit(&self) -> usize {
        let sync = self.plan.global.as_ref().and_then(|g| g.overrides.as_ref());
        crate::remote::overrides::body_limit(sync.map_or(0, |s| s.max))
    }

    /// The pull `overrides_tick` asked for could not be sent: another worker will try.
    pub fn overrides_not_sent(&self, host: &impl Host) {
        let Some(sync) = self.plan.global.as_ref().and_then(|g| g.overrides.as_ref()) else {
            return;
        };
        let names = self.overridable();
        let local: Vec<&str> = names.into_iter().flatten().collect();
        if let Ok(mut poller) = self.poller.try_borrow_mut() {
            poller.not_sent(host, &self.pull_scope(sync, &local));
        }
        self.overrides_failed(host, &PullFailure::Unanswered(None));
    }

    /// The service answered a pull (or did not): what it listed is written to shared data, or
    /// the overrides held stay in force, the failure counted and logged.
    pub fn overrides_answered(&self, host: &impl Host, answer: Answer) {
        let Some(sync) = self.plan.global.as_ref().and_then(|g| g.overrides.as_ref()) else {
            return;
        };
        let now = self.now(host);
        let names = self.overridable();
        let local: Vec<&str> = names.iter().flatten().copied().collect();
        let scope = self.pull_scope(sync, &local);
        let Ok(mut poller) = self.poller.try_borrow_mut() else {
            return;
        };
        match poller.answered(host, &scope, answer, now) {
            Ok(index) => {
                log::debug!(
                    "overrides pulled: version {}, {} held",
                    index.version,
                    index.count
                );
                if let Ok(mut view) = self.overrides.try_borrow_mut() {
                    view.refresh(host, &self.prefix, &names);
                }
            }
            Err(failure) => self.overrides_failed(host, &failure),
        }
    }

    fn overrides_failed(&self, host: &impl Host, failure: &PullFailure) {
        self.counters.overrides_pull_failed();
        let now = self.now(host);
        let last = self.last_overrides_log.get();
        if last == 0 || now >= last.saturating_add(MINUTE) {
            self.last_overrides_log.set(now);
            log::warn!("overrides not pulled, those pulled before stay in force: {failure}");
        }
    }

    /// A name no other of this worker's slots or settlements has, nor, from its random start,
    /// another worker's.
    fn next_id(&self) -> u64 {
        let id = self.last_id.get().wrapping_add(1);
        self.last_id.set(id);
        id
    }

    /// What Envoy does next: wait for the service's answer to the step's checks, or finish.
    fn proceed(&self, host: &impl Host, mut step: Step, now: u64) -> Verdict {
        let mut waited = false;
        loop {
            match step {
                Step::Done(outcome) => {
                    // A request decided without the service was recorded as it was decided,
                    // with its key's text; one that waited is recorded here, by hash only.
                    if waited {
                        self.record_top(&outcome, now, &mut |_| None);
                    }
                    return self.finish(host, &outcome, now);
                }
                Step::Callout(mut pending) => {
                    self.counters.callouts.add(1);
                    pending.name_slots(|| self.next_id());
                    let dispatched = self.plan.global.as_ref().is_some_and(|service| {
                        let body = match &service.protocol {
                            Protocol::Sluice { .. } => protocol::encode(pending.checks()),
                            Protocol::Rls { domain, .. } => rls::encode(domain, pending.checks()),
                        };
                        host.dispatch(service, &body)
                    });
                    if dispatched {
                        return Verdict::Waiting(pending);
                    }
                    self.record_call(false, now);
                    waited = true;
                    step = self.limiter(host, |l| l.resume(pending, None));
                }
            }
        }
    }

    fn record_call(&self, succeeded: bool, now: u64) {
        self.breaker.record(succeeded, now);
        if !succeeded {
            self.counters.callout_failures.add(1);
        }
    }

    /// A request that waited for the service ended before its answer (reset, destroyed): the
    /// slots its checks may take are given back.
    pub fn abandon(&self, host: &impl Host, pending: Pending) {
        self.give_back(host, &pending.abandon());
    }

    /// Releases slots the service may hold for a request that keeps none of them, through the
    /// outbox. The service applies a release that comes before its check by refusing the check
    /// (a tombstone), so the order they arrive in does not matter.
    fn give_back(&self, host: &impl Host, unkept: &[Entry]) {
        for entry in unkept {
            let op = match entry.held {
                Held::Lease { id, .. } => SettleOp::Release {
                    slot: slot_name(id),
                },
                Held::Reserved { tokens, .. } => SettleOp::Refund {
                    tokens,
                    age_ms: 0,
                    id: Some(self.settlement_id()),
                },
                Held::Slot(_) => continue,
            };
            let settlement = self.settlement(entry, op);
            let settled = settlement.filter(|(s, _)| s.protocol.settle_path().is_some());
            if let Some((service, settlement)) = settled {
                host.report(service, settlement);
                if matches!(entry.held, Held::Lease { .. }) {
                    self.counters.slots_ended(entry.policy, SlotEnd::Unused, 1);
                }
            }
        }
    }

    fn finish(&self, host: &impl Host, outcome: &Outcome, now: u64) -> Verdict {
        self.give_back(host, &outcome.unkept);
        self.counters.count(&self.plan, outcome);
        self.log_degraded(outcome, now);
        self.log_bypass(outcome, now);
        self.log_route_metadata(outcome, now);
        let denial = outcome.refused_by();
        // Every enforcing policy that refused, for the record and the reply alike.
        let refusals = denial.map(|_| outcome.refusals()).unwrap_or_default();
        let record = access_log::record(&self.plan, outcome, denial.as_ref(), &refusals);
        if let Some(record) = &record {
            host.record(record);
        }
        match denial {
            Some(denial) => {
                self.deny(host, outcome, (&denial, &refusals), now);
                Verdict::Denied
            }
            None => {
                let reported = self
                    .most_restrictive(outcome)
                    .map(|applied| self.reported(outcome, applied, now));
                let admitted = Admitted {
                    reported,
                    tab: outcome.tab.clone(),
                    record,
                };
                match self.delay(outcome) {
                    0 => Verdict::Continue(admitted),
                    delay => Verdict::Hold { delay, admitted },
                }
            }
        }
    }

    /// Records each local policy's decision among this worker's top keys (with the admin path
    /// on): a refusal, or what an admission consumed.
    /// `shown` gives a policy's key's text (`shown`), asked only for a key new to a sketch.
    fn record_top(
        &self,
        outcome: &Outcome,
        now: u64,
        shown: &mut dyn FnMut(usize) -> Option<Box<str>>,
    ) {
        let Some(Ok(mut top)) = self.top.as_ref().map(RefCell::try_borrow_mut) else {
            return;
        };
        let now_s = now / NANOS_PER_SEC;
        for a in &outcome.applied {
            if let Some(key) = a.key {
                let allowed = a.decision.allowed && !outcome.exhausted;
                // A policy that let through a request another refused charged nothing.
                let consumed = if allowed && !outcome.is_denied() {
                    a.cost
                } else {
                    0
                };
                let decided = (!allowed, consumed);
                top.record(now_s, (a.policy, key), decided, || shown(a.policy));
            }
        }
    }

    /// How `policy`'s key of `request` shows among the top keys (`core::top_keys::shown_text`):
    /// each part as `name=value` when `admin.top_show` names its source, else `name=#`; `None`
    /// when `top_show` names nothing (every key is its hash alone). The values were read for
    /// the key's hash already: no hostcall.
    fn shown<R: RequestSource + ?Sized>(
        &self,
        policy: usize,
        request: &mut Attributes<R>,
    ) -> Option<Box<str>> {
        if !self.top_show.contains(&true) {
            return None;
        }
        let policy = self.plan.policies.get(policy)?;
        let table = self.plan.tables.get(policy.table)?;
        let mut parts: Vec<(String, Option<Vec<u8>>)> = Vec::with_capacity(table.key.len());
        for part in &table.key {
            let Some((position, value)) = part.resolve(request) else {
                continue;
            };
            // No more of a value than a text shows (a header may be kilobytes).
            let value = value.get(..MAX_SHOWN_BYTES).unwrap_or(value).to_vec();
            let (name, shown) = match part.alternatives.get(position) {
                Some(Source::Attr(index)) => (
                    self.plan
                        .attrs
                        .get(*index)
                        .map(Attr::name)
                        .unwrap_or_default(),
                    self.top_show.get(*index).copied().unwrap_or(false),
                ),
                _ => ("global".to_string(), false),
            };
            parts.push((name, shown.then_some(value)));
        }
        let parts = parts.iter().map(|(n, v)| (n.as_str(), v.as_deref()));
        Some(shown_text(parts).into())
    }

    /// Once a second: sets this worker's top keys in its slot of shared data for the admin
    /// path (`state::top`).
    pub fn publish_top(&self, host: &impl Host) {
        let Some(Ok(mut top)) = self.top.as_ref().map(RefCell::try_borrow_mut) else {
            return;
        };
        let now_s = self.now(host) / NANOS_PER_SEC;
        if top.publish(host, &self.prefix, now_s).is_err() {
            log::debug!("top keys not published this second");
        }
        // Once a minute, by the worker of the first slot: each local policy that refused
        // anything in the last minute, over every worker.
        let last = self.last_top_log.get();
        if !top.holds_first_slot() || (last != 0 && now_s < last.saturating_add(60)) {
            return;
        }
        self.last_top_log.set(now_s);
        let boards = crate::state::top::read(host, &self.prefix, now_s);
        for (index, id) in top.policies() {
            let ranking = rank(&boards, id, Window::Minute, By::Refused, LOGGED_KEYS);
            if ranking.totals.refused > 0 {
                log::info!(
                    "top refused keys: policy={} window=1m {}",
                    self.policy_name(index),
                    log_fields(&ranking)
                );
            }
        }
    }

    /// A new configuration of this worker takes the worker slot `old` held for its top keys.
    pub fn succeed(&self, old: &Filter) {
        let (Some(new), Some(old)) = (&self.top, &old.top) else {
            return;
        };
        if let (Ok(mut new), Ok(old)) = (new.try_borrow_mut(), old.try_borrow()) {
            new.adopt(&old);
        }
    }

    /// The longest wait an enforcing policy put on an admitted request.
    fn delay(&self, outcome: &Outcome) -> u64 {
        let enforcing = outcome.applied.iter().filter(|a| a.enforced);
        enforcing.map(|a| a.decision.delay).max().unwrap_or(0)
    }

    /// Whether some policy holds requests for their turn, so held ones need releasing.
    pub fn shapes_traffic(&self) -> bool {
        let holds =
            |p: &crate::config::Policy| p.limits().any(|t| t.algorithm.max_delay().is_some());
        self.plan.policies.iter().any(holds)
    }

    /// Whether some policy owes sluice-service settlements when its requests end (a global
    /// metered or concurrency policy), so the worker's outbox needs sending soon.
    pub fn settles(&self) -> bool {
        // Configuration refuses such policies with an RLS, which takes no settlements.
        let owes = |p: &config::Policy| {
            matches!(p.scope, config::Scope::Global(_)) && (p.metered.is_some() || p.holds_slots())
        };
        self.plan.policies.iter().any(owes)
    }

    fn log_degraded(&self, outcome: &Outcome, now: u64) {
        let degraded = outcome
            .applied
            .iter()
            .find(|a| matches!(a.basis, Basis::Emergency | Basis::Unavailable));
        if let Some(applied) = degraded {
            if now >= self.last_degraded_log.get().saturating_add(NANOS_PER_SEC) {
                self.last_degraded_log.set(now);
                let name = self.policy_name(applied.policy);
                log::warn!(
                    "rate-limit service unavailable: policy {name} decided {:?} (logged at most once a second)",
                    applied.basis
                );
            }
        }
    }

    /// A route whose `filter_metadata.sluice` sluice could not use (every policy applied to it):
    /// at most one warning a minute per worker.
    fn log_route_metadata(&self, outcome: &Outcome, now: u64) {
        let Some(why) = outcome.ignored_route_metadata else {
            return;
        };
        let last = self.last_route_metadata_log.get();
        if last == 0 || now >= last.saturating_add(MINUTE) {
            self.last_route_metadata_log.set(now);
            log::warn!(
                "route metadata filter_metadata.sluice ignored, every policy applies: {why} (logged at most once a minute)"
            );
        }
    }

    /// The audit trail of bypasses: each entry's use at most once a minute (per worker), and
    /// its expiry once.
    fn log_bypass(&self, outcome: &Outcome, now: u64) {
        for &i in &outcome.bypassed {
            let (Some(b), Some((last, _))) = (self.plan.bypass.get(i), self.bypass_logged.get(i))
            else {
                continue;
            };
            if last.get() == 0 || now >= last.get().saturating_add(MINUTE) {
                last.set(now);
                log::info!(
                    "bypass: policy {} not applied to key {:016x} for {} ({}), until {}",
                    self.policy_name(b.policy),
                    b.key,
                    b.owner,
                    b.reason,
                    b.expires / NANOS_PER_SEC
                );
            }
        }
        for &i in &outcome.expired_bypass {
            let (Some(b), Some((_, told))) = (self.plan.bypass.get(i), self.bypass_logged.get(i))
            else {
                continue;
            };
            if !told.replace(true) {
                log::info!(
                    "bypass of policy {} for key {:016x} ({}, {}) expired at {}: ignored",
                    self.policy_name(b.policy),
                    b.key,
                    b.owner,
                    b.reason,
                    b.expires / NANOS_PER_SEC
                );
            }
        }
    }

    /// Refuses the request as the client's protocol expects (gRPC or plain HTTP): a policy's
    /// `denial` with the rate-limit headers, or a 503 when a policy that fails closed could not
    /// ask the service.
    /// `refusals`: every enforcing policy that refused it, the longest wait first.
    fn deny(&self, host: &impl Host, outcome: &Outcome, refusal: (&Applied, &[Applied]), now: u64) {
        let (denial, refusals) = refusal;
        let policy = self.plan.policies.get(denial.policy);
        let name = policy.map_or("", |p| p.name.as_str());
        log::debug!(
            "denied by policy {name}, version {}, key {:016x}",
            self.plan.version,
            denial.key.unwrap_or_default()
        );
        let refusal = Refusal::of(denial);
        let grpc = host
            .header("content-type")
            .is_some_and(|value| reply::is_grpc(&value));
        // The policy is the plan's own; the default stands in for it all the same.
        let default;
        let answer = match policy {
            Some(p) => &p.denial,
            None => {
                default = Denial::default();
                &default
            }
        };
        let refused = self.refused(refusals, denial);
        let said = Said {
            retry_secs: wait_secs(denial),
            reserve: policy.and_then(|p| p.metered.as_ref()).map(|_| denial.cost),
            spend: policy
                .and_then(|p| p.metered.as_ref())
                .is_some_and(|m| m.source.pricing().is_some()),
            refused: &refused,
        };
        let mut reply = LocalReply::refusal(refusal, answer, name, said, grpc);
        if refusal == Refusal::RateLimited {
            let reported = self.reported(outcome, *denial, now);
            self.each_response_header(&reported, |name, value| reply.add_header(name, value));
        }
        host.send_response(&reply);
    }

    /// Every enforcing policy that refused the request when more than one did, `denial` first.
    fn refused(&self, refusals: &[Applied], denial: &Applied) -> SmallVec<[Refused<'_>; 2]> {
        if refusals.len() < 2 {
            return SmallVec::new();
        }
        let others = refusals.iter().filter(|a| a.policy != denial.policy);
        std::iter::once(denial)
            .chain(others)
            .filter_map(|a| {
                let policy = self.plan.policies.get(a.policy)?;
                Some(Refused {
                    policy: &policy.name,
                    remaining: a.decision.remaining,
                    retry_secs: wait_secs(a),
                })
            })
            .collect()
    }

    /// What the response headers report: `applied` in the `headers` style, and for a provider's
    /// own headers the tightest enforcing policy of each unit (a spend budget counts neither
    /// requests nor tokens).
    fn reported(&self, outcome: &Outcome, applied: Applied, now: u64) -> Reported {
        let tightest = |tokens: bool| {
            outcome
                .applied
                .iter()
                .filter(|a| a.enforced && !matches!(a.tier.algorithm, Algorithm::Concurrency(_)))
                .filter(|a| {
                    let policy = self.plan.policies.get(a.policy);
                    let metered = policy.map(|p| p.metered.as_ref());
                    let spends = metered
                        .flatten()
                        .is_some_and(|m| m.source.pricing().is_some());
                    !spends && metered.map(|m| m.is_some()) == Some(tokens)
                })
                .min_by_key(|a| tightness(a))
                .copied()
        };
        let side = |wanted: TokenSide| {
            let counts = |a: &&Applied| {
                let policy = self.plan.policies.get(a.policy);
                policy.and_then(config::Policy::token_side) == Some(wanted)
            };
            let enforced = outcome.applied.iter().filter(|a| a.enforced);
            let counting = enforced.filter(counts);
            counting.min_by_key(|a| tightness(a)).copied()
        };
        let mut also: SmallVec<[Applied; 2]> = SmallVec::new();
        if self.plan.header_policies > 1 {
            let others = outcome
                .applied
                .iter()
                .filter(|a| a.enforced && **a != applied);
            also.extend(others.copied());
            also.sort_by_key(tightness);
            also.truncate(self.plan.header_policies - 1);
        }
        Reported {
            applied,
            now,
            also,
            requests: tightest(false),
            tokens: tightest(true),
            input_tokens: side(TokenSide::Input),
            output_tokens: side(TokenSide::Output),
        }
    }

    /// The enforcing policy with the fewest tokens left: the limit the client meets first.
    fn most_restrictive(&self, outcome: &Outcome) -> Option<Applied> {
        outcome
            .applied
            .iter()
            .filter(|a| a.enforced)
            .min_by_key(|a| tightness(a))
            .copied()
    }

    fn policy_name(&self, policy: usize) -> &str {
        self.plan
            .policies
            .get(policy)
            .map_or("", |p| p.name.as_str())
    }

    fn quota(&self, applied: &Applied) -> Option<Quota<'_>> {
        let policy = self.plan.policies.get(applied.policy)?;
        let decision = &applied.decision;
        Some(Quota {
            policy: &policy.name,
            limit: applied.tier.algorithm.capacity(),
            requests: applied.tier.requests,
            per_nanos: applied.tier.per_nanos,
            remaining: decision.remaining,
            reset_after: decision.reset_after,
            retry_after: (!decision.allowed && decision.retry_after > 0)
                .then_some(decision.retry_after),
            unit: match applied.tier.algorithm {
                Algorithm::Concurrency(_) => QuotaUnit::ConcurrentRequests,
                _ if policy
                    .metered
                    .as_ref()
                    .is_some_and(|m| m.source.pricing().is_some()) =>
                {
                    QuotaUnit::MicroUnits
                }
                _ if policy.metered.is_some() => QuotaUnit::Tokens,
                _ => QuotaUnit::Requests,
            },
        })
    }
}

impl Books for Filter {
    fn plan(&self) -> &Plan {
        Filter::plan(self)
    }

    fn settle(&self, host: &impl Host, entry: &mut Entry, op: Op) -> Settled {
        let now = self.now(host);
        self.limiter(host, |l| l.settle(entry, op, now))
    }

    fn counters(&self) -> &Counters {
        Filter::counters(self)
    }

    fn settlement(&self, entry: &Entry, op: SettleOp) -> Option<(&GlobalService, Settlement)> {
        let service = self.plan.global.as_ref()?;
        let policy = self.plan.policies.get(entry.policy)?;
        let check = key_check(policy, &entry.tier, entry.key.unwrap_or(entry.hash));
        let settlement = Settlement {
            key: check.key,
            algorithm: check.algorithm,
            requests: check.requests,
            per_ms: check.per_ms,
            burst: check.burst,
            calendar: check.calendar,
            op,
        };
        Some((service, settlement))
    }

    fn entered_debt(&self, entry: &Entry) {
        let debtor = Debtor {
            policy: entry.policy,
            hash: entry.hash,
            tier: entry.tier,
        };
        let entered = self
            .debtors
            .try_borrow_mut()
            .is_ok_and(|mut d| d.enter(debtor));
        if entered {
            self.counters.keys_in_debt(entry.policy, 1);
        }
    }

    fn settlement_id(&self) -> String {
        slot_name(self.next_id())
    }

    fn now(&self, host: &impl Host) -> u64 {
        Filter::now(self, host)
    }
}

/// This Envoy's own secret for slot hashes, when the operator gives none: random, made by the
/// first VM configured and kept in shared data, where every worker's VM finds it (created at
/// `ABSENT`, so that of two VMs configured at once, one keeps the other's). It outlives
/// configuration changes, as the tables do.
fn own_secret(
    store: &impl Store,
    env: &impl Environment,
    plugin: &str,
) -> Result<HashSecret, ConfigError> {
    let name = format!("sluice/{plugin}/hash-secret");
    let stored = || {
        let (bytes, cas) = store.get(&name)?;
        Some((
            <[u8; 16]>::try_from(bytes.as_slice())
                .ok()
                .map(HashSecret::from_bytes),
            cas,
        ))
    };
    let cas = match stored() {
        Some((Some(secret), _)) => return Ok(secret),
        Some((None, cas)) => cas,
        None => ABSENT,
    };
    let fresh = env
        .random()
        .map(HashSecret::from_bytes)
        .ok_or_else(|| ConfigError {
            field: "hash_secret_env".into(),
            reason: "not given, and the host gave no random bytes for a secret of this Envoy's own"
                .into(),
        })?;
    let _ = store.set(&name, &fresh.to_bytes(), cas);
    let secret = stored().and_then(|(secret, _)| secret).unwrap_or(fresh);
    if secret == fresh {
        log::warn!(
            "no hash_secret_env: slots are keyed with a random secret of this Envoy's own, but global keys, bypass key_hash entries and log lines use the public key, under which anyone can hash keys (see docs/configuration.md#key-hashing)"
        );
    }
    Ok(secret)
}

/// What orders policies by how close to their limit they are: the fewest left, then the
/// longest until full again.
fn tightness(applied: &Applied) -> (u64, std::cmp::Reverse<u64>) {
    let decision = &applied.decision;
    (decision.remaining, std::cmp::Reverse(decision.reset_after))
}

/// A refusal's wait in whole seconds; `None` for a wait of 0: nobody can say when (a
/// concurrency policy that sets no `retry_after`).
fn wait_secs(refusal: &Applied) -> Option<u64> {
    let retry = refusal.decision.retry_after;
    (retry > 0).then(|| retry_after_secs(retry))
}

#[cfg(test)]
mod tests;
