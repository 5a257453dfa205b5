//! Turns the configuration as written (`input`) into the `Plan` requests read: validates every
//! field, interns the request attributes, and places each policy's state in a shared-data
//! table.

use super::answer::Denial;
use super::input::{
    RawBypass, RawCalendar, RawConfig, RawCost, RawDenial, RawFailureMode, RawFromResponse,
    RawGlobal, RawLease, RawMatch, RawMetered, RawMissingKey, RawMode, RawOverrides, RawPolicy,
    RawProtocol, RawReserveFromRequest, RawScope, RawTiers, DEFAULT_CHECK_PATH,
};
use super::plan::{
    Bypass, GlobalService, Metered, OnFailure, OnUnknown, OverridesSync, Plan, Policy, Protocol,
    Reserve, Rollout, Scope, Secret, Tier, Tiers, UsageSource,
};
use super::{error, ConfigError, Env};
use crate::core::algorithm::{Algorithm, Drain, Invalid, Kind, Param, Rate, Slots, Window};
use crate::core::duration::{parse_nanos, NANOS_PER_SEC};
use crate::core::key::{hash_values, parse_part, HashSecret, KeyPart, Source};
use crate::core::matcher::{HeaderRule, Matcher, PathRule};
use crate::core::request::{Attr, BodyField};
use crate::state::table::{TableSpec, MAX_WIDTH};
use siphasher::sip::SipHasher13;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::ops::Range;

/// The most distinct keys a policy may track.
pub const MAX_MAX_KEYS: u32 = 10_000_000;
/// A sliding log keeps one timestamp per request of its limit, in every key's slot.
pub const MAX_SLIDING_LOG: u64 = 1_000;
/// The most requests of one key a global concurrency policy may allow in flight: sluice-service
/// keeps a key's slots as a sorted set of at most that many.
pub const MAX_GLOBAL_SLOTS: u64 = 10_000;
/// A concurrency policy's `lease` when it does not say: a minute. A slot lost with a crashed
/// Envoy, or whose release never reached the service, holds a place for at most that long (five
/// minutes until issue 31: a key of two slots locked out for five minutes by two lost
/// releases), and sluice-service shows it unrenewed for its last 25 s. The price is a renewal
/// per request in flight every 30 s instead of every 150 s: for 1,000 streams in flight, 33
/// settlements a second across the fleet (batched, one Lua call each) instead of 7. A
/// renewal still has 30 s to arrive before the slot lapses, as long as the outbox retries.
pub const DEFAULT_SLOT_LEASE: &str = "1m";

/// Validates and compiles a configuration; `env` reads the environment variables it names.
pub(super) fn compile(raw: RawConfig, env: Env) -> Result<Plan, ConfigError> {
    Compiler::default().compile(raw, env)
}

/// The operator's hash secret, from the environment variable `hash_secret_env` names, at least
/// `HashSecret::MIN_TEXT_BYTES` long. Its value is never shown: errors give its length.
fn hash_secret(name: Option<&str>, env: Env) -> Result<Option<HashSecret>, ConfigError> {
    const FIELD: &str = "hash_secret_env";
    let Some(name) = name else {
        return Ok(None);
    };
    let first_ok = |b: &u8| b.is_ascii_alphabetic() || *b == b'_';
    let valid = name.as_bytes().first().is_some_and(first_ok)
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid {
        return Err(error(
            FIELD,
            "must name an environment variable (letters, digits and '_', not starting with a digit)",
        ));
    }
    let text = secret(FIELD, name, env)?;
    let length = text.expose().len();
    if length < HashSecret::MIN_TEXT_BYTES {
        return Err(error(
            FIELD,
            format!(
                "{name} holds {length} bytes: a secret needs at least {} (e.g. `openssl rand -hex 32`)",
                HashSecret::MIN_TEXT_BYTES
            ),
        ));
    }
    Ok(Some(HashSecret::from_text(text.expose().as_bytes())))
}

#[derive(Default)]
struct Compiler {
    attrs: Vec<Attr>,
    tables: Vec<TableDraft>,
    /// The top-level `denial`: what a policy's own falls back to.
    denial: Denial,
}

/// A table while policies are still being placed in it.
struct TableDraft {
    key: Vec<KeyPart>,
    /// A concurrency policy's table, which it shares with no other: its layout, and so the
    /// slots in use it holds, outlive a reload that changes other policies of the key.
    own: bool,
    /// Each policy's name and number of columns, in column order.
    members: Vec<(String, usize)>,
    capacity: u32,
}

impl Compiler {
    fn compile(mut self, raw: RawConfig, env: Env) -> Result<Plan, ConfigError> {
        let hash_secret = hash_secret(raw.hash_secret_env.as_deref(), env)?;
        if raw.policies.is_empty() && raw.default.is_none() {
            return Err(error(
                "policies",
                "at least one policy (or a default) is required",
            ));
        }
        let global = raw.global.as_ref().map(|g| service(g, env)).transpose()?;
        self.denial = denial("denial", raw.denial.as_ref(), &self.denial)?;
        self.denial.api = raw.api.unwrap_or_default();
        let mut policies = Vec::with_capacity(raw.policies.len() + 1);
        for (i, policy) in raw.policies.iter().enumerate() {
            let at = format!("policies[{i}]");
            policies.push(self.policy(&at, policy, false, global.as_ref())?);
        }
        if let Some(default) = &raw.default {
            if default.matcher.is_some() {
                return Err(error(
                    "default.match",
                    "the default policy applies when no policy matches, so it takes no match",
                ));
            }
            policies.push(self.policy("default", default, true, global.as_ref())?);
        }
        let mut names = std::collections::HashSet::new();
        for (i, policy) in policies.iter().enumerate() {
            if !names.insert(policy.name.as_str()) {
                let field = if policy.fallback {
                    "default.name".into()
                } else {
                    format!("policies[{i}].name")
                };
                return Err(error(
                    field,
                    format!("duplicate policy name {:?}", policy.name),
                ));
            }
        }
        let shared = hash_secret.unwrap_or(HashSecret::PUBLIC);
        let bypass = raw
            .bypass
            .iter()
            .enumerate()
            .map(|(i, entry)| {
                bypass(
                    &format!("bypass[{i}]"),
                    entry,
                    &policies,
                    &self.tables,
                    &shared,
                )
            })
            .collect::<Result<Vec<_>, _>>()?
            .concat();
        let status_path = raw.status_path.as_deref().map(status_path).transpose()?;
        let admin = (raw.admin.as_ref())
            .map(|a| super::admin::admin(a, env))
            .transpose()?;
        let route_metadata = raw.route_metadata.then(|| self.intern(Attr::RouteMetadata));
        let attrs = self.attrs;
        let reads_body = attrs.iter().any(|a| matches!(a, Attr::Body(_)))
            || policies
                .iter()
                .flat_map(|p| &p.metered)
                .any(|m| m.ask_stream_usage);
        let tables = table_specs(self.tables, &attrs, &policies, &bypass);
        Ok(Plan {
            version: raw.version.unwrap_or_else(|| "unversioned".into()),
            headers: raw.headers,
            header_policies: header_policies(raw.header_policies)?,
            attrs,
            policies,
            tables,
            global,
            bypass,
            hash_secret,
            route_metadata,
            reads_body,
            status_path,
            admin,
        })
    }

