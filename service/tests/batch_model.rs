//! `CHECKS_LUA`, the batch script, run by a real redis-server against the one-check scripts the
//! model tests hold to the filter's algorithms (`lua_model.rs`, `algorithm_models.rs`): random
//! batches of checks of every algorithm it decides, on keys that recur within a batch, from
//! random states (fresh, of this window, of the last, foreign), give the same answers and leave
//! the same states as the same checks one script call after another. Windows and intervals are
//! far longer than the test, so that the time between the two runs only moves the durations
//! (`reset_us`, `retry_after_us`, `delay_us`, the TTLs) by that time.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use common::lcg::Lcg;
use sluice_service::stores::redis::{
    CHECKS_LUA, DECISION_BYTES, FIXED_WINDOW_LUA, LEAKY_BUCKET_LUA, RECORD_BYTES,
    SLIDING_WINDOW_LUA, TOKEN_BUCKET_LUA,
};
use sluice_testkit::redis::RedisServer;

const SEC: u64 = 1_000_000;
const YEAR: u64 = 31_536_000 * SEC;
/// How far durations may differ between the two runs (the test's own time, generously).
const SLACK_US: i64 = 5 * SEC as i64;

/// (kind code of `CHECKS_LUA`'s records, the one-check script, a1, a2, its capacity).
const ALGORITHMS: [(u8, &str, u64, u64, u64); 5] = [
    (1, TOKEN_BUCKET_LUA, 60 * SEC, 6, 6),
    (2, FIXED_WINDOW_LUA, YEAR, 7, 7),
    (3, SLIDING_WINDOW_LUA, YEAR, 7, 7),
    (4, LEAKY_BUCKET_LUA, 60 * SEC, 300 * SEC, 6),
    (1, TOKEN_BUCKET_LUA, 3600 * SEC, 1000, 1000),
];

struct Check {
    algorithm: usize,
    key: String,
    numbers: [u64; 5],
}

fn now_us(con: &mut redis::Connection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query(con).unwrap();
    s * SEC + us
}

/// A state for `key` of `algorithm`, the same under both prefixes.
fn seed(con: &mut redis::Connection, rng: &mut Lcg, algorithm: usize, keys: &[String]) {
    let (kind, _, a1, _, _) = ALGORITHMS[algorithm];
    let now = now_us(con);
    let index = now / a1;
    // A state of this window has the TTL its scripts give it (to the end of the window, or of
    // the next for the sliding window, plus 1 s): the batch script keeps it (`KEEPTTL`).
    let end_ms = |windows: u64| ((index + windows) * a1 - now).div_ceil(1000) + 1000;
    let (text, ttl_ms) = match (kind, rng.below(5)) {
        (_, 0) => (None, 0),
        (_, 1) => (Some("foreign".to_string()), 3_600_000),
        (1 | 4, _) => (Some((now + rng.below(4) * a1).to_string()), 3_600_000),
        (2, 2) => (Some(format!("{}:{}", index - 1, rng.below(8))), 3_600_000),
        (2, _) => (Some(format!("{index}:{}", rng.below(9))), end_ms(1)),
        (3, 2) => (
            Some(format!("{}:{}:{}", index - 1, rng.below(8), rng.below(8))),
            3_600_000,
        ),
        (_, _) => (
            Some(format!("{index}:{}:{}", rng.below(9), rng.below(8))),
            end_ms(2),
        ),
    };
    let other_type = rng.below(8) == 0;
    for key in keys {
        let _: () = redis::cmd("DEL").arg(key).query(con).unwrap();
        if other_type {
            // Another type: both scripts read it as no state.
            let _: () = redis::cmd("RPUSH").arg(key).arg("x").query(con).unwrap();
        } else if let Some(text) = &text {
            let _: () = redis::cmd("SET")
                .arg(key)
                .arg(text)
                .arg("PX")
                .arg(ttl_ms)
                .query(con)
                .unwrap();
        }
    }
}

/// The decision fields of the one-check scripts: allowed, granted, remaining, reset_us,
/// retry_after_us, delay_us (0 but the leaky bucket's).
fn one_by_one(con: &mut redis::Connection, checks: &[Check], prefix: &str) -> Vec<[i64; 6]> {
    checks
        .iter()
        .map(|check| {
            let (_, script, ..) = ALGORITHMS[check.algorithm];
            let reply: Vec<i64> = redis::cmd("EVAL")
                .arg(script)
                .arg(1)
                .arg(format!("{prefix}{}", check.key))
                .arg(&check.numbers[..])
                .query(con)
                .unwrap();
            let mut fields = [0; 6];
            fields[..reply.len()].copy_from_slice(&reply);
            fields
        })
        .collect()
}

