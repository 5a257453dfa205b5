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
const SETTINGS: [&str; 27] = [
    "SLUICE_MAX_OVERRIDES",
    "SLUICE_TOP_LOG_EVERY",
    "SLUICE_RLS_TOP_SHOW",
    "SLUICE_LISTEN",
    "SLUICE_ADMIN_TOKEN_FILE",
    "SLUICE_READ_TOKEN_FILE",
    "SLUICE_REDIS",
    "SLUICE_REDIS_CLUSTER",
    "SLUICE_MEMORY",
    "SLUICE_TOKEN_FILE",
    "SLUICE_ALLOW_UNAUTHENTICATED",
    "SLUICE_MAX_KEY_TTL",
    "SLUICE_METRIC_POLICIES",
    "SLUICE_MAX_CONNECTIONS",
    "SLUICE_HEADER_TIMEOUT",
    "SLUICE_IDLE_TIMEOUT",
    "SLUICE_MAX_REQUEST_BYTES",
    "SLUICE_LOG",
    "SLUICE_SHUTDOWN_DELAY",
    "SLUICE_SHUTDOWN_TIMEOUT",
    "SLUICE_RLS",
    "SLUICE_RLQS",
    "SLUICE_RLS_CONFIG",
    "SLUICE_RLS_HEADERS",
    "SLUICE_RLS_HASH_SECRET",
    "SLUICE_RLS_ALLOW_EMPTY_CONFIG",
    "SLUICE_RLS_MAX_STREAMS",
];

/// A running service, killed on drop.
pub struct Service {
    child: Child,
    /// The HTTP address (`0.0.0.0:0` when it serves only the RLS).
    pub addr: SocketAddr,
    /// The `listening` log event, which names the address and Redis.
    pub listening: serde_json::Value,
    /// The RLS's gRPC address, when started with `start_rls` and `--rls`.
    pub rls: Option<SocketAddr>,
    /// The RLQS's gRPC address, when started with `start_rls` and `--rlqs`.
    pub rlqs: Option<SocketAddr>,
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

    /// `sluice-service --memory`: limits in the service's own memory, no Redis.
    pub fn start_memory() -> Service {
        Service::start_with(&["--memory"], &[])
    }

    pub fn start_cluster(urls: &str) -> Service {
        Service::start_with(&["--redis-cluster", urls], &[])
    }

    /// `spawn`, then waits until /readyz answers 200 (Redis reached).
    pub fn start_with(args: &[&str], env: &[(&str, &str)]) -> Service {
        Launcher::default().start_with(args, env)
    }

    /// Starts with `args` (plus `--listen 127.0.0.1:0` unless SLUICE_LISTEN is in `env`) and
    /// waits for the `listening` log event, which names the address; Redis may be down.
    pub fn spawn(args: &[&str], env: &[(&str, &str)]) -> Service {
        Launcher::default().spawn(args, env)
    }

    /// Starts with `args` as they are (`--rls ... --rls-config ...` or `--rlqs ...`, and
    /// `--listen` only if given) and waits until the RLS listens (its address goes to `rls`),
    /// the RLQS too (to `rlqs`) if `--rlqs` is in `args`, HTTP too if `--listen` is, and Redis
    /// is up: ready for calls.
    pub fn start_rls(args: &[&str], env: &[(&str, &str)]) -> Service {
        Launcher::default().start_rls(args, env)
    }
}

/// `sluice-service --rls` on a free port, its `--rls-config` a directory of its own holding
/// `limits.yaml`.
pub struct Rls {
    pub service: Service,
    pub dir: super::TempDir,
}

impl Rls {
    /// `redis` is `["--redis", url]` or `["--redis-cluster", urls]`; `extra` more arguments.
    pub fn start(redis: &[&str], limits: &str, extra: &[&str]) -> Rls {
        Rls::launch(Launcher::default(), redis, limits, extra)
    }

    /// As `start`, started by `launcher` (under a file descriptor limit, say).
    pub fn launch(launcher: Launcher, redis: &[&str], limits: &str, extra: &[&str]) -> Rls {
        let dir = super::TempDir::new("rls-config");
        let path = dir.path().join("limits.yaml");
        std::fs::write(&path, limits).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        let config = dir.path().to_string_lossy().into_owned();
        let rls = ["--rls", "127.0.0.1:0", "--rls-config", &config];
        let service = launcher.start_rls(&[redis, &rls[..], extra].concat(), &[]);
        Rls { service, dir }
    }

    /// Where the RLS answers gRPC.
    pub fn address(&self) -> SocketAddr {
        self.service
            .rls
            .expect("start_rls waits for the RLS address")
    }

    /// Replaces `limits.yaml` as a config tool should: a new file renamed over the old one.
    pub fn rewrite(&self, limits: &str) {
        self.write("limits.yaml", limits);
    }

    /// Writes `name` into the config directory the same way.
    pub fn write(&self, name: &str, yaml: &str) {
        let staged = self.dir.path().join(format!(".{name}.new"));
        let path = self.dir.path().join(name);
        std::fs::write(&staged, yaml)
            .and_then(|()| std::fs::rename(&staged, &path))
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }
}

/// How the binary is started: `Launcher::default()` is how `Service::start_with`, `spawn` and
/// `start_rls` start it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Launcher {
    fd_limit: Option<u64>,
}

impl Launcher {
    /// The service under `ulimit -n n`, soft and hard (the test process keeps its own limit).
    pub fn fd_limit(n: u64) -> Launcher {
        Launcher { fd_limit: Some(n) }
    }

