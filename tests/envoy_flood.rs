//! A flood of new keys through a real Envoy (`--concurrency 2`): 200,000 requests, each with a
//! new `x-user-id`, against `max_keys` 10,000. While it runs, 20 clients never seen before each
//! get exactly their burst and then 429s, and 5 keys drained before it stay drained; Envoy's
//! memory stays put. The load: 8 threads, each sending one request after another on its own
//! keep-alive connection.

// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use sluice::limiter::PolicyOutcome::{Allowed, Denied};
use sluice::output::metrics::requests_counter;
use sluice_testkit::envoy::Envoy;
use sluice_testkit::http::Connection;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const FLOOD: usize = 200_000;
const THREADS: usize = 8;
const BURST: usize = 5;
/// Envoy's resident memory may grow by less than this over the flood: the table fills up to its
/// 10,000 keys (about half a MiB) and then only forgets keys to make room, so what else grows
/// is Envoy's own buffers and allocator.
const RSS_GROWTH_BOUND_KIB: u64 = 8 * 1024;
/// The whole flood must end within this, or the test fails (it takes about 20 s on 2 cores).
const FLOOD_DEADLINE: Duration = Duration::from_secs(50);

const CONFIG: &str = r#"{"policies": [{"name": "per-user", "key": ["header:x-user-id"],
  "requests": 1, "per": "1h", "burst": 5, "max_keys": 10000}]}"#;

/// `n` requests of one key on one keep-alive connection, one after another.
fn statuses(envoy: &Envoy, user: &str, n: usize) -> Vec<u16> {
    let mut connection = envoy.connect();
    let headers: &[(&str, &[u8])] = &[("x-user-id", user.as_bytes())];
    let send = |c: &mut Connection| c.send("GET", "/api/x", headers).unwrap().status;
    (0..n).map(|_| send(&mut connection)).collect()
}

/// `thread`'s share of the flood, one request after another on its keep-alive connection, until
/// `FLOOD_DEADLINE`: the statuses it got.
fn flood(envoy: &Envoy, thread: usize, sent: &AtomicUsize, started: Instant) -> Vec<u16> {
    let mut connection = envoy.connect();
    (0..FLOOD / THREADS)
        .map(|i| {
            if i % 1_000 == 0 {
                assert!(
                    started.elapsed() < FLOOD_DEADLINE,
                    "the flood took too long"
                );
            }
            let user = format!("flood-{thread}-{i}");
            let headers: &[(&str, &[u8])] = &[("x-user-id", user.as_bytes())];
            let status = connection.send("GET", "/api/x", headers).unwrap().status;
            sent.fetch_add(1, Ordering::Relaxed);
            status
        })
        .collect()
}

/// Waits (bounded) until the flood has sent `count` requests.
fn wait_for(sent: &AtomicUsize, count: usize, started: Instant) {
    while sent.load(Ordering::Relaxed) < count {
        assert!(started.elapsed() < FLOOD_DEADLINE, "the flood stalled");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_flood_of_200000_new_keys_locks_out_no_newcomer_frees_no_drained_key_and_grows_no_memory() {
    let envoy = Arc::new(Envoy::start(CONFIG));
    let drained: Vec<String> = (0..5).map(|i| format!("drained-{i}")).collect();
    for user in &drained {
        let expected = [vec![200; BURST], vec![429]].concat();
        assert_eq!(statuses(&envoy, user, BURST + 1), expected, "{user}");
    }
    let rss_before = envoy.rss_kib();
    let sent = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let flooders: Vec<_> = (0..THREADS)
        .map(|thread| {
            let (envoy, sent) = (envoy.clone(), sent.clone());
            std::thread::spawn(move || flood(&envoy, thread, &sent, started))
        })
        .collect();

    // Newcomers, a few at a time while the flood fills and churns the table.
    let mut newcomers = Vec::new();
    for i in 0..20 {
        wait_for(&sent, FLOOD / 25 * (i + 2), started);
        let user = format!("newcomer-{i}");
        newcomers.push((user.clone(), statuses(&envoy, &user, BURST + 3)));
    }
    let during: Vec<Vec<u16>> = drained.iter().map(|u| statuses(&envoy, u, 1)).collect();
    let flood: Vec<u16> = flooders
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let took = started.elapsed();
    let rss_after = envoy.rss_kib();
    let after: Vec<Vec<u16>> = drained.iter().map(|u| statuses(&envoy, u, 1)).collect();

    eprintln!(
        "flood: {} requests in {took:.1?} ({:.0}/s), {} 200s; Envoy RSS {rss_before} KiB before, \
         {rss_after} KiB after",
        flood.len(),
        flood.len() as f64 / took.as_secs_f64(),
        flood.iter().filter(|&&s| s == 200).count()
    );
    assert_eq!(flood.len(), FLOOD);
    assert!(
        flood.iter().all(|&s| s == 200),
        "each new key has its burst"
    );
    let expected = [vec![200; BURST], vec![429; 3]].concat();
    for (user, got) in &newcomers {
        assert_eq!(got, &expected, "{user}: exactly its burst, then 429s");
    }
    assert!(
        during.iter().chain(&after).all(|s| s == &[429]),
        "{during:?} {after:?}"
    );
    let growth = rss_after.saturating_sub(rss_before);
    assert!(growth < RSS_GROWTH_BOUND_KIB, "RSS grew by {growth} KiB");

    // Each worker hands all its counts over at once: once these are in, all are.
    let allowed = (FLOOD + (20 + 5) * BURST) as u64;
    let denied = (5 + 20 * 3 + 5 + 5) as u64;
    assert_eq!(
        envoy.wait_for_wasm_counter(&requests_counter("per-user", Allowed), allowed),
        allowed
    );
    assert_eq!(
        envoy.wait_for_wasm_counter(&requests_counter("per-user", Denied), denied),
        denied
    );
    // Only flood keys were forgotten, each owing the one request it made.
    let evictions = envoy.wasm_counter("sluice.evictions").unwrap_or(0);
    let forgiven = envoy.wasm_counter("sluice.forgiven").unwrap_or(0);
    eprintln!("evictions {evictions}, forgiven {forgiven}");
    assert!(evictions as usize > FLOOD / 2, "{evictions}");
    assert_eq!(forgiven, evictions);
}
