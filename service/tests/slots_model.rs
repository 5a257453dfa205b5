//! The concurrency scripts (`CONCURRENCY_LUA`, `CONCURRENCY_GIVE_BACK_LUA`, `SLOT_RELEASE_LUA`,
//! `SLOT_RENEW_LUA`), run by a real redis-server, against the memory store's `SlotTable`: one
//! random sequence of takes (named and anonymous), give-backs, releases and renewals on both,
//! from the same random state, must give the same replies.
//!
//! Redis TIME is the scripts' only clock, so the state is set relative to it: slots that
//! expired or live at least a second either side of now, new slots with a lease of a minute,
//! and a sequence that takes well under a second. The model is called with TIME read just
//! before each call; everything but `reset_us` is then the same whenever in the call Redis read
//! its clock, and `reset_us` differs by at most the call's duration plus that of the call that
//! took the newest slot (whose expiry Redis set from its own reading of the clock).
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
use sluice_service::stores::memory_slots::{Ask, SlotTable};
use sluice_service::stores::redis::{
    CONCURRENCY_GIVE_BACK_LUA, CONCURRENCY_LUA, SLOT_RELEASE_LUA, SLOT_RENEW_LUA,
};
use sluice_service::stores::Decision;
use sluice_testkit::redis::RedisServer;
use sluice_testkit::resp::Resp;

const SEC: u64 = 1_000_000;
const LEASE: u64 = 60 * SEC;
const KEY: &str = "sluice:{model}:concurrency";
/// The names slots are given: a few, so that takes, releases and renewals meet.
const NAMES: [&str; 5] = [
    "00000000000000a0",
    "00000000000000a1",
    "00000000000000a2",
    "00000000000000a3",
    "00000000000000a4",
];

