//! The configuration as users write it: the JSON format, read strictly (unknown fields are
//! refused everywhere). Defaults live here; meaning and validation live in `compile`.

use super::answer::{Api, GrpcStatus, HeaderStyle};
use super::{error, ConfigError};
use crate::core::algorithm::Kind;
use serde::Deserialize;
use std::collections::BTreeMap;

/// `max_keys` when a policy does not say.
pub const DEFAULT_MAX_KEYS: u32 = 10_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) version: Option<String>,
    pub(super) headers: Option<HeaderStyle>,
    pub(super) header_policies: Option<u64>,
    #[serde(default)]
    pub(super) policies: Vec<RawPolicy>,
    pub(super) default: Option<RawPolicy>,
    pub(super) global: Option<RawGlobal>,
    #[serde(default)]
    pub(super) bypass: Vec<RawBypass>,
    /// The environment variable that holds the operator's hash secret.
    pub(super) hash_secret_env: Option<String>,
    /// Whether the selected route's `filter_metadata.sluice` narrows or switches off the policies.
    #[serde(default)]
    pub(super) route_metadata: bool,
    /// How policies answer the requests they deny, unless they say otherwise.
    pub(super) denial: Option<RawDenial>,
    /// The API the routes speak, unless a policy says otherwise.
    pub(super) api: Option<Api>,
    /// The path at which the filter answers a client its own quota (off when absent).
    pub(super) status_path: Option<String>,
    /// The filter's own admin path for local policies (off when absent).
    pub(super) admin: Option<super::admin::RawAdmin>,
}

/// The answer to a denied request, each field falling back to the top-level `denial`, then to
/// the default (429, the JSON body, `RESOURCE_EXHAUSTED`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDenial {
    pub(super) status: Option<u32>,
    pub(super) body: Option<String>,
    pub(super) content_type: Option<String>,
    pub(super) grpc_status: Option<GrpcStatus>,
}

/// An audited exemption: who asked, why, and until when.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBypass {
    /// The key's value, one string per key part (each part's first alternative)...
    pub(super) key: Option<Vec<String>>,
    /// ...or its hash as the logs show it (16 hex digits).
    pub(super) key_hash: Option<String>,
    pub(super) policies: Vec<String>,
    pub(super) owner: String,
    pub(super) reason: String,
    pub(super) expires: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGlobal {
    #[serde(default)]
    pub(super) protocol: RawProtocol,
    pub(super) cluster: String,
    /// The `:authority` of the calls; the cluster's name when left out.
    pub(super) authority: Option<String>,
    /// sluice's protocol only: the path of the check.
    pub(super) path: Option<String>,
    /// The RLS protocol only: the domain of the limits.
    pub(super) domain: Option<String>,
    #[serde(default = "default_timeout")]
    pub(super) timeout: String,
    /// The environment variable that holds the service's bearer token.
    pub(super) token_env: Option<String>,
    /// The service's `--max-key-ttl`, when it runs with more than its default (62d).
    pub(super) max_key_ttl: Option<String>,
    /// Pull the service's overrides for the local policies.
    pub(super) overrides: Option<RawOverrides>,
}

/// `"overrides": {"every": "2s", "max": 10000}`: each field optional.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOverrides {
    pub(super) every: Option<String>,
    pub(super) max: Option<u64>,
    pub(super) path: Option<String>,
}

/// What the service speaks: sluice-service's `/v1/check`, or Envoy's Rate Limit Service.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawProtocol {
    #[default]
    Sluice,
    Rls,
}

/// The path of `POST /v1/check` when `global.path` does not say.
pub(super) const DEFAULT_CHECK_PATH: &str = "/v1/check";

