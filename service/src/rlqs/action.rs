//! The bucket action an Envoy is sent for its share: a token bucket of `share` tokens refilled
//! whole every period (Envoy 1.40 reads fill intervals in whole seconds, and refuses
//! `requests_per_time_unit`), or deny-all for a share of zero (a token bucket needs a token),
//! with a time to live after which Envoy's `expired_assignment_behavior` takes over.

use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
use envoy_types::pb::google::protobuf::{Duration as ProtoDuration, UInt32Value};

/// The assignment of `share` requests per `period` to `bucket`, for `ttl`.
pub fn assign(bucket: BucketId, share: u64, period: Duration, ttl: Duration) -> BucketAction {
    let strategy = if share == 0 {
        Strategy::BlanketRule(BlanketRule::DenyAll as i32)
    } else {
        let (tokens, fill) = refill(share, period);
        let tokens = u32::try_from(tokens).unwrap_or(u32::MAX);
        Strategy::TokenBucket(TokenBucket {
            max_tokens: tokens,
            tokens_per_fill: Some(UInt32Value { value: tokens }),
            fill_interval: Some(whole_seconds(fill)),
        })
    };
    let assignment = QuotaAssignmentAction {
        assignment_time_to_live: Some(whole_seconds(ttl)),
        rate_limit_strategy: Some(RateLimitStrategy {
            strategy: Some(strategy),
        }),
    };
    BucketAction {
        bucket_id: Some(bucket),
        bucket_action: Some(Action::QuotaAssignmentAction(assignment)),
    }
}

/// Tells Envoy to forget `bucket` (nobody reports it any more).
pub fn abandon(bucket: BucketId) -> BucketAction {
    BucketAction {
        bucket_id: Some(bucket),
        bucket_action: Some(Action::AbandonAction(AbandonAction {})),
    }
}

/// Fill intervals tried, shortest first: a short one keeps a bucket from admitting its whole
/// share at once (Envoy 1.40 rebuilds a changed bucket full, so its `max_tokens` is what each
/// re-assignment can add), a longer one rounds away less of the share.
const FILLS_S: [u64; 8] = [1, 2, 5, 10, 15, 30, 60, 300];

/// `share` per `period` as (tokens, fill interval): the shortest interval of whole seconds whose
/// tokens, rounded down, lose at most 2% of the share, else the whole period. Never more than
/// the share.
pub fn refill(share: u64, period: Duration) -> (u64, Duration) {
    let period_s = period.as_secs().max(1);
    for fill_s in FILLS_S.into_iter().take_while(|&f| f < period_s) {
        let exact = u128::from(share) * u128::from(fill_s);
        let tokens = exact / u128::from(period_s);
        let lost = exact - tokens * u128::from(period_s);
        if tokens > 0 && lost * 50 <= exact {
            return (
                u64::try_from(tokens).unwrap_or(u64::MAX),
                Duration::from_secs(fill_s),
            );
        }
    }
    (share, Duration::from_secs(period_s))
}

/// At least one second: below that Envoy 1.40's fill rate divides by zero.
fn whole_seconds(duration: Duration) -> ProtoDuration {
    let seconds = i64::try_from(duration.as_secs().max(1)).unwrap_or(i64::MAX);
    ProtoDuration { seconds, nanos: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strategy(action: &BucketAction) -> Option<Strategy> {
        match action.bucket_action {
            Some(Action::QuotaAssignmentAction(assignment)) => {
                assignment.rate_limit_strategy.and_then(|s| s.strategy)
            }
            _ => None,
        }
    }

    #[test]
    fn a_share_of_300_a_minute_is_5_tokens_a_second() {
        let action = assign(
            BucketId::default(),
            300,
            Duration::from_secs(60),
            Duration::from_secs(15),
        );
        let Some(Strategy::TokenBucket(bucket)) = strategy(&action) else {
            panic!("{action:?}");
        };
        assert_eq!(bucket.max_tokens, 5);
        assert_eq!(bucket.tokens_per_fill.map(|t| t.value), Some(5));
        assert_eq!(bucket.fill_interval.map(|d| d.seconds), Some(1));
    }

    #[test]
    fn a_refill_rounds_away_at_most_2_percent_and_never_adds() {
        let minute = Duration::from_secs(60);
        assert_eq!(refill(30, minute), (1, Duration::from_secs(2)));
        assert_eq!(refill(588, minute), (49, Duration::from_secs(5)));
        assert_eq!(refill(7, minute), (7, minute));
        for share in 1..2_000u64 {
            let (tokens, fill) = refill(share, minute);
            let per_minute = tokens * 60 / fill.as_secs();
            assert!(
                per_minute <= share && per_minute * 50 >= share * 49,
                "{share}"
            );
        }
    }

    #[test]
    fn a_share_of_nothing_denies_all_and_intervals_are_whole_seconds() {
        let action = assign(
            BucketId::default(),
            0,
            Duration::from_millis(10),
            Duration::ZERO,
        );
        assert_eq!(
            strategy(&action),
            Some(Strategy::BlanketRule(BlanketRule::DenyAll as i32))
        );
        let Some(Action::QuotaAssignmentAction(assignment)) = action.bucket_action else {
            panic!("{action:?}");
        };
        assert_eq!(
            assignment.assignment_time_to_live.map(|d| d.seconds),
            Some(1)
        );
    }
}
