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
//!
//! Two more agree request by request, in front of the test kit's LLM upstream: a token budget
//! per team and model (the usage each response reported, its debt, reservations from
//! `max_tokens`, usage missing, invalid and cut short), whose charges also equal Envoy's token
//! counters; and a concurrency limit, whose requests overlap in time (`/slow?ms=N`), each ending
//! when its `%DURATION%` says, with hundreds of milliseconds between an end and a later start.
#![cfg(not(target_arch = "wasm32"))]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use serde_json::{json, Value};
use sluice::limiter::PolicyOutcome;
use sluice::output::metrics::{
    requests_counter, tokens_counter, usage_unknown_counter, UsageUnknown,
};
use sluice_testkit::envoy::Envoy;
use sluice_testkit::llm::{post, LlmUpstream};
use sluice_testkit::TempDir;
use std::path::{Path, PathBuf};
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
/// per-route scope, the first of docs/configuration.md#per-route-scope).
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
    // Of a rollout to half the keys, tenant-c is in and tenant-x out (src/core/key.rs pins where a
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

/// Replays `log` (lines of Envoy's access log) through the configuration at `config`, with
/// `--check`: the JSON report, once every request is found to agree with Envoy.
fn replay_agreeing(dir: &Path, config: &Path, log: &[String]) -> Value {
    let log_path = dir.join("access.json");
    std::fs::write(&log_path, log.join("\n")).unwrap();
    let args = [
        "--config",
        config.to_str().unwrap(),
        "--log",
        log_path.to_str().unwrap(),
        "--check",
        "--format",
        "json",
    ];
    let report: Value = serde_json::from_str(&replay(&args, 0)).unwrap();
    let all = json!(log.len());
    assert_eq!(
        (&report["check"]["compared"], &report["check"]["agreed"]),
        (&all, &all),
        "{report:#}\n{}",
        log.join("\n")
    );
    assert_eq!(report["skipped"], json!(0), "{report:#}");
    report
}

