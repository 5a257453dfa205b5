//! The `max_keys` bound through a real Envoy (`--concurrency 2`), with a table of one slot (plus
//! the overflow slot), so that every step is deterministic: who takes the slot, who shares the
//! overflow, and what a key in active use keeps.
//!
//! The last test pins a bug found here and fixed: a key in active use whose bucket happened to
//! be full again counted as a free slot, so a newcomer took it, and the key, coming back, landed
//! in the overflow slot the flood had spent.

// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use sluice_testkit::envoy::Envoy;
use std::time::Duration;

/// One slot, no refill to speak of: a key that made a request stays busy.
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

#[test]
fn a_busy_key_keeps_its_slot_and_newcomers_share_the_overflow_budget() {
    let envoy = Envoy::start(ONE_SLOT);
    let alice: Vec<u16> = (0..3).map(|_| get(&envoy, "alice")).collect();
    assert_eq!(alice, [200; 3]);
    // The slot is alice's and in active use: the newcomers share the overflow slot's burst.
    let newcomers: Vec<u16> = (0..7).map(|i| get(&envoy, &format!("new-{i}"))).collect();
    assert_eq!(newcomers, [200, 200, 200, 200, 200, 429, 429]);
    // alice kept her own bucket: 2 of 5 left, whatever the overflow slot has.
    let alice: Vec<u16> = (0..3).map(|_| get(&envoy, "alice")).collect();
    assert_eq!(alice, [200, 200, 429]);
    assert_eq!(envoy.wait_for_wasm_counter("sluice.evictions", 0), 0);
    // Every newcomer's decision was made on the overflow slot, and operators can see it.
    assert_eq!(envoy.wait_for_wasm_counter("sluice.overflowed", 7), 7);
}

#[test]
fn a_key_not_used_for_a_second_is_evicted_and_counted() {
    let envoy = Envoy::start(ONE_SLOT);
    assert_eq!(get(&envoy, "alice"), 200);
    std::thread::sleep(Duration::from_millis(1100));
    // alice's bucket is not full (no refill to speak of), but she has not used it for over a
    // second: bob takes her slot and starts from a full bucket.
    let bob: Vec<u16> = (0..6).map(|_| get(&envoy, "bob")).collect();
    assert_eq!(bob, [200, 200, 200, 200, 200, 429]);
    assert_eq!(envoy.wait_for_wasm_counter("sluice.evictions", 1), 1);
}

/// alice sends 2 requests in 0.7 s under a limit of 2/s, burst 2: both pass, whatever the
/// newcomers do meanwhile.
#[test]
fn a_key_in_active_use_keeps_its_limit_when_its_bucket_is_full_between_requests() {
    let envoy = Envoy::start(ONE_FAST_SLOT);
    assert_eq!(get(&envoy, "alice"), 200);
    // 700 ms later alice is in active use (used within the last second), and her bucket is
    // full again (idle): README promises that a flood can never take her limit away.
    std::thread::sleep(Duration::from_millis(700));
    // Newcomers share the overflow slot and spend its burst: alice's slot is hers while in use.
    assert_eq!(get(&envoy, "bob"), 200);
    assert_eq!(get(&envoy, "new-1"), 200);
    assert_eq!(get(&envoy, "new-2"), 429);
    assert_eq!(
        get(&envoy, "alice"),
        200,
        "alice was denied: 2 requests in 0.7 s under 2/s, burst 2"
    );
}
