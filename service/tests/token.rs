//! `--token-file`: POST /v1/check requires `authorization: Bearer <token>` (401 otherwise), the
//! probes and /metrics do not; a rotated file takes effect on SIGHUP; the token never reaches
//! the logs; an empty or unreadable file stops the start.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::{bucket, checks_body};
use sluice_testkit::http::{get, send_raw, Response};
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::{run_to_exit, Service};
use sluice_testkit::{TempDir, SIGHUP};

const TOKEN: &str = "s3cret-Token_1";

/// POST /v1/check with `authorization` as given (`None`: no such header).
fn check_with(addr: SocketAddr, authorization: Option<&str>) -> Response {
    let body = checks_body(&[bucket("token/1", 1, 1000, 100, 1, 1)]);
    let authorization = authorization.map_or(String::new(), |a| format!("authorization: {a}\r\n"));
    let raw = format!(
        "POST /v1/check HTTP/1.1\r\nhost: sluice\r\nconnection: close\r\n{authorization}\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    send_raw(addr, raw.as_bytes())
}

fn start_with_tokens(redis: &RedisServer, file: &Path, env: &[(&str, &str)]) -> Service {
    let file = file.to_str().unwrap();
    Service::start_with(&["--redis", &redis.url(), "--token-file", file], env)
}

fn assert_unauthorized(response: &Response) {
    assert_eq!(response.status, 401, "{response:?}");
    let challenge = response.header("www-authenticate");
    assert_eq!(challenge, Some("Bearer"), "{response:?}");
    assert_eq!(response.json()["error"], "unauthorized", "{response:?}");
}

#[test]
fn with_a_token_file_a_check_needs_the_bearer_token_and_the_probes_do_not() {
    let redis = RedisServer::start();
    let dir = TempDir::new("token");
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    let service = start_with_tokens(&redis, &file, &[("SLUICE_LOG", "debug")]);
    assert_eq!(service.listening["token"], true);

    assert_unauthorized(&check_with(service.addr, None));
    assert_unauthorized(&check_with(service.addr, Some("Bearer wrong")));
    assert_unauthorized(&check_with(service.addr, Some(&format!("Bearer {TOKEN}x"))));
    assert_unauthorized(&check_with(service.addr, Some(&format!("Basic {TOKEN}"))));
    let allowed = check_with(service.addr, Some(&format!("Bearer {TOKEN}")));
    assert_eq!(allowed.status, 200, "{allowed:?}");
    assert_eq!(allowed.json()["results"][0]["allowed"], true);
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(get(service.addr, path).status, 200, "{path}");
    }
    let metrics = get(service.addr, "/metrics").text();
    let refused = r#"sluice_service_http_requests_total{path="/v1/check",status="401"} 4"#;
    assert!(metrics.lines().any(|l| l == refused), "{metrics}");
    assert_eq!(
        redis.client().cmd(&["DBSIZE"]).int(),
        1,
        "only the authorized check reached Redis"
    );

    // Every line logged since it listened, at debug level: none shows the token or the header.
    let lines = service.lines(Duration::from_millis(500));
    for line in &lines {
        let header = ["Bearer ", "Basic ", "authorization"]
            .iter()
            .any(|h| line.contains(h));
        assert!(!line.contains(TOKEN) && !header, "{line}");
    }
    let events: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let requests = events
        .iter()
        .filter(|e| e["message"] == "request" && e["path"] == "/v1/check");
    assert_eq!(
        requests.count(),
        5,
        "debug logs one line per request: {lines:?}"
    );
    let warned = events
        .iter()
        .filter(|e| e["level"] == "WARN")
        .collect::<Vec<_>>();
    assert_eq!(warned.len(), 1, "one warning for four 401s: {warned:?}");
    assert_eq!(warned[0]["reason"], "no token", "{lines:?}");
}

#[test]
fn a_rotated_token_file_takes_effect_on_sighup_and_may_hold_the_old_and_new_token() {
    let redis = RedisServer::start();
    let dir = TempDir::new("token");
    let file = dir.path().join("token");
    std::fs::write(&file, "old\n").unwrap();
    let service = start_with_tokens(&redis, &file, &[]);
    let status = |token: &str| check_with(service.addr, Some(&format!("Bearer {token}"))).status;
    assert_eq!((status("old"), status("new")), (200, 401));

    let reload = |content: &str, expected: &str| {
        std::fs::write(&file, content).unwrap();
        service.signal(SIGHUP);
        let event = service.event(expected, Duration::from_secs(5));
        event.unwrap_or_else(|| panic!("no {expected:?} after writing {content:?}"))
    };
    let reloaded = reload("old\nnew\n", "token file reloaded");
    assert_eq!(reloaded["tokens"], 2, "{reloaded}");
    assert_eq!((status("old"), status("new")), (200, 200));
    reload("new\n", "token file reloaded");
    assert_eq!((status("old"), status("new")), (401, 200));

    let refused = reload(
        "",
        "token file not reloaded: keeping the tokens read before",
    );
    assert_eq!(refused["level"], "WARN", "{refused}");
    assert_eq!(
        status("new"),
        200,
        "an emptied file keeps the tokens read before"
    );
}

#[test]
fn an_empty_or_unreadable_token_file_stops_the_start_with_a_message_naming_it() {
    let dir = TempDir::new("token");
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let missing = dir.path().join("missing");
    let cases = [(&empty, "holds no token"), (&missing, "cannot be read: ")];
    for (file, reason) in cases {
        let file = file.to_str().unwrap();
        let args = ["--redis", "redis://127.0.0.1:1", "--token-file", file];
        let (status, _, stderr) = run_to_exit(&args, &[], Duration::from_secs(10));
        assert_eq!(status.code(), Some(1), "{stderr}");
        let expected = format!("--token-file {file}: {reason}");
        assert!(stderr.contains(&expected), "{expected:?} not in {stderr}");
    }
}
