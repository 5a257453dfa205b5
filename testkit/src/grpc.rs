//! A real gRPC server and client: grpcio's, in `python/grpc_peer.py`, run by the Python of the
//! repo's `.venv` (`scripts/ensure-deps grpcio` installs it there; `make test` does); and a
//! grpcio client of the gRPC health protocol, as `grpc_health_probe` asks it
//! (`python/health_probe.py`).
//!
//! ```ignore
//! let server = GrpcServer::start();
//! let envoy = Envoy::options(json).grpc_upstream(server.addr()).start();
//! let calls = grpc_calls(envoy.addr(), 3, &[("x-user-id", "alice")]);
//! assert_eq!(calls[2].code, "RESOURCE_EXHAUSTED");
//! ```

use crate::{repo_root, send_signal, SIGKILL};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The Python with grpcio, and the peer script `name` of `testkit/python/`.
fn python_and(name: &str) -> (PathBuf, PathBuf) {
    let root = repo_root();
    let python = root.join(".venv/bin/python");
    let has_grpc = Command::new(&python)
        .args(["-c", "import grpc"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        has_grpc,
        "{} cannot import grpc: run `scripts/ensure-deps grpcio` (make test does)",
        python.display()
    );
    (python, root.join("testkit/python").join(name))
}

/// A peer script serving on 127.0.0.1: its process, its port (the first line it prints), and
/// the lines it prints after it.
fn serve_peer(script: &str, args: &[&str]) -> (Child, u16, mpsc::Receiver<String>) {
    let (python, peer) = python_and(script);
    let mut child = Command::new(python)
        .arg(peer)
        .arg("serve")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting a gRPC peer");
    let stdout = child.stdout.take().expect("the peer's stdout");
    // Read on a thread, so that a hung peer cannot hang the test.
    let (sent, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if sent.send(line).is_err() {
                break;
            }
        }
    });
    let port = lines
        .recv_timeout(START_TIMEOUT)
        .ok()
        .and_then(|l| l.trim().parse().ok());
    match port {
        Some(port) => (child, port, lines),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the gRPC peer {script} did not say its port within {START_TIMEOUT:?}")
        }
    }
}

/// One call's result as the client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcCall {
    /// The status name: `OK`, `RESOURCE_EXHAUSTED`, `UNAVAILABLE`...
    pub code: String,
    /// The status message (`grpc-message`).
    pub details: String,
    /// The initial and trailing metadata received (a trailers-only answer has only the latter).
    pub metadata: HashMap<String, String>,
}

/// A gRPC server echoing `/sluice.test.Echo/Echo` on 127.0.0.1, stopped when dropped.
pub struct GrpcServer {
    child: Child,
    port: u16,
}

impl GrpcServer {
    pub fn start() -> GrpcServer {
        let (child, port, _) = serve_peer("grpc_peer.py", &[]);
        GrpcServer { child, port }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            send_signal(pid, SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// `n` unary calls to `/sluice.test.Echo/Echo` at `target`, one after the other on one channel,
/// each with `metadata`. Every call has a 5 s deadline.
pub fn grpc_calls(target: SocketAddr, n: usize, metadata: &[(&str, &str)]) -> Vec<GrpcCall> {
    let (python, peer) = python_and("grpc_peer.py");
    let out = Command::new(python)
        .arg(peer)
        .args(["call", &target.to_string(), &n.to_string()])
        .args(metadata.iter().map(|(k, v)| format!("{k}={v}")))
        .stdin(Stdio::null())
        .output()
        .expect("running the gRPC client");
    assert!(
        out.status.success(),
        "the gRPC client failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let calls: Vec<GrpcCall> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("the gRPC client printed {line:?}: {e}"));
            let text = |field: &str| v[field].as_str().unwrap_or_default().to_string();
            let metadata = v["metadata"].as_object().map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect()
            });
            GrpcCall {
                code: text("code"),
                details: text("details"),
                metadata: metadata.unwrap_or_default(),
            }
        })
        .collect();
    assert_eq!(calls.len(), n, "calls made");
    calls
}

/// An independent Rate Limit Service (`python/rls_peer.py`): `limit` hits per `unit` (second,
/// minute or hour) for every descriptor, a fixed window each, every hit counted; or, by `mode`,
/// one whose calls fail (`unavailable`) or take 2 s (`slow`). Stopped when dropped.
pub struct RlsPeer {
    child: Child,
    port: u16,
    calls: mpsc::Receiver<String>,
}

impl RlsPeer {
    pub fn start(limit: u64, unit: &str, mode: &str) -> RlsPeer {
        let limit = limit.to_string();
        let (child, port, calls) = serve_peer("rls_peer.py", &[&limit, unit, mode]);
        RlsPeer { child, port, calls }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The calls received since the last look, as the peer printed them: `{"domain",
    /// "hits_addend", "descriptors": [{"entries": [[key, value]...], "hits_addend"}]}`.
    pub fn calls(&self) -> Vec<serde_json::Value> {
        let lines = std::iter::from_fn(|| self.calls.recv_timeout(Duration::from_millis(200)).ok());
        lines
            .map(|l| serde_json::from_str(&l).expect("a JSON line"))
            .collect()
    }
}

impl Drop for RlsPeer {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            send_signal(pid, SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// One `grpc.health.v1.Health/Check` of `service` at `target` (a 2 s deadline): the status
/// (`SERVING`, `NOT_SERVING`, ...) or the call's failure code (`NOT_FOUND`, `UNAVAILABLE`, ...).
pub fn health_check(target: SocketAddr, service: &str) -> String {
    let (python, probe) = python_and("health_probe.py");
    let out = Command::new(python)
        .arg(probe)
        .args(["check", &target.to_string(), service])
        .stdin(Stdio::null())
        .output()
        .expect("running the health client");
    assert!(
        out.status.success(),
        "the health client failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A `grpc.health.v1.Health/Watch` of `service` open for at most `seconds`: the statuses as the
/// stream sends them. Killed when dropped.
pub struct HealthWatch {
    child: Child,
    statuses: mpsc::Receiver<String>,
}

impl HealthWatch {
    pub fn start(target: SocketAddr, service: &str, seconds: u64) -> HealthWatch {
        let (python, probe) = python_and("health_probe.py");
        let mut child = Command::new(python)
            .arg(probe)
            .args(["watch", &target.to_string(), service, &seconds.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the health watch");
        let stdout = child.stdout.take().expect("the watch's stdout");
        let (sent, statuses) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sent.send(line.trim().to_string()).is_err() {
                    break;
                }
            }
        });
        HealthWatch { child, statuses }
    }

    /// The next status sent within `within`.
    pub fn next(&self, within: Duration) -> Option<String> {
        self.statuses.recv_timeout(within).ok()
    }
}

impl Drop for HealthWatch {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            send_signal(pid, SIGKILL);
        }
        let _ = self.child.wait();
    }
}