fn default_timeout() -> String {
    "50ms".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPolicy {
    pub(super) name: String,
    #[serde(rename = "match")]
    pub(super) matcher: Option<RawMatch>,
    pub(super) key: Vec<String>,
    #[serde(default)]
    pub(super) missing_key: RawMissingKey,
    pub(super) requests: u64,
    /// Required, except by the concurrency algorithm, which has no window.
    pub(super) per: Option<String>,
    pub(super) burst: Option<u64>,
    #[serde(default)]
    pub(super) cost: RawCost,
    #[serde(default)]
    pub(super) mode: RawMode,
    pub(super) tiers: Option<RawTiers>,
    #[serde(default = "default_max_keys")]
    pub(super) max_keys: u32,
    #[serde(default)]
    pub(super) algorithm: Kind,
    pub(super) max_delay: Option<String>,
    #[serde(default)]
    pub(super) scope: RawScope,
    pub(super) failure_mode: Option<RawFailureMode>,
    pub(super) lease: Option<RawLease>,
    /// The concurrency algorithm only: the `Retry-After` of its refusals.
    pub(super) retry_after: Option<String>,
    pub(super) emergency: Option<RawRate>,
    pub(super) denial: Option<RawDenial>,
    /// The API this policy's route speaks: its refusals and headers in that provider's shape.
    pub(super) api: Option<Api>,
    pub(super) rollout: Option<RawRollout>,
    /// A fixed window's periods on a calendar: `per` is then `1d`, `1w`, `1mo` or `1y`.
    pub(super) calendar: Option<RawCalendar>,
}

/// `"calendar": {"timezone": "Europe/Berlin", "starts": {...}}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCalendar {
    pub(super) timezone: String,
    pub(super) starts: Option<RawStarts>,
}

/// Where a calendar period starts; each field applies to some units only (`calendar.rs`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStarts {
    pub(super) month: Option<u8>,
    pub(super) day: Option<u8>,
    pub(super) weekday: Option<String>,
    pub(super) time: Option<String>,
}

/// A policy's `cost`: tokens a request takes, or an object saying how to read them from the
/// response (`compile::metered` reads it, so that its errors name the member at fault).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub(super) enum RawCost {
    Tokens(u64),
    Metered(serde_json::Value),
}

impl Default for RawCost {
    fn default() -> RawCost {
        RawCost::Tokens(1)
    }
}

/// `"cost": {"from_response": ...}`: the cost read from the response, reserved before it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMetered {
    /// Required, unless `price` makes the policy a spend budget.
    pub(super) from_response: Option<RawFromResponse>,
    /// A spend budget: the body's usage priced by model, `{"MODEL-or-glob": PRICE}`.
    pub(super) price: Option<serde_json::Value>,
    /// A spend budget's unpriced models: `"refuse"`, `"free"` or `{"price": PRICE}`.
    pub(super) unknown_model: Option<serde_json::Value>,
    /// Tokens reserved at admission: a number, or `{"request": "max_tokens", "default": N}`.
    pub(super) reserve: Option<serde_json::Value>,
    pub(super) max_debt: Option<u64>,
    /// `"reserve"`, or a number of tokens to charge when the usage never comes.
    pub(super) on_unknown: Option<serde_json::Value>,
    #[serde(default)]
    pub(super) ask_stream_usage: bool,
}

/// Where the usage is read: a count (or weights) of the body's usage, or a header or trailer.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFromResponse {
    pub(super) usage: Option<serde_json::Value>,
    pub(super) header: Option<String>,
}

/// `"reserve": {"request": "max_tokens", "default": N}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReserveFromRequest {
    pub(super) request: String,
    pub(super) default: u64,
}

/// A policy's `lease`: tokens taken at a time by a rate policy, or how long a concurrency
/// policy's slot lives unless renewed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub(super) enum RawLease {
    Tokens(u64),
    Duration(String),
}

/// Canary enforcement: the policy enforces for this share of its keys, shadow for the rest.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRollout {
    pub(super) enforce_percent: f64,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawScope {
    #[default]
    Local,
    Global,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawFailureMode {
    Open,
    Closed,
}

fn default_max_keys() -> u32 {
    DEFAULT_MAX_KEYS
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawMissingKey {
    #[default]
    Skip,
    Shared,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawMode {
    #[default]
    Enforce,
    Shadow,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMatch {
    pub(super) path_prefix: Option<String>,
    pub(super) path_exact: Option<String>,
    pub(super) methods: Option<Vec<String>>,
    #[serde(default)]
    pub(super) headers: Vec<RawHeaderCondition>,
    pub(super) routes: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHeaderCondition {
    pub(super) name: String,
    pub(super) present: Option<bool>,
    pub(super) equals: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTiers {
    pub(super) by: String,
    pub(super) values: BTreeMap<String, RawRate>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRate {
    pub(super) requests: u64,
    pub(super) per: Option<String>,
    pub(super) burst: Option<u64>,
}

/// Reads the JSON document; an error names the path of the field at fault.
pub(super) fn read(json: &[u8]) -> Result<RawConfig, ConfigError> {
    let mut deserializer = serde_json::Deserializer::from_slice(json);
    serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        let field = e.path().to_string();
        let field = if field == "." {
            "configuration".into()
        } else {
            field
        };
        error(field, e.inner().to_string())
    })
}
