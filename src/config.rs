//! The plugin configuration: parsed strictly once, then compiled into the `Plan` that every
//! request reads. Any error names the field and the reason; nothing half-valid gets through.

use crate::duration::{ceil_secs, parse_nanos};
use crate::gcra::Rate;
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    version: Option<String>,
    #[serde(default)]
    headers: HeaderStyle,
    #[serde(default)]
    policies: Vec<RawPolicy>,
    default: Option<RawPolicy>,
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

/// One rate a policy can run at: the policy's own, or a tier's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tier {
    pub rate: Rate,
    pub requests: u64,
    pub window_secs: u64,
}

/// A compiled policy. `table` and `column` say where its bucket lives.
#[derive(Debug, Clone)]
pub struct Policy {
    pub name: String,
    pub matcher: Matcher,
    /// The `default` policy: applies only when no other policy matched.
    pub fallback: bool,
    pub shadow: bool,
    pub share_missing_key: bool,
    pub cost: u64,
    pub tier: Tier,
    pub tiers: Option<(KeyPart, HashMap<Vec<u8>, Tier>)>,
    pub table: usize,
    pub column: usize,
}

/// A shared-data table: one bounded set of slots for all policies with the same key. Each slot
/// holds one key's buckets for all of them, so they cost one read and one CAS together.
#[derive(Debug, Clone)]
pub struct TableSpec {
    pub key: Vec<KeyPart>,
    pub capacity: u32,
    /// Number of policies (buckets) per slot.
    pub width: usize,
    /// Changes whenever the slot layout does, so a new layout never reads an old one's slots.
    pub layout_id: u64,
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
    tables: Vec<(Vec<KeyPart>, Vec<String>, u32)>,
}

impl Compiler {
    fn compile(mut self, raw: RawConfig) -> Result<Plan, ConfigError> {
        if raw.policies.is_empty() && raw.default.is_none() {
            return Err(error(
                "policies",
                "at least one policy (or a default) is required",
            ));
        }
        let mut policies = Vec::with_capacity(raw.policies.len() + 1);
        for (i, policy) in raw.policies.iter().enumerate() {
            policies.push(self.policy(&format!("policies[{i}]"), policy, false)?);
        }
        if let Some(default) = &raw.default {
            if default.matcher.is_some() {
                return Err(error(
                    "default.match",
                    "the default policy applies when no policy matches, so it takes no match",
                ));
            }
            policies.push(self.policy("default", default, true)?);
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
        let attrs = self.attrs;
        let tables = self
            .tables
            .into_iter()
            .map(|(key, names, capacity)| TableSpec {
                layout_id: layout_id(&key, &names, &attrs),
                width: names.len(),
                key,
                capacity,
            })
            .collect();
        Ok(Plan {
            version: raw.version.unwrap_or_else(|| "unversioned".into()),
            headers: raw.headers,
            attrs,
            policies,
            tables,
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

    fn policy(&mut self, at: &str, raw: &RawPolicy, fallback: bool) -> Result<Policy, ConfigError> {
        if !is_policy_name(&raw.name) {
            return Err(error(
                format!("{at}.name"),
                "must be 1-64 characters of A-Z, a-z, 0-9, '_', '-', '.'",
            ));
        }
        if raw.cost == 0 {
            return Err(error(format!("{at}.cost"), "must be at least 1"));
        }
        let tier = tier(at, raw.requests, &raw.per, raw.burst, raw.cost)?;
        let tiers = match &raw.tiers {
            Some(t) => Some(self.tiers(&format!("{at}.tiers"), t, raw.cost)?),
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
        let (table, column) = self.place(key, &raw.name, raw.max_keys);
        Ok(Policy {
            name: raw.name.clone(),
            matcher,
            fallback,
            shadow: raw.mode == Mode::Shadow,
            share_missing_key: raw.missing_key == MissingKey::Shared,
            cost: raw.cost,
            tier,
            tiers,
            table,
            column,
        })
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

    /// The table for this key (shared with earlier policies of the same key) and the column.
    fn place(&mut self, key: Vec<KeyPart>, name: &str, max_keys: u32) -> (usize, usize) {
        if let Some(index) = self.tables.iter().position(|(k, _, _)| *k == key) {
            if let Some((_, names, capacity)) = self.tables.get_mut(index) {
                names.push(name.to_string());
                *capacity = (*capacity).max(max_keys);
                return (index, names.len() - 1);
            }
        }
        self.tables.push((key, vec![name.to_string()], max_keys));
        (self.tables.len() - 1, 0)
    }

    fn tiers(
        &mut self,
        at: &str,
        raw: &RawTiers,
        cost: u64,
    ) -> Result<(KeyPart, HashMap<Vec<u8>, Tier>), ConfigError> {
        let by = parse_part(&raw.by, &mut |a| self.intern(a))
            .map_err(|r| error(format!("{at}.by"), r))?;
        let mut values = HashMap::new();
        for (value, rate) in &raw.values {
            let field = format!("{at}.values.{value}");
            values.insert(
                value.as_bytes().to_vec(),
                tier(&field, rate.requests, &rate.per, rate.burst, cost)?,
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

fn tier(
    at: &str,
    requests: u64,
    per: &str,
    burst: Option<u64>,
    cost: u64,
) -> Result<Tier, ConfigError> {
    if requests == 0 {
        return Err(error(format!("{at}.requests"), "must be at least 1"));
    }
    let per_nanos = parse_nanos(per).map_err(|r| error(format!("{at}.per"), r))?;
    let burst = burst.unwrap_or(requests);
    if burst < cost {
        return Err(error(
            format!("{at}.burst"),
            format!("must be >= cost ({cost})"),
        ));
    }
    let rate = Rate::new(requests, per_nanos, burst).ok_or_else(|| {
        error(
            format!("{at}.requests"),
            "rate out of range: more than one request per nanosecond, or a bucket that takes over a century to fill",
        )
    })?;
    Ok(Tier {
        rate,
        requests,
        window_secs: ceil_secs(per_nanos),
    })
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

/// Hashes what the key reads (not where the plan happens to index it) and the policy names.
fn layout_id(key: &[KeyPart], names: &[String], attrs: &[Attr]) -> u64 {
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
    names.hash(&mut hasher);
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
        assert_eq!(p.tier.rate, Rate::new(100, 60_000_000_000, 20).unwrap());
        assert_eq!((p.tier.requests, p.tier.window_secs), (100, 60));
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
        assert_eq!(plan.policies[0].tier.rate.burst, 7);
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

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::arbitrary::any::<u8>(), 0..200)) {
            let _ = parse(&bytes);
        }
    }
}
