//! The compiled configuration: what a policy is at run time. Built once by `compile`, read by
//! every request; nothing here parses or validates.

use super::answer::{Denial, HeaderStyle};
use crate::core::algorithm::{Algorithm, Window};
use crate::core::key::{HashSecret, KeyPart};
use crate::core::matcher::Matcher;
use crate::core::request::{Attr, Attributes, RequestSource};
use crate::wire::protocol::{self, Check, WireCalendar};
use std::collections::HashMap;
use std::ops::Range;

/// The compiled configuration.
#[derive(Debug, Clone)]
pub struct Plan {
    pub version: String,
    /// `None` when the configuration does not say: `legacy`, but none beside a provider's own
    /// (a policy's `api`), which say the same.
    pub headers: Option<HeaderStyle>,
    /// The most policies the draft `RateLimit` and `RateLimit-Policy` fields list (1: the one
    /// with the fewest left).
    pub header_policies: usize,
    /// Every request attribute some policy reads, each once.
    pub attrs: Vec<Attr>,
    pub policies: Vec<Policy>,
    pub tables: Vec<crate::state::table::TableSpec>,
    pub global: Option<GlobalService>,
    pub bypass: Vec<Bypass>,
    /// The operator's secret for key hashes (`hash_secret_env`), if any.
    pub hash_secret: Option<HashSecret>,
    /// The attribute holding the selected route's sluice metadata (`route_metadata`), if read.
    pub route_metadata: Option<usize>,
    /// Some policy reads the request body (`body:` key parts, a reservation from `max_tokens`,
    /// `ask_stream_usage`): a request with a body is decided once it has come (`BODY_BYTES`).
    pub reads_body: bool,
    /// The path the filter answers itself with the client's own quota (`status_path`), if on.
    pub status_path: Option<String>,
    /// The filter's own admin path (`admin`), if on.
    pub admin: Option<super::admin::AdminPath>,
}

impl Plan {
    /// Whether `policy` reads the request body: a key part from it, a reservation from
    /// `max_tokens`, or `ask_stream_usage`.
    pub fn policy_reads_body(&self, policy: &Policy) -> bool {
        let is_body = |source: &crate::core::key::Source| match source {
            crate::core::key::Source::Attr(i) => matches!(self.attrs.get(*i), Some(Attr::Body(_))),
            crate::core::key::Source::Global => false,
        };
        let keyed = self.tables.get(policy.table).is_some_and(|table| {
            let mut sources = table.key.iter().flat_map(|part| &part.alternatives);
            sources.any(is_body)
        });
        let metered = policy.metered.as_ref().is_some_and(|m| {
            m.ask_stream_usage
                || matches!(m.reserve, Reserve::MaxOutputTokens { .. })
                || matches!(m.source, UsageSource::Priced { .. })
        });
        keyed || metered
    }

    /// The policy named `name`.
    pub fn policy_index(&self, name: &[u8]) -> Option<usize> {
        self.policies.iter().position(|p| p.name.as_bytes() == name)
    }

    /// The exemption of `key` from `policy`, expired or not.
    pub fn bypass_of(&self, policy: usize, key: u64) -> Option<(usize, &Bypass)> {
        self.bypass
            .iter()
            .enumerate()
            .find(|(_, b)| b.policy == policy && b.key == key)
    }
}

/// A compiled policy. `table` and `words` say where its state lives in the key's slot.
#[derive(Debug, Clone)]
pub struct Policy {
    pub name: String,
    pub matcher: Matcher,
    /// The `default` policy: applies only when no other policy matched.
    pub fallback: bool,
    pub shadow: bool,
    /// Canary enforcement: enforcing for a share of the keys only.
    pub rollout: Option<Rollout>,
    pub share_missing_key: bool,
    /// Tokens a request takes: the fixed cost, or a metered policy's reservation when the
    /// request does not say more (`Metered::reserve`).
    pub cost: u64,
    /// The cost read from the response, if the policy's is (`"cost": {"from_response": ...}`).
    pub metered: Option<Metered>,
    /// Tokens taken at a time (the `lease` field, else the cost): per visit to a local bucket,
    /// the rest lent to this worker (see `ledger`); per call to the service, the rest granted
    /// to this Envoy (see `limiter::global`).
    pub take: u64,
    pub tier: Tier,
    pub tiers: Option<Tiers>,
    pub scope: Scope,
    /// How the policy answers the requests it denies.
    pub denial: Denial,
    /// The concurrency algorithm's `Retry-After`, if the policy sets one.
    pub retry_after: Option<u64>,
    pub table: usize,
    /// Its words of the slot's state (`columns()` of them), placed once for every request.
    pub words: Range<usize>,
}

