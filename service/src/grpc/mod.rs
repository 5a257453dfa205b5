//! The gRPC ports: Envoy's Rate Limit Service (`rls`, `--rls`) and its Rate Limit Quota Service
//! (`rlqs`, `--rlqs`), each on a listener of its own with `grpc.health.v1.Health` (`health`)
//! beside it, told apart by path (`route`), both over the limits files (`rules`) kept current
//! while they serve. Connections come through the same `connections::Gate` as HTTP's, with
//! HTTP/2's own bounds on top (`On::serve`, the one way a port is served).

pub mod health;
mod route;

use std::convert::Infallible;
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
use tonic::body::Body;
use tonic::codegen::http::{Request, Response};
use tonic::codegen::Service;
use tracing::warn;

use crate::auth::Guard;
use crate::connections::{Gate, Server};
use crate::decision::check::Bounds;
use crate::health::Readiness;
use crate::rlqs::metrics::RlqsMetrics;
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

/// The command line of the RLS and the RLQS.
#[derive(ClapArgs, Debug)]
#[command(group(clap::ArgGroup::new("grpc_port").args(["rls", "rlqs"]).multiple(true)))]
pub struct RlsArgs {
    /// Serve Envoy's Rate Limit Service gRPC API (HTTP/2 cleartext) on ADDR, e.g. 127.0.0.1:8081
    /// (port 0 picks a free port, logged when ready); needs --rls-config
    #[arg(long, env = "SLUICE_RLS", value_name = "ADDR", requires = "rls_config")]
    pub rls: Option<SocketAddr>,

    /// Serve Envoy's Rate Limit Quota Service (RLQS, for the `rate_limit_quota` filter) on its
    /// own gRPC port ADDR, sharing the budgets of --rls-config's limits among the Envoys that
    /// report them (port 0 picks a free port, logged when ready); needs --rls-config
    #[arg(
        long,
        env = "SLUICE_RLQS",
        value_name = "ADDR",
        requires = "rls_config"
    )]
    pub rlqs: Option<SocketAddr>,

    /// The rate limits of --rls and --rlqs: an envoyproxy/ratelimit YAML file, or a directory
    /// of them (one domain per file), watched for changes and reloaded on SIGHUP
    #[arg(
        long,
        env = "SLUICE_RLS_CONFIG",
        value_name = "PATH",
        requires = "grpc_port"
    )]
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

    /// The most RLQS streams (Envoys) one replica holds open; another is refused
    /// RESOURCE_EXHAUSTED until one ends
    #[arg(
        long,
        env = "SLUICE_RLQS_MAX_STREAMS",
        value_name = "N",
        default_value_t = crate::rlqs::service::MAX_STREAMS_PER_REPLICA,
        value_parser = at_least_one
    )]
    pub rlqs_max_streams: usize,

    /// The most RLQS buckets the streams of one replica report in all (each a key in the store);
    /// a new bucket beyond them gets no assignment until others are abandoned
    #[arg(
        long,
        env = "SLUICE_RLQS_MAX_BUCKETS",
        value_name = "N",
        default_value_t = crate::rlqs::service::MAX_BUCKETS_PER_REPLICA,
        value_parser = at_least_one
    )]
    pub rlqs_max_buckets: usize,

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

/// A count of 1 or more.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("must be a whole number of 1 or more, got {text:?}")),
    }
}

/// The names of the filter's `headers` setting.
fn header_style(text: &str) -> Result<HeaderStyle, String> {
    let name = serde::de::value::StrDeserializer::<serde::de::value::Error>::new(text);
    HeaderStyle::deserialize(name).map_err(|error| error.to_string())
}

/// What the gRPC ports share with the rest of the service.
pub struct Settings {
    pub bounds: Bounds,
    /// The bearer tokens the RLS asks for.
    pub guard: Guard,
    /// The same tokens, asked of the RLQS's streams (its own refusal log line).
    pub rlqs_guard: Guard,
    /// `--max-request-bytes`: the largest call.
    pub max_request_bytes: usize,
    /// Where the heaviest keys are recorded (with the admin API), shared with `/admin/v1/top`.
    pub top: Option<Arc<crate::top::TopRecorder>>,
    /// The operators' overrides (with the admin API), shared with `/admin/v1/overrides`.
    pub overrides: Option<Arc<crate::admin::overrides::OverrideTable>>,
}

