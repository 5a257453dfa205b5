//! One Envoy's share of a bucket's budget among the bucket's live demands, as the store's ledger
//! returns them (`stores::quota`: demand by the store's clock, Envoy 1.40's `time_elapsed` being
//! 0 in a bucket's first report and whole seconds after). The Envoys are taken in the order of
//! their ids, so that every replica divides a budget alike. Pure.

use crate::stores::quota::Demand;

use super::fair::fair_shares;

/// The share of `budget` (per period) of `envoy` among `demands`, and how many Envoys share it;
/// `None` if `envoy` is not among them (the bucket holds the most Envoys it keeps).
pub fn share(demands: &[Demand], envoy: &str, budget: u64) -> Option<(u64, usize)> {
    let mut ordered: Vec<&Demand> = demands.iter().collect();
    ordered.sort_unstable_by(|a, b| a.envoy.cmp(&b.envoy));
    let amounts: Vec<u64> = ordered.iter().map(|d| d.demand).collect();
    let shares = fair_shares(budget, &amounts);
    let at = ordered.iter().position(|d| d.envoy == envoy)?;
    Some((shares.get(at).copied()?, ordered.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stores::quota::{quota_key, QuotaLedger, QuotaReport};

    /// `envoy` reports `requests` of one bucket of 600 a minute at `at_s`: its share.
    fn report(ledger: &mut QuotaLedger, envoy: &str, requests: u64, at_s: u64) -> (u64, usize) {
        let report = QuotaReport {
            key: quota_key("api", [("name", "b")].into_iter()),
            envoy: envoy.to_owned(),
            requests,
            period_ms: 60_000,
            ttl_ms: 15_000,
        };
        let demands = ledger.report(&report, at_s * 1_000);
        share(&demands, envoy, 600).unwrap()
    }

    #[test]
    fn two_busy_envoys_split_a_budget_of_600_a_minute_evenly() {
        let mut ledger = QuotaLedger::default();
        report(&mut ledger, "1", 0, 0);
        report(&mut ledger, "2", 0, 0);
        assert_eq!(report(&mut ledger, "1", 100, 5), (600, 2));
        assert_eq!(report(&mut ledger, "2", 100, 5), (300, 2));
        assert_eq!(report(&mut ledger, "1", 100, 10), (300, 2));
    }

    #[test]
    fn an_idle_envoy_leaves_the_busy_one_nearly_all() {
        let mut ledger = QuotaLedger::default();
        report(&mut ledger, "1", 0, 0);
        assert_eq!(report(&mut ledger, "2", 500, 0), (600, 2));
        assert_eq!(report(&mut ledger, "1", 0, 5), (0, 2));
    }

    #[test]
    fn a_silent_envoy_is_reclaimed_after_the_ttl() {
        let mut ledger = QuotaLedger::default();
        report(&mut ledger, "1", 100, 10);
        assert_eq!(report(&mut ledger, "2", 100, 20), (300, 2));
        assert_eq!(report(&mut ledger, "2", 100, 26), (600, 1));
    }

    #[test]
    fn every_replica_divides_alike_whatever_order_the_store_returns() {
        let demand = |envoy: &str, demand| Demand {
            envoy: envoy.to_owned(),
            demand,
        };
        let one = [demand("a", 900), demand("b", 900), demand("c", 900)];
        let other = [demand("c", 900), demand("a", 900), demand("b", 900)];
        for envoy in ["a", "b", "c"] {
            assert_eq!(share(&one, envoy, 10), share(&other, envoy, 10));
        }
        assert_eq!(share(&one, "a", 10), Some((4, 3)));
        assert_eq!(share(&one, "d", 10), None);
    }
}
