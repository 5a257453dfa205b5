//! The real `sluice-service` binary as a child process.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// The workspace's debug build: Cargo builds it for the service's own tests, `make service`
/// for the filter's.
pub fn binary() -> std::path::PathBuf {
    let path = crate::target_dir().join("debug/sluice-service");
    assert!(
        path.exists(),
        "{} is missing: run `cargo build -p sluice-service`",
        path.display()
    );
    path
}
const READY_WITHIN: Duration = Duration::from_secs(10);

/// A running service, killed on drop.
pub struct Service {
    child: Child,
    /// The HTTP address (`0.0.0.0:0` when it serves only the RLS).
    pub addr: SocketAddr,
    pub ready_line: String,
    /// The RLS's gRPC address, when started with `start_rls`.
    pub rls: Option<SocketAddr>,
    stderr: Receiver<String>,
}

impl Service {
    /// POST /v1/check with these checks, which must succeed; the results, in order.
    pub fn check(&self, checks: &[serde_json::Value]) -> Vec<serde_json::Value> {
        let body = serde_json::json!({ "checks": checks }).to_string();
        let response = crate::http::post_json(self.addr, "/v1/check", &body);
        assert_eq!(response.status, 200, "{response:?}");
        response.json()["results"].as_array().unwrap().clone()
    }

    /// `sluice-service --listen 127.0.0.1:0 --redis <url>`.
    pub fn start(redis_url: &str) -> Service {
        Service::start_with(&["--redis", redis_url], &[])
    }

    pub fn start_cluster(urls: &str) -> Service {
        Service::start_with(&["--redis-cluster", urls], &[])
    }

    /// Starts with `args` (plus `--listen 127.0.0.1:0` unless SLUICE_LISTEN is in `env`) and
    /// waits for the readiness line, which names the address it listens on.
    pub fn start_with(args: &[&str], env: &[(&str, &str)]) -> Service {
        let listen: &[&str] = if env.iter().any(|(name, _)| *name == "SLUICE_LISTEN") {
            &[]
        } else {
            &["--listen", "127.0.0.1:0"]
        };
        let mut service = Service::spawn(&[listen, args].concat(), env);
        let ready = service.next_line(READY_WITHIN).unwrap_or_default();
        let addr = address(&ready, "sluice-service listening on ");
        service.addr = addr.unwrap_or_else(|| panic!("no readiness line, got {ready:?}"));
        service.ready_line = ready;
        service
    }

    /// Starts with `args` as they are (`--rls ... --rls-config ...`, and `--listen` only if
    /// given) and waits for the readiness lines: HTTP's if `--listen` is in `args`, then the RLS's
    /// (`sluice-service rls listening on ADDR, ...`), whose address goes to `rls`.
    pub fn start_rls(args: &[&str], env: &[(&str, &str)]) -> Service {
        let mut service = Service::spawn(args, env);
        let mut seen = Vec::new();
        while service.rls.is_none() {
            let Some(line) = service.next_line(READY_WITHIN) else {
                panic!("no readiness line for the RLS; got {seen:?}");
            };
            if let Some(addr) = address(&line, "sluice-service listening on ") {
                service.addr = addr;
            }
            if let Some(addr) = address(&line, "sluice-service rls listening on ") {
                service.rls = Some(addr);
                service.ready_line = line.clone();
            }
            seen.push(line);
        }
        service
    }

    fn spawn(args: &[&str], env: &[(&str, &str)]) -> Service {
        let mut child = command(args, env)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = lines_of(child.stderr.take().unwrap());
        Service {
            child,
            addr: "0.0.0.0:0".parse().unwrap(),
            ready_line: String::new(),
            rls: None,
            stderr,
        }
    }

    pub fn next_line(&self, within: Duration) -> Option<String> {
        self.stderr.recv_timeout(within).ok()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the process to exit on its own.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        crate::wait_for(within, || self.child.try_wait().ok().flatten())
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address in a readiness line `<prefix><address>, ...`.
fn address(line: &str, prefix: &str) -> Option<SocketAddr> {
    let rest = line.strip_prefix(prefix)?;
    rest.split(',').next()?.parse().ok()
}

/// Lines of a child's output, read on a thread that ends when the child does.
pub fn lines_of(output: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (send, receive) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(output).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                break;
            }
        }
    });
    receive
}

/// The binary with `args` and exactly the `SLUICE_*` settings in `env` (none inherited from the
/// test's own environment), no stdin.
fn command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(binary());
    command
        .args(args)
        .env_remove("SLUICE_LISTEN")
        .env_remove("SLUICE_REDIS")
        .env_remove("SLUICE_REDIS_CLUSTER")
        .env_remove("SLUICE_RLS")
        .env_remove("SLUICE_RLS_CONFIG")
        .env_remove("SLUICE_RLS_HEADERS")
        .envs(env.iter().copied())
        .stdin(Stdio::null());
    command
}

/// Runs the binary to completion (bounded), returning its status, stdout and stderr.
pub fn run_to_exit(
    args: &[&str],
    env: &[(&str, &str)],
    within: Duration,
) -> (ExitStatus, String, String) {
    let mut child = command(args, env)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = lines_of(child.stdout.take().unwrap());
    let stderr = lines_of(child.stderr.take().unwrap());
    let started = Instant::now();
    let status = crate::wait_for(within, || child.try_wait().ok().flatten());
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "sluice-service {args:?} still running after {:?}",
            started.elapsed()
        );
    };
    let collect = |lines: Receiver<String>| lines.iter().collect::<Vec<_>>().join("\n");
    (status, collect(stdout), collect(stderr))
}
