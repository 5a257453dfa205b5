//! Command line and environment.

use std::net::SocketAddr;

use clap::{Args as ClapArgs, Parser};

use crate::redis_store::RedisTarget;
use crate::rls::RlsArgs;

/// Where HTTP is served when `--listen` is not given and neither is `--rls`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// Decides sluice's global rate limits for the Envoy filter (token bucket, fixed window, sliding
/// window, sliding log, leaky bucket), keeping their state in Redis. Serves POST /v1/check,
/// GET /healthz and GET /metrics, and with --rls Envoy's Rate Limit Service gRPC API.
#[derive(Parser, Debug)]
#[command(name = "sluice-service", version)]
pub struct Args {
    /// Address to serve HTTP on (port 0 picks a free port, logged when ready) [default:
    /// 127.0.0.1:8080, or no HTTP at all with --rls]
    #[arg(long, env = "SLUICE_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,

    #[command(flatten)]
    pub redis: RedisArgs,

    #[command(flatten)]
    pub rls: RlsArgs,
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

/// Exactly one of the two.
#[derive(ClapArgs, Debug)]
#[group(required = true, multiple = false)]
pub struct RedisArgs {
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
}

impl RedisArgs {
    pub fn target(&self) -> RedisTarget {
        match (&self.redis, &self.redis_cluster) {
            (_, Some(nodes)) => RedisTarget::Cluster(nodes.clone()),
            // clap requires one of the two, so this is `--redis`.
            (url, None) => RedisTarget::Single(url.clone().unwrap_or_default()),
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
        assert_eq!(args.redis.target(), RedisTarget::Cluster(nodes));
        assert_eq!(args.http_listen(), Some("127.0.0.1:8080".parse().unwrap()));
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
    fn exactly_one_redis_is_required() {
        assert!(parse(&["--listen", "127.0.0.1:1"]).is_err());
        assert!(parse(&["--redis", "redis://a", "--redis-cluster", "redis://b"]).is_err());
        let single = parse(&["--redis", "redis://127.0.0.1:6379"]).unwrap();
        assert_eq!(
            single.redis.target(),
            RedisTarget::Single("redis://127.0.0.1:6379".into())
        );
    }
}