    fn intern(&mut self, attr: Attr) -> usize {
        match self.attrs.iter().position(|a| *a == attr) {
            Some(index) => index,
            None => {
                self.attrs.push(attr);
                self.attrs.len() - 1
            }
        }
    }

    fn policy(
        &mut self,
        at: &str,
        raw: &RawPolicy,
        fallback: bool,
        service: Option<&GlobalService>,
    ) -> Result<Policy, ConfigError> {
        if !is_policy_name(&raw.name) {
            return Err(error(
                format!("{at}.name"),
                "must be 1-64 characters of A-Z, a-z, 0-9, '_', '-', '.'",
            ));
        }
        let mut metered = metered(at, raw)?;
        if let Some(Reserve::MaxOutputTokens { attr, .. }) =
            metered.as_mut().map(|m| &mut m.reserve)
        {
            *attr = self.intern(Attr::Body(BodyField::MaxOutputTokens));
        }
        if let Some(UsageSource::Priced { model, .. }) = metered.as_mut().map(|m| &mut m.source) {
            *model = self.intern(Attr::Body(BodyField::String("model".into())));
        }
        let shape = Shape::of(at, raw, metered.as_ref())?;
        let tier = shape.tier(at, raw.requests, raw.per.as_deref(), raw.burst)?;
        let tiers = match &raw.tiers {
            Some(t) => Some(self.tiers(&format!("{at}.tiers"), t, &shape)?),
            None => None,
        };
        let matcher = match &raw.matcher {
            Some(m) => self.matcher(&format!("{at}.match"), m)?,
            None => Matcher::default(),
        };
        let key = self.key(&format!("{at}.key"), &raw.key)?;
        if !(1..=MAX_MAX_KEYS).contains(&raw.max_keys) {
            return Err(error(
                format!("{at}.max_keys"),
                format!("must be between 1 and {MAX_MAX_KEYS}"),
            ));
        }
        let scope = scope(at, raw, &shape, service.is_some())?;
        if scope != Scope::Local {
            global_slots_fit(at, &tier, tiers.as_ref())?;
            if metered
                .as_ref()
                .is_some_and(|m| m.source.pricing().is_some())
            {
                global_spend_fits(at, &tier, tiers.as_ref())?;
            }
        }
        let mut denial = denial(&format!("{at}.denial"), raw.denial.as_ref(), &self.denial)?;
        if let Some(api) = raw.api {
            denial.api = api;
        }
        let mut policy = Policy {
            name: raw.name.clone(),
            matcher,
            fallback,
            shadow: raw.mode == RawMode::Shadow,
            rollout: rollout(at, raw)?,
            share_missing_key: raw.missing_key == RawMissingKey::Shared,
            cost: shape.cost,
            metered,
            take: 0,
            tier,
            tiers,
            scope,
            denial,
            retry_after: retry_after(at, raw)?,
            table: 0,
            words: 0..0,
        };
        let grants = service.is_some_and(|s| matches!(s.protocol, Protocol::Sluice { .. }));
        if policy.metered.is_some() && policy.asks_rls(service) {
            return Err(error(
                format!("{at}.cost"),
                "an RLS is charged a response's usage by Envoy's own ratelimit filter \
                 (apply_on_stream_done, hits_addend from the usage this filter writes: \
                 docs/token-budgets.md#local-global-or-envoys-own-filter): meter with a local policy",
            ));
        }
        if raw.algorithm == Kind::Concurrency && policy.asks_rls(service) {
            return Err(error(
                format!("{at}.scope"),
                "an RLS counts requests in flight through Envoy's own ratelimit filter \
                 (is_negative_hits on stream done, docs/rls.md#concurrency-limits): a global concurrency policy \
                 needs sluice-service",
            ));
        }
        if raw.calendar.is_some() && policy.asks_rls(service) {
            return Err(error(
                format!("{at}.calendar"),
                "an RLS counts per second, minute, hour or day of the Unix clock: a global \
                 calendar window needs sluice-service",
            ));
        }
        policy.take = take(at, raw, &policy, grants)?;
        if let Some(service) = service.filter(|_| grants && policy.scope != Scope::Local) {
            global_keys_live_within(at, &policy, service.max_key_ttl_ms)?;
        }
        // A concurrency policy's table is its own, and its layout names its lease: the epochs
        // its state counts in are half of it, so a reload that changes the lease starts afresh
        // rather than read those counts in epochs of another length.
        let (own, layout_name) = match policy.tier.algorithm {
            Algorithm::Concurrency(slots) => (true, format!("{}@{}", raw.name, slots.lease())),
            _ => (false, raw.name.clone()),
        };
        (policy.table, policy.words) =
            self.place(key, layout_name, policy.columns(), raw.max_keys, own);
        if policy.words.end > MAX_WIDTH {
            return Err(error(
                format!("{at}.key"),
                format!(
                    "the policies of this key keep {} words of state per key: at most {MAX_WIDTH}",
                    policy.words.end
                ),
            ));
        }
        Ok(policy)
    }

    fn key(&mut self, at: &str, parts: &[String]) -> Result<Vec<KeyPart>, ConfigError> {
        if parts.is_empty() {
            return Err(error(at, "must list at least one key part"));
        }
        parts
            .iter()
            .enumerate()
            .map(|(i, part)| {
                parse_part(part, &mut |a| self.intern(a))
                    .map_err(|r| error(format!("{at}[{i}]"), r))
            })
            .collect()
    }

