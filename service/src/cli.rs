//! Command line and environment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args as ClapArgs, Parser};
use tracing_subscriber::EnvFilter;

use crate::redis_store::RedisTarget;
use crate::rls::RlsArgs;

/// Where HTTP is served when `--listen` is not given and neither is `--rls`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// Decides sluice's global rate limits for the Envoy filter (token bucket, fixed window, sliding
/// window, sliding log, leaky bucket), keeping their state in Redis. Serves POST /v1/check,
/// GET /healthz, GET /readyz and GET /metrics, and with --rls Envoy's Rate Limit Service gRPC
/// API; logs JSON lines on stderr.
#[derive(Parser, Debug)]
#[command(name = "sluice-service", version)]
pub struct Args {
    /// Address to serve HTTP on (port 0 picks a free port, logged when listening) [default:
    /// 127.0.0.1:8080, or no HTTP at all with --rls]
    #[arg(long, env = "SLUICE_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,

    #[command(flatten)]
    pub store: StoreArgs,

    #[command(flatten)]
    pub rls: RlsArgs,

    /// File of bearer tokens that POST /v1/check then requires, one per line; re-read when it
    /// changes and on SIGHUP
    #[arg(long, env = "SLUICE_TOKEN_FILE", value_name = "PATH")]
    pub token_file: Option<PathBuf>,

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
    /// Where to serve HTTP: `--listen`, else the default unless `--rls` is given.
    pub fn http_listen(&self) -> Option<SocketAddr> {
        match (self.listen, self.rls.rls) {
            (Some(listen), _) => Some(listen),
            (None, Some(_)) => None,
            (None, None) => DEFAULT_LISTEN.parse().ok(),
        }
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
}
