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

use crate::python::{Peer, Script};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

/// Every call has a 5 s deadline (`grpc_peer.py`); the client as a whole gets this much.
const CALLS_TIMEOUT: Duration = Duration::from_secs(60);

/// The peer script `name` of `testkit/python/`, with the Python that has grpcio.
fn grpc_peer(name: &str) -> Script {
    Script::with_package(name, "grpc", "grpcio")
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
    peer: Peer,
}

impl GrpcServer {
    pub fn start() -> GrpcServer {
        let peer = grpc_peer("grpc_peer.py").serve(&[]);
        GrpcServer { peer }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.peer.port))
    }
}

/// `n` unary calls to `/sluice.test.Echo/Echo` at `target`, one after the other on one channel,
/// each with `metadata`. Every call has a 5 s deadline.
pub fn grpc_calls(target: SocketAddr, n: usize, metadata: &[(&str, &str)]) -> Vec<GrpcCall> {
    let args = ["call".to_string(), target.to_string(), n.to_string()];
    let pairs = metadata.iter().map(|(k, v)| format!("{k}={v}"));
    let lines = grpc_peer("grpc_peer.py").run(args.into_iter().chain(pairs), CALLS_TIMEOUT);
    let calls: Vec<GrpcCall> = lines
        .iter()
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
    peer: Peer,
}

impl RlsPeer {
    pub fn start(limit: u64, unit: &str, mode: &str) -> RlsPeer {
        let limit = limit.to_string();
        let peer = grpc_peer("rls_peer.py").serve(&[&limit, unit, mode]);
        RlsPeer { peer }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.peer.port))
    }

    /// The calls received since the last look, as the peer printed them: `{"domain",
    /// "hits_addend", "descriptors": [{"entries": [[key, value]...], "hits_addend"}]}`.
    pub fn calls(&self) -> Vec<serde_json::Value> {
        let lines = std::iter::from_fn(|| {
            self.peer
                .lines
                .recv_timeout(Duration::from_millis(200))
                .ok()
        });
        lines
            .map(|l| serde_json::from_str(&l).expect("a JSON line"))
            .collect()
    }
}

/// One `grpc.health.v1.Health/Check` of `service` at `target` (a 2 s deadline): the status
/// (`SERVING`, `NOT_SERVING`, ...) or the call's failure code (`NOT_FOUND`, `UNAVAILABLE`, ...).
pub fn health_check(target: SocketAddr, service: &str) -> String {
    let args = ["check", &target.to_string(), service];
    let lines = grpc_peer("health_probe.py").run(args, Duration::from_secs(10));
    lines.first().cloned().unwrap_or_default()
}

/// A `grpc.health.v1.Health/Watch` of `service` open for at most `seconds`: the statuses as the
/// stream sends them. Killed when dropped.
pub struct HealthWatch {
    peer: Peer,
}

impl HealthWatch {
    pub fn start(target: SocketAddr, service: &str, seconds: u64) -> HealthWatch {
        let args = ["watch", &target.to_string(), service, &seconds.to_string()];
        let peer = grpc_peer("health_probe.py").start(args);
        HealthWatch { peer }
    }

    /// The next status sent within `within`.
    pub fn next(&self, within: Duration) -> Option<String> {
        let line = self.peer.lines.recv_timeout(within).ok()?;
        Some(line.trim().to_string())
    }
}
