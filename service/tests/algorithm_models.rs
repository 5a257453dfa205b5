//! The fixed-window, sliding-window, sliding-log and leaky-bucket scripts, run by a real
//! redis-server, against the filter's own algorithms (src/core/algorithm, the `sluice` crate): each
//! model calls the filter's `admit` with every time in µs (the algorithms are pure integer
//! functions, blind to the unit), and adds only what is the script's own: reading and writing
//! the Redis state it keeps, `take` (the most tokens in cost..=take that the filter admits), the
//! TTL, another algorithm's state under the key, and the debt: a refusal with a debt (ARGV[5])
//! is charged by the filter's `owe` and answered as the state stands after it.
//!
//! Redis TIME is the scripts' only clock, so each call is bracketed by TIME before and after:
//! some `now` in between must make the model give exactly the script's reply and the key's state
//! after the call, read back from Redis (and, after an admission, its TTL). The state before is
//! set at random (counts of this window or another, limits lowered since, expired and future
//! log entries, queues of any length, another algorithm's state) and then evolved by the script.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::fmt::Debug;

use common::clock::redis_time_us;
use common::lcg::Lcg;
use sluice::core::algorithm::{self as filter, Decision};
use sluice_service::stores::redis::{
    FIXED_WINDOW_LUA, LEAKY_BUCKET_LUA, SLIDING_LOG_LUA, SLIDING_WINDOW_LUA, TOKEN_BUCKET_LUA,
};
use sluice_testkit::redis::RedisServer;
use sluice_testkit::resp::{Reply, Resp};

const MS: u64 = 1_000;
const SEC: u64 = 1_000_000;
const YEAR_MS: u64 = 31_536_000_000;

/// A key's state in Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stored {
    Absent,
    Text(String),
    /// A sorted set as (score, member), in Redis's order.
    Log(Vec<(u64, String)>),
}

fn read(client: &mut Resp, key: &str) -> Stored {
    match client.cmd(&["TYPE", key]).text().as_str() {
        "none" => Stored::Absent,
        "string" => Stored::Text(client.cmd(&["GET", key]).text()),
        "zset" => {
            let Reply::Array(flat) = client.cmd(&["ZRANGE", key, "0", "-1", "WITHSCORES"]) else {
                panic!("ZRANGE")
            };
            let pairs = flat.chunks(2);
            let log = pairs.map(|p| (p[1].text().parse().unwrap(), p[0].text()));
            Stored::Log(log.collect())
        }
        other => panic!("unexpected type {other}"),
    }
}

fn write(client: &mut Resp, key: &str, stored: &Stored) {
    client.cmd(&["DEL", key]);
    match stored {
        Stored::Absent => {}
        Stored::Text(text) => assert_eq!(client.cmd(&["SET", key, text]).text(), "OK"),
        Stored::Log(entries) => {
            for (score, member) in entries {
                client.cmd(&["ZADD", key, &score.to_string(), member]);
            }
        }
    }
}

fn eval(client: &mut Resp, script: &str, key: &str, args: &[u64]) -> Vec<i128> {
    let args: Vec<String> = args.iter().map(u64::to_string).collect();
    let mut command = vec!["EVAL", script, "1", key];
    command.extend(args.iter().map(String::as_str));
    match client.cmd(&command) {
        Reply::Array(items) => items.iter().map(|r| i128::from(r.int())).collect(),
        other => panic!("script failed: {other:?}"),
    }
}

/// What one call does at `now`: the reply, the state after, and the TTL in ms it sets (None
/// when it writes nothing).
struct Outcome {
    reply: Vec<i128>,
    stored: Stored,
    ttl_ms: Option<u64>,
}

