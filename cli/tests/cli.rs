//! The `sluice` command against the real service over a real Redis: overrides set, listed and
//! deleted, a key shown, reset and credited once, tables by default and JSON with `--json`,
//! errors that say what the service said, and `sluice replay` as `sluice-replay`.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::{AdminTokens, Service};
use sluice_testkit::TempDir;

fn sluice(service: &Service, token_file: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .env("SLUICE_SERVICE", format!("http://{}", service.addr))
        .env("SLUICE_ADMIN_TOKEN_FILE", token_file)
        .env_remove("SLUICE_ADMIN_TOKEN")
        .output()
        .unwrap()
}

fn ok(output: &Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    stdout
}

const KEY: [&str; 8] = [
    "--policy",
    "api",
    "--key-hash",
    "00000000000000ac",
    "--requests",
    "5",
    "--per",
    "1m",
];

#[test]
fn an_operator_overrides_shows_resets_and_credits_a_key() {
    let redis = RedisServer::start();
    let dir = TempDir::new("cli");
    let tokens = AdminTokens::write(&dir);
    let (admin, read) = (&tokens.admin, &tokens.read);
    let url = redis.url();
    let args: Vec<&str> = ["--redis", &url].into_iter().chain(tokens.args()).collect();
    let service = Service::start_with(&args, &[]);

    let set = [
        &["overrides", "set"][..],
        &KEY,
        &[
            "--burst",
            "8",
            "--owner",
            "accounts",
            "--reason",
            "premium",
            "--expires",
            "30d",
        ],
    ]
    .concat();
    let table = ok(&sluice(&service, admin, &set));
    assert!(
        table.contains("api/00000000000000ac") && table.contains("done"),
        "{table}"
    );
    let table = ok(&sluice(&service, read, &["overrides", "list"]));
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("KEY"), "{table}");
    assert!(
        lines[1].contains("accounts") && lines[1].contains("alice"),
        "{table}"
    );
    assert!(
        lines[1].contains("in 29d") || lines[1].contains("in 30d"),
        "{table}"
    );
    assert_eq!(lines[2], "1 of at most 10000");
    let json: Value = serde_json::from_str(&ok(&sluice(
        &service,
        read,
        &["overrides", "list", "--json"],
    )))
    .unwrap();
    assert_eq!(json["overrides"][0]["burst"], 8);

    // The override applies: the key's limit is 8, from the override.
    let show = [&["keys", "show", "--json"][..], &KEY].concat();
    let state: Value = serde_json::from_str(&ok(&sluice(&service, read, &show))).unwrap();
    assert_eq!(
        (state["capacity"].as_u64(), state["source"].as_str()),
        (Some(8), Some("override"))
    );
    let checks: Vec<Value> = (0..8)
        .map(|_| serde_json::json!({"key": "api/00000000000000ac", "requests": 5, "per_ms": 60_000, "burst": 5, "cost": 1}))
        .collect();
    assert!(service.check(&checks).iter().all(|r| r["allowed"] == true));
    let table = ok(&sluice(
        &service,
        read,
        &[&["keys", "show"][..], &KEY].concat(),
    ));
    assert!(
        table.lines().next().unwrap().contains("REMAINING"),
        "{table}"
    );
    assert!(
        table.lines().nth(1).unwrap().contains("override"),
        "{table}"
    );

    // A read-only token cannot reset: the service's 403 is the command's error.
    let reset = [&["keys", "reset"][..], &KEY, &["--reason", "INC-7"]].concat();
    let refused = sluice(&service, read, &reset);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.starts_with("sluice: 403 forbidden"), "{stderr}");
    assert!(ok(&sluice(&service, admin, &reset)).contains("done"));
    let state: Value = serde_json::from_str(&ok(&sluice(&service, read, &show))).unwrap();
    assert_eq!(state["remaining"], 8);

    // A credit sent twice is applied once.
    assert!(service.check(&checks).iter().all(|r| r["allowed"] == true));
    let credit = [
        &["keys", "credit", "--json"][..],
        &KEY,
        &[
            "--tokens",
            "3",
            "--id",
            "00000000000000f1",
            "--reason",
            "goodwill",
        ],
    ]
    .concat();
    let first: Value = serde_json::from_str(&ok(&sluice(&service, admin, &credit))).unwrap();
    let second: Value = serde_json::from_str(&ok(&sluice(&service, admin, &credit))).unwrap();
    assert_eq!(
        (first["outcome"].as_str(), second["outcome"].as_str()),
        (Some("done"), Some("duplicate"))
    );
    let state: Value = serde_json::from_str(&ok(&sluice(&service, read, &show))).unwrap();
    assert_eq!(state["remaining"], 3);

    let delete = [
        "overrides",
        "delete",
        "--policy",
        "api",
        "--key-hash",
        "00000000000000ac",
        "--reason",
        "ended",
    ];
    assert!(ok(&sluice(&service, admin, &delete)).contains("done"));
    let table = ok(&sluice(&service, read, &["overrides", "list"]));
    assert!(table.ends_with("0 of at most 10000\n"), "{table}");
}

