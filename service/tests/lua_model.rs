//! The token-bucket Lua script, run by a real redis-server, against the filter's own token
//! bucket (src/core/algorithm/token_bucket.rs, the `sluice` crate) called in µs, plus the script's
//! `take`. Redis TIME is the script's only clock, so tests use buckets whose interval is far
//! longer than the test: no token comes back while it runs, and durations differ from the model
//! only by the time that passed since the bucket was created.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::time::Instant;

use common::lcg::Lcg;
use sluice::core::algorithm::token_bucket::{self, Rate};
use sluice_service::stores::redis::TOKEN_BUCKET_LUA;
use sluice_service::stores::MAX_CAPACITY_US;
use sluice_testkit::redis::RedisServer;
use sluice_testkit::resp::{Reply, Resp};

const MINUTE_US: u64 = 60_000_000;

/// The model's clock: every check is at NOW (durations in the replies are from it), and a TAT
/// given as an offset from now is NOW plus that offset.
const NOW: u64 = 1_000_000_000_000_000;

/// `token_bucket::admit` in µs, with take and debt (`token_bucket::owe`): `{allowed, granted,
/// remaining, reset_us, retry_after_us}`.
struct Model {
    rate: Rate,
    tat: u64,
}

impl Model {
    /// A bucket with no TAT yet (an absent key, a full bucket).
    fn new(interval_us: u64, burst: u64) -> Model {
        // One token per interval_us: its bound on capacity, 2^62, is far above MAX_CAPACITY_US.
        let rate = Rate::new(1, interval_us, burst).unwrap();
        Model { rate, tat: 0 }
    }

    /// A bucket whose TAT is `offset_us` from now.
    fn with_tat(interval_us: u64, burst: u64, offset_us: i128) -> Model {
        let tat = (i128::from(NOW) + offset_us).try_into().unwrap();
        Model {
            tat,
            ..Model::new(interval_us, burst)
        }
    }

    /// The script's `take`: the most tokens in cost..=take that the filter admits, each tried
    /// on a copy of the TAT; if even `cost` is denied, that denial.
    fn check(&mut self, cost: u64, take: u64) -> [i128; 5] {
        self.check_owing(cost, take, 0)
    }

    /// As `check`, and a refusal with `debt` is charged by `owe`, then answered as the bucket
    /// stands after it, with the tokens charged as granted.
    fn check_owing(&mut self, cost: u64, take: u64, debt: u64) -> [i128; 5] {
        for tokens in (cost..=take).rev() {
            let mut tat = self.tat;
            let mut d = token_bucket::admit(&self.rate, &mut tat, NOW, tokens);
            if d.allowed || tokens == cost {
                let mut granted = if d.allowed { tokens } else { 0 };
                if !d.allowed && debt > 0 && cost > 0 {
                    granted = token_bucket::owe(&self.rate, &mut tat, NOW, cost, debt);
                    d = token_bucket::admit(&self.rate, &mut tat.clone(), NOW, cost);
                }
                self.tat = tat;
                return [
                    d.allowed.into(),
                    granted.into(),
                    d.remaining.into(),
                    d.reset_after.into(),
                    d.retry_after.into(),
                ];
            }
        }
        panic!("take {take} < cost {cost}")
    }
}

fn eval(
    client: &mut Resp,
    key: &str,
    interval_us: u64,
    burst: u64,
    cost: u64,
    take: u64,
) -> [i128; 5] {
    eval_owing(client, key, (interval_us, burst), (cost, take), 0)
}

fn eval_owing(
    client: &mut Resp,
    key: &str,
    (interval_us, burst): (u64, u64),
    (cost, take): (u64, u64),
    debt: u64,
) -> [i128; 5] {
    let args = [interval_us, burst, cost, take, debt].map(|n| n.to_string());
    let mut command = vec!["EVAL", TOKEN_BUCKET_LUA, "1", key];
    command.extend(args.iter().map(String::as_str));
    let reply = client.cmd(&command).ints();
    reply
        .into_iter()
        .map(i128::from)
        .collect::<Vec<_>>()
        .try_into()
        .unwrap()
}

fn redis_now_us(client: &mut Resp) -> i128 {
    let Reply::Array(time) = client.cmd(&["TIME"]) else {
        panic!("TIME")
    };
    let [seconds, micros] = [&time[0], &time[1]].map(|r| r.text().parse::<i128>().unwrap());
    seconds * 1_000_000 + micros
}

/// Integer fields must match exactly; durations may be short by the time elapsed since the
/// bucket's first call (the model keeps `now` at that first call).
fn assert_matches(actual: [i128; 5], model: [i128; 5], elapsed_us: i128, step: &str) {
    assert_eq!(actual[..3], model[..3], "{step}: allowed/granted/remaining");
    for field in [3, 4] {
        let early_by = model[field] - actual[field];
        assert!(
            (0..=elapsed_us).contains(&early_by) || (model[field] == 0 && actual[field] == 0),
            "{step}: field {field} is {} but the model says {} (elapsed {elapsed_us} µs)",
            actual[field],
            model[field]
        );
    }
}