    /// The table for this key (shared with earlier policies of the same key) and the policy's
    /// `columns` words in its slots.
    fn place(
        &mut self,
        key: Vec<KeyPart>,
        name: String,
        columns: usize,
        max_keys: u32,
        own: bool,
    ) -> (usize, Range<usize>) {
        let member = (name, columns);
        let shared = |t: &TableDraft| !own && !t.own && t.key == key;
        if let Some(index) = self.tables.iter().position(shared) {
            if let Some(table) = self.tables.get_mut(index) {
                let column: usize = table.members.iter().map(|(_, c)| c).sum();
                table.members.push(member);
                table.capacity = table.capacity.max(max_keys);
                return (index, column..column + columns);
            }
        }
        self.tables.push(TableDraft {
            key,
            own,
            members: vec![member],
            capacity: max_keys,
        });
        (self.tables.len() - 1, 0..columns)
    }

    fn tiers(&mut self, at: &str, raw: &RawTiers, shape: &Shape) -> Result<Tiers, ConfigError> {
        let by = parse_part(&raw.by, &mut |a| self.intern(a))
            .map_err(|r| error(format!("{at}.by"), r))?;
        let mut values = HashMap::new();
        for (value, rate) in &raw.values {
            let field = format!("{at}.values.{value}");
            values.insert(
                value.as_bytes().to_vec(),
                shape.tier(&field, rate.requests, rate.per.as_deref(), rate.burst)?,
            );
        }
        Ok(Tiers { by, values })
    }

    fn matcher(&mut self, at: &str, raw: &RawMatch) -> Result<Matcher, ConfigError> {
        let path = match (&raw.path_prefix, &raw.path_exact) {
            (Some(_), Some(_)) => {
                return Err(error(
                    format!("{at}.path_exact"),
                    "give path_prefix or path_exact, not both",
                ))
            }
            (Some(p), None) => Some(PathRule::Prefix(path(&format!("{at}.path_prefix"), p)?)),
            (None, Some(p)) => Some(PathRule::Exact(path(&format!("{at}.path_exact"), p)?)),
            (None, None) => None,
        };
        let path = path.map(|rule| (self.intern(Attr::Path), rule));
        let methods = match &raw.methods {
            Some(methods) => {
                if methods.is_empty() {
                    return Err(error(
                        format!("{at}.methods"),
                        "must not be empty (leave it out to match any method)",
                    ));
                }
                if let Some(bad) = methods
                    .iter()
                    .find(|m| m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()))
                {
                    return Err(error(
                        format!("{at}.methods"),
                        format!("{bad:?} is not an upper-case method name"),
                    ));
                }
                Some((self.intern(Attr::Method), methods.clone()))
            }
            None => None,
        };
        let routes = match &raw.routes {
            Some(routes) => Some((self.intern(Attr::Route), route_names(at, routes)?)),
            None => None,
        };
        let mut headers = Vec::with_capacity(raw.headers.len());
        for (i, condition) in raw.headers.iter().enumerate() {
            let field = format!("{at}.headers[{i}]");
            if !crate::core::key::is_header_name(&condition.name) {
                return Err(error(
                    format!("{field}.name"),
                    format!("{:?} is not a valid header name", condition.name),
                ));
            }
            let rule = match (condition.present, &condition.equals) {
                (Some(present), None) => HeaderRule::Present(present),
                (None, Some(value)) => HeaderRule::Equals(value.as_bytes().to_vec()),
                _ => return Err(error(field, "give exactly one of present or equals")),
            };
            headers.push((
                self.intern(Attr::Header(condition.name.to_ascii_lowercase())),
                rule,
            ));
        }
        Ok(Matcher {
            path,
            methods,
            headers,
            routes,
        })
    }
}

/// What a policy's limits are made of, whatever the tier: the algorithm, the cost of a
/// request, and (leaky bucket) the longest a request may be held. `at` is the policy's path:
/// where an error in `cost` or `max_delay` is reported.
struct Shape<'a> {
    at: String,
    kind: Kind,
    /// What a request takes at admission: the cost, or a metered policy's reservation.
    cost: u64,
    /// Where an error in `cost` is reported...
    cost_field: &'static str,
    /// ...and what every limit must hold of it: a reservation of 0 still needs a token left
    /// (`limiter`).
    must_hold: u64,
    max_delay: Option<u64>,
    /// Concurrency only: how long a slot lives unless renewed.
    slot_lease: Option<u64>,
    /// Fixed window only: the calendar its windows follow.
    calendar: Option<&'a RawCalendar>,
}

