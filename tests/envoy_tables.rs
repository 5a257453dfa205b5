//! Key tables at scale through a real Envoy (`--concurrency 2`): memory grows with the keys a
//! table holds, at most 64 bytes a key, not with `max_keys`; a table of a million keys is ready
//! as fast as one of a single key, and so is a reload that changes its layout; and layouts that
//! configuration changes retire give their memory to the new ones.

// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use serde_json::json;
use sluice_testkit::envoy::Envoy;
use sluice_testkit::reload::Traffic;
use std::time::{Duration, Instant};

/// The bar: Envoy's resident memory per key a table holds.
const BYTES_PER_KEY: u64 = 64;
/// What Envoy's memory moves by between two Envoys given the same traffic, whatever sluice
/// keeps: its own buffers and allocator caches.
const NOISE_KIB: u64 = 4 * 1024;
/// Each fill must end within this, or the test fails (200,000 keys take about 30 s on 2 cores).
const FILL_DEADLINE: Duration = Duration::from_secs(90);

/// A token bucket per `x-user-id`, burst 5, with `max_keys` keys and `name`.
fn per_user(name: &str, max_keys: u32) -> String {
    json!({"policies": [{"name": name, "key": ["header:x-user-id"], "requests": 1, "per": "1h",
        "burst": 5, "max_keys": max_keys}]})
    .to_string()
}

/// One request for each of `keys` new keys, `threads` at a time, each thread on its own
/// keep-alive connection (so both workers take keys).
fn fill(envoy: &Envoy, prefix: &str, keys: usize, threads: usize) {
    let started = Instant::now();
    std::thread::scope(|scope| {
        for thread in 0..threads {
            scope.spawn(move || {
                let mut connection = envoy.connect();
                for i in (thread..keys).step_by(threads) {
                    if i % 1_000 < threads {
                        assert!(started.elapsed() < FILL_DEADLINE, "the fill took too long");
                    }
                    let user = format!("{prefix}-{i}");
                    let headers: &[(&str, &[u8])] = &[("x-user-id", user.as_bytes())];
                    let response = connection.send("GET", "/api/x", headers).unwrap();
                    assert_eq!(response.status, 200, "{user}: a new key has its burst");
                }
            });
        }
    });
}

#[test]
fn two_hundred_thousand_keys_cost_a_million_key_table_at_most_64_bytes_each() {
    const KEYS: u64 = 200_000;
    let control = Envoy::start(&per_user("per-user", 1));
    let table = Envoy::start(&per_user("per-user", 1_000_000));
    let ready = table.rss_kib().saturating_sub(control.rss_kib());
    std::thread::scope(|scope| {
        scope.spawn(|| fill(&control, "user", KEYS as usize, 4));
        scope.spawn(|| fill(&table, "user", KEYS as usize, 4));
    });
    let growth = table.rss_kib().saturating_sub(control.rss_kib());
    eprintln!(
        "a million-key table over a one-key table: {ready} KiB when ready, {growth} KiB with \
         {KEYS} keys ({:.1} bytes a key)",
        growth as f64 * 1024.0 / KEYS as f64
    );
    assert!(
        ready < NOISE_KIB,
        "{ready} KiB before any key: nothing is made up front"
    );
    assert!(
        growth * 1024 <= BYTES_PER_KEY * KEYS + NOISE_KIB * 1024,
        "{growth} KiB for {KEYS} keys"
    );
}

/// The time Envoy takes to start with `config`, then to take an update that changes the
/// table's layout (a renamed policy).
fn start_and_reload(max_keys: u32) -> (Duration, Duration) {
    let started = Instant::now();
    let mut envoy = Envoy::options(&per_user("first", max_keys))
        .lds_from_file()
        .start();
    let ready = started.elapsed();
    envoy.get("/api/x", &[("x-user-id", b"alice")]);
    let updating = Instant::now();
    envoy.update_plugin(&per_user("second", max_keys)).unwrap();
    let reloaded = updating.elapsed();
    assert_eq!(envoy.get("/api/x", &[("x-user-id", b"alice")]).status, 200);
    (ready, reloaded)
}

#[test]
fn a_million_key_table_starts_and_reloads_within_a_second_of_a_one_key_table() {
    let (one_ready, one_reloaded) = start_and_reload(1);
    let (million_ready, million_reloaded) = start_and_reload(1_000_000);
    eprintln!(
        "ready in {one_ready:?} (max_keys 1) and {million_ready:?} (1,000,000); reloaded in \
         {one_reloaded:?} and {million_reloaded:?}"
    );
    let second = Duration::from_secs(1);
    assert!(million_ready < one_ready + second, "{million_ready:?}");
    assert!(
        million_reloaded < one_reloaded + second,
        "{million_reloaded:?}"
    );
}

/// A sliding log of 1,000 requests per `x-user-id` under `name`: 8 KB records, one key a page,
/// so that a table of 1,000 keys weighs about 8 MiB, more than Envoy itself grows by over 20
/// updates, and a table left behind by each change would show.
fn wide(name: &str) -> String {
    json!({"policies": [{"name": name, "key": ["header:x-user-id"], "requests": 1000,
        "per": "1h", "algorithm": "sliding_log", "max_keys": WIDE_KEYS}]})
    .to_string()
}

const WIDE_KEYS: u32 = 1_000;
/// A full table of `wide`: per key, its record (22 + 8,000 bytes) and Envoy's entry around it.
const WIDE_TABLE_KIB: u64 = WIDE_KEYS as u64 * 8_200 / 1024;

/// An Envoy whose configuration comes through LDS, as the one changed under traffic.
fn through_lds(config: &str) -> Envoy {
    Envoy::options(config).lds_from_file().start()
}

#[test]
fn twenty_layout_changes_under_traffic_leave_memory_within_one_table_of_a_fresh_start() {
    let mut churned = through_lds(&wide("layout-0"));
    let traffic = Traffic::start(churned.addr());
    for change in 1..=20 {
        churned
            .update_plugin(&wide(&format!("layout-{change}")))
            .unwrap();
        fill(&churned, &format!("phase-{change}"), WIDE_KEYS as usize, 2);
    }
    let outcomes = traffic.finish();
    // The same traffic, keys and reloads, under the last layout from the start: each reload
    // only renames the configuration's version, so whatever Envoy and V8 keep per reload is on
    // both sides, and only tables left behind would tell them apart.
    let mut fresh = through_lds(&wide("layout-20"));
    let traffic = Traffic::start(fresh.addr());
    for change in 1..=20 {
        let mut config: serde_json::Value = serde_json::from_str(&wide("layout-20")).unwrap();
        config["version"] = json!(format!("v{change}"));
        fresh.update_plugin(&config.to_string()).unwrap();
        fill(&fresh, &format!("phase-{change}"), WIDE_KEYS as usize, 2);
    }
    traffic.finish();
    let (churned_kib, fresh_kib) = (churned.rss_kib(), fresh.rss_kib());
    eprintln!(
        "after 20 layout changes {churned_kib} KiB, a fresh start {fresh_kib} KiB; one table \
         {WIDE_TABLE_KIB} KiB; {} background requests",
        outcomes.len()
    );
    assert!(
        churned_kib <= fresh_kib + WIDE_TABLE_KIB,
        "{churned_kib} KiB > {fresh_kib} + {WIDE_TABLE_KIB}"
    );
    let failed = sluice_testkit::reload::failures(&outcomes);
    assert!(failed.is_empty(), "{failed:?}");
}
