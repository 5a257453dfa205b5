//! The RLS's Prometheus series, per domain and descriptor as envoyproxy/ratelimit's users graph
//! them (`total_hits`, `over_limit`, `near_limit`, `within_limit`, `shadow_mode`), registered in
//! the service's one registry.
//!
//! Their size stays bounded, in series and in bytes: a descriptor's label comes from the
//! configuration (its path of keys and configured values), so there are as many series as
//! configured limits. Only limits with `detailed_metric` (or `value_to_metric` on the way) put the
//! request's values in the label; such a label longer than `MAX_LABEL_BYTES` is cut and ends in
//! a hash of the whole, and at most `MAX_VALUE_SERIES` of them are ever created (later ones
//! count under the configured label). Counters saturate instead of wrapping.

use std::collections::{HashMap, HashSet};
use std::hash::Hasher;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::answer::Tally;
use crate::rules::watch::CountsLoads;

/// How many labels made of request values are created at most, over all domains.
pub const MAX_VALUE_SERIES: usize = 10_000;
/// The longest label made of request values: longer ones keep their first bytes and end in
/// `~` and 16 hex digits of a hash of the whole label.
pub const MAX_LABEL_BYTES: usize = 128;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DescriptorLabels {
    domain: String,
    descriptor: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

type PerDescriptor = Family<DescriptorLabels, Counter>;

/// The counters of one label set, each taken from its family the first time it counts (as
/// the family would create it), then added to directly.
struct Series {
    labels: DescriptorLabels,
    total_hits: OnceLock<Counter>,
    over_limit: OnceLock<Counter>,
    near_limit: OnceLock<Counter>,
    within_limit: OnceLock<Counter>,
    shadow_mode: OnceLock<Counter>,
}

impl Series {
    fn new(labels: DescriptorLabels) -> Series {
        Series {
            labels,
            total_hits: OnceLock::new(),
            over_limit: OnceLock::new(),
            near_limit: OnceLock::new(),
            within_limit: OnceLock::new(),
            shadow_mode: OnceLock::new(),
        }
    }
}

/// The series of labels from the configuration alone, by domain and descriptor: as many as
/// configured limits, found without building a label set.
type Configured = HashMap<String, HashMap<String, Arc<Series>>>;

/// Why a call was answered with an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Redis failed or did not answer in time: `UNAVAILABLE`.
    Redis,
    /// The request was refused (empty domain, no descriptors, too many, a bad override).
    Request,
    /// No valid bearer token (`--token-file`): `UNAUTHENTICATED`.
    Unauthenticated,
}

pub struct RlsMetrics {
    total_hits: PerDescriptor,
    over_limit: PerDescriptor,
    near_limit: PerDescriptor,
    within_limit: PerDescriptor,
    shadow_mode: PerDescriptor,
    errors: Family<KindLabels, Counter>,
    unknown_domain: Counter,
    config_loads: Family<ResultLabels, Counter>,
    domains: Gauge,
    /// The labels made of request values created so far.
    value_labels: Mutex<HashSet<DescriptorLabels>>,
    configured: RwLock<Configured>,
}

impl RlsMetrics {
    /// Creates the series and registers them in `registry`, under the prefix `rls`.
    pub fn register(registry: &mut Registry) -> RlsMetrics {
        let registry = registry.sub_registry_with_prefix("rls");
        let metrics = RlsMetrics {
            total_hits: Family::default(),
            over_limit: Family::default(),
            near_limit: Family::default(),
            within_limit: Family::default(),
            shadow_mode: Family::default(),
            errors: Family::default(),
            unknown_domain: Counter::default(),
            config_loads: Family::default(),
            domains: Gauge::default(),
            value_labels: Mutex::new(HashSet::new()),
            configured: RwLock::default(),
        };
        // prometheus-client ends each help text with a full stop itself.
        for (name, help, family) in [
            (
                "total_hits",
                "Hits (hits_addend) checked against a limit",
                &metrics.total_hits,
            ),
            (
                "over_limit",
                "Hits refused by a limit (in shadow mode too)",
                &metrics.over_limit,
            ),
            (
                "near_limit",
                "Allowed hits above 80% of a limit",
                &metrics.near_limit,
            ),
            (
                "within_limit",
                "Hits a limit allowed",
                &metrics.within_limit,
            ),
            (
                "shadow_mode",
                "Hits a limit in shadow mode would have refused",
                &metrics.shadow_mode,
            ),
        ] {
            registry.register(name, help, family.clone());
        }
        registry.register(
            "errors",
            "ShouldRateLimit calls answered with an error, by kind (redis, request, \
             unauthenticated)",
            metrics.errors.clone(),
        );
        registry.register(
            "unknown_domain",
            "ShouldRateLimit calls for a domain the configuration does not have",
            metrics.unknown_domain.clone(),
        );
        registry.register(
            "config_loads",
            "Configuration loads, by result (success, error)",
            metrics.config_loads.clone(),
        );
        registry.register(
            "config_domains",
            "Domains in the configuration in force",
            metrics.domains.clone(),
        );
        metrics
    }

