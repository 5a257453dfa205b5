//! The README's commands as a user runs them: `make run`, `make run-llm`, `make run-global` and
//! `make run-rls`, each serving on free ports for a few seconds, get the README's curl commands (its ports replaced by theirs)
//! and must give the answers the README promises. `make test` has built the wasm and the
//! service before the tests run, so the targets' build steps are no-ops here.

// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use sluice_testkit::http::http_request;
use sluice_testkit::make::Serving;
use sluice_testkit::wait_for;

const README: &str = include_str!("../README.md");

const ALICE_EIGHT: &str = r"for i in $(seq 8); do curl -s -o /dev/null -w '%{http_code}\n' -H 'x-user-id: alice' localhost:10000/api/hello; done";
const ALICE_SEVEN: &str = r"for i in $(seq 7); do curl -s -o /dev/null -w '%{http_code}\n' -H 'x-user-id: alice' localhost:10000/api/hello; done";
const BOB: &str = "curl -si -H 'x-user-id: bob' localhost:10000/api/hello";
const STATS: &str = "curl -s localhost:9901/stats/prometheus | grep sluice_requests_total";
const TEAM_A_SIX: &str = r"for i in $(seq 6); do curl -s -o /dev/null -w '%{http_code}\n' -H 'x-api-key: team-a' localhost:10000/v1/chat/completions; done";
const TOKENS: &str = "curl -s localhost:9901/stats/prometheus | grep sluice_tokens_charged_total";
const METRICS: &str = "curl -s localhost:8080/metrics | grep sluice_";

/// The filter hands its counters to Envoy once a second; the README says up to about 2 s.
const COUNTERS_WITHIN: Duration = Duration::from_secs(5);

#[test]
fn make_run_gives_alice_five_200s_then_429s_bob_a_200_and_the_counters() {
    let run = Serving::start("run");

    let alice = sh(&run, ALICE_EIGHT);
    let bob = sh(&run, BOB);
    let stats = stats_once_flushed(
        &run,
        &[
            r#"sluice_requests_total{sluice_policy="per-user",sluice_outcome="allowed"} 6"#,
            r#"sluice_requests_total{sluice_policy="per-user",sluice_outcome="denied"} 3"#,
        ],
    );

    assert_eq!(alice, "200\n200\n200\n200\n200\n429\n429\n429\n");
    assert!(bob.starts_with("HTTP/1.1 200"), "bob: {bob}");
    assert!(stats.is_some(), "{}", last_stats(&run));
    run.printed_the_commands(&[ALICE_EIGHT, BOB, STATS]);
}

#[test]
fn make_run_llm_gives_team_a_four_calls_on_its_token_budget_then_429s() {
    let run = Serving::start("run-llm");

    let team_a = sh(&run, TEAM_A_SIX);
    let charged = wait_for(COUNTERS_WITHIN, || {
        let stats = sh(&run, TOKENS);
        let line = r#"sluice_tokens_charged_total{sluice_policy="llm-tokens"} 6000"#;
        stats.lines().any(|l| l == line).then_some(stats)
    });

    // 5,000 tokens a minute, 500 reserved and 1,500 charged a call: three calls leave 500, the
    // fourth reserves them and leaves the key about 1,000 in debt.
    assert_eq!(team_a, "200\n200\n200\n200\n429\n429\n");
    assert!(charged.is_some(), "{}", sh(&run, TOKENS));
    run.printed_the_commands(&[TEAM_A_SIX, TOKENS]);
}

#[test]
fn make_run_global_gives_alice_five_200s_then_429s_decided_by_the_service() {
    let run = Serving::start("run-global");

    let alice = sh(&run, ALICE_SEVEN);
    let metrics = sh(&run, METRICS);
    let stats = stats_once_flushed(
        &run,
        &[
            r#"sluice_requests_total{sluice_policy="global-user",sluice_outcome="allowed"} 5"#,
            r#"sluice_requests_total{sluice_policy="global-user",sluice_outcome="denied"} 2"#,
        ],
    );

    assert_eq!(alice, "200\n200\n200\n200\n200\n429\n429\n");
    assert!(stats.is_some(), "{}", last_stats(&run));
    let checks = metric(&metrics, "sluice_service_checks_total");
    assert!(checks >= 1, "the service decided nothing:\n{metrics}");
    // With every call answered in time, the leases of 2 make the checks fewer than the
    // requests; a call that timed out on a busy machine is asked again.
    if callout_failures(&run) == Some(0) {
        assert!(checks < 7, "{checks} checks for 7 requests:\n{metrics}");
    }
    run.printed_the_commands(&[ALICE_SEVEN, METRICS]);
}

#[test]
fn make_run_rls_gives_alice_five_200s_then_429s_decided_by_the_rls() {
    // On a machine too busy, Envoy's first calls to the RLS can outlast envoy/rls.yaml's 100 ms
    // timeout and pass by failure_mode_deny: false, uncounted: once more, on a fresh start.
    let attempt = || {
        let run = Serving::start("run-rls");
        let alice = sh(&run, ALICE_SEVEN);
        let metrics = sh(&run, METRICS);
        run.printed_the_commands(&[ALICE_SEVEN, METRICS]);
        let user = r#"sluice_service_rls_total_hits_total{domain="sluice-demo",descriptor="generic_key_api.user"}"#;
        (alice, metric(&metrics, user), metrics)
    };
    let mut ran = attempt();
    if ran.1 != 7 {
        eprintln!(
            "{} hits counted of 7: trying once more, on a fresh start",
            ran.1
        );
        ran = attempt();
    }
    let (alice, hits, metrics) = ran;
    assert_eq!(alice, "200\n200\n200\n200\n200\n429\n429\n");
    assert_eq!(hits, 7, "{metrics}");
}

/// Runs a command the README shows, with the run's ports: its standard output.
fn sh(run: &Serving, command: &str) -> String {
    assert!(
        README.contains(command),
        "the README no longer shows {command}"
    );
    run.sh(command)
}

/// Runs the README's stats command until its output has every line of `lines`, as a user asks
/// again while the counters lag; the output then, or `None` after COUNTERS_WITHIN.
fn stats_once_flushed(run: &Serving, lines: &[&str]) -> Option<String> {
    wait_for(COUNTERS_WITHIN, || {
        let stats = sh(run, STATS);
        let shown = lines.iter().all(|want| stats.lines().any(|l| l == *want));
        shown.then_some(stats)
    })
}

/// `sluice.callout_failures`, read from the admin interface (the README does not show it).
fn callout_failures(run: &Serving) -> Option<u64> {
    let admin = format!("127.0.0.1:{}", run.port("ADMIN_PORT"))
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

fn last_stats(run: &Serving) -> String {
    format!(
        "counters not in /stats/prometheus within {COUNTERS_WITHIN:?}:\n{}",
        sh(run, STATS)
    )
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
