//! `--format json`: the replay as one JSON object, for scripts and CI.
//!
//! ```json
//! {"policies": {"NAME": {"matched": N, "allowed": N, "denied": N, "shadow_denied": N,
//!    "bypassed": N, "denied_share": F, "busiest_second": {"start": T, "requests": N},
//!    "top_keys": [{"key": HASH, "denied": N}], "tiers": {"VALUE": {...}},
//!    "rollout": {"enforce_percent": P, "enforced": {"matched": N, "allowed": N, "denied": N},
//!                "shadowed": {"matched": N, "allowed": N, "would_deny": N}},
//!    "tokens": {"settled": N, "reserved": N, "charged": N, "refunded": N, "owed": N,
//!               "forgiven": N, "refused_in_debt": N,
//!               "usage_unknown": {"missing": N, "invalid": N, "reset": N, "not_logged": N}},
//!    "concurrency": {"peak": N, "top_keys": [{"key": HASH, "in_flight": N}]}}},
//!  "lines": N, "skipped": N, "skipped_lines": [{"line": N, "reason": S}], "late": N,
//!  "filter_off": N, "requests": N, "denied": N, "no_duration": N,
//!  "check": {"compared": N, "agreed": N, "disagreements": [{"line": N,
//!    "replayed_status": N or null, "response_code": N, "response_code_details": S}]},
//!  "compare": {"requests": N, "changed": N, "policies": {"NAME": {...}}}}
//! ```
//! A top key's `denied` counts denials and shadow denials; `error` (when not 0) says by how much
//! it may be over (see `sluice::core::top_keys`), and `value` is the key's value with `--show-keys`: its parts, a
//! list of strings, or `null` for the bucket of requests missing the key (as is a `--compare`
//! example's). `filter_off` counts the requests of routes that switch the filter off (they count
//! in `requests`). `tiers` is there for a policy with tiers, `rollout` for one with a rollout
//! (its `shadowed.would_deny` is what the filter counts as `canary_shadow_denied`), `tokens` for
//! a token budget (counted as the filter's `sluice_tokens_*_total` and
//! `sluice_usage_unknown_total`), `concurrency` for a concurrency limit, `no_duration` when some
//! policy holds something until a request ends, `check` with `--check`, `compare` with
//! `--compare`. `denied_share` counts would-be denials too: the share denied were the policy
//! enforced for every key.

use crate::check::Check;
use crate::compare::{Changes, Comparison, Example};
use crate::engine::TokenTally;
use crate::report::{KeyValue, Report, SlotStats, Stats};
use crate::run::Replay;
use serde_json::{json, Map, Value};
use sluice::core::time::format_rfc3339;
use sluice::output::metrics::UsageUnknown;

/// How many keys a report lists per policy and tier.
pub const TOP_KEYS: usize = 10;

pub fn render(replay: &Replay) -> Value {
    let mut out = report(&replay.report);
    if let Some(check) = &replay.check {
        out.insert("check".into(), self::check(check));
    }
    if let Some(comparison) = &replay.comparison {
        out.insert("compare".into(), compare(comparison));
    }
    Value::Object(out)
}