#[test]
fn bad_arguments_are_refused_before_any_call() {
    let service = Service::start_memory();
    let nowhere = Path::new("/nonexistent/token");
    let output = sluice(&service, nowhere, &[&["keys", "show"][..], &KEY].concat());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--token-file /nonexistent/token"),
        "{stderr}"
    );
    let output = sluice(
        &service,
        nowhere,
        &[
            "keys",
            "show",
            "--policy",
            "p",
            "--key-hash",
            "h",
            "--requests",
            "1",
            "--per",
            "1x",
        ],
    );
    assert_eq!(output.status.code(), Some(2), "clap's usage error");
}

#[test]
fn sluice_replay_is_sluice_replay() {
    let replay =
        std::path::PathBuf::from(env!("CARGO_BIN_EXE_sluice")).with_file_name("sluice-replay");
    assert!(
        replay.exists(),
        "{} is missing: cargo build -p sluice-replay",
        replay.display()
    );
    let direct = Command::new(&replay).arg("--version").output().unwrap();
    let folded = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["replay", "--version"])
        .output()
        .unwrap();
    assert!(folded.status.success());
    assert_eq!(folded.stdout, direct.stdout);
    assert!(String::from_utf8_lossy(&folded.stdout).starts_with("sluice-replay"));
}

#[test]
fn sluice_top_shows_the_heavy_key_of_a_policy_as_a_table_and_as_json() {
    let redis = RedisServer::start();
    let dir = TempDir::new("cli-top");
    let tokens = AdminTokens::write(&dir);
    let read = &tokens.read;
    let url = redis.url();
    let args: Vec<&str> = ["--redis", &url].into_iter().chain(tokens.args()).collect();
    let service = Service::start_with(&args, &[]);
    let check = |key: &str| serde_json::json!({"key": key, "requests": 1, "per_ms": 60_000, "burst": 2, "cost": 1});
    for i in 0..20u64 {
        service.check(&[check(&format!("api/{:016x}", 0x100 + i))]);
    }
    for _ in 0..12 {
        service.check(&[check("api/00000000000000ac")]);
    }
    let table = ok(&sluice(&service, read, &["top", "--policy", "api"]));
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("http api over 1m: 22 allowed, 10 refused"),
        "{table}"
    );
    assert!(lines[1].starts_with("#  KEY HASH"), "{table}");
    assert!(lines[2].starts_with("1  00000000000000ac  10"), "{table}");
    assert_eq!(lines.len(), 3, "{table}");
    let json: Value = serde_json::from_str(&ok(&sluice(
        &service,
        read,
        &[
            "top", "--policy", "api", "--by", "consumed", "--window", "1h", "--limit", "3",
            "--json",
        ],
    )))
    .unwrap();
    assert_eq!(json["keys"].as_array().unwrap().len(), 3, "{json}");
    assert_eq!(json["keys"][0]["key"], "00000000000000ac", "{json}");
    assert_eq!(json["keys"][0]["count"], 2, "{json}");
    let policies = ok(&sluice(&service, read, &["top"]));
    assert!(
        policies
            .lines()
            .nth(1)
            .unwrap()
            .starts_with("http       api"),
        "{policies}"
    );
    let unknown = sluice(&service, read, &["top", "--policy", "nobody"]);
    assert!(!unknown.status.success());
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        stderr.starts_with("sluice: 404 unknown_policy: policy:"),
        "{stderr}"
    );
    let bad = sluice(&service, read, &["top", "--policy", "api", "--limit", "65"]);
    assert_eq!(bad.status.code(), Some(2), "clap's usage error");
}

