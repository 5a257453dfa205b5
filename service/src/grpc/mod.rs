//! The gRPC port (`--rls`): Envoy's Rate Limit Service (`rls`), the Rate Limit Quota Service
//! (`rlqs`) and `grpc.health.v1.Health` (`health`) on one listener, told apart by path
//! (`route`), over the limits files (`rules`) kept current while it serves. Connections come
//! through the same `connections::Gate` as HTTP's, with HTTP/2's own bounds on top (`serve`).

pub mod health;
mod route;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args as ClapArgs;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use prometheus_client::registry::Registry;
use serde::Deserialize;
use sluice::config::HeaderStyle;
use sluice::core::key::HashSecret;
use tokio::net::TcpListener;
use tracing::warn;

use crate::auth::Guard;
use crate::connections::{Gate, Server};
use crate::decision::check::Bounds;
use crate::health::Readiness;
use crate::rlqs::service::RlqsService;
use crate::rls::metrics::RlsMetrics;
use crate::rls::service::RlsService;
use crate::rules::watch::{self, Hangups, Watcher};
use crate::stores::Store;

/// `--rls-max-streams`'s default: HTTP/2 streams (calls in flight) one connection may have.
pub const DEFAULT_MAX_STREAMS: u32 = 100;
/// HTTP/2 flow-control windows: what a client may send ahead of the service, per stream and per
/// connection (hyper's default of 1 MiB per stream would let one stream's body run far past the
/// largest request).
const STREAM_WINDOW: u32 = 64 * 1024;
const CONNECTION_WINDOW: u32 = 1024 * 1024;
/// The most a request's header block may hold.
const MAX_HEADER_LIST: u32 = 16 * 1024;

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

    /// The secret the RLS's Redis keys are hashed under, the same for every replica: at least
    /// 32 bytes (e.g. `openssl rand -hex 32`); best given in the environment. Without it keys
    /// are hashed under a public key
    #[arg(
        long,
        env = "SLUICE_RLS_HASH_SECRET",
        value_name = "SECRET",
        hide_env_values = true,
        value_parser = hash_secret
    )]
    pub rls_hash_secret: Option<Secret>,

    /// Let a reload remove the domains whose files disappeared (down to none) instead of
    /// refusing it
    #[arg(long, env = "SLUICE_RLS_ALLOW_EMPTY_CONFIG")]
    pub rls_allow_empty_config: bool,

    /// HTTP/2 streams (calls in flight) one RLS connection may have (SETTINGS_MAX_CONCURRENT_STREAMS)
    #[arg(
        long,
        env = "SLUICE_RLS_MAX_STREAMS",
        value_name = "N",
        default_value_t = DEFAULT_MAX_STREAMS,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub rls_max_streams: u32,

    /// envoyproxy/ratelimit's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: read every limit of a
    /// call first, and when some would go over, charge only those (the others are not counted
    /// for a refused call); two Redis round trips per call of several limits
    #[arg(long, env = "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")]
    pub stop_cache_key_increment_when_overlimit: bool,

    /// Descriptor entry keys (e.g. `user_id,tenant`) whose values `/admin/v1/top` shows for the
    /// RLS's top keys; every other entry shows only its key (never an API key or an
    /// `authorization` value unless named here)
    #[arg(
        long,
        env = "SLUICE_RLS_TOP_SHOW",
        value_name = "KEYS",
        value_delimiter = ','
    )]
    pub rls_top_show: Vec<String>,
}

/// The key the operator's secret gives, never shown (not even through `{:?}`).
#[derive(Clone, Copy)]
pub struct Secret(HashSecret);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(hidden)")
    }
}

/// An operator's secret as the filter's `hash_secret_env` takes it: at least 32 bytes once
/// trimmed. Only its length is ever shown.
fn hash_secret(text: &str) -> Result<Secret, String> {
    let secret = text.trim().as_bytes();
    if secret.len() < HashSecret::MIN_TEXT_BYTES {
        return Err(format!(
            "must be at least {} bytes, got {}",
            HashSecret::MIN_TEXT_BYTES,
            secret.len()
        ));
    }
    Ok(Secret(HashSecret::from_text(secret)))
}

/// The names of the filter's `headers` setting.
fn header_style(text: &str) -> Result<HeaderStyle, String> {
    let name = serde::de::value::StrDeserializer::<serde::de::value::Error>::new(text);
    HeaderStyle::deserialize(name).map_err(|error| error.to_string())
}

