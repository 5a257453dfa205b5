//! `--rlqs ADDR`: the Rate Limit Quota Service on a gRPC port of its own, with gRPC health beside
//! it and the bearer token of `--token-file` asked of each stream; the RLS's port no longer
//! serves it; `--rlqs` without `--rls-config` refused at start, naming both; the admin API's
//! view of it (`GET /admin/v1/rlqs`).
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

#[path = "rlqs/client.rs"]
mod rlqs;

use std::time::Duration;

use rlqs::{bucket, open, per_minute, reports, Rlqs};
use serde_json::json;
use sluice_testkit::grpc::health_check;
use sluice_testkit::http::send_with;
use sluice_testkit::service::run_to_exit;

const RLQS_SERVICE: &str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";
const RLS_SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";
const LIMITS: &str = "\
domain: api
descriptors:
  - key: name
    rate_limit: {unit: minute, requests_per_unit: 600}
";

#[tokio::test]
async fn the_rlqs_has_its_own_port_with_health_and_the_rls_port_serves_only_the_rls() {
    let ports = ["--rls", "127.0.0.1:0", "--rlqs", "127.0.0.1:0"];
    let both = Rlqs::start(&["--memory"], LIMITS, &ports, &[]);
    let (rlqs, rls) = (both.address(), both.service.rls.unwrap());
    assert_ne!(rlqs, rls);
    let mut stream = open(rlqs, None).await.unwrap();
    // A first report of 50 requests: 600 a minute, the whole budget for the only Envoy.
    let answer = stream.report(reports("api", bucket("b"), 50, 0)).await;
    assert_eq!(per_minute(&answer), Some(600), "{answer:?}");
    let refused = match open(rls, None).await {
        Ok(mut elsewhere) => {
            elsewhere.send(reports("api", bucket("b"), 50, 0)).await;
            elsewhere.answers.message().await.unwrap_err()
        }
        Err(status) => status,
    };
    assert_eq!(refused.code(), tonic::Code::Unimplemented, "{refused}");
    let check = |address, name: &'static str| {
        tokio::task::spawn_blocking(move || health_check(address, name))
    };
    assert_eq!(check(rlqs, RLQS_SERVICE).await.unwrap(), "SERVING");
    assert_eq!(check(rlqs, "").await.unwrap(), "SERVING");
    assert_eq!(check(rlqs, RLS_SERVICE).await.unwrap(), "NOT_FOUND");
    assert_eq!(check(rls, RLQS_SERVICE).await.unwrap(), "NOT_FOUND");
}

#[tokio::test]
async fn a_stream_without_the_bearer_token_is_refused() {
    let dir = sluice_testkit::TempDir::new("rlqs-token");
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-Token_1\n").unwrap();
    let extra = ["--token-file", token.to_str().unwrap()];
    let service = Rlqs::start(&["--memory"], LIMITS, &["--rlqs", "127.0.0.1:0"], &extra);
    for wrong in [None, Some("Bearer nope")] {
        let refused = match open(service.address(), wrong).await {
            Ok(mut stream) => {
                stream.send(reports("api", bucket("b"), 1, 0)).await;
                stream.answers.message().await.unwrap_err()
            }
            Err(status) => status,
        };
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused}");
    }
    let mut stream = open(service.address(), Some("Bearer s3cret-Token_1"))
        .await
        .unwrap();
    let answer = stream.report(reports("api", bucket("b"), 1, 0)).await;
    assert!(per_minute(&answer).is_some(), "{answer:?}");
}

