//! Concurrency policies in a real two-worker Envoy in front of a slow upstream (the test kit's
//! LLM upstream, whose `/slow?ms=N` answers after N ms): at most N requests of a key in flight,
//! whichever workers they land on, and every slot given back however its request ends.

// Helpers report an unexpected response by panicking, as assertions do.
#![allow(clippy::panic, clippy::indexing_slicing)]

use sluice::output::metrics::{slots_released_counter, SlotEnd};
use sluice_testkit::envoy::Envoy;
use sluice_testkit::llm::{slow_in_flight, LlmUpstream};
use sluice_testkit::wait_for;
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Alice, as `slow_in_flight` sends her.
const ALICE_IN_FLIGHT: &[(&str, &str)] = &[("x-user-id", "alice")];

/// At most `requests` of one user in flight, with a lease of `lease`.
fn streams(requests: u64, lease: &str) -> String {
    format!(
        r#"{{"headers": "both", "policies": [{{"name": "streams", "key": ["header:x-user-id"],
        "algorithm": "concurrency", "requests": {requests}, "lease": "{lease}"}}]}}"#
    )
}

fn start(config: &str) -> (Envoy, LlmUpstream) {
    let upstream = LlmUpstream::start();
    let envoy = Envoy::options(config).upstream(upstream.addr()).start();
    (envoy, upstream)
}

const ALICE: [(&str, &[u8]); 1] = [("x-user-id", b"alice")];

/// Alice's quick request: its status.
fn quick(envoy: &Envoy) -> u16 {
    envoy.get("/slow?ms=0", &ALICE).status
}

/// Polls quick requests until one is admitted (at most 3 s): the slot came back.
fn admitted_again(envoy: &Envoy) -> bool {
    wait_for(Duration::from_secs(3), || {
        (quick(envoy) == 200).then_some(())
    })
    .is_some()
}

#[test]
fn three_requests_in_flight_of_one_key_get_two_slots_and_the_third_is_refused() {
    let (envoy, upstream) = start(&streams(2, "5m"));
    let running = [
        slow_in_flight(envoy.addr(), 2_000, ALICE_IN_FLIGHT),
        slow_in_flight(envoy.addr(), 2_000, ALICE_IN_FLIGHT),
    ];
    upstream.wait_for_calls(2);
    let refused = envoy.get("/slow?ms=0", &ALICE);
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.json()["policy"], "streams");
    assert_eq!(refused.header("retry-after"), None, "nobody knows when");
    assert_eq!(
        refused.header("ratelimit-policy"),
        Some(r#""streams";q=2;qu="concurrent-requests""#)
    );
    assert_eq!(
        envoy.get("/slow?ms=0", &[("x-user-id", b"bob")]).status,
        200,
        "another key"
    );
    let statuses: Vec<u16> = running.map(|r| r.join().unwrap()).into();
    assert_eq!(statuses, [200, 200]);
    assert_eq!(quick(&envoy), 200, "both slots back on completion");
    let completed = slots_released_counter("streams", SlotEnd::Completed);
    assert_eq!(envoy.wait_for_wasm_counter(&completed, 4), 4);
}

#[test]
fn a_slot_comes_back_when_the_client_leaves_mid_request() {
    let (envoy, upstream) = start(&streams(1, "5m"));
    let mut client = TcpStream::connect(envoy.addr()).unwrap();
    let request = "GET /slow?ms=10000 HTTP/1.1\r\nhost: test\r\nx-user-id: alice\r\n\r\n";
    client.write_all(request.as_bytes()).unwrap();
    upstream.wait_for_calls(1);
    assert_eq!(quick(&envoy), 429, "the slot is held");
    drop(client);
    assert!(admitted_again(&envoy), "the slot came back");
    let reset = slots_released_counter("streams", SlotEnd::Reset);
    assert_eq!(envoy.wait_for_wasm_counter(&reset, 1), 1);
}

#[test]
fn a_slot_comes_back_when_the_upstream_resets_or_times_out() {
    let upstream = LlmUpstream::start();
    let envoy = Envoy::options(&streams(1, "5m"))
        .upstream(upstream.addr())
        .route_timeout(Duration::from_secs(1))
        .start();
    let reset = envoy.get("/slow?ms=0", &[ALICE[0], ("x-test-reset", b"1")]);
    assert_eq!(reset.status, 503, "{reset:?}");
    assert_eq!(quick(&envoy), 200, "back after the reset");
    let timed_out = envoy.get("/slow?ms=3000", &ALICE);
    assert_eq!(timed_out.status, 504, "{timed_out:?}");
    assert_eq!(quick(&envoy), 200, "back after the timeout");
}

#[test]
fn a_request_longer_than_its_lease_keeps_its_slot() {
    let (envoy, upstream) = start(&streams(1, "4s"));
    let start = Instant::now();
    let long = slow_in_flight(envoy.addr(), 9_000, ALICE_IN_FLIGHT);
    upstream.wait_for_calls(1);
    for second in [3, 6, 8] {
        std::thread::sleep(
            (start + Duration::from_secs(second)).saturating_duration_since(Instant::now()),
        );
        assert_eq!(quick(&envoy), 429, "still held at {second}s: renewed");
    }
    assert_eq!(long.join().unwrap(), 200);
    assert_eq!(quick(&envoy), 200);
}

#[test]
fn a_reload_keeps_the_slots_in_use() {
    let upstream = LlmUpstream::start();
    let mut envoy = Envoy::options(&streams(2, "5m"))
        .upstream(upstream.addr())
        .ecds_from_file()
        .start();
    let running = [
        slow_in_flight(envoy.addr(), 3_000, ALICE_IN_FLIGHT),
        slow_in_flight(envoy.addr(), 3_000, ALICE_IN_FLIGHT),
    ];
    upstream.wait_for_calls(2);
    let reloaded = streams(2, "5m").replace(
        r#""policies": ["#,
        r#""version": "v2", "policies": [{"name": "per-ip", "key": ["ip"], "requests": 100, "per": "1s"}, "#,
    );
    envoy.update_plugin(&reloaded).unwrap();
    assert_eq!(quick(&envoy), 429, "the two in flight still count");
    let statuses: Vec<u16> = running.map(|r| r.join().unwrap()).into();
    assert_eq!(statuses, [200, 200]);
    assert!(
        admitted_again(&envoy),
        "given back under the configuration they began with"
    );
}
