//! Max-min fair shares of one bucket's budget among the Envoys that report demand for it: an
//! Envoy that asks for less than an equal share gets what it asks, the rest is split evenly
//! among the busier ones, and budget nobody claims is spread evenly as headroom for growth, at
//! most as much again as each asks (or `HEADROOM_FLOOR` of the budget): the rest stays unheld,
//! for Envoys that are new or grow. Pure integer arithmetic: the shares never sum past the
//! budget.

/// The headroom an Envoy asking (nearly) nothing may be given, as a fraction of the budget:
/// one twentieth.
pub const HEADROOM_FLOOR: u64 = 20;

/// The share of `budget` for each of `demands`, in the same order: max-min fair (water
/// filling), then whatever nobody claimed split evenly among all as headroom, each getting at
/// most its demand again or `budget / HEADROOM_FLOOR`, whichever is more. The shares sum to
/// exactly `budget` when the demands do (the integer remainder goes one unit each to the first
/// Envoys in order of demand), and never past it.
pub fn fair_shares(budget: u64, demands: &[u64]) -> Vec<u64> {
    let mut shares = vec![0; demands.len()];
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by_key(|&i| demands.get(i).copied().unwrap_or(0));
    let mut remaining = budget;
    let mut left = demands.len() as u64;
    let mut unsatisfied = Vec::new();
    for &i in &order {
        let demand = demands.get(i).copied().unwrap_or(0);
        let equal = remaining / left.max(1);
        if demand <= equal {
            if let Some(share) = shares.get_mut(i) {
                *share = demand;
            }
            remaining -= demand;
            left -= 1;
        } else {
            unsatisfied.push(i);
        }
    }
    // Everyone left wants more than an equal share of what is left: split it evenly. When
    // nobody is left, what is left is headroom nobody claimed: split it among all.
    let headroom = unsatisfied.is_empty();
    let takers: Vec<usize> = if headroom { order } else { unsatisfied };
    let count = takers.len() as u64;
    if count == 0 {
        return shares;
    }
    let (each, mut extra) = (remaining / count, remaining % count);
    for i in takers {
        let mut more = each + u64::from(extra > 0);
        if headroom {
            let demand = demands.get(i).copied().unwrap_or(0);
            more = more.min(demand.max(budget / HEADROOM_FLOOR));
        }
        if let Some(share) = shares.get_mut(i) {
            *share += more;
        }
        extra = extra.saturating_sub(1);
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_light_envoy_keeps_what_it_uses_and_the_busy_ones_split_the_rest() {
        // 600 a minute, demands 840, 240 and 120: an equal share is 200, so the light one keeps
        // its 120; 480 is left for two, 240 each: the middle one keeps its 240, the heavy gets 240.
        assert_eq!(fair_shares(600, &[840, 240, 120]), vec![240, 240, 120]);
        assert_eq!(fair_shares(600, &[840, 100, 20]), vec![480, 100, 20]);
    }

    #[test]
    fn one_idle_and_one_busy_gives_the_busy_one_nearly_all() {
        assert_eq!(fair_shares(600, &[0, 5000]), vec![0, 600]);
    }

    #[test]
    fn unclaimed_budget_is_spread_as_headroom_up_to_the_demand_again() {
        // 300 unclaimed, 150 each: the first may double its 100, the second takes 150.
        assert_eq!(fair_shares(600, &[100, 200]), vec![200, 350]);
        // Asking nothing, or a first report's 12 a minute: a twentieth of the budget more.
        assert_eq!(fair_shares(600, &[0, 0, 0]), vec![30, 30, 30]);
        assert_eq!(fair_shares(600, &[12, 12, 12]), vec![42, 42, 42]);
        assert_eq!(fair_shares(600, &[180, 120, 60]), vec![260, 200, 120]);
    }

    #[test]
    fn a_budget_that_does_not_divide_gives_the_remainder_to_the_first() {
        assert_eq!(fair_shares(10, &[100, 100, 100]), vec![4, 3, 3]);
        assert_eq!(fair_shares(0, &[5, 5]), vec![0, 0]);
        assert!(fair_shares(10, &[]).is_empty());
    }

    /// The reference: give everyone unsatisfied one unit at a time, in turn, until the budget
    /// or every demand runs out; then the rest one at a time to all.
    fn reference(budget: u64, demands: &[u64]) -> Vec<u64> {
        let mut shares = vec![0u64; demands.len()];
        let mut left = budget;
        while left > 0 {
            let mut gave = false;
            for (share, &demand) in shares.iter_mut().zip(demands) {
                if left > 0 && *share < demand {
                    *share += 1;
                    left -= 1;
                    gave = true;
                }
            }
            if !gave {
                break;
            }
        }
        let mut i = 0;
        while left > 0 && !shares.is_empty() {
            shares[i % demands.len()] += 1;
            left -= 1;
            i += 1;
        }
        shares
    }

    proptest! {
        #[test]
        fn shares_never_exceed_the_budget_and_are_max_min_fair(
            budget in 0u64..2_000,
            demands in proptest::collection::vec(0u64..1_000, 0..8),
        ) {
            let shares = fair_shares(budget, &demands);
            let total: u64 = shares.iter().sum();
            prop_assert!(total <= budget);
            if demands.iter().sum::<u64>() >= budget && !demands.is_empty() {
                prop_assert_eq!(total, budget);
            }
            // Headroom: never more than twice the demand or the floor past it.
            for (share, demand) in shares.iter().zip(&demands) {
                prop_assert!(*share <= demand + (*demand).max(budget / HEADROOM_FLOOR) + 1);
            }
            // Against the unit-by-unit reference: the same amount claimed by each Envoy (its
            // share capped at its demand), up to the one unit of rounding per Envoy.
            let expected = reference(budget, &demands);
            for ((share, want), demand) in shares.iter().zip(&expected).zip(&demands) {
                let (got, want) = ((*share).min(*demand), (*want).min(*demand));
                prop_assert!(got.abs_diff(want) <= 1, "{shares:?} vs {expected:?} for {demands:?}");
            }
            // Max-min: an Envoy short of its demand gets no less than anyone else, but one unit.
            for (i, (&share, &demand)) in shares.iter().zip(&demands).enumerate() {
                if share < demand {
                    for (j, &other) in shares.iter().enumerate() {
                        let other_claimed = other.min(demands[j]);
                        prop_assert!(share + 1 >= other_claimed, "{i}: {shares:?} for {demands:?}");
                    }
                }
            }
        }
    }
}
