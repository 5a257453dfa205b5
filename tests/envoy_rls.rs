//! Envoy's own rate limit filter (`envoy.filters.http.ratelimit`) against `sluice-service --rls`
//! and a real Redis, as a team migrating from envoyproxy/ratelimit would run them: descriptors
//! from route `rate_limits` actions, limits in envoyproxy/ratelimit's YAML.

// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

/// Redis TIME and windows placed around it, as the service's tests use them.
#[allow(dead_code)]
#[path = "../service/tests/common/clock.rs"]
mod clock;

use std::time::{Duration, Instant};

use clock::{redis_time_us, window_with_left};
use sluice_testkit::envoy::{grpc_cluster, Envoy, EnvoyOptions};
use sluice_testkit::http::Response;
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::Service;

/// A front listener on `{port}` whose routes send descriptors to the RLS at `{rls}`, and a
/// backend listener on `{backend_port}` that answers 200. On `/`: (case=<x-case>),
/// (case=<x-case>, user=<x-user-id>), (remote_address=<client>); on `/heavy`:
/// (generic_key=heavy) with hits_addend 3; on `/usage`: (generic_key=usage) asked with
/// hits_addend 0 before the request, and charged `x-usage` hits once its stream is done (the
/// pattern of usage-based limits, `x-usage` standing in for the dynamic metadata a gateway sets).
const BOOTSTRAP: &str = r#"
admin:
  address: { socket_address: { address: 127.0.0.1, port_value: {admin_port} } }
static_resources:
  listeners:
  - name: front
    address: { socket_address: { address: 127.0.0.1, port_value: {port} } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: front
          use_remote_address: true
          route_config:
            virtual_hosts:
            - name: front
              domains: ["*"]
              routes:
              - match: { prefix: /heavy }
                route: { cluster: backend }
                # Envoy takes hits_addend only from rate limits in the filter's per-route config.
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                    - actions: [{ generic_key: { descriptor_value: heavy } }]
                      hits_addend: { number: 3 }
              - match: { prefix: /usage }
                route: { cluster: backend }
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                    - actions: [{ generic_key: { descriptor_value: usage } }]
                      hits_addend: { number: 0 }
                    - actions: [{ generic_key: { descriptor_value: usage } }]
                      apply_on_stream_done: true
                      hits_addend: { format: "%REQ(x-usage)%" }
              - match: { prefix: / }
                route:
                  cluster: backend
                  rate_limits:
                  - actions:
                    - request_headers: { header_name: x-case, descriptor_key: case }
                  - actions:
                    - request_headers: { header_name: x-case, descriptor_key: case }
                    - request_headers: { header_name: x-user-id, descriptor_key: user }
                  - actions: [{ remote_address: {} }]
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: test
              timeout: 0.5s
              failure_mode_deny: {failure_mode_deny}
              rate_limit_service:
                transport_api_version: V3
                grpc_service: { envoy_grpc: { cluster_name: sluice_rls } }
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  - name: backend
    address: { socket_address: { address: 127.0.0.1, port_value: {backend_port} } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: backend
          route_config:
            virtual_hosts:
            - name: backend
              domains: ["*"]
              routes:
              - match: { prefix: / }
                direct_response: { status: 200, body: { inline_string: ok } }
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: backend
    type: STATIC
    connect_timeout: 0.25s
    load_assignment:
      cluster_name: backend
      endpoints:
      - lb_endpoints:
        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: {backend_port} } } }
{rls_cluster}"#;

/// Redis and the RLS over it with `limits` (domain `test`).
struct Rls {
    redis: RedisServer,
    server: sluice_testkit::service::Rls,
}

impl Rls {
    fn start(limits: &str, extra: &[&str]) -> Rls {
        let redis = RedisServer::start();
        let server = sluice_testkit::service::Rls::start(&["--redis", &redis.url()], limits, extra);
        Rls { redis, server }
    }

