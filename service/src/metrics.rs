//! Every series the service exports, in one Prometheus registry that `GET /metrics` renders in
//! the OpenMetrics text format. Another front end adds its own series to `registry_mut` before
//! the service starts serving. The series are listed in docs/service-api.md.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::{text, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::stores::{Check, Decision, FailureKind, Settled, Settlement};

/// The content type of `render`'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds of the latency buckets, in seconds; Redis answers in well under a millisecond,
/// and the command timeout is 1 s.
const LATENCY_BOUNDS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Distinct policies not listed in `--metric-policies` that get a `policy` label of their own;
/// later ones count under `OTHER`.
pub const MAX_POLICIES: usize = 100;
/// The `policy` label of checks past `MAX_POLICIES`, or whose key is not `<policy>/...` with a
/// policy name the filter accepts. Parentheses keep it apart from every real policy name.
pub const OTHER: &str = "(other)";
/// The filter's bound on policy names (`^[A-Za-z0-9_.-]{1,64}$`).
const MAX_POLICY_NAME: usize = 64;

/// A `--metric-policies` name: one the filter accepts.
pub fn policy_name(text: &str) -> Result<String, String> {
    if is_policy_name(text) {
        Ok(text.to_string())
    } else {
        Err("a policy name is 1 to 64 of A-Z a-z 0-9 _ . -".to_string())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabels {
    policy: String,
    algorithm: &'static str,
    result: &'static str,
}

/// Bounded: four ops, three results.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SettlementLabels {
    op: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RedisErrorLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    path: &'static str,
    status: u16,
}

pub struct Metrics {
    registry: Registry,
    checks: Family<CheckLabels, Counter>,
    settlements: Family<SettlementLabels, Counter>,
    check_duration: Histogram,
    redis_errors: Family<RedisErrorLabels, Counter>,
    redis_up: Gauge,
    slots_unrenewed: Gauge,
    http_requests: Family<HttpLabels, Counter>,
    policies: PolicyNames,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new(&[])
    }
}

impl Metrics {
    /// The `listed` policies (`--metric-policies`) always have a `policy` label of their own.
    pub fn new(listed: &[String]) -> Metrics {
        let mut metrics = Metrics {
            registry: Registry::with_prefix("sluice_service"),
            checks: Family::default(),
            settlements: Family::default(),
            check_duration: Histogram::new(LATENCY_BOUNDS),
            redis_errors: Family::default(),
            redis_up: Gauge::default(),
            slots_unrenewed: Gauge::default(),
            http_requests: Family::default(),
            policies: PolicyNames {
                listed: listed.iter().cloned().collect(),
                seen: Mutex::default(),
            },
        };
        metrics.register();
        metrics
    }

    fn register(&mut self) {
        let registry = &mut self.registry;
        registry.register(
            "checks",
            "Checks decided or failed, by policy (the key's part before '/'), algorithm and \
             result (allowed, denied, error)",
            self.checks.clone(),
        );
        registry.register(
            "settlements",
            "Settlements of POST /v1/settle, by op (charge, refund, release, renew) and result \
             (applied: tokens or a slot settled; unchanged: nothing left to settle; duplicate: \
             a charge or refund whose id was applied before; rejected: refused and dropped, the \
             others of its call applied; error)",
            self.settlements.clone(),
        );
        registry.register_with_unit(
            "check_duration",
            "Time to decide one valid request's checks, Redis included",
            prometheus_client::registry::Unit::Seconds,
            self.check_duration.clone(),
        );
        registry.register(
            "redis_errors",
            "Requests whose checks failed because of Redis, by kind",
            self.redis_errors.clone(),
        );
        registry.register(
            "redis_up",
            "1 while Redis answers the readiness probe, else 0",
            self.redis_up.clone(),
        );
        registry.register(
            "slots_unrenewed",
            "Live slots of global concurrency limits whose request has not renewed them in \
             time (half a lease, plus 5 s at most a quarter lease, since the last renewal): \
             leaks, or filters that cannot reach the service. Keys of slots this process \
             granted lately, looked at every 2 s",
            self.slots_unrenewed.clone(),
        );
        registry.register(
            "http_requests",
            "HTTP requests answered, by path and status",
            self.http_requests.clone(),
        );
        let version = [("version", env!("CARGO_PKG_VERSION"))];
        registry.register("build", "The service's version", Info::new(version));
    }

