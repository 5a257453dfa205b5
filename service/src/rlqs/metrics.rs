//! The RLQS's Prometheus series, per domain: the bucket reports entered, the requests Envoys
//! reported allowed and denied, the reports the store did not take, and the streams open. The
//! domain label is a domain of the limits files (a report of another domain is not counted),
//! so the series stay as many as the configured domains; a bucket id, which any Envoy may make
//! up, is never a label.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DomainLabels {
    domain: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    domain: String,
    outcome: &'static str,
}

pub struct RlqsMetrics {
    reports: Family<DomainLabels, Counter>,
    requests: Family<OutcomeLabels, Counter>,
    store_errors: Counter,
    streams: Gauge,
}

impl RlqsMetrics {
    /// Creates the series and registers them in `registry`, under the prefix `rlqs`.
    pub fn register(registry: &mut Registry) -> RlqsMetrics {
        let registry = registry.sub_registry_with_prefix("rlqs");
        let metrics = RlqsMetrics {
            reports: Family::default(),
            requests: Family::default(),
            store_errors: Counter::default(),
            streams: Gauge::default(),
        };
        registry.register(
            "reports",
            "Bucket reports entered in the ledger, by domain",
            metrics.reports.clone(),
        );
        registry.register(
            "requests",
            "Requests the Envoys reported, by domain and outcome (allowed, denied)",
            metrics.requests.clone(),
        );
        registry.register(
            "store_errors",
            "Bucket reports the store did not take (Redis away): no assignment was sent",
            metrics.store_errors.clone(),
        );
        registry.register("streams", "RLQS streams open", metrics.streams.clone());
        metrics
    }

    /// A report of `domain` (a configured one) entered: `allowed` and `denied` requests.
    pub fn record_report(&self, domain: &str, allowed: u64, denied: u64) {
        let domain = domain.to_owned();
        self.reports
            .get_or_create(&DomainLabels {
                domain: domain.clone(),
            })
            .inc();
        for (outcome, count) in [("allowed", allowed), ("denied", denied)] {
            let labels = OutcomeLabels {
                domain: domain.clone(),
                outcome,
            };
            // Bounded per report, so that a counter does not wrap on a hostile count.
            let count = count.min(crate::stores::quota::MAX_REQUESTS);
            self.requests.get_or_create(&labels).inc_by(count);
        }
    }

    pub fn record_store_error(&self) {
        self.store_errors.inc();
    }

    /// A stream opened; the gauge goes down when the guard drops.
    pub fn stream_open(self: &std::sync::Arc<Self>) -> StreamOpen {
        self.streams.inc();
        StreamOpen(std::sync::Arc::clone(self))
    }
}

/// An open stream, counted in `streams` until dropped.
pub struct StreamOpen(std::sync::Arc<RlqsMetrics>);

impl Drop for StreamOpen {
    fn drop(&mut self) {
        self.0.streams.dec();
    }
}
