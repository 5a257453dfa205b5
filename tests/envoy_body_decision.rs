//! A request whose decision needs its body reaches no upstream before every policy decided: with
//! `allow_on_headers_stop_iteration`, Envoy holds its headers while sluice reads the body, so a
//! refused request opens no upstream request and a stalled body holds nothing. Without the
//! option, sluice finds out, says so in Envoy's log, and still decides from the body.

// Helpers report an unexpected response by panicking, as assertions do.
#![allow(clippy::panic, clippy::indexing_slicing)]

use serde_json::json;
use sluice_testkit::envoy::Envoy;
use sluice_testkit::llm::{post, LlmUpstream};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Requests the upstream cluster was asked to carry.
fn upstream_requests(envoy: &Envoy) -> u64 {
    let stats = envoy.admin_stats("^cluster\\.upstream\\.upstream_rq_total$");
    stats
        .get("cluster.upstream.upstream_rq_total")
        .copied()
        .unwrap_or(0)
}

fn per_model(limit: serde_json::Value) -> String {
    let mut policy = json!({"name": "per-model", "key": ["body:model"]});
    for (field, value) in limit.as_object().into_iter().flatten() {
        policy[field] = value.clone();
    }
    json!({"policies": [policy]}).to_string()
}

const BODY: &str = r#"{"model": "small", "messages": []}"#;

#[test]
fn a_thousand_refused_requests_open_no_upstream_request() {
    let upstream = LlmUpstream::start();
    let config = per_model(json!({"requests": 2, "per": "1h"}));
    let envoy = Envoy::options(&config).upstream(upstream.addr()).start();
    let mut statuses = std::collections::BTreeMap::new();
    for _ in 0..1002 {
        let r = post(envoy.addr(), "/v1/chat/completions", &[], BODY).unwrap();
        *statuses.entry(r.status).or_insert(0) += 1;
    }
    assert_eq!(statuses, [(200, 2), (429, 1000)].into());
    assert_eq!(
        upstream_requests(&envoy),
        2,
        "only the admitted went upstream"
    );
}

/// Sends a request's head and the first half of its body, and stalls.
fn stalled(envoy: &Envoy) -> TcpStream {
    fn fail<T>(e: std::io::Error) -> T {
        panic!("stalled request: {e}")
    }
    let mut client = TcpStream::connect(envoy.addr()).unwrap_or_else(fail);
    (client.set_read_timeout(Some(Duration::from_secs(30)))).unwrap_or_else(fail);
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\nx-test-first-byte-ms: 2000\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        BODY.len()
    );
    let half = &BODY[..BODY.len() / 2];
    client.write_all(head.as_bytes()).unwrap_or_else(fail);
    client.write_all(half.as_bytes()).unwrap_or_else(fail);
    client
}

fn status_of(mut client: TcpStream) -> u16 {
    let mut answer = Vec::new();
    let _ = client.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    let status = text.split(' ').nth(1).unwrap_or_default();
    status
        .parse()
        .unwrap_or_else(|_| panic!("no status in {text:?}"))
}

#[test]
fn stalled_bodies_cannot_carry_a_key_past_its_concurrency_limit() {
    let upstream = LlmUpstream::start();
    let config = per_model(json!({"algorithm": "concurrency", "requests": 2}));
    let envoy = Envoy::options(&config).upstream(upstream.addr()).start();
    let clients: Vec<TcpStream> = (0..20).map(|_| stalled(&envoy)).collect();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        upstream_requests(&envoy),
        0,
        "nothing goes upstream while bodies stall"
    );
    let rest = &BODY[BODY.len() / 2..];
    for mut client in clients.iter() {
        client.write_all(rest.as_bytes()).unwrap();
    }
    let mut statuses: Vec<u16> = clients.into_iter().map(status_of).collect();
    statuses.sort_unstable();
    let admitted = statuses.iter().filter(|&&s| s == 200).count();
    assert_eq!(admitted, 2, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|&&s| s == 429).count(), 18);
    assert_eq!(upstream_requests(&envoy), 2);
}

#[test]
fn without_envoys_option_sluice_says_so_and_still_decides_from_the_body() {
    let upstream = LlmUpstream::start();
    let config = per_model(json!({"requests": 1, "per": "1h"}));
    let mut options = Envoy::options(&config).upstream(upstream.addr());
    options.hold_headers = false;
    let envoy = options.start();
    let first = post(envoy.addr(), "/v1/chat/completions", &[], BODY).unwrap();
    assert_eq!(first.status, 200);
    assert!(
        first.elapsed < Duration::from_secs(3),
        "found out within a tick: {:?}",
        first.elapsed
    );
    let said = sluice_testkit::wait_for(Duration::from_secs(5), || {
        envoy
            .log()
            .contains("allow_on_headers_stop_iteration")
            .then_some(())
    });
    assert!(said.is_some(), "Envoy's log names the option");
    let second = post(envoy.addr(), "/v1/chat/completions", &[], BODY).unwrap();
    assert_eq!(second.status, 429, "decided from the body all the same");
}
