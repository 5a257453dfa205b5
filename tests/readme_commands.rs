//! The README's commands as a user runs them: `make run`, `make run-global` and `make run-rls`, each serving on
//! free ports for a few seconds, get the README's curl commands (its ports replaced by theirs)
//! and must give the answers the README promises. `make test` has built the wasm and the
//! service before the tests run, so the targets' build steps are no-ops here.

// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_testkit::http::http_request;
use sluice_testkit::{free_port, repo_root, send_signal, wait_for, TempDir, SIGKILL, SIGTERM};

const README: &str = include_str!("../README.md");

/// The make variables that set the ports, with the ports the README shows.
const PORTS: [(&str, u16); 6] = [
    ("LISTEN_PORT", 10000),
    ("ADMIN_PORT", 9901),
    ("SERVICE_PORT", 8080),
    ("REDIS_PORT", 6379),
    ("RLS_PORT", 8081),
    ("BACKEND_PORT", 10001),
];

const ALICE_EIGHT: &str = r"for i in $(seq 8); do curl -s -o /dev/null -w '%{http_code}\n' -H 'x-user-id: alice' localhost:10000/api/hello; done";
const ALICE_SEVEN: &str = r"for i in $(seq 7); do curl -s -o /dev/null -w '%{http_code}\n' -H 'x-user-id: alice' localhost:10000/api/hello; done";
const BOB: &str = "curl -si -H 'x-user-id: bob' localhost:10000/api/hello";
const STATS: &str = "curl -s localhost:9901/stats/prometheus | grep sluice_requests_total";
const METRICS: &str = "curl -s localhost:8080/metrics | grep sluice_";

/// Envoy's start (the targets' no-op builds included) and a bound on one README command.
const SERVE_WITHIN: Duration = Duration::from_secs(45);
const COMMAND_SECONDS: u32 = 20;
/// The filter hands its counters to Envoy once a second; the README says up to about 2 s.
const COUNTERS_WITHIN: Duration = Duration::from_secs(5);
const STOP_WITHIN: Duration = Duration::from_secs(5);

#[test]
fn make_run_gives_alice_five_200s_then_429s_bob_a_200_and_the_counters() {
    let run = Serving::start("run", &["LISTEN_PORT", "ADMIN_PORT"]);

    let alice = run.sh(ALICE_EIGHT);
    let bob = run.sh(BOB);
    let stats = run.stats_once_flushed(&[
        r#"sluice_requests_total{sluice_policy="per-user",sluice_outcome="allowed"} 6"#,
        r#"sluice_requests_total{sluice_policy="per-user",sluice_outcome="denied"} 3"#,
    ]);

    assert_eq!(alice, "200\n200\n200\n200\n200\n429\n429\n429\n");
    assert!(bob.starts_with("HTTP/1.1 200"), "bob: {bob}");
    assert!(stats.is_some(), "{}", run.last_stats());
    run.printed_the_commands(&[ALICE_EIGHT, BOB, STATS]);
}

#[test]
fn make_run_global_gives_alice_five_200s_then_429s_decided_by_the_service() {
    let run = Serving::start(
        "run-global",
        &["LISTEN_PORT", "ADMIN_PORT", "SERVICE_PORT", "REDIS_PORT"],
    );

    let alice = run.sh(ALICE_SEVEN);
    let metrics = run.sh(METRICS);
    let stats = run.stats_once_flushed(&[
        r#"sluice_requests_total{sluice_policy="global-user",sluice_outcome="allowed"} 5"#,
        r#"sluice_requests_total{sluice_policy="global-user",sluice_outcome="denied"} 2"#,
    ]);

    assert_eq!(alice, "200\n200\n200\n200\n200\n429\n429\n");
    assert!(stats.is_some(), "{}", run.last_stats());
    let checks = metric(&metrics, "sluice_service_checks_total");
    assert!(checks >= 1, "the service decided nothing:\n{metrics}");
    // With every call answered in time, the leases of 2 make the checks fewer than the
    // requests; a call that timed out on a busy machine is asked again.
    if run.callout_failures() == Some(0) {
        assert!(checks < 7, "{checks} checks for 7 requests:\n{metrics}");
    }
    run.printed_the_commands(&[ALICE_SEVEN, METRICS]);
}

