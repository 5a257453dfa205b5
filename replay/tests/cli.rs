//! The `sluice-replay` command as an operator runs it: the seeds' reference behaviour as a
//! replay, the JSON report's shape, `--check`, `--compare`, bad lines, gzip and standard input,
//! `--svg`, `--print-log-format`, Envoy YAML configurations, refused configurations. No Envoy.
#![cfg(not(target_arch = "wasm32"))]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use serde_json::{json, Value};
use sluice_testkit::TempDir;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The seeds' limit: one request a second per user, bursts of five.
const SEEDS: &str = r#"{"policies": [{"name": "per-user", "key": ["header:x-user-id"],
    "requests": 1, "per": "1s", "burst": 5}]}"#;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// `sluice-replay ARGS`, with `stdin` on its standard input.
fn replay(args: &[&str], stdin: &[u8]) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice-replay"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A run refused at its arguments reads none of it: the pipe may break.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `sluice-replay --config CONFIG --log - EXTRA`, reading `log`.
fn replay_log(config: &Path, log: impl AsRef<[u8]>, extra: &[&str]) -> Run {
    let mut args = vec!["--config", arg(config), "--log", "-"];
    args.extend(extra);
    replay(&args, log.as_ref())
}

fn json_of(run: &Run) -> Value {
    serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", run.stdout, run.stderr))
}

/// A log line for `user` at `second` (plus `micros`) after 2026-12-01T00:00:00Z, with Envoy's
/// answer.
fn line(user: &str, second: u64, micros: u64, code: u16) -> String {
    json!({"start_time": format!("2026-12-01T00:00:{second:02}.{micros:06}Z"), "method": "GET",
           "path": "/api/x", "authority": "api.example.com", "remote_address": "10.0.0.1",
           "route_name": "api", "headers": {"x-user-id": user}, "metadata": {},
           "response_code": code})
    .to_string()
}

/// Eight requests at t = 0 and three at t = 2 s, with the answers the seeds give.
fn seeds_log() -> String {
    let codes = [200, 200, 200, 200, 200, 429, 429, 429];
    let first = codes
        .iter()
        .enumerate()
        .map(|(i, &c)| line("alice", 0, i as u64, c));
    let second = [200, 200, 429]
        .iter()
        .enumerate()
        .map(|(i, &c)| line("alice", 2, i as u64, c));
    first.chain(second).map(|l| l + "\n").collect()
}