impl<'a> Shape<'a> {
    fn of(
        at: &str,
        raw: &'a RawPolicy,
        metered: Option<&Metered>,
    ) -> Result<Shape<'a>, ConfigError> {
        if raw.calendar.is_some() && raw.algorithm != Kind::FixedWindow {
            return Err(error(
                format!("{at}.calendar"),
                format!(
                    "calendar windows are fixed windows: does not apply to the {} algorithm",
                    raw.algorithm.name()
                ),
            ));
        }
        let max_delay = match (&raw.max_delay, raw.algorithm) {
            (Some(text), Kind::LeakyBucket) => {
                Some(parse_nanos(text).map_err(|r| error(format!("{at}.max_delay"), r))?)
            }
            (None, Kind::LeakyBucket) => {
                return Err(error(
                    format!("{at}.max_delay"),
                    "leaky_bucket needs the longest a request may be held",
                ))
            }
            (Some(_), kind) => return Err(not_for(&format!("{at}.max_delay"), kind)),
            (None, _) => None,
        };
        let slot_lease = match (&raw.lease, raw.algorithm) {
            (Some(RawLease::Duration(text)), Kind::Concurrency) => Some(text.as_str()),
            (None, Kind::Concurrency) => Some(DEFAULT_SLOT_LEASE),
            (Some(RawLease::Tokens(_)), Kind::Concurrency) => {
                return Err(error(
                    format!("{at}.lease"),
                    "a concurrency policy's lease is how long a slot lives unless renewed: a \
                     duration such as \"5m\"",
                ))
            }
            (Some(RawLease::Duration(_)), _) => {
                return Err(error(
                    format!("{at}.lease"),
                    "a number of tokens (a duration is a concurrency policy's lease)",
                ))
            }
            (_, _) => None,
        };
        let slot_lease = slot_lease
            .map(|text| parse_nanos(text).map_err(|r| error(format!("{at}.lease"), r)))
            .transpose()?;
        if raw.algorithm == Kind::Concurrency && raw.cost != RawCost::Tokens(1) {
            return Err(error(
                format!("{at}.cost"),
                "a request in flight takes one slot: a concurrency policy has no cost",
            ));
        }
        let (cost, cost_field, must_hold) = match (metered, &raw.cost) {
            (Some(metered), _) => {
                let reserve = metered.reserve.at_least();
                (reserve, "cost.reserve", reserve.max(1))
            }
            (None, RawCost::Tokens(cost)) => (*cost, "cost", *cost),
            (None, RawCost::Metered(_)) => (1, "cost", 1),
        };
        Ok(Shape {
            at: at.to_string(),
            kind: raw.algorithm,
            cost,
            cost_field,
            must_hold,
            max_delay,
            slot_lease,
            calendar: raw.calendar.as_ref(),
        })
    }

    /// `requests` per `per` (and `burst` where the algorithm has one) as a validated limit. A
    /// number out of bounds is reported on its field: under `at` (the policy, a tier or the
    /// emergency budget), or the policy's own `cost` and `max_delay`.
    fn tier(
        &self,
        at: &str,
        requests: u64,
        per: Option<&str>,
        burst: Option<u64>,
    ) -> Result<Tier, ConfigError> {
        let mut calendar = None;
        let per_nanos = match (per, self.slot_lease) {
            (Some(_), Some(_)) => return Err(not_for(&format!("{at}.per"), self.kind)),
            // A concurrency limit has no window: its slots' lease stands in for one.
            (None, Some(lease)) => lease,
            (Some(per), None) => match self.calendar {
                Some(raw) => {
                    let unit = super::calendar::unit(&format!("{at}.per"), per)?;
                    calendar = Some(super::calendar::calendar(
                        &self.at,
                        raw,
                        unit,
                        at == self.at,
                    )?);
                    unit.nominal_nanos()
                }
                None => {
                    parse_nanos(per).map_err(|r| error(format!("{at}.per"), per_error(per, r)))?
                }
            },
            (None, None) => return Err(error(at, "missing field `per`")),
        };
        if burst.is_some() && self.kind != Kind::TokenBucket {
            return Err(not_for(&format!("{at}.burst"), self.kind));
        }
        let refused = |invalid: Invalid| match invalid.param {
            Param::Cost => error(format!("{}.{}", self.at, self.cost_field), invalid.reason),
            Param::MaxDelay => error(format!("{}.max_delay", self.at), invalid.reason),
            param => error(format!("{at}.{}", param.field()), invalid.reason),
        };
        let algorithm = match calendar {
            Some(calendar) => Window::calendar(requests, calendar).map(Algorithm::FixedWindow),
            None => self.algorithm(requests, per_nanos, burst),
        }
        .map_err(refused)?;
        algorithm.check_cost(self.must_hold).map_err(refused)?;
        Ok(Tier {
            algorithm,
            requests,
            per_nanos,
        })
    }

    fn algorithm(&self, requests: u64, per: u64, burst: Option<u64>) -> Result<Algorithm, Invalid> {
        Ok(match self.kind {
            Kind::TokenBucket => {
                Algorithm::TokenBucket(Rate::new(requests, per, burst.unwrap_or(requests))?)
            }
            Kind::FixedWindow => Algorithm::FixedWindow(Window::new(requests, per)?),
            Kind::SlidingWindow => Algorithm::SlidingWindow(Window::new(requests, per)?),
            Kind::SlidingLog if requests > MAX_SLIDING_LOG => {
                return Err(Invalid {
                    param: Param::Requests,
                    reason: format!(
                        "sliding_log keeps a timestamp per request: at most {MAX_SLIDING_LOG}"
                    ),
                })
            }
            Kind::SlidingLog => Algorithm::SlidingLog(Window::new(requests, per)?),
            Kind::LeakyBucket => {
                let max_delay = self.max_delay.unwrap_or(0);
                Algorithm::LeakyBucket(Drain::new(requests, per, max_delay)?)
            }
            Kind::Concurrency => Algorithm::Concurrency(Slots::new(requests, per)?),
        })
    }
}

/// The tables as requests read them. A table's keys are known beyond this Envoy
/// (`TableSpec::shares_key`) when a global, bypassed or rolled-out policy is among its members:
/// every Envoy must agree on which keys a rollout enforces for.
fn table_specs(
    drafts: Vec<TableDraft>,
    attrs: &[Attr],
    policies: &[Policy],
    bypass: &[Bypass],
) -> Vec<TableSpec> {
    let named = |(i, p): (usize, &Policy)| {
        matches!(p.scope, Scope::Global(_))
            || p.rollout.is_some()
            || bypass.iter().any(|b| b.policy == i)
    };
    let shares_key = |table: usize| {
        let mut members = policies
            .iter()
            .enumerate()
            .filter(|(_, p)| p.table == table);
        members.any(named)
    };
    (drafts.into_iter().enumerate())
        .map(|(i, t)| {
            let width = t.members.iter().map(|(_, columns)| columns).sum();
            let ids = layout_ids(&t.key, &t.members, attrs);
            TableSpec::new(t.key, t.capacity, width, shares_key(i), ids)
        })
        .collect()
}

/// Why `per` is no duration: a calendar period without a calendar says what it lacks.
fn per_error(per: &str, reason: String) -> String {
    match crate::core::calendar::Unit::parse(per) {
        Some(_) => format!("{per:?} is a calendar period: it needs the policy's \"calendar\""),
        None => reason,
    }
}

fn not_for(field: &str, kind: Kind) -> ConfigError {
    error(
        field,
        format!("does not apply to the {} algorithm", kind.name()),
    )
}