/// Runs `script` once and finds the `now` between TIME before and after the call at which
/// `model` (from the state before) gives exactly the reply and the state after; checks the TTL
/// that admission set. Returns that `now` and the reply.
fn run_exact(
    client: &mut Resp,
    key: &str,
    (script, args): (&str, &[u64]),
    model: &dyn Fn(&Stored, u64) -> Outcome,
    label: &str,
) -> (u64, Vec<i128>) {
    let before = read(client, key);
    let t0 = redis_time_us(client);
    let reply = eval(client, script, key, args);
    let t1 = redis_time_us(client);
    let after = read(client, key);
    let pttl = client.cmd(&["PTTL", key]).int();
    let t2 = redis_time_us(client);
    let Some((now, outcome)) = (t0..=t1)
        .map(|now| (now, model(&before, now)))
        .find(|(_, o)| o.reply == reply && o.stored == after)
    else {
        let (first, last) = (model(&before, t0), model(&before, t1));
        panic!(
            "{label}: no now in {t0}..={t1} explains reply {reply:?} and state {after:?} \
             from {before:?}; the model says {:?} / {:?} at the ends, state {:?}",
            first.reply, last.reply, last.stored
        );
    };
    if let Some(ttl_ms) = outcome.ttl_ms {
        let short_by = ttl_ms as i64 - pttl;
        let slack = ((t2 - now) / MS) as i64 + 2;
        assert!(
            (-1..=slack).contains(&short_by),
            "{label}: PTTL {pttl} ms, expected {ttl_ms} ms less at most {slack}"
        );
    }
    (now, reply)
}

impl Lcg {
    /// cost in 1..=min(limit, 4) and take in cost..=limit, strict (take = cost) half the time.
    fn cost_and_take(&mut self, limit: u64) -> (u64, u64) {
        let cost = 1 + self.below(limit.min(4));
        let take = if self.below(2) == 0 {
            cost
        } else {
            cost + self.below((limit - cost).min(50) + 1)
        };
        (cost, take)
    }

    /// A debt of none (half the time), a few tokens, or one limit's worth (the RLS's).
    fn debt(&mut self, limit: u64) -> u64 {
        match self.below(4) {
            0 => 1 + self.below(limit.min(5)),
            1 => limit,
            _ => 0,
        }
    }

    /// Another algorithm's state, or something that is no state at all.
    fn foreign(&mut self, now: u64) -> Stored {
        match self.below(4) {
            0 => Stored::Text(now.to_string()),
            1 => Stored::Text("7:3:1".into()),
            2 => Stored::Text("garbage".into()),
            _ => Stored::Log(vec![(now, format!("{now}-0"))]),
        }
    }
}

fn ceil_ms(us: u64) -> u64 {
    us.div_ceil(MS)
}

/// `<digits>:<digits>...` as numbers, if that is what `text` is.
fn numbers(text: &str) -> Option<Vec<u64>> {
    text.split(':').map(|part| part.parse().ok()).collect()
}

/// The filter's state words from a script's `<word>:<word>...` (N of them); anything else (no
/// key, another algorithm's state) is the filter's empty state, all zeros (window 0 is long past).
fn words<const N: usize>(stored: &Stored) -> [u64; N] {
    match stored {
        Stored::Text(text) => numbers(text).and_then(|n| n.try_into().ok()),
        _ => None,
    }
    .unwrap_or([0; N])
}

/// The scripts' `take`: the most tokens in cost..=take that `admit` admits from `state`, each
/// tried on a copy, and the state that admission leaves; if even `cost` is denied, that denial.
/// Returns the decision and the tokens granted.
fn grant<S: Clone>(
    state: &mut S,
    cost: u64,
    take: u64,
    decide: impl Fn(&mut S, u64) -> Decision,
) -> (Decision, u64) {
    let attempt = |tokens| {
        let mut after = state.clone();
        (decide(&mut after, tokens), after)
    };
    let (denial, _) = attempt(cost);
    if !denial.allowed {
        return (denial, 0);
    }
    let (granted, (d, after)) = (cost..=take)
        .rev()
        .map(|tokens| (tokens, attempt(tokens)))
        .find(|(_, (d, _))| d.allowed)
        .unwrap();
    *state = after;
    (d, granted)
}

