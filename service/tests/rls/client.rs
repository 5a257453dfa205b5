//! For the RLS tests: `sluice-service --rls` over a config directory of its own (the test kit's
//! `Rls`), and a tonic client of Envoy's Rate Limit Service protocol.
// Included by each RLS test binary, which uses only part of it; test support code.
#![allow(dead_code, clippy::unwrap_used, clippy::panic)]

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;

pub use sluice_testkit::service::Rls;

pub type Client = RateLimitServiceClient<Channel>;

/// A tonic client of `rls`.
pub async fn connect(rls: &Rls) -> Client {
    let address = format!("http://{}", rls.address());
    RateLimitServiceClient::connect(address).await.unwrap()
}

/// A request in `domain` with one descriptor per entry list, and `hits_addend`.
pub fn request(
    domain: &str,
    descriptors: &[&[(&str, &str)]],
    hits_addend: u32,
) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors
            .iter()
            .map(|entries| descriptor(entries))
            .collect(),
        hits_addend,
    }
}

pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: (entries.iter())
            .map(|&(key, value)| Entry {
                key: key.into(),
                value: value.into(),
            })
            .collect(),
        ..Default::default()
    }
}

/// `ShouldRateLimit`, which must succeed.
pub async fn ask(client: &mut Client, request: RateLimitRequest) -> RateLimitResponse {
    match client.should_rate_limit(request.clone()).await {
        Ok(response) => response.into_inner(),
        Err(status) => panic!("{request:?}: {status}"),
    }
}

pub fn overall(response: &RateLimitResponse) -> Code {
    Code::try_from(response.overall_code).unwrap()
}

pub fn codes(response: &RateLimitResponse) -> Vec<Code> {
    let statuses = response.statuses.iter();
    statuses.map(|s| Code::try_from(s.code).unwrap()).collect()
}

/// The overall codes of `n` calls of `request`, in order.
pub async fn overall_codes(client: &mut Client, request: &RateLimitRequest, n: usize) -> Vec<Code> {
    let mut codes = Vec::with_capacity(n);
    for _ in 0..n {
        codes.push(overall(&ask(client, request.clone()).await));
    }
    codes
}

/// `ok` OKs, then `over` OVER_LIMITs.
pub fn oks_then_over(ok: usize, over: usize) -> Vec<Code> {
    let mut codes = vec![Code::Ok; ok];
    codes.extend(vec![Code::OverLimit; over]);
    codes
}