fn service(raw: &RawGlobal, env: Env) -> Result<GlobalService, ConfigError> {
    if raw.cluster.is_empty() {
        return Err(error("global.cluster", "must name an Envoy cluster"));
    }
    let authority = raw.authority.clone().unwrap_or_else(|| raw.cluster.clone());
    if authority.is_empty() {
        return Err(error("global.authority", "must not be empty"));
    }
    let timeout = parse_nanos(&raw.timeout).map_err(|r| error("global.timeout", r))?;
    let protocol = match (raw.protocol, &raw.path, &raw.domain) {
        (RawProtocol::Sluice, _, Some(_)) => {
            return Err(error(
                "global.domain",
                "applies to \"protocol\": \"rls\" only",
            ))
        }
        (RawProtocol::Sluice, path, None) => Protocol::Sluice {
            path: self::path("global.path", path.as_deref().unwrap_or(DEFAULT_CHECK_PATH))?,
        },
        (RawProtocol::Rls, Some(_), _) => {
            return Err(error(
                "global.path",
                "the RLS protocol has one gRPC method, ShouldRateLimit: no path",
            ))
        }
        (RawProtocol::Rls, None, Some(domain)) if !domain.is_empty() => Protocol::Rls {
            domain: domain.clone(),
            grpc_service: crate::wire::rls::grpc_service(&raw.cluster, &authority),
        },
        (RawProtocol::Rls, None, _) => {
            return Err(error(
                "global.domain",
                "the RLS protocol needs the domain of its limits",
            ))
        }
    };
    Ok(GlobalService {
        cluster: raw.cluster.clone(),
        authority,
        timeout_ms: timeout.div_ceil(1_000_000),
        authorization: raw
            .token_env
            .as_deref()
            .map(|name| secret("global.token_env", name, env))
            .transpose()?
            .map(|token| Secret::new(format!("Bearer {}", token.expose()))),
        protocol,
        max_key_ttl_ms: match &raw.max_key_ttl {
            Some(ttl) => {
                let nanos = parse_nanos(ttl).map_err(|r| error("global.max_key_ttl", r))?;
                nanos
                    .div_ceil(1_000_000)
                    .max(crate::wire::protocol::SERVICE_MAX_KEY_TTL_MS)
            }
            None => crate::wire::protocol::SERVICE_MAX_KEY_TTL_MS,
        },
        overrides: raw
            .overrides
            .as_ref()
            .map(|o| overrides_sync(raw.protocol, o))
            .transpose()?,
    })
}

/// The overrides' default period and bound, and the bounds of both.
const OVERRIDES_EVERY: &str = "2s";
const MIN_OVERRIDES_EVERY: u64 = NANOS_PER_SEC;
const MAX_OVERRIDES_EVERY: u64 = 60 * NANOS_PER_SEC;
pub const DEFAULT_MAX_OVERRIDES: u64 = 10_000;
pub const MAX_MAX_OVERRIDES: u64 = 100_000;

fn overrides_sync(protocol: RawProtocol, raw: &RawOverrides) -> Result<OverridesSync, ConfigError> {
    if protocol != RawProtocol::Sluice {
        return Err(error(
            "global.overrides",
            "overrides are sluice-service's: not with \"protocol\": \"rls\"",
        ));
    }
    let every_text = raw.every.as_deref().unwrap_or(OVERRIDES_EVERY);
    let every = parse_nanos(every_text).map_err(|r| error("global.overrides.every", r))?;
    if !(MIN_OVERRIDES_EVERY..=MAX_OVERRIDES_EVERY).contains(&every) {
        return Err(error(
            "global.overrides.every",
            format!("must be between 1s and 60s, got {every_text:?}"),
        ));
    }
    let max = raw.max.unwrap_or(DEFAULT_MAX_OVERRIDES);
    if !(1..=MAX_MAX_OVERRIDES).contains(&max) {
        return Err(error(
            "global.overrides.max",
            format!("must be between 1 and {MAX_MAX_OVERRIDES}, got {max}"),
        ));
    }
    let listing = raw.path.as_deref().unwrap_or(crate::wire::overrides::PATH);
    Ok(OverridesSync {
        every,
        max: usize::try_from(max).unwrap_or(usize::MAX),
        path: path("global.overrides.path", listing)?,
    })
}

/// The answer to denied requests: the fields `raw` gives, the others from `fallback`.
fn denial(at: &str, raw: Option<&RawDenial>, fallback: &Denial) -> Result<Denial, ConfigError> {
    let Some(raw) = raw else {
        return Ok(fallback.clone());
    };
    let status = raw.status.unwrap_or(fallback.status);
    if !(400..=599).contains(&status) {
        return Err(error(
            format!("{at}.status"),
            "must be an HTTP error status, between 400 and 599",
        ));
    }
    let content_type = match &raw.content_type {
        Some(value) if value.is_empty() || !value.bytes().all(|b| (b' '..=b'~').contains(&b)) => {
            return Err(error(
                format!("{at}.content_type"),
                "must be a header value: printable ASCII, not empty",
            ))
        }
        Some(value) => value.clone(),
        None => fallback.content_type.clone(),
    };
    Ok(Denial {
        status,
        body: raw.body.clone().or_else(|| fallback.body.clone()),
        content_type,
        grpc_status: raw.grpc_status.unwrap_or(fallback.grpc_status),
        api: fallback.api,
    })
}

/// The value of the environment variable `name`, which must be set and not blank. Envoy gives
/// its VM only the variables its `vm_config.environment_variables` lists.
fn secret(field: &str, name: &str, env: Env) -> Result<Secret, ConfigError> {
    let value = env(name).map(|v| v.trim().to_string()).unwrap_or_default();
    if value.is_empty() {
        return Err(error(
            field,
            format!(
                "environment variable {name:?} is not set or empty in the wasm VM (list it in \
                 vm_config.environment_variables.host_env_keys, or a WasmPlugin's vmConfig.env)"
            ),
        ));
    }
    Ok(Secret::new(value))
}

/// Tokens a policy takes at a time: `lease`, or just the cost. A lease lies between the cost
/// and the smallest burst of the policy's limits; locally only a token bucket can lend tokens to
/// a worker and take them back, and globally only a service that `grants` tokens ahead
/// (sluice-service: an RLS charges what it is asked).
fn take(at: &str, raw: &RawPolicy, policy: &Policy, grants: bool) -> Result<u64, ConfigError> {
    // A duration is a concurrency policy's lease, of its slots (`Shape::of`).
    let Some(RawLease::Tokens(take)) = raw.lease else {
        return Ok(policy.cost);
    };
    if policy.metered.is_some() {
        return Err(error(
            format!("{at}.lease"),
            "a cost read from the response is settled per request: it cannot be lent ahead",
        ));
    }
    let kind = raw.algorithm;
    let lends_locally = policy.scope == Scope::Local && kind == Kind::TokenBucket;
    let global = matches!(policy.scope, Scope::Global(_));
    if global && !grants {
        return Err(error(
            format!("{at}.lease"),
            "an RLS grants no tokens ahead (\"protocol\": \"rls\"): leases need sluice-service",
        ));
    }
    let leases_globally = global && kind != Kind::LeakyBucket;
    if !lends_locally && !leases_globally {
        return Err(not_for(&format!("{at}.lease"), kind));
    }
    let capacities = policy.own_limits().map(|t| t.algorithm.capacity());
    let smallest_burst = capacities.min().unwrap_or(1);
    if take < policy.cost || take > smallest_burst {
        return Err(error(
            format!("{at}.lease"),
            format!(
                "must be between cost ({}) and burst ({smallest_burst})",
                policy.cost
            ),
        ));
    }
    Ok(take)
}

