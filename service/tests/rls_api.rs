//! `sluice-service --rls` alone, through a tonic client: request validation as
//! envoyproxy/ratelimit answers it, exact counts under concurrency, a Redis Cluster, Redis
//! failures, configuration reloads, response headers, metrics and the command line.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;
#[path = "rls/client.rs"]
mod rls;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::clock::{redis_time_us, window_around};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{rate_limit, Code};
use envoy_types::pb::google::protobuf::UInt64Value;
use rls::{ask, codes, connect, oks_then_over, overall, overall_codes, request, Rls};
use sluice_testkit::http::get;
use sluice_testkit::redis::{RedisCluster, RedisServer};
use sluice_testkit::service::run_to_exit;
use tonic::Code as GrpcCode;

const PER_USER: &str = "domain: api
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 3}
";

fn single(redis: &RedisServer) -> Vec<String> {
    vec!["--redis".into(), redis.url()]
}

fn start(redis: &RedisServer, yaml: &str, extra: &[&str]) -> Rls {
    let url = redis.url();
    Rls::start(&["--redis", &url], yaml, extra)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_empty_domain_or_descriptor_list_is_an_error_and_an_unknown_domain_is_ok() {
    let redis = RedisServer::start();
    let rls = start(&redis, PER_USER, &[]);
    let mut client = connect(&rls).await;
    let no_domain = client
        .should_rate_limit(request("", &[&[("user", "a")]], 0))
        .await;
    let status = no_domain.unwrap_err();
    assert_eq!(status.code(), GrpcCode::Unknown);
    assert_eq!(status.message(), "rate limit domain must not be empty");
    let none = client
        .should_rate_limit(request("api", &[], 0))
        .await
        .unwrap_err();
    assert_eq!(none.code(), GrpcCode::Unknown);
    assert_eq!(
        none.message(),
        "rate limit descriptor list must not be empty"
    );
    let unknown = ask(
        &mut client,
        request("other", &[&[("user", "a")], &[("x", "y")]], 0),
    )
    .await;
    assert_eq!(overall(&unknown), Code::Ok);
    assert_eq!(codes(&unknown), [Code::Ok, Code::Ok]);
    assert!(unknown.statuses.iter().all(|s| s.current_limit.is_none()));
    assert_eq!(redis.client().cmd(&["DBSIZE"]).int(), 0, "nothing counted");
}

#[tokio::test(flavor = "multi_thread")]
async fn each_value_of_a_value_less_descriptor_gets_its_own_limit_with_its_status() {
    let redis = RedisServer::start();
    let rls = start(&redis, PER_USER, &[]);
    let mut client = connect(&rls).await;
    let alice = request("api", &[&[("user", "alice")]], 0);
    assert_eq!(
        overall_codes(&mut client, &alice, 4).await,
        oks_then_over(3, 1)
    );
    let bob = ask(&mut client, request("api", &[&[("user", "bob")]], 0)).await;
    assert_eq!(overall(&bob), Code::Ok);
    let status = &bob.statuses[0];
    let limit = status.current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (3, rate_limit::Unit::Day.into())
    );
    assert_eq!(status.limit_remaining, 2);
    let until = status.duration_until_reset.unwrap();
    assert!((1..=86_400).contains(&until.seconds), "{until:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn hits_addend_charges_that_many_past_the_limit_too_and_a_hits_addend_of_zero_only_asks() {
    let redis = RedisServer::start();
    let rls = start(&redis, "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 10}\n", &[]);
    let mut client = connect(&rls).await;
    let heavy = request("api", &[&[("user", "a")]], 4);
    assert_eq!(
        overall_codes(&mut client, &heavy, 2).await,
        oks_then_over(2, 0)
    );
    let mut asking = request("api", &[&[("user", "a")]], 0);
    asking.descriptors[0].hits_addend = Some(UInt64Value { value: 0 });
    let remaining = |answer: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        (overall(answer), answer.statuses[0].limit_remaining)
    };
    for _ in 0..3 {
        let answer = ask(&mut client, asking.clone()).await;
        assert_eq!(remaining(&answer), (Code::Ok, 2), "8 of 10");
    }
    let over = ask(&mut client, heavy.clone()).await;
    assert_eq!(remaining(&over), (Code::OverLimit, 0), "12 of 10");
    let answer = ask(&mut client, asking).await;
    assert_eq!(
        remaining(&answer),
        (Code::OverLimit, 0),
        "over: asking is refused"
    );
    let one = request("api", &[&[("user", "a")]], 1);
    assert_eq!(
        overall_codes(&mut client, &one, 1).await,
        oks_then_over(0, 1)
    );
}

