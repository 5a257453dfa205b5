//! `grpc.health.v1.Health` on each gRPC port, for Kubernetes gRPC probes, Envoy's gRPC health
//! checks of the RLS (or RLQS) cluster and `grpc_health_probe`: `SERVING` for the empty name
//! (the server) and the port's service (`envoy.service.ratelimit.v3.RateLimitService`, or
//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService`) while the service is ready (Redis answers
//! and it is not shutting down: what `/readyz` says; the configuration is loaded before the port
//! is bound), `NOT_SERVING` otherwise. Another name is `NOT_FOUND` (`Check`) or
//! `SERVICE_UNKNOWN` (`Watch`), as the gRPC health protocol says. No token is asked: probes
//! carry none, and the answer tells nothing but whether the service serves.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{self, Stream, StreamExt};
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use crate::connections::Activity;
use crate::health::Readiness;

/// The RLS's own name in the health protocol.
pub const RLS_SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";
/// The RLQS's.
pub const RLQS_SERVICE: &str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";
/// How often readiness is read for `Watch`: it follows Redis within about a second (`health`).
pub const WATCH_INTERVAL: Duration = Duration::from_millis(250);

/// A `Check` answers from readiness now; a `Watch` from its reads every `WATCH_INTERVAL`
/// (`follow`), true while serving.
pub struct Probes {
    ready_now: Box<dyn Fn() -> bool + Send + Sync>,
    serving: watch::Receiver<bool>,
    /// The port's service (`RLS_SERVICE`, `RLQS_SERVICE`).
    service: &'static str,
}

/// The health service of the port that serves `service`, and the task that keeps it current
/// with `readiness`.
pub fn probes(
    readiness: Arc<Readiness>,
    service: &'static str,
) -> (HealthServer<Probes>, impl std::future::Future<Output = ()>) {
    let (sender, serving) = watch::channel(readiness.check().is_ok());
    // Not the last read: a probe just after Redis first answered would be told `NOT_SERVING`
    // for up to a `WATCH_INTERVAL` (seen under load in `service/tests/rlqs_api.rs`).
    let now = Arc::clone(&readiness);
    let ready_now = Box::new(move || now.check().is_ok());
    let probes = Probes {
        ready_now,
        serving,
        service,
    };
    (HealthServer::new(probes), follow(readiness, sender))
}

/// Reads readiness every `WATCH_INTERVAL` and tells the watchers when it changes.
async fn follow(readiness: Arc<Readiness>, sender: watch::Sender<bool>) {
    loop {
        let serving = readiness.check().is_ok();
        sender.send_if_modified(|last| std::mem::replace(last, serving) != serving);
        tokio::time::sleep(WATCH_INTERVAL).await;
    }
}

impl Probes {
    fn known(&self, service: &str) -> bool {
        service.is_empty() || service == self.service
    }
}

fn response(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse {
        status: status.into(),
    }
}

fn serving_status(serving: bool) -> ServingStatus {
    if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    }
}

type Updates = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for Probes {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let activity = request.extensions().get::<Activity>().cloned();
        let _answering = activity.as_ref().map(Activity::answering);
        if !self.known(&request.get_ref().service) {
            return Err(Status::not_found("unknown service"));
        }
        let status = serving_status((self.ready_now)());
        Ok(Response::new(response(status)))
    }

    type WatchStream = Updates;

    /// The status now, then each change, for as long as the caller listens; the call is a
    /// request in flight meanwhile, so no connection deadline closes it.
    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Updates>, Status> {
        let answering = (request.extensions().get::<Activity>()).map(Activity::answering);
        let updates: Updates = if self.known(&request.get_ref().service) {
            Box::pin(changes(self.serving.clone()))
        } else {
            let unknown = Ok(response(ServingStatus::ServiceUnknown));
            Box::pin(stream::once(async { unknown }).chain(stream::pending()))
        };
        let held = updates.map(move |update| {
            let _held = &answering;
            update
        });
        Ok(Response::new(Box::pin(held)))
    }
}

/// The status now, then every change.
fn changes(
    serving: watch::Receiver<bool>,
) -> impl Stream<Item = Result<HealthCheckResponse, Status>> {
    stream::unfold((serving, true), |(mut serving, first)| async move {
        if !first && serving.changed().await.is_err() {
            return None;
        }
        let status = serving_status(*serving.borrow_and_update());
        Some((Ok(response(status)), (serving, false)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(service: &str) -> Request<HealthCheckRequest> {
        Request::new(HealthCheckRequest {
            service: service.into(),
        })
    }

    /// Probes whose readiness now is what `serving` holds.
    fn probes_of(serving: watch::Receiver<bool>, service: &'static str) -> Probes {
        let now = serving.clone();
        Probes {
            ready_now: Box::new(move || *now.borrow()),
            serving,
            service,
        }
    }

    fn status(answer: &HealthCheckResponse) -> ServingStatus {
        ServingStatus::try_from(answer.status).unwrap()
    }

    #[tokio::test]
    async fn the_server_and_the_rls_are_serving_as_readiness_says_and_other_names_are_unknown() {
        let (sender, serving) = watch::channel(false);
        let probes = probes_of(serving, RLS_SERVICE);
        for name in ["", RLS_SERVICE] {
            let answer = probes.check(ask(name)).await.unwrap().into_inner();
            assert_eq!(status(&answer), ServingStatus::NotServing);
        }
        sender.send(true).unwrap();
        let answer = probes.check(ask(RLS_SERVICE)).await.unwrap().into_inner();
        assert_eq!(status(&answer), ServingStatus::Serving);
        let unknown = probes.check(ask("other")).await.unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::NotFound);
        let elsewhere = probes.check(ask(RLQS_SERVICE)).await.unwrap_err();
        assert_eq!(elsewhere.code(), tonic::Code::NotFound);
    }

    #[tokio::test]
    async fn a_watch_sends_the_status_then_each_change() {
        let (sender, serving) = watch::channel(true);
        let probes = probes_of(serving, RLQS_SERVICE);
        let mut updates = probes.watch(ask("")).await.unwrap().into_inner();
        let mut next = async || status(&updates.next().await.unwrap().unwrap());
        assert_eq!(next().await, ServingStatus::Serving);
        sender.send(false).unwrap();
        assert_eq!(next().await, ServingStatus::NotServing);
        let mut unknown = probes.watch(ask("other")).await.unwrap().into_inner();
        let first = unknown.next().await.unwrap().unwrap();
        assert_eq!(status(&first), ServingStatus::ServiceUnknown);
    }
}
