//! The bucket action an Envoy is sent for its share: a token bucket refilled at exactly the
//! share's rate (`share` tokens every period, which Envoy 1.40 turns into a rate per second; it
//! reads fill intervals in whole seconds, and refuses `requests_per_time_unit`) holding at most
//! `BURST` of it, or deny-all for a share of zero (a token bucket needs a token), with a time to
//! live after which Envoy's `expired_assignment_behavior` takes over.

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
        Strategy::TokenBucket(TokenBucket {
            max_tokens: burst(share, period),
            tokens_per_fill: Some(UInt32Value {
                value: u32::try_from(tokens).unwrap_or(u32::MAX),
            }),
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

/// How much of its share a bucket may hold: Envoy 1.40 builds a token bucket full (when an
/// assignment first comes, and again each time it changes), so `max_tokens` is what each new
/// assignment can add past the rate to a busy Envoy, whose bucket is otherwise empty; and it is
/// the slack an Envoy that gets all it asks has for requests that come close together, or late
/// and then at once. Two seconds of the share, at least `MIN_TOKENS`.
pub const BURST: Duration = Duration::from_secs(2);
/// The fewest tokens a bucket holds: a share of 2 a second still lets 4 requests come at once.
pub const MIN_TOKENS: u32 = 4;

/// `share` per `period` as the tokens `BURST` holds, at least `MIN_TOKENS`.
pub fn burst(share: u64, period: Duration) -> u32 {
    let period_ms = period.as_millis().max(1);
    let tokens = u128::from(share) * BURST.as_millis() / period_ms;
    u32::try_from(tokens).unwrap_or(u32::MAX).max(MIN_TOKENS)
}

/// `share` per `period` as (tokens, fill interval) at the same rate: the period itself when it
/// is whole seconds (the exact rate: Envoy 1.40 refills continuously at tokens / interval),
/// else the period rounded up to whole seconds and its tokens rounded down (below 1 s the fill
/// rate divides by zero). Never more than the share's rate.
pub fn refill(share: u64, period: Duration) -> (u64, Duration) {
    let period_ms = period.as_millis().max(1);
    let fill_s = period_ms.div_ceil(1_000).max(1);
    let tokens = u128::from(share) * fill_s * 1_000 / period_ms;
    let fill = Duration::from_secs(u64::try_from(fill_s).unwrap_or(u64::MAX));
    (u64::try_from(tokens).unwrap_or(u64::MAX), fill)
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
    fn a_share_of_300_a_minute_refills_300_a_minute_and_holds_two_seconds_of_it() {
        let action = assign(
            BucketId::default(),
            300,
            Duration::from_secs(60),
            Duration::from_secs(15),
        );
        let Some(Strategy::TokenBucket(bucket)) = strategy(&action) else {
            panic!("{action:?}");
        };
        assert_eq!(bucket.tokens_per_fill.map(|t| t.value), Some(300));
        assert_eq!(bucket.fill_interval.map(|d| d.seconds), Some(60));
        assert_eq!(bucket.max_tokens, 10);
        assert_eq!(burst(12, Duration::from_secs(60)), MIN_TOKENS);
        assert_eq!(burst(u64::MAX, Duration::from_secs(1)), u32::MAX);
    }

    #[test]
    fn a_period_below_a_second_is_refilled_over_whole_seconds_never_faster() {
        assert_eq!(
            refill(5, Duration::from_millis(500)),
            (10, Duration::from_secs(1))
        );
        assert_eq!(
            refill(3, Duration::from_millis(1_500)),
            (4, Duration::from_secs(2))
        );
        assert_eq!(
            refill(7, Duration::from_secs(3_600)),
            (7, Duration::from_secs(3_600))
        );
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
