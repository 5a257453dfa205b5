//! For the RLQS tests: `sluice-service --rlqs` over a limits directory of its own, and a tonic
//! client of Envoy's Rate Limit Quota Service that sends one message of reports at a time.
// Included by each RLQS test binary, which uses only part of it; test support code.
#![allow(dead_code, clippy::unwrap_used, clippy::panic)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use futures_util::StreamExt;
use sluice_testkit::service::Service;
use sluice_testkit::TempDir;
use tokio::sync::mpsc;
use tonic::Streaming;

/// A service with `ports` (`["--rlqs", "127.0.0.1:0"]`, and `--rls` too if wanted) over
/// `limits`, with `store` (`["--memory"]`, `["--redis", url]`) and `extra` arguments.
pub struct Rlqs {
    pub service: Service,
    pub dir: TempDir,
}

impl Rlqs {
    pub fn start(store: &[&str], limits: &str, ports: &[&str], extra: &[&str]) -> Rlqs {
        let dir = TempDir::new("rlqs-config");
        std::fs::write(dir.path().join("limits.yaml"), limits).unwrap();
        let config = dir.path().to_string_lossy().into_owned();
        let args = [store, ports, &["--rls-config", &config], extra].concat();
        let service = Service::start_rls(&args, &[]);
        Rlqs { service, dir }
    }

    pub fn address(&self) -> SocketAddr {
        self.service.rlqs.unwrap()
    }
}

/// One open `StreamRateLimitQuotas`: messages go out one at a time, answers come back.
pub struct Stream {
    sender: mpsc::Sender<RateLimitQuotaUsageReports>,
    pub answers: Streaming<RateLimitQuotaResponse>,
}

/// A client of the RLQS at `address`: one connection, shared by the streams opened on clones.
pub async fn connect(address: SocketAddr) -> Client {
    RateLimitQuotaServiceClient::connect(format!("http://{address}"))
        .await
        .unwrap()
}

pub type Client = RateLimitQuotaServiceClient<tonic::transport::Channel>;

/// Opens a stream at `address`, on a connection of its own, with `authorization` metadata if
/// given.
pub async fn open(
    address: SocketAddr,
    authorization: Option<&str>,
) -> Result<Stream, tonic::Status> {
    open_on(&mut connect(address).await, authorization).await
}

/// Opens a stream on `client`'s connection.
pub async fn open_on(
    client: &mut Client,
    authorization: Option<&str>,
) -> Result<Stream, tonic::Status> {
    let (sender, receiver) = mpsc::channel(16);
    let outbound =
        futures_util::stream::unfold(receiver, |mut r| async { r.recv().await.map(|m| (m, r)) });
    let mut request = tonic::Request::new(outbound);
    if let Some(value) = authorization {
        request
            .metadata_mut()
            .insert("authorization", value.parse().unwrap());
    }
    let answers = client.stream_rate_limit_quotas(request).await?.into_inner();
    Ok(Stream { sender, answers })
}

impl Stream {
    /// Sends `reports` and waits (at most 5 s) for the answer.
    pub async fn report(&mut self, reports: RateLimitQuotaUsageReports) -> RateLimitQuotaResponse {
        self.sender.send(reports).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(5), self.answers.next()).await;
        answer.unwrap().unwrap().unwrap()
    }

    /// Sends `reports` without waiting.
    pub async fn send(&self, reports: RateLimitQuotaUsageReports) {
        self.sender.send(reports).await.unwrap();
    }
}

/// The bucket `{name: <name>}`.
pub fn bucket(name: &str) -> BucketId {
    BucketId {
        bucket: HashMap::from([("name".to_owned(), name.to_owned())]),
    }
}

/// A message of one report in `domain`: `allowed` and `denied` requests of `bucket`.
pub fn reports(
    domain: &str,
    bucket: BucketId,
    allowed: u64,
    denied: u64,
) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.to_owned(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(bucket),
            time_elapsed: None,
            num_requests_allowed: allowed,
            num_requests_denied: denied,
        }],
    }
}

/// The first action's token bucket as requests per minute, 0 for deny-all; `None` without an
/// assignment.
pub fn per_minute(response: &RateLimitQuotaResponse) -> Option<u64> {
    match response.bucket_action.first()?.bucket_action {
        Some(Action::QuotaAssignmentAction(a)) => match a.rate_limit_strategy?.strategy? {
            Strategy::TokenBucket(bucket) => {
                let fill = u64::try_from(bucket.fill_interval?.seconds).ok()?;
                Some(u64::from(bucket.tokens_per_fill?.value) * 60 / fill)
            }
            _ => Some(0),
        },
        _ => None,
    }
}

/// The value of the sample `series` (its name and labels, as `/metrics` writes them) on the
/// HTTP port `address` (started with `--listen`); `None` if there is none.
pub fn metric(address: SocketAddr, series: &str) -> Option<u64> {
    let metrics = sluice_testkit::http::get(address, "/metrics");
    assert_eq!(metrics.status, 200);
    let text = metrics.text();
    let line = text.lines().find(|l| l.split(' ').next() == Some(series))?;
    line.rsplit(' ').next()?.parse().ok()
}