/// What the RLS shares with the rest of the service.
pub struct Settings {
    pub bounds: Bounds,
    pub guard: Guard,
    /// `--max-request-bytes`: the largest call.
    pub max_request_bytes: usize,
    /// Where the heaviest keys are recorded (with the admin API), shared with `/admin/v1/top`.
    pub top: Option<Arc<crate::top::TopRecorder>>,
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
    max_streams: u32,
    max_request_bytes: usize,
}

impl<S: Store> Rls<S> {
    /// Does all that can fail before the service says it is ready: `None` without `--rls`.
    /// Its series go into `registry`.
    pub async fn prepare(
        args: &RlsArgs,
        store: S,
        registry: &mut Registry,
        settings: Settings,
    ) -> Result<Option<Rls<S>>, String> {
        let (Some(address), Some(path)) = (args.rls, &args.rls_config) else {
            return Ok(None);
        };
        let metrics = Arc::new(RlsMetrics::register(registry));
        let reload = watch::Reload {
            bounds: settings.bounds,
            allow_empty: args.rls_allow_empty_config,
        };
        let started = Watcher::start(path, reload, metrics.clone());
        let (watcher, config) = started.map_err(|errors| {
            let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
            format!("cannot load --rls-config:\n{}", lines.join("\n"))
        })?;
        let domains = config.current().domain_count();
        let secret = args.rls_hash_secret.map_or_else(
            || {
                warn!(
                "no --rls-hash-secret: rls keys are hashed under a public key, so whoever reads \
                 Redis can tell which descriptor values a key counts"
            );
                HashSecret::PUBLIC
            },
            |Secret(secret)| secret,
        );
        let hangups =
            Hangups::install().map_err(|failure| format!("cannot handle SIGHUP: {failure}"))?;
        let listener = TcpListener::bind(address)
            .await
            .map_err(|failure| format!("cannot listen on {address} (--rls): {failure}"))?;
        let address = listener
            .local_addr()
            .map_err(|failure| failure.to_string())?;
        let service = RlsService {
            store,
            config,
            headers: args.rls_headers,
            metrics,
            guard: settings.guard,
            secret,
            stop_increments: args.stop_cache_key_increment_when_overlimit,
            top: settings.top,
            top_show: args.rls_top_show.clone(),
        };
        Ok(Some(Rls {
            listener,
            address,
            config_path: path.clone(),
            domains,
            watcher,
            hangups,
            service,
            max_streams: args.rls_max_streams,
            max_request_bytes: settings.max_request_bytes,
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
    /// accepting and gives calls in flight `drain` to finish. Whether they all did. Connections
    /// come through `gate`; a stream buffers at most `--max-request-bytes` (larger calls are
    /// refused as soon as their length is read) and a connection `--rls-max-streams` of them.
    /// The health service answers from `readiness`.
    pub async fn serve<F>(
        self,
        gate: Arc<Gate>,
        readiness: Arc<Readiness>,
        stopping: F,
        drain: Duration,
    ) -> Result<bool, String>
    where
        F: Future<Output = ()> + Clone,
    {
        let watching = tokio::spawn(self.watcher.run(self.hangups));
        let listener = self.listener;
        let incoming = futures_util::stream::unfold((gate, listener), |(gate, listener)| async {
            let stream = gate.accept(&listener, Server::Rls).await;
            Some((Ok::<_, std::io::Error>(stream), (gate, listener)))
        });
        let rlqs = RlqsService::new(self.service.config.clone());
        let rlqs = RateLimitQuotaServiceServer::new(rlqs)
            .max_decoding_message_size(self.max_request_bytes);
        let rls = RateLimitServiceServer::new(self.service)
            .max_decoding_message_size(self.max_request_bytes);
        // The Rate Limit Quota Service (issue 36) shares the port and the limits files.
        let rls = route::ByPath {
            prefix: route::RLQS,
            matched: rlqs,
            rest: rls,
        };
        let (health, following) = health::probes(readiness);
        let following = tokio::spawn(following);
        let health = health.max_decoding_message_size(self.max_request_bytes);
        let service = route::ByPath {
            prefix: route::HEALTH,
            matched: health,
            rest: rls,
        };
        let server = tonic::transport::Server::builder()
            .max_concurrent_streams(self.max_streams)
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .http2_max_header_list_size(MAX_HEADER_LIST)
            .serve_with_incoming_shutdown(service, incoming, stopping.clone());
        let drained = tokio::select! {
            served = server => served.map(|()| true).map_err(|failure| format!("rls: {failure}")),
            () = async { stopping.await; tokio::time::sleep(drain).await } => Ok(false),
        };
        watching.abort();
        following.abort();
        drained
    }
}
