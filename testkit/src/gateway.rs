//! An LLM gateway: a real two-worker Envoy with the filter configured by a test, in front of the
//! test kit's LLM upstream (`local`); or its one policy global (failing closed) and served by a
//! real `sluice-service` over a real Redis (`GlobalGateway`), for the token and spend budget
//! tests.

use crate::envoy::Envoy;
use crate::llm::LlmUpstream;
use crate::redis::RedisServer;
use crate::service::Service;
use serde_json::{json, Value};
use std::time::Duration;

/// An Envoy whose filter `config` configures, in front of a new LLM upstream.
pub fn local(config: &Value) -> (Envoy, LlmUpstream) {
    let upstream = LlmUpstream::start();
    let envoy = Envoy::options(&config.to_string())
        .upstream(upstream.addr())
        .start();
    (envoy, upstream)
}

/// The Envoy, its upstream and its service, Redis kept alive beside them.
pub struct GlobalGateway {
    pub envoy: Envoy,
    pub upstream: LlmUpstream,
    pub service: Service,
    _redis: RedisServer,
}

impl GlobalGateway {
    /// `policy` made global (failing closed), with `config`'s other top-level fields (`api`).
    pub fn start(mut policy: Value, config: Value) -> GlobalGateway {
        let redis = RedisServer::start();
        let service = Service::start(&redis.url());
        let upstream = LlmUpstream::start();
        (policy["scope"], policy["failure_mode"]) = (json!("global"), json!("closed"));
        let mut config = config;
        config["headers"] = json!("both");
        config["policies"] = json!([policy]);
        config["global"] =
            json!({"cluster": "sluice_service", "authority": "sluice-service", "timeout": "500ms"});
        let envoy = Envoy::options(&config.to_string())
            .service(&[service.addr])
            .upstream(upstream.addr())
            .start();
        GlobalGateway {
            envoy,
            upstream,
            service,
            _redis: redis,
        }
    }

    /// The sum of the service's `metric` series whose labels include every one of `labels`.
    pub fn service_count(&self, metric: &str, labels: &[&str]) -> u64 {
        let metrics = crate::http::get(self.service.addr, "/metrics").text();
        let series = metrics.lines().filter(|line| {
            line.strip_prefix(metric).is_some_and(|rest| {
                rest.starts_with('{') && labels.iter().all(|l| rest.contains(l))
            })
        });
        series
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// Waits until the service applied `n` settlements of `op`: what the Envoy sent after the
    /// responses so far.
    pub fn settled(&self, op: &str, n: u64) {
        let op = format!(r#"op="{op}""#);
        let labels = [op.as_str(), r#"result="applied""#];
        let done = crate::wait_for(Duration::from_secs(5), || {
            (self.service_count("sluice_service_settlements_total", &labels) >= n).then_some(())
        });
        let metrics = crate::http::get(self.service.addr, "/metrics").text();
        let settlements = metrics.lines().filter(|l| l.contains("settlements"));
        let settlements: Vec<&str> = settlements.collect();
        assert!(
            done.is_some(),
            "{n} {op} settlements applied within 5 s: {settlements:#?}"
        );
    }
}
