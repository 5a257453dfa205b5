//! A make target that serves in the foreground (`make run`, `make run-global`, `make run-rls`), as
//! a user starts it from the docs, on free ports: every port variable of the Makefile gets one,
//! and the docs' commands are run with their default ports replaced by those. The targets build
//! first; under `make test` the wasm and the service are built already, so that is a no-op.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::http::http_request;
use crate::{free_port, repo_root, send_signal, TempDir, SIGKILL, SIGTERM};

/// Envoy's start (the targets' no-op builds included) and a bound on one command.
const SERVE_WITHIN: Duration = Duration::from_secs(45);
const COMMAND_SECONDS: u32 = 20;
const STOP_WITHIN: Duration = Duration::from_secs(5);

/// The Makefile's port variables and their defaults, the ports the docs show:
/// `LISTEN_PORT := 10000` and the like.
pub fn default_ports() -> Vec<(String, u16)> {
    let makefile = std::fs::read_to_string(repo_root().join("Makefile")).expect("the Makefile");
    let ports: Vec<(String, u16)> = makefile
        .lines()
        .filter_map(|line| {
            let (var, value) = line.split_once(" := ")?;
            let port = value.trim().parse().ok()?;
            var.ends_with("_PORT").then(|| (var.to_string(), port))
        })
        .collect();
    assert!(!ports.is_empty(), "no `NAME_PORT := N` in the Makefile");
    ports
}

/// A make target serving in the foreground, in its own process group, which drop stops.
pub struct Serving {
    make: Child,
    /// (make variable, its default port, this run's port)
    ports: Vec<(String, u16, u16)>,
    dir: TempDir,
}

impl Serving {
    /// `make TARGET VAR=port...` from the repo root with a free port for each port variable,
    /// once Envoy's admin (`ADMIN_PORT`) says LIVE.
    pub fn start(target: &str) -> Serving {
        let ports: Vec<_> = default_ports()
            .into_iter()
            .map(|(var, default)| (var, default, free_port()))
            .collect();
        let dir = TempDir::new("make");
        let out = File::create(dir.path().join("make.log")).unwrap();
        let make = Command::new("make")
            .arg(target)
            .args(ports.iter().map(|(var, _, port)| format!("{var}={port}")))
            .current_dir(repo_root())
            // As a user types it, not as a sub-make of `make test`.
            .env_remove("MAKEFLAGS")
            .env_remove("MAKELEVEL")
            .env_remove("MFLAGS")
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("make must be installed");
        let mut serving = Serving { make, ports, dir };
        serving.wait_until_live(target);
        serving
    }

    fn wait_until_live(&mut self, target: &str) {
        let admin = format!("127.0.0.1:{}", self.port("ADMIN_PORT"))
            .parse()
            .unwrap();
        let deadline = Instant::now() + SERVE_WITHIN;
        loop {
            if let Ok(Some(status)) = self.make.try_wait() {
                panic!("make {target} exited ({status}):\n{}", self.output());
            }
            let live = http_request(admin, "GET", "/ready", &[]);
            if live.is_ok_and(|r| r.status == 200 && r.text().trim() == "LIVE") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "make {target}: Envoy not LIVE within {SERVE_WITHIN:?}:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// This run's port for the make variable `var`.
    pub fn port(&self, var: &str) -> u16 {
        let found = self.ports.iter().find(|(v, _, _)| v == var);
        found.map(|(_, _, port)| *port).unwrap_or_else(|| {
            panic!("no {var} in the Makefile");
        })
    }

    /// A command of the docs with this run's ports in place of the defaults.
    pub fn localised(&self, command: &str) -> String {
        self.ports
            .iter()
            .fold(command.to_string(), |command, (_, default, port)| {
                command.replace(
                    &format!("localhost:{default}"),
                    &format!("localhost:{port}"),
                )
            })
    }

    /// Runs a command of the docs, with this run's ports, in sh from the repo root: its
    /// standard output.
    pub fn sh(&self, command: &str) -> String {
        sh(&self.localised(command))
    }

    /// What the target printed holds each command, with this run's ports.
    pub fn printed_the_commands(&self, commands: &[&str]) {
        let output = self.output();
        for command in commands {
            let command = self.localised(command);
            assert!(
                output.contains(&command),
                "make did not print {command}:\n{output}"
            );
        }
    }

    /// What make and what it started printed so far.
    pub fn output(&self) -> String {
        let bytes = std::fs::read(self.dir.path().join("make.log")).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Runs `command` in sh from the repo root, bounded in time: its standard output. The
/// workspace's debug binaries (`sluice-service`, ...) come first on its PATH, as installed ones
/// would be for a user typing the docs' commands.
pub fn sh(command: &str) -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    let binaries = crate::target_dir().join("debug");
    let out = Command::new("timeout")
        .args([&COMMAND_SECONDS.to_string(), "sh", "-c", command])
        .env("PATH", format!("{}:{path}", binaries.display()))
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Drop for Serving {
    /// SIGTERM to the whole group (make, the shell, Envoy, Redis, the service), SIGKILL to
    /// whatever is left after STOP_WITHIN.
    fn drop(&mut self) {
        let group = -i32::try_from(self.make.id()).unwrap();
        send_signal(group, SIGTERM);
        let deadline = Instant::now() + STOP_WITHIN;
        while Instant::now() < deadline && matches!(self.make.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        send_signal(group, SIGKILL);
        let _ = self.make.wait();
        if std::thread::panicking() {
            eprintln!("--- what make printed ---\n{}", tail(&self.output(), 60));
        }
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
