//! Proves, by property testing, the config parser's promise from the hardening issue: "no panic,
//! ever; invalid config always rejected with a message naming the field".
//!
//! Each case takes one of the shipped configurations (`schema/examples/*.json`, all valid), picks
//! one place in it (any object member or array element, at any depth, or a new member of any
//! object) and mutates it once: a value of the wrong type, an edge-case number (negative, zero,
//! huge, fractional), an edge-case string (empty, very long, control characters, non-ASCII,
//! nearly-valid durations/timestamps/key parts/enum names, another string of the same document),
//! an unknown or known-but-absent member inserted, or the member/element deleted. Then
//! `sluice::config::parse` must not panic, and if it refuses the document, the `ConfigError`
//! must name the mutated place:
//!
//! * its `field` is the mutated path, written as `src/config/` writes paths
//!   (`policies[0].match.headers[1].name`, `policies[0].tiers.values.gold.burst`); or
//! * an enclosing object or array, at a path-segment boundary (a member now missing, a rule over
//!   the object such as "exactly one of present or equals"); or
//! * something inside the value the mutation put there (only when that value is an array or an
//!   object); or
//! * one of the documented cross-field consequences listed in [`consequences`], each with the
//!   rule in `src/config/compile.rs` that reports it there and the reason it reports.
//!
//! Its `reason` must not be empty, and what Envoy logs (`Display`) must contain the field.
#![cfg(not(target_arch = "wasm32"))]
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::OnceLock;

use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use serde_json::{Number, Value};
use sluice::config::{parse_with_env, ConfigError, Plan};

/// Cases per run (`PROPTEST_CASES` overrides it): about 5 s in a debug build.
const CASES: u32 = 10_000;

/// One step of a path into the JSON document.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Key(String),
    Index(usize),
}

/// A path as `ConfigError::field` writes it: members joined by `.`, array elements as `[i]`
/// (`policies[0].key[1]`, `bypass[0].policies[0]`, `global.timeout`).
fn render(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

fn key(k: &str) -> Seg {
    Seg::Key(k.to_string())
}

fn join(path: &[Seg], more: &[Seg]) -> Vec<Seg> {
    path.iter().chain(more).cloned().collect()
}

/// The filter's parser in a VM whose environment has every variable a configuration names, as
/// the operator's deployment gives it (`global.token_env`).
fn parse(json: &[u8]) -> Result<Plan, ConfigError> {
    parse_with_env(json, &|_| {
        Some("a-secret-from-the-deployment-32-bytes-or-more".to_string())
    })
}

/// The shipped configurations, by file name.
fn examples() -> &'static [(String, Value)] {
    static EXAMPLES: OnceLock<Vec<(String, Value)>> = OnceLock::new();
    EXAMPLES.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("schema/examples");
        let mut examples: Vec<(String, Value)> = fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|e| e == "json"))
            .map(|path| {
                let text = fs::read_to_string(&path).unwrap();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                (name, serde_json::from_str(&text).unwrap())
            })
            .collect();
        examples.sort_by(|a, b| a.0.cmp(&b.0));
        examples
    })
}

// ---------------------------------------------------------------------------------------------
// Generating mutations

/// What a mutation does at its path.
#[derive(Debug, Clone)]
enum Mutation {
    /// The member or element gets this value instead.
    Replace(Value),
    /// The member or element is removed (later elements of an array move up).
    Delete,
    /// A member that was not there is added with this value (the path's last step is its name).
    Insert(Value),
}

#[derive(Debug, Clone)]
struct Case {
    example: usize,
    path: Vec<Seg>,
    mutation: Mutation,
}

/// A place to mutate: an existing member/element, or an object to add a member to.
#[derive(Debug, Clone)]
enum Target {
    Existing(Vec<Seg>),
    Object(Vec<Seg>),
}

