//! Issue 31: a global slot is held only by a request that runs. Through a real Envoy, the real
//! sluice-service and a real Redis: a request reset while its check is under way, a check the
//! filter gives up on (its timeout shorter than the service's answer), a request another policy
//! refuses, and a batch of settlements the service refuses in part: each leaked its slot, at
//! the service, for the whole lease. The slots the service holds are read from Redis itself.
//!
//! The service is made slow by stopping Redis (SIGSTOP) for well under the service's own
//! 1 s command timeout: the check waits in Redis, as a stalled service would.

// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use serde_json::{json, Value};
use sluice::output::metrics::{slots_released_counter, SlotEnd};
use sluice_testkit::envoy::Envoy;
use sluice_testkit::llm::{Api, LlmUpstream};
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::Service;
use sluice_testkit::wait_for;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Two slots per tenant, across every Envoy, of a minute's lease: a slot leaked stays for the
/// whole test.
fn streams(requests: u64) -> Value {
    json!({"name": "streams", "scope": "global", "key": ["header:x-tenant"],
        "algorithm": "concurrency", "requests": requests, "lease": "1m", "failure_mode": "closed"})
}

fn config(timeout: &str, policies: Value) -> String {
    json!({"global": {"cluster": "sluice_service", "authority": "sluice-service",
        "timeout": timeout}, "policies": policies})
    .to_string()
}

fn envoy(config: &str, service: &Service, upstream: &LlmUpstream) -> Envoy {
    Envoy::options(config)
        .service(&[service.addr])
        .upstream(upstream.addr())
        .start()
}

/// The slots of `streams` that sluice-service holds in Redis, every key's.
fn held(redis: &RedisServer) -> i64 {
    const SUM: &str = "local n = 0 for _, k in ipairs(redis.call('KEYS', ARGV[1])) do \
        n = n + redis.call('ZCARD', k) end return n";
    let mut client = redis.client();
    client
        .cmd(&["EVAL", SUM, "0", "sluice:{streams/*}:concurrency"])
        .int()
}

/// Waits up to 3 s for the service to hold no slot: the slots held then.
fn settles_to_none(redis: &RedisServer) -> i64 {
    wait_for(Duration::from_secs(3), || (held(redis) == 0).then_some(0))
        .unwrap_or_else(|| held(redis))
}

/// A quick request of `tenant`'s (and `user`'s): its status.
fn quick(envoy: &Envoy, tenant: &str, user: &str) -> u16 {
    let headers = [
        ("x-tenant", tenant.as_bytes()),
        ("x-user-id", user.as_bytes()),
    ];
    envoy.get("/slow?ms=0", &headers).status
}

/// A request sent on a connection of its own, which the caller closes (resets) by dropping it.
fn sent(addr: SocketAddr, tenant: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).unwrap();
    let request = format!("GET /slow?ms=0 HTTP/1.1\r\nhost: test\r\nx-tenant: {tenant}\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    stream
}

/// Finding 1: clients that reset their request while its check waited at the service leaked
/// every slot of the key (5 of 5 in the review), with nothing in flight.
#[test]
fn a_request_reset_while_its_check_is_under_way_leaves_no_slot_at_the_service() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let upstream = LlmUpstream::start();
    let envoy = envoy(&config("2s", json!([streams(2)])), &service, &upstream);
    assert_eq!(quick(&envoy, "acme", "a"), 200, "the service answers");
    assert_eq!(settles_to_none(&redis), 0);

    redis.freeze();
    let resets: Vec<TcpStream> = (0..2).map(|_| sent(envoy.addr(), "acme")).collect();
    std::thread::sleep(Duration::from_millis(300));
    drop(resets);
    std::thread::sleep(Duration::from_millis(200));
    redis.thaw();

    assert_eq!(settles_to_none(&redis), 0, "slots held at the service");
    assert_eq!(quick(&envoy, "acme", "a"), 200);
    assert_eq!(
        upstream.calls().len(),
        2,
        "the reset requests never reached it"
    );
    let unused = slots_released_counter("streams", SlotEnd::Unused);
    assert_eq!(
        envoy.wait_for_wasm_counter(&unused, 2),
        2,
        "given back unused"
    );
}