/// The scripts' debt: when even `cost` is refused and the key may owe `debt`, `owe` charges up to
/// `cost` tokens, and the decision is the refusal as the state stands after it (`decide` on a
/// copy), with the tokens charged as granted.
fn owing<S: Clone>(
    state: &mut S,
    (refused, granted): (Decision, u64),
    (cost, debt): (u64, u64),
    owe: impl Fn(&mut S) -> u64,
    decide: impl Fn(&mut S, u64) -> Decision,
) -> (Decision, u64) {
    if refused.allowed || debt == 0 || cost == 0 {
        return (refused, granted);
    }
    match owe(state) {
        0 => (refused, 0),
        charged => (decide(&mut state.clone(), cost), charged),
    }
}

/// The script's reply and TTL for the filter's decision: `{allowed, granted, remaining,
/// reset_us, retry_after_us}`; a grant or a charge sets a TTL of reset plus 1 s.
fn outcome(d: Decision, granted: u64, stored: Stored) -> Outcome {
    Outcome {
        reply: vec![
            d.allowed.into(),
            granted.into(),
            d.remaining.into(),
            d.reset_after.into(),
            d.retry_after.into(),
        ],
        stored,
        ttl_ms: (granted > 0).then(|| ceil_ms(d.reset_after) + 1000),
    }
}

/// A window of `limit` per `length` µs, as the filter's window algorithms take it.
fn per(limit: u64, length: u64) -> filter::Window {
    filter::Window::new(limit, length).unwrap()
}

// ---- fixed window -------------------------------------------------------------------------

/// The filter's `fixed_window::admit`, with take and debt; state `<index>:<count>`.
fn fixed_window(
    limit: u64,
    window: u64,
    (cost, take): (u64, u64),
    debt: u64,
) -> impl Fn(&Stored, u64) -> Outcome {
    move |stored, now| {
        let mut state: [u64; filter::fixed_window::COLUMNS] = words(stored);
        let admit = |state: &mut [u64; 2], tokens| {
            filter::fixed_window::admit(&per(limit, window), state, now, tokens)
        };
        let decided = grant(&mut state, cost, take, admit);
        let owe = |state: &mut [u64; 2]| {
            filter::fixed_window::owe(&per(limit, window), state, now, cost, debt)
        };
        let (d, granted) = owing(&mut state, decided, (cost, debt), owe, admit);
        let [index, count] = state;
        let after = if granted > 0 {
            Stored::Text(format!("{index}:{count}"))
        } else {
            stored.clone()
        };
        outcome(d, granted, after)
    }
}

#[test]
fn fixed_window_matches_the_model() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    let mut random = Lcg(0xf1ed);
    for case in 0..250 {
        let limit = random.pick(&[1, 2, 3, 5, 10, 100, 1_000_000_000]);
        let window_ms = random.pick(&[1, 3, 50, 1_000, 60_000, 86_400_000, YEAR_MS]);
        let window = window_ms * MS;
        let (cost, take) = random.cost_and_take(limit);
        let debt = random.debt(limit);
        let key = format!("sluice:{{fixed/{case}}}");
        let now = redis_time_us(&mut client);
        let index = now / window;
        let stored = match random.below(6) {
            0 => Stored::Absent,
            1 => random.foreign(now),
            n => {
                let at = [index - 1, index, index, index + 1][n as usize - 2];
                let count = random.below(limit.min(1000) + debt.min(1000) + 2);
                Stored::Text(format!("{at}:{count}"))
            }
        };
        write(&mut client, &key, &stored);
        let model = fixed_window(limit, window, (cost, take), debt);
        for step in 0..3 {
            let label = format!("case {case} step {step}: limit {limit} per {window_ms} ms, cost {cost} take {take} debt {debt}");
            let args = [window, limit, cost, take, debt];
            run_exact(&mut client, &key, (FIXED_WINDOW_LUA, &args), &model, &label);
        }
    }
}

// ---- sliding window -----------------------------------------------------------------------

