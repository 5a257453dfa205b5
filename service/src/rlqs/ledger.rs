//! What each Envoy asked of each bucket lately, by the service's own clock (Envoy 1.40's
//! `time_elapsed` is 0 in a bucket's first report and whole seconds after), and the shares of
//! the bucket's budget that follow. Pure: the clock is handed in.

use std::collections::HashMap;
use std::time::Duration;

use super::fair::fair_shares;

/// One Envoy's last report of one bucket.
#[derive(Clone, Copy, Debug)]
struct Report {
    /// Requests (allowed and denied) per budget period, as last measured.
    demand: u64,
    /// When it was received.
    at: Duration,
}

/// The reports of one bucket, per Envoy (a stream id).
#[derive(Default, Debug)]
pub struct Ledger {
    buckets: HashMap<String, HashMap<u64, Report>>,
}

impl Ledger {
    /// Records that `envoy` saw `requests` (allowed + denied) of `bucket` in the `elapsed` since
    /// its previous report, as demand per `period`. A first report (elapsed zero) counts its
    /// requests as demand over one reporting interval.
    pub fn report(
        &mut self,
        bucket: &str,
        envoy: u64,
        requests: u64,
        elapsed: Duration,
        period: Duration,
        now: Duration,
    ) {
        let over = if elapsed.is_zero() {
            REPORTING_INTERVAL
        } else {
            elapsed
        };
        let demand = u128::from(requests) * period.as_millis() / over.as_millis().max(1);
        let demand = u64::try_from(demand).unwrap_or(u64::MAX);
        let envoys = self.buckets.entry(bucket.to_owned()).or_default();
        envoys.insert(envoy, Report { demand, at: now });
    }

    /// Forgets the reports older than `ttl`, and the buckets nobody reports any more (which the
    /// stream then abandons). Returns the buckets forgotten.
    pub fn expire(&mut self, now: Duration, ttl: Duration) -> Vec<String> {
        let mut gone = Vec::new();
        self.buckets.retain(|bucket, envoys| {
            envoys.retain(|_, report| now.saturating_sub(report.at) <= ttl);
            if envoys.is_empty() {
                gone.push(bucket.clone());
            }
            !envoys.is_empty()
        });
        gone
    }

    /// The share of `budget` (per period) of `envoy` in `bucket`, and how many Envoys share it.
    pub fn share(&self, bucket: &str, envoy: u64, budget: u64) -> Option<(u64, usize)> {
        let envoys = self.buckets.get(bucket)?;
        let mut ids: Vec<u64> = envoys.keys().copied().collect();
        ids.sort_unstable();
        let demands: Vec<u64> = ids
            .iter()
            .map(|id| envoys.get(id).map_or(0, |report| report.demand))
            .collect();
        let shares = fair_shares(budget, &demands);
        let at = ids.iter().position(|&id| id == envoy)?;
        Some((shares.get(at).copied()?, ids.len()))
    }
}

/// Envoy 1.40 reports every 5 s, whatever `reporting_interval` says.
pub const REPORTING_INTERVAL: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn two_busy_envoys_split_a_budget_of_600_a_minute_evenly() {
        let mut ledger = Ledger::default();
        ledger.report("b", 1, 100, secs(5), MINUTE, secs(10));
        ledger.report("b", 2, 100, secs(5), MINUTE, secs(10));
        assert_eq!(ledger.share("b", 1, 600), Some((300, 2)));
        assert_eq!(ledger.share("b", 2, 600), Some((300, 2)));
    }

    #[test]
    fn an_idle_envoy_leaves_the_busy_one_nearly_all() {
        let mut ledger = Ledger::default();
        ledger.report("b", 1, 0, secs(5), MINUTE, secs(10));
        ledger.report("b", 2, 500, secs(5), MINUTE, secs(10));
        assert_eq!(ledger.share("b", 2, 600), Some((600, 2)));
        assert_eq!(ledger.share("b", 1, 600), Some((0, 2)));
    }

    #[test]
    fn a_silent_envoy_is_reclaimed_after_the_ttl_and_an_unreported_bucket_forgotten() {
        let mut ledger = Ledger::default();
        ledger.report("b", 1, 100, secs(5), MINUTE, secs(10));
        ledger.report("b", 2, 100, secs(5), MINUTE, secs(20));
        assert!(ledger.expire(secs(25), secs(10)).is_empty());
        assert_eq!(ledger.share("b", 2, 600), Some((600, 1)));
        assert_eq!(ledger.expire(secs(40), secs(10)), vec!["b".to_owned()]);
        assert_eq!(ledger.share("b", 2, 600), None);
    }

    #[test]
    fn a_first_report_counts_over_one_reporting_interval() {
        let mut ledger = Ledger::default();
        // 50 requests in Envoy 1.40's first report (elapsed 0): 600 a minute.
        ledger.report("b", 1, 50, Duration::ZERO, MINUTE, secs(1));
        ledger.report("b", 2, 1000, secs(5), MINUTE, secs(1));
        assert_eq!(ledger.share("b", 1, 1000), Some((500, 2)));
    }
}