/// A cost read from the response (`"cost": {...}`), if the policy's is: where the usage is read,
/// what a request reserves, how far a key may owe, what an unknown usage costs. Errors name the
/// member of `cost` at fault.
fn metered(at: &str, raw: &RawPolicy) -> Result<Option<Metered>, ConfigError> {
    let RawCost::Metered(value) = &raw.cost else {
        return Ok(None);
    };
    let at = format!("{at}.cost");
    if !value.is_object() {
        return Err(error(
            at,
            "a number of tokens, or how to read them from the response ({\"from_response\": \
             {\"usage\": \"total_tokens\"}})",
        ));
    }
    let raw_metered: RawMetered = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." {
            at.clone()
        } else {
            format!("{at}.{path}")
        };
        error(field, e.inner().to_string())
    })?;
    if !matches!(
        raw.algorithm,
        Kind::TokenBucket | Kind::FixedWindow | Kind::SlidingWindow
    ) {
        return Err(error(
            format!("{at}.from_response"),
            format!(
                "a cost read from the response needs token_bucket, fixed_window or \
                 sliding_window, which can owe and refund tokens: not {}",
                raw.algorithm.name()
            ),
        ));
    }
    let source =
        match (&raw_metered.from_response, &raw_metered.price) {
            (Some(from_response), None) => usage_source(&at, from_response)?,
            (None, Some(price)) => priced(&at, price, raw_metered.unknown_model.as_ref())?,
            (Some(_), Some(price)) => {
                // A price that is wrong itself is named first: it is what the author meant.
                priced(&at, price, raw_metered.unknown_model.as_ref())?;
                return Err(error(
                    format!("{at}.from_response"),
                    "a spend budget (price) reads every kind of token of the body's usage: \
                 leave from_response out",
                ));
            }
            (None, None) => return Err(error(
                at,
                "needs from_response, where the usage is read ({\"from_response\": {\"usage\": \
                 \"total_tokens\"}}), or price, for a spend budget",
            )),
        };
    if raw_metered.unknown_model.is_some() && raw_metered.price.is_none() {
        return Err(error(
            format!("{at}.unknown_model"),
            "only a spend budget (price) has models to price",
        ));
    }
    let max_debt = raw_metered.max_debt;
    if max_debt.is_some_and(|d| d > crate::core::algorithm::MAX_COUNT) {
        let reason = format!("must be at most {}", crate::core::algorithm::MAX_COUNT);
        return Err(error(format!("{at}.max_debt"), reason));
    }
    Ok(Some(Metered {
        source,
        reserve: reserve(&at, raw_metered.reserve.as_ref())?,
        max_debt,
        on_unknown: on_unknown(&at, raw_metered.on_unknown.as_ref())?,
        ask_stream_usage: raw_metered.ask_stream_usage,
    }))
}

fn usage_source(at: &str, raw: &RawFromResponse) -> Result<UsageSource, ConfigError> {
    let at = format!("{at}.from_response");
    match (&raw.usage, &raw.header) {
        (Some(usage), None) => crate::core::usage::Meter::parse(usage)
            .map(UsageSource::Body)
            .map_err(|r| error(format!("{at}.usage"), r)),
        (None, Some(name)) if crate::core::key::is_header_name(name) => {
            Ok(UsageSource::Header(name.to_ascii_lowercase()))
        }
        (None, Some(name)) => Err(error(
            format!("{at}.header"),
            format!("{name:?} is not a valid header name"),
        )),
        _ => Err(error(at, "give one of usage or header")),
    }
}

/// A spend budget's prices (`cost.price`) and unpriced models (`cost.unknown_model`, refused
/// unless it says otherwise); the request's model attribute is interned by the caller.
fn priced(
    at: &str,
    price: &serde_json::Value,
    unknown: Option<&serde_json::Value>,
) -> Result<UsageSource, ConfigError> {
    use crate::core::usage::price::{Prices, Pricing, UnknownModel};
    let prices = Prices::parse(price).map_err(|r| error(format!("{at}.price"), r))?;
    let unknown = match unknown {
        None => UnknownModel::Refuse,
        Some(value) => {
            UnknownModel::parse(value).map_err(|r| error(format!("{at}.unknown_model"), r))?
        }
    };
    Ok(UsageSource::Priced {
        pricing: Pricing { prices, unknown },
        model: 0,
    })
}

fn reserve(at: &str, raw: Option<&serde_json::Value>) -> Result<Reserve, ConfigError> {
    let at = format!("{at}.reserve");
    let Some(value) = raw else {
        return Ok(Reserve::Tokens(0));
    };
    if let Some(tokens) = value.as_u64() {
        return Ok(Reserve::Tokens(tokens));
    }
    let from_request: RawReserveFromRequest =
        serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." {
                at.clone()
            } else {
                format!("{at}.{path}")
            };
            let reason = format!(
                "{} (a number of tokens, or {{\"request\": \"max_tokens\", \"default\": N}})",
                e.inner()
            );
            error(field, reason)
        })?;
    if from_request.request != "max_tokens" {
        return Err(error(
            format!("{at}.request"),
            "only \"max_tokens\" (the body's max_tokens, max_completion_tokens or max_output_tokens)",
        ));
    }
    Ok(Reserve::MaxOutputTokens {
        default: from_request.default,
        attr: 0,
    })
}