fn batched(con: &mut redis::Connection, checks: &[Check], prefix: &str) -> Vec<[i64; 6]> {
    let mut records = Vec::new();
    let mut keys: Vec<String> = Vec::new();
    for check in checks {
        let key = format!("{prefix}{}", check.key);
        let index = match keys.iter().position(|k| *k == key) {
            Some(i) => i + 1,
            None => {
                keys.push(key);
                keys.len()
            }
        };
        records.push(ALGORITHMS[check.algorithm].0);
        records.extend_from_slice(&(index as u16).to_le_bytes());
        for n in check.numbers {
            records.extend_from_slice(&(n as f64).to_le_bytes());
        }
    }
    assert_eq!(records.len(), checks.len() * RECORD_BYTES);
    let mut eval = redis::cmd("EVAL");
    eval.arg(CHECKS_LUA).arg(keys.len()).arg(&keys[..]);
    let reply: Vec<u8> = eval.arg(records).query(con).unwrap();
    assert_eq!(reply.len(), checks.len() * DECISION_BYTES);
    reply
        .chunks(DECISION_BYTES)
        .map(|decision| {
            let mut fields = [0; 6];
            for (field, bytes) in fields.iter_mut().zip(decision.chunks(8)) {
                *field = f64::from_le_bytes(bytes.try_into().unwrap()) as i64;
            }
            fields
        })
        .collect()
}

#[test]
fn a_batch_decides_as_its_checks_one_after_another() {
    let redis = RedisServer::start();
    let mut con = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut rng = Lcg(37);
    for round in 0..200 {
        let keys = 1 + rng.below(4) as usize;
        let mut checks = Vec::new();
        for k in 0..keys {
            let algorithm = rng.below(ALGORITHMS.len() as u64) as usize;
            let key = format!("{round}/{k}/{algorithm}");
            seed(
                &mut con,
                &mut rng,
                algorithm,
                &[format!("s:{key}"), format!("b:{key}")],
            );
            for _ in 0..1 + rng.below(6) {
                let capacity = ALGORITHMS[algorithm].4;
                let cost = rng.below(capacity.min(4) + 1);
                let take = cost + rng.below(capacity - cost + 1).min(2);
                let debt = rng.pick(&[0, 0, 3, capacity]);
                let (_, _, a1, a2, _) = ALGORITHMS[algorithm];
                checks.push(Check {
                    algorithm,
                    key: key.clone(),
                    numbers: [a1, a2, cost, take, debt],
                });
            }
        }
        // Interleaved: a key's checks keep their order, the keys' mix.
        let mut order: Vec<usize> = (0..checks.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        order.sort_by_key(|&i| checks[i].key.clone());
        let mut mixed: Vec<Check> = Vec::new();
        let mut rest: Vec<std::collections::VecDeque<Check>> = Vec::new();
        let mut by_key: std::collections::BTreeMap<String, usize> = Default::default();
        for check in checks {
            let n = by_key.len();
            let slot = *by_key.entry(check.key.clone()).or_insert(n);
            if slot == rest.len() {
                rest.push(Default::default());
            }
            rest[slot].push_back(check);
        }
        while rest.iter().any(|queue| !queue.is_empty()) {
            let slot = rng.below(rest.len() as u64) as usize;
            if let Some(check) = rest[slot].pop_front() {
                mixed.push(check);
            }
        }
        let single = one_by_one(&mut con, &mixed, "s:");
        let batch = batched(&mut con, &mixed, "b:");
        for (i, (s, b)) in single.iter().zip(&batch).enumerate() {
            let label = format!(
                "round {round}, check {i} ({}, {:?})",
                mixed[i].key, mixed[i].numbers
            );
            assert_eq!(s[..3], b[..3], "{label}: {s:?} one by one, {b:?} batched");
            for f in 3..6 {
                assert!(
                    (s[f] - b[f]).abs() <= SLACK_US,
                    "{label}: {s:?} one by one, {b:?} batched"
                );
            }
        }
        for key in by_key.keys() {
            let (s, b) = (format!("s:{key}"), format!("b:{key}"));
            let kind = |con: &mut redis::Connection, k: &str| -> String {
                redis::cmd("TYPE").arg(k).query(con).unwrap()
            };
            assert_eq!(kind(&mut con, &s), kind(&mut con, &b), "{key}");
            if kind(&mut con, &s) != "string" {
                continue;
            }
            let text = |con: &mut redis::Connection, k: &str| -> String {
                redis::cmd("GET").arg(k).query(con).unwrap()
            };
            let (st, bt) = (text(&mut con, &s), text(&mut con, &b));
            let algorithm = ALGORITHMS[mixed.iter().find(|c| &c.key == key).unwrap().algorithm].0;
            if st != bt && (algorithm == 1 || algorithm == 4) {
                // A TAT: the same to the time between the runs.
                let (sn, bn): (i64, i64) = (st.parse().unwrap(), bt.parse().unwrap());
                assert!(
                    (sn - bn).abs() <= SLACK_US,
                    "{key}: {st} one by one, {bt} batched"
                );
            } else {
                assert_eq!(st, bt, "{key}");
            }
            let ttl = |con: &mut redis::Connection, k: &str| -> i64 {
                redis::cmd("PTTL").arg(k).query(con).unwrap()
            };
            let (sl, bl) = (ttl(&mut con, &s), ttl(&mut con, &b));
            assert!(
                (sl - bl).abs() <= SLACK_US / 1000,
                "{key}: TTL {sl} one by one, {bl} batched"
            );
        }
    }
}
