//! envoyproxy/ratelimit's configuration files, read strictly into a tree per domain.
//!
//! One YAML file holds one `domain` and its `descriptors`, nested to any depth, each with a
//! `key`, an optional `value` (absent: every value gets its own counters; `*` matches any run of
//! characters) and an optional `rate_limit`. Every key envoyproxy/ratelimit accepts is accepted
//! and means the same; sluice adds `algorithm`, `burst`, `per`, `max_delay`, `lease` and
//! `charge_refused` to `rate_limit`, and lets a descriptor repeat at one level: its limits and children then add up (a burst and a
//! sustained limit on one descriptor) where envoyproxy/ratelimit refuses a "duplicate composite
//! key". Errors name the file, the line and the field (`ConfigError`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sluice::core::duration::parse_nanos;

use crate::decision::check::{interval_us, Bounds, Shape};
use crate::stores::Algorithm;
use sluice::core::algorithm::Kind;

/// Every domain of every file, ready for matching, and the bounds they were checked against.
#[derive(Debug, Default)]
pub struct Config {
    domains: HashMap<String, Node>,
    pub bounds: Bounds,
}

/// A level of descriptors: the root of a domain, or a descriptor with what is nested in it.
#[derive(Debug, Default)]
pub struct Node {
    /// Children by `key` (no value: any value) or `key_value`, as envoyproxy/ratelimit looks
    /// them up; a wildcard child is also listed in `wildcards`.
    pub children: HashMap<String, Node>,
    /// The children whose `key_value` holds `*`, in file order (the first match wins).
    pub wildcards: Vec<Wildcard>,
    pub limits: Vec<Limit>,
    /// This node's part of a metrics label: `key`, `key_value` or `key_<pattern>`.
    pub label: String,
    /// The path of labels from the domain down, `.`-joined: the metrics label of its limits.
    pub path: String,
    /// `share_threshold`: every value this wildcard matches shares one counter.
    pub share_threshold: bool,
    /// `value_to_metric`: the request's value goes into the metrics label.
    pub value_to_metric: bool,
}

/// A wildcard child: its `key_value` split at each `*`.
#[derive(Debug)]
pub struct Wildcard {
    pub key_value: String,
    pub parts: Vec<String>,
}

impl Wildcard {
    /// Whether `text` is the parts in order with anything (or nothing) at each `*`.
    pub fn matches(&self, text: &str) -> bool {
        let (Some(first), Some(last)) = (self.parts.first(), self.parts.last()) else {
            return false;
        };
        if self.parts.len() == 1 {
            return text == first;
        }
        let fixed: usize = self.parts.iter().map(String::len).sum();
        if text.len() < fixed || !text.starts_with(first.as_str()) || !text.ends_with(last.as_str())
        {
            return false;
        }
        let mut rest = text.get(first.len()..text.len() - last.len()).unwrap_or("");
        for middle in self.parts.iter().skip(1).take(self.parts.len() - 2) {
            match rest.find(middle.as_str()) {
                Some(at) => rest = rest.get(at + middle.len()..).unwrap_or(""),
                None => return false,
            }
        }
        true
    }
}

/// One `rate_limit` of a descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub rule: Rule,
    /// `name`: what `replaces` refers to.
    pub name: Option<String>,
    /// `replaces`: the names of the limits this one drops from a request it applies to.
    pub replaces: Vec<String>,
    pub shadow_mode: bool,
    pub quota_mode: bool,
    pub detailed_metric: bool,
    /// `charge_refused` (default true): a refused request's hits are counted too, the key owing
    /// up to one limit's worth past it, as envoyproxy/ratelimit counts every hit (`debt`).
    pub charge_refused: bool,
    /// The metrics label: the node's path, with `#2`, `#3`, ... for a node's later limits.
    pub label: String,
    /// A name fit for the draft `RateLimit` headers (`[A-Za-z0-9_.-]`, from the configuration,
    /// never from a request): `name` if it is one, else the label with other characters as `_`.
    pub policy: String,
    /// Tells this limit's counters from the node's other limits' in the store key (which also
    /// holds the algorithm and its numbers, `store::state_key`): `<n>`, the limits before it on
    /// the node with the same algorithm and numbers, so adding a limit moves no other limit's
    /// counters.
    pub identity: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// `unlimited: true`: never limited, never counted in the store.
    Unlimited,
    Limited(Rate),
}

/// What a limited rule allows, in the store's terms and in the protocol's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rate {
    pub algorithm: Algorithm,
    /// `requests_per_unit`: 0 refuses everything (envoyproxy/ratelimit's block list).
    pub requests: u32,
    pub window_ms: u64,
    /// The protocol's unit for `current_limit`: the `unit`, or a `per` of exactly one unit;
    /// `Unknown` for other windows.
    pub unit: Unit,
}