/// The filter's `sliding_window::admit`, with take and debt; state
/// `<index>:<current>:<previous>`.
fn sliding_window(
    limit: u64,
    window: u64,
    (cost, take): (u64, u64),
    debt: u64,
) -> impl Fn(&Stored, u64) -> Outcome {
    move |stored, now| {
        let mut state: [u64; filter::sliding_window::COLUMNS] = words(stored);
        let admit = |state: &mut [u64; 3], tokens| {
            filter::sliding_window::admit(&per(limit, window), state, now, tokens)
        };
        let decided = grant(&mut state, cost, take, admit);
        let owe = |state: &mut [u64; 3]| {
            filter::sliding_window::owe(&per(limit, window), state, now, cost, debt)
        };
        let (d, granted) = owing(&mut state, decided, (cost, debt), owe, admit);
        let [index, current, previous] = state;
        let after = if granted > 0 {
            Stored::Text(format!("{index}:{current}:{previous}"))
        } else {
            stored.clone()
        };
        outcome(d, granted, after)
    }
}

#[test]
fn sliding_window_matches_the_model() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    let mut random = Lcg(0x51d1);
    for case in 0..250 {
        let limit = random.pick(&[1, 2, 3, 5, 10, 100, 999_999_937, 1_000_000_000]);
        let window_ms = random.pick(&[1, 3, 50, 1_000, 60_000, 86_400_000, YEAR_MS]);
        let window = window_ms * MS;
        let (cost, take) = random.cost_and_take(limit);
        let debt = random.debt(limit);
        let key = format!("sluice:{{sliding/{case}}}");
        let now = redis_time_us(&mut client);
        let index = now / window;
        let count = |random: &mut Lcg| match random.below(3) {
            0 => random.below(limit + debt + 2),
            1 => limit - random.below(limit.min(3)),
            _ => random.below(limit.min(10) + 1),
        };
        let stored = match random.below(6) {
            0 => Stored::Absent,
            1 => random.foreign(now),
            n => {
                let at = [index - 2, index - 1, index, index][n as usize - 2];
                let (current, previous) = (count(&mut random), count(&mut random));
                Stored::Text(format!("{at}:{current}:{previous}"))
            }
        };
        write(&mut client, &key, &stored);
        let model = sliding_window(limit, window, (cost, take), debt);
        for step in 0..3 {
            let label = format!("case {case} step {step}: limit {limit} per {window_ms} ms, cost {cost} take {take} debt {debt}");
            let args = [window, limit, cost, take, debt];
            run_exact(
                &mut client,
                &key,
                (SLIDING_WINDOW_LUA, &args),
                &model,
                &label,
            );
        }
    }
}

#[test]
fn sliding_window_products_beyond_two_to_the_53_stay_exact() {
    // A billion per year, the previous window nearly full: previous × window ≈ 3 × 10^22.
    let redis = RedisServer::start();
    let mut client = redis.client();
    let (limit, window) = (1_000_000_000, YEAR_MS * MS);
    let now = redis_time_us(&mut client);
    let index = now / window;
    for (case, (current, previous)) in [
        (0, 999_999_937),
        (1, 999_999_999),
        (12_345, 987_654_321),
        (999_999_000, 1_000_000_000),
        (999_999_999, 999_999_999),
        (1_000_000_000, 999_999_999),
        (0, 1),
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("sluice:{{big/{case}}}");
        let state = format!("{index}:{current}:{previous}");
        write(&mut client, &key, &Stored::Text(state));
        let model = sliding_window(limit, window, (1, 1000), limit);
        for step in 0..2 {
            let label = format!("case {case} step {step}");
            let args = [window, limit, 1, 1000, limit];
            run_exact(
                &mut client,
                &key,
                (SLIDING_WINDOW_LUA, &args),
                &model,
                &label,
            );
        }
    }
}

// ---- sliding log --------------------------------------------------------------------------

