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

/// The environment variables the binary reads, none inherited from the test's own environment.
const SETTINGS: [&str; 7] = [
    "SLUICE_LISTEN",
    "SLUICE_REDIS",
    "SLUICE_REDIS_CLUSTER",
    "SLUICE_TOKEN_FILE",
    "SLUICE_LOG",
    "SLUICE_SHUTDOWN_DELAY",
    "SLUICE_SHUTDOWN_TIMEOUT",
];

/// A running service, killed on drop.
pub struct Service {
    child: Child,
    pub addr: SocketAddr,
    /// The `listening` log event, which names the address and Redis.
    pub listening: serde_json::Value,
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

    /// `sluice-service --listen 127.0.0.1:0 --redis <url>`, ready.
    pub fn start(redis_url: &str) -> Service {
        Service::start_with(&["--redis", redis_url], &[])
    }

    pub fn start_cluster(urls: &str) -> Service {
        Service::start_with(&["--redis-cluster", urls], &[])
    }

    /// `spawn`, then waits until /readyz answers 200 (Redis reached).
    pub fn start_with(args: &[&str], env: &[(&str, &str)]) -> Service {
        let service = Service::spawn(args, env);
        let ready = super::wait_for(READY_WITHIN, || {
            (super::http::get(service.addr, "/readyz").status == 200).then_some(())
        });
        assert!(ready.is_some(), "/readyz not 200 within {READY_WITHIN:?}");
        service
    }

    /// Starts with `args` (plus `--listen 127.0.0.1:0` unless SLUICE_LISTEN is in `env`) and
    /// waits for the `listening` log event, which names the address; Redis may be down.
    pub fn spawn(args: &[&str], env: &[(&str, &str)]) -> Service {
        let listen: &[&str] = if env.iter().any(|(name, _)| *name == "SLUICE_LISTEN") {
            &[]
        } else {
            &["--listen", "127.0.0.1:0"]
        };
        let mut child = command(&[listen, args].concat(), env)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = lines_of(child.stderr.take().unwrap());
        let mut service = Service {
            child,
            addr: "127.0.0.1:0".parse().unwrap(),
            listening: serde_json::Value::Null,
            stderr,
        };
        let listening = service.event("listening", READY_WITHIN);
        let listening = listening.unwrap_or_else(|| panic!("no listening event"));
        let addr = listening["address"].as_str().and_then(|a| a.parse().ok());
        service.addr = addr.unwrap_or_else(|| panic!("no address in {listening}"));
        service.listening = listening;
        service
    }

    /// The next log event with this message, skipping the lines before it (each must be one
    /// JSON object).
    pub fn event(&self, message: &str, within: Duration) -> Option<serde_json::Value> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let line = self.stderr.recv_timeout(left).ok()?;
            let event: serde_json::Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("a log line that is not JSON ({e}): {line}"));
            if event["message"] == message {
                return Some(event);
            }
        }
    }

    /// Every log line from here until none comes for `quiet`.
    pub fn lines(&self, quiet: Duration) -> Vec<String> {
        std::iter::from_fn(|| self.stderr.recv_timeout(quiet).ok()).collect()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`crate::SIGTERM`, ...) to the service.
    pub fn signal(&self, signal: i32) {
        crate::send_signal(i32::try_from(self.pid()).unwrap(), signal);
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
    command.args(args);
    for name in SETTINGS {
        command.env_remove(name);
    }
    command.envs(env.iter().copied()).stdin(Stdio::null());
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
