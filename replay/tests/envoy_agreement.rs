//! `sluice-replay --check` agrees with a real Envoy on every request: a one-worker Envoy with the
//! built filter writes its access log in the format `--print-log-format` prints, through a mix of
//! keys, policies (token bucket, a fixed window rolled out to half its keys, a layered pair, a
//! shadow policy, a tier, a route's own policy and the route metadata that scopes it, a route
//! that switches the filter off) and bursts; the replay of that log, given Envoy's own
//! configuration file, gives the same answer to every request, and the same counts per policy
//! as Envoy's own counters.
//!
//! The filter decides with Envoy's clock when it runs, a little after the `%START_TIME%` the log
//! records. So the traffic keeps every decision far from a boundary of its limit: each token
//! bucket refills one token a second and each burst either drains it or finds it full again, so
//! its refill times fall at whole seconds after some burst's first request; bursts come half a
//! second off those (at 0, 1.5, 2.5 and 3.5 s); the hourly limits do not refill during the test;
//! and the fixed window's seconds (aligned to the Unix epoch) are met from 0.2 s in, for at most
//! `PHASE_LIMIT`. A burst takes a few milliseconds; the margins are hundreds.
#![cfg(not(target_arch = "wasm32"))]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use serde_json::{json, Value};
use sluice::limiter::PolicyOutcome;
use sluice::metrics::requests_counter;
use sluice_testkit::envoy::Envoy;
use sluice_testkit::TempDir;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A phase of traffic must end within this of its start to keep to the margins above.
const PHASE_LIMIT: Duration = Duration::from_millis(150);

fn config() -> Value {
    json!({"route_metadata": true, "policies": [
        {"name": "per-user", "match": {"path_prefix": "/api/"}, "key": ["header:x-user-id"],
         "requests": 1, "per": "1s", "burst": 3,
         "tiers": {"by": "header:x-plan", "values": {"gold": {"requests": 1, "per": "1s", "burst": 6}}}},
        {"name": "per-user-hour", "match": {"path_prefix": "/api/"}, "key": ["header:x-user-id"],
         "requests": 8, "per": "1h"},
        {"name": "per-tenant-window", "match": {"path_prefix": "/win/"}, "key": ["header:x-tenant"],
         "algorithm": "fixed_window", "requests": 4, "per": "1s",
         "rollout": {"enforce_percent": 50}},
        {"name": "per-ip-shadow", "key": ["ip"], "requests": 20, "per": "1h", "mode": "shadow"},
        {"name": "checkout-route", "match": {"routes": ["checkout"]}, "key": ["route"],
         "requests": 1, "per": "1s", "burst": 2},
        {"name": "static-cap", "match": {"path_prefix": "/static/"}, "key": ["global"],
         "requests": 1, "per": "1h", "burst": 1}
    ]})
}

/// The route `static` switches the filter off, so `static-cap` never applies (Envoy's own
/// per-route scope, the README's first).
fn static_route() -> (&'static str, &'static str, [&'static str; 1]) {
    (
        "static",
        "/static/",
        [
            r#"typed_per_filter_config: { envoy.filters.http.wasm: { "@type": type.googleapis.com/envoy.config.route.v3.FilterConfig, disabled: true } }"#,
        ],
    )
}

/// The route `checkout` keeps only its own policy, through its metadata.
fn checkout_route() -> (&'static str, &'static str, [&'static str; 1]) {
    (
        "checkout",
        "/checkout/",
        ["metadata: { filter_metadata: { sluice: { policies: [checkout-route] } } }"],
    )
}

fn replay_bin() -> &'static str {
    env!("CARGO_BIN_EXE_sluice-replay")
}

/// `sluice-replay ARGS`, which must exit with `code`; its standard output.
fn replay(args: &[&str], code: i32) -> String {
    let out = Command::new(replay_bin()).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(code),
        "{args:?}\n{stdout}\n{stderr}"
    );
    stdout
}

/// The `log_format` of the access log that `--print-log-format` prints, as JSON (which Envoy
/// reads as YAML).
fn printed_log_format(config: &Path) -> String {
    let printed = replay(
        &["--config", config.to_str().unwrap(), "--print-log-format"],
        0,
    );
    let field: Value = serde_yaml::from_str(&printed).unwrap();
    field["access_log"][0]["typed_config"]["log_format"].to_string()
}

/// Sleeps until the wall clock is `fraction` into a second.
fn wait_for_fraction(fraction: f64) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let into = f64::from(now.subsec_nanos()) / 1e9;
    let wait = (fraction - into).rem_euclid(1.0);
    std::thread::sleep(Duration::from_secs_f64(wait));
}