#[test]
fn sluice_rlqs_shows_a_replicas_rlqs_or_says_it_serves_none() {
    let dir = TempDir::new("cli-rlqs");
    let tokens = AdminTokens::write(&dir);
    let read = &tokens.read;
    let limits = dir.path().join("limits");
    std::fs::create_dir(&limits).unwrap();
    let yaml = "domain: api\ndescriptors:\n  - key: name\n    rate_limit: {unit: minute, requests_per_unit: 600}\n";
    std::fs::write(limits.join("limits.yaml"), yaml).unwrap();
    let limits = limits.to_string_lossy().into_owned();
    let args: Vec<&str> = [
        "--memory",
        "--listen",
        "127.0.0.1:0",
        "--rlqs",
        "127.0.0.1:0",
    ]
    .into_iter()
    .chain(["--rls-config", &limits])
    .chain(tokens.args())
    .collect();
    let serving = Service::start_rls(&args, &[]);
    let table = ok(&sluice(&serving, read, &["rlqs"]));
    assert!(
        table.starts_with("0 streams open on this replica\n"),
        "{table}"
    );
    assert!(table.contains("DOMAIN"), "{table}");
    let json: Value =
        serde_json::from_str(&ok(&sluice(&serving, read, &["rlqs", "--json"]))).unwrap();
    assert_eq!(json, serde_json::json!({"streams": 0, "descriptors": []}));

    let plain: Vec<&str> = ["--memory"].into_iter().chain(tokens.args()).collect();
    let plain = Service::start_with(&plain, &[]);
    let none = sluice(&plain, read, &["rlqs"]);
    assert!(!none.status.success());
    let stderr = String::from_utf8_lossy(&none.stderr);
    assert!(stderr.starts_with("sluice: 404 not_found:"), "{stderr}");
}

#[test]
fn sluice_envoys_lists_the_envoys_that_said_who_they_are() {
    let dir = TempDir::new("cli-envoys");
    let tokens = AdminTokens::write(&dir);
    let args: Vec<&str> = ["--memory"].into_iter().chain(tokens.args()).collect();
    let service = Service::start_with(&args, &[]);
    let said: &[(&str, &[u8])] = &[
        ("content-type", b"application/json"),
        ("x-sluice-envoy", b"edge-7"),
        ("x-sluice-worker", b"00000000000000c1"),
        ("x-sluice-dropped", b"3"),
    ];
    let body =
        r#"{"checks": [{"key": "api/x", "requests": 1, "per_ms": 1000, "burst": 1, "cost": 1}]}"#;
    let call =
        sluice_testkit::http::send_with(service.addr, "POST", "/v1/check", said, body.as_bytes());
    assert_eq!(call.status, 200, "{call:?}");
    let table = ok(&sluice(&service, &tokens.read, &["envoys"]));
    let mut lines = table.lines();
    assert_eq!(
        lines.next(),
        Some("Envoys that called this replica in the last minute: 1; settlements dropped: 3")
    );
    assert!(lines.next().unwrap().starts_with("ENVOY"), "{table}");
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!((row[0], row[2], row[3]), ("edge-7", "1", "3"), "{table}");
    let json: Value =
        serde_json::from_str(&ok(&sluice(&service, &tokens.read, &["envoys", "--json"]))).unwrap();
    assert_eq!(json["envoys"][0]["envoy"], "edge-7", "{json}");
}

#[test]
fn sluice_keys_seen_asks_by_the_limits_the_services_checks_used() {
    let dir = TempDir::new("cli-seen");
    let tokens = AdminTokens::write(&dir);
    let args: Vec<&str> = ["--memory"].into_iter().chain(tokens.args()).collect();
    let service = Service::start_with(&args, &[]);
    let check = |requests: u64| {
        serde_json::json!({"key": "api/00000000000000ac", "requests": requests, "per_ms": 60_000,
                           "burst": requests, "cost": 1})
    };
    // The policy's limit changed from 5 to 10 a minute: its checks used both.
    for requests in [5, 10] {
        let spent = service.check(&vec![check(requests); 3]);
        assert!(spent.iter().all(|r| r["allowed"] == true), "{spent:?}");
    }
    let key = [
        "--policy",
        "api",
        "--key-hash",
        "00000000000000ac",
        "--seen",
    ];
    let show = [&["keys", "show", "--json"][..], &key].concat();
    let state: Value = serde_json::from_str(&ok(&sluice(&service, &tokens.read, &show))).unwrap();
    assert_eq!(
        (&state["capacity"], &state["remaining"]),
        (&10.into(), &7.into()),
        "the latest"
    );

    let reset = [&["keys", "reset"][..], &key, &["--reason", "INC-9"]].concat();
    let table = ok(&sluice(&service, &tokens.admin, &reset));
    let done = table
        .lines()
        .filter(|l| l.starts_with("service") && l.ends_with("done"));
    assert_eq!(done.count(), 2, "one reset per limit: {table}");
    for requests in [5, 10] {
        let after = service.check(&[check(requests)]);
        assert_eq!(after[0]["remaining"], requests - 1, "{after:?}");
    }

    let unseen = [
        "keys",
        "show",
        "--policy",
        "web",
        "--key-hash",
        "00000000000000ac",
        "--seen",
    ];
    let refused = sluice(&service, &tokens.read, &unseen);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.starts_with("sluice: --seen: the service saw no check of http policy \"web\""),
        "{stderr}"
    );
    let both = [&show[..], &["--requests", "5", "--per", "1m"]].concat();
    assert_eq!(sluice(&service, &tokens.read, &both).status.code(), Some(2));
}