fn targets(value: &Value, path: &mut Vec<Seg>, out: &mut Vec<Target>) {
    match value {
        Value::Object(members) => {
            out.push(Target::Object(path.clone()));
            for (name, member) in members {
                path.push(Seg::Key(name.clone()));
                out.push(Target::Existing(path.clone()));
                targets(member, path, out);
                path.pop();
            }
        }
        Value::Array(elements) => {
            for (i, element) in elements.iter().enumerate() {
                path.push(Seg::Index(i));
                out.push(Target::Existing(path.clone()));
                targets(element, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

fn strings_of(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Object(members) => {
            for (name, member) in members {
                out.push(name.clone());
                strings_of(member, out);
            }
        }
        Value::Array(elements) => elements.iter().for_each(|e| strings_of(e, out)),
        _ => {}
    }
}

fn at<'a>(value: &'a Value, path: &[Seg]) -> Option<&'a Value> {
    path.iter().try_fold(value, |v, seg| match seg {
        Seg::Key(k) => v.get(k),
        Seg::Index(i) => v.get(i),
    })
}

fn at_mut<'a>(value: &'a mut Value, path: &[Seg]) -> &'a mut Value {
    path.iter().fold(value, |v, seg| match seg {
        Seg::Key(k) => &mut v[k.as_str()],
        Seg::Index(i) => &mut v[*i],
    })
}

/// Every member name the configuration knows: inserting one where it is absent exercises the
/// rules between optional members (`burst` on a window, `lease` on a local window, `match` on
/// the default, `path_prefix` next to `path_exact`, `key_hash` next to `key`...).
const KNOWN_MEMBERS: &[&str] = &[
    "version",
    "headers", // top level and in `match`
    "policies",
    "default",
    "global",
    "bypass",
    "route_metadata",
    "status_path",
    "admin",
    "listener",
    "read_token_env",
    "token_env",
    "top_show",
    "key",
    "key_hash",
    "owner",
    "reason",
    "expires",
    "cluster",
    "authority",
    "path",
    "timeout",
    "name",
    "match",
    "missing_key",
    "requests",
    "per",
    "burst",
    "cost",
    "mode",
    "tiers",
    "max_keys",
    "algorithm",
    "max_delay",
    "scope",
    "failure_mode",
    "lease",
    "emergency",
    "rollout",
    "enforce_percent",
    "path_prefix",
    "path_exact",
    "methods",
    "routes",
    "present",
    "equals",
    "by",
    "values",
    // Concurrency limits and token budgets.
    "retry_after",
    "from_response",
    "usage",
    "header",
    "reserve",
    "max_debt",
    "on_unknown",
    "ask_stream_usage",
    "request",
    "input_tokens",
    "prompt_tokens",
    "output_tokens",
    "completion_tokens",
    "total_tokens",
    // Spend budgets.
    "price",
    "unknown_model",
    "input",
    "output",
    "cache_read",
    "cache_write",
    "reasoning",
];

