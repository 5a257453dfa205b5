//! Command line and environment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args as ClapArgs, Parser};
use sluice::core::duration::parse_nanos;
use tracing_subscriber::EnvFilter;

use crate::connections::{self, Limits};
use crate::decision::check::{human_ms, Bounds};
use crate::grpc::RlsArgs;
use crate::http::DEFAULT_MAX_REQUEST_BYTES;
use crate::metrics;
use crate::stores::redis::RedisTarget;
use crate::stores::MAX_CAPACITY_US;

/// Where HTTP is served when `--listen` is not given and neither is `--rls` nor `--rlqs`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// Decides sluice's global rate limits for the Envoy filter (token bucket, fixed window, sliding
/// window, sliding log, leaky bucket), keeping their state in Redis. Serves POST /v1/check,
/// GET /healthz, GET /readyz and GET /metrics, with --rls Envoy's Rate Limit Service gRPC
/// API and with --rlqs its Rate Limit Quota Service; logs JSON lines on stderr.
#[derive(Parser, Debug)]
#[command(name = "sluice-service", version)]
pub struct Args {
    /// Address to serve HTTP on (port 0 picks a free port, logged when listening) [default:
    /// 127.0.0.1:8080, or no HTTP at all with --rls or --rlqs]
    #[arg(long, env = "SLUICE_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,

    #[command(flatten)]
    pub store: StoreArgs,

    #[command(flatten)]
    pub rls: RlsArgs,

    /// File of bearer tokens that POST /v1/check and the RLS then require, one per line; re-read
    /// when it changes and on SIGHUP
    #[arg(long, env = "SLUICE_TOKEN_FILE", value_name = "PATH")]
    pub token_file: Option<PathBuf>,

    /// File of admin API tokens, which may read and write /admin/v1/... (`NAME TOKEN` or
    /// `TOKEN` per line; the name is who the audit log says wrote); without it the admin API is
    /// not served. Re-read every 10 s and on SIGHUP
    #[arg(long, env = "SLUICE_ADMIN_TOKEN_FILE", value_name = "PATH")]
    pub admin_token_file: Option<PathBuf>,

    /// File of read-only admin API tokens (as --admin-token-file's): they may show, never write
    #[arg(
        long,
        env = "SLUICE_READ_TOKEN_FILE",
        value_name = "PATH",
        requires = "admin_token_file"
    )]
    pub read_token_file: Option<PathBuf>,

    /// The most overrides the admin API keeps; setting a new one past it is refused (409)
    #[arg(
        long,
        env = "SLUICE_MAX_OVERRIDES",
        value_name = "N",
        default_value_t = crate::admin::overrides::MAX_OVERRIDES,
        value_parser = clap::value_parser!(u64).range(1..=1_000_000)
    )]
    pub max_overrides: u64,

    /// How often the `top refused keys` log record is written, in seconds (tests shorten it)
    #[arg(
        long,
        env = "SLUICE_TOP_LOG_EVERY",
        value_name = "SECONDS",
        default_value_t = 60,
        hide = true,
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    pub top_log_every: u64,

    /// Serve a non-loopback address without --token-file: only where something else
    /// authenticates every caller (a mesh's mutual TLS and authorization policy)
    #[arg(long, env = "SLUICE_ALLOW_UNAUTHENTICATED")]
    pub allow_unauthenticated: bool,

    /// The longest any key may live in Redis: a limit whose state would need longer (a bucket
    /// that takes longer to fill, a longer window, two for a sliding window) is refused
    #[arg(
        long,
        env = "SLUICE_MAX_KEY_TTL",
        value_name = "DURATION",
        default_value = "62d",
        value_parser = max_key_ttl
    )]
    pub max_key_ttl: Bounds,

    /// Policies that always have a `policy` label of their own in the metrics, comma-separated
    /// (other names get one while fewer than 100 have)
    #[arg(
        long,
        env = "SLUICE_METRIC_POLICIES",
        value_name = "NAMES",
        value_delimiter = ',',
        value_parser = metrics::policy_name
    )]
    pub metric_policies: Vec<String>,

    #[command(flatten)]
    pub connections: ConnectionArgs,

    /// Log level (error, warn, info, debug, trace) or tracing directives
    #[arg(
        long,
        env = "SLUICE_LOG",
        value_name = "FILTER",
        default_value = "info",
        value_parser = log_filter
    )]
    pub log: String,

    /// On SIGTERM, keep serving this long with /readyz failing, so that load balancers stop
    /// sending first
    #[arg(
        long,
        env = "SLUICE_SHUTDOWN_DELAY",
        value_name = "SECONDS",
        default_value = "0",
        value_parser = seconds
    )]
    pub shutdown_delay: Duration,

    /// Then stop accepting, and give requests in flight this long to finish
    #[arg(
        long,
        env = "SLUICE_SHUTDOWN_TIMEOUT",
        value_name = "SECONDS",
        default_value = "5",
        value_parser = seconds
    )]
    pub shutdown_timeout: Duration,
}

