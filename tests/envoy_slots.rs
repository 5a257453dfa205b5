//! The `max_keys` bound through a real Envoy (`--concurrency 2`), with a table of one slot, so
//! that every step is deterministic: a new key always gets the slot, with its own full budget;
//! what the key it took the slot from owed is forgiven and counted; and keys racing for the slot
//! from two workers never share a budget.
//!
//! (Before the take-over rule of issue 13, a newcomer whose slots were in use shared one
//! overflow budget with every other such key: during a flood, with the flood.)

// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use sluice::limiter::PolicyOutcome::{Allowed, Denied};
use sluice::output::metrics::requests_counter;
use sluice_testkit::envoy::Envoy;
use std::sync::Arc;
use std::time::Duration;

/// One slot, no refill to speak of: a key owes what it took.
const ONE_SLOT: &str = r#"{"policies": [{"name": "per-user", "key": ["header:x-user-id"],
  "requests": 1, "per": "1h", "burst": 5, "max_keys": 1}]}"#;

/// One slot, 2/s with a burst of 2: a key's bucket is full again 500 ms after one request.
const ONE_FAST_SLOT: &str = r#"{"policies": [{"name": "per-user", "key": ["header:x-user-id"],
  "requests": 2, "per": "1s", "burst": 2, "max_keys": 1}]}"#;

fn get(envoy: &Envoy, user: &str) -> u16 {
    envoy
        .get("/api/x", &[("x-user-id", user.as_bytes())])
        .status
}

fn statuses(envoy: &Envoy, user: &str, n: usize) -> Vec<u16> {
    (0..n).map(|_| get(envoy, user)).collect()
}

#[test]
fn a_new_key_always_gets_its_own_burst_and_what_it_forgets_is_counted() {
    let envoy = Envoy::start(ONE_SLOT);
    assert_eq!(statuses(&envoy, "alice", 3), [200; 3]);
    // The one slot is alice's: bob takes it, with a full bucket of his own.
    assert_eq!(statuses(&envoy, "bob", 6), [200, 200, 200, 200, 200, 429]);
    assert_eq!(envoy.wait_for_wasm_counter("sluice.evictions", 1), 1);
    assert_eq!(
        envoy.wait_for_wasm_counter("sluice.forgiven", 3),
        3,
        "alice owed 3"
    );
}

/// alice sends 2 requests in 0.7 s under a limit of 2/s, burst 2: both pass, whatever the
/// newcomers do meanwhile.
#[test]
fn a_key_whose_bucket_is_full_again_loses_nothing_when_a_newcomer_takes_its_slot() {
    let envoy = Envoy::start(ONE_FAST_SLOT);
    assert_eq!(get(&envoy, "alice"), 200);
    std::thread::sleep(Duration::from_millis(700));
    // alice's bucket is full again: it owes nothing, so taking it forgives nothing.
    assert_eq!(statuses(&envoy, "bob", 3), [200, 200, 429]);
    assert_eq!(
        get(&envoy, "alice"),
        200,
        "2 requests in 0.7 s under 2/s, burst 2"
    );
    assert_eq!(
        envoy.wait_for_wasm_counter("sluice.forgiven", 2),
        2,
        "bob owed 2"
    );
}

/// Eight keys on eight connections, spread over both workers, take the one slot from each other
/// as fast as they can. Two workers may take the slot for two keys at the same instant: the CAS
/// on the slot (its owner word with it) lets one of them through, so no key ever starts from
/// another's state: every key's first request passes, and all keys together get no more than
/// their bursts plus what forgetting forgave them.
#[test]
fn keys_racing_for_one_slot_from_two_workers_never_share_a_budget() {
    let envoy = Arc::new(Envoy::start(ONE_SLOT));
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let envoy = envoy.clone();
            std::thread::spawn(move || {
                let mut connection = envoy.connect();
                let user = format!("racer-{i}");
                let headers: &[(&str, &[u8])] = &[("x-user-id", user.as_bytes())];
                let mut send = || connection.send("GET", "/api/x", headers).unwrap().status;
                (0..50).map(|_| send()).collect::<Vec<u16>>()
            })
        })
        .collect();
    let all: Vec<Vec<u16>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(all.iter().all(|s| s[0] == 200), "{all:?}");
    let admitted = all.iter().flatten().filter(|&&s| s == 200).count() as u64;
    let denied = 8 * 50 - admitted;
    let counter = |name: &str, value: u64| envoy.wait_for_wasm_counter(name, value);
    assert_eq!(
        counter(&requests_counter("per-user", Allowed), admitted),
        admitted
    );
    assert_eq!(
        counter(&requests_counter("per-user", Denied), denied),
        denied
    );
    let forgiven = envoy.wasm_counter("sluice.forgiven").unwrap_or(0);
    assert!(admitted <= 8 * 5 + forgiven, "{admitted} > 40 + {forgiven}");
}

/// A token bucket of burst 2 per `x-user-id`: a new key's first two requests must both pass.
const BURST_TWO: &str = r#"{"policies": [{"name": "per-user", "key": ["header:x-user-id"],
  "requests": 1, "per": "1s", "burst": 2}]}"#;

/// 400 new keys, each sending its first two requests at the same instant on two fresh
/// connections (so, about half the time, on the two workers): both must pass, as they do for a
/// key the table holds already. Two workers deciding one new key at once each read the other's
/// state at their own clock: the one that read the clock first must not see the bucket as
/// emptier than it is.
#[test]
fn four_hundred_pairs_of_simultaneous_first_requests_are_all_admitted() {
    let envoy = Envoy::start(BURST_TWO);
    let mut refused = Vec::new();
    for pair in 0..400 {
        let user = format!("first-{pair}");
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let sides: Vec<_> = (0..2)
            .map(|_| {
                let connection = envoy.connect();
                let (barrier, user) = (barrier.clone(), user.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    let headers: &[(&str, &[u8])] = &[("x-user-id", user.as_bytes())];
                    connection.request("GET", "/api/x", headers).unwrap()
                })
            })
            .collect();
        for side in sides {
            let response = side.join().unwrap();
            if response.status != 200 {
                refused.push((
                    pair,
                    response.status,
                    response.header("retry-after").map(str::to_string),
                ));
            }
        }
    }
    assert_eq!(refused, [], "pairs with a refused first request");
}