impl Rate {
    /// An operator's override (`/admin/v1/overrides`) of `requests` per `per_ms` (a
    /// concurrency limit's lease), already validated into `algorithm`.
    pub fn overridden(algorithm: Algorithm, requests: u64, per_ms: u64) -> Rate {
        let unit = match algorithm {
            Algorithm::Concurrency { .. } => Unit::Unknown,
            _ => Unit::of_window(per_ms),
        };
        Rate {
            algorithm,
            requests: u32::try_from(requests).unwrap_or(u32::MAX),
            window_ms: per_ms,
            unit,
        }
    }

    /// The most a request can ever get: the bucket, the window's limit, the queue.
    pub fn capacity(&self) -> u64 {
        self.algorithm.capacity()
    }

    /// The most tokens a key may owe past this limit (`store::Check::debt`): one limit's worth
    /// when refused hits are charged, so a key is at most one more window or bucket behind; a
    /// leaky bucket and slots never owe.
    pub fn debt(&self, charge_refused: bool) -> u64 {
        match self.algorithm {
            Algorithm::LeakyBucket { .. } | Algorithm::Concurrency { .. } => 0,
            _ if charge_refused => self.capacity(),
            _ => 0,
        }
    }
}

/// envoyproxy/ratelimit's units; a month is 30 days and a year 365, windows aligned to the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Unknown,
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

const UNITS: [(Unit, &str, u64); 7] = [
    (Unit::Second, "second", 1_000),
    (Unit::Minute, "minute", 60_000),
    (Unit::Hour, "hour", 3_600_000),
    (Unit::Day, "day", 86_400_000),
    (Unit::Week, "week", 604_800_000),
    (Unit::Month, "month", 2_592_000_000),
    (Unit::Year, "year", 31_536_000_000),
];

impl Unit {
    fn parse(name: &str) -> Option<(Unit, u64)> {
        let name = name.to_ascii_lowercase();
        UNITS
            .iter()
            .find(|(_, unit_name, _)| *unit_name == name)
            .map(|&(unit, _, ms)| (unit, ms))
    }

    fn of_window(window_ms: u64) -> Unit {
        UNITS
            .iter()
            .find(|(_, _, ms)| *ms == window_ms)
            .map_or(Unit::Unknown, |&(unit, _, _)| unit)
    }

    /// The length of a window of this unit (`Unknown`: none).
    pub fn window_ms(self) -> Option<u64> {
        UNITS
            .iter()
            .find(|(unit, _, _)| *unit == self)
            .map(|&(_, _, ms)| ms)
    }
}

/// Configuration files as read: each path with its contents.
pub type Files = Vec<(PathBuf, String)>;

/// A refused file: where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based; 0 when the file could not be read at all.
    pub line: usize,
    pub reason: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.reason)
    }
}

impl Config {
    /// The root of a domain's descriptors.
    pub fn domain(&self, name: &str) -> Option<&Node> {
        self.domains.get(name)
    }

    pub fn domain_count(&self) -> usize {
        self.domains.len()
    }