/// A policy's cost read from the response: a reservation at admission, settled against the usage
/// when the response ends (`tab`, `response`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metered {
    pub source: UsageSource,
    pub reserve: Reserve,
    /// Tokens a key may owe past its limit; `None`: the capacity of the limit it runs at.
    pub max_debt: Option<u64>,
    pub on_unknown: OnUnknown,
    /// Rewrite a streaming request that does not ask for its usage so that it does.
    pub ask_stream_usage: bool,
}

impl Metered {
    /// The debt a key may run up under `tier`.
    pub fn max_debt(&self, tier: &Tier) -> u64 {
        self.max_debt.unwrap_or(tier.algorithm.capacity())
    }

    /// What a request reserves under `tier`: the fixed reservation, or what its body asks at
    /// most, priced by the meter (a spend budget's: by the price of the model it names, else the
    /// dearest, `Pricing::reservation`) and capped at the limit's capacity (more could never
    /// pass).
    pub fn reservation<R: RequestSource + ?Sized>(
        &self,
        tier: &Tier,
        request: &mut Attributes<R>,
    ) -> u64 {
        match self.reserve {
            Reserve::Tokens(tokens) => tokens,
            Reserve::MaxOutputTokens { default, attr } => {
                let asked = request
                    .get(attr)
                    .and_then(crate::core::usage::count_from_header);
                let priced = match (&self.source, asked) {
                    (UsageSource::Body(meter), Some(tokens)) => meter.output_cost(tokens),
                    (UsageSource::Priced { pricing, model }, Some(tokens)) => {
                        pricing.reservation(request.get(*model), tokens)
                    }
                    (_, Some(tokens)) => tokens,
                    (_, None) => default,
                };
                priced.min(tier.algorithm.capacity())
            }
        }
    }
}

/// Which tokens a token budget counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenSide {
    /// Input tokens only (`input_tokens`, or weights of the input's kinds alone).
    Input,
    /// Output tokens only.
    Output,
    /// Both, or a count from a header, whose kind nobody knows.
    Both,
}

/// Where a response's usage is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UsageSource {
    /// The usage object of the body (JSON or server-sent events), as `Meter` prices it.
    Body(crate::core::usage::Meter),
    /// A count in this response header or trailer (lower case).
    Header(String),
    /// A spend budget: the body's usage priced by the model that served it (`usage::price`),
    /// in micro-units of the currency. `model` is the attribute of the request body's `model`.
    Priced {
        pricing: crate::core::usage::price::Pricing,
        model: usize,
    },
}

impl UsageSource {
    /// Whether the usage is read from the response body.
    pub fn reads_body(&self) -> bool {
        !matches!(self, UsageSource::Header(_))
    }

    /// A spend budget's prices and the attribute of the model its requests name.
    pub fn pricing(&self) -> Option<(&crate::core::usage::price::Pricing, usize)> {
        match self {
            UsageSource::Priced { pricing, model } => Some((pricing, *model)),
            _ => None,
        }
    }
}

/// What a request reserves at admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserve {
    Tokens(u64),
    /// What the request body asks for at most (`max_tokens`...: the attribute `attr`), priced
    /// by the meter and capped by the limit's capacity; `default` when it does not say.
    MaxOutputTokens {
        default: u64,
        attr: usize,
    },
}

impl Reserve {
    /// The least a request of the policy reserves when its body does not say: what its limits
    /// must hold.
    pub fn at_least(&self) -> u64 {
        match *self {
            Reserve::Tokens(tokens)
            | Reserve::MaxOutputTokens {
                default: tokens, ..
            } => tokens,
        }
    }
}

/// What a response whose usage never comes (aborted, failed, unreadable) is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnUnknown {
    /// As much as the key can owe: its capacity and its debt (the default). No call whose usage
    /// is read could cost the key more, so hiding the usage never costs a client less.
    Max,
    /// Its reservation stays charged.
    Reserve,
    Tokens(u64),
}