#[derive(Debug, Clone, Copy)]
enum Op {
    Take {
        cost: u64,
        take: u64,
        name: Option<&'static str>,
    },
    GiveBack(u64),
    Release(&'static str),
    Renew(&'static str),
}

fn random_op(random: &mut Lcg, limit: u64) -> Op {
    let name = NAMES[random.below(NAMES.len() as u64) as usize];
    match random.below(5) {
        0 => Op::Take {
            cost: 1,
            take: 1,
            name: Some(name),
        },
        1 => {
            let cost = 1 + random.below(limit + 1);
            let take = if random.below(4) == 0 { 0 } else { cost };
            Op::Take {
                cost,
                take,
                name: None,
            }
        }
        2 => Op::GiveBack(random.below(limit + 2)),
        3 => Op::Release(name),
        _ => Op::Renew(name),
    }
}

/// A name's tombstone, as `store::released_key` names it for `KEY`.
fn tombstone(name: &str) -> String {
    format!("sluice:{{model}}:released/{name}")
}

/// The op by its script on Redis: a decision's five numbers, or a release's or renewal's one.
fn eval(client: &mut Resp, limit: u64, op: Op) -> Vec<i64> {
    let (script, args, second): (&str, Vec<String>, Option<String>) = match op {
        Op::Take { cost, take, name } => {
            let numbers = [limit, LEASE, cost, take].map(|n| n.to_string());
            let mut args = numbers.to_vec();
            args.push(name.unwrap_or("").to_string());
            (CONCURRENCY_LUA, args, name.map(tombstone))
        }
        Op::GiveBack(count) => (
            CONCURRENCY_GIVE_BACK_LUA,
            vec![limit.to_string(), count.to_string()],
            None,
        ),
        Op::Release(name) => (
            SLOT_RELEASE_LUA,
            vec![name.to_string(), LEASE.to_string()],
            Some(tombstone(name)),
        ),
        Op::Renew(name) => (
            SLOT_RENEW_LUA,
            vec![LEASE.to_string(), name.to_string()],
            None,
        ),
    };
    let mut command = vec!["EVAL", script];
    match &second {
        Some(second) => command.extend(["2", KEY, second.as_str()]),
        None => command.extend(["1", KEY]),
    }
    command.extend(args.iter().map(String::as_str));
    let reply = client.cmd(&command);
    match op {
        Op::Take { .. } | Op::GiveBack(_) => reply.ints(),
        _ => vec![reply.int()],
    }
}

/// The op on the model at `now`, in the scripts' reply shape.
fn model(table: &mut SlotTable, limit: u64, op: Op, now: u64) -> Vec<i64> {
    let numbers = |d: Decision| {
        let n = |v: u64| i64::try_from(v).unwrap();
        vec![
            i64::from(d.allowed),
            n(d.granted),
            n(d.remaining),
            n(d.reset_us),
            n(d.retry_after_us),
        ]
    };
    match op {
        Op::Take { cost, take, name } => {
            let ask = Ask {
                limit,
                lease_us: LEASE,
                cost,
                take,
                name,
            };
            numbers(table.acquire(KEY, ask, now))
        }
        Op::GiveBack(count) => numbers(table.give_back(KEY, limit, count, now)),
        Op::Release(name) => vec![table.release(KEY, name, LEASE, now) as i64],
        Op::Renew(name) => vec![table.renew(KEY, LEASE, name, now) as i64],
    }
}

/// The same random slots on Redis and on the model: each name absent, expired or live, at
/// least a second from `now`; or, now and then, state of another type under the key.
fn random_state(random: &mut Lcg, client: &mut Resp, table: &mut SlotTable, now: u64) {
    client.cmd(&["DEL", KEY]);
    for name in NAMES {
        client.cmd(&["DEL", &tombstone(name)]);
    }
    if random.below(8) == 0 {
        client.cmd(&["SET", KEY, "12:3"]);
        return;
    }
    for name in NAMES {
        let expiry = match random.below(3) {
            0 => continue,
            1 => now - SEC - random.below(10 * SEC),
            _ => now + SEC + random.below(10 * SEC),
        };
        client.cmd(&["ZADD", KEY, &expiry.to_string(), name]);
        // Taken at 0 with a lease that ends at `expiry`: the model's way to hold that slot.
        let ask = Ask {
            limit: u64::MAX / 2,
            lease_us: expiry,
            cost: 1,
            take: 1,
            name: Some(name),
        };
        table.acquire(KEY, ask, 0);
    }
}

#[test]
fn random_takes_give_backs_releases_and_renewals_match_the_memory_store() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    let mut random = Lcg(0x51075);
    for round in 0..60 {
        let limit = 1 + random.below(4);
        let mut table = SlotTable::default();
        let mut longest = 0;
        let now = redis_time_us(&mut client);
        random_state(&mut random, &mut client, &mut table, now);
        for step in 0..12 {
            let op = random_op(&mut random, limit);
            let before = redis_time_us(&mut client);
            let actual = eval(&mut client, limit, op);
            let elapsed = i64::try_from(redis_time_us(&mut client) - before).unwrap();
            longest = longest.max(elapsed);
            let expected = model(&mut table, limit, op, before);
            let label = format!("round {round} step {step} limit {limit} {op:?}");
            if actual.len() == 1 {
                assert_eq!(actual, expected, "{label}");
                continue;
            }
            assert_eq!(
                actual[..3],
                expected[..3],
                "{label}: allowed/granted/remaining"
            );
            assert_eq!(actual[4], 0, "{label}: no retry_after");
            let apart = (expected[3] - actual[3]).abs();
            assert!(
                apart <= elapsed + longest,
                "{label}: reset {} but the model says {}",
                actual[3],
                expected[3]
            );
        }
    }
}

#[test]
fn a_key_that_holds_slots_lives_until_its_newest_lease_ends() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    let take = Op::Take {
        cost: 1,
        take: 1,
        name: Some(NAMES[0]),
    };
    eval(&mut client, 2, take);
    let ttl_ms = client.cmd(&["PTTL", KEY]).int();
    let lease_ms = (LEASE / 1000) as i64;
    assert!(
        (lease_ms..=lease_ms + 1000).contains(&ttl_ms),
        "PTTL {ttl_ms}"
    );
    assert_eq!(eval(&mut client, 2, Op::Release(NAMES[0])), [1]);
    assert_eq!(
        client.cmd(&["EXISTS", KEY]).int(),
        0,
        "an empty set is no key"
    );
}

/// Issue 31: a check the filter gave up on may reach Redis after the release it sent instead.
/// The release of a slot no check took leaves a tombstone for a lease, and the late check then
/// takes nothing; a renewal that comes after the release does not take the slot back.
#[test]
fn a_late_check_or_renewal_never_takes_a_released_slot() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    let take = |name| Op::Take {
        cost: 1,
        take: 1,
        name: Some(name),
    };
    assert_eq!(
        eval(&mut client, 1, Op::Release(NAMES[0])),
        [0],
        "never taken"
    );
    let ttl_ms = client.cmd(&["PTTL", &tombstone(NAMES[0])]).int();
    let lease_ms = (LEASE / 1000) as i64;
    assert!(
        (lease_ms - 1000..=lease_ms).contains(&ttl_ms),
        "PTTL {ttl_ms}"
    );
    assert_eq!(
        eval(&mut client, 1, take(NAMES[0]))[..3],
        [0, 0, 1],
        "the late check"
    );
    assert_eq!(
        eval(&mut client, 1, take(NAMES[1]))[..3],
        [1, 1, 0],
        "the slot is free"
    );
    assert_eq!(eval(&mut client, 1, Op::Release(NAMES[1])), [1]);
    assert_eq!(
        eval(&mut client, 1, Op::Renew(NAMES[1])),
        [0],
        "the late renewal"
    );
    assert_eq!(client.cmd(&["EXISTS", KEY]).int(), 0, "nothing taken back");
    assert_eq!(eval(&mut client, 1, take(NAMES[2]))[..3], [1, 1, 0]);
}