/// Strings that are almost what some field wants: durations, timestamps, key parts, methods,
/// enum variants, hashes, policy names at the length limit.
/// Timestamps around the last instant u64 nanoseconds hold (2554-07-21T23:34:33.709551615Z).
fn nearly_valid() -> Vec<String> {
    [
        "0s",
        "-1s",
        "1.5s",
        "1 s",
        "1S",
        "s",
        "1",
        "0ms",
        "1ms",
        "1d",
        "213503d",
        "213504d",
        "18446744073709551615ms",
        "18446744073709551616s",
        "99999999999999999999d",
        "/",
        "/x",
        "x",
        "GET",
        "get",
        "POST ",
        "ip",
        "ip|",
        "|ip",
        "global",
        "route",
        "path",
        "method",
        "authority",
        "header:",
        "header:x y",
        "header:x-user-id",
        "metadata:",
        "metadata:ns:",
        "metadata::k",
        "metadata:ns:a..b",
        "metadata:envoy.filters.http.jwt_authn:payload.sub",
        "token_bucket",
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "leaky_bucket",
        "concurrency",
        "local",
        "open",
        "closed",
        "shadow",
        "enforce",
        "skip",
        "shared",
        "legacy",
        "draft",
        "both",
        "none",
        " ",
        "\t",
        " x ",
        "1970-01-01T00:00:00Z",
        "1969-12-31T23:59:59Z",
        "1970-01-01T00:30:00+01:00",
        "2026-02-29T00:00:00Z",
        "2024-02-29T00:00:00Z",
        "2026-12-01T00:00:60Z",
        "2026-12-01T00:00:00.123456789123+14:00",
        "2026-12-01T00:00:00-99:99",
        "2026-12-01T00:00:00.Z",
        "2026-12-01t00:00:00z",
        "2554-07-21T23:34:33Z",
        "2554-07-21T23:34:34Z",
        "9999-12-31T23:59:59Z",
        "0000000000000000",
        "ffffffffffffffff",
        "FFFFFFFFFFFFFFFF",
        "7af12e58ae350d9",
        "+7af12e58ae350d9",
        "7af12e58ae350d9a0",
        "renamed-policy",
        "body:",
        "body:model",
        "body:a b",
        "3s",
        "4s",
        "5m",
        "total_tokens",
        "input_tokens",
        "output_tokens",
        "max_tokens",
        "reserve",
        "x-usage-total-tokens",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(["a".repeat(64), "a".repeat(65)])
    .collect()
}

fn edge_string() -> BoxedStrategy<String> {
    prop_oneof![
        1 => Just(String::new()),
        // Very long, in characters a field might accept (or a number with a unit).
        2 => (select(vec!["a", "9", "/", "é", "x-", "日"]), 65..3000usize, select(vec!["", "s", "ms", "Z"]))
            .prop_map(|(unit, n, suffix)| unit.repeat(n) + suffix),
        2 => "[a-z0-9:/-]{0,4}[\\x00-\\x1f\\x7f][a-z0-9:/-]{0,4}",
        2 => "[a-z0-9:/-]{0,3}[éß日本語🚀\u{200b}\u{feff}\u{130}\u{212a}]{1,3}[a-z0-9:/-]{0,3}",
        4 => select(nearly_valid()),
    ]
    .boxed()
}

fn edge_number() -> BoxedStrategy<Value> {
    let fixed: Vec<Value> = vec![
        0.into(),
        (-1).into(),
        (-5).into(),
        i64::MIN.into(),
        1.into(),
        2.into(),
        3.into(),
        5.into(),
        20.into(),
        100.into(),
        1000.into(),
        1001.into(),
        u32::MAX.into(),
        (u64::from(u32::MAX) + 1).into(),
        (1u64 << 53).into(),
        (1u64 << 62).into(),
        u64::MAX.into(),
        0.5.into(),
        1.5.into(),
        (-0.5).into(),
        1e20.into(),
        1e300.into(),
    ];
    prop_oneof![
        4 => select(fixed),
        1 => any::<u64>().prop_map(Value::from),
        1 => any::<i64>().prop_map(Value::from),
        1 => any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
    ]
    .boxed()
}

fn member_name() -> BoxedStrategy<String> {
    prop_oneof![
        2 => select(KNOWN_MEMBERS.to_vec()).prop_map(str::to_string),
        2 => "[a-z_]{1,12}",
        1 => edge_string().prop_map(|s| s.chars().take(40).collect()),
    ]
    .boxed()
}

fn leaf() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        edge_number(),
        edge_string().prop_map(Value::String),
    ]
    .boxed()
}

