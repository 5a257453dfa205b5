//! Every request example in the docs, run against the real thing, so that the docs stay true:
//! each `curl` of docs/service-api.md (checks and settlements) against a real sluice-service and
//! Redis (its answers are the ```json block after it, one line per call, the same command sent
//! again for each), the 429 of the README and docs/responses.md against a real Envoy with
//! envoy/demo.yaml's configuration, and each whole configuration the README and docs/*.md show
//! against the filter's parser.
//!
//! Durations (`*_ms`) depend on when a call lands: they must agree within `SLACK_MS`, and for
//! epoch-aligned windows the test first waits for the moment of the window the example was taken
//! at (read off its first answer's `reset_ms`). An example that disagrees is tried once more on
//! an empty Redis, for a machine too busy to keep to the moment.
#![cfg(not(target_arch = "wasm32"))]
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use serde_json::Value;
use sluice_testkit::docs::files;
use sluice_testkit::envoy::Envoy;
use sluice_testkit::http::{http_request, post_json};
use sluice_testkit::redis::RedisServer;
use sluice_testkit::repo_root;
use sluice_testkit::service::Service;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const SERVICE_API: &str = include_str!("../docs/service-api.md");
const README: &str = include_str!("../README.md");
const SLACK_MS: i64 = 100;
const ATTEMPTS: usize = 2;

/// A fenced block: its language and text.
fn blocks(markdown: &str) -> Vec<(&str, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(&str, String)> = None;
    for line in markdown.lines() {
        match (&mut open, line.trim_start().strip_prefix("```")) {
            (None, Some(lang)) => open = Some((lang.trim(), String::new())),
            (Some(_), Some(_)) => blocks.extend(open.take()),
            (Some((_, text)), None) => {
                text.push_str(line);
                text.push('\n');
            }
            (None, None) => {}
        }
    }
    blocks
}

/// One curl example: the path, the body it posts (`None`: a GET) and the answer to each call.
#[derive(Debug)]
struct Example {
    path: String,
    body: Option<String>,
    answers: Vec<Value>,
}

/// The `curl` examples of a document, each with the answers in the ```json block after it.
fn curl_examples(markdown: &str) -> Vec<Example> {
    let blocks = blocks(markdown);
    let mut examples = Vec::new();
    for (i, (lang, text)) in blocks.iter().enumerate() {
        if *lang != "sh" || !text.trim_start().starts_with("curl ") || text.contains("--redis") {
            continue;
        }
        let after_host = text
            .split("localhost:8080")
            .nth(1)
            .expect("curl localhost:8080");
        let mut path = after_host.split(|c: char| c.is_whitespace() || c == '\'');
        let path = path.next().unwrap().to_string();
        let body = text.split_once("-d '").map(|(_, rest)| {
            let (body, _) = rest.rsplit_once('\'').expect("a quoted body");
            body.to_string()
        });
        let (answer_lang, answers) = blocks.get(i + 1).expect("answers after each curl");
        assert_eq!(
            *answer_lang, "json",
            "the block after {text} holds its answers"
        );
        let answers = answers
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect();
        examples.push(Example {
            path,
            body,
            answers,
        });
    }
    examples
}

fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    u64::try_from(since.as_millis()).unwrap()
}

/// Waits for the moment of an epoch-aligned window that the example's first answer shows, if
/// one of its checks has such a window.
fn wait_for_the_examples_moment(example: &Example) {
    let Some(body) = &example.body else { return };
    let request: Value = serde_json::from_str(body).unwrap();
    // A settlement's answer tells no moment.
    let Some(checks) = request["checks"].as_array() else {
        return;
    };
    let windowed = checks.iter().enumerate().find(|(_, c)| {
        matches!(
            c["algorithm"].as_str(),
            Some("fixed_window" | "sliding_window")
        )
    });
    let Some((i, check)) = windowed else { return };
    let per = check["per_ms"].as_u64().unwrap();
    let Some(reset) = example.answers[0]["results"][i]["reset_ms"].as_u64() else {
        return;
    };
    let moment = (per - reset % per) % per;
    let wait = (moment + per - now_ms() % per) % per;
    std::thread::sleep(Duration::from_millis(wait));
}

/// Where `actual` differs from `expected`: durations by more than `SLACK_MS`, anything else at all.
fn differences(expected: &Value, actual: &Value, at: &str, out: &mut Vec<String>) {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) if e.len() == a.len() => {
            for (key, value) in e {
                let here = format!("{at}.{key}");
                match (a.get(key), key.ends_with("_ms")) {
                    (Some(Value::Number(got)), true) => {
                        let (want, got) = (value.as_i64().unwrap(), got.as_i64().unwrap());
                        if (want - got).abs() > SLACK_MS {
                            out.push(format!("{here}: {got}, the doc says {want}"));
                        }
                    }
                    (Some(got), _) => differences(value, got, &here, out),
                    (None, _) => out.push(format!("{here}: missing")),
                }
            }
        }
        (Value::Array(e), Value::Array(a)) if e.len() == a.len() => {
            for (i, (e, a)) in e.iter().zip(a).enumerate() {
                differences(e, a, &format!("{at}[{i}]"), out);
            }
        }
        _ if expected == actual => {}
        _ => out.push(format!("{at}: {actual}, the doc says {expected}")),
    }
}

