//! The filter's own protobuf for the Rate Limit Service protocol (`sluice::wire::rls`, written by hand
//! for the wasm VM) read and written by prost over Envoy's protos (`envoy-types`), as every RLS
//! server and Envoy itself read them.

// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use envoy_types::pb::envoy::config::core::v3::{grpc_service::TargetSpecifier, GrpcService};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit, Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration;
use prost::Message;
use sluice::core::algorithm::Kind;
use sluice::wire::protocol::Check;

fn check(cost: u64, entries: &[(&str, &str)]) -> Check {
    Check {
        key: "per-user/0000000000000001".into(),
        algorithm: Kind::TokenBucket,
        requests: 10,
        per_ms: 60_000,
        burst: 10,
        cost,
        take: None,
        max_delay_ms: None,
        slot: None,
        calendar: None,
        entries: entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

#[test]
fn prost_reads_the_filters_request_as_it_was_meant() {
    let checks = [
        check(3, &[("generic_key", "per-user"), ("x-user-id", "ålice ✓")]),
        check(
            1,
            &[("generic_key", "per-ip"), ("remote_address", "10.0.0.1")],
        ),
    ];
    let request =
        RateLimitRequest::decode(&sluice::wire::rls::encode("edge", &checks)[..]).unwrap();
    assert_eq!(request.domain, "edge");
    assert_eq!(request.hits_addend, 0, "costs differ: only per descriptor");
    type Entries = Vec<(String, String)>;
    let descriptors: Vec<(Entries, Option<u64>)> = request
        .descriptors
        .iter()
        .map(|d| {
            let entries = d.entries.iter().map(|e| (e.key.clone(), e.value.clone()));
            (entries.collect(), d.hits_addend.map(|h| h.value))
        })
        .collect();
    assert_eq!(descriptors[0].0, checks[0].entries);
    assert_eq!((descriptors[0].1, descriptors[1].1), (Some(3), Some(1)));
    assert!(request
        .descriptors
        .iter()
        .all(|d| d.limit.is_none() && !d.is_negative_hits));
    let same =
        RateLimitRequest::decode(&sluice::wire::rls::encode("edge", &checks[1..])[..]).unwrap();
    assert_eq!(same.hits_addend, 1, "one cost: the request's too");
}

fn status(code: Code, remaining: u32, reset: Option<(i64, i32)>) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name: "per-user".into(),
            requests_per_unit: 3,
            unit: Unit::Minute as i32,
        }),
        limit_remaining: remaining,
        duration_until_reset: reset.map(|(seconds, nanos)| Duration { seconds, nanos }),
        ..DescriptorStatus::default()
    }
}

#[test]
fn the_filter_reads_prosts_answer_as_it_was_meant() {
    let response = RateLimitResponse {
        overall_code: Code::OverLimit as i32,
        statuses: vec![
            status(Code::Ok, 2, Some((41, 500_000_000))),
            status(Code::OverLimit, 0, Some((7, 0))),
        ],
        ..RateLimitResponse::default()
    };
    let checks = [check(1, &[]), check(1, &[])];
    let answers = sluice::wire::rls::decode(&response.encode_to_vec(), &checks).unwrap();
    let second = 1_000_000_000;
    assert_eq!(
        (
            answers[0].allowed,
            answers[0].remaining,
            answers[0].reset_after
        ),
        (true, 2, 41 * second + second / 2)
    );
    assert_eq!(
        (
            answers[1].allowed,
            answers[1].remaining,
            answers[1].retry_after
        ),
        (false, 0, 7 * second)
    );
    let negative = RateLimitResponse {
        statuses: vec![status(Code::Ok, 1, Some((-5, -1)))],
        ..RateLimitResponse::default()
    };
    let answers = sluice::wire::rls::decode(&negative.encode_to_vec(), &checks[..1]).unwrap();
    assert_eq!(
        answers[0].reset_after, 0,
        "a negative duration reads as none"
    );
}

#[test]
fn prost_reads_the_grpc_service_the_filter_names_its_cluster_by() {
    let service =
        GrpcService::decode(&sluice::wire::rls::grpc_service("rls", "ratelimit.internal")[..]);
    let Some(TargetSpecifier::EnvoyGrpc(envoy)) = service.unwrap().target_specifier else {
        panic!("an envoy_grpc target");
    };
    assert_eq!(
        (envoy.cluster_name.as_str(), envoy.authority.as_str()),
        ("rls", "ratelimit.internal")
    );
}
