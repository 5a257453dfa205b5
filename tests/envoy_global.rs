//! Global limits through real Envoys, the real sluice-service and real redis-servers: one
//! budget across Envoys, leases and the over-limit cache, failure modes when Redis or the
//! service is gone, and a Redis Cluster.

// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use serde_json::{json, Value};
use sluice::limiter::PolicyOutcome::{Allowed, Denied};
use sluice::output::metrics::{degraded_counter, requests_counter};
use sluice_testkit::envoy::Envoy;
use sluice_testkit::redis::{RedisCluster, RedisServer};
use sluice_testkit::service::Service;
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

const ALICE: &[(&str, &[u8])] = &[("x-user-id", b"alice")];

/// How long a request waits for the service. Generous: on a loaded test machine a call that
/// times out falls to the policy's failure mode, which is not what most tests here look at
/// (with 500 ms, a clean-clone `make test` once saw a third request of a burst of 2 allowed,
/// open, while Envoy took 2 s to load its wasm).
const TIMEOUT_MS: u64 = 1500;

fn config(policies: Value) -> String {
    json!({
        "global": {"cluster": "sluice_service", "authority": "sluice-service",
                   "timeout": format!("{TIMEOUT_MS}ms")},
        "policies": policies,
    })
    .to_string()
}

/// A global per-user policy with no refill to speak of: `burst` requests, then denials.
fn per_user(burst: u64, extra: Value) -> Value {
    let mut policy = json!({"name": "global-user", "scope": "global", "key": ["header:x-user-id"],
        "requests": 1, "per": "1h", "burst": burst});
    for (k, v) in extra.as_object().unwrap() {
        policy[k] = v.clone();
    }
    policy
}

fn envoy(service: &[SocketAddr], policies: Value) -> Envoy {
    Envoy::options(&config(policies)).service(service).start()
}

fn statuses(envoy: &Envoy, n: usize, headers: &[(&str, &[u8])]) -> Vec<u16> {
    (0..n)
        .map(|_| envoy.get("/api/x", headers).status)
        .collect()
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|&&s| s == status).count()
}

#[test]
fn three_envoys_share_one_strict_global_limit_exactly() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let envoys: Vec<Envoy> = (0..3)
        .map(|_| envoy(&[service.addr], json!([per_user(10, json!({}))])))
        .collect();
    let all: Vec<u16> = (0..45)
        .map(|i| envoys[i % 3].get("/api/x", ALICE).status)
        .collect();
    assert_eq!(count(&all, 200), 10, "{all:?}");
    assert_eq!(count(&all, 429), 35, "{all:?}");
}

#[test]
fn leases_never_let_more_than_the_global_limit_through() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    // Closed: a call that times out answers 503 rather than an emergency budget's 200.
    let lease = json!({"lease": 4, "failure_mode": "closed"});
    let envoys: Vec<Envoy> = (0..3)
        .map(|_| envoy(&[service.addr], json!([per_user(20, lease.clone())])))
        .collect();
    let all: Vec<u16> = (0..60)
        .map(|i| envoys[i % 3].get("/api/x", ALICE).status)
        .collect();
    let admitted = count(&all, 200);
    // Leased tokens are real debits: at most the limit, at worst a lease short per Envoy.
    assert!(
        (20 - 3 * 3..=20).contains(&admitted),
        "admitted {admitted}: {all:?}"
    );
}

/// With leases of 2 from a burst of 5, a request paid from this Envoy's grant reports what alice
/// can still do (the global remaining plus the granted tokens still here), counting down one per
/// request as a local bucket would, with the service's time to full; never "0 left" while the
/// global bucket has tokens.
#[test]
fn requests_paid_from_a_grant_report_what_the_client_can_still_do() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let mut config: Value =
        serde_json::from_str(&config(json!([per_user(5, json!({"lease": 2}))]))).unwrap();
    config["headers"] = json!("both");
    let envoy = Envoy::options(&config.to_string())
        .service(&[service.addr])
        .start();
    let seen: Vec<(u16, String, String)> = (0..6)
        .map(|_| {
            let r = envoy.get("/api/x", ALICE);
            let header = |name: &str| r.header(name).unwrap_or("-").to_string();
            (
                r.status,
                header("x-ratelimit-remaining"),
                header("ratelimit"),
            )
        })
        .collect();
    let expected = [
        (200, "4", "r=4;t=7200"),
        (200, "3", "r=3;t=7200"),
        (200, "2", "r=2;t=14400"),
        (200, "1", "r=1;t=14400"),
        (200, "0", "r=0;t=18000"),
        (429, "0", "r=0;t=3600"),
    ];
    let expected: Vec<(u16, String, String)> = expected
        .iter()
        .map(|(s, left, fields)| (*s, left.to_string(), format!("\"global-user\";{fields}")))
        .collect();
    assert_eq!(seen, expected);
}