/// Runs the example on an empty Redis; what differs from the doc.
fn run(example: &Example, redis: &RedisServer, service: &Service) -> Vec<String> {
    redis.client().cmd(&["FLUSHALL"]);
    wait_for_the_examples_moment(example);
    let mut found = Vec::new();
    for (call, expected) in example.answers.iter().enumerate() {
        let response = match &example.body {
            Some(body) => post_json(service.addr, &example.path, body),
            None => http_request(service.addr, "GET", &example.path, &[]).unwrap(),
        };
        let actual: Value = serde_json::from_slice(&response.body)
            .unwrap_or_else(|e| panic!("{}: {e}: {response:?}", example.path));
        let mut differ = Vec::new();
        differences(
            expected,
            &actual,
            &format!("call {}", call + 1),
            &mut differ,
        );
        if !differ.is_empty() {
            found.push(format!("{}\n  real answer: {actual}", differ.join("\n  ")));
        }
    }
    found
}

#[test]
fn every_service_api_example_gives_the_answers_the_doc_shows() {
    let examples = curl_examples(SERVICE_API);
    assert!(examples.len() >= 10, "{} examples found", examples.len());
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let mut wrong = Vec::new();
    for example in &examples {
        let mut found = Vec::new();
        for _ in 0..ATTEMPTS {
            found = run(example, &redis, &service);
            if found.is_empty() {
                break;
            }
        }
        if !found.is_empty() {
            let request = example.body.as_deref().unwrap_or_default();
            wrong.push(format!(
                "{} {request}:\n  {}",
                example.path,
                found.join("\n  ")
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/service-api.md is wrong:\n{}",
        wrong.join("\n\n")
    );
}

/// README.md and docs/*.md: each page's path from the repo root, and its text.
fn pages() -> Vec<(String, String)> {
    let docs = files("docs", &["md"]).into_iter().map(|path| {
        let page = path
            .strip_prefix(repo_root())
            .unwrap()
            .display()
            .to_string();
        (page, std::fs::read_to_string(&path).unwrap())
    });
    std::iter::once(("README.md".to_string(), README.to_string()))
        .chain(docs)
        .collect()
}

/// Every ```` ```json ```` block of the README and docs/*.md that is a whole configuration (an
/// object with `policies`) is one the filter takes, every variable it names set. Fragments (a
/// `"tiers"` member, a `"global"` one) are left to the schema's examples.
#[test]
fn every_whole_configuration_the_docs_show_is_one_the_filter_takes() {
    let env = |_: &str| Some("a-secret-from-the-deployment-32-bytes-or-more".to_string());
    let mut checked = 0;
    for (page, markdown) in pages() {
        for (lang, text) in blocks(&markdown) {
            let Ok(config) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            if lang != "json" || config.get("policies").is_none() {
                continue;
            }
            if let Err(e) = sluice::config::parse_with_env(text.as_bytes(), &env) {
                panic!("{page}: the filter refuses {text}: {e}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 6, "only {checked} configurations found");
}

/// The configuration in envoy/demo.yaml, as `make run` starts it.
fn demo_configuration() -> String {
    let text = std::fs::read_to_string(repo_root().join("envoy/demo.yaml")).unwrap();
    let yaml: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let chain = &yaml["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0];
    let filters = chain["typed_config"]["http_filters"].as_sequence().unwrap();
    let wasm = filters
        .iter()
        .find(|f| f["name"] == "envoy.filters.http.wasm")
        .unwrap();
    let value = &wasm["typed_config"]["config"]["configuration"]["value"];
    value.as_str().unwrap().to_string()
}

/// The README and docs/responses.md show the 429 that `make run` gives alice's sixth request.
#[test]
fn the_docs_429_is_what_the_demo_answers_alice_sixth_request() {
    let responses = std::fs::read_to_string(repo_root().join("docs/responses.md")).unwrap();
    let examples: Vec<String> = [README, responses.as_str()]
        .into_iter()
        .flat_map(|page| {
            let http = blocks(page).into_iter();
            http.filter(|(lang, text)| *lang == "http" && text.contains(" 429 "))
                .map(|(_, text)| text)
                .take(1)
        })
        .collect();
    assert_eq!(
        examples.len(),
        2,
        "the README and docs/responses.md each show a 429"
    );
    let envoy = Envoy::start(&demo_configuration());
    let alice: &[(&str, &[u8])] = &[("x-user-id", b"alice")];
    for _ in 0..5 {
        assert_eq!(envoy.get("/api/hello", alice).status, 200);
    }
    let denied = envoy.get("/api/hello", alice);
    assert_eq!(denied.status, 429);
    for example in examples {
        let (head, body) = example.split_once("\n\n").unwrap();
        let mut lines = head.lines();
        assert_eq!(lines.next(), Some("HTTP/1.1 429 Too Many Requests"));
        for line in lines {
            let (name, value) = line.split_once(": ").unwrap();
            assert_eq!(denied.header(name), Some(value), "{name} in {denied:?}");
        }
        assert_eq!(denied.text(), body.trim_end());
    }
}