#[test]
fn random_strict_and_lease_checks_match_the_model() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    let mut random = Lcg(0x5eed);
    for (interval_us, burst) in [
        (MINUTE_US, 1),
        (MINUTE_US, 5),
        (60 * MINUTE_US, 100),
        (MINUTE_US / 7, 37),
    ] {
        let key = format!("sluice:{{model/{interval_us}/{burst}}}");
        let mut model = Model::new(interval_us, burst);
        let started = Instant::now();
        for step in 0..60 {
            let cost = 1 + random.below(burst.div_ceil(3));
            let take = cost + random.below(burst - cost + 1);
            let actual = eval(&mut client, &key, interval_us, burst, cost, take);
            let elapsed_us = started.elapsed().as_micros() as i128 + 50_000;
            let label = format!("{key} step {step} cost {cost} take {take}");
            assert_matches(actual, model.check(cost, take), elapsed_us, &label);
        }
    }
}

#[test]
fn eight_rapid_calls_with_burst_five_at_one_per_second_allow_five() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    let results: Vec<_> = (0..8)
        .map(|_| eval(&mut client, "sluice:{b5}", 1_000_000, 5, 1, 1))
        .collect();
    let allowed: Vec<bool> = results.iter().map(|r| r[0] == 1).collect();
    assert_eq!(allowed, [true, true, true, true, true, false, false, false]);
    let remaining: Vec<i128> = results.iter().map(|r| r[2]).collect();
    assert_eq!(remaining, [4, 3, 2, 1, 0, 0, 0, 0]);
    for denied in &results[5..] {
        assert_eq!(denied[1], 0, "a denial grants nothing");
        assert!(
            (800_000..=1_000_000).contains(&denied[4]),
            "retry after {} µs",
            denied[4]
        );
    }
}

#[test]
fn a_lease_takes_what_is_there_up_to_take() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    let lease = |client: &mut Resp| eval(client, "sluice:{lease}", MINUTE_US, 30, 1, 20);
    let granted: Vec<(i128, i128, i128)> = (0..3)
        .map(|_| lease(&mut client))
        .map(|r| (r[0], r[1], r[2]))
        .collect();
    assert_eq!(granted, [(1, 20, 10), (1, 10, 0), (0, 0, 0)]);
}

#[test]
fn a_lease_needs_at_least_cost_tokens() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    assert_eq!(eval(&mut client, "sluice:{c}", MINUTE_US, 10, 1, 7)[1], 7);
    let short = eval(&mut client, "sluice:{c}", MINUTE_US, 10, 4, 10);
    assert_eq!(
        (short[0], short[1], short[2]),
        (0, 0, 3),
        "3 tokens left, cost 4: denied"
    );
}

#[test]
fn a_tat_in_the_past_is_a_full_bucket_not_more() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    let an_hour_ago = redis_now_us(&mut client) - 3_600_000_000;
    client.cmd(&["SET", "sluice:{stale}", &an_hour_ago.to_string()]);
    let r = eval(&mut client, "sluice:{stale}", 1_000_000, 5, 1, 5);
    assert_eq!(
        (r[0], r[1], r[2]),
        (1, 5, 0),
        "elapsed time is clamped at a full bucket"
    );
}

#[test]
fn a_tat_beyond_capacity_denies_with_nothing_remaining() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    let now = redis_now_us(&mut client);
    // As left by a policy whose bucket was larger: 10 s of debt against a 5 s bucket.
    let tat = now + 10_000_000;
    client.cmd(&["SET", "sluice:{debt}", &tat.to_string()]);
    let r = eval(&mut client, "sluice:{debt}", 1_000_000, 5, 1, 1);
    assert_eq!((r[0], r[1], r[2]), (0, 0, 0));
    let expected_retry = 6_000_000; // tat + 1 s - 5 s - now
    assert!(
        (expected_retry - 100_000..=expected_retry).contains(&r[4]),
        "retry {}",
        r[4]
    );
    assert!((9_900_000..=10_000_000).contains(&r[3]), "reset {}", r[3]);
}

#[test]
fn a_denial_writes_nothing() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    eval(&mut client, "sluice:{d}", MINUTE_US, 1, 1, 1);
    let before = client.cmd(&["GET", "sluice:{d}"]);
    assert_eq!(eval(&mut client, "sluice:{d}", MINUTE_US, 1, 1, 1)[0], 0);
    assert_eq!(client.cmd(&["GET", "sluice:{d}"]), before);
}

#[test]
fn every_write_sets_a_ttl_of_reset_plus_one_second() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    let r = eval(&mut client, "sluice:{ttl}", 1_000_000, 5, 3, 3);
    let pttl = i128::from(client.cmd(&["PTTL", "sluice:{ttl}"]).int());
    let expected = r[3].div_euclid(1000) + 1 + 1000; // ceil(reset_us / 1000) + 1000
    assert!(
        (expected - 200..=expected).contains(&pttl),
        "PTTL {pttl}, expected about {expected}"
    );
}