#[tokio::test]
async fn a_replica_holds_its_flags_bounds_of_streams_and_buckets() {
    let extra = ["--rlqs-max-streams", "2", "--rlqs-max-buckets", "3"];
    let service = Rlqs::start(&["--memory"], LIMITS, &["--rlqs", "127.0.0.1:0"], &extra);
    let address = service.address();
    let mut first = open(address, None).await.unwrap();
    let mut second = open(address, None).await.unwrap();
    for (stream, name) in [(&mut first, "a"), (&mut second, "b")] {
        let answer = stream.report(reports("api", bucket(name), 1, 0)).await;
        assert!(per_minute(&answer).is_some(), "{answer:?}");
    }
    // A third stream is refused, as soon as it is opened or at its first message.
    let refused = match open(address, None).await {
        Ok(mut third) => {
            third.send(reports("api", bucket("c"), 1, 0)).await;
            third.answers.message().await.unwrap_err()
        }
        Err(status) => status,
    };
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused}");
    // Buckets: 2 kept, 1 more is the bound; the fourth gets no assignment.
    let answer = first.report(reports("api", bucket("c"), 1, 0)).await;
    assert!(per_minute(&answer).is_some(), "{answer:?}");
    let mut both = reports("api", bucket("a"), 1, 0);
    both.bucket_quota_usages
        .extend(reports("api", bucket("d"), 1, 0).bucket_quota_usages);
    let answer = first.report(both).await;
    let answered: Vec<_> = (answer.bucket_action.iter())
        .map(|action| action.bucket_id.clone().unwrap())
        .collect();
    assert_eq!(answered, [bucket("a")], "{answer:?}");
    // A stream that ends gives its place back.
    drop(second);
    let mut third = None;
    for _ in 0..50 {
        if let Ok(mut stream) = open(address, None).await {
            let answered = tokio::time::timeout(Duration::from_millis(500), async {
                stream.send(reports("api", bucket("a"), 1, 0)).await;
                stream.answers.message().await
            })
            .await;
            if matches!(answered, Ok(Ok(Some(_)))) {
                third = Some(stream);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(third.is_some(), "no place given back");
    let zero = ["--memory", "--rlqs", "127.0.0.1:0", "--rls-config", "x"];
    let zero = [&zero[..], &["--rlqs-max-streams", "0"]].concat();
    let (status, _, stderr) = run_to_exit(&zero, &[], Duration::from_secs(10));
    assert!(!status.success());
    assert!(
        stderr.contains("--rlqs-max-streams")
            && stderr.contains("must be a whole number of 1 or more"),
        "{stderr}"
    );
}

#[test]
fn rlqs_without_its_limits_is_refused_at_start_naming_both_flags() {
    let args = ["--memory", "--rlqs", "127.0.0.1:0"];
    let (status, stdout, stderr) = run_to_exit(&args, &[], Duration::from_secs(10));
    assert!(!status.success());
    let said = format!("{stdout}{stderr}");
    assert!(
        said.contains("--rls-config") && said.contains("--rlqs"),
        "{said}"
    );
}

#[tokio::test]
async fn the_admin_api_shows_each_descriptor_as_this_replica_serves_it() {
    let dir = sluice_testkit::TempDir::new("rlqs-admin");
    let admin = dir.path().join("admin");
    std::fs::write(&admin, "oncall s3cret-admin-token\n").unwrap();
    let extra = ["--admin-token-file", admin.to_str().unwrap()];
    let ports = ["--listen", "127.0.0.1:0", "--rlqs", "127.0.0.1:0"];
    let service = Rlqs::start(&["--memory"], LIMITS, &ports, &extra);
    let (mut one, mut two) = (
        open(service.address(), None).await.unwrap(),
        open(service.address(), None).await.unwrap(),
    );
    assert!(per_minute(&one.report(reports("api", bucket("b"), 50, 0)).await).is_some());
    assert!(per_minute(&two.report(reports("api", bucket("b"), 30, 5)).await).is_some());
    let headers: &[(&str, &[u8])] = &[("authorization", b"Bearer s3cret-admin-token")];
    let shown = send_with(service.service.addr, "GET", "/admin/v1/rlqs", headers, b"");
    assert_eq!(shown.status, 200, "{shown:?}");
    let shown = shown.json();
    assert_eq!(shown["streams"], 2, "{shown}");
    let name = &shown["descriptors"][0];
    assert_eq!(
        (&name["domain"], &name["descriptor"]),
        (&json!("api"), &json!("name"))
    );
    let counts = [
        &name["reports"],
        &name["allowed"],
        &name["denied"],
        &name["envoys"],
    ];
    assert_eq!(
        counts,
        [&json!(2), &json!(80), &json!(5), &json!(2)],
        "{shown}"
    );
    // Both Envoys' shares of the 600 a minute: at most the budget, beyond a newcomer's starting
    // fiftieth (docs/rlqs.md#how-it-shares-a-budget).
    let assigned = name["assigned"].as_u64().unwrap();
    assert!((1..=600 + 600 / 50).contains(&assigned), "{shown}");
    // Shown to tokens only; a bucket's value is never shown.
    let unauthorized = send_with(service.service.addr, "GET", "/admin/v1/rlqs", &[], b"");
    assert_eq!(unauthorized.status, 401);
    assert!(!shown.to_string().contains("\"b\""), "{shown}");
}