/// The filter's `sliding_log::admit`, with take; state a sorted set of admission times,
/// members `<time>-<n>`, n counting on from the entries already at that time. Another
/// algorithm's state is dropped first, even by a denial. A refusal with debt logs up to `cost`
/// entries at now, at most `limit + debt` live.
fn sliding_log(
    limit: u64,
    window: u64,
    (cost, take): (u64, u64),
    debt: u64,
) -> impl Fn(&Stored, u64) -> Outcome {
    move |stored, now| {
        let before = match stored {
            Stored::Log(entries) => entries.clone(),
            _ => Vec::new(),
        };
        // One word per entry, 0 a free slot, and at least the filter's `limit + debt` words: a
        // log kept under a higher limit holds more entries than that, and each still counts.
        let mut times: Vec<u64> = before.iter().map(|(t, _)| *t).collect();
        times.resize(times.len().max((limit + debt) as usize), 0);
        let at_now = |times: &[u64]| times.iter().filter(|&&t| t == now).count() as u64;
        let first = at_now(&times);
        let admit = |times: &mut Vec<u64>, tokens| {
            filter::sliding_log::admit(&per(limit, window), times, now, tokens)
        };
        let decided = grant(&mut times, cost, take, admit);
        let owe = |times: &mut Vec<u64>| {
            filter::sliding_log::owe(&per(limit, window), times, now, cost, debt)
        };
        let (d, granted) = owing(&mut times, decided, (cost, debt), owe, admit);
        if granted == 0 {
            let after = match stored {
                Stored::Log(_) => stored.clone(),
                _ => Stored::Absent,
            };
            return outcome(d, granted, after);
        }
        // The script trims every expired entry where the filter overwrites only the slots it
        // needs: the live entries are the same, those kept plus the ones it placed at `now`.
        let placed = at_now(&times) - first;
        let mut after: Vec<(u64, String)> = (before.into_iter())
            .filter(|(t, _)| t + window > now)
            .collect();
        after.extend((first..first + placed).map(|n| (now, format!("{now}-{n}"))));
        after.sort();
        // Every write sets a TTL of the window plus 1 s: its newest entries are at now.
        let mut outcome = outcome(d, granted, Stored::Log(after));
        outcome.ttl_ms = Some(ceil_ms(window) + 1000);
        outcome
    }
}

#[test]
fn sliding_log_matches_the_model() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    let mut random = Lcg(0x1065);
    for case in 0..200 {
        let limit = random.pick(&[1, 2, 3, 5, 10, 40, 1000]);
        let window_ms = random.pick(&[1, 3, 50, 1_000, 60_000, YEAR_MS]);
        let window = window_ms * MS;
        let (cost, take) = random.cost_and_take(limit);
        let debt = random.debt(limit);
        let key = format!("sluice:{{log/{case}}}");
        let now = redis_time_us(&mut client);
        let stored = match random.below(5) {
            0 => Stored::Absent,
            1 => random.foreign(now),
            _ => {
                // Entries from two windows ago to a second ahead (a clock that stepped back).
                let n = random.below((limit + debt).min(50) + 3);
                let mut entries: Vec<(u64, String)> = (0..n)
                    .map(|i| {
                        let back = random.below(2 * window);
                        let t = if random.below(10) == 0 {
                            now + random.below(SEC)
                        } else {
                            now - back
                        };
                        (t, format!("{t}-{i}"))
                    })
                    .collect();
                entries.sort();
                Stored::Log(entries)
            }
        };
        write(&mut client, &key, &stored);
        let model = sliding_log(limit, window, (cost, take), debt);
        for step in 0..3 {
            let label = format!("case {case} step {step}: limit {limit} per {window_ms} ms, cost {cost} take {take} debt {debt}");
            let args = [window, limit, cost, take, debt];
            run_exact(&mut client, &key, (SLIDING_LOG_LUA, &args), &model, &label);
        }
    }
}

#[test]
fn sliding_log_members_stay_unique_within_one_microsecond() {
    // A thousand tokens admitted by one call share one time: each is its own member.
    let redis = RedisServer::start();
    let mut client = redis.client();
    let args = [60 * SEC, 1000, 1, 1000];
    let (_, reply) = run_exact(
        &mut client,
        "sluice:{wide}",
        (SLIDING_LOG_LUA, &args),
        &sliding_log(1000, 60 * SEC, (1, 1000), 0),
        "a lease of the whole log",
    );
    assert_eq!(reply[..3], [1, 1000, 0]);
    assert_eq!(client.cmd(&["ZCARD", "sluice:{wide}"]).int(), 1000);
}

