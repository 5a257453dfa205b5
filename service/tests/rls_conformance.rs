//! envoyproxy/ratelimit's documented configuration examples (its README, "Examples" 1 to 11),
//! each with the behaviour documented there, against `sluice-service --rls`, a real Redis and a
//! tonic client. `docs/rls.md` tabulates the results.
//!
//! Every example file loads as written. The behaviour tests raise units of a second or a minute
//! to an hour (the limits stay the same numbers), so that no fixed window ends in the middle of
//! a test; what is checked does not depend on the unit.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "rls/client.rs"]
mod rls;

use std::path::PathBuf;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use rls::{ask, codes, connect, oks_then_over, overall, overall_codes, request, Client, Rls};
use sluice_service::decision::check::Bounds;
use sluice_service::rules::config::Config;
use sluice_testkit::http::get;
use sluice_testkit::redis::RedisServer;

const EXAMPLE_1: &str = "domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit: {unit: second, requests_per_unit: 500}
  - key: database
    value: default
    rate_limit: {unit: second, requests_per_unit: 500}
";

const EXAMPLE_2: &str = "domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
";

const EXAMPLE_3: &str = "domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
";

const EXAMPLE_4_SHALLOW: &str = "domain: example4
descriptors:
  - key: key
    value: value
    rate_limit: {requests_per_unit: 300, unit: second}
";

const EXAMPLE_4_NESTED: &str = "domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit: {requests_per_unit: 300, unit: second}
";

const EXAMPLE_5: &str = "domain: internal
descriptors:
  - key: ldap
    rate_limit: {unlimited: true}
  - key: azure
    rate_limit: {unit: minute, requests_per_unit: 100}
";

const EXAMPLE_6: &str = "domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit: {requests_per_unit: 10, unit: second}
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit: {requests_per_unit: 20, unit: second}
";

const EXAMPLE_7: &str = "domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: {name: specific_limit, requests_per_unit: 5, unit: second}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
";

const EXAMPLE_8: &str = "domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: key1
    value: value1
    rate_limit: {unit: minute, requests_per_unit: 20}
";