    /// Envoy in front of this RLS, failing closed or open when it cannot answer.
    fn envoy(&self, failure_mode_deny: bool) -> Envoy {
        let bootstrap = BOOTSTRAP
            .replace(
                "{rls_cluster}",
                &grpc_cluster("sluice_rls", self.server.address()),
            )
            .replace("{failure_mode_deny}", &failure_mode_deny.to_string());
        EnvoyOptions::bootstrap(&bootstrap).start()
    }
}

fn limits(descriptors: &str) -> String {
    format!("domain: test\ndescriptors:\n{descriptors}")
}

fn get(envoy: &Envoy, case: &str, user: Option<&str>) -> Response {
    let mut headers: Vec<(&str, &[u8])> = vec![("x-case", case.as_bytes())];
    if let Some(user) = user {
        headers.push(("x-user-id", user.as_bytes()));
    }
    envoy.get("/", &headers)
}

fn statuses(envoy: &Envoy, case: &str, user: Option<&str>, n: usize) -> Vec<u16> {
    (0..n).map(|_| get(envoy, case, user).status).collect()
}

#[test]
fn per_descriptor_nested_and_value_less_limits_each_hold() {
    let rls = Rls::start(
        &limits(
            "  - key: case
    value: shared
    rate_limit: {unit: hour, requests_per_unit: 4}
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 2}
",
        ),
        &[],
    );
    let envoy = rls.envoy(false);
    // Two per user (the nested, value-less descriptor), four for the case value in all. As in
    // envoyproxy/ratelimit every descriptor of a request is charged, also when another refuses
    // it: alice's third request took one of the four.
    assert_eq!(
        statuses(&envoy, "shared", Some("alice"), 3),
        [200, 200, 429]
    );
    assert_eq!(statuses(&envoy, "shared", Some("bob"), 2), [200, 429]);
    // Another case value matches nothing: no limit.
    assert_eq!(statuses(&envoy, "other", Some("alice"), 4), [200; 4]);
    let limited = get(&envoy, "shared", Some("carol"));
    assert_eq!(limited.status, 429);
    assert_eq!(limited.header("x-envoy-ratelimited"), Some("true"));
}

#[test]
fn shadow_mode_lets_everything_through_and_unlimited_never_limits() {
    let rls = Rls::start(
        &limits(
            "  - key: case
    value: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: case
    value: internal
    rate_limit: {unlimited: true}
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 20}
",
        ),
        &["--listen", "127.0.0.1:0"],
    );
    let envoy = rls.envoy(false);
    assert_eq!(statuses(&envoy, "trial", None, 5), [200; 5]);
    assert_eq!(statuses(&envoy, "internal", None, 15), [200; 15]);
    // Every request counted against the address limit of 20 too.
    assert_eq!(statuses(&envoy, "other", None, 1), [429]);
    let metrics = sluice_testkit::http::get(rls.server.service.addr, "/metrics").text();
    let shadow = r#"sluice_service_rls_shadow_mode_total{domain="test",descriptor="case_trial"} 4"#;
    assert!(metrics.lines().any(|l| l == shadow), "{metrics}");
}

#[test]
fn hits_addend_from_the_route_charges_that_many() {
    let rls = Rls::start(
        &limits("  - key: generic_key\n    value: heavy\n    rate_limit: {unit: hour, requests_per_unit: 10}\n"),
        &[],
    );
    let envoy = rls.envoy(false);
    let heavy: Vec<u16> = (0..4).map(|_| envoy.get("/heavy", &[]).status).collect();
    assert_eq!(heavy, [200, 200, 200, 429]);
}