    /// Where another front end registers its series (before serving).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// One count per check, labelled with its policy, algorithm and what was decided.
    pub fn record_decisions(&self, checks: &[Check], decisions: &[Decision]) {
        for (check, decision) in checks.iter().zip(decisions) {
            let result = if decision.allowed {
                "allowed"
            } else {
                "denied"
            };
            self.count_check(check, result);
        }
    }

    /// A request whose checks all failed: each counts as an error, the request once by kind.
    pub fn record_failure(&self, checks: &[Check], kind: FailureKind) {
        for check in checks {
            self.count_check(check, "error");
        }
        let labels = RedisErrorLabels { kind: kind.name() };
        self.redis_errors.get_or_create(&labels).inc();
    }

    /// One count per settlement: applied if it changed something, duplicate if its id had been
    /// applied before.
    pub fn record_settlements(&self, settlements: &[Settlement], settled: &[Settled]) {
        for (settlement, &done) in settlements.iter().zip(settled) {
            let result = match done {
                Settled::Duplicate => "duplicate",
                _ if done.changed() => "applied",
                Settled::Applied(_) => "unchanged",
            };
            self.count_settlement(settlement, result);
        }
    }

    /// Settlements refused one by one and dropped (`settle::Parsed::rejected`), by op.
    pub fn record_rejected(&self, ops: impl Iterator<Item = &'static str>) {
        for op in ops {
            let labels = SettlementLabels {
                op,
                result: "rejected",
            };
            self.settlements.get_or_create(&labels).inc();
        }
    }

    /// Settlements that failed on Redis: each counts as an error, the request once by kind.
    pub fn record_settle_failure(&self, settlements: &[Settlement], kind: FailureKind) {
        for settlement in settlements {
            self.count_settlement(settlement, "error");
        }
        let labels = RedisErrorLabels { kind: kind.name() };
        self.redis_errors.get_or_create(&labels).inc();
    }

    fn count_settlement(&self, settlement: &Settlement, result: &'static str) {
        let op = settlement.op.name();
        self.settlements
            .get_or_create(&SettlementLabels { op, result })
            .inc();
    }

    fn count_check(&self, check: &Check, result: &'static str) {
        let labels = CheckLabels {
            policy: self.policies.label(&check.key),
            algorithm: check.algorithm.name(),
            result,
        };
        self.checks.get_or_create(&labels).inc();
    }

    pub fn observe_check_duration(&self, elapsed: Duration) {
        self.check_duration.observe(elapsed.as_secs_f64());
    }

    pub fn set_slots_unrenewed(&self, slots: u64) {
        self.slots_unrenewed
            .set(i64::try_from(slots).unwrap_or(i64::MAX));
    }

    pub fn set_redis_up(&self, up: bool) {
        self.redis_up.set(i64::from(up));
    }

    pub fn record_http(&self, path: &'static str, status: u16) {
        let labels = HttpLabels { path, status };
        self.http_requests.get_or_create(&labels).inc();
    }

    pub fn render(&self) -> String {
        let mut body = String::new();
        // Writing to a String cannot fail.
        let _ = text::encode(&mut body, &self.registry);
        body
    }
}

/// The policy names that have a label: the listed ones, and the first `MAX_POLICIES` others
/// seen. A caller sending made-up keys can neither grow the number of series without bound nor
/// take a listed policy's label.
#[derive(Default)]
struct PolicyNames {
    listed: HashSet<String>,
    seen: Mutex<HashSet<String>>,
}

impl PolicyNames {
    /// The `policy` label of a check key `<policy>/<hash>`.
    fn label(&self, key: &str) -> String {
        let Some(name) = key.split_once('/').map(|(name, _)| name) else {
            return OTHER.to_string();
        };
        if !is_policy_name(name) {
            return OTHER.to_string();
        }
        if self.listed.contains(name) {
            return name.to_string();
        }
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.contains(name) || seen.len() < MAX_POLICIES && seen.insert(name.to_string()) {
            name.to_string()
        } else {
            OTHER.to_string()
        }
    }
}