    /// Counts one call's limits in `domain`.
    pub fn record(&self, domain: &str, tallies: &[Tally]) {
        for tally in tallies {
            if tally.label == tally.fallback {
                self.add(&self.configured(domain, tally.label), tally);
            } else {
                self.add(&Series::new(self.value_labels(domain, tally)), tally);
            }
        }
    }

    fn add(&self, series: &Series, tally: &Tally) {
        let add = |counter: &OnceLock<Counter>, family: &PerDescriptor, n: u64| {
            let counter = counter.get_or_init(|| family.get_or_create(&series.labels).clone());
            saturating_add(counter, n);
        };
        add(&series.total_hits, &self.total_hits, tally.hits);
        if tally.over_limit {
            add(&series.over_limit, &self.over_limit, tally.hits);
        } else {
            add(&series.within_limit, &self.within_limit, tally.hits);
        }
        if tally.near_limit > 0 {
            add(&series.near_limit, &self.near_limit, tally.near_limit);
        }
        if tally.shadow_mode {
            add(&series.shadow_mode, &self.shadow_mode, tally.hits);
        }
    }

    /// The series of a label from the configuration alone.
    fn configured(&self, domain: &str, label: &str) -> Arc<Series> {
        let known = (self
            .configured
            .read()
            .unwrap_or_else(PoisonError::into_inner))
        .get(domain)
        .and_then(|descriptors| descriptors.get(label))
        .cloned();
        if let Some(series) = known {
            return series;
        }
        let mut configured = self
            .configured
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let descriptors = configured.entry(domain.to_string()).or_default();
        let series = descriptors.entry(label.to_string()).or_insert_with(|| {
            Arc::new(Series::new(DescriptorLabels {
                domain: domain.to_string(),
                descriptor: label.to_string(),
            }))
        });
        Arc::clone(series)
    }

    /// The tally's label with request values (cut to `MAX_LABEL_BYTES`) while fewer than
    /// `MAX_VALUE_SERIES` exist.
    fn value_labels(&self, domain: &str, tally: &Tally) -> DescriptorLabels {
        let labels = DescriptorLabels {
            domain: domain.to_string(),
            descriptor: bounded_label(tally.label),
        };
        let mut seen = self
            .value_labels
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if seen.contains(&labels) || seen.len() < MAX_VALUE_SERIES && seen.insert(labels.clone()) {
            return labels;
        }
        DescriptorLabels {
            domain: domain.to_string(),
            descriptor: tally.fallback.to_string(),
        }
    }

    pub fn record_failure(&self, failure: Failure) {
        let kind = match failure {
            Failure::Redis => "redis",
            Failure::Request => "request",
            Failure::Unauthenticated => "unauthenticated",
        };
        self.errors.get_or_create(&KindLabels { kind }).inc();
    }

    pub fn record_unknown_domain(&self) {
        self.unknown_domain.inc();
    }
}

/// Adds `n`, staying at `u64::MAX` rather than wrapping to 0.
fn saturating_add(counter: &Counter, n: u64) {
    let add = |count: u64| Some(count.saturating_add(n));
    let _ = counter.inner().fetch_update(Relaxed, Relaxed, add);
}

