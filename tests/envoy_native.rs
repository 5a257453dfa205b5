//! sluice behaving as Envoy's own rate-limit filters do, through a real Envoy: gRPC clients get
//! gRPC answers (a real grpcio client and server, over an HTTP/2 upstream), each refusal and
//! each would-be denial shows in the access log with its policy, mode and key, Prometheus gets
//! one labelled series per policy and outcome, and a policy's denial answer is configurable.
//!
//! The access log format and the stats tags are the ones `envoy/demo.yaml` ships, read from it.

// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use serde_json::{json, Value};
use sluice::limiter::PolicyOutcome;
use sluice::output::metrics::{requests_counter, tag_regex, LABELS};
use sluice_testkit::envoy::{Envoy, EnvoyOptions};
use sluice_testkit::grpc::{grpc_calls, GrpcCall, GrpcServer};
use sluice_testkit::repo_root;
use std::path::{Path, PathBuf};

fn yaml(path: &Path) -> serde_yaml::Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The first value under `key` anywhere in `doc`.
fn find<'a>(doc: &'a serde_yaml::Value, key: &str) -> Option<&'a serde_yaml::Value> {
    match doc {
        serde_yaml::Value::Mapping(map) => map
            .get(key)
            .or_else(|| map.values().find_map(|v| find(v, key))),
        serde_yaml::Value::Sequence(items) => items.iter().find_map(|v| find(v, key)),
        _ => None,
    }
}

fn demo() -> serde_yaml::Value {
    yaml(&repo_root().join("envoy/demo.yaml"))
}

/// The `stats_config` of `envoy/demo.yaml`, as JSON.
fn demo_stats_config() -> Value {
    let demo = demo();
    let stats = find(&demo, "stats_config").expect("demo.yaml has a stats_config");
    serde_json::to_value(stats).unwrap()
}

/// `options` with the access log format and the stats config of `envoy/demo.yaml`.
fn as_the_demo(options: EnvoyOptions) -> EnvoyOptions {
    let demo = demo();
    let log_format = find(&demo, "access_log")
        .and_then(|logs| find(logs, "log_format"))
        .expect("demo.yaml has an access log");
    options
        .stats_config(&demo_stats_config().to_string())
        .access_log(&serde_json::to_string(log_format).unwrap())
}

/// One access-log line of the demo's format: `"<request>" <status> <details> <sluice record>`.
#[derive(Debug, PartialEq, Eq)]
struct Logged {
    status: String,
    details: String,
    /// The record's fields but the key, and the key.
    record: String,
    key: String,
}

fn logged(line: &str) -> Logged {
    let after_request = line.rsplit_once("\" ").map_or("", |(_, rest)| rest);
    let mut words = after_request.splitn(3, ' ');
    let (status, details) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let record = words.next().unwrap_or("");
    let (record, key) = record.rsplit_once(" key=").unwrap_or((record, ""));
    Logged {
        status: status.into(),
        details: details.into(),
        record: record.into(),
        key: key.into(),
    }
}

fn log_of(envoy: &Envoy, n: usize) -> Vec<Logged> {
    let lines = envoy.access_log(n);
    assert_eq!(lines.len(), n, "access log:\n{}", lines.join("\n"));
    lines.iter().map(|l| logged(l)).collect()
}

/// The value of one Prometheus series, `name{labels}` written as Envoy writes it.
fn series(envoy: &Envoy, name: &str, labels: &[(&str, &str)]) -> Option<u64> {
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    let wanted = format!("{name}{{{}}} ", labels.join(","));
    let text = envoy.prometheus();
    let line = text.lines().find(|l| l.starts_with(&wanted))?;
    line[wanted.len()..].trim().parse().ok()
}