impl Args {
    /// Where to serve HTTP: `--listen`, else the default unless `--rls` or `--rlqs` is given.
    pub fn http_listen(&self) -> Option<SocketAddr> {
        match (self.listen, self.rls.rls.or(self.rls.rlqs)) {
            (Some(listen), _) => Some(listen),
            (None, Some(_)) => None,
            (None, None) => DEFAULT_LISTEN.parse().ok(),
        }
    }

    /// Secure by default: an address beyond loopback is served only with a token, unless the
    /// operator says that something else authenticates the callers.
    pub fn check_authentication(&self) -> Result<(), String> {
        if self.token_file.is_some() || self.allow_unauthenticated {
            return Ok(());
        }
        let exposed = [self.http_listen(), self.rls.rls, self.rls.rlqs]
            .into_iter()
            .flatten()
            .find(|address| !address.ip().is_loopback());
        match exposed {
            Some(address) => Err(format!(
                "will not serve {address} without --token-file: anyone who reaches it could \
                 spend any key's budget. Give --token-file, or --allow-unauthenticated where \
                 something else authenticates every caller (a mesh's mutual TLS and \
                 authorization policy)"
            )),
            None => Ok(()),
        }
    }
}

/// How many connections, and how long each may wait: defaults that hold on a process limit of
/// 1,024 file descriptors (docs/service-api.md#connections).
#[derive(ClapArgs, Debug)]
pub struct ConnectionArgs {
    /// Connections open at once, both servers together; at the cap the idle connection that did
    /// least for longest is closed for a newcomer [default: the file descriptor limit less 64,
    /// at most 16384]
    #[arg(
        long,
        env = "SLUICE_MAX_CONNECTIONS",
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_connections: Option<u32>,

    /// A connection's first request, and each HTTP/1.1 request from its first byte, must arrive
    /// within this long
    #[arg(
        long,
        env = "SLUICE_HEADER_TIMEOUT",
        value_name = "SECONDS",
        default_value = "10",
        value_parser = positive_seconds
    )]
    pub header_timeout: Duration,

    /// A connection without a request in flight is closed this long after its last answer
    #[arg(
        long,
        env = "SLUICE_IDLE_TIMEOUT",
        value_name = "SECONDS",
        default_value = "120",
        value_parser = positive_seconds
    )]
    pub idle_timeout: Duration,

    /// The largest request: a check's body, an RLS call's message
    #[arg(
        long,
        env = "SLUICE_MAX_REQUEST_BYTES",
        value_name = "BYTES",
        default_value_t = DEFAULT_MAX_REQUEST_BYTES,
        value_parser = request_bytes
    )]
    pub max_request_bytes: usize,
}

impl ConnectionArgs {
    pub fn limits(&self) -> Limits {
        let max_connections = (self.max_connections)
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or_else(connections::default_max_connections);
        Limits {
            max_connections,
            header_timeout: self.header_timeout,
            idle_timeout: self.idle_timeout,
        }
    }
}

/// A duration as the filter writes one (`62d`, `12h`), whole milliseconds, from a second up to
/// the largest bucket.
fn max_key_ttl(text: &str) -> Result<Bounds, String> {
    let nanos = parse_nanos(text)?;
    let max_ms = MAX_CAPACITY_US / 1000;
    if nanos % 1_000_000 != 0 || !(1_000..=max_ms).contains(&(nanos / 1_000_000)) {
        let max = human_ms(max_ms);
        return Err(format!("must be whole milliseconds, 1s to {max}"));
    }
    Ok(Bounds {
        max_key_ttl_ms: nanos / 1_000_000,
    })
}

/// Whole seconds, 1 to a day.
fn positive_seconds(text: &str) -> Result<Duration, String> {
    match seconds(text) {
        Ok(duration) if !duration.is_zero() => Ok(duration),
        _ => Err("must be whole seconds, 1 to 86400".to_string()),
    }
}