/// A bound listener and the address it got.
struct Port {
    listener: TcpListener,
    address: SocketAddr,
}

impl Port {
    async fn bind(address: SocketAddr, flag: &str) -> Result<Port, String> {
        let listener = TcpListener::bind(address)
            .await
            .map_err(|failure| format!("cannot listen on {address} ({flag}): {failure}"))?;
        let address = listener
            .local_addr()
            .map_err(|failure| failure.to_string())?;
        Ok(Port { listener, address })
    }
}

/// HTTP/2's bounds of a gRPC port.
#[derive(Clone, Copy)]
struct Bounded {
    /// `--rls-max-streams`.
    max_streams: u32,
}

/// The RLS and the RLQS ready to serve, each on its own port if asked for: the configuration
/// loaded, the ports bound, SIGHUP handled.
pub struct Rls<S> {
    rls: Option<Port>,
    rlqs: Option<Port>,
    config_path: PathBuf,
    domains: usize,
    watcher: Watcher,
    hangups: Hangups,
    service: RlsService<S>,
    rlqs_guard: Guard,
    /// The RLQS's handle on the store, and its series.
    rlqs_store: S,
    rlqs_metrics: Arc<RlqsMetrics>,
    rlqs_bounds: crate::rlqs::service::Bounds,
    bounded: Bounded,
    max_request_bytes: usize,
}

impl<S: Store + Clone> Rls<S> {
    /// Does all that can fail before the service says it is ready: `None` without `--rls` or
    /// `--rlqs`. Its series go into `registry`.
    pub async fn prepare(
        args: &RlsArgs,
        store: S,
        registry: &mut Registry,
        settings: Settings,
    ) -> Result<Option<Rls<S>>, String> {
        if args.rls.is_none() && args.rlqs.is_none() {
            return Ok(None);
        }
        // The command line has already refused either port without the limits (`RlsArgs`).
        let Some(path) = &args.rls_config else {
            return Err("--rls and --rlqs need --rls-config".into());
        };
        let metrics = Arc::new(RlsMetrics::register(registry));
        // The RLQS's series only where it is served.
        let rlqs_metrics = match args.rlqs {
            Some(_) => RlqsMetrics::register(registry),
            None => RlqsMetrics::register(&mut Registry::default()),
        };
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
                if args.rls.is_some() {
                    warn!(
                        "no --rls-hash-secret: rls keys are hashed under a public key, so \
                         whoever reads Redis can tell which descriptor values a key counts"
                    );
                }
                HashSecret::PUBLIC
            },
            |Secret(secret)| secret,
        );
        let hangups =
            Hangups::install().map_err(|failure| format!("cannot handle SIGHUP: {failure}"))?;
        let rls = match args.rls {
            Some(address) => Some(Port::bind(address, "--rls").await?),
            None => None,
        };
        let rlqs = match args.rlqs {
            Some(address) => Some(Port::bind(address, "--rlqs").await?),
            None => None,
        };
        let service = RlsService {
            store: store.clone(),
            config,
            headers: args.rls_headers,
            metrics,
            guard: settings.guard,
            secret,
            stop_increments: args.stop_cache_key_increment_when_overlimit,
            top: settings.top,
            top_show: args.rls_top_show.clone(),
            overrides: settings.overrides,
        };
        Ok(Some(Rls {
            rls,
            rlqs,
            config_path: path.clone(),
            domains,
            watcher,
            hangups,
            service,
            rlqs_guard: settings.rlqs_guard,
            rlqs_store: store,
            rlqs_metrics: Arc::new(rlqs_metrics),
            rlqs_bounds: crate::rlqs::service::Bounds {
                max_streams: args.rlqs_max_streams,
                max_buckets: args.rlqs_max_buckets,
            },
            bounded: Bounded {
                max_streams: args.rls_max_streams,
            },
            max_request_bytes: settings.max_request_bytes,
        }))
    }

    /// The RLQS's series, where it is served: the admin API's view of it.
    pub fn rlqs_metrics(&self) -> Option<Arc<RlqsMetrics>> {
        self.rlqs.as_ref().map(|_| Arc::clone(&self.rlqs_metrics))
    }

    /// Logs where each port listens (the port chosen, for port 0) and what it loaded: the
    /// readiness events `rls listening` and `rlqs listening`.
    pub fn announce(&self, store: &dyn std::fmt::Display) {
        let (config, domains) = (self.config_path.display(), self.domains);
        if let Some(Port { address, .. }) = &self.rls {
            tracing::info!(address = %address, config = %config, domains, store = %store, "rls listening");
        }
        if let Some(Port { address, .. }) = &self.rlqs {
            tracing::info!(address = %address, config = %config, domains, store = %store, "rlqs listening");
        }
    }

    /// Serves each port, reloading the configuration meanwhile, until `stopping` completes; then
    /// stops accepting and gives calls in flight `drain` to finish. Whether they all did.
    /// Connections come through `gate`; a stream buffers at most `--max-request-bytes` (larger
    /// calls are refused as soon as their length is read) and a connection `--rls-max-streams`
    /// of them. Each port's health service answers from `readiness`.
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
        let (bounded, max_bytes) = (self.bounded, self.max_request_bytes);
        let (rls_port, rlqs_port) = (self.rls, self.rlqs);
        let config = self.service.config.clone();
        let rlqs = RlqsService::new(
            config,
            self.rlqs_guard,
            self.rlqs_store,
            self.rlqs_metrics,
            self.rlqs_bounds,
        );
        let beating = rlqs_port.as_ref().map(|_| tokio::spawn(rlqs.beating()));
        let rlqs = RateLimitQuotaServiceServer::new(rlqs).max_decoding_message_size(max_bytes);
        let rls = RateLimitServiceServer::new(self.service).max_decoding_message_size(max_bytes);
        let (gate_rls, readiness_rls, stopping_rls) =
            (Arc::clone(&gate), Arc::clone(&readiness), stopping.clone());
        let serving_rls = async move {
            let Some(port) = rls_port else {
                return Ok(true);
            };
            let on = On {
                server: Server::Rls,
                name: health::RLS_SERVICE,
                bounded,
                max_bytes,
            };
            on.serve(port, rls, gate_rls, readiness_rls, stopping_rls, drain)
                .await
        };
        let serving_rlqs = async move {
            let Some(port) = rlqs_port else {
                return Ok(true);
            };
            let on = On {
                server: Server::Rlqs,
                name: health::RLQS_SERVICE,
                bounded,
                max_bytes,
            };
            on.serve(port, rlqs, gate, readiness, stopping, drain).await
        };
        let (rls, rlqs) = tokio::join!(serving_rls, serving_rlqs);
        watching.abort();
        if let Some(beating) = beating {
            beating.abort();
        }
        Ok(rls? && rlqs?)
    }
}

