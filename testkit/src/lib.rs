//! The one test harness of the workspace: real processes and small blocking clients.
//!
//! - `envoy`: an Envoy with the built sluice filter, on free loopback ports;
//! - `redis`: `redis-server`s, one node or a three-node Cluster; `resp`: a RESP client;
//! - `service`: the `sluice-service` binary;
//! - `grpc`: a gRPC server and client (grpcio, from the repo's `.venv`);
//! - `llm`: an OpenAI- and Anthropic-compatible upstream shaped by request headers, and its
//!   clients: one of this crate's that streams, and the official openai SDK (from `.venv`);
//! - `http`: an HTTP/1.1 client for all of them;
//! - `reload`: traffic and waits for the tests that change an Envoy's configuration as it runs;
//! - `make`: the serving make targets (`make run`, ...) as the docs start them;
//! - `docs`: the command transcripts of a Markdown page, and whether a command printed them.
//!
//! Every child process is stopped by PID when its handle drops, also when a test panics, and
//! every wait has a deadline. Test support code panics with a clear message when the set-up is
//! broken: that is how it reports.
#![allow(
    clippy::panic,
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::indexing_slicing
)]

pub mod browser;
pub mod docs;
pub mod envoy;
pub mod gateway;
pub mod grpc;
pub mod http;
pub mod llm;
pub mod make;
mod python;
pub mod redis;
pub mod reload;
pub mod resp;
pub mod service;

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A port that was free a moment ago on 127.0.0.1 (bind port 0, read it, release it).
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding an ephemeral port on 127.0.0.1")
}

/// Raises this process's soft limit on open files to at least `n` (up to the hard limit), for a
/// test that holds many sockets; the limit it has then.
pub fn raise_fd_limit(n: u64) -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let limit = getrlimit(Resource::Nofile);
    let wanted = limit.maximum.map_or(n, |hard| n.min(hard));
    if limit.current.is_some_and(|soft| soft >= wanted) {
        return limit.current.unwrap_or(wanted);
    }
    let raised = rustix::process::Rlimit {
        current: Some(wanted),
        maximum: limit.maximum,
    };
    setrlimit(Resource::Nofile, raised).expect("raising the open files limit");
    wanted
}

/// The resident memory (VmRSS) of our child `pid`, in KiB.
pub(crate) fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/status: {e}"));
    let line = status.lines().find(|l| l.starts_with("VmRSS:"));
    let kib = line.and_then(|l| l.split_whitespace().nth(1)?.parse().ok());
    kib.unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
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

// Linux's numbers.
pub const SIGHUP: i32 = 1;
pub const SIGINT: i32 = 2;
pub const SIGKILL: i32 = 9;
pub const SIGTERM: i32 = 15;
pub const SIGCONT: i32 = 18;
pub const SIGSTOP: i32 = 19;

/// kill(2) to `pid`, or with a minus sign to the process group it leads. Only for our own
/// child not yet reaped (or its group), so that the number cannot belong to another process.
pub fn send_signal(pid: i32, signal: i32) {
    extern "C" {
        fn kill(pid: i32, sig: i32) -> i32;
    }
    // SAFETY: kill(2) takes two integers and touches no memory of ours.
    unsafe {
        kill(pid, signal);
    }
}

/// The workspace root (the filter's crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .expect("testkit lives in the workspace root")
}

/// The workspace's crates, `cargo metadata`'s: each one's name as Rust writes it
/// (`sluice_service`) and its directory.
pub fn workspace_crates() -> Vec<(String, PathBuf)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(repo_root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
    let packages = metadata["packages"].as_array().expect("packages");
    let crates = packages.iter().map(|p| {
        let manifest = PathBuf::from(p["manifest_path"].as_str().unwrap_or_default());
        let dir = manifest.parent().map(Path::to_path_buf).unwrap_or_default();
        (
            p["name"].as_str().unwrap_or_default().replace('-', "_"),
            dir,
        )
    });
    crates.collect()
}

/// Where Cargo puts build outputs: `$CARGO_TARGET_DIR`, else `<root>/target`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
}

/// A directory under the system temp dir, removed on drop; kept when the test is failing, for
/// the logs it holds.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("sluice-{label}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("[testkit] kept {} for its logs", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