    /// As `Service::start_with`.
    pub fn start_with(self, args: &[&str], env: &[(&str, &str)]) -> Service {
        let service = self.spawn(args, env);
        let ready = super::wait_for(READY_WITHIN, || {
            (super::http::get(service.addr, "/readyz").status == 200).then_some(())
        });
        assert!(ready.is_some(), "/readyz not 200 within {READY_WITHIN:?}");
        service
    }

    /// As `Service::spawn`.
    pub fn spawn(self, args: &[&str], env: &[(&str, &str)]) -> Service {
        let listen: &[&str] = if env.iter().any(|(name, _)| *name == "SLUICE_LISTEN") {
            &[]
        } else {
            &["--listen", "127.0.0.1:0"]
        };
        let mut service = self.launch(&[listen, args].concat(), env);
        let listening = service.event("listening", READY_WITHIN);
        let listening = listening.unwrap_or_else(|| panic!("no listening event"));
        let addr = listening["address"].as_str().and_then(|a| a.parse().ok());
        service.addr = addr.unwrap_or_else(|| panic!("no address in {listening}"));
        service.listening = listening;
        service
    }

    /// As `Service::start_rls`.
    pub fn start_rls(self, args: &[&str], env: &[(&str, &str)]) -> Service {
        let mut service = self.launch(args, env);
        let mut waiting = vec!["redis is up"];
        if args.contains(&"--rls") {
            waiting.push("rls listening");
        }
        if args.contains(&"--rlqs") {
            waiting.push("rlqs listening");
        }
        if args.contains(&"--listen") {
            waiting.push("listening");
        }
        let deadline = Instant::now() + READY_WITHIN;
        while !waiting.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            let event = service.next_event(left);
            let event = event.unwrap_or_else(|| panic!("still waiting for {waiting:?}"));
            let message = event["message"].as_str().unwrap_or_default();
            let address = event["address"].as_str().and_then(|a| a.parse().ok());
            match message {
                "rls listening" => service.rls = address,
                "rlqs listening" => service.rlqs = address,
                "listening" => {
                    service.addr = address.unwrap();
                    service.listening = event.clone();
                }
                _ => {}
            }
            waiting.retain(|&waited| waited != message);
        }
        service
    }

    fn launch(self, args: &[&str], env: &[(&str, &str)]) -> Service {
        let mut child = self
            .command(args, env)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = lines_of(child.stderr.take().unwrap());
        Service {
            child,
            addr: "0.0.0.0:0".parse().unwrap(),
            listening: serde_json::Value::Null,
            rls: None,
            rlqs: None,
            stderr,
        }
    }

    /// The binary with `args` and exactly the `SLUICE_*` settings in `env` (none inherited from
    /// the test's own environment), no stdin; under `sh -c 'ulimit -n N; exec ...'` with an fd
    /// limit, which keeps the binary's pid.
    fn command(self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut command = match self.fd_limit {
            None => Command::new(binary()),
            Some(limit) => {
                let mut sh = Command::new("sh");
                sh.args(["-c", r#"ulimit -n "$0" && exec "$@""#, &limit.to_string()]);
                sh.arg(binary());
                sh
            }
        };
        command.args(args);
        for name in SETTINGS {
            command.env_remove(name);
        }
        command.envs(env.iter().copied()).stdin(Stdio::null());
        command
    }
}

impl Service {
    /// The next log event (each line must be one JSON object), if one comes `within`.
    pub fn next_event(&self, within: Duration) -> Option<serde_json::Value> {
        let line = self.stderr.recv_timeout(within).ok()?;
        let event = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("a log line that is not JSON ({e}): {line}"));
        Some(event)
    }

    /// The next log event with this message, skipping the lines before it (each must be one
    /// JSON object).
    pub fn event(&self, message: &str, within: Duration) -> Option<serde_json::Value> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let event = self.next_event(left)?;
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

    /// The service's resident memory now, in KiB (`VmRSS` of /proc).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Its open file descriptors now.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .unwrap()
            .count()
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

/// Runs the binary to completion (bounded), returning its status, stdout and stderr.
pub fn run_to_exit(
    args: &[&str],
    env: &[(&str, &str)],
    within: Duration,
) -> (ExitStatus, String, String) {
    let mut child = Launcher::default()
        .command(args, env)
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

/// The admin API's token that `AdminTokens` gives `alice`...
pub const ADMIN_TOKEN: &str = "adm1n-token";
/// ...and its read-only token.
pub const READ_TOKEN: &str = "rEad-token";

/// The admin API's two token files, written in a test's directory.
pub struct AdminTokens {
    pub admin: std::path::PathBuf,
    pub read: std::path::PathBuf,
}

impl AdminTokens {
    /// `alice` holds `ADMIN_TOKEN`; `READ_TOKEN` reads.
    pub fn write(dir: &crate::TempDir) -> AdminTokens {
        let tokens = AdminTokens {
            admin: dir.path().join("admin"),
            read: dir.path().join("read"),
        };
        std::fs::write(&tokens.admin, format!("alice {ADMIN_TOKEN}\n")).unwrap();
        std::fs::write(&tokens.read, format!("{READ_TOKEN}\n")).unwrap();
        tokens
    }

    /// `--admin-token-file` and `--read-token-file`, for `Service::start_with`.
    pub fn args(&self) -> [&str; 4] {
        [
            "--admin-token-file",
            utf8(&self.admin),
            "--read-token-file",
            utf8(&self.read),
        ]
    }
}

fn utf8(path: &std::path::Path) -> &str {
    path.to_str().expect("a UTF-8 temporary path")
}