/// Limits of every algorithm whose windows neither start nor end during the test.
fn every_algorithm(per_ms: u64) -> String {
    format!(
        "domain: api
descriptors:
  - key: fixed_window
    rate_limit: {{requests_per_unit: 40, per: {per_ms}ms}}
  - key: sliding_window
    rate_limit: {{algorithm: sliding_window, requests_per_unit: 40, per: {per_ms}ms}}
  - key: sliding_log
    rate_limit: {{algorithm: sliding_log, requests_per_unit: 40, per: {per_ms}ms}}
  - key: token_bucket
    rate_limit: {{algorithm: token_bucket, requests_per_unit: 1, unit: hour, burst: 40}}
"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn parallel_clients_never_get_more_than_the_limit_of_any_algorithm() {
    let redis = RedisServer::start();
    let per_ms = window_around(redis_time_us(&mut redis.client()), 120_000..240_000, 40_000);
    let rls = start(&redis, &every_algorithm(per_ms), &[]);
    for algorithm in [
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "token_bucket",
    ] {
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let address = format!("http://{}", rls.service.rls.unwrap());
                tokio::spawn(async move {
                    let mut client = rls::Client::connect(address).await.unwrap();
                    let one = request("api", &[&[(algorithm, "k")]], 0);
                    let codes = overall_codes(&mut client, &one, 10).await;
                    codes.iter().filter(|&&c| c == Code::Ok).count()
                })
            })
            .collect();
        let mut allowed = 0;
        for task in tasks {
            allowed += task.await.unwrap();
        }
        assert_eq!(allowed, 40, "{algorithm}: 80 calls from 8 clients");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redis_cluster_counts_every_value_exactly_on_the_node_of_its_slot() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let rls = Rls::start(&["--redis-cluster", &urls], PER_USER, &[]);
    let mut client = connect(&rls).await;
    let mut allowed: BTreeMap<String, usize> = BTreeMap::new();
    for round in 0..5 {
        for user in 0..20 {
            let user = format!("user-{user}");
            // Two descriptors per call: their keys sit in different slots.
            let other = format!("{user}-{round}");
            let call = request("api", &[&[("user", &user)], &[("user", &other)]], 0);
            let answer = ask(&mut client, call).await;
            *allowed.entry(user).or_default() +=
                usize::from(answer.statuses[0].code == Code::Ok as i32);
        }
    }
    assert!(allowed.values().all(|&n| n == 3), "{allowed:?}");
    for node in &cluster.nodes {
        assert!(
            node.client().cmd(&["DBSIZE"]).int() > 0,
            "node {} holds no counter",
            node.port
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn with_redis_down_or_frozen_the_answer_is_unavailable_within_a_second_or_so() {
    let mut redis = RedisServer::start();
    let rls = start(&redis, PER_USER, &[]);
    let mut client = connect(&rls).await;
    let one = request("api", &[&[("user", "a")]], 0);
    redis.freeze();
    let started = Instant::now();
    let frozen = client.should_rate_limit(one.clone()).await.unwrap_err();
    let took = started.elapsed();
    redis.thaw();
    assert_eq!(frozen.code(), GrpcCode::Unavailable, "{frozen:?}");
    assert!(took < Duration::from_millis(1_800), "took {took:?}");
    redis.stop();
    let started = Instant::now();
    let down = client.should_rate_limit(one.clone()).await.unwrap_err();
    assert_eq!(down.code(), GrpcCode::Unavailable, "{down:?}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
    // A request that needs no counter is still answered.
    let unknown = ask(&mut client, request("other", &[&[("user", "a")]], 0)).await;
    assert_eq!(overall(&unknown), Code::Ok);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_changed_file_applies_within_seconds_and_a_bad_one_keeps_the_previous_limits() {
    let redis = RedisServer::start();
    let rls = start(&redis, PER_USER, &[]);
    let mut client = connect(&rls).await;
    let carol = request("api", &[&[("user", "carol")]], 0);
    assert_eq!(
        overall_codes(&mut client, &carol, 4).await,
        oks_then_over(3, 1)
    );
    rls.rewrite(&PER_USER.replace("requests_per_unit: 3", "requests_per_unit: 5"));
    let applied = sluice_testkit::wait_for(Duration::from_secs(5), || {
        let answer = futures_block(ask(&mut client, request("api", &[&[("user", "dave")]], 0)));
        (answer.statuses[0].current_limit.as_ref()?.requests_per_unit == 5).then_some(())
    });
    assert!(
        applied.is_some(),
        "the new limit was not applied within 5 s"
    );
    // A counter belongs to the numbers that wrote it: carol's 3 of the old limit do not count
    // against the new one, and were not touched by it.
    assert_eq!(
        overall_codes(&mut client, &carol, 6).await,
        oks_then_over(5, 1)
    );

    rls.rewrite(
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: fortnight\n",
    );
    let refused = "rls configuration refused, the previous one keeps serving";
    let logged = rls.service.event(refused, Duration::from_secs(5));
    let logged = logged.expect("no error was logged");
    assert_eq!(logged["level"], "ERROR");
    let error = logged["error"].as_str().unwrap();
    let expected =
        "limits.yaml:3: descriptors[0]: rate_limit.unit: invalid rate limit unit 'fortnight'";
    assert!(error.ends_with(expected), "{logged}");
    let erin = request("api", &[&[("user", "erin")]], 0);
    assert_eq!(
        overall_codes(&mut client, &erin, 6).await,
        oks_then_over(5, 1)
    );
}

/// Runs a future to completion from synchronous code inside a multi-threaded runtime.
fn futures_block<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(future))
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_reloads_at_once_and_does_not_stop_the_service() {
    let redis = RedisServer::start();
    let rls = start(&redis, PER_USER, &[]);
    let status = std::process::Command::new("kill")
        .args(["-HUP", &rls.service.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let loaded = rls
        .service
        .event("rls configuration loaded", Duration::from_secs(2));
    assert_eq!(loaded.expect("no reload logged")["domains"], 1);
    let mut client = connect(&rls).await;
    assert_eq!(
        overall(&ask(&mut client, request("api", &[&[("user", "a")]], 0)).await),
        Code::Ok
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn response_headers_report_the_tightest_limit_when_asked_for() {
    let redis = RedisServer::start();
    let rls = start(&redis, PER_USER, &["--rls-headers", "both"]);
    let mut client = connect(&rls).await;
    let one = request("api", &[&[("user", "a")]], 0);
    let headers = |response: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        let all = response.response_headers_to_add.iter();
        all.map(|h| (h.key.clone(), h.value.clone()))
            .collect::<BTreeMap<_, _>>()
    };
    let first = headers(&ask(&mut client, one.clone()).await);
    assert_eq!(first["x-ratelimit-limit"], "3");
    assert_eq!(first["x-ratelimit-remaining"], "2");
    assert_eq!(first["ratelimit-policy"], "\"user\";q=3;w=86400");
    assert!(
        first["ratelimit"].starts_with("\"user\";r=2;t="),
        "{first:?}"
    );
    assert!(!first.contains_key("retry-after"));
    overall_codes(&mut client, &one, 2).await;
    let over = headers(&ask(&mut client, one).await);
    assert_eq!(over["x-ratelimit-remaining"], "0");
    assert!(over["retry-after"].parse::<u64>().unwrap() >= 1, "{over:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_hits_per_domain_and_descriptor_next_to_the_http_api() {
    let redis = RedisServer::start();
    let url = redis.url();
    let rls = Rls::start(&["--redis", &url, "--listen", "127.0.0.1:0"], PER_USER, &[]);
    let mut client = connect(&rls).await;
    overall_codes(&mut client, &request("api", &[&[("user", "a")]], 0), 5).await;
    let metrics = get(rls.service.addr, "/metrics");
    assert_eq!(metrics.status, 200);
    let text = metrics.text();
    for line in [
        r#"sluice_service_rls_total_hits_total{domain="api",descriptor="user"} 5"#,
        r#"sluice_service_rls_within_limit_total{domain="api",descriptor="user"} 3"#,
        r#"sluice_service_rls_over_limit_total{domain="api",descriptor="user"} 2"#,
        r#"sluice_service_rls_near_limit_total{domain="api",descriptor="user"} 1"#,
        r#"sluice_service_rls_config_loads_total{result="success"} 1"#,
        "sluice_service_rls_config_domains 1",
        "sluice_service_redis_up 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{}",
            text
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leaky_bucket_holds_each_answer_until_the_requests_turn() {
    let redis = RedisServer::start();
    let yaml = "domain: api\ndescriptors:\n  - key: shaped\n    rate_limit: {algorithm: leaky_bucket, requests_per_unit: 5, unit: second, max_delay: 500ms}\n";
    let rls = start(&redis, yaml, &[]);
    let client = connect(&rls).await;
    let one = request("api", &[&[("shaped", "k")]], 0);
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let (mut client, one) = (client.clone(), one.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                let answer = ask(&mut client, one).await;
                (started.elapsed(), overall(&answer))
            })
        })
        .collect();
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    answers.sort();
    // Four at once at 5 a second: the first passes at once, the next two wait 200 and 400 ms,
    // and the fourth would wait 600 ms, more than max_delay: it is refused at once.
    let codes: Vec<Code> = answers.iter().map(|&(_, code)| code).collect();
    let held: Vec<u128> = answers.iter().map(|(took, _)| took.as_millis()).collect();
    assert_eq!(
        codes.iter().filter(|&&c| c == Code::OverLimit).count(),
        1,
        "{answers:?}"
    );
    assert_eq!(codes[3], Code::Ok, "{answers:?}");
    assert!(
        (150..350).contains(&held[2]) && (350..550).contains(&held[3]),
        "{answers:?}"
    );
}

#[test]
fn a_bad_configuration_at_start_exits_naming_file_and_line() {
    let redis = RedisServer::start();
    let dir = sluice_testkit::TempDir::new("rls-bad");
    let file = dir.path().join("bad.yaml");
    std::fs::write(
        &file,
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: day}\n    extra: 1\n",
    )
    .unwrap();
    let file = file.to_string_lossy().into_owned();
    let mut args: Vec<String> = single(&redis);
    args.extend(["--rls", "127.0.0.1:0", "--rls-config", &file].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, _, stderr) = run_to_exit(&args, &[], Duration::from_secs(10));
    assert_eq!(status.code(), Some(1), "{stderr}");
    let expected = format!("{file}:5: descriptors[0]: unknown field `extra`");
    assert!(stderr.contains(&expected), "{stderr}");
}

#[test]
fn rls_needs_its_configuration_and_help_documents_the_options() {
    let (status, _, stderr) = run_to_exit(
        &["--redis", "redis://x", "--rls", "127.0.0.1:0"],
        &[],
        Duration::from_secs(10),
    );
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--rls-config"), "{stderr}");
    let (status, stdout, _) = run_to_exit(&["--help"], &[], Duration::from_secs(10));
    assert!(status.success());
    for text in [
        "--rls <ADDR>",
        "--rls-config <PATH>",
        "--rls-headers <STYLE>",
        "SLUICE_RLS=",
        "SLUICE_RLS_CONFIG",
        "SIGHUP",
    ] {
        assert!(stdout.contains(text), "--help lacks {text:?}:\n{stdout}");
    }
}

#[test]
fn the_descriptor_keys_in_redis_are_hashes_of_any_bytes() {
    let redis = RedisServer::start();
    let rls = start(&redis, PER_USER, &[]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut client = connect(&rls).await;
        let odd = request("api", &[&[("user", "{tag} \u{1F600}\n")]], 0);
        assert_eq!(
            overall_codes(&mut client, &odd, 4).await,
            oks_then_over(3, 1)
        );
    });
    let sluice_testkit::resp::Reply::Array(keys) = redis.client().cmd(&["KEYS", "*"]) else {
        panic!("KEYS")
    };
    assert_eq!(keys.len(), 1);
    let key = keys[0].text();
    let hash = key
        .strip_prefix("sluice:rls:{")
        .and_then(|k| k.split_once('}'));
    let (hash, algorithm) = hash.unwrap_or_else(|| panic!("{key}"));
    assert!(
        hash.len() == 32 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
        "{key}"
    );
    assert_eq!(algorithm, ":fixed_window/86400000000/3");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_that_only_asks_and_a_refund_write_nothing() {
    let redis = RedisServer::start();
    let rls = start(&redis, PER_USER, &[]);
    let mut client = connect(&rls).await;
    let mut asking = request("api", &[&[("user", "a")]], 0);
    asking.descriptors[0].hits_addend = Some(UInt64Value { value: 0 });
    let mut refund = request("api", &[&[("user", "b")]], 0);
    refund.descriptors[0].hits_addend = Some(UInt64Value { value: 2 });
    refund.descriptors[0].is_negative_hits = true;
    for call in [asking, refund] {
        let answer = ask(&mut client, call).await;
        assert_eq!(
            (overall(&answer), answer.statuses[0].limit_remaining),
            (Code::Ok, 3)
        );
    }
    assert_eq!(redis.client().cmd(&["DBSIZE"]).int(), 0, "no key created");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_a_token_file_rls_calls_need_the_bearer_token_as_metadata() {
    let redis = RedisServer::start();
    let dir = sluice_testkit::TempDir::new("rls-token");
    let file = dir.path().join("token");
    std::fs::write(&file, "s3cret-Token_1\n").unwrap();
    let rls = start(&redis, PER_USER, &["--token-file", file.to_str().unwrap()]);
    let mut client = connect(&rls).await;
    let one = request("api", &[&[("user", "a")]], 0);
    for authorization in [None, Some("Bearer wrong"), Some("Basic s3cret-Token_1")] {
        let mut call = tonic::Request::new(one.clone());
        if let Some(value) = authorization {
            call.metadata_mut()
                .insert("authorization", value.parse().unwrap());
        }
        let refused = client.should_rate_limit(call).await.unwrap_err();
        assert_eq!(
            refused.code(),
            GrpcCode::Unauthenticated,
            "{authorization:?}"
        );
    }
    assert_eq!(redis.client().cmd(&["DBSIZE"]).int(), 0);
    let mut call = tonic::Request::new(one);
    (call.metadata_mut()).insert("authorization", "Bearer s3cret-Token_1".parse().unwrap());
    let answer = client.should_rate_limit(call).await.unwrap().into_inner();
    assert_eq!(overall(&answer), Code::Ok);
}