#[test]
fn a_log_entry_leaves_exactly_one_window_after_it_was_admitted() {
    // Entries one µs apart around now - window: whichever µs the script runs at, one of them is
    // exactly one window old, and no longer counts (live means time > now - window). The
    // admission's new members are named after the script's now, which pins it.
    let redis = RedisServer::start();
    let mut client = redis.client();
    let window = 60 * SEC;
    // How long after reading TIME here the script runs: learnt from each attempt. On a loaded
    // machine the lag jumps by more than the entries' millisecond, so there are many attempts
    // (a few ms each); the test ends at the first that lands.
    let mut lag = 1_000;
    for attempt in 0..500 {
        let key = format!("sluice:{{edge/{attempt}}}");
        let time = redis_time_us(&mut client);
        let from = time + lag - window - 500;
        let entries: Vec<String> = (from..from + 1000)
            .flat_map(|t| [t.to_string(), format!("{t}-0")])
            .collect();
        let mut zadd = vec!["ZADD", key.as_str()];
        zadd.extend(entries.iter().map(String::as_str));
        assert_eq!(client.cmd(&zadd).int(), 1000);
        let args = [window, 1000, 1, 1];
        let model = sliding_log(1000, window, (1, 1), 0);
        let label = format!("attempt {attempt}");
        let (now, _) = run_exact(&mut client, &key, (SLIDING_LOG_LUA, &args), &model, &label);
        if (from..from + 1000).contains(&(now - window)) {
            return;
        }
        lag = now - time;
    }
    panic!("the script never ran while an entry was exactly one window old");
}

// ---- leaky bucket -------------------------------------------------------------------------

/// The filter's `leaky_bucket::admit` (take is cost); state the TAT (when the queue drains) in
/// µs. The reply adds `delay_us`.
fn leaky_bucket(interval: u64, max_delay: u64, cost: u64) -> impl Fn(&Stored, u64) -> Outcome {
    move |stored, now| {
        // Not a number (another algorithm's state) is 0, as in the script: an empty queue.
        let mut tat = match stored {
            Stored::Text(text) => text.parse().unwrap_or(0),
            _ => 0,
        };
        let drain = filter::Drain::new(1, interval, max_delay).unwrap();
        let d = filter::leaky_bucket::admit(&drain, &mut tat, now, cost);
        let (granted, after) = if d.allowed {
            (cost, Stored::Text(tat.to_string()))
        } else {
            (0, stored.clone())
        };
        let mut outcome = outcome(d, granted, after);
        outcome.reply.push(d.delay.into());
        outcome
    }
}

#[test]
fn leaky_bucket_matches_the_model() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    let mut random = Lcg(0x1eaf);
    for case in 0..250 {
        let interval = random.pick(&[1, 7, 1_000, 100_000, SEC, 3_600 * SEC]);
        let max_delay = random.pick(&[0, 1, 999, 250_000, 10 * SEC, YEAR_MS * MS]);
        let cost = 1 + random.below(3);
        let key = format!("sluice:{{leaky/{case}}}");
        let now = redis_time_us(&mut client);
        let stored = match random.below(5) {
            0 => Stored::Absent,
            1 => random.foreign(now),
            2 => Stored::Text((now - random.below(10 * SEC)).to_string()),
            _ => {
                let ahead = random.below(max_delay.max(interval) * 2 + 1);
                Stored::Text((now + ahead).to_string())
            }
        };
        write(&mut client, &key, &stored);
        let model = leaky_bucket(interval, max_delay, cost);
        for step in 0..3 {
            let label = format!(
                "case {case} step {step}: interval {interval} µs, max delay {max_delay} µs, cost {cost}"
            );
            let args = [interval, max_delay, cost];
            run_exact(&mut client, &key, (LEAKY_BUCKET_LUA, &args), &model, &label);
        }
    }
}