const EXAMPLE_9: &str = "domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: path
    value: /api/*/action
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: route
    value: /api/*/resource/*/action
    rate_limit: {unit: minute, requests_per_unit: 20}
";

const EXAMPLE_10: &str = "domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
";

const EXAMPLE_10_WILDCARD: &str = "domain: example10_wildcard
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 100}
";

const EXAMPLE_11: &str = "domain: example11
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit: {unit: hour, requests_per_unit: 10}
";

const ALL: [&str; 13] = [
    EXAMPLE_1,
    EXAMPLE_2,
    EXAMPLE_3,
    EXAMPLE_4_SHALLOW,
    EXAMPLE_4_NESTED,
    EXAMPLE_5,
    EXAMPLE_6,
    EXAMPLE_7,
    EXAMPLE_8,
    EXAMPLE_9,
    EXAMPLE_10,
    EXAMPLE_10_WILDCARD,
    EXAMPLE_11,
];

/// The example with every unit of a second or a minute raised to an hour.
fn in_hours(example: &str) -> String {
    example
        .replace("unit: second", "unit: hour")
        .replace("unit: minute", "unit: hour")
}

/// The service with `example` (in hours), its Redis, a client; `--listen` for the metrics.
async fn serve(example: &str) -> (RedisServer, Rls, Client) {
    let redis = RedisServer::start();
    let url = redis.url();
    let rls = Rls::start(
        &["--redis", &url, "--listen", "127.0.0.1:0"],
        &in_hours(example),
        &[],
    );
    let client = connect(&rls).await;
    (redis, rls, client)
}

fn metrics(rls: &Rls) -> String {
    get(rls.service.addr, "/metrics").text()
}

#[test]
fn every_documented_example_loads_unchanged() {
    for (i, example) in ALL.iter().enumerate() {
        let file = (
            PathBuf::from(format!("example{i}.yaml")),
            example.to_string(),
        );
        if let Err(errors) = Config::from_files(&[file], &Bounds::default()) {
            panic!("{example}\n{errors:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn example_1_each_value_of_a_key_has_its_own_limit_and_others_none() {
    let (_redis, _rls, mut client) = serve(&EXAMPLE_1.replace("500", "3")).await;
    let users = request("mongo_cps", &[&[("database", "users")]], 0);
    assert_eq!(
        overall_codes(&mut client, &users, 4).await,
        oks_then_over(3, 1)
    );
    let default = request("mongo_cps", &[&[("database", "default")]], 0);
    assert_eq!(overall_codes(&mut client, &default, 1).await, [Code::Ok]);
    let other = ask(
        &mut client,
        request("mongo_cps", &[&[("database", "other")]], 0),
    )
    .await;
    assert_eq!(overall(&other), Code::Ok);
    assert_eq!(other.statuses[0].current_limit, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn example_2_nested_and_value_less_descriptors_limit_each_number_and_answer_per_descriptor() {
    let (_redis, _rls, mut client) = serve(EXAMPLE_2).await;
    let marketing = |number: &str| {
        let number = number.to_string();
        request(
            "messaging",
            &[
                &[("message_type", "marketing"), ("to_number", &number)],
                &[("to_number", &number)],
            ],
            0,
        )
    };
    for _ in 0..5 {
        let answer = ask(&mut client, marketing("2061111111")).await;
        assert_eq!(codes(&answer), [Code::Ok, Code::Ok]);
    }
    let sixth = ask(&mut client, marketing("2061111111")).await;
    assert_eq!(overall(&sixth), Code::OverLimit);
    assert_eq!(codes(&sixth), [Code::OverLimit, Code::Ok]);
    let remaining: Vec<u32> = sixth.statuses.iter().map(|s| s.limit_remaining).collect();
    assert_eq!(remaining, [0, 94]);
    let other = ask(&mut client, marketing("2062222222")).await;
    assert_eq!(codes(&other), [Code::Ok, Code::Ok]);
}

#[tokio::test(flavor = "multi_thread")]
async fn example_3_a_listed_value_is_matched_before_the_key_alone() {
    let (_redis, _rls, mut client) = serve(EXAMPLE_3).await;
    let listed = request("edge_proxy_per_ip", &[&[("remote_address", "50.0.0.5")]], 0);
    assert_eq!(
        overall_codes(&mut client, &listed, 2).await,
        oks_then_over(0, 2)
    );
    let other = request("edge_proxy_per_ip", &[&[("remote_address", "50.0.0.1")]], 0);
    assert_eq!(
        overall_codes(&mut client, &other, 11).await,
        oks_then_over(10, 1)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn example_4_a_limit_applies_only_at_the_depth_of_the_request_descriptor() {
    let two = request(
        "example4",
        &[&[("key", "value"), ("subkey", "subvalue")]],
        0,
    );
    let (_redis, _rls, mut client) = serve(EXAMPLE_4_SHALLOW).await;
    let shallow = ask(&mut client, two.clone()).await;
    assert_eq!(
        (overall(&shallow), &shallow.statuses[0].current_limit),
        (Code::Ok, &None)
    );
    let (_redis, _rls, mut client) = serve(EXAMPLE_4_NESTED).await;
    let nested = ask(&mut client, two).await;
    let limit = nested.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((overall(&nested), limit.requests_per_unit), (Code::Ok, 300));
}

#[tokio::test(flavor = "multi_thread")]
async fn example_5_unlimited_answers_ok_with_the_most_remaining_and_counts_nothing() {
    let (redis, _rls, mut client) = serve(EXAMPLE_5).await;
    let ldap = request("internal", &[&[("ldap", "x")]], 0);
    for _ in 0..3 {
        let answer = ask(&mut client, ldap.clone()).await;
        assert_eq!(
            (overall(&answer), answer.statuses[0].limit_remaining),
            (Code::Ok, u32::MAX)
        );
        assert_eq!(answer.statuses[0].current_limit, None);
    }
    assert_eq!(redis.client().cmd(&["DBSIZE"]).int(), 0);
    let azure = ask(&mut client, request("internal", &[&[("azure", "x")]], 0)).await;
    assert_eq!(azure.statuses[0].limit_remaining, 99);
}

#[tokio::test(flavor = "multi_thread")]
async fn example_6_shadow_mode_answers_ok_past_the_limit_and_counts_it() {
    let (_redis, rls, mut client) = serve(EXAMPLE_6).await;
    let user_a = request(
        "example6",
        &[&[("service", "auth-service"), ("user", "user-a")]],
        0,
    );
    assert_eq!(
        overall_codes(&mut client, &user_a, 12).await,
        oks_then_over(12, 0)
    );
    let user_b = request(
        "example6",
        &[&[("service", "auth-service"), ("user", "user-b")]],
        0,
    );
    assert_eq!(
        overall_codes(&mut client, &user_b, 21).await,
        oks_then_over(20, 1)
    );
    let text = metrics(&rls);
    let shadow = r#"sluice_service_rls_shadow_mode_total{domain="example6",descriptor="service.user_user-a"} 2"#;
    assert!(text.lines().any(|l| l == shadow), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn example_7_replaces_drops_the_named_limit_and_leaves_its_counter_alone() {
    let (_redis, _rls, mut client) = serve(EXAMPLE_7).await;
    let first = [("key_1", "value_1"), ("user", "bkthomps")];
    let second = [("key_2", "value_2"), ("user", "bkthomps")];
    let both = request("example7", &[&first, &second], 0);
    assert_eq!(
        overall_codes(&mut client, &both, 11).await,
        oks_then_over(10, 1)
    );
    let alone = request("example7", &[&first], 0);
    assert_eq!(
        overall_codes(&mut client, &alone, 6).await,
        oks_then_over(5, 1)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn example_8_detailed_metric_names_each_unspecified_value() {
    let (_redis, rls, mut client) = serve(EXAMPLE_8).await;
    for value in ["unspecified_value", "unspecified_value2", "value1"] {
        ask(&mut client, request("example8", &[&[("key1", value)]], 0)).await;
    }
    let text = metrics(&rls);
    for label in [
        "key1_unspecified_value",
        "key1_unspecified_value2",
        "key1_value1",
    ] {
        let line = format!(
            r#"sluice_service_rls_total_hits_total{{domain="example8",descriptor="{label}"}} 1"#
        );
        assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn example_9_wildcards_match_trailing_middle_and_several_stars() {
    let (_redis, _rls, mut client) = serve(EXAMPLE_9).await;
    for (key, value, limited) in [
        ("key1", "value1", true),
        ("key1", "valueXYZ", true),
        ("key1", "valu", false),
        ("path", "/api/123/action", true),
        ("path", "/api/user-id/action", true),
        ("path", "/api/123/other", false),
        ("route", "/api/v1/resource/123/action", true),
        ("route", "/api/v2/resource/456/other", false),
    ] {
        let answer = ask(&mut client, request("example9", &[&[(key, value)]], 0)).await;
        let limit = answer.statuses[0].current_limit.as_ref();
        assert_eq!(
            limit.map(|l| l.requests_per_unit),
            limited.then_some(20),
            "{key}={value}"
        );
    }
    // Without share_threshold each value has its own counter.
    let one = request("example9", &[&[("key1", "value3")]], 0);
    let other = request("example9", &[&[("key1", "value4")]], 0);
    assert_eq!(
        overall_codes(&mut client, &one, 21).await,
        oks_then_over(20, 1)
    );
    assert_eq!(overall_codes(&mut client, &other, 1).await, [Code::Ok]);
}

#[tokio::test(flavor = "multi_thread")]
async fn example_10_value_to_metric_puts_runtime_values_in_the_metric() {
    let (_redis, rls, mut client) = serve(EXAMPLE_10).await;
    for (route, method, subject) in [("api", "GET", "123"), ("web", "POST", "456")] {
        let entries = [
            ("route", route),
            ("http_method", method),
            ("subject_id", subject),
        ];
        ask(&mut client, request("example10", &[&entries], 0)).await;
    }
    let text = metrics(&rls);
    for label in [
        "route_api.http_method_GET.subject_id",
        "route_web.http_method_POST.subject_id",
    ] {
        let line = format!(
            r#"sluice_service_rls_total_hits_total{{domain="example10",descriptor="{label}"}} 1"#
        );
        assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
    }
    let (_redis, rls, mut client) = serve(EXAMPLE_10_WILDCARD).await;
    let entries = [
        ("user", "alice"),
        ("action", "readfile"),
        ("resource", "documents"),
    ];
    ask(&mut client, request("example10_wildcard", &[&entries], 0)).await;
    let line = r#"sluice_service_rls_total_hits_total{domain="example10_wildcard",descriptor="user_alice.action_readfile.resource"} 1"#;
    let text = metrics(&rls);
    assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn example_11_share_threshold_makes_every_match_share_one_counter() {
    let (_redis, _rls, mut client) = serve(EXAMPLE_11).await;
    let file = |key: &str, value: &str| request("example11", &[&[(key, value)]], 0);
    assert_eq!(
        overall_codes(&mut client, &file("files", "files/a.pdf"), 5).await,
        oks_then_over(5, 0)
    );
    assert_eq!(
        overall_codes(&mut client, &file("files", "files/b.csv"), 5).await,
        oks_then_over(5, 0)
    );
    assert_eq!(
        overall_codes(&mut client, &file("files", "files/c.txt"), 1).await,
        [Code::OverLimit]
    );
    let isolated = file("files_no_share", "files_no_share/a.pdf");
    assert_eq!(
        overall_codes(&mut client, &isolated, 11).await,
        oks_then_over(10, 1)
    );
    let other = file("files_no_share", "files_no_share/b.csv");
    assert_eq!(overall_codes(&mut client, &other, 1).await, [Code::Ok]);
}
