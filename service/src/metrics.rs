//! Counters and a latency histogram, rendered in the Prometheus text format by hand
//! (five series do not need a metrics crate), followed by the series other parts (the RLS)
//! registered in `registry`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use prometheus_client::registry::Registry;

use crate::store::Decision;

/// Upper bounds of the latency buckets, in seconds; Redis answers in well under a millisecond,
/// and the command timeout is 1 s.
const LATENCY_BOUNDS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

#[derive(Default)]
pub struct Metrics {
    checks: AtomicU64,
    denials: AtomicU64,
    redis_errors: AtomicU64,
    bad_requests: AtomicU64,
    latency: Histogram,
    registry: Registry,
}

impl Metrics {
    pub fn record_decisions(&self, decisions: &[Decision]) {
        let denied = decisions.iter().filter(|d| !d.allowed).count();
        self.checks.fetch_add(count(decisions.len()), Relaxed);
        self.denials.fetch_add(count(denied), Relaxed);
    }

    pub fn record_redis_error(&self) {
        self.redis_errors.fetch_add(1, Relaxed);
    }

    pub fn record_bad_request(&self) {
        self.bad_requests.fetch_add(1, Relaxed);
    }

    pub fn record_latency(&self, elapsed: Duration) {
        self.latency.observe(elapsed);
    }

    /// Where other parts register their series, to be rendered with these.
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    pub fn render(&self) -> String {
        let mut text = String::new();
        counter(
            &mut text,
            "sluice_checks_total",
            "Checks decided (one per entry of a request).",
            &self.checks,
        );
        counter(
            &mut text,
            "sluice_denials_total",
            "Checks denied.",
            &self.denials,
        );
        counter(
            &mut text,
            "sluice_redis_errors_total",
            "Requests that failed because Redis failed or timed out.",
            &self.redis_errors,
        );
        counter(
            &mut text,
            "sluice_bad_requests_total",
            "Requests refused with 400.",
            &self.bad_requests,
        );
        self.latency.render(
            &mut text,
            "sluice_check_duration_seconds",
            "Time to answer a valid /v1/check request, Redis included.",
        );
        let _ = prometheus_client::encoding::text::encode_registry(&mut text, &self.registry);
        text
    }
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn counter(text: &mut String, name: &str, help: &str, value: &AtomicU64) {
    let _ = write!(
        text,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
        value.load(Relaxed)
    );
}

/// Per-bucket counts (not cumulative; `render` accumulates) and the sum in microseconds.
#[derive(Default)]
struct Histogram {
    buckets: [AtomicU64; LATENCY_BOUNDS.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let slot = LATENCY_BOUNDS.iter().position(|&bound| seconds <= bound);
        if let Some(bucket) = slot.and_then(|i| self.buckets.get(i)) {
            bucket.fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_us.fetch_add(micros, Relaxed);
    }

    fn render(&self, text: &mut String, name: &str, help: &str) {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, bucket) in LATENCY_BOUNDS.iter().zip(&self.buckets) {
            cumulative += bucket.load(Relaxed);
            let _ = writeln!(text, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let count = self.count.load(Relaxed);
        let sum = self.sum_us.load(Relaxed) as f64 / 1e6;
        let _ = write!(
            text,
            "{name}_bucket{{le=\"+Inf\"}} {count}\n{name}_sum {sum}\n{name}_count {count}\n"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn counters_and_a_cumulative_histogram_are_rendered() {
        let metrics = Metrics::default();
        metrics.record_decisions(&[decision(true), decision(false), decision(false)]);
        metrics.record_bad_request();
        metrics.record_redis_error();
        metrics.record_latency(Duration::from_micros(700));
        metrics.record_latency(Duration::from_secs(9));
        let text = metrics.render();
        for line in [
            "sluice_checks_total 3",
            "sluice_denials_total 2",
            "sluice_redis_errors_total 1",
            "sluice_bad_requests_total 1",
            "# TYPE sluice_check_duration_seconds histogram",
            "sluice_check_duration_seconds_bucket{le=\"0.0005\"} 0",
            "sluice_check_duration_seconds_bucket{le=\"0.001\"} 1",
            "sluice_check_duration_seconds_bucket{le=\"2.5\"} 1",
            "sluice_check_duration_seconds_bucket{le=\"+Inf\"} 2",
            "sluice_check_duration_seconds_sum 9.0007",
            "sluice_check_duration_seconds_count 2",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }
}