    /// The domains, in no order.
    pub fn domain_names(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    /// Builds the configuration from `(file, contents)` pairs: all or nothing, every error found.
    /// Every limit is checked against `bounds`.
    pub fn from_files(
        files: &[(PathBuf, String)],
        bounds: &Bounds,
    ) -> Result<Config, Vec<ConfigError>> {
        let mut config = Config {
            bounds: *bounds,
            ..Config::default()
        };
        let mut errors = Vec::new();
        for (file, text) in files {
            match parse_file(file, text, bounds) {
                Ok((domain, _)) if config.domains.contains_key(&domain.name) => {
                    errors.push(ConfigError {
                        file: file.clone(),
                        line: domain.line,
                        reason: format!("duplicate domain '{}' in config file", domain.name),
                    });
                }
                Ok((domain, root)) => {
                    config.domains.insert(domain.name, root);
                }
                Err(error) => errors.push(error),
            }
        }
        if errors.is_empty() {
            Ok(config)
        } else {
            Err(errors)
        }
    }
}

/// The files a `--rls-config` path stands for: the file itself, or the `*.yaml` and `*.yml`
/// files of the directory (not its subdirectories, nor names starting with `.`, such as a
/// Kubernetes ConfigMap's `..data`), in name order.
pub fn config_files(path: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let unreadable = |error: std::io::Error| ConfigError {
        file: path.to_path_buf(),
        line: 0,
        reason: format!("cannot be read: {error}"),
    };
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(unreadable)? {
        let file = entry.map_err(unreadable)?.path();
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or(".");
        let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        if yaml && !name.starts_with('.') && file.is_file() {
            files.push(file);
        }
    }
    files.sort();
    Ok(files)
}

/// What tells a file's change without reading it: its path, length and modification time.
pub type Stamp = (PathBuf, u64, Option<std::time::SystemTime>);

/// The stamps of every file of `path` (`config_files`).
pub fn stamps(path: &Path) -> Result<Vec<Stamp>, ConfigError> {
    config_files(path)?
        .into_iter()
        .map(|file| match std::fs::metadata(&file) {
            Ok(meta) => Ok((file, meta.len(), meta.modified().ok())),
            Err(error) => Err(ConfigError {
                file,
                line: 0,
                reason: format!("cannot be read: {error}"),
            }),
        })
        .collect()
}

/// Reads every file of `path` (`config_files`).
pub fn read_files(path: &Path) -> Result<Files, ConfigError> {
    config_files(path)?
        .into_iter()
        .map(|file| match std::fs::read_to_string(&file) {
            Ok(text) => Ok((file, text)),
            Err(error) => Err(ConfigError {
                file,
                line: 0,
                reason: format!("cannot be read: {error}"),
            }),
        })
        .collect()
}

struct DomainName {
    name: String,
    line: usize,
}

fn parse_file(file: &Path, text: &str, bounds: &Bounds) -> Result<(DomainName, Node), ConfigError> {
    let error = |line: usize, reason: String| ConfigError {
        file: file.to_path_buf(),
        line,
        reason,
    };
    let raw: RawFile = serde_yaml::from_str(text).map_err(|e| {
        let line = e.location().map_or(1, |l| l.line());
        error(line, without_location(&e))
    })?;
    let domain_line = line_of(text, "domain:");
    if raw.domain.is_empty() {
        return Err(error(
            domain_line,
            "config file cannot have empty domain".into(),
        ));
    }
    let mut root = Node::default();
    let descriptors = raw.descriptors.unwrap_or_default();
    add_descriptors(&mut root, descriptors, "", bounds)
        .map_err(|(at, reason)| error(line_of(text, &at), reason))?;
    let domain = DomainName {
        name: raw.domain,
        line: domain_line,
    };
    Ok((domain, root))
}

/// serde_yaml's message without its " at line L column C": the line is reported on its own.
fn without_location(error: &serde_yaml::Error) -> String {
    let text = error.to_string();
    match text.rfind(" at line ") {
        Some(at) => text.get(..at).unwrap_or(&text).to_string(),
        None => text,
    }
}

/// The 1-based line of the first line holding `needle` (a descriptor's `key: <name>` for the
/// errors found after parsing), or 1.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|line| line.contains(needle))
        .map_or(1, |index| index + 1)
}

/// Errors after parsing carry `key: <key>` of the descriptor at fault, to find its line.
type BuildError = (String, String);

fn add_descriptors(
    parent: &mut Node,
    descriptors: Vec<RawDescriptor>,
    parent_path: &str,
    bounds: &Bounds,
) -> Result<(), BuildError> {
    for raw in descriptors {
        let key = raw.key.0;
        let at = format!("key: {key}");
        let key_value = match raw.value.filter(|v| !v.is_empty()) {
            Some(value) => format!("{key}_{value}"),
            None => key,
        };
        let wildcard = key_value.contains('*');
        if raw.share_threshold && !wildcard {
            let reason = format!(
                "share_threshold can only be used with wildcard values (containing '*'), but found key '{key_value}'"
            );
            return Err((at, reason));
        }
        let path = if parent_path.is_empty() {
            key_value.clone()
        } else {
            format!("{parent_path}.{key_value}")
        };
        if wildcard && !parent.children.contains_key(&key_value) {
            let parts = key_value.split('*').map(str::to_string).collect();
            parent.wildcards.push(Wildcard {
                key_value: key_value.clone(),
                parts,
            });
        }
        let node = parent.children.entry(key_value.clone()).or_default();
        node.label = key_value;
        node.path = path.clone();
        node.share_threshold |= raw.share_threshold;
        node.value_to_metric |= raw.value_to_metric;
        if let Some(parsed) = raw.rate_limit {
            if let Rule::Limited(rate) = &parsed.rule {
                check_lifetime(bounds, rate, parsed.charge_refused)
                    .map_err(|reason| (at.clone(), reason))?;
            }
            let modes = Modes {
                shadow_mode: raw.shadow_mode,
                quota_mode: raw.quota_mode,
                detailed_metric: raw.detailed_metric,
            };
            let limit = build_limit(parsed, modes, node);
            node.limits.push(limit);
        }
        let unlimited = node.limits.iter().any(|l| l.rule == Rule::Unlimited);
        if unlimited && node.limits.len() > 1 {
            let reason = "an unlimited rate_limit cannot share its descriptor with other limits";
            return Err((at, reason.into()));
        }
        add_descriptors(node, raw.descriptors.unwrap_or_default(), &path, bounds)?;
    }
    Ok(())
}

/// A limit's key must live within `--max-key-ttl`, its debt refilled too (a bucket that charges
/// refused hits may owe a whole bucket more).
fn check_lifetime(bounds: &Bounds, rate: &Rate, charge_refused: bool) -> Result<(), String> {
    let debt = rate.debt(charge_refused);
    (bounds.check_lifetime_owing(&rate.algorithm, debt)).map_err(|reason| {
        let owing = if debt > 0 && bounds.check_lifetime(&rate.algorithm).is_ok() {
            " (with the bucket it may owe: charge_refused: false owes none)"
        } else {
            ""
        };
        format!("rate_limit: {reason}{owing}")
    })
}