#[test]
fn make_run_rls_gives_alice_five_200s_then_429s_decided_by_the_rls() {
    let run = Serving::start(
        "run-rls",
        &[
            "LISTEN_PORT",
            "ADMIN_PORT",
            "SERVICE_PORT",
            "REDIS_PORT",
            "RLS_PORT",
            "BACKEND_PORT",
        ],
    );

    let alice = run.sh(ALICE_SEVEN);
    let metrics = run.sh(METRICS);

    assert_eq!(alice, "200\n200\n200\n200\n200\n429\n429\n");
    let user = r#"sluice_service_rls_total_hits_total{domain="sluice-demo",descriptor="generic_key_api.user"}"#;
    assert_eq!(metric(&metrics, user), 7, "{metrics}");
    run.printed_the_commands(&[ALICE_SEVEN, METRICS]);
}

/// A make target serving in the foreground, in its own process group, which drop stops.
struct Serving {
    make: Child,
    /// (make variable, the README's port, this run's port)
    ports: Vec<(&'static str, u16, u16)>,
    dir: TempDir,
}

impl Serving {
    /// `make TARGET VAR=port...` from the repo root with a free port for each of `vars`, once
    /// Envoy's admin says LIVE.
    fn start(target: &str, vars: &[&'static str]) -> Serving {
        let ports: Vec<_> = PORTS
            .iter()
            .filter(|(var, _)| vars.contains(var))
            .map(|&(var, readme)| (var, readme, free_port()))
            .collect();
        let dir = TempDir::new("readme");
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

    fn port(&self, var: &str) -> u16 {
        let (_, _, port) = self.ports.iter().find(|(v, _, _)| *v == var).unwrap();
        *port
    }

    /// A README command with this run's ports in place of the README's.
    fn localised(&self, command: &str) -> String {
        self.ports
            .iter()
            .fold(command.to_string(), |command, (_, readme, port)| {
                command.replace(&format!("localhost:{readme}"), &format!("localhost:{port}"))
            })
    }

    /// Runs a command the README shows, with this run's ports, in sh; its standard output.
    fn sh(&self, command: &str) -> String {
        assert!(
            README.contains(command),
            "the README no longer shows {command}"
        );
        let out = Command::new("timeout")
            .args([
                &COMMAND_SECONDS.to_string(),
                "sh",
                "-c",
                &self.localised(command),
            ])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs the README's stats command until its output has every line of `lines`, as a user
    /// asks again while the counters lag; the output then, or `None` after COUNTERS_WITHIN.
    fn stats_once_flushed(&self, lines: &[&str]) -> Option<String> {
        wait_for(COUNTERS_WITHIN, || {
            let stats = self.sh(STATS);
            let shown = lines.iter().all(|want| stats.lines().any(|l| l == *want));
            shown.then_some(stats)
        })
    }

    /// `sluice.callout_failures`, read from the admin interface (the README does not show it).
    fn callout_failures(&self) -> Option<u64> {
        let admin = format!("127.0.0.1:{}", self.port("ADMIN_PORT"))
            .parse()
            .unwrap();
        let path = "/stats?filter=callout_failures";
        let stats = http_request(admin, "GET", path, &[]).ok()?.text();
        stats.lines().find_map(|l| {
            l.strip_prefix("wasmcustom.sluice.callout_failures: ")?
                .parse()
                .ok()
        })
    }

    fn last_stats(&self) -> String {
        format!(
            "counters not in /stats/prometheus within {COUNTERS_WITHIN:?}:\n{}",
            self.sh(STATS)
        )
    }

    /// What the target printed holds each command, with this run's ports.
    fn printed_the_commands(&self, commands: &[&str]) {
        let output = self.output();
        for command in commands {
            let command = self.localised(command);
            assert!(
                output.contains(&command),
                "make did not print {command}:\n{output}"
            );
        }
    }

    fn output(&self) -> String {
        let bytes = std::fs::read(self.dir.path().join("make.log")).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }
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

/// The sum of the samples `NAME VALUE` and `NAME{labels} VALUE` in `metrics`: a series over
/// all its labels.
fn metric(metrics: &str, name: &str) -> u64 {
    let samples: Vec<u64> = (metrics.lines())
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let labels_end = if rest.starts_with('{') {
                rest.find("} ")? + 1
            } else {
                0
            };
            rest.get(labels_end..)?.strip_prefix(' ')?.parse().ok()
        })
        .collect();
    assert!(!samples.is_empty(), "no {name} in:\n{metrics}");
    samples.iter().sum()
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
