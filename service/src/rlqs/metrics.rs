//! The RLQS's Prometheus series, per domain and descriptor of the limits files: the bucket
//! reports entered, the requests Envoys reported allowed and denied, the requests per period
//! last assigned and the streams holding an assignment (both of this replica), the reports the
//! store did not take, and the streams open.
//!
//! A bucket id is whatever an Envoy's `bucket_id_builder` makes of a request, so it is never a
//! label: a bucket is counted under the descriptor of the limits it matched (`Descriptor`, its
//! path of keys and configured values, as the RLS labels its series), so the series stay as
//! many as the configured limits, whatever the Envoys report. Counters saturate instead of
//! wrapping. The same figures, by descriptor, are the admin API's `GET /admin/v1/rlqs`
//! (`RlqsMetrics::view`).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The descriptor a bucket matched: a configured domain and the metrics label of the limit that
/// is its budget (`rules::config::Limit::label`), never a request's value.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct Descriptor {
    domain: String,
    descriptor: String,
}

impl Descriptor {
    /// `domain` must be a domain of the limits and `label` a configured limit's label.
    pub fn new(domain: &str, label: &str) -> Descriptor {
        Descriptor {
            domain: domain.to_owned(),
            descriptor: label.to_owned(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    #[prometheus(flatten)]
    descriptor: Descriptor,
    outcome: &'static str,
}

pub struct RlqsMetrics {
    reports: Family<Descriptor, Counter>,
    requests: Family<OutcomeLabels, Counter>,
    assigned: Family<Descriptor, Gauge>,
    envoys: Family<Descriptor, Gauge>,
    store_errors: Counter,
    deferred: Counter,
    streams: Gauge,
    /// Every descriptor reported: as many as the limits files configure.
    seen: Mutex<BTreeSet<Descriptor>>,
}

/// One descriptor as `GET /admin/v1/rlqs` shows it: this replica's series of it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DescriptorView {
    pub domain: String,
    pub descriptor: String,
    /// Bucket reports entered, and the requests they reported.
    pub reports: u64,
    pub allowed: u64,
    pub denied: u64,
    /// Requests per period last assigned, summed over the streams holding a share now.
    pub assigned: u64,
    /// Streams (Envoys) holding a share now.
    pub envoys: u64,
}

/// This replica's RLQS now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct View {
    pub streams: u64,
    pub descriptors: Vec<DescriptorView>,
}

impl RlqsMetrics {
    /// Creates the series and registers them in `registry`, under the prefix `rlqs`.
    pub fn register(registry: &mut Registry) -> RlqsMetrics {
        let registry = registry.sub_registry_with_prefix("rlqs");
        let metrics = RlqsMetrics {
            reports: Family::default(),
            requests: Family::default(),
            assigned: Family::default(),
            envoys: Family::default(),
            store_errors: Counter::default(),
            deferred: Counter::default(),
            streams: Gauge::default(),
            seen: Mutex::default(),
        };
        // prometheus-client ends each help text with a full stop itself.
        registry.register(
            "reports",
            "Bucket reports entered in the ledger, by domain and descriptor of the limits",
            metrics.reports.clone(),
        );
        registry.register(
            "requests",
            "Requests the Envoys reported, by domain, descriptor and outcome (allowed, denied)",
            metrics.requests.clone(),
        );
        registry.register(
            "assigned",
            "Requests per period of the limit (its unit) last assigned to this replica's \
             streams, summed over their buckets, by domain and descriptor; summed over the \
             replicas, a bucket's is at most its budget",
            metrics.assigned.clone(),
        );
        registry.register(
            "envoys",
            "Streams (Envoys) of this replica holding an assignment of a bucket of the \
             descriptor, by domain and descriptor",
            metrics.envoys.clone(),
        );
        registry.register(
            "store_errors",
            "Bucket reports the store did not take (Redis away): no assignment was sent",
            metrics.store_errors.clone(),
        );
        registry.register(
            "reports_deferred",
            "Bucket reports over their stream's allowance (faster than any Envoy reports): no \
             store call, no action, their requests counted at the bucket's next report",
            metrics.deferred.clone(),
        );
        registry.register("streams", "RLQS streams open", metrics.streams.clone());
        metrics
    }

