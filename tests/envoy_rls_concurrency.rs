//! A concurrency limit through Envoy's own rate limit filter (`envoy.filters.http.ratelimit`)
//! against `sluice-service --rls` and a real Redis, as docs/rls.md configures it: one
//! `rate_limits` entry takes a slot before the request (`hits_addend` 1), a second one, sent when
//! the stream is done (`apply_on_stream_done`), gives it back (`is_negative_hits`). In front of
//! a slow upstream (the test kit's LLM upstream, whose `/slow?ms=N` answers after N ms).

// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use std::thread::JoinHandle;
use std::time::Duration;

use sluice_testkit::envoy::{grpc_cluster, Envoy, EnvoyOptions};
use sluice_testkit::llm::{slow_in_flight, LlmUpstream};
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::Rls;
use sluice_testkit::wait_for;

/// Alice, as `slow_in_flight` sends her.
const ALICE_IN_FLIGHT: &[(&str, &str)] = &[("x-user-id", "alice")];

/// A front listener on `{port}` whose route asks the RLS (`{rls_cluster}`) for a slot of
/// (user=<x-user-id>) before the request and gives it back when its stream is done, and sends
/// the request on to the upstream at `{upstream_port}`.
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
          route_config:
            virtual_hosts:
            - name: front
              domains: ["*"]
              routes:
              - match: { prefix: / }
                route: { cluster: upstream }
                # Envoy takes hits_addend only from rate limits in the filter's per-route config.
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                    - actions: [{ request_headers: { header_name: x-user-id, descriptor_key: user } }]
                      hits_addend: { number: 1 }
                    - actions: [{ request_headers: { header_name: x-user-id, descriptor_key: user } }]
                      apply_on_stream_done: true
                      hits_addend: { number: 1, is_negative_hits: true }
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: test
              timeout: 1s
              failure_mode_deny: true
              rate_limit_service:
                transport_api_version: V3
                grpc_service: { envoy_grpc: { cluster_name: sluice_rls } }
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: upstream
    type: STATIC
    connect_timeout: 0.25s
    load_assignment:
      cluster_name: upstream
      endpoints:
      - lb_endpoints:
        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: {upstream_port} } } }
{rls_cluster}"#;

/// Two requests of a user in flight at once.
const LIMITS: &str = "domain: test
descriptors:
  - key: user
    rate_limit: {algorithm: concurrency, requests_per_unit: 2, lease: 5m}
";
const N: usize = 2;

/// Redis, the RLS with `LIMITS`, the upstream and Envoy in front of them.
struct Setup {
    redis: RedisServer,
    _rls: Rls,
    upstream: LlmUpstream,
    envoy: Envoy,
}

fn setup() -> Setup {
    let redis = RedisServer::start();
    let rls = Rls::start(&["--redis", &redis.url()], LIMITS, &[]);
    let upstream = LlmUpstream::start();
    let bootstrap = BOOTSTRAP
        .replace("{rls_cluster}", &grpc_cluster("sluice_rls", rls.address()))
        .replace("{upstream_port}", &upstream.addr().port().to_string());
    let envoy = EnvoyOptions::bootstrap(&bootstrap).start();
    Setup {
        redis,
        _rls: rls,
        upstream,
        envoy,
    }
}

/// The slots the RLS holds in Redis, live or not: the members of its concurrency keys.
fn slots_in_redis(redis: &RedisServer) -> i64 {
    let mut client = redis.client();
    let keys = client.cmd(&["KEYS", "sluice:rls:*:concurrency"]);
    let sluice_testkit::resp::Reply::Array(keys) = keys else {
        panic!("KEYS")
    };
    (keys.iter())
        .map(|key| client.cmd(&["ZCARD", &key.text()]).int())
        .sum()
}

/// N + 1 slow requests at once, whose statuses are counted when they are done.
fn n_plus_one_at_once(setup: &Setup) -> (usize, usize) {
    let running: Vec<JoinHandle<u16>> = (0..=N)
        .map(|_| slow_in_flight(setup.envoy.addr(), 2_000, ALICE_IN_FLIGHT))
        .collect();
    let statuses: Vec<u16> = running.into_iter().map(|r| r.join().unwrap()).collect();
    let count = |status| statuses.iter().filter(|&&s| s == status).count();
    assert_eq!(count(200) + count(429), N + 1, "{statuses:?}");
    (count(200), count(429))
}

#[test]
fn n_plus_one_requests_in_flight_get_n_slots_and_give_them_back_when_done() {
    let setup = setup();
    assert_eq!(n_plus_one_at_once(&setup), (N, 1));
    assert_eq!(
        setup.upstream.calls().len(),
        N,
        "the refused one never left Envoy"
    );
    // The stream-done calls come after the responses: wait for them to reach Redis.
    let freed = wait_for(Duration::from_secs(5), || {
        (slots_in_redis(&setup.redis) == 0).then_some(())
    });
    assert!(
        freed.is_some(),
        "{} slots still held",
        slots_in_redis(&setup.redis)
    );
    assert_eq!(n_plus_one_at_once(&setup), (N, 1), "every slot came back");
}
