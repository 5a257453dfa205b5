//! The calendar window's Lua scripts, run by a real redis-server, against the obvious model: a
//! count per period, admitted while count + cost <= limit, granting up to `take`, a refusal with
//! debt counted up to limit + debt. The boundaries are ones the test makes around Redis TIME;
//! whichever three periods around TIME the service passes (TIME in the first, the middle or the
//! last of them, as when the service's clock is behind or ahead of Redis's), the script counts
//! into the same period's state.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use common::clock::redis_time_us;
use common::lcg::Lcg;
use sluice_service::stores::redis::{CALENDAR_WINDOW_LUA, CALENDAR_WINDOW_REFUND_LUA};
use sluice_testkit::redis::RedisServer;
use sluice_testkit::resp::{Reply, Resp};

fn eval(client: &mut Resp, script: &str, key: &str, args: &[u64]) -> Vec<i64> {
    let args: Vec<String> = args.iter().map(u64::to_string).collect();
    let mut command = vec!["EVAL", script, "1", key];
    command.extend(args.iter().map(String::as_str));
    match client.cmd(&command) {
        Reply::Int(n) => vec![n],
        reply => reply.ints(),
    }
}

/// A period length of whole seconds (100 to 1,000) whose period holding `now_us` has at least
/// 20 s on either side of it.
fn whole_seconds_around(now_us: u64) -> u64 {
    let now = now_us / 1_000_000;
    let seconds = (100..1_000)
        .find(|&length| (20..length - 20).contains(&(now % length)))
        .unwrap();
    seconds * 1_000_000
}

/// The count of one period, and what a check does to it: `[allowed, granted, remaining]`.
struct Model {
    limit: u64,
    count: u64,
}

impl Model {
    fn check(&mut self, cost: u64, take: u64, debt: u64) -> [i64; 3] {
        let Model { limit, count } = *self;
        if count + cost > limit {
            let charged = if debt > 0 && cost > 0 {
                (count + cost).min(limit + debt).saturating_sub(count)
            } else {
                0
            };
            self.count += charged;
            return [0, charged as i64, limit.saturating_sub(self.count) as i64];
        }
        let granted = take.min(limit - count);
        self.count += granted;
        [1, granted as i64, (limit - self.count) as i64]
    }
}

#[test]
fn random_checks_match_a_count_per_period_whichever_boundaries_the_service_passes() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    let mut random = Lcg(0xca1e);
    // Whole-second periods of 100 to 1,000 s with TIME at least 20 s from either end.
    let now_us = redis_time_us(&mut client);
    let length_us = whole_seconds_around(now_us);
    let start = now_us / length_us * length_us;
    let end = start + length_us;
    // Three sets of boundaries that all put TIME in [start, end): in the middle, the first
    // and the last of the three periods.
    let around = [
        [start - length_us, start, end, end + length_us],
        [start, end, end + length_us, end + 2 * length_us],
        [start - 2 * length_us, start - length_us, start, end],
    ];
    for limit in [1u64, 7, 100] {
        let key = format!("sluice:{{calendar/{limit}}}");
        let mut model = Model { limit, count: 0 };
        for step in 0..60 {
            let cost = 1 + random.below(limit.div_ceil(3));
            let take = cost + random.below(limit - cost + 1);
            let debt = if random.below(4) == 0 {
                random.below(5)
            } else {
                0
            };
            let [b1, b2, b3, b4] = around[step % 3];
            let reply = eval(
                &mut client,
                CALENDAR_WINDOW_LUA,
                &key,
                &[limit, cost, take, debt, b1, b2, b3, b4],
            );
            let label = format!("limit {limit} step {step} cost {cost} take {take} debt {debt}");
            assert_eq!(reply[..3], model.check(cost, take, debt), "{label}");
            let reset = reply[3] as u64;
            let time = redis_time_us(&mut client);
            assert!(
                reset <= end - now_us && reset + 1_000_000 >= end - time,
                "{label}: reset {reset} µs, the period ends in {} µs",
                end - time
            );
            let expected_retry = if reply[0] == 1 { 0 } else { reply[3] };
            assert_eq!(reply[4], expected_retry, "{label}: retry_after");
        }
        // The state names the period by its start, in seconds.
        let stored = client.cmd(&["GET", &key]).text();
        assert_eq!(stored, format!("{}:{}", start / 1_000_000, model.count));
    }
}

#[test]
fn a_refund_counts_in_the_period_that_took_the_tokens() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    let now_us = redis_time_us(&mut client);
    let length_us = whole_seconds_around(now_us);
    let start = now_us / length_us * length_us;
    let b = [
        start - length_us,
        start,
        start + length_us,
        start + 2 * length_us,
    ];
    let key = "sluice:{calendar/refund}";
    let check = [10, 1, 10, 0, b[0], b[1], b[2], b[3]];
    assert_eq!(eval(&mut client, CALENDAR_WINDOW_LUA, key, &check)[1], 10);
    let refund = |age_us: u64| [4, age_us, b[0], b[1], b[2], b[3]];
    assert_eq!(
        eval(&mut client, CALENDAR_WINDOW_REFUND_LUA, key, &refund(1_000)),
        [4]
    );
    // Taken before this period began: nothing to give back.
    let before = now_us - start + 5_000_000;
    assert_eq!(
        eval(
            &mut client,
            CALENDAR_WINDOW_REFUND_LUA,
            key,
            &refund(before)
        ),
        [0]
    );
    assert_eq!(
        client.cmd(&["GET", key]).text(),
        format!("{}:6", start / 1_000_000)
    );
}