fn any_json() -> BoxedStrategy<Value> {
    leaf()
        .prop_recursive(2, 12, 4, |inner| {
            prop_oneof![
                vec(inner.clone(), 0..4).prop_map(Value::Array),
                btree_map(member_name(), inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
        .boxed()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

fn kind(value: &Value) -> Kind {
    match value {
        Value::Null => Kind::Null,
        Value::Bool(_) => Kind::Bool,
        Value::Number(_) => Kind::Number,
        Value::String(_) => Kind::String,
        Value::Array(_) => Kind::Array,
        Value::Object(_) => Kind::Object,
    }
}

fn of_kind(kind: Kind) -> BoxedStrategy<Value> {
    match kind {
        Kind::Null => Just(Value::Null).boxed(),
        Kind::Bool => any::<bool>().prop_map(Value::Bool).boxed(),
        Kind::Number => edge_number(),
        Kind::String => edge_string().prop_map(Value::String).boxed(),
        Kind::Array => vec(any_json(), 0..4).prop_map(Value::Array).boxed(),
        Kind::Object => btree_map(member_name(), any_json(), 0..4)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
            .boxed(),
    }
}

/// A value of any other type than `original`'s.
fn wrong_type(original: &Value) -> BoxedStrategy<Value> {
    let others: Vec<Kind> = [
        Kind::Null,
        Kind::Bool,
        Kind::Number,
        Kind::String,
        Kind::Array,
        Kind::Object,
    ]
    .into_iter()
    .filter(|k| *k != kind(original))
    .collect();
    select(others).prop_flat_map(of_kind).boxed()
}

fn mutation_of(doc: &'static Value, target: Target) -> BoxedStrategy<(Vec<Seg>, Mutation)> {
    match target {
        Target::Object(path) => {
            let existing = at(doc, &path).and_then(Value::as_object).unwrap();
            (member_name(), any_json())
                .prop_map(move |(mut name, value)| {
                    while existing.contains_key(&name) {
                        name.push('_');
                    }
                    (join(&path, &[Seg::Key(name)]), Mutation::Insert(value))
                })
                .boxed()
        }
        Target::Existing(path) => {
            let original = at(doc, &path).unwrap();
            let mut strings = Vec::new();
            strings_of(doc, &mut strings);
            let replacement = match original {
                Value::Number(_) => {
                    prop_oneof![1 => wrong_type(original), 2 => edge_number()].boxed()
                }
                Value::String(_) => prop_oneof![
                    2 => wrong_type(original),
                    3 => edge_string().prop_map(Value::String),
                    1 => select(strings).prop_map(Value::String),
                ]
                .boxed(),
                _ => wrong_type(original),
            };
            prop_oneof![
                1 => Just(Mutation::Delete),
                4 => replacement.prop_map(Mutation::Replace),
            ]
            .prop_map(move |m| (path.clone(), m))
            .boxed()
        }
    }
}

fn case() -> impl Strategy<Value = Case> {
    (0..examples().len()).prop_flat_map(|example| {
        let doc = &examples()[example].1;
        let mut all = Vec::new();
        targets(doc, &mut Vec::new(), &mut all);
        select(all)
            .prop_flat_map(move |target| mutation_of(doc, target))
            .prop_map(move |(path, mutation)| Case {
                example,
                path,
                mutation,
            })
    })
}

fn apply(case: &Case) -> Value {
    let mut doc = examples()[case.example].1.clone();
    let (last, parent) = case.path.split_last().unwrap();
    match (at_mut(&mut doc, parent), last, &case.mutation) {
        (Value::Object(members), Seg::Key(k), Mutation::Delete) => {
            members.remove(k);
        }
        (Value::Array(elements), Seg::Index(i), Mutation::Delete) => {
            elements.remove(*i);
        }
        (Value::Object(members), Seg::Key(k), Mutation::Replace(v) | Mutation::Insert(v)) => {
            members.insert(k.clone(), v.clone());
        }
        (Value::Array(elements), Seg::Index(i), Mutation::Replace(v)) => elements[*i] = v.clone(),
        (parent, last, mutation) => panic!("cannot apply {mutation:?} at {last:?} of {parent}"),
    }
    doc
}

// ---------------------------------------------------------------------------------------------
// The property

/// How a refusal named the mutated place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Naming {
    Exact,
    Enclosing,
    Inside,
    Consequence(&'static str),
}

/// `inner` is `outer` followed by more path segments.
fn is_under(inner: &str, outer: &str) -> bool {
    inner
        .strip_prefix(outer)
        .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
}

/// The policies of `doc`, as their paths (`policies[i]`, then `default`).
fn policies(doc: &Value) -> Vec<Vec<Seg>> {
    let listed = doc
        .get("policies")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    (0..listed)
        .map(|i| vec![key("policies"), Seg::Index(i)])
        .chain(doc.get("default").map(|_| vec![key("default")]))
        .collect()
}

/// The rates of policy `p` in `doc`: its own, each tier's, its emergency budget. Each validates
/// `requests`, `per` and `burst` together (`Shape::tier` in src/config/compile.rs).
fn rates(doc: &Value, p: &[Seg]) -> Vec<Vec<Seg>> {
    let values = join(p, &[key("tiers"), key("values")]);
    let tiers = at(doc, &values)
        .and_then(Value::as_object)
        .into_iter()
        .flat_map(|m| m.keys())
        .map(|name| join(&values, &[Seg::Key(name.clone())]));
    [p.to_vec()]
        .into_iter()
        .chain(tiers)
        .chain([join(p, &[key("emergency")])])
        .collect()
}

/// Errors a mutation may cause away from the mutated place: `(field, text its reason
/// contains, the rule in src/config/compile.rs that reports it there)`.
#[derive(Default)]
struct Allowed(Vec<(String, &'static str, &'static str)>);

impl Allowed {
    fn add(&mut self, field: &[Seg], reason: &'static str, rule: &'static str) {
        self.0.push((render(field), reason, rule));
    }

    /// Every name listed in a bypass entry's `policies`.
    fn bypass_names(&mut self, doc: &Value) {
        for (j, entry) in array(doc, &[key("bypass")]).iter().enumerate() {
            for k in 0..entry
                .get("policies")
                .and_then(Value::as_array)
                .map_or(0, Vec::len)
            {
                self.add(
                    &[key("bypass"), Seg::Index(j), key("policies"), Seg::Index(k)],
                    "no policy is named",
                    "a bypass names its policies: one removed or renamed is reported there",
                );
            }
        }
    }

    /// What an RLS cannot decide for a global policy `p` (`Compiler::policy`): a cost read from
    /// the response, refused on `cost`, and requests in flight, refused on `scope`.
    fn rls_refusals(&mut self, p: &[Seg]) {
        self.add(
            &join(p, &[key("cost")]),
            "an RLS is charged a response's usage",
            "a global token budget needs sluice-service, not an RLS: refused on `cost`",
        );
        self.add(
            &join(p, &[key("scope")]),
            "an RLS counts requests in flight",
            "a global concurrency policy needs sluice-service, not an RLS: refused on `scope`",
        );
        self.add(
            &join(p, &[key("calendar")]),
            "needs sluice-service",
            "a global calendar window needs sluice-service, not an RLS: refused on `calendar`",
        );
    }

    /// Every bypass entry's `key`.
    fn bypass_keys(&mut self, doc: &Value) {
        for j in 0..array(doc, &[key("bypass")]).len() {
            self.add(
                &[key("bypass"), Seg::Index(j), key("key")],
                "key parts: give one value for each",
                "a bypass key has one value per key part of each policy it names",
            );
        }
    }
}

fn array<'a>(doc: &'a Value, path: &[Seg]) -> &'a [Value] {
    at(doc, path)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The cross-field consequences of a mutation at `m`, computed on the mutated document `doc`:
/// the errors src/config/compile.rs reports on another field than the mutated one because its rule spans
/// both. Anything not listed here, nor at, around or inside `m`, fails the property.
fn consequences(doc: &Value, m: &[Seg]) -> Allowed {
    let mut allowed = Allowed::default();
    let a = &mut allowed;
    match m {
        // Without `default`, a document whose `policies` is empty has no policy at all
        // (reported on `policies`); and bypass entries may name the default.
        [Seg::Key(d)] if d == "default" => {
            a.add(
                &[key("policies")],
                "at least one policy (or a default)",
                "at least one policy or a default, reported on `policies`",
            );
            a.bypass_names(doc);
        }
        // Without the service settings, every global policy is refused on its `scope`.
        [Seg::Key(g)] if g == "global" => {
            for p in policies(doc) {
                a.add(
                    &join(&p, &[key("scope")]),
                    "service settings",
                    "a global policy needs the top-level `global`, reported on its `scope`",
                );
            }
        }
        // Another protocol: what only the other one takes is refused on itself (an RLS's
        // `domain`, sluice-service's `path` and leases), and an RLS needs its `domain`.
        [Seg::Key(g), Seg::Key(p)] if g == "global" && p == "protocol" => {
            let global = |name: &str| [key("global"), key(name)];
            a.add(
                &global("domain"),
                "\"rls\" only",
                "`domain` is an RLS's only",
            );
            a.add(
                &global("domain"),
                "needs the domain",
                "an RLS needs its `domain`",
            );
            a.add(
                &global("path"),
                "no path",
                "an RLS has one method, no `path`",
            );
            for p in policies(doc) {
                let rule = "an RLS grants no leases: refused on each policy's `lease`";
                a.add(&join(&p, &[key("lease")]), "grants no tokens ahead", rule);
                a.rls_refusals(&p);
            }
        }
        // A policy removed (or the whole list): bypass entries that named it.
        [Seg::Key(p)] | [Seg::Key(p), Seg::Index(_)] if p == "policies" => a.bypass_names(doc),
        // A bypass entry naming another policy, whose key has another number of parts.
        [Seg::Key(b), Seg::Index(j), Seg::Key(n), ..] if b == "bypass" && n == "policies" => {
            a.add(
                &[key("bypass"), Seg::Index(*j), key("key")],
                "key parts: give one value for each",
                "a bypass key has one value per key part of each policy it names",
            );
        }
        _ => {}
    }

    // Mutations inside one policy `p`; `rest` is the path within it.
    let (p, rest): (Vec<Seg>, &[Seg]) = match m {
        [Seg::Key(ps), Seg::Index(i), rest @ ..] if ps == "policies" => {
            (vec![key("policies"), Seg::Index(*i)], rest)
        }
        [Seg::Key(d), rest @ ..] if d == "default" => (vec![key("default")], rest),
        _ => return allowed,
    };
    let field = |name: &str| join(&p, &[key(name)]);
    let is = |name: &str| matches!(rest, [Seg::Key(k)] if k == name);
    let starts = |name: &str| matches!(rest, [Seg::Key(k), ..] if k == name);
    let rates = rates(doc, &p);
    let emergency = field("emergency");
    let lease = field("lease");
    // A global policy leases between `cost` and the smallest burst (capacity) of its own rate and
    // its tiers' (not the emergency's); without `lease` it leases `cost`. Reported on `lease`,
    // also when `lease` is not given (a global leaky bucket whose capacity is below its cost).
    let lease_rule = "lease between cost and the smallest burst, reported on `lease`";

    if rest.is_empty() || is("name") {
        a.bypass_names(doc);
    }
    if is("name") {
        // A rename that collides: the later of the two policies is reported.
        for q in policies(doc) {
            a.add(
                &join(&q, &[key("name")]),
                "duplicate policy name",
                "policy names are unique; the later duplicate is reported",
            );
        }
    }
    if starts("key") {
        a.bypass_keys(doc);
    }
    // `cost`, or a token budget's reservation inside it (`cost.reserve`, its `default`).
    if starts("cost") {
        for r in &rates {
            for f in ["requests", "burst"] {
                a.add(
                    &join(r, &[key(f)]),
                    "must be >= cost",
                    "each rate's burst (token bucket) or requests (windows) holds one request's cost \
                     or reservation",
                );
            }
        }
        a.add(&lease, "must be between cost", lease_rule);
        a.add(
            &lease,
            "cannot be lent ahead",
            "a cost read from the response is settled per request: no `lease`",
        );
    }
    if is("algorithm") {
        for r in &rates {
            for f in ["requests", "burst", "per"] {
                a.add(
                    &join(r, &[key(f)]),
                    "",
                    "the algorithm decides which rate fields apply and their bounds",
                );
            }
            a.add(
                r,
                "missing field `per`",
                "a concurrency policy's tiers and emergency budget take no `per`, the others' need it",
            );
        }
        a.add(
            &field("cost"),
            "has no cost",
            "a concurrency policy takes no `cost` but 1",
        );
        a.add(
            &join(&p, &[key("cost"), key("from_response")]),
            "which can owe and refund tokens",
            "a cost read from the response needs token_bucket or a window, reported on \
             `cost.from_response`",
        );
        a.add(
            &field("retry_after"),
            "does not apply to the",
            "`retry_after` is a concurrency policy's only",
        );
        a.add(
            &field("calendar"),
            "calendar windows are fixed windows",
            "only a fixed window follows a calendar, reported on `calendar`",
        );
        a.rls_refusals(&p);
        a.add(
            &field("max_delay"),
            "",
            "max_delay is required by leaky_bucket and refused by the others",
        );
        a.add(
            &lease,
            "",
            "a lease's bounds and whether it applies depend on the algorithm",
        );
    }
    if is("max_delay") {
        // A leaky bucket's capacity is max_delay / interval + 1.
        a.add(&lease, "must be between cost", lease_rule);
    }
    for r in &rates {
        let Some(within) = m.strip_prefix(r.as_slice()) else {
            continue;
        };
        let rate_field = |name: &str| matches!(within, [Seg::Key(k)] if k == name);
        if rate_field("per") {
            a.add(
                &join(r, &[key("requests")]),
                "more than one request per nanosecond",
                "a shorter `per` can make the rate faster than 1/ns, reported on `requests`",
            );
        }
        if rate_field("per") || rate_field("requests") {
            a.add(
                &join(r, &[key("burst")]),
                "over a century",
                "burst × per / requests must fit 2^62 ns, reported on `burst`",
            );
            a.add(
                &field("cost"),
                "over a century",
                "a leaky bucket's cost × per / requests must fit 2^62 ns, reported on `cost`",
            );
        }
        if rate_field("requests") {
            a.add(
                &join(r, &[key("burst")]),
                "must be >= cost",
                "burst defaults to requests, and must hold one request's cost",
            );
        }
        if *r != emergency && ["requests", "burst", "per"].iter().any(|f| rate_field(f)) {
            a.add(&lease, "must be between cost", lease_rule);
        }
    }
    if starts("calendar") {
        // With a calendar `per` is a calendar period, without one a duration: each rate's `per`.
        for r in &rates {
            a.add(
                &join(r, &[key("per")]),
                "calendar",
                "a calendar decides what a rate's `per` may be, reported on `per`",
            );
        }
    }
    if is("per") {
        // The policy's own period decides which start fields apply.
        for f in ["weekday", "day", "month"] {
            a.add(
                &join(&p, &[key("calendar"), key("starts"), key(f)]),
                "applies to a per of",
                "a start field that the policy's period does not read is refused on itself",
            );
        }
    }
    if starts("tiers") {
        // A tier added or replaced, with a smaller burst.
        a.add(&lease, "must be between cost", lease_rule);
    }
    if is("scope") {
        a.rls_refusals(&p);
        for f in ["failure_mode", "emergency"] {
            a.add(
                &field(f),
                "applies to global policies only",
                "failure_mode and emergency are refused on a local policy",
            );
        }
        a.add(
            &lease,
            "does not apply to the",
            "a local policy leases only from a token bucket",
        );
        a.add(&lease, "must be between cost", lease_rule);
    }
    if is("mode") {
        a.add(
            &field("rollout"),
            "a shadow policy enforces for no key",
            "a rollout needs an enforcing policy, reported on `rollout`",
        );
    }
    if is("failure_mode") {
        a.add(
            &emergency,
            "fails closed has no emergency budget",
            "a policy that fails closed takes no emergency budget, reported on `emergency`",
        );
    }
    if matches!(rest, [Seg::Key(mt), Seg::Key(pp)] if mt == "match" && pp == "path_prefix") {
        a.add(
            &join(&p, &[key("match"), key("path_exact")]),
            "not both",
            "path_prefix and path_exact exclude each other, reported on `path_exact`",
        );
    }
    allowed
}

/// How `e` names the place `case` mutated in `doc`, or `None` when it names something else.
fn naming(doc: &Value, case: &Case, e: &ConfigError) -> Option<Naming> {
    let mutated = render(&case.path);
    let container = match &case.mutation {
        Mutation::Replace(v) | Mutation::Insert(v) => v.is_array() || v.is_object(),
        Mutation::Delete => false,
    };
    if e.field == mutated {
        return Some(Naming::Exact);
    }
    if is_under(&mutated, &e.field) {
        return Some(Naming::Enclosing);
    }
    if container && is_under(&e.field, &mutated) {
        return Some(Naming::Inside);
    }
    consequences(doc, &case.path)
        .0
        .into_iter()
        .find(|(field, reason, _)| *field == e.field && e.reason.contains(reason))
        .map(|(_, _, rule)| Naming::Consequence(rule))
}

/// What one case did: accepted, or refused and named how.
type Outcome = Option<Naming>;

fn check(case: &Case) -> Result<Outcome, TestCaseError> {
    let doc = apply(case);
    let json = serde_json::to_string(&doc).unwrap();
    let Ok(result) = catch_unwind(AssertUnwindSafe(|| parse(json.as_bytes()).map(drop))) else {
        return Err(TestCaseError::fail(format!(
            "parse panicked on {json}\n(mutation {case:?})"
        )));
    };
    let Err(e) = result else {
        return Ok(None);
    };
    let shown = e.to_string();
    prop_assert!(
        !e.reason.trim().is_empty(),
        "empty reason: {e:?} for {json}"
    );
    prop_assert!(
        shown.contains(&e.field),
        "{shown:?} does not show the field {:?}",
        e.field
    );
    let named = naming(&doc, case, &e);
    prop_assert!(
        named.is_some(),
        "the refusal `{shown}` does not name the mutated place `{}` ({:?} in {})\ndocument: {json}",
        render(&case.path),
        case.mutation,
        examples()[case.example].0,
    );
    Ok(named)
}

#[test]
fn every_example_is_valid() {
    let names: Vec<&str> = examples().iter().map(|(n, _)| n.as_str()).collect();
    for expected in [
        "algorithms-bypass.json",
        "default-policy.json",
        "global.json",
        "layered.json",
        "per-ip-fallback.json",
        "per-user.json",
        "shadow.json",
        "tiers-cost.json",
        "tokens.json",
        "concurrency.json",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    for (name, doc) in examples() {
        if let Err(e) = parse(doc.to_string().as_bytes()) {
            panic!("{name} is refused: {e}");
        }
    }
}

/// `render` writes paths exactly as the parser names fields, for every kind of step: member,
/// array element, map entry (a tier), at the top level and nested.
#[test]
fn paths_are_written_as_the_parser_writes_them() {
    let example = examples()
        .iter()
        .position(|(n, _)| n == "tiers-cost.json")
        .unwrap();
    let refused_at = |path: Vec<Seg>, value: Value, expected: &str| {
        assert_eq!(render(&path), expected);
        let case = Case {
            example,
            path,
            mutation: Mutation::Replace(value),
        };
        let e = parse(apply(&case).to_string().as_bytes()).unwrap_err();
        assert_eq!(e.field, expected, "{e}");
    };
    let policy = vec![key("policies"), Seg::Index(0)];
    refused_at(
        join(&policy, &[key("key"), Seg::Index(0)]),
        "cookie:x".into(),
        "policies[0].key[0]",
    );
    refused_at(
        join(
            &policy,
            &[key("tiers"), key("values"), key("premium"), key("burst")],
        ),
        Value::from(1),
        "policies[0].tiers.values.premium.burst",
    );
    refused_at(
        join(&policy, &[key("match"), key("methods"), Seg::Index(0)]),
        Value::from(1),
        "policies[0].match.methods[0]",
    );
    refused_at(
        join(&policy, &[key("match"), key("path_prefix")]),
        "x".into(),
        "policies[0].match.path_prefix",
    );
    refused_at(vec![key("headers")], "rfc".into(), "headers");
}

#[test]
fn every_refusal_names_the_mutated_place() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CASES);
    let mut runner = TestRunner::new(Config {
        cases,
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    });
    let seen: RefCell<BTreeMap<Outcome, u32>> = RefCell::default();
    let result = runner.run(&case(), |case| {
        let outcome = check(&case)?;
        *seen.borrow_mut().entry(outcome).or_default() += 1;
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    let seen = seen.into_inner();
    eprintln!("outcomes of {cases} cases:");
    for (outcome, n) in &seen {
        eprintln!("{n:>7}  {outcome:?}");
    }
    // Not vacuous: most mutations are refused, and by each kind of naming.
    let refused: u32 = seen
        .iter()
        .filter(|(o, _)| o.is_some())
        .map(|(_, n)| n)
        .sum();
    assert!(
        u64::from(refused) * 2 > u64::from(cases),
        "only {refused} of {cases} refused"
    );
    if cases >= CASES {
        for kind in [Naming::Exact, Naming::Enclosing, Naming::Inside] {
            assert!(seen.contains_key(&Some(kind)), "no refusal named {kind:?}");
        }
        assert!(
            seen.keys()
                .any(|o| matches!(o, Some(Naming::Consequence(_)))),
            "no cross-field consequence exercised"
        );
    }
}

/// Found by the property above: expiries past the end of u64 nanoseconds used to panic (debug)
/// or wrap around into an already expired bypass (release).
#[test]
fn far_future_expiry_is_refused() {
    for expires in [
        "2554-07-21T23:34:34Z",
        "2554-07-21T23:34:33.9Z",
        "9999-12-31T23:59:59Z",
    ] {
        let config = serde_json::json!({
            "policies": [{"name": "a", "key": ["ip"], "requests": 1, "per": "1s"}],
            "bypass": [{"key": ["x"], "policies": ["a"], "owner": "o", "reason": "r",
                "expires": expires}],
        });
        let outcome = catch_unwind(|| parse(config.to_string().as_bytes()).map(drop));
        match outcome {
            Err(_) => panic!("parse panicked on expires {expires:?}"),
            Ok(result) => assert_eq!(result.unwrap_err().field, "bypass[0].expires", "{expires}"),
        }
    }
}