/// Calls per 1,000 requests of one hot key: strict, with the over-limit cache doing its work
/// once the key is over its limit, and with leases.
#[test]
fn the_cache_and_leases_spare_the_service_calls() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let calls_per_1000 = |policy: Value| {
        let name = policy["name"].as_str().unwrap().to_string();
        let envoy = envoy(&[service.addr], json!([policy]));
        let all = statuses(&envoy, 1000, ALICE);
        let (allowed, denied) = (count(&all, 200) as u64, count(&all, 429) as u64);
        assert_eq!(allowed + denied, 1000);
        // Each worker flushes all its counters at once: once both totals are in, so are the calls.
        assert_eq!(
            envoy.wait_for_wasm_counter(&requests_counter(&name, Allowed), allowed),
            allowed
        );
        if denied > 0 {
            assert_eq!(
                envoy.wait_for_wasm_counter(&requests_counter(&name, Denied), denied),
                denied
            );
        }
        (envoy.wasm_counter("sluice.callouts").unwrap_or(0), allowed)
    };
    let policy = |name: &str, requests: u64, burst: u64, extra: Value| {
        let mut p = per_user(burst, extra);
        p["name"] = json!(name);
        p["requests"] = json!(requests);
        p
    };
    let (strict, _) = calls_per_1000(policy("strict", 100_000_000, 100_000, json!({})));
    let (cached, cached_ok) = calls_per_1000(policy("cached", 1, 10, json!({})));
    let (leased, leased_ok) =
        calls_per_1000(policy("leased", 100_000_000, 100_000, json!({"lease": 20})));
    eprintln!(
        "calls per 1000 requests of one hot key: strict {strict}, over-limit cache {cached} \
         ({cached_ok} allowed), lease 20 {leased} ({leased_ok} allowed)"
    );
    assert_eq!(strict, 1000);
    assert_eq!(cached_ok, 10);
    assert!(cached <= 20, "{cached}");
    assert_eq!(leased_ok, 1000);
    assert!(leased <= 1000 / 20 + 10, "{leased}");
}