/// `label` if it is at most `MAX_LABEL_BYTES`; else its first bytes (whole characters), `~`,
/// and 16 hex digits of its hash, `MAX_LABEL_BYTES` at most in all: distinct long labels stay
/// apart.
fn bounded_label(label: &str) -> String {
    if label.len() <= MAX_LABEL_BYTES {
        return label.to_string();
    }
    let mut hasher = siphasher::sip::SipHasher13::new();
    hasher.write(label.as_bytes());
    let mut end = MAX_LABEL_BYTES - 17;
    while !label.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}~{:016x}",
        label.get(..end).unwrap_or(""),
        hasher.finish()
    )
}

impl CountsLoads for RlsMetrics {
    /// A configuration load: `Some(domains)` when it took effect, `None` when it was refused.
    fn record_config_load(&self, domains: Option<usize>) {
        let result = if domains.is_some() {
            "success"
        } else {
            "error"
        };
        self.config_loads
            .get_or_create(&ResultLabels { result })
            .inc();
        if let Some(domains) = domains {
            self.domains.set(i64::try_from(domains).unwrap_or(i64::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    fn tally<'a>(label: &'a str, fallback: &'a str, hits: u64, over_limit: bool) -> Tally<'a> {
        Tally {
            label,
            fallback,
            hits,
            over_limit,
            shadow_mode: false,
            near_limit: 0,
            descriptor: 0,
            check: 0,
            policy: "p",
            granted: 0,
        }
    }

    fn render(registry: &Registry) -> String {
        let mut text = String::new();
        encode(&mut text, registry).unwrap();
        text
    }

    #[test]
    fn hits_are_counted_per_domain_and_descriptor() {
        let mut registry = Registry::with_prefix("sluice_service");
        let metrics = RlsMetrics::register(&mut registry);
        let within = tally("to_number", "to_number", 2, false);
        let over = tally("to_number", "to_number", 1, true);
        metrics.record("messaging", &[within, over]);
        let text = render(&registry);
        for line in [
            r#"sluice_service_rls_total_hits_total{domain="messaging",descriptor="to_number"} 3"#,
            r#"sluice_service_rls_within_limit_total{domain="messaging",descriptor="to_number"} 2"#,
            r#"sluice_service_rls_over_limit_total{domain="messaging",descriptor="to_number"} 1"#,
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }

    #[test]
    fn long_labels_are_cut_and_told_apart_by_a_hash_and_counters_saturate() {
        let mut registry = Registry::with_prefix("sluice_service");
        let metrics = RlsMetrics::register(&mut registry);
        let long = |c: &str| format!("user_{}", c.repeat(1 << 20));
        metrics.record("d", &[tally(&long("a"), "user", u64::MAX, false)]);
        metrics.record("d", &[tally(&long("a"), "user", 5, false)]);
        metrics.record("d", &[tally(&long("\u{e9}"), "user", 1, false)]);
        let text = render(&registry);
        let hits: Vec<&str> = (text.lines())
            .filter(|l| l.starts_with("sluice_service_rls_total_hits_total{"))
            .collect();
        assert_eq!(hits.len(), 2, "{hits:?}");
        for line in &hits {
            let label = line
                .split("descriptor=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            assert!(label.len() <= MAX_LABEL_BYTES, "{label}");
            assert!(label.starts_with("user_"), "{label}");
        }
        assert!(
            hits.iter().any(|l| l.ends_with(&format!(" {}", u64::MAX))),
            "{hits:?}"
        );
        assert!(text.len() < 4096, "{} bytes", text.len());
    }

    #[test]
    fn request_values_make_at_most_a_bounded_number_of_series() {
        let mut registry = Registry::with_prefix("sluice_service");
        let metrics = RlsMetrics::register(&mut registry);
        for n in 0..MAX_VALUE_SERIES + 5 {
            let label = format!("user_{n}");
            metrics.record("d", &[tally(&label, "user", 1, false)]);
        }
        metrics.record("d", &[tally("user_0", "user", 1, false)]);
        let text = render(&registry);
        let series = (text.lines())
            .filter(|l| l.starts_with("sluice_service_rls_total_hits_total{"))
            .count();
        assert_eq!(series, MAX_VALUE_SERIES + 1);
        assert!(
            text.contains(r#"sluice_service_rls_total_hits_total{domain="d",descriptor="user"} 5"#)
        );
        assert!(text
            .contains(r#"sluice_service_rls_total_hits_total{domain="d",descriptor="user_0"} 2"#));
    }
}