/// What one gRPC port is: which server the gate counts it as, the service its health names,
/// its HTTP/2 bounds.
struct On {
    server: Server,
    name: &'static str,
    bounded: Bounded,
    max_bytes: usize,
}

impl On {
    /// Serves `service` and `grpc.health.v1.Health` beside it on `port` until `stopping`
    /// completes, then gives calls in flight `drain` to finish. Whether they all did.
    async fn serve<T, F>(
        self,
        port: Port,
        service: T,
        gate: Arc<Gate>,
        readiness: Arc<Readiness>,
        stopping: F,
        drain: Duration,
    ) -> Result<bool, String>
    where
        T: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
            + Clone
            + Send
            + 'static,
        T::Future: Send + 'static,
        F: Future<Output = ()> + Clone,
    {
        let (listener, server) = (port.listener, self.server);
        let incoming =
            futures_util::stream::unfold((gate, listener), move |(gate, listener)| async move {
                let stream = gate.accept(&listener, server).await;
                Some((Ok::<_, std::io::Error>(stream), (gate, listener)))
            });
        let (health, following) = health::probes(readiness, self.name);
        let following = tokio::spawn(following);
        let health = health.max_decoding_message_size(self.max_bytes);
        let routed = route::ByPath {
            prefix: route::HEALTH,
            matched: health,
            rest: service,
        };
        let served = tonic::transport::Server::builder()
            .max_concurrent_streams(self.bounded.max_streams)
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .http2_max_header_list_size(MAX_HEADER_LIST)
            .serve_with_incoming_shutdown(routed, incoming, stopping.clone());
        let drained = tokio::select! {
            served = served => served.map(|()| true).map_err(|failure| format!("{}: {failure}", server.name())),
            () = async { stopping.await; tokio::time::sleep(drain).await } => Ok(false),
        };
        following.abort();
        drained
    }
}