/// 1 KiB to 16 MiB.
fn request_bytes(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(bytes) if (1024..=16 << 20).contains(&bytes) => Ok(bytes),
        _ => Err("must be 1024 to 16777216 bytes".to_string()),
    }
}

fn log_filter(text: &str) -> Result<String, String> {
    EnvFilter::try_new(text)
        .map(|_| text.to_string())
        .map_err(|error| error.to_string())
}

/// Whole seconds, at most a day.
fn seconds(text: &str) -> Result<Duration, String> {
    match text.parse::<u64>() {
        Ok(seconds) if seconds <= 86_400 => Ok(Duration::from_secs(seconds)),
        _ => Err("must be whole seconds, 0 to 86400".to_string()),
    }
}

/// Where limits are kept: exactly one of the three.
#[derive(ClapArgs, Debug)]
#[group(required = true, multiple = false)]
pub struct StoreArgs {
    /// A single Redis node, e.g. redis://127.0.0.1:6379 (redis://:password@host:port/db)
    #[arg(long, env = "SLUICE_REDIS", value_name = "URL")]
    pub redis: Option<String>,

    /// Redis Cluster seed nodes, comma-separated, e.g. redis://h1:7000,redis://h2:7001
    #[arg(
        long,
        env = "SLUICE_REDIS_CLUSTER",
        value_name = "URLS",
        value_delimiter = ','
    )]
    pub redis_cluster: Option<Vec<String>>,

    /// No Redis: limits kept in this process, for trying sluice out and for tests (one replica
    /// only; the state goes with the process)
    #[arg(long, env = "SLUICE_MEMORY")]
    pub memory: bool,
}

/// The store chosen on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    Redis(RedisTarget),
    Memory,
}