fn on_unknown(at: &str, raw: Option<&serde_json::Value>) -> Result<OnUnknown, ConfigError> {
    match raw {
        None => Ok(OnUnknown::Max),
        Some(value) if value.as_str() == Some("max") => Ok(OnUnknown::Max),
        Some(value) if value.as_str() == Some("reserve") => Ok(OnUnknown::Reserve),
        Some(value) => value.as_u64().map(OnUnknown::Tokens).ok_or_else(|| {
            error(
                format!("{at}.on_unknown"),
                "\"max\" (as much as the key can owe, the default), \"reserve\" (the \
                 reservation stays charged) or a number of tokens",
            )
        }),
    }
}

/// The `Retry-After` of a concurrency policy's refusals, if it sets one: nobody knows when a
/// slot will free, so there is none by default.
fn retry_after(at: &str, raw: &RawPolicy) -> Result<Option<u64>, ConfigError> {
    let field = format!("{at}.retry_after");
    match (&raw.retry_after, raw.algorithm) {
        (None, _) => Ok(None),
        (Some(text), Kind::Concurrency) => parse_nanos(text).map(Some).map_err(|r| error(field, r)),
        (Some(_), kind) => Err(not_for(&field, kind)),
    }
}

/// Canary enforcement, for an enforcing policy: the share of its keys it enforces for, in
/// millionths.
fn rollout(at: &str, raw: &RawPolicy) -> Result<Option<Rollout>, ConfigError> {
    let Some(rollout) = &raw.rollout else {
        return Ok(None);
    };
    if raw.mode == RawMode::Shadow {
        return Err(error(
            format!("{at}.rollout"),
            "a shadow policy enforces for no key: a rollout needs \"mode\": \"enforce\"",
        ));
    }
    let percent = rollout.enforce_percent;
    if !(0.0..=100.0).contains(&percent) {
        return Err(error(
            format!("{at}.rollout.enforce_percent"),
            "must be between 0 and 100",
        ));
    }
    Ok(Some(Rollout {
        enforce_per_million: (percent * 10_000.0).round() as u32,
    }))
}

/// Where the policy is decided; the fields that only make sense for a global policy are
/// refused on a local one.
/// A global spend budget, of the policy or of any of its tiers, within what sluice-service
/// counts per key (`SERVICE_MAX_COUNT` micro-units, 1,000 of the currency, a window): the service
/// would refuse every check of a larger one.
fn global_spend_fits(at: &str, tier: &Tier, tiers: Option<&Tiers>) -> Result<(), ConfigError> {
    let max = crate::wire::protocol::SERVICE_MAX_COUNT;
    let tiers = tiers.into_iter().flat_map(|t| &t.values);
    let named = tiers.map(|(value, tier)| {
        let value = String::from_utf8_lossy(value);
        (format!("{at}.tiers.values.{value}"), tier)
    });
    for (field, tier) in std::iter::once((at.to_string(), tier)).chain(named) {
        let (field, count) = if tier.requests > max {
            (format!("{field}.requests"), tier.requests)
        } else if tier.algorithm.capacity() > max {
            (format!("{field}.burst"), tier.algorithm.capacity())
        } else {
            continue;
        };
        return Err(error(
            field,
            format!(
                "{count} micro-units: sluice-service counts at most {max} per key (1,000 of the \
                 currency), and would refuse every check of a global spend budget above it"
            ),
        ));
    }
    Ok(())
}

/// A global concurrency limit, of the policy or of any of its tiers, within what sluice-service
/// keeps (`MAX_GLOBAL_SLOTS`): the service would refuse every check of a larger one.
fn global_slots_fit(at: &str, tier: &Tier, tiers: Option<&Tiers>) -> Result<(), ConfigError> {
    let tiers = tiers.into_iter().flat_map(|t| &t.values);
    let named = tiers.map(|(value, tier)| {
        let value = String::from_utf8_lossy(value);
        (format!("{at}.tiers.values.{value}"), tier)
    });
    for (field, tier) in std::iter::once((at.to_string(), tier)).chain(named) {
        if matches!(tier.algorithm, Algorithm::Concurrency(s) if s.limit > MAX_GLOBAL_SLOTS) {
            return Err(error(
                format!("{field}.requests"),
                format!(
                    "sluice-service keeps at most {MAX_GLOBAL_SLOTS} requests of one key in \
                     flight: a larger global concurrency limit would have every check refused"
                ),
            ));
        }
    }
    Ok(())
}

/// sluice-service refuses a check or a charge whose key would outlive its `--max-key-ttl`
/// (`protocol::key_lifetime_ms`): a global policy of such a limit would have every check
/// refused, or every charge dropped, so it is refused here, naming the field that makes the key
/// live so long.
fn global_keys_live_within(at: &str, policy: &Policy, max_ms: u64) -> Result<(), ConfigError> {
    let tiers = policy.tiers.iter().flat_map(|t| &t.values);
    let named = tiers.map(|(value, tier)| {
        let value = String::from_utf8_lossy(value);
        (format!("{at}.tiers.values.{value}"), tier)
    });
    for (field, tier) in std::iter::once((at.to_string(), &policy.tier)).chain(named) {
        let check = super::plan::key_check(policy, tier, 0);
        let debt = policy.metered.as_ref().map_or(0, |m| m.max_debt(tier));
        let (plain, owing) = (
            crate::wire::protocol::key_lifetime_ms(&check, 0),
            crate::wire::protocol::key_lifetime_ms(&check, debt),
        );
        let (field, lifetime) = match tier.algorithm.kind() {
            _ if plain <= max_ms && owing > max_ms => (format!("{at}.cost.max_debt"), owing),
            _ if plain <= max_ms => continue,
            Kind::TokenBucket => (format!("{field}.burst"), plain),
            Kind::LeakyBucket => (format!("{field}.max_delay"), plain),
            Kind::Concurrency => (format!("{field}.lease"), plain),
            _ => (format!("{field}.per"), plain),
        };
        return Err(error(
            field,
            format!(
                "its key would live {}, more than sluice-service keeps a key ({}, global.max_key_ttl: \
                 the service's --max-key-ttl): the service would refuse its checks or charges",
                days(lifetime),
                days(max_ms)
            ),
        ));
    }
    Ok(())
}

/// Milliseconds as whole days, rounded up, or seconds below a day.
fn days(ms: u64) -> String {
    const DAY_MS: u64 = 86_400_000;
    if ms >= DAY_MS {
        format!("{}d", ms.div_ceil(DAY_MS))
    } else {
        format!("{}s", ms.div_ceil(1000))
    }
}

