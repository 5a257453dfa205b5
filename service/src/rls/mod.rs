//! Envoy's Rate Limit Service protocol (`--rls`): `sluice-service` as a drop-in for
//! envoyproxy/ratelimit, behind Envoy's native `envoy.filters.http.ratelimit` filter.
//!
//! `config` reads envoyproxy/ratelimit's YAML files (with sluice's extensions) into a tree per
//! domain; `watch` keeps it current; `matching` finds the limits of a request's descriptor;
//! `answer` plans the store checks and builds the response (pure, clock injected); `service` is
//! the gRPC method over the same `Store` (Lua scripts, Redis `TIME`) as `/v1/check`; `metrics`
//! counts per domain and descriptor.

pub mod answer;
pub mod config;
pub mod matching;
pub mod metrics;
pub mod service;
pub mod watch;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args as ClapArgs;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use prometheus_client::registry::Registry;
use serde::Deserialize;
use sluice::headers::HeaderStyle;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;

use crate::store::Store;
use metrics::RlsMetrics;
use service::RlsService;
use watch::{Hangups, Watcher};

/// The command line of the RLS.
#[derive(ClapArgs, Debug)]
pub struct RlsArgs {
    /// Serve Envoy's Rate Limit Service gRPC API (HTTP/2 cleartext) on ADDR, e.g. 127.0.0.1:8081
    /// (port 0 picks a free port, logged when ready); needs --rls-config
    #[arg(long, env = "SLUICE_RLS", value_name = "ADDR", requires = "rls_config")]
    pub rls: Option<SocketAddr>,

    /// The rate limits of --rls: an envoyproxy/ratelimit YAML file, or a directory of them
    /// (one domain per file), watched for changes and reloaded on SIGHUP
    #[arg(long, env = "SLUICE_RLS_CONFIG", value_name = "PATH", requires = "rls")]
    pub rls_config: Option<PathBuf>,

    /// Rate-limit headers the RLS asks Envoy to add to responses: none, legacy
    /// (x-ratelimit-limit, -remaining, -reset), draft (ratelimit-policy, ratelimit) or both
    #[arg(
        long,
        env = "SLUICE_RLS_HEADERS",
        value_name = "STYLE",
        default_value = "none",
        value_parser = header_style
    )]
    pub rls_headers: HeaderStyle,
}

/// The names of the filter's `headers` setting.
fn header_style(text: &str) -> Result<HeaderStyle, String> {
    let name = serde::de::value::StrDeserializer::<serde::de::value::Error>::new(text);
    HeaderStyle::deserialize(name).map_err(|error| error.to_string())
}

/// An RLS ready to serve: its configuration loaded, its port bound, SIGHUP handled.
pub struct Rls<S> {
    listener: TcpListener,
    address: SocketAddr,
    config_path: PathBuf,
    domains: usize,
    watcher: Watcher,
    hangups: Hangups,
    service: RlsService<S>,
}

impl<S: Store> Rls<S> {
    /// Does all that can fail before the service says it is ready: `None` without `--rls`.
    /// Its series go into `registry`.
    pub async fn prepare(
        args: &RlsArgs,
        store: S,
        registry: &mut Registry,
    ) -> Result<Option<Rls<S>>, String> {
        let (Some(address), Some(path)) = (args.rls, &args.rls_config) else {
            return Ok(None);
        };
        let metrics = Arc::new(RlsMetrics::register(registry));
        let (watcher, config) = Watcher::start(path, Arc::clone(&metrics)).map_err(|errors| {
            let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
            format!("cannot load --rls-config:\n{}", lines.join("\n"))
        })?;
        let domains = config.current().domain_count();
        let hangups =
            Hangups::install().map_err(|failure| format!("cannot handle SIGHUP: {failure}"))?;
        let listener = TcpListener::bind(address)
            .await
            .map_err(|failure| format!("cannot listen on {address} (--rls): {failure}"))?;
        let address = listener
            .local_addr()
            .map_err(|failure| failure.to_string())?;
        let service = RlsService::new(store, config, args.rls_headers, metrics);
        Ok(Some(Rls {
            listener,
            address,
            config_path: path.clone(),
            domains,
            watcher,
            hangups,
            service,
        }))
    }

    /// Logs where it listens (the port chosen, for port 0) and what it loaded: the readiness
    /// event `rls listening`.
    pub fn announce(&self, store: &dyn std::fmt::Display) {
        let (address, config) = (self.address, self.config_path.display());
        let domains = self.domains;
        tracing::info!(address = %address, config = %config, domains, store = %store, "rls listening");
    }

    /// Serves gRPC, reloading the configuration meanwhile, until `stopping` completes; then stops
    /// accepting and gives calls in flight `drain` to finish. Whether they all did.
    pub async fn serve<F>(self, stopping: F, drain: Duration) -> Result<bool, String>
    where
        F: Future<Output = ()> + Clone,
    {
        let watching = tokio::spawn(self.watcher.run(self.hangups));
        let incoming = TcpIncoming::from(self.listener).with_nodelay(Some(true));
        // One service: served as it is, without a router in front of it.
        let service = RateLimitServiceServer::new(self.service);
        let server = tonic::transport::Server::builder().serve_with_incoming_shutdown(
            service,
            incoming,
            stopping.clone(),
        );
        let drained = tokio::select! {
            served = server => served.map(|()| true).map_err(|failure| format!("rls: {failure}")),
            () = async { stopping.await; tokio::time::sleep(drain).await } => Ok(false),
        };
        watching.abort();
        drained
    }
}