/// One request of a burst: (path, user or tenant header, plan).
type Send = (&'static str, &'static str, &'static str);

/// Bursts of traffic at `start`, `start + 1.5 s`, `+ 2.5 s`, `+ 3.5 s`: returns the statuses.
fn drive(envoy: &Envoy) -> Vec<u16> {
    let phases: [&[(Send, usize)]; 4] = [
        &[
            (("/api/a", "alice", ""), 5),
            (("/api/b", "bob", "gold"), 8),
            (("/api/c", "carol", "silver"), 2),
            (("/win/x", "tenant-x", ""), 6),
            (("/win/y", "tenant-c", ""), 3),
            (("/other", "", ""), 2),
            (("/checkout/a", "", ""), 4),
            (("/static/a", "alice", ""), 3),
        ],
        &[
            (("/api/a", "alice", ""), 3),
            (("/api/b", "bob", "gold"), 3),
            (("/win/x", "tenant-x", ""), 5),
        ],
        &[
            (("/api/a", "alice", ""), 2),
            (("/api/c", "carol", "silver"), 4),
            (("/win/y", "tenant-c", ""), 6),
            (("/checkout/b", "", ""), 2),
            (("/static/b", "bob", ""), 2),
        ],
        &[
            (("/api/a", "alice", ""), 3),
            (("/api/b", "bob", "gold"), 4),
            (("/win/x", "tenant-x", ""), 2),
        ],
    ];
    let offsets = [0.0, 1.5, 2.5, 3.5];
    wait_for_fraction(0.2);
    let start = Instant::now();
    let mut statuses = Vec::new();
    for (phase, offset) in phases.iter().zip(offsets) {
        let at = start + Duration::from_secs_f64(offset);
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        let began = Instant::now();
        for ((path, who, plan), count) in phase.iter() {
            for _ in 0..*count {
                let header = if path.starts_with("/win/") {
                    "x-tenant"
                } else {
                    "x-user-id"
                };
                let mut headers: Vec<(&str, &[u8])> = Vec::new();
                if !who.is_empty() {
                    headers.push((header, who.as_bytes()));
                }
                if !plan.is_empty() {
                    headers.push(("x-plan", plan.as_bytes()));
                }
                statuses.push(envoy.get(path, &headers).status);
            }
        }
        let took = began.elapsed();
        assert!(
            took < PHASE_LIMIT,
            "a burst took {took:?}: too long to keep decisions away from their limits' boundaries \
             (is the machine overloaded?)"
        );
    }
    statuses
}

#[test]
fn replaying_a_one_worker_envoys_access_log_agrees_on_every_request_and_every_count() {
    let dir = TempDir::new("replay-agreement");
    let config_path = dir.path().join("config.json");
    std::fs::write(&config_path, config().to_string()).unwrap();
    let (route, prefix, fields) = checkout_route();
    let (off, off_prefix, off_fields) = static_route();
    let envoy = Envoy::options(&config().to_string())
        .concurrency(1)
        .route(route, prefix, &fields)
        .route(off, off_prefix, &off_fields)
        .access_log(&printed_log_format(&config_path))
        .start();

    let statuses = drive(&envoy);
    let denied = statuses.iter().filter(|&&s| s == 429).count();
    assert!(denied >= 10 && denied < statuses.len() - 10, "{statuses:?}");
    let log = envoy.access_log(statuses.len()).join("\n");
    let log_path = dir.path().join("access.json");
    std::fs::write(&log_path, log).unwrap();

    // Envoy's own file: the replay reads the routes that switch the filter off from it.
    let bootstrap = envoy.dir().join("bootstrap.yaml");
    let args = [
        "--config",
        bootstrap.to_str().unwrap(),
        "--log",
        log_path.to_str().unwrap(),
    ];
    let out = replay(&[&args[..], &["--check", "--format", "json"]].concat(), 0);
    let report: Value = serde_json::from_str(&out).unwrap();
    let all = json!(statuses.len());
    assert_eq!(
        (&report["check"]["compared"], &report["check"]["agreed"]),
        (&all, &all),
        "{report:#}"
    );
    assert_eq!(
        (report["skipped"].clone(), report["denied"].clone()),
        (json!(0), json!(denied))
    );
    assert_eq!(report["filter_off"], json!(STATIC_REQUESTS), "{report:#}");
    assert_counts_match(&report, &envoy);
    assert_the_scenario(&report, statuses.len() as u64);
}

/// Each policy's counts in the report equal Envoy's counters (which the filter hands over once
/// a second: waited for).
fn assert_counts_match(report: &Value, envoy: &Envoy) {
    for (policy, counts) in report["policies"].as_object().unwrap() {
        for outcome in PolicyOutcome::ALL {
            let replayed = match outcome {
                PolicyOutcome::CanaryShadowDenied => &counts["rollout"]["shadowed"]["would_deny"],
                _ => &counts[outcome.as_str()],
            };
            let replayed = replayed.as_u64().unwrap_or(0);
            let name = requests_counter(policy, outcome);
            let envoys = envoy.wait_for_wasm_counter(&name, replayed);
            assert_eq!(
                replayed, envoys,
                "{name}: the replay's count against Envoy's"
            );
        }
    }
}

/// Requests `drive` sends to the route `static`.
const STATIC_REQUESTS: u64 = 5;

/// The traffic exercised what it was meant to: a tier, the shadow policy, the route's policy and
/// its metadata, the route without the filter, both groups of the rollout.
fn assert_the_scenario(report: &Value, requests: u64) {
    let policy = |name: &str, field: &str| report["policies"][name][field].as_u64().unwrap();
    assert_eq!(
        report["policies"]["per-user"]["tiers"]["gold"]["matched"],
        json!(15)
    );
    assert!(policy("per-ip-shadow", "shadow_denied") > 0);
    assert_eq!(
        (
            policy("checkout-route", "allowed"),
            policy("checkout-route", "denied")
        ),
        (4, 2),
        "burst 2, then a bucket full again 2.5 s later"
    );
    // Of a rollout to half the keys, tenant-c is in and tenant-x out (src/key.rs pins where a
    // key falls).
    let rollout = &report["policies"]["per-tenant-window"]["rollout"];
    assert_eq!(
        (
            rollout["enforced"]["matched"].clone(),
            rollout["shadowed"]["matched"].clone()
        ),
        (json!(9), json!(13))
    );
    assert_eq!(rollout["shadowed"]["would_deny"], json!(3), "{rollout:#}");
    assert_eq!(
        policy("per-ip-shadow", "matched"),
        requests - 6 - STATIC_REQUESTS,
        "the checkout route's metadata leaves the shadow policy out, and the filter never saw \
         the static route's requests"
    );
    assert_eq!(policy("static-cap", "matched"), 0);
}