#[test]
fn leaky_bucket_delays_by_one_interval_more_each_and_denies_beyond_max_delay() {
    let redis = RedisServer::start();
    let mut client = redis.client();
    let (interval, max_delay) = (10 * SEC, 25 * SEC);
    let model = leaky_bucket(interval, max_delay, 1);
    let args = [interval, max_delay, 1];
    let calls: Vec<(u64, Vec<i128>)> = (0..5)
        .map(|call| {
            let label = format!("call {call}");
            run_exact(
                &mut client,
                "sluice:{queue}",
                (LEAKY_BUCKET_LUA, &args),
                &model,
                &label,
            )
        })
        .collect();
    let first = calls[0].0;
    let [interval, max_delay] = [interval, max_delay].map(i128::from);
    for (k, (now, reply)) in (0..).zip(&calls) {
        // Turns are k intervals after the first call; the queue holds 2.5 intervals.
        let since = i128::from(now - first);
        if k < 3 {
            assert_eq!(reply[..3], [1, 1, 2 - k], "call {k}");
            assert_eq!(reply[5], k * interval - since, "call {k}: the delay");
        } else {
            assert_eq!(reply[..3], [0, 0, 0], "call {k}");
            assert_eq!(reply[5], 0, "call {k}: no delay when denied");
            let delay = 3 * interval - since;
            assert_eq!(reply[4], delay - max_delay, "call {k}: retry after");
        }
    }
}

// ---- all of them --------------------------------------------------------------------------

#[test]
fn a_key_holding_another_algorithms_state_is_taken_over() {
    // A policy whose algorithm changed finds the old state under its key: it counts as none.
    let redis = RedisServer::start();
    let mut client = redis.client();
    let now = redis_time_us(&mut client);
    let log = Stored::Log(vec![(now, format!("{now}-0"))]);
    write(&mut client, "sluice:{was-log}", &log);
    let r = eval(
        &mut client,
        TOKEN_BUCKET_LUA,
        "sluice:{was-log}",
        &[SEC, 5, 1, 1],
    );
    assert_eq!(r[..3], [1, 1, 4], "a full bucket, not an error");
    assert_eq!(client.cmd(&["TYPE", "sluice:{was-log}"]).text(), "string");
    let r = eval(
        &mut client,
        SLIDING_LOG_LUA,
        "sluice:{was-log}",
        &[SEC, 5, 1, 1],
    );
    assert_eq!(r[..3], [1, 1, 4], "an empty log, not an error");
    assert_eq!(client.cmd(&["TYPE", "sluice:{was-log}"]).text(), "zset");
}

#[test]
fn a_check_of_cost_zero_only_reads_in_every_script() {
    // The RLS's hits_addend 0, refunds, and calls past a limit's capacity: no key is created,
    // and a key's state and TTL stay as they were.
    let redis = RedisServer::start();
    let mut client = redis.client();
    let scripts: [(&str, &str, [u64; 4]); 5] = [
        ("token_bucket", TOKEN_BUCKET_LUA, [SEC, 5, 0, 0]),
        ("fixed_window", FIXED_WINDOW_LUA, [60 * SEC, 5, 0, 0]),
        ("sliding_window", SLIDING_WINDOW_LUA, [60 * SEC, 5, 0, 0]),
        ("sliding_log", SLIDING_LOG_LUA, [60 * SEC, 5, 0, 0]),
        ("leaky_bucket", LEAKY_BUCKET_LUA, [SEC, 5 * SEC, 0, 0]),
    ];
    for (name, script, args) in scripts {
        let key = format!("sluice:{{ask/{name}}}");
        let leaky = name == "leaky_bucket";
        let args: &[u64] = if leaky { &args[..3] } else { &args };
        let asked = eval(&mut client, script, &key, args);
        assert_eq!(asked[..2], [1, 0], "{name}: allowed, nothing granted");
        assert_eq!(
            read(&mut client, &key),
            Stored::Absent,
            "{name}: a key created"
        );
        let mut charged = args.to_vec();
        charged[2] = 1;
        if !leaky {
            charged[3] = 1;
        }
        eval(&mut client, script, &key, &charged);
        let (state, pttl) = (read(&mut client, &key), client.cmd(&["PTTL", &key]).int());
        std::thread::sleep(std::time::Duration::from_millis(20));
        let asked = eval(&mut client, script, &key, args);
        assert_eq!(asked[1], 0, "{name}: nothing granted");
        assert_eq!(read(&mut client, &key), state, "{name}: state changed");
        let after = client.cmd(&["PTTL", &key]).int();
        assert!(
            after < pttl,
            "{name}: TTL renewed ({pttl} ms, then {after} ms)"
        );
    }
}