/// Words a global policy keeps per key before its emergency state: the tokens the service
/// granted this Envoy, when they lapse, until when the key is over its limit, and the remaining
/// and time to full the service last reported (what a request paid from the grant reports).
pub const GLOBAL_COLUMNS: usize = 5;

impl Policy {
    /// The limit run while the service cannot answer, if the policy fails open to one of its own
    /// (`None` in a fail-open policy: the request's tier).
    pub fn emergency(&self) -> Option<Tier> {
        match self.scope {
            Scope::Global(OnFailure::Open { emergency }) => emergency,
            _ => None,
        }
    }

    /// The limits a request can run at: the policy's own and its tiers'.
    pub fn own_limits(&self) -> impl Iterator<Item = Tier> + '_ {
        let tiers = self.tiers.iter().flat_map(|t| t.values.values().copied());
        [self.tier].into_iter().chain(tiers)
    }

    /// Every limit the policy can run at: its own, its tiers', its emergency budget.
    pub fn limits(&self) -> impl Iterator<Item = Tier> + '_ {
        self.own_limits().chain(self.emergency())
    }

    /// Words of state per key: the algorithm's (for the largest of its limits), and for a
    /// global policy the grant and over-limit marks besides.
    pub fn columns(&self) -> usize {
        let local = self.limits().map(|t| t.algorithm.columns()).max();
        local.unwrap_or(1)
            + match self.scope {
                Scope::Local => 0,
                Scope::Global(_) => GLOBAL_COLUMNS,
            }
    }

    /// The tier this request runs at: the one its tier key names, else the policy's own.
    pub fn tier_of<R: RequestSource + ?Sized>(&self, request: &mut Attributes<R>) -> Tier {
        self.tiers
            .as_ref()
            .and_then(|tiers| tiers.select(request))
            .unwrap_or(self.tier)
    }
}

impl Policy {
    /// Whether the policy is decided by an RLS (Envoy's protocol) rather than sluice-service.
    pub fn asks_rls(&self, service: Option<&GlobalService>) -> bool {
        let rls = |s: &GlobalService| matches!(s.protocol, Protocol::Rls { .. });
        matches!(self.scope, Scope::Global(_)) && service.is_some_and(rls)
    }

    /// Whether the policy rewrites a streaming request to ask for its usage (`ask_stream_usage`).
    pub fn asks_stream_usage(&self) -> bool {
        self.metered.as_ref().is_some_and(|m| m.ask_stream_usage)
    }

    /// Which tokens a token budget counts, for Anthropic's input and output token headers:
    /// `None` for any other policy (a spend budget counts money).
    pub fn token_side(&self) -> Option<TokenSide> {
        use crate::core::usage::{Count, Meter};
        let metered = self.metered.as_ref()?;
        Some(match &metered.source {
            UsageSource::Priced { .. } => return None,
            UsageSource::Header(_) => TokenSide::Both,
            UsageSource::Body(Meter::Count(Count::Input)) => TokenSide::Input,
            UsageSource::Body(Meter::Count(Count::Output)) => TokenSide::Output,
            UsageSource::Body(Meter::Count(_)) => TokenSide::Both,
            UsageSource::Body(Meter::Weighted(w)) => {
                let input = w.input.max(w.cache_read).max(w.cache_write) > 0;
                let output = w.output.max(w.reasoning) > 0;
                match (input, output) {
                    (true, false) => TokenSide::Input,
                    (false, true) => TokenSide::Output,
                    _ => TokenSide::Both,
                }
            }
        })
    }

    /// Whether the policy reads its cost from the usage in response bodies.
    pub fn meters_bodies(&self) -> bool {
        let metered = self.metered.as_ref();
        metered.is_some_and(|m| m.source.reads_body())
    }

    /// Whether the policy counts requests in flight (the concurrency algorithm): its slots are
    /// given back when its requests end.
    pub fn holds_slots(&self) -> bool {
        matches!(self.tier.algorithm, Algorithm::Concurrency(_))
    }

    /// Whether the policy enforces for the key (its shared hash, which a table with a rollout
    /// always has: see `TableSpec::shares_key`): not a shadow policy, and the key within its
    /// rollout's share, if it has one. Otherwise it runs in shadow for the key.
    pub fn enforces(&self, key: Option<u64>) -> bool {
        !self.shadow
            && self
                .rollout
                .is_none_or(|r| key.is_some_and(|key| r.covers(key)))
    }
}

