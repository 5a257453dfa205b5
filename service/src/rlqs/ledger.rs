//! One Envoy's share of a bucket's budget among the bucket's live demands, as the store's ledger
//! returns them (`stores::quota`: demand by the store's clock, Envoy 1.40's `time_elapsed` being
//! 0 in a bucket's first report and whole seconds after, and the share each Envoy holds). The
//! Envoys are taken in the order of their ids, so that every replica divides a budget alike.
//!
//! Each Envoy keeps what it was sent until its next report (Envoy 1.40 reports every 5 s, each
//! Envoy at its own moment), so a share is its fair share taken only from budget the others do
//! not hold: the shares held never sum past the budget, beyond `NEWCOMER` of it. And since Envoy
//! 1.40 rebuilds a changed token bucket full, a share stays as it was while the fair one moves
//! by at most `HOLD_PERCENT` (`steady`). Pure.

use crate::stores::quota::Demand;

use super::fair::fair_shares;

/// An Envoy that finds the budget all held is still sent the least of its fair share and this
/// fraction of the budget (a fiftieth), beyond the budget until the others' next reports shrink
/// their shares: a new Envoy gets a share at once.
pub const NEWCOMER: u64 = 50;

/// An Envoy's demand counts this fraction more than measured (a twentieth, 5%): a token
/// bucket refilled at exactly the rate requests come refuses some whenever they come unevenly,
/// so an Envoy that gets all it asks gets a little more. What it leaves unused is the cost, at
/// most 5% of the budget, when busier Envoys could have used it.
pub const SLACK: u64 = 20;

/// How far a fair share may move, in percent, before a new one is sent (`steady`).
pub const HOLD_PERCENT: u64 = 3;

/// The share of `budget` (per period) of `envoy` among `demands`, and how many Envoys share it;
/// `None` if `envoy` is not among them (the bucket holds the most Envoys it keeps). `held` is
/// what the Envoy was last sent.
pub fn share(
    demands: &[Demand],
    envoy: &str,
    budget: u64,
    held: Option<u64>,
) -> Option<(u64, usize)> {
    let mut ordered: Vec<&Demand> = demands.iter().collect();
    ordered.sort_unstable_by(|a, b| a.envoy.cmp(&b.envoy));
    let amounts: Vec<u64> = (ordered.iter())
        .map(|d| d.demand.saturating_add(d.demand.div_ceil(SLACK)))
        .collect();
    let shares = fair_shares(budget, &amounts);
    let at = ordered.iter().position(|d| d.envoy == envoy)?;
    let fair = shares.get(at).copied()?;
    let demand = amounts.get(at).copied()?;
    let others: u64 = (ordered.iter())
        .filter(|d| d.envoy != envoy)
        .map(|d| d.held)
        .fold(0, u64::saturating_add);
    let free = budget.saturating_sub(others);
    let target = fair.min(free).max(fair.min(budget / NEWCOMER));
    Some((steady(held, target, demand, free), ordered.len()))
}