#[test]
fn the_largest_accepted_bucket_stays_exact_in_lua_doubles() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    let year_us = 31_536_000_000_000;
    let burst = MAX_CAPACITY_US / year_us;
    let r = eval(&mut client, "sluice:{big}", year_us, burst, 1, burst);
    assert_eq!((r[0], r[1], r[2]), (1, i128::from(burst), 0));
    let capacity = i128::from(burst * year_us);
    assert!(
        (capacity - 100_000..=capacity).contains(&r[3]),
        "reset {} of {capacity}",
        r[3]
    );
    let stored = client.cmd(&["GET", "sluice:{big}"]).text();
    assert!(
        stored.bytes().all(|b| b.is_ascii_digit()),
        "TAT stored as an integer, not {stored:?}"
    );
    let after = eval(&mut client, "sluice:{big}", year_us, burst, 1, 1);
    assert_eq!((after[0], after[2]), (0, 0));
    assert!(
        (year_us as i128 - 100_000..=year_us as i128).contains(&after[4]),
        "one year to the next token"
    );
}

#[test]
fn partly_refilled_buckets_match_the_model() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    let mut random = Lcg(0xb0c7);
    let (interval_us, burst) = (1_000_000u64, 8u64);
    let capacity = (interval_us * burst) as i128;
    for case in 0..80 {
        // A TAT between "full long ago" and "twice over capacity", kept at least 100 ms away
        // from a token boundary so the few ms between TIME and EVAL cannot cross one.
        let whole = random.below(3 * burst) as i128 - burst as i128;
        let offset = whole * interval_us as i128 + 100_000 + random.below(800_000) as i128;
        let (cost, take) = (1 + random.below(burst), burst);
        let take = take.max(cost) - random.below(take.max(cost) - cost + 1);
        let key = format!("sluice:{{partial/{case}}}");
        let now = redis_now_us(&mut client);
        client.cmd(&["SET", &key, &(now + offset).to_string()]);
        let started = Instant::now();
        let actual = eval(&mut client, &key, interval_us, burst, cost, take);
        let mut model = Model::with_tat(interval_us, burst, offset);
        let elapsed_us = started.elapsed().as_micros() as i128 + 50_000;
        let label = format!("offset {offset} µs of {capacity}, cost {cost}, take {take}");
        assert_matches(actual, model.check(cost, take), elapsed_us, &label);
    }
}

#[test]
fn refused_checks_owe_up_to_the_debt_as_the_model_does() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    let mut random = Lcg(0xdeb7);
    for (interval_us, burst) in [(MINUTE_US, 1), (MINUTE_US, 5), (MINUTE_US / 7, 37)] {
        for (n, debt) in [1, burst].into_iter().enumerate() {
            let key = format!("sluice:{{owing/{interval_us}/{burst}/{n}}}");
            let mut model = Model::new(interval_us, burst);
            let started = Instant::now();
            for step in 0..40 {
                // Costs up to the most a check may be charged: the bucket and its debt.
                let cost = random.below(burst + debt + 1);
                let actual =
                    eval_owing(&mut client, &key, (interval_us, burst), (cost, cost), debt);
                let elapsed_us = started.elapsed().as_micros() as i128 + 50_000;
                let label = format!("{key} step {step} cost {cost}");
                assert_matches(
                    actual,
                    model.check_owing(cost, cost, debt),
                    elapsed_us,
                    &label,
                );
            }
        }
    }
}

#[test]
fn a_bucket_owes_at_most_its_debt_and_pays_it_back_at_its_rate() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    // 10 a second, a bucket of 10 that may owe 10: 25 asked at once are 20 charged.
    let owing = |client: &mut Resp, cost| {
        eval_owing(client, "sluice:{owes}", (100_000, 10), (cost, cost), 10)
    };
    let first = owing(&mut client, 25);
    assert_eq!(first[..3], [0, 20, 0], "refused, 20 charged, nothing left");
    assert!(
        (1_900_000..=2_000_000).contains(&first[3]),
        "full in 2 s: {}",
        first[3]
    );
    assert!(
        (3_400_000..=3_500_000).contains(&first[4]),
        "25 fit in 3.5 s: {}",
        first[4]
    );
    assert_eq!(owing(&mut client, 1)[..2], [0, 0], "nothing more is owed");
    std::thread::sleep(std::time::Duration::from_millis(500));
    // 5 of the 10 owed are paid back: refused, and this hit owed too.
    assert_eq!(
        owing(&mut client, 1)[..2],
        [0, 1],
        "still owing after 0.5 s"
    );
    std::thread::sleep(std::time::Duration::from_millis(900));
    let paid = owing(&mut client, 1);
    assert_eq!(paid[0], 1, "paid back at 10 a second");
}
