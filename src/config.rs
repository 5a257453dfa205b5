//! The plugin configuration: parsed strictly once, then compiled into the `Plan` that every
//! request reads. Any error names the field and the reason; nothing half-valid gets through.

use crate::algorithm::{Algorithm, Rate};
use crate::duration::parse_nanos;
use crate::headers::HeaderStyle;
use crate::key::{parse_part, KeyPart, Source};
use crate::matcher::{HeaderRule, Matcher, PathRule};
use crate::request::Attr;
use serde::Deserialize;
use siphasher::sip::SipHasher13;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{Hash, Hasher};

pub const DEFAULT_MAX_KEYS: u32 = 10_000;
pub const MAX_MAX_KEYS: u32 = 1_000_000;
/// A sliding log keeps one timestamp per request of its limit, in every key's slot.
pub const MAX_SLIDING_LOG: u64 = 1_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    version: Option<String>,
    #[serde(default)]
    headers: HeaderStyle,
    #[serde(default)]
    policies: Vec<RawPolicy>,
    default: Option<RawPolicy>,
    global: Option<RawGlobal>,
    #[serde(default)]
    bypass: Vec<RawBypass>,
}

/// An audited exemption: who asked, why, and until when.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBypass {
    /// The key's value, one string per key part (each part's first alternative)...
    key: Option<Vec<String>>,
    /// ...or its hash as the logs show it (16 hex digits).
    key_hash: Option<String>,
    policies: Vec<String>,
    owner: String,
    reason: String,
    expires: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGlobal {
    cluster: String,
    authority: String,
    #[serde(default = "default_check_path")]
    path: String,
    #[serde(default = "default_timeout")]
    timeout: String,
}

fn default_check_path() -> String {
    "/v1/check".into()
}

