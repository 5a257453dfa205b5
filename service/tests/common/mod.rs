//! Test harness: real `redis-server`s (single or Cluster), the real `sluice-service` binary,
//! and small blocking clients for HTTP and RESP. Every child process is killed by PID when its
//! handle drops, so a failing test leaves nothing running. Every wait has a deadline.
// Each test binary compiles this module and uses only part of it. It is test support code (not
// under #[test], so clippy's in-tests allowances miss it): panicking with a clear message is how
// it reports a broken setup.
#![allow(
    dead_code,
    clippy::panic,
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::indexing_slicing
)]

pub mod clock;
pub mod http;
pub mod redis;
pub mod resp;
pub mod service;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Polls `probe` until it gives a value or `limit` passes.
pub fn wait_for<T>(limit: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(value) = probe() {
            return Some(value);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Sends `signal` (`-STOP`, `-TERM`, ...) to a process this test started.
pub fn signal(pid: u32, signal: &str) {
    let pid = pid.to_string();
    let sent = std::process::Command::new("kill")
        .args([signal, &pid])
        .status();
    assert!(sent.unwrap().success(), "kill {signal} {pid}");
}

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("sluice-{label}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The JSON body of a request with the given checks.
pub fn checks_body(checks: &[serde_json::Value]) -> String {
    serde_json::json!({ "checks": checks }).to_string()
}

/// One token-bucket check; `take` is left out when equal to `cost` (strict mode).
pub fn bucket(
    key: &str,
    requests: u64,
    per_ms: u64,
    burst: u64,
    cost: u64,
    take: u64,
) -> serde_json::Value {
    let mut check = serde_json::json!({
        "key": key, "requests": requests, "per_ms": per_ms, "burst": burst, "cost": cost,
    });
    if take != cost {
        check["take"] = take.into();
    }
    check
}

/// One check of a window algorithm (`fixed_window`, `sliding_window`, `sliding_log`): `limit`
/// per `per_ms`, sent as the filter does (burst = requests); `take` left out when equal to `cost`.
pub fn window(
    algorithm: &str,
    key: &str,
    limit: u64,
    per_ms: u64,
    cost: u64,
    take: u64,
) -> serde_json::Value {
    let mut check = bucket(key, limit, per_ms, limit, cost, take);
    check["algorithm"] = algorithm.into();
    check
}

/// One leaky-bucket check as the filter sends it: `requests` per `per_ms`, held at most
/// `max_delay_ms`, burst = max_delay / interval + 1, take = cost.
pub fn leaky(
    key: &str,
    requests: u64,
    per_ms: u64,
    max_delay_ms: u64,
    cost: u64,
) -> serde_json::Value {
    let burst = max_delay_ms * requests / per_ms + 1;
    serde_json::json!({
        "key": key, "algorithm": "leaky_bucket", "requests": requests, "per_ms": per_ms,
        "burst": burst, "cost": cost, "take": cost, "max_delay_ms": max_delay_ms,
    })
}