/// Finding 1, without an attacker: one stall of the service longer than the filter's timeout
/// leaked every slot whose check timed out (3 of 3 in the review).
#[test]
fn a_check_that_times_out_leaves_no_slot_at_the_service() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let upstream = LlmUpstream::start();
    let envoy = envoy(&config("300ms", json!([streams(2)])), &service, &upstream);

    redis.freeze();
    let addr = envoy.addr();
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(move || {
                let tenant: [(&str, &[u8]); 1] = [("x-tenant", b"acme")];
                sluice_testkit::http::http_request(addr, "GET", "/slow?ms=0", &tenant).unwrap()
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(700));
    redis.thaw();
    let statuses: Vec<u16> = waiting
        .into_iter()
        .map(|t| t.join().unwrap().status)
        .collect();
    assert_eq!(
        statuses,
        [503, 503],
        "failing closed when the check timed out"
    );

    assert_eq!(settles_to_none(&redis), 0, "slots held at the service");
}

/// Finding 2: the service granted a slot to a request that another global policy refused; the
/// slot was never given back (2 of 3 and 3 of 3 fresh users refused in the review).
#[test]
fn a_request_another_policy_refuses_gives_back_the_slot_it_was_granted() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let upstream = LlmUpstream::start();
    let tight = json!({"name": "per-user", "scope": "global", "key": ["header:x-user-id"],
        "requests": 1, "per": "1h", "failure_mode": "closed"});
    let envoy = envoy(
        &config("2s", json!([streams(1), tight])),
        &service,
        &upstream,
    );

    assert_eq!(quick(&envoy, "acme", "alice"), 200);
    assert_eq!(settles_to_none(&redis), 0, "released when it ended");
    assert_eq!(
        quick(&envoy, "acme", "alice"),
        429,
        "alice's hour is used up"
    );
    assert_eq!(
        settles_to_none(&redis),
        0,
        "the slot granted to the refused request"
    );
    assert_eq!(
        quick(&envoy, "acme", "bob"),
        200,
        "the tenant's one slot is free"
    );
}

/// Finding 3: a charge the service refuses (its debt would outlive the service's --max-key-ttl)
/// failed its whole batch with a 400, which went back to the front of the worker's outbox,
/// again and again, and the slot releases with it.
#[test]
fn a_settlement_the_service_refuses_holds_back_no_release() {
    let redis = RedisServer::start();
    let service = Service::start_with(&["--redis", &redis.url(), "--max-key-ttl", "1d"], &[]);
    let upstream = LlmUpstream::start();
    // 30 tokens per 20 h: the service takes its checks (20 h), but a key that owes a burst more
    // would live 40 h, past the service's 1 d: it refuses every charge.
    let budget = json!({"name": "llm", "scope": "global", "key": ["header:x-api-key"],
        "requests": 30, "per": "20h", "failure_mode": "closed",
        "cost": {"from_response": {"usage": "total_tokens"}, "reserve": 10}});
    let config = config("2s", json!([streams(1), budget]));
    let envoy = Envoy::options(&config)
        .service(&[service.addr])
        .upstream(upstream.addr())
        .concurrency(1)
        .start();
    let ask = |tenant: &str| {
        let headers = [
            ("x-tenant", tenant),
            ("x-api-key", "alice"),
            ("x-test-usage", "total=20"),
        ];
        sluice_testkit::llm::call(envoy.addr(), Api::ChatCompletions, false, &headers).status
    };
    assert_eq!(ask("acme"), 200);
    assert_eq!(settles_to_none(&redis), 0, "the release went through");
    assert_eq!(ask("acme"), 200, "the tenant's one slot is free");
    assert!(
        envoy.wait_for_wasm_counter("sluice.settlements_rejected", 1) >= 1,
        "the refused charge is counted"
    );
    let metrics = sluice_testkit::http::get(service.addr, "/metrics").text();
    assert!(
        metrics.contains(r#"sluice_service_settlements_total{op="charge",result="rejected"}"#),
        "{metrics}"
    );
}