    /// A report of a bucket of `descriptor` entered: `allowed` and `denied` requests, each
    /// counted up to `MAX_REQUESTS` as the ledger counts them.
    pub fn record_report(&self, descriptor: &Descriptor, allowed: u64, denied: u64) {
        self.see(descriptor);
        saturating_add(&self.reports.get_or_create(descriptor), 1);
        for (outcome, count) in [("allowed", allowed), ("denied", denied)] {
            let labels = OutcomeLabels {
                descriptor: descriptor.clone(),
                outcome,
            };
            let count = count.min(crate::stores::quota::MAX_REQUESTS);
            saturating_add(&self.requests.get_or_create(&labels), count);
        }
    }

    fn see(&self, descriptor: &Descriptor) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if !seen.contains(descriptor) {
            seen.insert(descriptor.clone());
        }
    }

    /// Every descriptor reported, with its series now, in order.
    pub fn view(&self) -> View {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let descriptors = (seen.iter())
            .map(|d| {
                let outcome = |outcome| OutcomeLabels {
                    descriptor: d.clone(),
                    outcome,
                };
                let requests = |outcome| self.requests.get(&outcome).map_or(0, |c| c.get());
                let gauge = |family: &Family<Descriptor, Gauge>| {
                    family
                        .get(d)
                        .map_or(0, |g| u64::try_from(g.get()).unwrap_or(0))
                };
                DescriptorView {
                    domain: d.domain.clone(),
                    descriptor: d.descriptor.clone(),
                    reports: self.reports.get(d).map_or(0, |c| c.get()),
                    allowed: requests(outcome("allowed")),
                    denied: requests(outcome("denied")),
                    assigned: gauge(&self.assigned),
                    envoys: gauge(&self.envoys),
                }
            })
            .collect();
        View {
            streams: u64::try_from(self.streams.get()).unwrap_or(0),
            descriptors,
        }
    }

    pub fn record_deferred(&self) {
        self.deferred.inc();
    }

    pub fn record_store_error(&self) {
        self.store_errors.inc();
    }

    /// A stream opened; the gauge goes down when the guard drops.
    pub fn stream_open(self: &Arc<Self>) -> StreamOpen {
        self.streams.inc();
        StreamOpen(Arc::clone(self))
    }
}

/// Adds `n`, staying at `u64::MAX` rather than wrapping to 0.
fn saturating_add(counter: &Counter, n: u64) {
    let add = |count: u64| Some(count.saturating_add(n));
    let _ = counter.inner().fetch_update(Relaxed, Relaxed, add);
}

/// A share as a gauge's value (a share is at most a budget, a `u32`).
fn gauge_value(share: u64) -> i64 {
    i64::try_from(share).unwrap_or(i64::MAX)
}

/// An open stream, counted in `streams` until dropped.
pub struct StreamOpen(Arc<RlqsMetrics>);

impl Drop for StreamOpen {
    fn drop(&mut self) {
        self.0.streams.dec();
    }
}

/// What one descriptor's gauges count of one stream.
struct Held {
    assigned: Gauge,
    envoys: Gauge,
    /// The stream's buckets of the descriptor holding an assignment, and their shares' sum.
    buckets: usize,
    shares: u64,
}

/// One stream's assignments as `assigned` and `envoys` count them: what it adds to each
/// descriptor's, taken back when a bucket's share changes, when the bucket is abandoned and,
/// all of it, when the stream ends (dropped). No store call: the stream knows what it sent.
pub struct Holdings {
    metrics: Arc<RlqsMetrics>,
    held: HashMap<Descriptor, Held>,
}

impl Holdings {
    pub fn new(metrics: &Arc<RlqsMetrics>) -> Holdings {
        Holdings {
            metrics: Arc::clone(metrics),
            held: HashMap::new(),
        }
    }

    /// A bucket held `before` (its descriptor and share, if it held one) and holds `after` now.
    pub fn change(
        &mut self,
        before: Option<(&Descriptor, u64)>,
        after: Option<(&Descriptor, u64)>,
    ) {
        // The new first, so that a bucket that keeps its descriptor keeps its stream counted.
        if let Some((descriptor, share)) = after {
            let metrics = &self.metrics;
            let held = self.held.entry(descriptor.clone()).or_insert_with(|| {
                let envoys = metrics.envoys.get_or_create_owned(descriptor);
                envoys.inc();
                Held {
                    assigned: metrics.assigned.get_or_create_owned(descriptor),
                    envoys,
                    buckets: 0,
                    shares: 0,
                }
            });
            held.buckets += 1;
            held.shares = held.shares.saturating_add(share);
            held.assigned.inc_by(gauge_value(share));
        }
        if let Some((descriptor, share)) = before {
            let Some(held) = self.held.get_mut(descriptor) else {
                return;
            };
            let share = share.min(held.shares);
            held.shares -= share;
            held.assigned.dec_by(gauge_value(share));
            held.buckets = held.buckets.saturating_sub(1);
            if held.buckets == 0 {
                held.envoys.dec();
                held.assigned.dec_by(gauge_value(held.shares));
                self.held.remove(descriptor);
            }
        }
    }
}