fn write(dir: &TempDir, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

fn arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn the_seeds_replayed_give_five_allowed_three_denied_then_two_allowed_one_denied() {
    let dir = TempDir::new("replay-cli");
    let config = write(&dir, "seeds.json", SEEDS);
    let run = replay_log(&config, seeds_log(), &["--check", "--format", "json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let report = json_of(&run);
    assert_eq!(
        report["check"],
        json!({"compared": 11, "agreed": 11, "disagreements": []})
    );
    let policy = &report["policies"]["per-user"];
    assert_eq!(
        (policy["allowed"].clone(), policy["denied"].clone()),
        (json!(7), json!(4))
    );
}

#[test]
fn check_names_each_request_the_replay_answers_otherwise_and_exits_3() {
    let dir = TempDir::new("replay-cli");
    let config = write(&dir, "seeds.json", SEEDS);
    let log = seeds_log().replacen("\"response_code\":429", "\"response_code\":200", 1);
    let run = replay_log(&config, log, &["--check"]);
    assert_eq!(run.code, 3, "{}", run.stdout);
    assert!(
        run.stdout.contains("check: 10 of 11 requests"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("line 6: replayed refused with 429; Envoy answered 200 (-)"),
        "{}",
        run.stdout
    );
}

#[test]
fn check_tells_sluices_refusals_by_their_details_and_a_policys_own_denial_status() {
    let dir = TempDir::new("replay-cli");
    let config = SEEDS.replace(
        "\"burst\": 5",
        "\"burst\": 5, \"denial\": {\"status\": 503}",
    );
    let config = write(&dir, "seeds-503.json", config);
    let with_details = |details: &[&str]| -> String {
        let codes = [200, 200, 200, 200, 200, 503, 503, 503];
        let lines = codes.iter().zip(details.iter().cycle()).enumerate();
        let lines = lines.map(|(i, (code, details))| {
            let mut line: Value = serde_json::from_str(&line("alice", 0, i as u64, *code)).unwrap();
            if !details.is_empty() {
                line["response_code_details"] = json!(details);
            }
            line.to_string() + "\n"
        });
        lines.collect()
    };
    let agreed = |log: String| {
        json_of(&replay_log(&config, log, &["--check", "--format", "json"]))["check"]["agreed"]
            .clone()
    };
    assert_eq!(
        agreed(with_details(&[""])),
        json!(8),
        "by status: the policy's 503"
    );
    let details = [
        "via_upstream",
        "via_upstream",
        "via_upstream",
        "via_upstream",
        "via_upstream",
        "sluice_rate_limited",
        "sluice_rate_limited",
        "sluice_rate_limited",
    ];
    assert_eq!(agreed(with_details(&details)), json!(8), "by details");
    let mut upstream = details;
    upstream[0] = "sluice_rate_limited";
    assert_eq!(
        agreed(with_details(&upstream)),
        json!(7),
        "a refusal the replay does not make"
    );
}

#[test]
fn the_json_report_has_the_documented_shape() {
    let dir = TempDir::new("replay-cli");
    let config = write(&dir, "seeds.json", SEEDS);
    let report = json_of(&replay_log(&config, seeds_log(), &["--format", "json"]));
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        keys(&report),
        [
            "denied",
            "filter_off",
            "late",
            "lines",
            "policies",
            "requests",
            "skipped",
            "skipped_lines"
        ]
    );
    assert_eq!(
        (report["lines"].clone(), report["skipped"].clone()),
        (json!(11), json!(0))
    );
    let policy = &report["policies"]["per-user"];
    assert_eq!(
        keys(policy),
        [
            "allowed",
            "busiest_second",
            "bypassed",
            "denied",
            "denied_share",
            "matched",
            "shadow_denied",
            "top_keys"
        ]
    );
    assert_eq!(policy["matched"], json!(11));
    assert_eq!(
        policy["busiest_second"],
        json!({"start": "2026-12-01T00:00:00Z", "requests": 8})
    );
    let top = policy["top_keys"].as_array().unwrap();
    assert_eq!(top.len(), 1);
    assert_eq!(top[0]["denied"], json!(4));
    assert_eq!(
        top[0]["key"].as_str().unwrap().len(),
        16,
        "a hash, not the user id"
    );
    assert!(
        !run_text(&config).contains("alice"),
        "no raw key without --show-keys"
    );
    let shown = json_of(&replay_log(
        &config,
        seeds_log(),
        &["--format", "json", "--show-keys"],
    ));
    assert_eq!(
        shown["policies"]["per-user"]["top_keys"][0]["value"],
        json!(["alice"]),
        "one string per key part, as a bypass entry's key"
    );
    let text = replay_log(&config, seeds_log(), &["--show-keys"]).stdout;
    assert!(text.contains(r#"         4  ["alice"]"#), "{text}");
}

fn run_text(config: &Path) -> String {
    replay_log(config, seeds_log(), &[]).stdout
}

#[test]
fn bad_lines_are_counted_listed_by_number_and_skipped() {
    let dir = TempDir::new("replay-cli");
    let config = write(&dir, "seeds.json", SEEDS);
    let log = format!(
        "{}\nGET /api/x HTTP/1.1\n\n{{\"method\":\"GET\"}}\n{{\"start_time\":\"noon\"}}\n{}\n",
        line("alice", 0, 0, 200),
        line("alice", 0, 1, 200)
    );
    let run = replay_log(&config, log, &["--format", "json"]);
    assert_eq!(run.code, 0);
    let report = json_of(&run);
    assert_eq!(
        (
            report["lines"].clone(),
            report["skipped"].clone(),
            report["requests"].clone()
        ),
        (json!(5), json!(3), json!(2))
    );
    let listed: Vec<(u64, String)> = report["skipped_lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["line"].as_u64().unwrap(),
                s["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        listed.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        [2, 4, 5],
        "blank lines are not lines"
    );
    assert!(listed[0].1.starts_with("not a JSON object"), "{listed:?}");
    assert_eq!(listed[1].1, "no start_time");
    assert!(
        listed[2]
            .1
            .starts_with("start_time: \"noon\" is not an RFC 3339"),
        "{listed:?}"
    );
}

#[test]
fn a_gzipped_log_file_reads_as_the_plain_log_on_standard_input() {
    let dir = TempDir::new("replay-cli");
    let config = write(&dir, "seeds.json", SEEDS);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(seeds_log().as_bytes()).unwrap();
    let gzipped = write(&dir, "access.json.gz", gz.finish().unwrap());
    let from_file = replay(
        &[
            "--config",
            arg(&config),
            "--log",
            arg(&gzipped),
            "--format",
            "json",
        ],
        b"",
    );
    let from_stdin = replay_log(&config, seeds_log(), &["--format", "json"]);
    assert_eq!(json_of(&from_file), json_of(&from_stdin));
}

#[test]
fn lines_out_of_order_within_the_window_are_replayed_in_start_order() {
    let dir = TempDir::new("replay-cli");
    let config = write(&dir, "seeds.json", SEEDS);
    let mut lines: Vec<String> = seeds_log().lines().map(str::to_string).collect();
    lines.swap(8, 10);
    lines.swap(0, 7);
    let log = lines.join("\n");
    let report = json_of(&replay_log(&config, log, &["--check", "--format", "json"]));
    assert_eq!(report["check"]["agreed"], json!(11), "{report:#}");
    assert_eq!(report["late"], json!(0));
    let late = json_of(&replay_log(
        &config,
        [
            line("bob", 5, 0, 200),
            line("bob", 6, 0, 200),
            line("bob", 1, 0, 200),
        ]
        .join("\n"),
        &["--format", "json", "--reorder-window", "1ms"],
    ));
    assert_eq!(
        late["late"],
        json!(1),
        "past the window: decided at the time reached, counted"
    );
}

#[test]
fn a_reorder_window_of_0_replays_in_log_order_and_a_bad_one_exits_2() {
    let dir = TempDir::new("replay-cli");
    let config = write(&dir, "seeds.json", SEEDS);
    // Bob's line of second 1 comes after his lines of seconds 5 and 6 (late whatever the
    // window of 0); carol's two, a microsecond apart, in reverse.
    let log = [
        line("bob", 5, 0, 200),
        line("bob", 6, 0, 200),
        line("bob", 1, 0, 200),
        line("carol", 7, 1, 200),
        line("carol", 7, 0, 200),
    ]
    .join("\n");
    for zero in ["0", "0s", "0ms"] {
        let report = json_of(&replay_log(
            &config,
            &log,
            &["--format", "json", "--reorder-window", zero],
        ));
        assert_eq!(
            report["late"],
            json!(2),
            "--reorder-window {zero}: {report:#}"
        );
        assert_eq!(report["requests"], json!(5));
    }
    let ordered = json_of(&replay_log(&config, &log, &["--format", "json"]));
    assert_eq!(
        ordered["late"],
        json!(0),
        "the default 2 s puts all back in order"
    );
    for bad in ["soon", "2", "1.5s", "1fortnight"] {
        let run = replay_log(&config, &log, &["--reorder-window", bad]);
        assert_eq!(run.code, 2, "--reorder-window {bad}: {}", run.stderr);
        assert!(
            run.stderr.contains("invalid value") && run.stderr.contains("--reorder-window"),
            "{}",
            run.stderr
        );
    }
}

/// An Envoy configuration with the seeds' filter and two named routes: `api`, and `static`,
/// which switches the filter off.
fn envoy_with_a_route_off() -> String {
    let config = serde_json::to_string(SEEDS).unwrap();
    format!(
        r#"static_resources:
  listeners:
  - filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          http_filters:
          - name: envoy.filters.http.wasm
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: {config}
          - name: envoy.filters.http.router
          route_config:
            virtual_hosts:
            - name: local
              domains: ["*"]
              routes:
              - name: static
                match: {{ prefix: /static/ }}
                route: {{ cluster: web }}
                typed_per_filter_config:
                  envoy.filters.http.wasm:
                    "@type": type.googleapis.com/envoy.config.route.v3.FilterConfig
                    disabled: true
              - name: api
                match: {{ prefix: / }}
                route: {{ cluster: web }}
"#
    )
}

#[test]
fn requests_on_a_route_that_switches_the_filter_off_pass_undecided() {
    let dir = TempDir::new("replay-cli");
    let envoy = write(&dir, "envoy.yaml", envoy_with_a_route_off());
    // Alice's seeds on the route `api`, and eight more of hers on `static`, all answered 200.
    let static_lines: String = (0..8)
        .map(|i| {
            line("alice", 0, 100 + i, 200)
                .replace(r#""route_name":"api""#, r#""route_name":"static""#)
                + "\n"
        })
        .collect();
    let log = seeds_log() + &static_lines;
    let run = replay_log(&envoy, &log, &["--check", "--format", "json"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let report = json_of(&run);
    assert_eq!(
        (report["requests"].clone(), report["filter_off"].clone()),
        (json!(19), json!(8))
    );
    assert_eq!(report["check"]["agreed"], json!(19), "{report:#}");
    assert_eq!(report["policies"]["per-user"]["matched"], json!(11));
    let text = replay_log(&envoy, &log, &[]).stdout;
    assert!(
        text.starts_with(
            "19 lines: 19 requests replayed (8 on routes that switch the filter off), 4 denied"
        ),
        "{text}"
    );
    let as_json = write(&dir, "seeds.json", SEEDS);
    let blind = replay_log(&as_json, &log, &["--check"]);
    assert_eq!(
        blind.code, 3,
        "the JSON alone does not know the route: {}",
        blind.stdout
    );
}

#[test]
fn compare_counts_the_requests_that_change_outcome_per_policy_with_examples() {
    let dir = TempDir::new("replay-cli");
    let config = write(&dir, "seeds.json", SEEDS);
    let tighter = write(
        &dir,
        "tighter.json",
        SEEDS
            .replace("\"burst\": 5", "\"burst\": 3")
            .replace("per-user", "per-user-3"),
    );
    let run = replay_log(
        &config,
        seeds_log(),
        &["--compare", arg(&tighter), "--format", "json"],
    );
    let compare = &json_of(&run)["compare"];
    assert_eq!(
        (compare["requests"].clone(), compare["changed"].clone()),
        (json!(11), json!(2))
    );
    let changes = &compare["policies"]["per-user-3"];
    assert_eq!(
        (
            changes["newly_denied"].clone(),
            changes["newly_allowed"].clone()
        ),
        (json!(2), json!(0))
    );
    let example = &changes["examples"][0];
    assert_eq!(
        (example["line"].clone(), example["now_denied"].clone()),
        (json!(4), json!(true))
    );
    assert_eq!(example["path"], json!("/api/x"));
    let back = replay_log(&tighter, seeds_log(), &["--compare", arg(&config)]);
    assert!(
        back.stdout
            .contains("per-user-3: 0 newly denied, 2 no longer denied"),
        "{}",
        back.stdout
    );
}

#[test]
fn an_envoy_yaml_file_is_read_for_its_configuration_and_a_chart_is_written() {
    let dir = TempDir::new("replay-cli");
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../envoy/demo.yaml");
    let svg = dir.path().join("chart.svg");
    let run = replay_log(&demo, seeds_log(), &["--svg", arg(&svg)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(
        chart.starts_with("<svg") && chart.contains("per-user"),
        "{chart}"
    );
}

#[test]
fn print_log_format_prints_the_access_log_for_the_configurations_headers_and_metadata() {
    let dir = TempDir::new("replay-cli");
    let config = write(
        &dir,
        "jwt.json",
        r#"{"policies": [{"name": "per-sub",
        "key": ["metadata:envoy.filters.http.jwt_authn:payload.sub"], "requests": 1, "per": "1s",
        "tiers": {"by": "header:x-plan", "values": {"gold": {"requests": 5, "per": "1s"}}}}]}"#,
    );
    let run = replay(&["--config", arg(&config), "--print-log-format"], b"");
    assert_eq!(run.code, 0, "{}", run.stderr);
    let printed: Value = serde_yaml::from_str(&run.stdout).unwrap();
    let format = &printed["access_log"][0]["typed_config"]["log_format"]["json_format"];
    assert_eq!(format["headers"], json!({"x-plan": "%REQ(X-PLAN)%"}));
    assert_eq!(
        format["metadata"],
        json!({"envoy.filters.http.jwt_authn": "%DYNAMIC_METADATA(envoy.filters.http.jwt_authn)%"})
    );
    assert_eq!(
        format["start_time"],
        json!("%START_TIME(%Y-%m-%dT%H:%M:%S.%6fZ)%")
    );
}

#[test]
fn a_refused_configuration_or_an_unreadable_log_exits_1_naming_the_cause() {
    let dir = TempDir::new("replay-cli");
    let bad = write(
        &dir,
        "bad.json",
        SEEDS.replace("\"burst\": 5", "\"burst\": 0"),
    );
    let run = replay_log(&bad, b"", &[]);
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("policies[0].burst"), "{}", run.stderr);
    let config = write(&dir, "seeds.json", SEEDS);
    let missing = replay(
        &[
            "--config",
            arg(&config),
            "--log",
            "/nonexistent/access.json",
        ],
        b"",
    );
    assert_eq!(missing.code, 1);
    assert!(
        missing.stderr.contains("--log /nonexistent/access.json"),
        "{}",
        missing.stderr
    );
}

#[test]
fn the_replay_honours_a_rollout_none_and_all_exactly_and_counts_its_two_groups() {
    let dir = TempDir::new("replay-cli");
    let users: String = (0..200)
        .flat_map(|u| (0..7).map(move |i| line(&format!("user-{u}"), 0, i, 200) + "\n"))
        .collect();
    let rollout = |percent: u32| {
        let config = SEEDS.replace(
            "\"burst\": 5",
            &format!("\"burst\": 5, \"rollout\": {{\"enforce_percent\": {percent}}}"),
        );
        let path = write(&dir, &format!("rollout-{percent}.json"), config);
        let report = json_of(&replay_log(&path, &users, &["--format", "json"]));
        report["policies"]["per-user"].clone()
    };
    let none = rollout(0);
    assert_eq!(none["denied"], json!(0));
    assert_eq!(
        none["rollout"]["shadowed"],
        json!({"matched": 1400, "allowed": 1000, "would_deny": 400})
    );
    let all = rollout(100);
    assert_eq!(all["denied"], json!(400));
    assert_eq!(
        all["rollout"]["enforced"],
        json!({"matched": 1400, "allowed": 1000, "denied": 400})
    );
    let half = rollout(50);
    let enforced = half["rollout"]["enforced"]["matched"].as_u64().unwrap();
    assert!((500..=900).contains(&enforced), "{half:#}");
    assert_eq!(
        half["denied"].as_u64().unwrap() * 7,
        enforced * 2,
        "two of each canary user's seven"
    );
    assert_eq!(
        half["denied_share"], none["denied_share"],
        "the share denied were it enforced for all"
    );
}

/// The workspace root, where the docs' commands run.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn the_readmes_commands_print_the_demos_log_format_and_replay_its_sample_log() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice-replay"))
            .args(args)
            .current_dir(repo())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let format = run(&["--config", "envoy/demo.yaml", "--print-log-format"]);
    assert!(format.contains("x-user-id: '%REQ(X-USER-ID)%'"), "{format}");
    let replayed = run(&[
        "--config",
        "envoy/demo.yaml",
        "--log",
        "replay/testdata/demo-access.json",
        "--check",
    ]);
    assert!(
        replayed.contains("check: 12 of 12 requests with a response code agree"),
        "{replayed}"
    );
    assert!(
        replayed.contains("12 lines: 12 requests replayed, 4 denied"),
        "{replayed}"
    );
}
