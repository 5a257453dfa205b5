//! Global concurrency policies (`"scope": "global"`, `"algorithm": "concurrency"`) through two
//! real Envoys, the real sluice-service and a real Redis, in front of a slow upstream (the test
//! kit's LLM upstream, whose `/slow?ms=N` answers after N ms): one key's N slots shared by both
//! Envoys, renewed while their requests live, and the slots of an Envoy killed with SIGKILL
//! (never released) free again within their lease.

// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use serde_json::json;
use sluice_testkit::envoy::Envoy;
use sluice_testkit::llm::{slow_in_flight, LlmUpstream};
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::Service;
use sluice_testkit::wait_for;
use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Alice, as `slow_in_flight` sends her.
const ALICE_IN_FLIGHT: &[(&str, &str)] = &[("x-user-id", "alice")];

const ALICE: [(&str, &[u8]); 1] = [("x-user-id", b"alice")];
/// The slots' lease: the shortest there is, so that a lost slot frees itself soon.
const LEASE: Duration = Duration::from_secs(4);

/// At most two of a user's requests in flight across every Envoy, slots of a 4 s lease.
fn config() -> String {
    json!({
        "global": {"cluster": "sluice_service", "authority": "sluice-service", "timeout": "500ms"},
        "policies": [{"name": "streams", "scope": "global", "key": ["header:x-user-id"],
            "algorithm": "concurrency", "requests": 2, "lease": "4s", "failure_mode": "closed"}],
    })
    .to_string()
}

fn envoy(service: SocketAddr, upstream: &LlmUpstream) -> Envoy {
    Envoy::options(&config())
        .service(&[service])
        .upstream(upstream.addr())
        .start()
}

/// A request of alice's answered after `ms`, sent again until one is admitted (within 5 s):
/// the slot that a quick request took is given back from its Envoy's timer, a moment after it
/// ends.
fn admitted_in_flight(envoy: &Envoy, upstream: &LlmUpstream, ms: u64) -> JoinHandle<u16> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let calls = upstream.calls().len();
        let request = slow_in_flight(envoy.addr(), ms, ALICE_IN_FLIGHT);
        let reached = wait_for(Duration::from_secs(1), || {
            (upstream.calls().len() > calls || request.is_finished()).then_some(())
        });
        if reached.is_some() && upstream.calls().len() > calls {
            return request;
        }
        assert_eq!(request.join().unwrap(), 429, "refused, or nothing");
        assert!(Instant::now() < deadline, "no slot came back within 5 s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Alice's quick request: its status.
fn quick(envoy: &Envoy) -> u16 {
    envoy.get("/slow?ms=0", &ALICE).status
}

#[test]
fn two_envoys_share_one_keys_slots_and_a_killed_envoys_slots_free_within_their_lease() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let upstream = LlmUpstream::start();
    let mut first = envoy(service.addr, &upstream);
    let second = envoy(service.addr, &upstream);

    // One request in flight through each Envoy: the key's two slots are taken. 9 s: past the
    // lease, within the test kit's 10 s to read an answer.
    let lost = slow_in_flight(first.addr(), 9_000, ALICE_IN_FLIGHT);
    let long = slow_in_flight(second.addr(), 9_000, ALICE_IN_FLIGHT);
    upstream.wait_for_calls(2);
    assert_eq!(
        quick(&first),
        429,
        "both slots held, one through each Envoy"
    );
    assert_eq!(quick(&second), 429);

    // The first Envoy dies with its request: its slot is never given back.
    first.kill();
    let killed = Instant::now();
    assert_eq!(lost.join().unwrap(), 0, "the connection died with Envoy");
    assert_eq!(quick(&second), 429, "the lost slot is still counted");
    let freed = wait_for(LEASE + Duration::from_secs(3), || {
        (quick(&second) == 200).then(|| killed.elapsed())
    });
    let freed = freed.expect("the lost slot freed itself within its lease");
    assert!(
        freed <= LEASE + Duration::from_secs(1),
        "freed after {freed:?}"
    );

    // The second Envoy's request, past its own lease by now, still holds its slot: renewed.
    let again = admitted_in_flight(&second, &upstream, 3_000);
    assert_eq!(
        quick(&second),
        429,
        "the long request and the new one hold both slots"
    );
    assert_eq!((again.join().unwrap(), long.join().unwrap()), (200, 200));
    let back = wait_for(Duration::from_secs(3), || {
        (quick(&second) == 200).then_some(())
    });
    assert!(back.is_some(), "every slot back once the requests are done");
}

/// A slot is given back a moment after its request ends, not a timer's second later: one
/// request of alice's every 50 ms against her 2 slots finds one free each time. (Releases sent
/// once a second admitted about 2 in 20.)
#[test]
fn a_global_slot_is_free_again_moments_after_its_request_ends() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let upstream = LlmUpstream::start();
    let envoy = envoy(service.addr, &upstream);

    let requests = 60;
    let mut statuses = Vec::new();
    for _ in 0..requests {
        let sent = Instant::now();
        statuses.push(quick(&envoy));
        std::thread::sleep(Duration::from_millis(50).saturating_sub(sent.elapsed()));
    }
    let admitted = statuses.iter().filter(|&&s| s == 200).count();
    // A stalled worker or a slow call may refuse one or two on a loaded machine.
    assert!(
        admitted >= requests - 3,
        "{admitted} of {requests} admitted: {statuses:?}"
    );
}