/// A one-worker Envoy running `config` (written to `dir`) in front of `upstream`, with the
/// access log `--print-log-format` prints for it: the Envoy and the configuration's path.
fn envoy_logging(dir: &TempDir, config: &Value, upstream: &LlmUpstream) -> (Envoy, PathBuf) {
    let config_path = dir.path().join("config.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let envoy = Envoy::options(&config.to_string())
        .concurrency(1)
        .upstream(upstream.addr())
        .access_log(&printed_log_format(&config_path))
        .start();
    (envoy, config_path)
}

/// A budget of 1,000 tokens a day per team and model (the usage's total), each request reserving
/// what its `max_tokens` asks (100 when it does not), a key owing at most 500 past it.
fn token_budget() -> Value {
    json!({"policies": [{"name": "llm", "key": ["header:x-team", "body:model"],
        "requests": 1000, "per": "1d",
        "cost": {"from_response": {"usage": "total_tokens"},
                 "reserve": {"request": "max_tokens", "default": 100}, "max_debt": 500,
                 "on_unknown": "reserve"}}]})
}

/// One chat completion: the team, the model, its `max_tokens`, the upstream's `x-test-usage`,
/// whether it streams (a number: cut after that many events), and the status Envoy must answer.
struct Call {
    team: &'static str,
    model: &'static str,
    max_tokens: Option<u64>,
    usage: &'static str,
    stream: Option<u32>,
    status: u16,
}

const fn call(team: &'static str, model: &'static str, usage: &'static str, status: u16) -> Call {
    Call {
        team,
        model,
        max_tokens: None,
        usage,
        stream: None,
        status,
    }
}

/// Team a's m1 spends its day and runs into debt; m2 has its own budget; team b reserves from
/// `max_tokens` (capped at the budget), is refunded, then is refused a reservation its balance
/// does not cover; unknown usage (invalid, missing, a stream cut short) is charged the
/// reservation.
const CALLS: [Call; 10] = [
    // 1,000 - 100 reserved; 600 used: 400 left.
    call("a", "m1", "total=600", 200),
    // 300 left after the reservation; 600 used: 200 owed.
    call("a", "m1", "total=600", 200),
    call("a", "m1", "total=5", 429),
    call("a", "m2", "input=100,output=200", 200),
    Call {
        max_tokens: Some(5000),
        ..call("b", "m1", "total=50", 200)
    },
    Call {
        max_tokens: Some(980),
        ..call("b", "m1", "total=50", 429)
    },
    call("b", "m1", "bad", 200),
    call("c", "m1", "none", 200),
    Call {
        stream: Some(u32::MAX),
        ..call("c", "m2", "input=10,output=20", 200)
    },
    Call {
        stream: Some(1),
        ..call("d", "m1", "total=999", 200)
    },
];

impl Call {
    /// Sends it through `envoy`, one request at a time: its status.
    fn send(&self, envoy: &Envoy) -> u16 {
        let mut body =
            json!({"model": self.model, "messages": [{"role": "user", "content": "hi"}]});
        if let Some(max_tokens) = self.max_tokens {
            body["max_tokens"] = json!(max_tokens);
        }
        let cut = self.stream.filter(|&n| n < u32::MAX).map(|n| n.to_string());
        if self.stream.is_some() {
            body["stream"] = json!(true);
            body["stream_options"] = json!({"include_usage": true});
        }
        let mut headers = vec![("x-team", self.team), ("x-test-usage", self.usage)];
        if let Some(cut) = &cut {
            headers.push(("x-test-cut-after", cut));
        }
        let path = "/v1/chat/completions";
        post(envoy.addr(), path, &headers, &body.to_string())
            .unwrap_or_else(|e| panic!("POST {path}: {e}"))
            .status
    }
}

#[test]
fn a_token_budget_per_team_and_model_replays_as_envoy_charged_it_request_by_request() {
    let dir = TempDir::new("replay-tokens");
    let upstream = LlmUpstream::start();
    let (envoy, config_path) = envoy_logging(&dir, &token_budget(), &upstream);
    let statuses: Vec<u16> = CALLS.iter().map(|c| c.send(&envoy)).collect();
    let expected: Vec<u16> = CALLS.iter().map(|c| c.status).collect();
    assert_eq!(statuses, expected);
    let log = envoy.access_log(CALLS.len());
    let report = replay_agreeing(dir.path(), &config_path, &log);
    assert_counts_match(&report, &envoy);

    let tokens = &report["policies"]["llm"]["tokens"];
    let counter = |base: &str, replayed: &Value| {
        let name = tokens_counter("llm", base);
        let replayed = replayed.as_u64().unwrap();
        assert_eq!(
            envoy.wait_for_wasm_counter(&name, replayed),
            replayed,
            "{name}"
        );
    };
    counter("tokens_charged_total", &tokens["charged"]);
    counter("tokens_refunded_total", &tokens["refunded"]);
    counter("tokens_owed_total", &tokens["owed"]);
    // The stream cut short is settled when Envoy destroys it, after its line is written: its
    // line has no usage, which the replay counts as not logged, and charges alike.
    for why in UsageUnknown::ALL {
        let replayed = match why {
            UsageUnknown::Reset => &tokens["usage_unknown"]["not_logged"],
            _ => &tokens["usage_unknown"][why.as_str()],
        };
        let replayed = replayed.as_u64().unwrap();
        let name = usage_unknown_counter("llm", why);
        assert_eq!(
            envoy.wait_for_wasm_counter(&name, replayed),
            replayed,
            "{name}"
        );
    }
    let unknown = json!({"missing": 1, "invalid": 1, "reset": 0, "not_logged": 1});
    assert_eq!(
        (
            &tokens["owed"],
            &tokens["refused_in_debt"],
            &tokens["usage_unknown"]
        ),
        (&json!(200), &json!(1), &unknown),
        "{tokens:#}"
    );

    // What a looser budget, pricing output four times, would have done to the same traffic:
    // the requests Envoy refused have no usage in the log, and are charged what on_unknown says
    // (the reservation: none here).
    let looser = json!({"policies": [{"name": "llm", "key": ["header:x-team", "body:model"],
        "requests": 100000, "per": "1d", "cost": {"from_response":
        {"usage": {"input_tokens": 1, "output_tokens": 4}}, "on_unknown": "reserve"}}]});
    let looser_path = dir.path().join("looser.json");
    std::fs::write(&looser_path, looser.to_string()).unwrap();
    let log_path = dir.path().join("access.json");
    let args = [
        "--config",
        looser_path.to_str().unwrap(),
        "--log",
        log_path.to_str().unwrap(),
        "--format",
        "json",
    ];
    let looser: Value = serde_json::from_str(&replay(&args, 0)).unwrap();
    let tokens = &looser["policies"]["llm"]["tokens"];
    assert_eq!(looser["denied"], json!(0), "{looser:#}");
    // The upstream reports input and output 0 beside a total alone: only team a's m2 and team
    // c's stream cost anything, 100 + 4 × 200 and 10 + 4 × 20.
    assert_eq!(tokens["charged"], json!(990), "{tokens:#}");
    let unknown = json!({"missing": 1, "invalid": 1, "reset": 0, "not_logged": 3});
    assert_eq!(tokens["usage_unknown"], unknown, "{tokens:#}");
}

/// At most two requests of a user in flight.
fn two_in_flight() -> Value {
    json!({"policies": [{"name": "streams", "key": ["header:x-user-id"],
        "algorithm": "concurrency", "requests": 2}]})
}

/// (when it starts, in ms from the first; the user; how long the upstream takes, in ms; the
/// status Envoy must answer). Alice's first two hold her two slots until 600 and 700 ms; the
/// next two are refused; her two at 900 and 1,000 ms find both free again and hold them until
/// 1,300 and 1,400; the one at 1,150 is refused, the one at 1,600 passes. Bob has his own.
const OVERLAPPING: [(u64, &str, u64, u16); 10] = [
    (0, "alice", 600, 200),
    (100, "alice", 600, 200),
    (200, "alice", 0, 429),
    (250, "bob", 300, 200),
    (400, "alice", 0, 429),
    (900, "alice", 400, 200),
    (1000, "alice", 400, 200),
    (1150, "alice", 0, 429),
    (1150, "bob", 0, 200),
    (1600, "alice", 0, 200),
];

#[test]
fn a_concurrency_limit_replays_as_envoy_held_it_with_requests_overlapping_in_time() {
    let dir = TempDir::new("replay-concurrency");
    let upstream = LlmUpstream::start();
    let (envoy, config_path) = envoy_logging(&dir, &two_in_flight(), &upstream);
    let addr = envoy.addr();
    let start = Instant::now();
    let statuses: Vec<u16> = std::thread::scope(|threads| {
        let sent: Vec<_> = OVERLAPPING
            .iter()
            .map(|&(at, user, ms, _)| {
                threads.spawn(move || {
                    let at = start + Duration::from_millis(at);
                    std::thread::sleep(at.saturating_duration_since(Instant::now()));
                    let path = format!("/slow?ms={ms}");
                    let headers: [(&str, &[u8]); 1] = [("x-user-id", user.as_bytes())];
                    sluice_testkit::http::http_request(addr, "GET", &path, &headers)
                        .map_or(0, |r| r.status)
                })
            })
            .collect();
        sent.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let expected: Vec<u16> = OVERLAPPING.iter().map(|&(.., status)| status).collect();
    assert_eq!(
        statuses, expected,
        "the requests did not overlap as planned (is the machine overloaded?)"
    );
    let log = envoy.access_log(OVERLAPPING.len());
    let report = replay_agreeing(dir.path(), &config_path, &log);
    assert_counts_match(&report, &envoy);
    let streams = &report["policies"]["streams"];
    assert_eq!(streams["denied"], json!(3), "{report:#}");
    assert_eq!(streams["concurrency"]["peak"], json!(2), "{report:#}");
    assert_eq!(report["no_duration"], json!(0), "{report:#}");
}