#[test]
fn usage_charged_when_the_stream_is_done_past_the_limit_refuses_the_next_request() {
    let rls = Rls::start(
        &limits("  - key: generic_key\n    value: usage\n    rate_limit: {unit: hour, requests_per_unit: 10}\n"),
        &[],
    );
    let envoy = rls.envoy(false);
    // Served: nothing used yet. Its 50 are charged after the response (Envoy drops the answer).
    let served = envoy.get("/usage", &[("x-usage", b"50")]);
    assert_eq!(served.status, 200);
    // The charge comes after the response: ask until it has landed, bounded.
    let started = Instant::now();
    let mut next = envoy.get("/usage", &[("x-usage", b"0")]).status;
    while next == 200 && started.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(50));
        next = envoy.get("/usage", &[("x-usage", b"0")]).status;
    }
    assert_eq!(next, 429, "the overspend was charged");
}

#[test]
fn two_limits_on_one_descriptor_both_hold_and_the_headers_show_the_tighter() {
    let rls = Rls::start(
        &limits(
            "  - key: case
    value: two
    rate_limit: {unit: hour, requests_per_unit: 5, name: hourly}
  - key: case
    value: two
    rate_limit: {unit: day, requests_per_unit: 3, name: daily}
",
        ),
        &["--rls-headers", "both"],
    );
    let envoy = rls.envoy(false);
    let first = get(&envoy, "two", None);
    assert_eq!(first.status, 200);
    assert_eq!(first.header("x-ratelimit-limit"), Some("3"));
    assert_eq!(first.header("x-ratelimit-remaining"), Some("2"));
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"daily\";q=3;w=86400")
    );
    assert_eq!(statuses(&envoy, "two", None, 2), [200, 200]);
    let refused = get(&envoy, "two", None);
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("x-ratelimit-remaining"), Some("0"));
    assert!(refused
        .header("ratelimit")
        .unwrap()
        .starts_with("\"daily\";r=0;t="));
    let retry_after: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=86_400).contains(&retry_after), "{retry_after}");
    // One counter per limit.
    assert_eq!(rls.redis.client().cmd(&["DBSIZE"]).int(), 2);
}

#[test]
fn a_sliding_window_refuses_the_burst_a_fixed_window_lets_through_at_its_edge() {
    let rls = Rls::start(&limits("  - key: case\n    value: none\n"), &[]);
    let envoy = rls.envoy(false);
    let now = redis_time_us(&mut rls.redis.client());
    let window_ms = window_with_left(now, 2_000..6_000, 900..1_300);
    rls.server.rewrite(&limits(&format!(
        "  - key: case
    value: sliding
    rate_limit: {{algorithm: sliding_window, requests_per_unit: 3, per: {window_ms}ms}}
  - key: case
    value: fixed
    rate_limit: {{requests_per_unit: 3, per: {window_ms}ms}}
"
    )));
    hang_up(&rls.server.service);
    std::thread::sleep(Duration::from_millis(200));
    let window = |rls: &Rls| redis_time_us(&mut rls.redis.client()) / 1000 / window_ms;
    let filled_in = window(&rls);
    assert_eq!(statuses(&envoy, "sliding", None, 4), [200, 200, 200, 429]);
    assert_eq!(statuses(&envoy, "fixed", None, 4), [200, 200, 200, 429]);
    assert_eq!(
        window(&rls),
        filled_in,
        "the test ran into the window's end"
    );
    // Just after the window's end: the fixed window starts again from zero, the sliding one
    // still weighs the last window's 3 at nearly their full count.
    let now_ms = redis_time_us(&mut rls.redis.client()) / 1000;
    std::thread::sleep(Duration::from_millis(window_ms - now_ms % window_ms + 100));
    assert_eq!(get(&envoy, "fixed", None).status, 200);
    assert_eq!(get(&envoy, "sliding", None).status, 429);
}