/// A descriptor's flags that belong to its `rate_limit`.
struct Modes {
    shadow_mode: bool,
    quota_mode: bool,
    detailed_metric: bool,
}

fn build_limit(parsed: ParsedRateLimit, modes: Modes, node: &Node) -> Limit {
    let n = node.limits.len() + 1;
    let label = if n == 1 {
        node.path.clone()
    } else {
        format!("{}#{n}", node.path)
    };
    Limit {
        identity: identity(&parsed.rule, node),
        policy: policy_name(parsed.name.as_deref(), &label),
        rule: parsed.rule,
        name: parsed.name,
        replaces: parsed.replaces,
        shadow_mode: modes.shadow_mode,
        quota_mode: modes.quota_mode,
        detailed_metric: modes.detailed_metric,
        charge_refused: parsed.charge_refused,
        label,
    }
}

/// A `rate_limit` checked on its own, while the file is parsed: its errors carry the line of
/// the descriptor that holds it.
#[derive(Deserialize)]
#[serde(try_from = "RawRateLimit")]
struct ParsedRateLimit {
    rule: Rule,
    name: Option<String>,
    replaces: Vec<String>,
    charge_refused: bool,
}

impl TryFrom<RawRateLimit> for ParsedRateLimit {
    type Error = String;

    fn try_from(raw: RawRateLimit) -> Result<ParsedRateLimit, String> {
        let replaces = replaces(&raw)?;
        let rule = if raw.unlimited {
            unlimited(&raw)?
        } else {
            Rule::Limited(rate(&raw)?)
        };
        let never_owes = [Kind::LeakyBucket, Kind::Concurrency];
        if let Some(name) = raw.algorithm.filter(|a| never_owes.contains(a)) {
            if raw.charge_refused.is_some() {
                return Err(format!(
                    "rate_limit.charge_refused: not with {}, which never charges a refused request",
                    name.name()
                ));
            }
        }
        let name = raw.name.filter(|n| !n.is_empty());
        Ok(ParsedRateLimit {
            rule,
            name,
            replaces,
            charge_refused: raw.charge_refused.unwrap_or(true),
        })
    }
}

fn replaces(raw: &RawRateLimit) -> Result<Vec<String>, String> {
    let names: Vec<String> = (raw.replaces.iter().flatten())
        .map(|r| r.name.clone().unwrap_or_default())
        .collect();
    if names.iter().any(String::is_empty) {
        return Err("rate_limit.replaces: should not have an empty replaces entry".into());
    }
    let own = raw.name.as_deref().filter(|n| !n.is_empty());
    if own.is_some_and(|own| names.iter().any(|n| n == own)) {
        return Err("rate_limit.replaces: should not contain name of same descriptor".into());
    }
    Ok(names)
}

/// `unlimited: true` takes no unit, window or algorithm. As in envoyproxy/ratelimit, a `unit`
/// that is not a valid unit is ignored there.
fn unlimited(raw: &RawRateLimit) -> Result<Rule, String> {
    if raw.unit.as_deref().and_then(Unit::parse).is_some() {
        return Err("rate_limit.unit: should not specify rate limit unit when unlimited".into());
    }
    let extensions = [
        ("per", raw.per.is_some()),
        ("algorithm", raw.algorithm.is_some()),
        ("burst", raw.burst.is_some()),
        ("max_delay", raw.max_delay.is_some()),
        ("lease", raw.lease.is_some()),
        ("charge_refused", raw.charge_refused.is_some()),
    ];
    match extensions.iter().find(|(_, given)| *given) {
        Some((field, _)) => Err(format!("rate_limit.{field}: not with unlimited")),
        None => Ok(Rule::Unlimited),
    }
}