/// The fields of a `json!` object, for more to be added.
fn fields(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

fn report(report: &Report) -> Map<String, Value> {
    let policies: Map<String, Value> = report
        .policies
        .iter()
        .map(|p| {
            let mut policy = fields(stats(&p.all));
            if !p.tiers.is_empty() {
                let tiers = p.tiers.iter().map(|(name, s)| (name.clone(), stats(s)));
                policy.insert("tiers".into(), Value::Object(tiers.collect()));
            }
            if let Some(r) = &p.rollout {
                let (e, s) = (&r.enforced, &r.shadowed);
                let rollout = json!({"enforce_percent": r.enforce_percent,
                    "enforced": {"matched": e.matched, "allowed": e.allowed, "denied": e.denied},
                    "shadowed": {"matched": s.matched, "allowed": s.allowed, "would_deny": s.denied}});
                policy.insert("rollout".into(), rollout);
            }
            if let Some(t) = &p.tokens {
                policy.insert("tokens".into(), tokens(t));
            }
            if let Some(slots) = &p.slots {
                policy.insert("concurrency".into(), concurrency(slots));
            }
            (p.name.clone(), Value::Object(policy))
        })
        .collect();
    let skipped_lines: Vec<Value> = report
        .skipped_lines
        .iter()
        .map(|(line, reason)| json!({"line": line, "reason": reason}))
        .collect();
    let mut out = fields(json!({
        "policies": policies,
        "lines": report.lines,
        "skipped": report.skipped,
        "skipped_lines": skipped_lines,
        "late": report.late,
        "filter_off": report.filter_off,
        "requests": report.requests,
        "denied": report.denied,
    }));
    if let Some(n) = report.no_duration {
        out.insert("no_duration".into(), json!(n));
    }
    out
}

fn tokens(t: &TokenTally) -> Value {
    let mut unknown: Map<String, Value> = UsageUnknown::ALL
        .iter()
        .zip(t.unknown)
        .map(|(why, n)| (why.as_str().to_string(), json!(n)))
        .collect();
    unknown.insert("not_logged".into(), json!(t.not_logged));
    json!({"settled": t.settled, "reserved": t.reserved, "charged": t.charged,
           "refunded": t.refunded, "owed": t.owed, "forgiven": t.forgiven,
           "refused_in_debt": t.refused_in_debt, "usage_unknown": unknown})
}

fn concurrency(slots: &SlotStats) -> Value {
    let top_keys: Vec<Value> = slots
        .top
        .top(TOP_KEYS)
        .into_iter()
        .map(|c| {
            let mut key = fields(json!({"key": format!("{:016x}", c.key), "in_flight": c.count}));
            if let Some(value) = &c.value {
                key.insert("value".into(), key_value(value));
            }
            Value::Object(key)
        })
        .collect();
    json!({"peak": slots.peak, "top_keys": top_keys})
}

fn stats(stats: &Stats) -> Value {
    let t = &stats.tally;
    let (second, requests) = stats.busiest.best;
    let busiest = (requests > 0).then(|| {
        json!({"start": format_rfc3339(second * sluice::core::duration::NANOS_PER_SEC), "requests": requests})
    });
    let top_keys: Vec<Value> = stats
        .top
        .top(TOP_KEYS)
        .into_iter()
        .map(|c| {
            let mut key = fields(json!({"key": format!("{:016x}", c.key), "denied": c.count}));
            if c.error > 0 {
                key.insert("error".into(), json!(c.error));
            }
            if let Some(value) = &c.value {
                key.insert("value".into(), key_value(value));
            }
            Value::Object(key)
        })
        .collect();
    json!({
        "matched": t.matched,
        "allowed": t.allowed,
        "denied": t.denied,
        "shadow_denied": t.shadow_denied,
        "bypassed": t.bypassed,
        "denied_share": t.denied_share(),
        "busiest_second": busiest,
        "top_keys": top_keys,
    })
}

fn check(check: &Check) -> Value {
    let disagreements: Vec<Value> = check
        .disagreements
        .iter()
        .map(|d| {
            json!({"line": d.line, "replayed_status": d.replayed,
                   "response_code": d.response_code, "response_code_details": d.details})
        })
        .collect();
    json!({"compared": check.compared, "agreed": check.agreed, "disagreements": disagreements})
}

fn compare(comparison: &Comparison) -> Value {
    let policies: Map<String, Value> = comparison
        .policies
        .iter()
        .map(|(name, changes)| (name.clone(), self::changes(changes)))
        .collect();
    json!({"requests": comparison.requests, "changed": comparison.changed, "policies": policies})
}

fn changes(changes: &Changes) -> Value {
    let examples: Vec<Value> = changes.examples.iter().map(example).collect();
    json!({"newly_denied": changes.newly_denied, "newly_allowed": changes.newly_allowed,
           "examples": examples})
}

fn example(e: &Example) -> Value {
    let mut example = fields(json!({"line": e.line, "start_time": format_rfc3339(e.time),
        "method": e.method, "path": e.path, "key": e.key, "now_denied": e.now_denied}));
    if let Some(value) = &e.value {
        example.insert("value".into(), key_value(value));
    }
    Value::Object(example)
}

/// A key's value: its parts as a list of strings, `null` for the bucket of requests missing it.
fn key_value(value: &KeyValue) -> Value {
    match value {
        KeyValue::Parts(parts) => json!(parts),
        KeyValue::Missing => Value::Null,
    }
}