fn is_policy_name(name: &str) -> bool {
    (1..=MAX_POLICY_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stores::{Algorithm, Namespace, Slots};

    fn check(key: &str) -> Check {
        Check {
            namespace: Namespace::Http,
            key: key.to_string(),
            algorithm: Algorithm::FixedWindow {
                limit: 5,
                window_us: 1_000_000,
            },
            cost: 1,
            take: 1,
            debt: 0,
            slots: Slots::Anonymous,
            state_of: None,
        }
    }

    fn decision(allowed: bool) -> Decision {
        Decision {
            allowed,
            granted: 0,
            remaining: 0,
            reset_us: 0,
            retry_after_us: 0,
            delay_us: None,
        }
    }

    fn assert_lines(text: &str, lines: &[&str]) {
        for line in lines {
            assert!(
                text.lines().any(|l| l == *line),
                "missing {line:?} in\n{text}"
            );
        }
    }

    #[test]
    fn checks_count_by_policy_algorithm_and_result_and_failures_by_kind() {
        let metrics = Metrics::default();
        let checks = [
            check("per-user/00ff"),
            check("per-user/0a0a"),
            check("tenant/1"),
        ];
        let decisions = [decision(true), decision(false), decision(false)];
        metrics.record_decisions(&checks, &decisions);
        metrics.record_failure(&checks[2..], FailureKind::Timeout);
        metrics.observe_check_duration(Duration::from_micros(700));
        metrics.set_redis_up(true);
        metrics.record_http("/v1/check", 401);
        assert_lines(
            &metrics.render(),
            &[
                r#"sluice_service_checks_total{policy="per-user",algorithm="fixed_window",result="allowed"} 1"#,
                r#"sluice_service_checks_total{policy="per-user",algorithm="fixed_window",result="denied"} 1"#,
                r#"sluice_service_checks_total{policy="tenant",algorithm="fixed_window",result="denied"} 1"#,
                r#"sluice_service_checks_total{policy="tenant",algorithm="fixed_window",result="error"} 1"#,
                r#"sluice_service_redis_errors_total{kind="timeout"} 1"#,
                r#"sluice_service_check_duration_seconds_bucket{le="0.0005"} 0"#,
                r#"sluice_service_check_duration_seconds_bucket{le="0.001"} 1"#,
                "sluice_service_check_duration_seconds_count 1",
                "sluice_service_redis_up 1",
                r#"sluice_service_http_requests_total{path="/v1/check",status="401"} 1"#,
                concat!(
                    r#"sluice_service_build_info{version=""#,
                    env!("CARGO_PKG_VERSION"),
                    r#""} 1"#
                ),
                "# EOF",
            ],
        );
    }

    #[test]
    fn policies_past_the_bound_or_not_named_as_the_filter_names_them_count_as_other() {
        let names = PolicyNames::default();
        for n in 0..MAX_POLICIES {
            assert_eq!(names.label(&format!("p{n}/1")), format!("p{n}"));
        }
        assert_eq!(names.label("one-too-many/1"), OTHER);
        assert_eq!(names.label("p0/2"), "p0", "a known policy keeps its label");
        let fresh = PolicyNames::default();
        let long = format!("{}/1", "a".repeat(65));
        for key in ["no-slash", "/1", "a:b/1", long.as_str()] {
            assert_eq!(fresh.label(key), OTHER, "{key}");
        }
        assert_eq!(fresh.label(&format!("{}/1", "a".repeat(64))).len(), 64);
    }

    #[test]
    fn made_up_names_cannot_push_a_listed_policy_into_other() {
        let metrics = Metrics::new(&["checkout".to_string()]);
        for n in 0..MAX_POLICIES + 5 {
            assert_ne!(
                metrics.policies.label(&format!("made-up-{n}/1")),
                "checkout"
            );
        }
        assert_eq!(metrics.policies.label("made-up-extra/1"), OTHER);
        assert_eq!(metrics.policies.label("checkout/7af1"), "checkout");
        assert!(policy_name("per user").is_err());
        assert_eq!(policy_name("per-user").unwrap(), "per-user");
    }
}