fn rate(raw: &RawRateLimit) -> Result<Rate, String> {
    let name = raw.algorithm.unwrap_or(Kind::FixedWindow);
    if name == Kind::Concurrency {
        return slots(raw);
    }
    if raw.lease.is_some() {
        return Err(format!(
            "rate_limit.lease: only for concurrency, not {}",
            name.name()
        ));
    }
    let (unit, window_ms) = window(raw)?;
    let requests = raw.requests_per_unit.unwrap_or(0);
    if raw.burst.is_some() && name != Kind::TokenBucket {
        return Err(format!(
            "rate_limit.burst: only for token_bucket, not {}",
            name.name()
        ));
    }
    let max_delay_ms = match (&raw.max_delay, name) {
        (Some(text), Kind::LeakyBucket) => Some(whole_ms(text, "max_delay", true)?),
        (None, Kind::LeakyBucket) => return Err(
            "rate_limit.max_delay: required for leaky_bucket: the longest a request may be held"
                .into(),
        ),
        (Some(_), _) => {
            return Err(format!(
                "rate_limit.max_delay: only for leaky_bucket, not {}",
                name.name()
            ))
        }
        (None, _) => None,
    };
    if requests == 0 {
        // Nothing passes, whatever the algorithm: a window that allows none.
        let algorithm = Algorithm::FixedWindow {
            limit: 0,
            window_us: window_ms * 1000,
        };
        return Ok(Rate {
            algorithm,
            requests,
            window_ms,
            unit,
        });
    }
    let requests_u64 = u64::from(requests);
    let burst = match (name, max_delay_ms) {
        (Kind::TokenBucket, _) => raw.burst.unwrap_or(requests_u64),
        (Kind::LeakyBucket, Some(max_delay)) => {
            max_delay * 1000 / interval_us(requests_u64, window_ms) + 1
        }
        _ => requests_u64,
    };
    let shape = Shape {
        calendar: None,
        name,
        requests: requests_u64,
        per_ms: window_ms,
        burst,
        max_delay_ms,
    };
    let algorithm = shape
        .algorithm(&field_name)
        .map_err(|bad| format!("rate_limit.{}", bad.detail))?;
    Ok(Rate {
        algorithm,
        requests,
        window_ms,
        unit,
    })
}

/// A concurrency limit: `requests_per_unit` slots in use at once, each a lease (`lease`,
/// sluice's, default `DEFAULT_LEASE`) that frees itself if the hit that gives it back is lost.
/// It has no window and owes nothing, so the fields of windows and buckets are refused.
fn slots(raw: &RawRateLimit) -> Result<Rate, String> {
    let windowed = [
        ("unit", raw.unit.is_some()),
        ("per", raw.per.is_some()),
        ("burst", raw.burst.is_some()),
        ("max_delay", raw.max_delay.is_some()),
    ];
    if let Some((field, _)) = windowed.iter().find(|(_, given)| *given) {
        return Err(format!(
            "rate_limit.{field}: not with concurrency, whose slots last a lease (lease, default {DEFAULT_LEASE})"
        ));
    }
    let lease = raw.lease.as_deref().unwrap_or(DEFAULT_LEASE);
    let lease_ms = whole_ms(lease, "lease", false)?;
    let requests = raw.requests_per_unit.unwrap_or(0);
    let shape = Shape {
        calendar: None,
        name: Kind::Concurrency,
        requests: u64::from(requests),
        per_ms: lease_ms,
        burst: u64::from(requests),
        max_delay_ms: None,
    };
    let lease_field = |field: &str| match field {
        "per_ms" => "lease".to_string(),
        other => field_name(other),
    };
    let algorithm =
        (shape.algorithm(&lease_field)).map_err(|bad| format!("rate_limit.{}", bad.detail))?;
    Ok(Rate {
        algorithm,
        requests,
        window_ms: lease_ms,
        unit: Unit::Unknown,
    })
}

/// A concurrency limit's lease when the file gives none: long enough for most streams, short
/// enough that a slot whose −1 is lost comes back the same hour.
pub const DEFAULT_LEASE: &str = "5m";

/// The configuration's names for `Shape`'s fields, in errors.
fn field_name(field: &str) -> String {
    match field {
        "requests" => "requests_per_unit",
        "per_ms" => "per",
        "max_delay_ms" => "max_delay",
        other => other,
    }
    .to_string()
}

/// `unit` (as envoyproxy/ratelimit reads it, in any case) or sluice's `per`: exactly one.
fn window(raw: &RawRateLimit) -> Result<(Unit, u64), String> {
    match (&raw.unit, &raw.per) {
        (Some(_), Some(_)) => Err("rate_limit.per: give unit or per, not both".into()),
        (Some(unit), None) => Unit::parse(unit)
            .ok_or_else(|| format!("rate_limit.unit: invalid rate limit unit '{unit}'")),
        (None, Some(per)) => {
            let ms = whole_ms(per, "per", false)?;
            Ok((Unit::of_window(ms), ms))
        }
        (None, None) => Err("rate_limit.unit: invalid rate limit unit ''".into()),
    }
}

/// A duration (`"500ms"`, `"30s"`, `"5m"`, `"1h"`, `"1d"`) in whole milliseconds; `zero` allows
/// `"0ms"`, which the filter's parser refuses for windows.
fn whole_ms(text: &str, field: &str, zero: bool) -> Result<u64, String> {
    if zero && text.strip_suffix("ms").is_some_and(|n| n == "0") {
        return Ok(0);
    }
    let nanos = parse_nanos(text).map_err(|reason| format!("rate_limit.{field}: {reason}"))?;
    if nanos % 1_000_000 != 0 {
        return Err(format!("rate_limit.{field}: must be whole milliseconds"));
    }
    Ok(nanos / 1_000_000)
}

fn identity(rule: &Rule, node: &Node) -> String {
    let algorithm = |rule: &Rule| match rule {
        Rule::Limited(rate) => Some(rate.algorithm),
        Rule::Unlimited => None,
    };
    let same = (node.limits.iter())
        .filter(|l| algorithm(&l.rule) == algorithm(rule))
        .count();
    same.to_string()
}