/// The share to send an Envoy whose share would be `target` now, `held` being what it holds:
/// `held` while that is no more than the budget left `free` by the others and within
/// `HOLD_PERCENT` of `target` on the side that costs nobody: an Envoy that gets all it asks
/// (`demand` at most `target`) keeps a share up to that much above, never below what it asks;
/// a busier one keeps a share up to that much below, never above its fair one.
pub fn steady(held: Option<u64>, target: u64, demand: u64, free: u64) -> u64 {
    let Some(held) = held.filter(|&h| h > 0 && h <= free) else {
        return target;
    };
    let margin = target * HOLD_PERCENT / 100;
    let kept = if demand <= target {
        (target..=target + margin).contains(&held)
    } else {
        (target.saturating_sub(margin)..=target).contains(&held)
    };
    if kept && target > 0 {
        held
    } else {
        target
    }
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
            dead: std::sync::Arc::new([]),
        };
        let demands = ledger.report(&report, at_s * 1_000);
        let (sent, envoys) = share(&demands, envoy, 600, None).unwrap();
        ledger.hold(&report.key, envoy, Some(sent));
        (sent, envoys)
    }

    #[test]
    fn a_share_comes_only_from_budget_the_others_do_not_hold() {
        let mut ledger = QuotaLedger::default();
        // First reports of nothing: a twentieth of the budget each as headroom.
        assert_eq!(report(&mut ledger, "1", 0, 0), (30, 1));
        assert_eq!(report(&mut ledger, "2", 0, 0), (30, 2));
        // 1 asks 1,200 a minute: its fair share is all, but 2 holds 30 until it reports.
        assert_eq!(report(&mut ledger, "1", 100, 5), (570, 2));
        // 2 asks as much: its fair share is half, but 1 holds 570 until it reports.
        assert_eq!(report(&mut ledger, "2", 100, 5), (30, 2));
        assert_eq!(report(&mut ledger, "1", 100, 10), (300, 2));
        assert_eq!(report(&mut ledger, "2", 100, 10), (300, 2));
    }

    #[test]
    fn an_idle_envoy_leaves_the_busy_one_nearly_all() {
        let mut ledger = QuotaLedger::default();
        report(&mut ledger, "1", 0, 0);
        assert_eq!(report(&mut ledger, "2", 500, 0), (570, 2));
        assert_eq!(report(&mut ledger, "1", 0, 5), (0, 2));
        assert_eq!(report(&mut ledger, "2", 500, 5), (600, 2));
    }

    #[test]
    fn a_newcomer_gets_a_fiftieth_at_once_and_a_silent_envoy_is_reclaimed_after_the_ttl() {
        let mut ledger = QuotaLedger::default();
        assert_eq!(report(&mut ledger, "1", 100, 10), (600, 1));
        assert_eq!(report(&mut ledger, "2", 100, 20), (12, 2));
        assert_eq!(report(&mut ledger, "2", 100, 26), (600, 1));
    }

    #[test]
    fn a_stream_that_ends_is_forgotten_at_once() {
        let mut ledger = QuotaLedger::default();
        report(&mut ledger, "1", 100, 0);
        report(&mut ledger, "2", 100, 0);
        assert_eq!(report(&mut ledger, "1", 100, 5), (300, 2));
        let key = quota_key("api", [("name", "b")].into_iter());
        assert!(ledger.hold(&key, "1", None));
        assert_eq!(report(&mut ledger, "2", 100, 6), (600, 1));
    }

    #[test]
    fn a_share_is_held_while_the_fair_one_moves_by_3_percent_on_the_side_that_costs_nobody() {
        // A busy Envoy (asks 840) with a fair share of 240: it keeps 235, not 245.
        assert_eq!(steady(Some(235), 240, 840, 600), 235);
        assert_eq!(steady(Some(245), 240, 840, 600), 240);
        assert_eq!(steady(Some(230), 240, 840, 600), 240);
        // A light one (asks 120, gets it): it keeps 123, not 117.
        assert_eq!(steady(Some(123), 120, 120, 600), 123);
        assert_eq!(steady(Some(117), 120, 120, 600), 120);
        // Never past what the others leave, never a share for nothing.
        assert_eq!(steady(Some(123), 120, 120, 121), 120);
        assert_eq!(steady(Some(5), 0, 0, 600), 0);
        assert_eq!(steady(None, 240, 840, 600), 240);
    }

    #[test]
    fn every_replica_divides_alike_whatever_order_the_store_returns() {
        let demand = |envoy: &str, demand| Demand {
            envoy: envoy.to_owned(),
            demand,
            held: 0,
        };
        let one = [demand("a", 900), demand("b", 900), demand("c", 900)];
        let other = [demand("c", 900), demand("a", 900), demand("b", 900)];
        for envoy in ["a", "b", "c"] {
            assert_eq!(share(&one, envoy, 10, None), share(&other, envoy, 10, None));
        }
        assert_eq!(share(&one, "a", 10, None), Some((4, 3)));
        assert_eq!(share(&one, "d", 10, None), None);
    }
}