#[test]
fn a_global_and_a_local_policy_layer_in_one_request() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let local = json!({"name": "per-ip", "key": ["ip"], "requests": 1, "per": "1h", "burst": 4});
    let envoy = envoy(&[service.addr], json!([per_user(2, json!({})), local]));
    let r = envoy.get("/api/x", ALICE);
    assert_eq!(r.status, 200);
    assert_eq!(statuses(&envoy, 2, ALICE), [200, 429]);
    let denied = envoy.get("/api/x", ALICE);
    assert!(
        denied.text().contains(r#""policy":"global-user""#),
        "{}",
        denied.text()
    );
    // The global denials charged no local bucket: bob still has per-ip's last two tokens.
    let bob: &[(&str, &[u8])] = &[("x-user-id", b"bob")];
    assert_eq!(statuses(&envoy, 3, bob), [200, 200, 429]);
    assert!(envoy
        .get("/api/x", bob)
        .text()
        .contains(r#""policy":"per-ip""#));
}

/// Redis dies mid-test: an open policy falls back to its emergency budget, a closed one answers
/// 503, nothing hangs; Redis comes back: decisions are global again.
#[test]
fn redis_down_applies_the_failure_modes_and_recovery_resumes_global_decisions() {
    let mut redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let open = per_user(
        100,
        json!({"emergency": {"requests": 1, "per": "1h", "burst": 3}}),
    );
    let mut closed = per_user(100, json!({"failure_mode": "closed"}));
    closed["name"] = json!("closed-tenant");
    closed["key"] = json!(["header:x-tenant"]);
    let envoy = envoy(&[service.addr], json!([open, closed]));
    assert_eq!(statuses(&envoy, 2, ALICE), [200, 200]);

    redis.stop();
    let started = Instant::now();
    let degraded = statuses(&envoy, 10, ALICE);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    // The workers of one Envoy share its emergency bucket: a burst of 3 in all.
    assert_eq!(count(&degraded, 200), 3, "{degraded:?}");
    assert_eq!(count(&degraded, 429), 7, "{degraded:?}");
    let tenant: &[(&str, &[u8])] = &[("x-tenant", b"acme")];
    let r = envoy.get("/api/x", tenant);
    assert_eq!(r.status, 503);
    assert_eq!(
        r.text(),
        r#"{"error":"rate_limit_unavailable","policy":"closed-tenant","retry_after":1}"#
    );
    assert_eq!(r.header("retry-after"), Some("1"));

    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    while envoy.get("/api/x", tenant).status != 200 {
        assert!(Instant::now() < deadline, "global decisions did not resume");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(envoy.wait_for_wasm_counter(&degraded_counter("global-user"), 10) >= 10);
}

/// A cluster with no endpoints, and a service that never answers: the request completes within
/// the timeout and a margin, with the failure mode applied.
#[test]
fn no_endpoint_or_a_silent_service_never_hangs_a_request() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let closed = json!([per_user(100, json!({"failure_mode": "closed"}))]);
    for endpoints in [vec![], vec![silent_addr]] {
        let envoy = envoy(&endpoints, closed.clone());
        for _ in 0..4 {
            let started = Instant::now();
            let r = envoy.get("/api/x", ALICE);
            let took = started.elapsed();
            assert_eq!(r.status, 503, "{endpoints:?}: {}", r.text());
            assert!(
                took < Duration::from_millis(TIMEOUT_MS + 400),
                "{endpoints:?}: took {took:?}"
            );
        }
    }
    drop(silent);
}

#[test]
fn a_redis_cluster_keeps_keys_in_different_slots_exact() {
    let cluster = RedisCluster::start();
    let service = Service::start_cluster(&cluster.urls());
    let envoy = envoy(&[service.addr], json!([per_user(3, json!({}))]));
    for user in 0..12 {
        let id = format!("user-{user}");
        let headers: &[(&str, &[u8])] = &[("x-user-id", id.as_bytes())];
        assert_eq!(
            statuses(&envoy, 5, headers),
            [200, 200, 200, 429, 429],
            "{id}"
        );
    }
    for node in &cluster.nodes {
        assert!(
            node.client().cmd(&["DBSIZE"]).int() > 0,
            "node {} holds no key",
            node.port
        );
    }
}

/// Every algorithm in global scope: two Envoys share each key's budget exactly, and a global
/// leaky bucket holds requests for the turn the service gives them.
#[test]
fn every_algorithm_holds_one_budget_across_envoys() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let policy = |name: &str, algorithm: &str| {
        json!({"name": name, "scope": "global", "algorithm": algorithm,
            "match": {"path_prefix": format!("/{name}/")}, "key": ["header:x-user-id"],
            "requests": 4, "per": "1h"})
    };
    let mut token_bucket = policy("tb", "token_bucket");
    token_bucket["burst"] = json!(4);
    let policies = json!([
        token_bucket,
        policy("fw", "fixed_window"),
        policy("sw", "sliding_window"),
        policy("sl", "sliding_log"),
    ]);
    let envoys = [
        envoy(&[service.addr], policies.clone()),
        envoy(&[service.addr], policies),
    ];
    for name in ["tb", "fw", "sw", "sl"] {
        let path = format!("/{name}/x");
        let all: Vec<u16> = (0..10)
            .map(|i| envoys[i % 2].get(&path, ALICE).status)
            .collect();
        assert_eq!(
            all,
            [200, 200, 200, 200, 429, 429, 429, 429, 429, 429],
            "{name}"
        );
    }

    let mut leaky = policy("lb", "leaky_bucket");
    leaky["requests"] = json!(10);
    leaky["per"] = json!("1s");
    leaky["max_delay"] = json!("250ms");
    let envoy = envoy(&[service.addr], json!([leaky]));
    let started = Instant::now();
    let (first, second, third) = (
        envoy.get("/lb/x", ALICE),
        envoy.get("/lb/x", ALICE),
        envoy.get("/lb/x", ALICE),
    );
    assert_eq!((first.status, second.status, third.status), (200, 200, 200));
    let took = started.elapsed();
    // Sent one after another: the second waits for its turn 100 ms after the first, the
    // third 100 ms after that (less the time the second already waited).
    assert!(
        (Duration::from_millis(190)..Duration::from_millis(400)).contains(&took),
        "{took:?}"
    );
}

#[test]
fn the_filter_sends_the_services_token_from_its_vm_environment() {
    let redis = RedisServer::start();
    let dir = sluice_testkit::TempDir::new("token");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    let token_file = token_file.to_string_lossy().into_owned();
    let service = Service::start_with(&["--redis", &redis.url(), "--token-file", &token_file], &[]);
    let mut with_token = config(json!([per_user(2, json!({"failure_mode": "closed"}))]));
    let timeout = format!(r#""timeout":"{TIMEOUT_MS}ms""#);
    assert!(with_token.contains(&timeout));
    with_token = with_token.replace(
        &timeout,
        &format!(r#"{timeout},"token_env":"SLUICE_SERVICE_TOKEN""#),
    );
    let options = Envoy::options(&with_token).service(&[service.addr]);
    let envoy = options
        .clone()
        .vm_env("SLUICE_SERVICE_TOKEN", "s3cret-token")
        .start();
    assert_eq!(
        statuses(&envoy, 3, ALICE),
        [200, 200, 429],
        "decided by the service"
    );
    let wrong = options
        .clone()
        .vm_env("SLUICE_SERVICE_TOKEN", "guess")
        .start();
    let bob: &[(&str, &[u8])] = &[("x-user-id", b"bob")];
    assert_eq!(
        statuses(&wrong, 1, bob),
        [503],
        "refused by the service: fails closed"
    );
    let log = options
        .try_start()
        .err()
        .expect("refused without the variable");
    assert!(log.contains("global.token_env"), "{log}");
    assert!(!log.contains("s3cret"), "the token never reaches a log");
}