/// `name` if it is fit for a header, else `label` with every other character as `_`; at most 64.
fn policy_name(name: Option<&str>, label: &str) -> String {
    let fits = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if let Some(name) = name.filter(|n| n.len() <= 64 && n.chars().all(fits)) {
        return name.to_string();
    }
    let text = name.unwrap_or(label);
    (text.chars())
        .map(|c| if fits(c) { c } else { '_' })
        .take(64)
        .collect()
}

// The files as written. Unknown keys are refused everywhere except under `metadata`, which
// envoyproxy/ratelimit passes through to Envoy's dynamic metadata only when an option asks, so
// it is accepted and not used.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    domain: String,
    descriptors: Option<Vec<RawDescriptor>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDescriptor {
    key: Key,
    value: Option<String>,
    rate_limit: Option<ParsedRateLimit>,
    descriptors: Option<Vec<RawDescriptor>>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    quota_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
    #[serde(default)]
    value_to_metric: bool,
    #[serde(default)]
    share_threshold: bool,
    #[serde(default, rename = "metadata")]
    _metadata: Option<serde_yaml::Value>,
}

/// A descriptor's `key`: refused where it is written when empty.
struct Key(String);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Key, D::Error> {
        let key = String::deserialize(deserializer)?;
        if key.is_empty() {
            return Err(serde::de::Error::custom("descriptor has empty key"));
        }
        Ok(Key(key))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    requests_per_unit: Option<u32>,
    unit: Option<String>,
    #[serde(default)]
    unlimited: bool,
    name: Option<String>,
    replaces: Option<Vec<RawReplaces>>,
    algorithm: Option<Kind>,
    burst: Option<u64>,
    per: Option<String>,
    max_delay: Option<String>,
    lease: Option<String>,
    charge_refused: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplaces {
    name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(yaml: &str) -> Result<Config, Vec<ConfigError>> {
        let files = [(PathBuf::from("rls/test.yaml"), yaml.to_string())];
        Config::from_files(&files, &Bounds::default())
    }

    fn refused(yaml: &str) -> String {
        let errors = load(yaml).unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        errors[0].to_string()
    }

    fn limits<'c>(config: &'c Config, path: &[&str]) -> &'c [Limit] {
        let mut node = config.domain("d").unwrap();
        for key in path {
            node = &node.children[*key];
        }
        &node.limits
    }

    #[test]
    fn an_envoyproxy_ratelimit_file_loads_into_fixed_windows_of_its_units() {
        let config = load(
            "domain: d\ndescriptors:\n  - key: database\n    value: users\n    rate_limit:\n      unit: Second\n      requests_per_unit: 500\n  - key: to_number\n    rate_limit: {unit: day, requests_per_unit: 100}\n",
        )
        .unwrap();
        let [users] = limits(&config, &["database_users"]) else {
            panic!()
        };
        let expected = Rate {
            algorithm: Algorithm::FixedWindow {
                limit: 500,
                window_us: 1_000_000,
            },
            requests: 500,
            window_ms: 1_000,
            unit: Unit::Second,
        };
        assert_eq!(users.rule, Rule::Limited(expected));
        assert_eq!(users.label, "database_users");
        let [day] = limits(&config, &["to_number"]) else {
            panic!()
        };
        let Rule::Limited(rate) = &day.rule else {
            panic!()
        };
        assert_eq!((rate.unit, rate.window_ms), (Unit::Day, 86_400_000));
    }

    #[test]
    fn refused_hits_are_charged_unless_charge_refused_is_false_and_a_bucket_must_live_its_debt() {
        let config = load(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 5}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 5, charge_refused: false}\n",
        )
        .unwrap();
        let charges = |key| limits(&config, &[key])[0].charge_refused;
        assert_eq!((charges("a"), charges("b")), (true, false));
        // 40 days to fill, 80 with the bucket it may owe: past --max-key-ttl's 62 days.
        let bucket = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {algorithm: token_bucket, requests_per_unit: 1, unit: day, burst: 40}\n";
        assert_eq!(
            refused(bucket),
            "rls/test.yaml:3: rate_limit: its key would live 80d, more than --max-key-ttl 62d (with the bucket it may owe: charge_refused: false owes none)"
        );
        let owes_none = bucket.replace("burst: 40}", "burst: 40, charge_refused: false}");
        assert!(load(&owes_none).is_ok());
        for other in [
            "{algorithm: leaky_bucket, requests_per_unit: 1, unit: second, max_delay: 1s, charge_refused: true}",
            "{unlimited: true, charge_refused: false}",
        ] {
            let yaml = format!("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {other}\n");
            assert!(refused(&yaml).contains("rate_limit.charge_refused: not with"), "{other}");
        }
    }

    #[test]
    fn sluice_extensions_choose_the_algorithm_burst_and_any_window() {
        let config = load(
            "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {algorithm: token_bucket, requests_per_unit: 10, per: 30s, burst: 20}\n  - key: shaped\n    rate_limit: {algorithm: leaky_bucket, requests_per_unit: 10, unit: second, max_delay: 500ms}\n",
        )
        .unwrap();
        let Rule::Limited(bucket) = &limits(&config, &["user"])[0].rule else {
            panic!()
        };
        let expected = Algorithm::TokenBucket {
            interval_us: 3_000_000,
            burst: 20,
        };
        assert_eq!(
            (bucket.algorithm, bucket.unit, bucket.capacity()),
            (expected, Unit::Unknown, 20)
        );
        let Rule::Limited(leaky) = &limits(&config, &["shaped"])[0].rule else {
            panic!()
        };
        let expected = Algorithm::LeakyBucket {
            interval_us: 100_000,
            max_delay_us: 500_000,
        };
        assert_eq!((leaky.algorithm, leaky.capacity()), (expected, 6));
    }

    #[test]
    fn a_descriptor_written_twice_adds_its_limits_and_children_up() {
        let config = load(
            "domain: d\ndescriptors:\n  - key: account\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - key: account\n    rate_limit: {unit: day, requests_per_unit: 250, name: daily}\n    descriptors:\n      - key: method\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
        )
        .unwrap();
        let both = limits(&config, &["account"]);
        let labels: Vec<&str> = both.iter().map(|l| l.label.as_str()).collect();
        assert_eq!(labels, ["account", "account#2"]);
        let identities: Vec<&str> = both.iter().map(|l| l.identity.as_str()).collect();
        // Told apart by their algorithms' numbers in the store key already.
        assert_eq!(identities, ["0", "0"]);
        assert_eq!(both[1].policy, "daily");
        assert_eq!(limits(&config, &["account", "method"]).len(), 1);
    }

    #[test]
    fn a_missing_requests_per_unit_refuses_everything_as_in_envoyproxy_ratelimit() {
        let config =
            load("domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second}\n").unwrap();
        let Rule::Limited(rate) = &limits(&config, &["ip"])[0].rule else {
            panic!()
        };
        assert_eq!(
            rate.algorithm,
            Algorithm::FixedWindow {
                limit: 0,
                window_us: 1_000_000
            }
        );
    }

    #[test]
    fn errors_give_the_file_the_line_and_the_field() {
        let cases = [
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 5\n",
                "rls/test.yaml:3: descriptors[0]: rate_limit.unit: invalid rate limit unit 'fortnight'",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unitt: second\n",
                "rls/test.yaml:5: descriptors[0].rate_limit: unknown field `unitt`",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n  - key: ''\n",
                "rls/test.yaml:4: descriptors[1]: descriptor has empty key",
            ),
            ("descriptors: []\n", "rls/test.yaml:1: config file cannot have empty domain"),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n",
                "rls/test.yaml:3: descriptors[0]: rate_limit.unit: should not specify rate limit unit when unlimited",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: x, replaces: [{name: x}]}\n",
                "rls/test.yaml:3: descriptors[0]: rate_limit.replaces: should not contain name of same descriptor",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{}]}\n",
                "rls/test.yaml:3: descriptors[0]: rate_limit.replaces: should not have an empty replaces entry",
            ),
            (
                "domain: d\ndescriptors:\n  - key: b\n  - key: a\n    value: v\n    share_threshold: true\n",
                "rls/test.yaml:4: share_threshold can only be used with wildcard values (containing '*'), but found key 'a_v'",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, per: 1s, requests_per_unit: 1}\n",
                "rls/test.yaml:3: descriptors[0]: rate_limit.per: give unit or per, not both",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {per: 90, requests_per_unit: 1}\n",
                "rls/test.yaml:3: descriptors[0]: rate_limit.per: \"90\" has no unit (use ms, s, m, h or d)",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 5}\n",
                "rls/test.yaml:3: descriptors[0]: rate_limit.burst: only for token_bucket, not fixed_window",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: leaky_bucket}\n",
                "rls/test.yaml:3: descriptors[0]: rate_limit.max_delay: required for leaky_bucket",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1001, algorithm: sliding_log}\n",
                "rls/test.yaml:3: descriptors[0]: rate_limit.requests_per_unit: 1001 is not in 1..=1000",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcra}\n",
                "rls/test.yaml:4: descriptors[0].rate_limit.algorithm: unknown variant `gcra`",
            ),
            (
                "domain: d\ndescriptors:\n  - key: b\n  - key: a\n    rate_limit: {unit: year, requests_per_unit: 1}\n",
                "rls/test.yaml:4: rate_limit: its key would live 365d, more than --max-key-ttl 62d",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true}\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
                "rls/test.yaml:3: an unlimited rate_limit cannot share its descriptor with other limits",
            ),
        ];
        for (yaml, expected) in cases {
            let got = refused(yaml);
            assert!(
                got.starts_with(expected),
                "{yaml}\n  gave {got:?}\n  expected {expected:?}"
            );
        }
    }

    #[test]
    fn a_concurrency_limit_has_requests_per_unit_slots_of_a_lease() {
        let config = load(
            "domain: d\ndescriptors:\n  - key: streams\n    rate_limit: {algorithm: concurrency, requests_per_unit: 3}\n  - key: long\n    rate_limit: {algorithm: concurrency, requests_per_unit: 3, lease: 1h}\n",
        )
        .unwrap();
        let lease = |key| match &limits(&config, &[key])[0].rule {
            Rule::Limited(rate) => rate.algorithm,
            Rule::Unlimited => panic!(),
        };
        let slots = |lease_us| Algorithm::Concurrency { limit: 3, lease_us };
        assert_eq!(lease("streams"), slots(300_000_000), "5m by default");
        assert_eq!(lease("long"), slots(3_600_000_000));
    }

    #[test]
    fn a_concurrency_limit_refuses_the_fields_of_windows_naming_them() {
        let file = |fields: &str| {
            format!("domain: d\ndescriptors:\n  - key: streams\n    rate_limit: {{algorithm: concurrency, requests_per_unit: 3{fields}}}\n")
        };
        let cases = [
            (", unit: second", "rate_limit.unit: not with concurrency"),
            (", per: 1s", "rate_limit.per: not with concurrency"),
            (", burst: 3", "rate_limit.burst: not with concurrency"),
            (
                ", max_delay: 1s",
                "rate_limit.max_delay: not with concurrency",
            ),
            (
                ", charge_refused: false",
                "rate_limit.charge_refused: not with concurrency",
            ),
            (", lease: 3s", "rate_limit.lease: 3000 is not in 4000..="),
        ];
        for (fields, expected) in cases {
            let got = refused(&file(fields));
            assert!(got.contains(expected), "{fields}: {got}");
        }
        let many = file("").replace("requests_per_unit: 3", "requests_per_unit: 10001");
        assert!(refused(&many).contains("rate_limit.requests_per_unit: 10001 is not in 1..=10000"));
        let windowed = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 5, lease: 1m}\n";
        assert!(
            refused(windowed).contains("rate_limit.lease: only for concurrency, not fixed_window")
        );
    }

    #[test]
    fn a_domain_in_two_files_is_refused_naming_the_second() {
        let file = |name: &str| (PathBuf::from(name), "domain: d\n".to_string());
        let files = [file("a.yaml"), file("b.yaml")];
        let errors = Config::from_files(&files, &Bounds::default()).unwrap_err();
        let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(messages, ["b.yaml:1: duplicate domain 'd' in config file"]);
    }

    #[test]
    fn every_error_of_every_file_is_reported() {
        let files = [
            (
                PathBuf::from("a.yaml"),
                "domain: a\ndescriptors:\n  - value: x\n".to_string(),
            ),
            (PathBuf::from("b.yaml"), "domain: [b\n".to_string()),
            (PathBuf::from("c.yaml"), "domain: c\n".to_string()),
        ];
        let errors = Config::from_files(&files, &Bounds::default()).unwrap_err();
        let files: Vec<&Path> = errors.iter().map(|e| e.file.as_path()).collect();
        assert_eq!(files, [Path::new("a.yaml"), Path::new("b.yaml")]);
    }

    #[test]
    fn a_directory_gives_its_yaml_files_in_name_order() {
        let dir = std::env::temp_dir().join(format!("sluice-rls-config-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("..data")).unwrap();
        for name in [
            "b.yml",
            "a.yaml",
            "notes.txt",
            ".hidden.yaml",
            "..data/c.yaml",
        ] {
            std::fs::write(dir.join(name), "domain: x\n").unwrap();
        }
        let files = config_files(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(files, [dir.join("a.yaml"), dir.join("b.yml")]);
    }

    #[test]
    fn header_names_come_from_the_configuration_and_fit_the_draft_headers() {
        assert_eq!(policy_name(Some("per-user.v1"), "x"), "per-user.v1");
        assert_eq!(policy_name(Some("per user"), "x"), "per_user");
        assert_eq!(policy_name(None, "path_/api/*"), "path__api__");
        assert_eq!(policy_name(None, &"k".repeat(100)).len(), 64);
    }

    #[test]
    fn wildcards_match_each_star_against_any_run_of_characters() {
        let wildcard = |pattern: &str| Wildcard {
            key_value: pattern.into(),
            parts: pattern.split('*').map(str::to_string).collect(),
        };
        let trailing = wildcard("key_value*");
        assert!(trailing.matches("key_value") && trailing.matches("key_value123"));
        assert!(!trailing.matches("key_valu"));
        let middle = wildcard("path_/api/*/action");
        assert!(middle.matches("path_/api/1/action") && !middle.matches("path_/api/1/other"));
        let overlapping = wildcard("k_ab*ab");
        assert!(overlapping.matches("k_abab") && !overlapping.matches("k_aba"));
        assert!(wildcard("k_*").matches("k_"));
    }
}
