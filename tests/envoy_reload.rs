//! The plugin configuration changes while Envoy serves: the listener comes from a file-based
//! LDS resource (a watched directory), and each change is a new file renamed over the old one,
//! as Envoy wants file-based xDS changed. Envoy builds a new filter chain with the new plugin
//! configuration (same vm_id, same code: the same VMs, a new root context) and drains the old.
//!
//! - No request fails across the switches: client threads keep sending throughout, and none
//!   meets a connection error or a 5xx; a refused configuration leaves the old one serving.
//! - Bucket state follows the slot layout: shared data is per vm_id and slot names depend only on
//!   the plugin name, the key and the policies' names and columns. A changed burst keeps the
//!   layout, so a key keeps what it spent; a renamed policy is a new layout with fresh buckets.

// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use serde_json::json;
use sluice_testkit::envoy::Envoy;
use sluice_testkit::http::http_request;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const CLIENT_THREADS: usize = 4;
/// A bound on the background traffic, whatever happens to the test.
const CLIENT_DEADLINE: Duration = Duration::from_secs(15);
/// Keys the background clients use: few, so that they never push a test key out of its slot.
const CLIENT_KEYS: usize = 8;

/// One per-user policy that does not refill during a test: `burst` requests, then 429s.
fn config(version: &str, name: &str, burst: u64) -> String {
    json!({
        "version": version,
        "headers": "both",
        "policies": [{"name": name, "key": ["header:x-user-id"], "requests": 1, "per": "1h",
                      "burst": burst, "max_keys": 1000}],
    })
    .to_string()
}

fn user(id: &str) -> [(&str, &[u8]); 1] {
    [("x-user-id", id.as_bytes())]
}

/// Requests on fresh connections, from a few threads, until stopped: every outcome is kept
/// (`Ok(status)` or the connection error).
struct Traffic {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Vec<Result<u16, String>>>>,
}

impl Traffic {
    fn start(addr: SocketAddr) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..CLIENT_THREADS)
            .map(|t| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let deadline = Instant::now() + CLIENT_DEADLINE;
                    let mut outcomes = Vec::new();
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        let key = format!("traffic-{}", (t + outcomes.len()) % CLIENT_KEYS);
                        let outcome = http_request(addr, "GET", "/api/x", &user(&key));
                        outcomes.push(outcome.map(|r| r.status));
                    }
                    outcomes
                })
            })
            .collect();
        Traffic { stop, threads }
    }

    fn finish(self) -> Vec<Result<u16, String>> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    }
}

/// Waits until new connections meet the configuration whose draft policy header starts with
/// `policy_header` (`"per-user";q=1`) and whose burst is `burst`: eight probes in a row, so every
/// worker has switched. A 429 carries the headers too, so the probes use a few keys of their own
/// (a new key each time would take slots, and could push a test key out of its own).
fn wait_for_config(envoy: &Envoy, policy_header: &str, burst: u64) {
    static PROBE: AtomicU32 = AtomicU32::new(0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut in_a_row = 0;
    while in_a_row < 8 {
        let key = format!("probe-{}", PROBE.fetch_add(1, Ordering::Relaxed) % 4);
        let r = envoy.get("/api/x", &user(&key));
        let switched = r
            .header("ratelimit-policy")
            .unwrap_or("")
            .starts_with(policy_header)
            && r.header("x-ratelimit-limit") == Some(&burst.to_string());
        in_a_row = if switched { in_a_row + 1 } else { 0 };
        assert!(
            Instant::now() < deadline,
            "the new configuration did not serve within 10 s: {r:?}"
        );
    }
}

fn statuses(envoy: &Envoy, key: &str, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| envoy.get("/api/x", &user(key)).status)
        .collect()
}

fn failures(outcomes: &[Result<u16, String>]) -> Vec<String> {
    outcomes
        .iter()
        .filter_map(|o| match o {
            Ok(status) if *status == 200 || *status == 429 => None,
            Ok(status) => Some(format!("status {status}")),
            Err(e) => Some(e.clone()),
        })
        .collect()
}

#[test]
fn the_plugin_configuration_changes_under_traffic_and_no_request_fails() {
    let mut envoy = Envoy::options(&config("v0", "per-user", 5))
        .lds_from_file()
        .start();
    let traffic = Traffic::start(envoy.addr());
    let mut switches = 0;
    for (round, burst) in [6, 7, 8, 9, 10, 11].into_iter().enumerate() {
        std::thread::sleep(Duration::from_millis(150));
        let version = format!("v{}", round + 1);
        envoy
            .update_plugin(&config(&version, "per-user", burst))
            .unwrap();
        wait_for_config(&envoy, r#""per-user";q=1"#, burst);
        switches += 1;
    }
    // A configuration the filter refuses: Envoy rejects the update and the last one serves on.
    let refused = envoy.update_plugin(&config("bad", "per-user", 0));
    assert!(refused.is_err(), "burst 0 was accepted");
    wait_for_config(&envoy, r#""per-user";q=1"#, 11);
    std::thread::sleep(Duration::from_millis(150));
    let outcomes = traffic.finish();

    let failed = failures(&outcomes);
    eprintln!(
        "{} requests across {switches} switches and a refused update, {} failed",
        outcomes.len(),
        failed.len()
    );
    assert!(
        outcomes.len() >= 100,
        "too little traffic: {}",
        outcomes.len()
    );
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(10)]
    );
    assert!(
        envoy
            .log()
            .contains("invalid configuration: policies[0].burst"),
        "no configuration error in the log"
    );
}

#[test]
fn a_changed_burst_keeps_what_a_key_spent_and_a_renamed_policy_starts_fresh() {
    let mut envoy = Envoy::options(&config("v1", "per-user", 5))
        .lds_from_file()
        .start();
    let traffic = Traffic::start(envoy.addr());
    assert_eq!(statuses(&envoy, "alice", 3), [200, 200, 200]);

    // Same name, same key: the same slots. The bucket is a GCRA timestamp, so alice keeps her
    // 3 spent requests under the new burst: 8 - 3 = 5 left, not 8.
    envoy.update_plugin(&config("v2", "per-user", 8)).unwrap();
    wait_for_config(&envoy, r#""per-user";q=1"#, 8);
    assert_eq!(
        statuses(&envoy, "alice", 6),
        [200, 200, 200, 200, 200, 429],
        "the state did not carry over"
    );

    // A renamed policy is a new slot layout: alice starts again with a full bucket of 8.
    envoy
        .update_plugin(&config("v3", "per-user-v3", 8))
        .unwrap();
    wait_for_config(&envoy, r#""per-user-v3";q=1"#, 8);
    let mut expected = vec![200; 8];
    expected.push(429);
    assert_eq!(
        statuses(&envoy, "alice", 9),
        expected,
        "a renamed policy kept state"
    );

    // Back to the old name: the old slots are still in shared data (Envoy never frees them), so
    // alice finds her old bucket again, with 0 left of 8.
    envoy.update_plugin(&config("v4", "per-user", 8)).unwrap();
    wait_for_config(&envoy, r#""per-user";q=1"#, 8);
    assert_eq!(
        statuses(&envoy, "alice", 1),
        [429],
        "the old slots were gone"
    );

    let outcomes = traffic.finish();
    let failed = failures(&outcomes);
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(10)]
    );
}