fn scope(
    at: &str,
    raw: &RawPolicy,
    shape: &Shape,
    has_service: bool,
) -> Result<Scope, ConfigError> {
    if raw.scope == RawScope::Local {
        let only_global = [
            ("failure_mode", raw.failure_mode.is_some()),
            ("emergency", raw.emergency.is_some()),
        ];
        return match only_global.iter().find(|(_, given)| *given) {
            Some((field, _)) => Err(error(
                format!("{at}.{field}"),
                "applies to global policies only (\"scope\": \"global\")",
            )),
            None => Ok(Scope::Local),
        };
    }
    if !has_service {
        return Err(error(
            format!("{at}.scope"),
            "a global policy needs the top-level \"global\" service settings",
        ));
    }
    let on_failure = match (
        raw.failure_mode.unwrap_or(RawFailureMode::Open),
        &raw.emergency,
    ) {
        (RawFailureMode::Open, None) => OnFailure::Open { emergency: None },
        (RawFailureMode::Open, Some(r)) => {
            let at = format!("{at}.emergency");
            let emergency = shape.tier(&at, r.requests, r.per.as_deref(), r.burst)?;
            OnFailure::Open {
                emergency: Some(emergency),
            }
        }
        (RawFailureMode::Closed, Some(_)) => {
            return Err(error(
                format!("{at}.emergency"),
                "a policy that fails closed has no emergency budget",
            ))
        }
        (RawFailureMode::Closed, None) => OnFailure::Closed,
    };
    Ok(Scope::Global(on_failure))
}

/// A bypass entry, one exemption per policy it names.
fn bypass(
    at: &str,
    raw: &RawBypass,
    policies: &[Policy],
    tables: &[TableDraft],
    secret: &HashSecret,
) -> Result<Vec<Bypass>, ConfigError> {
    for (field, value) in [("owner", &raw.owner), ("reason", &raw.reason)] {
        if value.trim().is_empty() {
            return Err(error(
                format!("{at}.{field}"),
                "must say who and why: it is the audit trail",
            ));
        }
    }
    let expires = crate::core::time::parse_rfc3339(&raw.expires)
        .map_err(|r| error(format!("{at}.expires"), r))?;
    if raw.policies.is_empty() {
        return Err(error(
            format!("{at}.policies"),
            "must name at least one policy",
        ));
    }
    raw.policies
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let (index, policy) = policies
                .iter()
                .enumerate()
                .find(|(_, p)| p.name == *name)
                .ok_or_else(|| {
                    error(
                        format!("{at}.policies[{i}]"),
                        format!("no policy is named {name:?}"),
                    )
                })?;
            let parts = tables.get(policy.table).map_or(0, |t| t.key.len());
            let key = match (&raw.key, &raw.key_hash) {
                (Some(values), None) if values.len() == parts => hash_values(values, secret),
                (Some(_), None) => {
                    return Err(error(
                        format!("{at}.key"),
                        format!("policy {name:?} has {parts} key parts: give one value for each"),
                    ))
                }
                (None, Some(hex)) => u64::from_str_radix(hex, 16)
                    .ok()
                    .filter(|_| hex.len() == 16)
                    .ok_or_else(|| {
                        error(
                            format!("{at}.key_hash"),
                            "must be the 16 hex digits the logs show",
                        )
                    })?,
                _ => return Err(error(at, "give exactly one of key or key_hash")),
            };
            Ok(Bypass {
                policy: index,
                key,
                owner: raw.owner.clone(),
                reason: raw.reason.clone(),
                expires,
            })
        })
        .collect()
}

/// The route names of a `match`: some, none empty.
fn route_names(at: &str, routes: &[String]) -> Result<Vec<String>, ConfigError> {
    if routes.is_empty() {
        return Err(error(
            format!("{at}.routes"),
            "must not be empty (leave it out to match any route)",
        ));
    }
    if let Some(i) = routes.iter().position(String::is_empty) {
        return Err(error(
            format!("{at}.routes[{i}]"),
            "must name a route (Envoy's route `name`)",
        ));
    }
    Ok(routes.to_vec())
}

fn path(at: &str, path: &str) -> Result<String, ConfigError> {
    if path.starts_with('/') {
        Ok(path.to_string())
    } else {
        Err(error(at, "must start with '/'"))
    }
}

/// The most bytes of `status_path`.
pub const MAX_STATUS_PATH: usize = 256;

/// `status_path`: a path alone, as Envoy's `:path` carries it (no query, fragment, space or
/// control character), which the filter compares byte for byte.
fn status_path(path: &str) -> Result<String, ConfigError> {
    const FIELD: &str = "status_path";
    if !path.starts_with('/') {
        return Err(error(FIELD, "must start with '/'"));
    }
    if path.len() > MAX_STATUS_PATH {
        return Err(error(
            FIELD,
            format!("must be at most {MAX_STATUS_PATH} bytes"),
        ));
    }
    if let Some(c) = path
        .chars()
        .find(|c| !c.is_ascii_graphic() || matches!(c, '?' | '#'))
    {
        return Err(error(
            FIELD,
            format!(
                "must be a path alone, printable ASCII without '?' or '#' (it is compared with the request's whole :path): found {c:?}"
            ),
        ));
    }
    Ok(path.to_string())
}

fn is_policy_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
}

/// Identifies what the key reads (not where the plan happens to index it), and the policies'
/// names and column counts: the table's pages and its layout's records.
fn layout_ids(key: &[KeyPart], members: &[(String, usize)], attrs: &[Attr]) -> (u64, u64) {
    let mut hasher = SipHasher13::new_with_keys(0, 0);
    for part in key {
        for source in &part.alternatives {
            match source {
                Source::Global => None,
                Source::Attr(index) => attrs.get(*index),
            }
            .hash(&mut hasher);
        }
        hasher.write_u8(b'|');
    }
    let key_id = hasher.finish();
    members.hash(&mut hasher);
    (key_id, hasher.finish())
}

/// The most policies the draft headers may list: a handful, as a response header is no report.
pub const MAX_HEADER_POLICIES: u64 = 8;

fn header_policies(raw: Option<u64>) -> Result<usize, ConfigError> {
    match raw.unwrap_or(1) {
        n @ 1..=MAX_HEADER_POLICIES => Ok(usize::try_from(n).unwrap_or(1)),
        n => Err(error(
            "header_policies",
            format!("{n} is out of range: from 1 to {MAX_HEADER_POLICIES}"),
        )),
    }
}
