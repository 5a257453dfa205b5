//! Command line and environment.

use std::net::SocketAddr;

use clap::{Args as ClapArgs, Parser};

use crate::redis_store::RedisTarget;

/// Decides sluice's global rate limits for the Envoy filter (token bucket, fixed window, sliding
/// window, sliding log, leaky bucket), keeping their state in Redis. Serves POST /v1/check,
/// GET /healthz and GET /metrics.
#[derive(Parser, Debug)]
#[command(name = "sluice-service", version)]
pub struct Args {
    /// Address to serve HTTP on (port 0 picks a free port, logged when ready)
    #[arg(
        long,
        env = "SLUICE_LISTEN",
        value_name = "ADDR",
        default_value = "127.0.0.1:8080"
    )]
    pub listen: SocketAddr,

    #[command(flatten)]
    pub redis: RedisArgs,
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
        assert_eq!(args.listen, "127.0.0.1:8080".parse().unwrap());
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