impl Drop for Holdings {
    fn drop(&mut self) {
        for (_, held) in self.held.drain() {
            held.assigned.dec_by(gauge_value(held.shares));
            held.envoys.dec();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    fn render(registry: &Registry) -> String {
        let mut text = String::new();
        encode(&mut text, registry).unwrap();
        text
    }

    fn has(text: &str, line: &str) -> bool {
        text.lines().any(|l| l == line)
    }

    #[test]
    fn reports_are_counted_by_domain_and_descriptor_and_saturate() {
        let mut registry = Registry::with_prefix("sluice_service");
        let metrics = RlqsMetrics::register(&mut registry);
        let name = Descriptor::new("api", "name");
        metrics.record_report(&name, 7, 3);
        metrics.record_report(&Descriptor::new("api", "tenant_acme.path"), 1, 0);
        let text = render(&registry);
        for line in [
            r#"sluice_service_rlqs_reports_total{domain="api",descriptor="name"} 1"#,
            r#"sluice_service_rlqs_requests_total{domain="api",descriptor="name",outcome="allowed"} 7"#,
            r#"sluice_service_rlqs_requests_total{domain="api",descriptor="name",outcome="denied"} 3"#,
            r#"sluice_service_rlqs_requests_total{domain="api",descriptor="tenant_acme.path",outcome="allowed"} 1"#,
        ] {
            assert!(has(&text, line), "missing {line:?} in\n{text}");
        }
        // A hostile count adds at most MAX_REQUESTS a report, and the sum stops at u64::MAX.
        let max = crate::stores::quota::MAX_REQUESTS;
        metrics.record_report(&name, u64::MAX, 0);
        let allowed = Descriptor::new("api", "name");
        let counter = metrics.requests.get_or_create_owned(&OutcomeLabels {
            descriptor: allowed,
            outcome: "allowed",
        });
        assert_eq!(counter.get(), 7 + max);
        counter.inner().store(u64::MAX - 1, Relaxed);
        metrics.record_report(&name, u64::MAX, 0);
        assert_eq!(counter.get(), u64::MAX);
    }

    #[test]
    fn assigned_and_envoys_follow_each_streams_shares_and_go_when_it_ends() {
        let mut registry = Registry::with_prefix("sluice_service");
        let metrics = Arc::new(RlqsMetrics::register(&mut registry));
        let (name, other) = (
            Descriptor::new("api", "name"),
            Descriptor::new("api", "user"),
        );
        let (mut one, mut two) = (Holdings::new(&metrics), Holdings::new(&metrics));
        // Stream one holds two buckets of `name` and one of `user`; stream two one of `name`.
        one.change(None, Some((&name, 100)));
        one.change(None, Some((&name, 20)));
        one.change(None, Some((&other, 5)));
        two.change(None, Some((&name, 300)));
        let gauges = |d: &Descriptor| {
            (
                metrics.assigned.get_or_create(d).get(),
                metrics.envoys.get_or_create(d).get(),
            )
        };
        assert_eq!(gauges(&name), (420, 2));
        assert_eq!(gauges(&other), (5, 1));
        // A share that changes moves the sum; the stream is still counted once.
        one.change(Some((&name, 100)), Some((&name, 60)));
        assert_eq!(gauges(&name), (380, 2));
        // A bucket abandoned takes its share back; the stream's last bucket of a descriptor
        // takes the stream out of `envoys`.
        one.change(Some((&other, 5)), None);
        assert_eq!(gauges(&other), (0, 0));
        // A reload that moves a bucket to another descriptor moves its share.
        two.change(Some((&name, 300)), Some((&other, 300)));
        assert_eq!(gauges(&name), (80, 1));
        assert_eq!(gauges(&other), (300, 1));
        drop(one);
        assert_eq!(gauges(&name), (0, 0));
        drop(two);
        assert_eq!(gauges(&other), (0, 0));
        let text = render(&registry);
        assert!(
            has(
                &text,
                r#"sluice_service_rlqs_assigned{domain="api",descriptor="name"} 0"#
            ),
            "{text}"
        );
        assert!(
            has(
                &text,
                r#"sluice_service_rlqs_envoys{domain="api",descriptor="user"} 0"#
            ),
            "{text}"
        );
    }
}
