//! The refund scripts (`TOKEN_BUCKET_REFUND_LUA`, `FIXED_WINDOW_REFUND_LUA`,
//! `SLIDING_WINDOW_REFUND_LUA`), run by a real redis-server, against the filter's own
//! `Algorithm::refund` (src/core/algorithm, the `sluice` crate) called in µs: from random states (a
//! bucket full or owing, counts of this window, the one before or older, another algorithm's
//! state) and random refunds (tokens, and an age that puts their taking in this window, the one
//! before or two back), the reply and the state left in Redis must be the model's.
//!
//! Redis TIME is the scripts' only clock: each call is bracketed by TIME before and after, and
//! the model run at both ends; the script must agree with one of them. Windows are an hour and
//! a bucket's tokens a minute each, so that the bracket (well under a millisecond) decides
//! nothing but where a bucket stands between two tokens.
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
use sluice::core::algorithm::{Algorithm, Rate, Window};
use sluice_service::stores::redis::{
    FIXED_WINDOW_REFUND_LUA, SLIDING_WINDOW_REFUND_LUA, TOKEN_BUCKET_REFUND_LUA,
};
use sluice_testkit::redis::RedisServer;
use sluice_testkit::resp::{Reply, Resp};

const MINUTE: u64 = 60_000_000;
const HOUR: u64 = 3_600_000_000;
const LIMIT: u64 = 10;

/// The state in Redis: `None` for no key.
fn read(client: &mut Resp, key: &str) -> Option<String> {
    match client.cmd(&["GET", key]) {
        Reply::Bulk(value) => value,
        other => panic!("GET: {other:?}"),
    }
}

fn write(client: &mut Resp, key: &str, state: Option<&str>) {
    client.cmd(&["DEL", key]);
    if let Some(state) = state {
        client.cmd(&["SET", key, state]);
    }
}

/// One algorithm's refund: its script's ARGV after the tokens and age, and how its state reads
/// and writes as words.
struct Case {
    limit: Algorithm,
    script: &'static str,
    args: fn(u64, u64) -> Vec<u64>,
    /// The stored text as the algorithm's words (`None`: no state of it).
    words: fn(Option<&str>) -> Option<Vec<u64>>,
    text: fn(&[u64]) -> String,
}

fn numbers(text: Option<&str>, parts: usize) -> Option<Vec<u64>> {
    let words: Vec<u64> = text?
        .split(':')
        .map(|w| w.parse().ok())
        .collect::<Option<_>>()?;
    (words.len() == parts).then_some(words)
}

fn cases() -> [Case; 3] {
    let window = Window::new(LIMIT, HOUR).unwrap();
    [
        Case {
            limit: Algorithm::TokenBucket(Rate::new(1, MINUTE, LIMIT).unwrap()),
            script: TOKEN_BUCKET_REFUND_LUA,
            args: |tokens, _| vec![MINUTE, tokens],
            words: |text| numbers(text, 1),
            text: |words| words[0].to_string(),
        },
        Case {
            limit: Algorithm::FixedWindow(window),
            script: FIXED_WINDOW_REFUND_LUA,
            args: |tokens, age| vec![HOUR, tokens, age],
            words: |text| numbers(text, 2),
            text: |w| format!("{}:{}", w[0], w[1]),
        },
        Case {
            limit: Algorithm::SlidingWindow(window),
            script: SLIDING_WINDOW_REFUND_LUA,
            args: |tokens, age| vec![HOUR, tokens, age],
            words: |text| numbers(text, 3),
            text: |w| format!("{}:{}:{}", w[0], w[1], w[2]),
        },
    ]
}

/// A random state of `case`'s algorithm at `now`, or another algorithm's.
fn random_state(random: &mut Lcg, case: &Case, now: u64) -> Option<String> {
    let index = now / HOUR;
    let count = |random: &mut Lcg| random.below(2 * LIMIT + 1);
    match (random.below(6), &case.limit) {
        (0, _) => None,
        (1, _) => Some("zzz".into()),
        (_, Algorithm::TokenBucket(_)) => {
            let owed = random.below(2 * LIMIT * MINUTE);
            let tat = if random.below(4) == 0 {
                now - owed
            } else {
                now + owed
            };
            Some(tat.to_string())
        }
        (_, Algorithm::FixedWindow(_)) => {
            let at = index - random.below(2);
            Some(format!("{at}:{}", count(random)))
        }
        _ => {
            let at = index - random.below(3);
            Some(format!("{at}:{}:{}", count(random), count(random)))
        }
    }
}

/// An age that puts the tokens' taking in this window, the one before, or two back.
fn random_age(random: &mut Lcg, now: u64) -> u64 {
    let elapsed = now % HOUR;
    match random.below(3) {
        0 => random.below(elapsed.max(1)),
        1 => elapsed + HOUR / 2,
        _ => elapsed + HOUR + HOUR / 2,
    }
}

/// The model's reply and the state it leaves, at `now`.
fn model(case: &Case, state: Option<&str>, now: u64, tokens: u64, age: u64) -> (i64, String) {
    let Some(mut words) = (case.words)(state) else {
        return (0, state.unwrap_or_default().to_string());
    };
    let before = words.clone();
    let given = case.limit.refund(&mut words, now, tokens, now - age);
    let after = if words == before || given == 0 && !moved_a_bucket(case, &before, &words) {
        state.unwrap_or_default().to_string()
    } else {
        (case.text)(&words)
    };
    (i64::try_from(given).unwrap(), after)
}

/// A refund of part of a token moves a bucket's TAT, and is written, with nothing given back.
fn moved_a_bucket(case: &Case, before: &[u64], after: &[u64]) -> bool {
    matches!(case.limit, Algorithm::TokenBucket(_)) && before != after
}

#[test]
fn random_refunds_match_the_filters_algorithms() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    let mut random = Lcg(0x2ef0);
    for case in cases() {
        let key = format!("sluice:{{refund}}:{}", case.limit.name());
        let mut gave_back = 0;
        for step in 0..150 {
            let now = redis_time_us(&mut client);
            let state = random_state(&mut random, &case, now);
            write(&mut client, &key, state.as_deref());
            let (tokens, age) = (1 + random.below(2 * LIMIT), random_age(&mut random, now));
            let args: Vec<String> = (case.args)(tokens, age)
                .iter()
                .map(u64::to_string)
                .collect();
            let mut command = vec!["EVAL", case.script, "1", &key];
            command.extend(args.iter().map(String::as_str));
            let before = redis_time_us(&mut client);
            let given = client.cmd(&command).int();
            gave_back += usize::from(given > 0);
            let after = redis_time_us(&mut client);
            let stored = read(&mut client, &key).unwrap_or_default();
            let fits = |at: u64| {
                let (want, left) = model(&case, state.as_deref(), at, tokens, age);
                // A bucket refunded to full stands at the script's own now, within the bracket.
                let full_at_now = stored
                    .parse::<u64>()
                    .is_ok_and(|t| (before..=after).contains(&t))
                    && left
                        .parse::<u64>()
                        .is_ok_and(|t| (before..=after).contains(&t));
                want == given && (left == stored || full_at_now)
            };
            assert!(
                fits(before) || fits(after),
                "{} step {step}: state {state:?}, {tokens} tokens {age} µs old: gave {given}, left {stored:?}; the model at {before}: {:?}",
                case.limit.name(),
                model(&case, state.as_deref(), before, tokens, age),
            );
        }
        // The random states give tokens back and refuse to, both often.
        assert!(
            (10..130).contains(&gave_back),
            "{}: {gave_back} of 150",
            case.limit.name()
        );
    }
}