/// A rollout: the policy enforces for the keys whose rollout position (`key::rollout_position`,
/// stable wherever the key is hashed) falls under this many millionths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rollout {
    pub enforce_per_million: u32,
}

impl Rollout {
    pub fn covers(&self, key: u64) -> bool {
        crate::core::key::rollout_position(key) < self.enforce_per_million
    }
}

/// One limit a policy can run at: the policy's own, or a tier's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tier {
    pub algorithm: Algorithm,
    pub requests: u64,
    pub per_nanos: u64,
}

/// Per-tier limits, chosen by the value of a key part.
#[derive(Debug, Clone)]
pub struct Tiers {
    pub by: KeyPart,
    pub values: HashMap<Vec<u8>, Tier>,
}

impl Tiers {
    fn select<R: RequestSource + ?Sized>(&self, request: &mut Attributes<R>) -> Option<Tier> {
        let (_, value) = self.by.resolve(request)?;
        self.values.get(value).copied()
    }
}

/// Where a policy is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// By its bucket in this Envoy's shared data.
    Local,
    /// By the rate-limit service, for every Envoy; and this when the service cannot answer.
    Global(OnFailure),
}

/// What a global policy does while the service cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    /// Enforce a limit locally: `emergency`, or the request's own tier when `None`.
    Open { emergency: Option<Tier> },
    /// Answer 503.
    Closed,
}

/// Where and how the rate-limit service is called, from the top-level `global` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalService {
    pub cluster: String,
    pub authority: String,
    pub timeout_ms: u64,
    /// The `authorization` header's value (`Bearer <token>`), when the service requires a token.
    pub authorization: Option<Secret>,
    pub protocol: Protocol,
    /// The longest sluice-service keeps a key (its `--max-key-ttl`, `global.max_key_ttl`): a
    /// global policy whose key would live longer is refused here, as the service would refuse
    /// its checks or charges.
    pub max_key_ttl_ms: u64,
    /// Pull sluice-service's overrides into shared data, for the local policies
    /// (`global.overrides`); `None`: off.
    pub overrides: Option<OverridesSync>,
}

/// How the overrides are pulled (`global.overrides`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverridesSync {
    /// Nanoseconds between pulls.
    pub every: u64,
    /// The most overrides of this configuration's local policies held: a listing of more is
    /// refused whole, and the last one stays in force.
    pub max: usize,
    /// The listing's path on the service.
    pub path: String,
}

/// What the service speaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Protocol {
    /// sluice-service's `POST /v1/check` (JSON), at this path.
    Sluice { path: String },
    /// Envoy's Rate Limit Service, `ShouldRateLimit` over gRPC (`rls`), asking about `domain`.
    Rls {
        domain: String,
        /// The cluster as the host's gRPC call takes it (`rls::grpc_service`), made once.
        grpc_service: Vec<u8>,
    },
}

impl Protocol {
    /// Where settlements go (`outbox`): the check's path with `settle` for its last segment
    /// (`/v1/check` → `/v1/settle`). An RLS takes none.
    pub fn settle_path(&self) -> Option<String> {
        let Protocol::Sluice { path } = self else {
            return None;
        };
        let base = path.rsplit_once('/').map_or("", |(base, _)| base);
        Some(format!("{base}/settle"))
    }
}

/// A value that must never reach a log: its `Debug` shows only that it is there.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Secret {
        Secret(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
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

/// A check of one request on the key `key` (a shared hash) of `policy` under `tier`: the key and
/// limit that every check and settlement of that key names, as the service counts them.
pub fn key_check(policy: &Policy, tier: &Tier, key: u64) -> Check {
    let algorithm = tier.algorithm;
    Check {
        key: protocol::key(&policy.name, key),
        algorithm: algorithm.kind(),
        requests: tier.requests,
        per_ms: protocol::per_ms(tier.per_nanos),
        burst: algorithm.capacity(),
        cost: 1,
        take: None,
        max_delay_ms: algorithm.max_delay().map(protocol::per_ms),
        slot: None,
        calendar: match algorithm {
            Algorithm::FixedWindow(Window {
                calendar: Some(calendar),
                ..
            }) => WireCalendar::of(&calendar),
            _ => None,
        },
        entries: Vec::new(),
    }
}