impl StoreArgs {
    pub fn backend(&self) -> Backend {
        match (&self.redis, &self.redis_cluster) {
            _ if self.memory => Backend::Memory,
            (_, Some(nodes)) => Backend::Redis(RedisTarget::Cluster(nodes.clone())),
            // clap requires one of the three, so this is `--redis`.
            (url, None) => Backend::Redis(RedisTarget::Single(url.clone().unwrap_or_default())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::check::DEFAULT_MAX_KEY_TTL_MS;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("sluice-service").chain(args.iter().copied()))
    }

    #[test]
    fn redis_cluster_takes_comma_separated_nodes() {
        let args = parse(&["--redis-cluster", "redis://h1:1,redis://h2:2"]).unwrap();
        let nodes = vec!["redis://h1:1".to_string(), "redis://h2:2".to_string()];
        assert_eq!(
            args.store.backend(),
            Backend::Redis(RedisTarget::Cluster(nodes))
        );
        assert_eq!(args.http_listen(), Some("127.0.0.1:8080".parse().unwrap()));
        assert_eq!(args.token_file, None);
        assert_eq!(args.log, "info");
        assert_eq!(args.shutdown_delay, Duration::ZERO);
        assert_eq!(args.shutdown_timeout, Duration::from_secs(5));
        assert_eq!(args.max_key_ttl.max_key_ttl_ms, DEFAULT_MAX_KEY_TTL_MS);
        let limits = args.connections.limits();
        assert_eq!(limits.header_timeout, Duration::from_secs(10));
        assert_eq!(limits.idle_timeout, Duration::from_secs(120));
        assert_eq!(args.connections.max_request_bytes, 65_536);
    }

    #[test]
    fn a_non_loopback_address_needs_a_token_or_the_flag_that_says_why_not() {
        let exposed = ["--memory", "--listen", "0.0.0.0:8080"];
        let refused = parse(&exposed).unwrap().check_authentication().unwrap_err();
        assert!(refused.starts_with("will not serve 0.0.0.0:8080 without --token-file"));
        for extra in [&["--token-file", "t"][..], &["--allow-unauthenticated"]] {
            let args = parse(&[&exposed[..], extra].concat()).unwrap();
            assert_eq!(args.check_authentication(), Ok(()), "{extra:?}");
        }
        let rls = ["--memory", "--rls", "[::]:8081", "--rls-config", "c"];
        assert!(parse(&rls).unwrap().check_authentication().is_err());
        let local = [
            "--memory",
            "--listen",
            "127.0.0.1:1",
            "--rls",
            "[::1]:2",
            "--rls-config",
            "c",
        ];
        assert_eq!(parse(&local).unwrap().check_authentication(), Ok(()));
        assert_eq!(parse(&["--memory"]).unwrap().check_authentication(), Ok(()));
    }

    #[test]
    fn bounds_and_timeouts_are_checked_where_they_are_given() {
        let with = |extra: &[&str]| parse(&[&["--memory"][..], extra].concat());
        let args = with(&["--max-key-ttl", "90d", "--max-connections", "900"]).unwrap();
        assert_eq!(args.max_key_ttl.max_key_ttl_ms, 90 * 86_400_000);
        assert_eq!(args.connections.limits().max_connections, 900);
        for bad in [
            &["--max-key-ttl", "500ms"][..],
            &["--max-key-ttl", "1500us"],
            &["--max-key-ttl", "60000d"],
            &["--header-timeout", "0"],
            &["--max-connections", "0"],
            &["--max-request-bytes", "100"],
            &["--metric-policies", "a,b c"],
        ] {
            assert!(with(bad).is_err(), "{bad:?}");
        }
        let listed = with(&["--metric-policies", "checkout,per-user"]).unwrap();
        assert_eq!(listed.metric_policies, ["checkout", "per-user"]);
    }

    #[test]
    fn shutdown_bounds_are_whole_seconds_and_log_filters_must_parse() {
        let redis = ["--redis", "redis://a"];
        let args = parse(&[&redis[..], &["--shutdown-delay", "3", "--log", "debug"]].concat());
        let args = args.unwrap();
        assert_eq!(args.shutdown_delay, Duration::from_secs(3));
        assert_eq!(args.log, "debug");
        for bad in [
            ["--shutdown-timeout", "1.5"],
            ["--shutdown-delay", "-1"],
            ["--shutdown-delay", "86401"],
            ["--log", "info,[bad"],
        ] {
            assert!(parse(&[&redis[..], &bad[..]].concat()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn exactly_one_store_is_required() {
        assert!(parse(&["--listen", "127.0.0.1:1"]).is_err());
        assert!(parse(&["--redis", "redis://a", "--redis-cluster", "redis://b"]).is_err());
        assert!(parse(&["--redis", "redis://a", "--memory"]).is_err());
        let single = parse(&["--redis", "redis://127.0.0.1:6379"]).unwrap();
        assert_eq!(
            single.store.backend(),
            Backend::Redis(RedisTarget::Single("redis://127.0.0.1:6379".into()))
        );
        assert_eq!(
            parse(&["--memory"]).unwrap().store.backend(),
            Backend::Memory
        );
    }

    #[test]
    fn with_rls_http_is_served_only_when_listen_is_given() {
        let rls = [
            "--redis",
            "redis://a",
            "--rls",
            "127.0.0.1:0",
            "--rls-config",
            "rls.yaml",
        ];
        assert_eq!(parse(&rls).unwrap().http_listen(), None);
        let both = parse(&[&rls[..], &["--listen", "127.0.0.1:9"]].concat()).unwrap();
        assert_eq!(both.http_listen(), Some("127.0.0.1:9".parse().unwrap()));
    }

    #[test]
    fn rls_and_its_config_come_together() {
        assert!(parse(&["--redis", "redis://a", "--rls", "127.0.0.1:0"]).is_err());
        assert!(parse(&["--redis", "redis://a", "--rls-config", "rls.yaml"]).is_err());
        let bad_headers = [
            "--rls",
            "127.0.0.1:0",
            "--rls-config",
            "x",
            "--rls-headers",
            "all",
        ];
        assert!(parse(&[&["--redis", "redis://a"][..], &bad_headers].concat()).is_err());
    }

    #[test]
    fn rlqs_needs_the_limits_files_and_serves_no_http_by_default() {
        let alone = Args::try_parse_from(["sluice-service", "--memory", "--rlqs", "127.0.0.1:0"]);
        let error = alone.unwrap_err().to_string();
        assert!(
            error.contains("--rls-config") && error.contains("--rlqs"),
            "{error}"
        );
        let rlqs = ["--memory", "--rlqs", "127.0.0.1:0", "--rls-config", "c"];
        let args = parse(&rlqs).unwrap();
        assert_eq!(args.http_listen(), None);
        assert_eq!(args.rls.rls, None);
        let exposed = ["--memory", "--rlqs", "[::]:8082", "--rls-config", "c"];
        assert!(parse(&exposed).unwrap().check_authentication().is_err());
    }
}
