//! What the reload tests share (`envoy_reload.rs` through LDS, `envoy_istio.rs` through ECDS):
//! one per-user policy that does not refill during a test, background traffic that records every
//! outcome, and a wait until every worker serves a given configuration.

use crate::envoy::Envoy;
use crate::http::{http_request, Response};
use serde_json::json;
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
pub fn config(version: &str, name: &str, burst: u64) -> String {
    json!({
        "version": version,
        "headers": "both",
        "policies": [{"name": name, "key": ["header:x-user-id"], "requests": 1, "per": "1h",
                      "burst": burst, "max_keys": 1000}],
    })
    .to_string()
}

pub fn user(id: &str) -> [(&str, &[u8]); 1] {
    [("x-user-id", id.as_bytes())]
}

/// Requests on fresh connections, from a few threads, until stopped: every outcome is kept
/// (`Ok(status)` or the connection error).
pub struct Traffic {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Vec<Result<u16, String>>>>,
}

impl Traffic {
    pub fn start(addr: SocketAddr) -> Traffic {
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

    pub fn finish(self) -> Vec<Result<u16, String>> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    }
}

/// Waits until new connections meet the configuration of policy `name` with burst `burst` (its
/// draft policy header `"<name>";q=<burst>;w=...`).
pub fn wait_for_config(envoy: &Envoy, name: &str, burst: u64) {
    let policy_header = format!("\"{name}\";q={burst};");
    wait_for_responses(envoy, |r| {
        r.header("ratelimit-policy")
            .unwrap_or("")
            .starts_with(&policy_header)
            && r.header("x-ratelimit-limit") == Some(&burst.to_string())
    });
}

/// Waits until `switched` holds for eight probes in a row on new connections, so every worker
/// has switched (at most 10 s). A 429 carries the rate-limit headers too, so the probes use a few
/// keys of their own (a new key each time would take slots, and could push a test key out of
/// its own).
pub fn wait_for_responses(envoy: &Envoy, switched: impl Fn(&Response) -> bool) {
    static PROBE: AtomicU32 = AtomicU32::new(0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut in_a_row = 0;
    while in_a_row < 8 {
        let key = format!("probe-{}", PROBE.fetch_add(1, Ordering::Relaxed) % 4);
        let r = envoy.get("/api/x", &user(&key));
        in_a_row = if switched(&r) { in_a_row + 1 } else { 0 };
        assert!(
            Instant::now() < deadline,
            "the new configuration did not serve within 10 s: {r:?}"
        );
    }
}

pub fn statuses(envoy: &Envoy, key: &str, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| envoy.get("/api/x", &user(key)).status)
        .collect()
}

pub fn failures(outcomes: &[Result<u16, String>]) -> Vec<String> {
    outcomes
        .iter()
        .filter_map(|o| match o {
            Ok(status) if *status == 200 || *status == 429 => None,
            Ok(status) => Some(format!("status {status}")),
            Err(e) => Some(e.clone()),
        })
        .collect()
}
