//! `--format text` (the default): the replay as an operator reads it, a table of policies (and
//! their tiers), the groups of each rollout, what each token budget charged and each concurrency
//! limit held in flight, each policy's most denied keys, then what `--check` and `--compare`
//! found.

use crate::check::Check;
use crate::compare::Comparison;
use crate::engine::TokenTally;
use crate::json::TOP_KEYS;
use crate::report::{Report, RolloutReport, SlotStats, Stats};
use crate::run::Replay;
use sluice::core::duration::NANOS_PER_SEC;
use sluice::core::time::format_rfc3339;
use sluice::output::metrics::UsageUnknown;
use std::fmt::Write;

pub fn render(replay: &Replay) -> String {
    let mut out = String::new();
    report(&mut out, &replay.report);
    if let Some(check) = &replay.check {
        self::check(&mut out, check);
    }
    if let Some(comparison) = &replay.comparison {
        compare(&mut out, comparison);
    }
    out
}

fn report(out: &mut String, r: &Report) {
    let filter_off = if r.filter_off > 0 {
        format!(" ({} on routes that switch the filter off)", r.filter_off)
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "{} lines: {} requests replayed{filter_off}, {} denied; {} lines skipped, {} late",
        r.lines, r.requests, r.denied, r.skipped, r.late
    );
    for (line, reason) in &r.skipped_lines {
        let _ = writeln!(out, "  skipped line {line}: {reason}");
    }
    if r.skipped > r.skipped_lines.len() as u64 {
        let _ = writeln!(
            out,
            "  ... and {} more",
            r.skipped - r.skipped_lines.len() as u64
        );
    }
    if let Some(n) = r.no_duration.filter(|&n| n > 0) {
        let _ = writeln!(
            out,
            "  {n} requests holding a slot or reservation have no duration: they ended as they started"
        );
    }
    let _ = writeln!(
        out,
        "\n{:<28} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8}  busiest second",
        "policy", "matched", "allowed", "denied", "shadow", "bypassed", "denied%"
    );
    for policy in &r.policies {
        row(out, &policy.name, &policy.all);
        for (tier, stats) in &policy.tiers {
            row(out, &format!("  tier {tier}"), stats);
        }
    }
    for policy in &r.policies {
        if let Some(rollout) = &policy.rollout {
            rollout_line(out, &policy.name, rollout);
        }
    }
    for policy in &r.policies {
        if let Some(tokens) = &policy.tokens {
            tokens_lines(out, &policy.name, tokens);
        }
        if let Some(slots) = &policy.slots {
            in_flight(out, &policy.name, slots);
        }
    }
    for policy in &r.policies {
        top_keys(out, &policy.name, &policy.all);
    }
}

fn tokens_lines(out: &mut String, name: &str, t: &TokenTally) {
    let _ = writeln!(
        out,
        "\n{name}: {} responses settled: {} tokens reserved, {} charged, {} refunded; {} owed past \
         the limit, {} forgiven; refused for debt: {}",
        t.settled, t.reserved, t.charged, t.refunded, t.owed, t.forgiven, t.refused_in_debt
    );
    if t.unknown.iter().any(|&n| n > 0) || t.not_logged > 0 {
        let why = UsageUnknown::ALL.iter().zip(t.unknown);
        let why: Vec<String> = why.map(|(w, n)| format!("{n} {}", w.as_str())).collect();
        let _ = writeln!(
            out,
            "  usage unknown (charged as on_unknown says): {}; {} not in the log",
            why.join(", "),
            t.not_logged
        );
    }
}

fn in_flight(out: &mut String, name: &str, slots: &SlotStats) {
    let _ = writeln!(
        out,
        "\n{name}: at most {} requests of a key in flight at once",
        slots.peak
    );
    for counted in slots.top.top(TOP_KEYS) {
        let value = counted.value.map(|v| format!("  {v}")).unwrap_or_default();
        let _ = writeln!(out, "  {:016x} {:>10}{value}", counted.key, counted.count);
    }
}

fn row(out: &mut String, name: &str, stats: &Stats) {
    let t = &stats.tally;
    let (second, requests) = stats.busiest.best;
    let busiest = if requests > 0 {
        format!("{} ({requests})", format_rfc3339(second * NANOS_PER_SEC))
    } else {
        "-".into()
    };
    let _ = writeln!(
        out,
        "{name:<28} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7.2}%  {busiest}",
        t.matched,
        t.allowed,
        t.denied,
        t.shadow_denied,
        t.bypassed,
        100.0 * t.denied_share()
    );
}

fn rollout_line(out: &mut String, name: &str, r: &RolloutReport) {
    let (e, s) = (&r.enforced, &r.shadowed);
    let _ = writeln!(
        out,
        "\n{name}: rollout to {}% of keys: enforced for {} requests ({} denied), shadow for {} \
         ({} would have been denied)",
        r.enforce_percent, e.matched, e.denied, s.matched, s.denied
    );
}

fn top_keys(out: &mut String, name: &str, stats: &Stats) {
    let top = stats.top.top(TOP_KEYS);
    if top.is_empty() {
        return;
    }
    let _ = writeln!(out, "\n{name}: keys denied most (shadow denials included)");
    for counted in top {
        let error = if counted.error > 0 {
            format!(" (may be up to {} over)", counted.error)
        } else {
            String::new()
        };
        let value = counted.value.map(|v| format!("  {v}")).unwrap_or_default();
        let _ = writeln!(
            out,
            "  {:016x} {:>10}{error}{value}",
            counted.key, counted.count
        );
    }
}

fn check(out: &mut String, check: &Check) {
    let share = if check.compared == 0 {
        100.0
    } else {
        100.0 * check.agreed as f64 / check.compared as f64
    };
    let _ = writeln!(
        out,
        "\ncheck: {} of {} requests with a response code agree with Envoy ({share:.3}%)",
        check.agreed, check.compared
    );
    for d in &check.disagreements {
        let replayed = d
            .replayed
            .map_or("passed".into(), |s| format!("refused with {s}"));
        let code = d.response_code.map_or("-".into(), |c| c.to_string());
        let details = d.details.as_deref().unwrap_or("-");
        let _ = writeln!(
            out,
            "  line {}: replayed {replayed}; Envoy answered {code} ({details})",
            d.line
        );
    }
}

fn compare(out: &mut String, comparison: &Comparison) {
    let _ = writeln!(
        out,
        "\ncompare: {} of {} requests change outcome",
        comparison.changed, comparison.requests
    );
    for (name, changes) in &comparison.policies {
        let _ = writeln!(
            out,
            "  {name}: {} newly denied, {} no longer denied",
            changes.newly_denied, changes.newly_allowed
        );
        for e in &changes.examples {
            let now = if e.now_denied {
                "now denied"
            } else {
                "no longer denied"
            };
            let value = e
                .value
                .as_ref()
                .map(|v| format!(" {v}"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "    line {} {} {} {} key {}{value}: {now}",
                e.line,
                format_rfc3339(e.time),
                e.method,
                e.path,
                e.key
            );
        }
    }
}