/// Polls `series` until it reads `expected` (counters reach Envoy about once a second).
fn wait_for_series(envoy: &Envoy, policy: &str, outcome: &str, expected: u64) -> Option<u64> {
    let labels = [("sluice_policy", policy), ("sluice_outcome", outcome)];
    let mut last = None;
    for _ in 0..100 {
        last = series(envoy, "sluice_requests_total", &labels);
        if last == Some(expected) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    last
}

fn per_user(name: &str, burst: u64, extra: Value) -> Value {
    let mut policy = json!({"name": name, "key": ["header:x-user-id"], "requests": 1, "per": "1h",
        "burst": burst});
    for (k, v) in extra.as_object().unwrap() {
        policy[k] = v.clone();
    }
    policy
}

fn codes(calls: &[GrpcCall]) -> Vec<&str> {
    calls.iter().map(|c| c.code.as_str()).collect()
}

// --- gRPC.

#[test]
fn a_grpc_call_over_its_limit_gets_resource_exhausted_naming_the_policy_with_retry_after() {
    let server = GrpcServer::start();
    let config = json!({"policies": [
        per_user("per-user", 2, json!({})),
        {"name": "per-key", "key": ["header:x-api-key"], "requests": 1, "per": "1h", "burst": 1,
         "denial": {"grpc_status": "unavailable"}},
    ]});
    let envoy = as_the_demo(Envoy::options(&config.to_string()))
        .grpc_upstream(server.addr())
        .start();

    let alice = grpc_calls(envoy.addr(), 3, &[("x-user-id", "alice")]);
    let keyed = grpc_calls(envoy.addr(), 2, &[("x-api-key", "k1")]);

    assert_eq!(codes(&alice), ["OK", "OK", "RESOURCE_EXHAUSTED"]);
    let denied = &alice[2];
    assert_eq!(
        denied.details,
        "too_many_requests: policy per-user, retry after 3600s"
    );
    for (name, value) in [
        ("retry-after", "3600"),
        ("x-ratelimit-limit", "2"),
        ("x-ratelimit-remaining", "0"),
    ] {
        assert_eq!(
            denied.metadata.get(name).map(String::as_str),
            Some(value),
            "{name}: {denied:?}"
        );
    }
    assert_eq!(
        codes(&keyed),
        ["OK", "UNAVAILABLE"],
        "per-key's own grpc_status"
    );
    assert_eq!(
        keyed[1].details,
        "too_many_requests: policy per-key, retry after 3600s"
    );

    let log = log_of(&envoy, 5);
    let (allowed, refused) = (&log[0], &log[2]);
    assert_eq!(
        (allowed.details.as_str(), allowed.record.as_str()),
        ("via_upstream", "-")
    );
    assert_eq!(refused.details, "sluice_rate_limited");
    assert_eq!(
        refused.record,
        "outcome=denied policy=per-user mode=enforce"
    );
    assert_eq!(log[4].record, "outcome=denied policy=per-key mode=enforce");
}

#[test]
fn a_shadow_policy_lets_grpc_calls_through_and_logs_and_counts_its_would_be_denials() {
    let server = GrpcServer::start();
    let config = json!({"policies": [per_user("trial", 1, json!({"mode": "shadow"}))]});
    let envoy = as_the_demo(Envoy::options(&config.to_string()))
        .grpc_upstream(server.addr())
        .start();

    let calls = grpc_calls(envoy.addr(), 3, &[("x-user-id", "alice")]);

    assert_eq!(codes(&calls), ["OK", "OK", "OK"]);
    let log = log_of(&envoy, 3);
    assert_eq!(log[0].record, "-", "nothing to show while within the limit");
    for would_be in &log[1..] {
        assert_eq!(would_be.details, "via_upstream");
        assert_eq!(
            would_be.record,
            "outcome=shadow_denied policy=trial mode=shadow"
        );
        assert_eq!(would_be.key.len(), 16, "{would_be:?}");
    }
    assert_eq!(
        wait_for_series(&envoy, "trial", "shadow_denied", 2),
        Some(2)
    );
    assert_eq!(wait_for_series(&envoy, "trial", "allowed", 1), Some(1));
}

#[test]
fn a_grpc_call_under_a_policy_that_fails_closed_gets_unavailable() {
    let server = GrpcServer::start();
    let config = json!({
        "global": {"cluster": "sluice_service", "authority": "sluice-service", "timeout": "100ms"},
        "policies": [per_user("global-user", 10, json!({"scope": "global", "failure_mode": "closed"}))],
    });
    let envoy = as_the_demo(Envoy::options(&config.to_string()))
        .service(&[])
        .grpc_upstream(server.addr())
        .start();

    let calls = grpc_calls(envoy.addr(), 1, &[("x-user-id", "alice")]);

    assert_eq!(codes(&calls), ["UNAVAILABLE"]);
    assert_eq!(
        calls[0].details,
        "rate_limit_unavailable: policy global-user, retry after 1s"
    );
    assert_eq!(
        calls[0].metadata.get("retry-after").map(String::as_str),
        Some("1")
    );
    let log = log_of(&envoy, 1);
    assert_eq!(log[0].details, "sluice_unavailable");
    assert_eq!(
        log[0].record,
        "outcome=denied policy=global-user mode=enforce"
    );
}

// --- Access logs over plain HTTP.

#[test]
fn the_access_log_shows_a_denials_details_policy_and_key_which_a_bypass_then_takes() {
    let config = |bypass: Value| {
        json!({"policies": [per_user("per-user", 1, json!({}))], "bypass": bypass}).to_string()
    };
    let alice = [("x-user-id", &b"alice"[..])];
    let bob = [("x-user-id", &b"bob"[..])];
    let envoy = as_the_demo(Envoy::options(&config(json!([])))).start();

    let statuses: Vec<u16> = [&alice, &alice, &bob]
        .iter()
        .map(|user| envoy.get("/api/x", &user[..]).status)
        .collect();

    assert_eq!(statuses, [200, 429, 200]);
    let log = log_of(&envoy, 3);
    let seen = |l: &Logged| (l.status.clone(), l.details.clone(), l.record.clone());
    let line = |status: &str, details: &str, record: &str| {
        (status.to_string(), details.to_string(), record.to_string())
    };
    assert_eq!(seen(&log[0]), line("200", "direct_response", "-"));
    assert_eq!(
        seen(&log[1]),
        line(
            "429",
            "sluice_rate_limited",
            "outcome=denied policy=per-user mode=enforce"
        )
    );
    let key = &log[1].key;
    assert!(
        key.len() == 16 && key.bytes().all(|b| b.is_ascii_hexdigit()),
        "{key}"
    );

    // The operator exempts the key the log shows: alice passes, logged as bypassed; bob does not.
    let bypass = json!([{"key_hash": key, "policies": ["per-user"], "owner": "oncall",
        "reason": "INC-7", "expires": "2099-01-01T00:00:00Z"}]);
    let envoy = as_the_demo(Envoy::options(&config(bypass))).start();
    let statuses: Vec<u16> = [&alice, &alice, &bob, &bob]
        .iter()
        .map(|user| envoy.get("/api/x", &user[..]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
    let log = log_of(&envoy, 4);
    for bypassed in &log[..2] {
        assert_eq!(
            bypassed.record,
            "outcome=bypassed policy=per-user mode=enforce"
        );
        assert_eq!(&bypassed.key, key);
    }
    assert_eq!(log[3].record, "outcome=denied policy=per-user mode=enforce");
    assert_ne!(&log[3].key, key);
}

// --- Labelled metrics.

/// With the demo's stats tags and the stats matcher docs/deployment.md#istio gives Istio users
/// (`proxyStatsMatcher`), which keeps sluice's counters and drops Envoy's own.
#[test]
fn prometheus_labels_each_policy_apart_even_names_that_flatten_alike() {
    let config = json!({"policies": [
        per_user("per-user", 1, json!({})),
        per_user("per_user", 2, json!({})),
        per_user("per.user", 1, json!({"mode": "shadow"})),
    ]});
    let mut stats = demo_stats_config();
    stats["stats_matcher"] =
        json!({"inclusion_list": {"patterns": [{"prefix": "wasmcustom.sluice"}]}});
    let envoy = as_the_demo(Envoy::options(&config.to_string()))
        .stats_config(&stats.to_string())
        .start();

    let statuses: Vec<u16> = (0..4)
        .map(|_| envoy.get("/", &[("x-user-id", b"alice")]).status)
        .collect();

    // per-user denies from the second request on, so the others are charged once: per_user
    // allows the first and has no part in the denied ones, per.user (shadow) would deny those.
    assert_eq!(statuses, [200, 429, 429, 429]);
    for (policy, outcome, expected) in [
        ("per-user", "allowed", 1),
        ("per-user", "denied", 3),
        ("per_user", "allowed", 1),
        ("per_user", "denied", 0),
        ("per.user", "allowed", 1),
        ("per.user", "shadow_denied", 3),
    ] {
        assert_eq!(
            wait_for_series(&envoy, policy, outcome, expected),
            Some(expected),
            "{policy} {outcome}:\n{}",
            envoy.prometheus()
        );
    }
    assert!(
        !envoy
            .prometheus()
            .contains("envoy_http_downstream_rq_total"),
        "the matcher keeps only sluice's counters"
    );
    // /stats keeps the whole name, labels and all.
    let name = requests_counter("per.user", PolicyOutcome::ShadowDenied);
    assert_eq!(envoy.wasm_counter(&name), Some(3), "{name}");
}

/// Files in `envoy/` that are Envoy bootstraps running the sluice filter (envoy/rls.yaml runs
/// Envoy's own rate-limit filter, which has no counters of sluice's).
fn shipped_bootstraps_with_sluice() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join("envoy"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            std::fs::read_to_string(path).is_ok_and(|t| {
                t.contains("static_resources") && t.contains("envoy.filters.http.wasm")
            })
        })
        .collect();
    files.sort();
    files
}

#[test]
fn every_shipped_bootstrap_with_sluice_turns_each_label_into_a_stats_tag() {
    let bootstraps = shipped_bootstraps_with_sluice();
    assert!(bootstraps.len() >= 2, "{bootstraps:?}");
    for path in bootstraps {
        let doc = yaml(&path);
        let tags = &doc["stats_config"]["stats_tags"];
        for label in LABELS {
            let tag = tags
                .as_sequence()
                .and_then(|t| t.iter().find(|t| t["tag_name"].as_str() == Some(label)));
            assert_eq!(
                tag.and_then(|t| t["regex"].as_str()),
                Some(tag_regex(label).as_str()),
                "{}: stats_tags for {label}",
                path.display()
            );
        }
    }
}

// --- The denial answer.

#[test]
fn a_configured_denial_answers_with_its_status_body_and_content_type() {
    let config = json!({
        "headers": "legacy",
        "denial": {"status": 503, "body": "{\"message\":\"slow down\"}"},
        "policies": [
            per_user("per-user", 1, json!({})),
            {"name": "per-key", "key": ["header:x-api-key"], "requests": 1, "per": "1h", "burst": 1,
             "denial": {"status": 403, "body": "quota used up\n", "content_type": "text/plain"}},
        ],
    });
    let envoy = as_the_demo(Envoy::options(&config.to_string())).start();

    envoy.get("/", &[("x-user-id", b"alice")]);
    let top = envoy.get("/", &[("x-user-id", b"alice")]);
    envoy.get("/", &[("x-api-key", b"k1")]);
    let own = envoy.get("/", &[("x-api-key", b"k1")]);

    assert_eq!(
        (top.status, top.text().as_str()),
        (503, r#"{"message":"slow down"}"#)
    );
    assert_eq!(top.header("content-type"), Some("application/json"));
    assert_eq!(top.header("retry-after"), Some("3600"));
    assert_eq!(top.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!((own.status, own.text().as_str()), (403, "quota used up\n"));
    assert_eq!(own.header("content-type"), Some("text/plain"));
    let log = log_of(&envoy, 4);
    assert_eq!(
        (log[1].status.as_str(), log[1].details.as_str()),
        ("503", "sluice_rate_limited")
    );
    assert_eq!(
        (log[3].status.as_str(), log[3].details.as_str()),
        ("403", "sluice_rate_limited")
    );
}