fn hang_up(service: &Service) {
    let status = std::process::Command::new("kill")
        .args(["-HUP", &service.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn with_redis_down_failure_mode_deny_decides_in_envoy() {
    let mut rls = Rls::start(
        &limits(
            "  - key: case\n    value: any\n    rate_limit: {unit: hour, requests_per_unit: 100}\n",
        ),
        &[],
    );
    let closed = rls.envoy(true);
    let open = rls.envoy(false);
    assert_eq!(get(&closed, "any", None).status, 200);
    rls.redis.stop();
    let started = Instant::now();
    assert_eq!(get(&closed, "any", None).status, 500);
    assert_eq!(get(&open, "any", None).status, 200);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    let allowed = open.admin_stats("ratelimit\\.failure_mode_allowed$");
    assert_eq!(allowed.values().sum::<u64>(), 1, "{allowed:?}");
}

#[test]
fn a_config_change_while_traffic_runs_applies_within_seconds_without_errors() {
    // Nothing passes at first; then one request per user an hour; then a broken file, which
    // must leave the second version serving.
    let user_limit = |requests: u32| {
        limits(&format!(
            "  - key: case\n    value: live\n    descriptors:\n      - key: user\n        rate_limit: {{unit: hour, requests_per_unit: {requests}}}\n"
        ))
    };
    let rls = Rls::start(&user_limit(0), &[]);
    let envoy = rls.envoy(true);
    let mut seen = Vec::new();
    let mut changed_at = None;
    let mut broken_at = None;
    let started = Instant::now();
    for n in 0..400 {
        if changed_at.is_none() && n == 20 {
            rls.server.rewrite(&user_limit(1));
            changed_at = Some(Instant::now());
        }
        let user = format!("user-{n}");
        let status = get(&envoy, "live", Some(&user)).status;
        seen.push(status);
        if status == 200 && broken_at.is_none() {
            let took = changed_at.map(|at| at.elapsed()).unwrap_or_default();
            assert!(took < Duration::from_secs(3), "applied after {took:?}");
            rls.server.rewrite(
                "domain: test\ndescriptors:\n  - key: case\n    rate_limit: {unit: eon}\n",
            );
            broken_at = Some(n);
        }
        if broken_at.is_some_and(|at| n > at + 50) || started.elapsed() > Duration::from_secs(20) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let first_ok = seen
        .iter()
        .position(|&s| s == 200)
        .expect("the new limit never applied");
    assert!(seen[..first_ok].iter().all(|&s| s == 429), "{seen:?}");
    // From the switch on, every user gets its one request, through the broken file too.
    assert!(seen[first_ok..].iter().all(|&s| s == 200), "{seen:?}");
    assert!(seen.len() > first_ok + 50, "{seen:?}");
}

/// The shipped demo (envoy/rls.yaml and envoy/rls-config/) on free ports.
#[test]
fn the_shipped_demo_gives_each_user_a_burst_of_five() {
    let root = env!("CARGO_MANIFEST_DIR");
    let redis = RedisServer::start();
    let url = redis.url();
    let config = format!("{root}/envoy/rls-config");
    let args = [
        "--redis",
        &url,
        "--rls",
        "127.0.0.1:0",
        "--rls-config",
        &config,
        "--rls-headers",
        "both",
    ];
    let service = Service::start_rls(&args, &[]);
    let demo = std::fs::read_to_string(format!("{root}/envoy/rls.yaml")).unwrap();
    let bootstrap = demo
        .replace("port_value: 10000", "port_value: {port}")
        .replace("port_value: 9901", "port_value: {admin_port}")
        .replace("port_value: 10001", "port_value: {backend_port}")
        .replace(
            "port_value: 8081",
            &format!("port_value: {}", service.rls.unwrap().port()),
        );
    let envoy = EnvoyOptions::bootstrap(&bootstrap).start();
    let alice: &[(&str, &[u8])] = &[("x-user-id", b"alice")];
    let codes: Vec<u16> = (0..6)
        .map(|_| envoy.get("/api/hello", alice).status)
        .collect();
    assert_eq!(codes, [200, 200, 200, 200, 200, 429]);
    let bob = envoy.get(
        "/api/hello",
        &[("x-user-id", b"bob"), ("x-plan", b"premium")],
    );
    assert_eq!(bob.status, 200);
    assert_eq!(bob.header("x-ratelimit-remaining"), Some("4"));
}