fn default_timeout() -> String {
    "50ms".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    name: String,
    #[serde(rename = "match")]
    matcher: Option<RawMatch>,
    key: Vec<String>,
    #[serde(default)]
    missing_key: MissingKey,
    requests: u64,
    per: String,
    burst: Option<u64>,
    #[serde(default = "one")]
    cost: u64,
    #[serde(default)]
    mode: Mode,
    tiers: Option<RawTiers>,
    #[serde(default = "default_max_keys")]
    max_keys: u32,
    #[serde(default)]
    algorithm: Kind,
    max_delay: Option<String>,
    #[serde(default)]
    scope: Scope,
    failure_mode: Option<FailureMode>,
    lease: Option<u64>,
    emergency: Option<RawRate>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Kind {
    #[default]
    TokenBucket,
    FixedWindow,
    SlidingWindow,
    SlidingLog,
    LeakyBucket,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::TokenBucket => "token_bucket",
            Kind::FixedWindow => "fixed_window",
            Kind::SlidingWindow => "sliding_window",
            Kind::SlidingLog => "sliding_log",
            Kind::LeakyBucket => "leaky_bucket",
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Scope {
    #[default]
    Local,
    Global,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum FailureMode {
    Open,
    Closed,
}

fn one() -> u64 {
    1
}

fn default_max_keys() -> u32 {
    DEFAULT_MAX_KEYS
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum MissingKey {
    #[default]
    Skip,
    Shared,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    #[default]
    Enforce,
    Shadow,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMatch {
    path_prefix: Option<String>,
    path_exact: Option<String>,
    methods: Option<Vec<String>>,
    #[serde(default)]
    headers: Vec<RawHeaderCondition>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHeaderCondition {
    name: String,
    present: Option<bool>,
    equals: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTiers {
    by: String,
    values: BTreeMap<String, RawRate>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRate {
    requests: u64,
    per: String,
    burst: Option<u64>,
}

/// A refused configuration: which field, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

fn error(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// One limit a policy can run at: the policy's own, or a tier's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tier {
    pub algorithm: Algorithm,
    pub requests: u64,
    pub per_nanos: u64,
}

/// How a global policy is decided when the service cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GlobalPolicy {
    /// When the service cannot answer: `Some(rate)` enforces that rate locally instead
    /// (`None` in it: the request's own tier); `None`: fail closed with a 503.
    pub fail_open: Option<Option<Tier>>,
}

/// Where and how the rate-limit service is called, from the top-level `global` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalService {
    pub cluster: String,
    pub authority: String,
    pub path: String,
    pub timeout_ms: u64,
}

/// A compiled policy. `table` and `column` say where its state lives in the key's slot.
#[derive(Debug, Clone)]
pub struct Policy {
    pub name: String,
    pub matcher: Matcher,
    /// The `default` policy: applies only when no other policy matched.
    pub fallback: bool,
    pub shadow: bool,
    pub share_missing_key: bool,
    pub cost: u64,
    /// Tokens taken per visit to the bucket (local: this worker spends the rest itself) or per
    /// call to the service (global: this Envoy does): `lease`, or the cost.
    pub lease: u64,
    pub tier: Tier,
    pub tiers: Option<(KeyPart, HashMap<Vec<u8>, Tier>)>,
    /// `None`: a local policy, decided by its bucket in shared data.
    pub global: Option<GlobalPolicy>,
    pub table: usize,
    pub column: usize,
}

/// Words a global policy keeps per key besides its emergency state: leased tokens, when they
/// lapse, and until when the key is over its limit (see `limiter::GlobalState`).
pub const GLOBAL_COLUMNS: usize = 3;

impl Policy {
    /// Words of state per key: the algorithm's (for the largest tier), and for a global policy
    /// its lease and over-limit mark besides.
    pub fn columns(&self) -> usize {
        let emergency = self.global.and_then(|g| g.fail_open.flatten());
        let local = self
            .tiers
            .iter()
            .flat_map(|(_, values)| values.values())
            .chain([&self.tier])
            .chain(emergency.as_ref())
            .map(|t| t.algorithm.columns())
            .max()
            .unwrap_or(1);
        local
            + if self.global.is_some() {
                GLOBAL_COLUMNS
            } else {
                0
            }
    }
}

/// A shared-data table: one bounded set of slots for all policies with the same key. Each slot
/// holds one key's buckets for all of them, so they cost one read and one CAS together.
#[derive(Debug, Clone)]
pub struct TableSpec {
    pub key: Vec<KeyPart>,
    pub capacity: u32,
    /// Words of state per slot: the sum of its policies' columns.
    pub width: usize,
    /// Changes whenever the slot layout does, so a new layout never reads an old one's slots.
    pub layout_id: u64,
}

/// One policy's exemption of one key, from a `bypass` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bypass {
    pub policy: usize,
    pub key: u64,
    pub owner: String,
    pub reason: String,
    /// Unix nanoseconds.
    pub expires: u64,
}

/// The compiled configuration.
#[derive(Debug, Clone)]
pub struct Plan {
    pub version: String,
    pub headers: HeaderStyle,
    /// Every request attribute some policy reads, each once.
    pub attrs: Vec<Attr>,
    pub policies: Vec<Policy>,
    pub tables: Vec<TableSpec>,
    pub global: Option<GlobalService>,
    pub bypass: Vec<Bypass>,
}

impl Plan {
    /// The exemption of `key` from `policy`, expired or not.
    pub fn bypass_of(&self, policy: usize, key: u64) -> Option<(usize, &Bypass)> {
        self.bypass
            .iter()
            .enumerate()
            .find(|(_, b)| b.policy == policy && b.key == key)
    }
}

/// Parses and validates the plugin configuration.
pub fn parse(json: &[u8]) -> Result<Plan, ConfigError> {
    let raw: RawConfig = serde_path_to_error::deserialize(
        &mut serde_json::Deserializer::from_slice(json),
    )
    .map_err(|e| {
        let field = e.path().to_string();
        error(
            if field == "." {
                "configuration".into()
            } else {
                field
            },
            e.inner().to_string(),
        )
    })?;
    Compiler::default().compile(raw)
}

#[derive(Default)]
struct Compiler {
    attrs: Vec<Attr>,
    tables: Vec<TableDraft>,
}

/// A table while policies are still being placed in it.
struct TableDraft {
    key: Vec<KeyPart>,
    /// Each policy's name and number of columns, in column order.
    members: Vec<(String, usize)>,
    capacity: u32,
}

impl Compiler {
    fn compile(mut self, raw: RawConfig) -> Result<Plan, ConfigError> {
        if raw.policies.is_empty() && raw.default.is_none() {
            return Err(error(
                "policies",
                "at least one policy (or a default) is required",
            ));
        }
        let global = raw.global.as_ref().map(service).transpose()?;
        let mut policies = Vec::with_capacity(raw.policies.len() + 1);
        for (i, policy) in raw.policies.iter().enumerate() {
            let at = format!("policies[{i}]");
            policies.push(self.policy(&at, policy, false, global.is_some())?);
        }
        if let Some(default) = &raw.default {
            if default.matcher.is_some() {
                return Err(error(
                    "default.match",
                    "the default policy applies when no policy matches, so it takes no match",
                ));
            }
            policies.push(self.policy("default", default, true, global.is_some())?);
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
        let bypass = raw
            .bypass
            .iter()
            .enumerate()
            .map(|(i, entry)| bypass(&format!("bypass[{i}]"), entry, &policies, &self.tables))
            .collect::<Result<Vec<_>, _>>()?
            .concat();
        let attrs = self.attrs;
        let tables = self
            .tables
            .into_iter()
            .map(|t| TableSpec {
                layout_id: layout_id(&t.key, &t.members, &attrs),
                width: t.members.iter().map(|(_, columns)| columns).sum(),
                key: t.key,
                capacity: t.capacity,
            })
            .collect();
        Ok(Plan {
            version: raw.version.unwrap_or_else(|| "unversioned".into()),
            headers: raw.headers,
            attrs,
            policies,
            tables,
            global,
            bypass,
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
        has_service: bool,
    ) -> Result<Policy, ConfigError> {
        if !is_policy_name(&raw.name) {
            return Err(error(
                format!("{at}.name"),
                "must be 1-64 characters of A-Z, a-z, 0-9, '_', '-', '.'",
            ));
        }
        if raw.cost == 0 {
            return Err(error(format!("{at}.cost"), "must be at least 1"));
        }
        let shape = Shape::of(at, raw)?;
        let tier = shape.tier(at, raw.requests, &raw.per, raw.burst)?;
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
        let lease = lease(at, raw, &shape, &tier, tiers.as_ref())?;
        let global = global_policy(at, raw, &shape, has_service)?;
        let mut policy = Policy {
            name: raw.name.clone(),
            matcher,
            fallback,
            shadow: raw.mode == Mode::Shadow,
            share_missing_key: raw.missing_key == MissingKey::Shared,
            cost: raw.cost,
            lease,
            tier,
            tiers,
            global,
            table: 0,
            column: 0,
        };
        (policy.table, policy.column) = self.place(key, &raw.name, policy.columns(), raw.max_keys);
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

    /// The table for this key (shared with earlier policies of the same key) and the first
    /// of the policy's columns in it.
    fn place(
        &mut self,
        key: Vec<KeyPart>,
        name: &str,
        columns: usize,
        max_keys: u32,
    ) -> (usize, usize) {
        let member = (name.to_string(), columns);
        if let Some(index) = self.tables.iter().position(|t| t.key == key) {
            if let Some(table) = self.tables.get_mut(index) {
                let column = table.members.iter().map(|(_, c)| c).sum();
                table.members.push(member);
                table.capacity = table.capacity.max(max_keys);
                return (index, column);
            }
        }
        self.tables.push(TableDraft {
            key,
            members: vec![member],
            capacity: max_keys,
        });
        (self.tables.len() - 1, 0)
    }

    fn tiers(
        &mut self,
        at: &str,
        raw: &RawTiers,
        shape: &Shape,
    ) -> Result<(KeyPart, HashMap<Vec<u8>, Tier>), ConfigError> {
        let by = parse_part(&raw.by, &mut |a| self.intern(a))
            .map_err(|r| error(format!("{at}.by"), r))?;
        let mut values = HashMap::new();
        for (value, rate) in &raw.values {
            let field = format!("{at}.values.{value}");
            values.insert(
                value.as_bytes().to_vec(),
                shape.tier(&field, rate.requests, &rate.per, rate.burst)?,
            );
        }
        Ok((by, values))
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
        let mut headers = Vec::with_capacity(raw.headers.len());
        for (i, condition) in raw.headers.iter().enumerate() {
            let field = format!("{at}.headers[{i}]");
            if !crate::key::is_header_name(&condition.name) {
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
        })
    }
}

/// What a policy's limits are made of, whatever the tier: the algorithm, the cost of a
/// request, and (leaky bucket) the longest a request may be held.
struct Shape {
    kind: Kind,
    cost: u64,
    max_delay: Option<u64>,
}

impl Shape {
    fn of(at: &str, raw: &RawPolicy) -> Result<Shape, ConfigError> {
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
        Ok(Shape {
            kind: raw.algorithm,
            cost: raw.cost,
            max_delay,
        })
    }

    /// `requests` per `per` (and `burst` where the algorithm has one) as a validated limit.
    fn tier(
        &self,
        at: &str,
        requests: u64,
        per: &str,
        burst: Option<u64>,
    ) -> Result<Tier, ConfigError> {
        if requests == 0 {
            return Err(error(format!("{at}.requests"), "must be at least 1"));
        }
        let per_nanos = parse_nanos(per).map_err(|r| error(format!("{at}.per"), r))?;
        if burst.is_some() && self.kind != Kind::TokenBucket {
            return Err(not_for(&format!("{at}.burst"), self.kind));
        }
        let cost = self.cost;
        let out_of_range = || {
            error(
                format!("{at}.requests"),
                "rate out of range: more than one request per nanosecond, or a bucket that takes over a century to fill",
            )
        };
        let at_least_cost = |field: &str, value: u64| {
            if value < cost {
                Err(error(
                    format!("{at}.{field}"),
                    format!("must be >= cost ({cost})"),
                ))
            } else {
                Ok(())
            }
        };
        let algorithm = match self.kind {
            Kind::TokenBucket => {
                let burst = burst.unwrap_or(requests);
                at_least_cost("burst", burst)?;
                Algorithm::TokenBucket(
                    Rate::new(requests, per_nanos, burst).ok_or_else(out_of_range)?,
                )
            }
            Kind::FixedWindow | Kind::SlidingWindow | Kind::SlidingLog => {
                at_least_cost("requests", requests)?;
                let (limit, window) = (requests, per_nanos);
                match self.kind {
                    Kind::FixedWindow => Algorithm::FixedWindow { limit, window },
                    Kind::SlidingWindow => Algorithm::SlidingWindow { limit, window },
                    _ if limit > MAX_SLIDING_LOG => {
                        return Err(error(
                            format!("{at}.requests"),
                            format!(
                            "sliding_log keeps a timestamp per request: at most {MAX_SLIDING_LOG}"
                        ),
                        ))
                    }
                    _ => Algorithm::SlidingLog { limit, window },
                }
            }
            Kind::LeakyBucket => {
                let interval = per_nanos
                    .checked_div(requests)
                    .filter(|&i| i > 0)
                    .ok_or_else(out_of_range)?;
                Algorithm::LeakyBucket {
                    interval,
                    max_delay: self.max_delay.unwrap_or(0),
                }
            }
        };
        Ok(Tier {
            algorithm,
            requests,
            per_nanos,
        })
    }
}

fn not_for(field: &str, kind: Kind) -> ConfigError {
    error(
        field,
        format!("does not apply to the {} algorithm", kind.name()),
    )
}

fn service(raw: &RawGlobal) -> Result<GlobalService, ConfigError> {
    if raw.cluster.is_empty() {
        return Err(error("global.cluster", "must name an Envoy cluster"));
    }
    if raw.authority.is_empty() {
        return Err(error("global.authority", "must not be empty"));
    }
    let timeout = parse_nanos(&raw.timeout).map_err(|r| error("global.timeout", r))?;
    Ok(GlobalService {
        cluster: raw.cluster.clone(),
        authority: raw.authority.clone(),
        path: path("global.path", &raw.path)?,
        timeout_ms: timeout.div_ceil(1_000_000),
    })
}

/// Tokens a policy takes per visit to its bucket (local) or call to the service (global):
/// `lease`, or just the cost. A lease lies between the cost and the smallest burst of the
/// policy's rates; locally only a token bucket can lend tokens out and take them back.
fn lease(
    at: &str,
    raw: &RawPolicy,
    shape: &Shape,
    tier: &Tier,
    tiers: Option<&(KeyPart, HashMap<Vec<u8>, Tier>)>,
) -> Result<u64, ConfigError> {
    let leases_locally = raw.scope == Scope::Local && shape.kind != Kind::TokenBucket;
    if raw.lease.is_some() && (leases_locally || shape.kind == Kind::LeakyBucket) {
        return Err(not_for(&format!("{at}.lease"), shape.kind));
    }
    let take = raw.lease.unwrap_or(raw.cost);
    let smallest_burst = tiers
        .into_iter()
        .flat_map(|(_, values)| values.values())
        .chain([tier])
        .map(|t| t.algorithm.capacity())
        .min()
        .unwrap_or(1);
    if take < raw.cost || take > smallest_burst {
        return Err(error(
            format!("{at}.lease"),
            format!(
                "must be between cost ({}) and burst ({smallest_burst})",
                raw.cost
            ),
        ));
    }
    Ok(take)
}

/// The global settings of a policy; the fields that only make sense for one are refused on
/// a local policy.
fn global_policy(
    at: &str,
    raw: &RawPolicy,
    shape: &Shape,
    has_service: bool,
) -> Result<Option<GlobalPolicy>, ConfigError> {
    if raw.scope == Scope::Local {
        let only_global = [
            ("failure_mode", raw.failure_mode.is_some()),
            ("emergency", raw.emergency.is_some()),
        ];
        return match only_global.iter().find(|(_, given)| *given) {
            Some((field, _)) => Err(error(
                format!("{at}.{field}"),
                "applies to global policies only (\"scope\": \"global\")",
            )),
            None => Ok(None),
        };
    }
    if !has_service {
        return Err(error(
            format!("{at}.scope"),
            "a global policy needs the top-level \"global\" service settings",
        ));
    }
    let fail_open = match (
        raw.failure_mode.unwrap_or(FailureMode::Open),
        &raw.emergency,
    ) {
        (FailureMode::Open, None) => Some(None),
        (FailureMode::Open, Some(r)) => {
            let at = format!("{at}.emergency");
            Some(Some(shape.tier(&at, r.requests, &r.per, r.burst)?))
        }
        (FailureMode::Closed, Some(_)) => {
            return Err(error(
                format!("{at}.emergency"),
                "a policy that fails closed has no emergency budget",
            ))
        }
        (FailureMode::Closed, None) => None,
    };
    Ok(Some(GlobalPolicy { fail_open }))
}

/// A bypass entry, one exemption per policy it names.
fn bypass(
    at: &str,
    raw: &RawBypass,
    policies: &[Policy],
    tables: &[TableDraft],
) -> Result<Vec<Bypass>, ConfigError> {
    for (field, value) in [("owner", &raw.owner), ("reason", &raw.reason)] {
        if value.trim().is_empty() {
            return Err(error(
                format!("{at}.{field}"),
                "must say who and why: it is the audit trail",
            ));
        }
    }
    let expires =
        crate::time::parse_rfc3339(&raw.expires).map_err(|r| error(format!("{at}.expires"), r))?;
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
                (Some(values), None) if values.len() == parts => crate::key::hash_values(values),
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

fn path(at: &str, path: &str) -> Result<String, ConfigError> {
    if path.starts_with('/') {
        Ok(path.to_string())
    } else {
        Err(error(at, "must start with '/'"))
    }
}

fn is_policy_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
}

/// Hashes what the key reads (not where the plan happens to index it) and the policies'
/// names and column counts.
fn layout_id(key: &[KeyPart], members: &[(String, usize)], attrs: &[Attr]) -> u64 {
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
    members.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn policy() -> Value {
        json!({"name": "per-user", "key": ["header:x-user-id"], "requests": 100, "per": "1m", "burst": 20})
    }

    fn with(policy_fields: Value) -> Value {
        let mut p = policy();
        for (k, v) in policy_fields.as_object().unwrap() {
            p[k] = v.clone();
        }
        json!({ "policies": [p] })
    }

    fn refused(config: Value) -> ConfigError {
        parse(config.to_string().as_bytes()).expect_err("should be refused")
    }

    fn assert_refused(config: Value, field: &str, reason_contains: &str) {
        let e = refused(config);
        assert_eq!(e.field, field, "{e}");
        assert!(e.reason.contains(reason_contains), "{e}");
    }

    #[test]
    fn the_issue_example_compiles_with_defaults() {
        let plan = parse(
            br#"{"version":"2026-11-29.1","headers":"legacy","policies":[{"name":"per-user",
            "match":{"path_prefix":"/api/","methods":["GET","POST"]},"key":["header:x-user-id"],
            "requests":100,"per":"1m","burst":20,"mode":"enforce"}]}"#,
        )
        .unwrap();
        assert_eq!(plan.version, "2026-11-29.1");
        let p = &plan.policies[0];
        assert_eq!((p.cost, p.shadow, p.share_missing_key), (1, false, false));
        assert_eq!(
            p.tier.algorithm,
            Algorithm::TokenBucket(Rate::new(100, 60_000_000_000, 20).unwrap())
        );
        assert_eq!((p.tier.requests, p.tier.per_nanos), (100, 60_000_000_000));
        assert_eq!(plan.tables[0].capacity, DEFAULT_MAX_KEYS);
    }

    #[test]
    fn burst_defaults_to_requests() {
        let plan = parse(
            json!({"policies": [{"name": "a", "key": ["ip"], "requests": 7, "per": "1s"}]})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(plan.policies[0].tier.algorithm.capacity(), 7);
    }

    #[test]
    fn policies_with_the_same_key_share_one_table() {
        let config = json!({"policies": [
            {"name": "second", "key": ["header:x-user-id"], "requests": 1, "per": "1s"},
            {"name": "ip", "key": ["ip"], "requests": 1, "per": "1s"},
            {"name": "minute", "key": ["header:X-User-Id"], "requests": 10, "per": "1m", "max_keys": 50000},
        ]});
        let plan = parse(config.to_string().as_bytes()).unwrap();
        assert_eq!(plan.tables.len(), 2);
        assert_eq!((plan.policies[2].table, plan.policies[2].column), (0, 1));
        assert_eq!((plan.tables[0].width, plan.tables[0].capacity), (2, 50000));
    }

    #[test]
    fn the_slot_layout_id_ignores_attribute_order() {
        let a = json!({"policies": [
            {"name": "m", "match": {"headers": [{"name": "x-a", "present": true}]}, "key": ["header:x-user-id"], "requests": 1, "per": "1s"}]});
        let b = json!({"policies": [{"name": "m", "key": ["header:x-user-id"], "requests": 1, "per": "1s"}]});
        let id = |c: Value| parse(c.to_string().as_bytes()).unwrap().tables[0].layout_id;
        assert_eq!(id(a), id(b));
    }

    #[test]
    fn rejects_unknown_fields_naming_them() {
        assert_refused(
            with(json!({"brust": 3})),
            "policies[0].brust",
            "unknown field",
        );
        assert_refused(
            json!({"policies": [], "polices": []}),
            "polices",
            "unknown field",
        );
    }

    #[test]
    fn rejects_wrong_types_naming_the_field() {
        assert_refused(
            with(json!({"burst": "5"})),
            "policies[0].burst",
            "invalid type",
        );
        assert_refused(
            with(json!({"key": "ip"})),
            "policies[0].key",
            "invalid type",
        );
    }

    #[test]
    fn rejects_zero_and_negative_rates() {
        assert_refused(
            with(json!({"requests": 0})),
            "policies[0].requests",
            "at least 1",
        );
        assert_refused(
            with(json!({"requests": -5})),
            "policies[0].requests",
            "invalid value",
        );
        assert_refused(
            with(json!({"burst": 0})),
            "policies[0].burst",
            "must be >= cost",
        );
        assert_refused(with(json!({"cost": 0})), "policies[0].cost", "at least 1");
    }

    #[test]
    fn rejects_rates_out_of_range() {
        assert_refused(
            with(json!({"requests": 2_000_000, "per": "1ms"})),
            "policies[0].requests",
            "out of range",
        );
        assert_refused(
            with(json!({"requests": 1, "per": "365d", "burst": 1_000_000})),
            "policies[0].requests",
            "out of range",
        );
    }

    #[test]
    fn rejects_burst_below_cost() {
        assert_refused(
            with(json!({"burst": 2, "cost": 3})),
            "policies[0].burst",
            "must be >= cost (3)",
        );
    }

    #[test]
    fn rejects_unparsable_durations() {
        assert_refused(with(json!({"per": "1 minute"})), "policies[0].per", "unit");
        assert_refused(
            with(json!({"per": "0s"})),
            "policies[0].per",
            "greater than zero",
        );
    }

    #[test]
    fn rejects_duplicate_names() {
        let p = policy();
        assert_refused(json!({"policies": [p, p]}), "policies[1].name", "duplicate");
        assert_refused(
            json!({"policies": [p], "default": p}),
            "default.name",
            "duplicate",
        );
    }

    #[test]
    fn rejects_names_that_would_need_escaping() {
        assert_refused(
            with(json!({"name": "a\"b"})),
            "policies[0].name",
            "characters",
        );
        assert_refused(with(json!({"name": ""})), "policies[0].name", "characters");
    }

    #[test]
    fn rejects_bad_keys() {
        assert_refused(with(json!({"key": []})), "policies[0].key", "at least one");
        assert_refused(
            with(json!({"key": ["ip", "cookie:x"]})),
            "policies[0].key[1]",
            "unknown key part",
        );
        assert_refused(
            with(json!({"missing_key": "deny"})),
            "policies[0].missing_key",
            "unknown variant",
        );
    }

    #[test]
    fn rejects_bad_matches() {
        assert_refused(
            with(json!({"match": {"path_prefix": "/a", "path_exact": "/b"}})),
            "policies[0].match.path_exact",
            "not both",
        );
        assert_refused(
            with(json!({"match": {"path_prefix": "api"}})),
            "policies[0].match.path_prefix",
            "start with '/'",
        );
        assert_refused(
            with(json!({"match": {"methods": []}})),
            "policies[0].match.methods",
            "not be empty",
        );
        assert_refused(
            with(json!({"match": {"methods": ["get"]}})),
            "policies[0].match.methods",
            "upper-case",
        );
        assert_refused(
            with(json!({"match": {"headers": [{"name": "x"}]}})),
            "policies[0].match.headers[0]",
            "exactly one",
        );
        assert_refused(
            with(json!({"match": {"headers": [{"name": "a b", "present": true}]}})),
            "policies[0].match.headers[0].name",
            "header name",
        );
    }

    #[test]
    fn rejects_bad_modes_and_header_styles() {
        assert_refused(
            with(json!({"mode": "log"})),
            "policies[0].mode",
            "unknown variant",
        );
        assert_refused(
            json!({"headers": "rfc", "policies": [policy()]}),
            "headers",
            "unknown variant",
        );
    }

    #[test]
    fn rejects_bad_tiers() {
        let tiers = |values: Value| {
            with(json!({"cost": 2, "tiers": {"by": "header:x-plan", "values": values}}))
        };
        assert_refused(
            tiers(json!({"pro": {"requests": 10, "per": "1s", "burst": 1}})),
            "policies[0].tiers.values.pro.burst",
            ">= cost",
        );
        assert_refused(
            tiers(json!({"pro": {"requests": 10, "per": "soon"}})),
            "policies[0].tiers.values.pro.per",
            "unit",
        );
        assert_refused(
            tiers(json!({"pro": {"requests": 10}})),
            "policies[0].tiers.values.pro",
            "missing field `per`",
        );
        assert_refused(
            with(json!({"tiers": {"by": "plan", "values": {}}})),
            "policies[0].tiers.by",
            "unknown key part",
        );
    }

    #[test]
    fn rejects_max_keys_out_of_range() {
        assert_refused(
            with(json!({"max_keys": 0})),
            "policies[0].max_keys",
            "between",
        );
        assert_refused(
            with(json!({"max_keys": 2_000_000})),
            "policies[0].max_keys",
            "between",
        );
    }

    #[test]
    fn rejects_an_empty_configuration() {
        assert_refused(json!({}), "policies", "at least one");
        assert_eq!(refused(json!([])).field, "configuration");
        assert!(parse(b"not json").is_err());
    }

    #[test]
    fn a_default_policy_takes_no_match() {
        let mut d = policy();
        d["match"] = json!({"path_prefix": "/"});
        assert_refused(
            json!({"policies": [], "default": d}),
            "default.match",
            "no match",
        );
        let plan = parse(json!({"default": policy()}).to_string().as_bytes()).unwrap();
        assert!(plan.policies[0].fallback);
    }

    fn with_service(policy_fields: Value) -> Value {
        let mut config = with(policy_fields);
        config["global"] = json!({"cluster": "ratelimit", "authority": "ratelimit.local"});
        config
    }

    #[test]
    fn a_global_policy_compiles_with_its_defaults() {
        let plan = parse(
            with_service(json!({"scope": "global"}))
                .to_string()
                .as_bytes(),
        )
        .unwrap();
        let service = plan.global.as_ref().unwrap();
        assert_eq!(
            (service.path.as_str(), service.timeout_ms),
            ("/v1/check", 50)
        );
        let global = plan.policies[0].global.unwrap();
        assert_eq!(
            global,
            GlobalPolicy {
                fail_open: Some(None)
            }
        );
        assert_eq!(plan.policies[0].lease, 1);
        assert_eq!(plan.tables[0].width, 4);
    }

    #[test]
    fn global_only_fields_are_refused_on_local_policies() {
        assert_refused(
            with(json!({"failure_mode": "closed"})),
            "policies[0].failure_mode",
            "global policies only",
        );
        let emergency = json!({"requests": 1, "per": "1s"});
        assert_refused(
            with(json!({"emergency": emergency})),
            "policies[0].emergency",
            "global policies only",
        );
    }

    #[test]
    fn a_global_policy_needs_the_service_settings() {
        assert_refused(
            with(json!({"scope": "global"})),
            "policies[0].scope",
            "\"global\" service settings",
        );
        assert_refused(
            with(json!({"scope": "cluster"})),
            "policies[0].scope",
            "unknown variant",
        );
    }

    #[test]
    fn a_local_token_bucket_can_lease_and_nothing_else_locally() {
        let plan = parse(with(json!({"lease": 5})).to_string().as_bytes()).unwrap();
        assert_eq!((plan.policies[0].lease, plan.policies[0].cost), (5, 1));
        assert_refused(
            with(json!({"lease": 21})),
            "policies[0].lease",
            "between cost (1) and burst (20)",
        );
        assert_refused(
            with(json!({"algorithm": "fixed_window", "burst": null, "lease": 2})),
            "policies[0].lease",
            "does not apply to the fixed_window algorithm",
        );
    }

    #[test]
    fn rejects_bad_leases_and_failure_modes() {
        assert_refused(
            with_service(json!({"scope": "global", "lease": 21})),
            "policies[0].lease",
            "between cost (1) and burst (20)",
        );
        assert_refused(
            with_service(json!({"scope": "global", "cost": 2, "lease": 1})),
            "policies[0].lease",
            "between cost (2)",
        );
        let closed = json!({"scope": "global", "failure_mode": "closed", "emergency": {"requests": 1, "per": "1s"}});
        assert_refused(
            with_service(closed),
            "policies[0].emergency",
            "fails closed",
        );
        assert_refused(
            with_service(json!({"scope": "global", "failure_mode": "maybe"})),
            "policies[0].failure_mode",
            "unknown variant",
        );
    }

    #[test]
    fn rejects_bad_service_settings() {
        let service = |s: Value| json!({"global": s, "policies": [policy()]});
        assert_refused(
            service(json!({"cluster": "", "authority": "a"})),
            "global.cluster",
            "Envoy cluster",
        );
        assert_refused(
            service(json!({"cluster": "c", "authority": "a", "timeout": "soon"})),
            "global.timeout",
            "unit",
        );
        assert_refused(
            service(json!({"cluster": "c", "authority": "a", "path": "check"})),
            "global.path",
            "start with '/'",
        );
        assert_refused(
            service(json!({"cluster": "c"})),
            "global",
            "missing field `authority`",
        );
    }

    #[test]
    fn every_algorithm_compiles_with_its_own_fields() {
        for (name, expected) in [
            (
                "fixed_window",
                Algorithm::FixedWindow {
                    limit: 100,
                    window: 60_000_000_000,
                },
            ),
            (
                "sliding_window",
                Algorithm::SlidingWindow {
                    limit: 100,
                    window: 60_000_000_000,
                },
            ),
            (
                "sliding_log",
                Algorithm::SlidingLog {
                    limit: 100,
                    window: 60_000_000_000,
                },
            ),
        ] {
            let mut fields = policy();
            fields.as_object_mut().unwrap().remove("burst");
            fields["algorithm"] = json!(name);
            let config = json!({"policies": [fields]});
            assert_eq!(
                parse(config.to_string().as_bytes()).unwrap().policies[0]
                    .tier
                    .algorithm,
                expected
            );
        }
        let mut fields = policy();
        fields.as_object_mut().unwrap().remove("burst");
        fields["algorithm"] = json!("leaky_bucket");
        fields["max_delay"] = json!("500ms");
        let plan = parse(json!({"policies": [fields]}).to_string().as_bytes()).unwrap();
        assert_eq!(
            plan.policies[0].tier.algorithm,
            Algorithm::LeakyBucket {
                interval: 600_000_000,
                max_delay: 500_000_000
            }
        );
    }

    #[test]
    fn fields_that_do_not_apply_to_an_algorithm_are_refused() {
        assert_refused(
            with(json!({"algorithm": "fixed_window"})),
            "policies[0].burst",
            "does not apply to the fixed_window algorithm",
        );
        assert_refused(
            with(json!({"max_delay": "1s"})),
            "policies[0].max_delay",
            "does not apply to the token_bucket algorithm",
        );
        let mut leaky = policy();
        leaky.as_object_mut().unwrap().remove("burst");
        leaky["algorithm"] = json!("leaky_bucket");
        assert_refused(
            json!({"policies": [leaky.clone()]}),
            "policies[0].max_delay",
            "needs the longest",
        );
        leaky["max_delay"] = json!("1s");
        leaky["scope"] = json!("global");
        leaky["lease"] = json!(2);
        let config = json!({"global": {"cluster": "c", "authority": "a"}, "policies": [leaky]});
        assert_refused(
            config,
            "policies[0].lease",
            "does not apply to the leaky_bucket algorithm",
        );
        assert_refused(
            with(json!({"algorithm": "gcra"})),
            "policies[0].algorithm",
            "unknown variant",
        );
    }

    #[test]
    fn a_sliding_log_is_capped_and_windows_need_room_for_the_cost() {
        let mut log = policy();
        log.as_object_mut().unwrap().remove("burst");
        log["algorithm"] = json!("sliding_log");
        log["requests"] = json!(MAX_SLIDING_LOG + 1);
        assert_refused(
            json!({"policies": [log.clone()]}),
            "policies[0].requests",
            "at most 1000",
        );
        log["requests"] = json!(2);
        log["cost"] = json!(3);
        assert_refused(
            json!({"policies": [log]}),
            "policies[0].requests",
            "must be >= cost (3)",
        );
    }

    #[test]
    fn a_sliding_log_keeps_a_word_per_request_of_its_largest_tier() {
        let mut log = policy();
        log.as_object_mut().unwrap().remove("burst");
        log["algorithm"] = json!("sliding_log");
        log["tiers"] =
            json!({"by": "header:x-plan", "values": {"pro": {"requests": 300, "per": "1m"}}});
        let plan = parse(json!({"policies": [log]}).to_string().as_bytes()).unwrap();
        assert_eq!(plan.policies[0].columns(), 300);
    }

    fn with_bypass(entry: Value) -> Value {
        json!({"policies": [policy()], "bypass": [entry]})
    }

    fn alice_bypass() -> Value {
        json!({"key": ["alice"], "policies": ["per-user"], "owner": "oncall@example.com",
            "reason": "INC-42", "expires": "2026-12-01T00:00:00Z"})
    }

    #[test]
    fn a_bypass_names_its_key_policies_owner_reason_and_expiry() {
        let plan = parse(with_bypass(alice_bypass()).to_string().as_bytes()).unwrap();
        let b = &plan.bypass[0];
        assert_eq!(
            (b.policy, b.owner.as_str(), b.reason.as_str()),
            (0, "oncall@example.com", "INC-42")
        );
        assert_eq!(b.key, crate::key::hash_values(&["alice".into()]));
        assert_eq!(b.expires, 1_796_083_200_000_000_000);
        let mut by_hash = alice_bypass();
        by_hash.as_object_mut().unwrap().remove("key");
        by_hash["key_hash"] = json!(format!("{:016x}", b.key));
        assert_eq!(
            parse(with_bypass(by_hash).to_string().as_bytes())
                .unwrap()
                .bypass,
            plan.bypass
        );
    }

    #[test]
    fn a_bypass_without_its_audit_trail_is_refused() {
        for field in ["owner", "reason", "expires", "policies"] {
            let mut entry = alice_bypass();
            entry.as_object_mut().unwrap().remove(field);
            assert_refused(
                with_bypass(entry),
                "bypass[0]",
                &format!("missing field `{field}`"),
            );
        }
        let mut entry = alice_bypass();
        entry["owner"] = json!(" ");
        assert_refused(with_bypass(entry), "bypass[0].owner", "audit trail");
        let mut entry = alice_bypass();
        entry["expires"] = json!("next week");
        assert_refused(with_bypass(entry), "bypass[0].expires", "RFC 3339");
        let mut entry = alice_bypass();
        entry["policies"] = json!(["nope"]);
        assert_refused(
            with_bypass(entry),
            "bypass[0].policies[0]",
            "no policy is named",
        );
        let mut entry = alice_bypass();
        entry["key"] = json!(["alice", "extra"]);
        assert_refused(with_bypass(entry), "bypass[0].key", "1 key parts");
        let mut entry = alice_bypass();
        entry["key_hash"] = json!("zz");
        assert_refused(
            with_bypass(entry),
            "bypass[0]",
            "exactly one of key or key_hash",
        );
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::arbitrary::any::<u8>(), 0..200)) {
            let _ = parse(&bytes);
        }
    }
}
