//! The `Store` over Redis (one node or a Cluster): one atomic Lua call per check, Redis TIME as
//! the only clock, every call bounded by `COMMAND_TIMEOUT`.

use std::fmt;
use std::time::Duration;

use futures_util::future::try_join_all;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, Pipeline, RedisError, RedisResult, Script, ServerErrorKind, Value};

use crate::store::{Bucket, Decision, Store, StoreError};

/// Token bucket as GCRA: the whole state is the bucket's theoretical arrival time (TAT).
/// The bucket is full when TAT <= now; each token taken moves TAT one interval later.
///
/// KEYS[1]: `sluice:{<key>}`, the TAT in µs since the epoch (decimal string; absent = full).
/// ARGV[1]: interval_us, µs per token (>= 1).   ARGV[2]: burst, capacity in tokens.
/// ARGV[3]: cost, tokens needed.                ARGV[4]: take, tokens wanted (cost..=burst).
/// Returns {allowed (1|0), granted, remaining, reset_us, retry_after_us}.
///
/// A denial writes nothing. A grant sets the TAT with a TTL of the time until the bucket is
/// full again plus 1 s, so idle keys vanish. Numbers are Lua doubles: exact because the caller
/// keeps burst × interval below `check::MAX_CAPACITY_US`. `%d` formats them without exponents.
pub const TOKEN_BUCKET_LUA: &str = r"
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local take = tonumber(ARGV[4])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local capacity = burst * interval
-- A TAT in the past means a full bucket: elapsed time beyond that is not credited.
local tat = math.max(tonumber(redis.call('GET', KEYS[1])) or 0, now)
local available = math.floor((capacity - (tat - now)) / interval)
if available < cost then
  local retry_after = tat + cost * interval - capacity - now
  return {0, 0, math.max(available, 0), tat - now, retry_after}
end
local granted = math.min(take, available)
tat = tat + granted * interval
local reset = tat - now
local ttl_ms = math.ceil(reset / 1000) + 1000
redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', string.format('%d', ttl_ms))
return {1, granted, available - granted, reset, 0}
";

/// Bound on every Redis operation, retries and reconnects included.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
/// Bound on connecting (and loading the script) at start.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Which Redis to use, as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    Single(String),
    Cluster(Vec<String>),
}

impl fmt::Display for RedisTarget {
    /// For logs: URLs without their passwords.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisTarget::Single(url) => f.write_str(&redact(url)),
            RedisTarget::Cluster(urls) => {
                let urls: Vec<String> = urls.iter().map(|url| redact(url)).collect();
                write!(f, "cluster {}", urls.join(","))
            }
        }
    }
}

/// `redis://user:secret@host:port` → `redis://***@host:port`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest
        .get(..authority_end)
        .and_then(|authority| authority.rfind('@'))
    {
        Some(at) => format!("{scheme}://***{}", rest.get(at..).unwrap_or_default()),
        None => url.to_string(),
    }
}

/// The Redis key of a check: the hash tag is the whole caller key, so a check's state lives in
/// one Cluster slot (algorithms with several keys use `sluice:{<key>}:<suffix>`).
pub fn redis_key(key: &str) -> String {
    format!("sluice:{{{key}}}")
}

#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

pub struct RedisStore {
    connection: Connection,
    script: Script,
}

impl RedisStore {
    /// Connects, checks that Redis answers and loads the script, all within `CONNECT_TIMEOUT`.
    pub async fn connect(target: &RedisTarget) -> Result<RedisStore, StoreError> {
        bounded(CONNECT_TIMEOUT, async {
            let store = RedisStore {
                connection: open(target).await?,
                script: Script::new(TOKEN_BUCKET_LUA),
            };
            store.load_script().await?;
            Ok(store)
        })
        .await
    }

    /// SCRIPT LOAD; in a Cluster the client sends it to every node.
    async fn load_script(&self) -> RedisResult<()> {
        let loaded = match self.connection.clone() {
            Connection::Single(mut con) => self.script.load_async(&mut con).await,
            Connection::Cluster(mut con) => self.script.load_async(&mut con).await,
        };
        loaded.map(drop)
    }

    async fn decide(&self, buckets: &[Bucket]) -> RedisResult<Vec<Decision>> {
        let replies = match self.connection.clone() {
            Connection::Single(mut con) => self.eval_pipelined(&mut con, buckets).await?,
            Connection::Cluster(con) => self.eval_concurrently(&con, buckets).await?,
        };
        if replies.len() != buckets.len() {
            let detail = format!("{} replies for {} checks", replies.len(), buckets.len());
            return Err(unexpected_reply(detail));
        }
        replies.into_iter().map(decision_from_reply).collect()
    }

    /// One node: all checks in one pipeline. Checks that met NOSCRIPT (the script cache was
    /// flushed, or Redis restarted) are run again, once, after loading the script.
    async fn eval_pipelined(
        &self,
        con: &mut ConnectionManager,
        buckets: &[Bucket],
    ) -> RedisResult<Vec<Value>> {
        let mut replies = self
            .pipeline(buckets.iter())
            .query_async::<Vec<Value>>(con)
            .await?;
        let missing: Vec<usize> = (replies.iter().enumerate())
            .filter(|(_, reply)| is_noscript(reply))
            .map(|(i, _)| i)
            .collect();
        if missing.is_empty() {
            return Ok(replies);
        }
        self.load_script().await?;
        let again = missing.iter().filter_map(|&i| buckets.get(i));
        let retried = self.pipeline(again).query_async::<Vec<Value>>(con).await?;
        for (i, reply) in missing.into_iter().zip(retried) {
            if let Some(slot) = replies.get_mut(i) {
                *slot = reply;
            }
        }
        Ok(replies)
    }

    /// Cluster: every check in flight at once. The client multiplexes them over one connection
    /// per node, so each node gets its checks in one round trip; it follows MOVED/ASK per command
    /// and `invoke_async` reloads the script on NOSCRIPT. (A redis-rs pipeline must stay within
    /// one slot, and checks of one request are in different slots.)
    async fn eval_concurrently(
        &self,
        con: &ClusterConnection,
        buckets: &[Bucket],
    ) -> RedisResult<Vec<Value>> {
        try_join_all(buckets.iter().map(|bucket| {
            let mut con = con.clone();
            let mut invocation = self.script.key(redis_key(&bucket.key));
            invocation.arg(&script_args(bucket));
            async move { invocation.invoke_async::<Value>(&mut con).await }
        }))
        .await
    }

    /// EVALSHA per bucket; errors stay in the replies so NOSCRIPT can be told from the rest.
    fn pipeline<'a>(&self, buckets: impl Iterator<Item = &'a Bucket>) -> Pipeline {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for bucket in buckets {
            pipe.cmd("EVALSHA")
                .arg(self.script.get_hash())
                .arg(1)
                .arg(redis_key(&bucket.key))
                .arg(&script_args(bucket));
        }
        pipe
    }

    async fn ping(&self) -> RedisResult<()> {
        let ping = redis::cmd("PING");
        match self.connection.clone() {
            Connection::Single(mut con) => ping.exec_async(&mut con).await,
            Connection::Cluster(mut con) => ping.exec_async(&mut con).await,
        }
    }
}

impl Store for RedisStore {
    async fn check(&self, buckets: &[Bucket]) -> Result<Vec<Decision>, StoreError> {
        bounded(COMMAND_TIMEOUT, async { self.decide(buckets).await }).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        bounded(COMMAND_TIMEOUT, async { RedisStore::ping(self).await }).await
    }
}

async fn open(target: &RedisTarget) -> RedisResult<Connection> {
    match target {
        RedisTarget::Single(url) => {
            let client = redis::Client::open(url.as_str())?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(COMMAND_TIMEOUT))
                .set_response_timeout(Some(COMMAND_TIMEOUT))
                // At start, fail fast; later the manager reconnects on the next command.
                .set_number_of_retries(1);
            let manager = ConnectionManager::new_with_config(client, config).await?;
            Ok(Connection::Single(manager))
        }
        RedisTarget::Cluster(urls) => {
            let client = ClusterClientBuilder::new(urls.iter().map(String::as_str))
                .connection_timeout(COMMAND_TIMEOUT)
                .response_timeout(COMMAND_TIMEOUT)
                .retries(2)
                .build()?;
            Ok(Connection::Cluster(client.get_async_connection().await?))
        }
    }
}

/// ARGV of `TOKEN_BUCKET_LUA`.
fn script_args(bucket: &Bucket) -> [u64; 4] {
    [bucket.interval_us, bucket.burst, bucket.cost, bucket.take]
}

fn is_noscript(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(error) if error.code() == "NOSCRIPT")
}

/// `{allowed, granted, remaining, reset_us, retry_after_us}` from the script, or the error
/// Redis answered instead.
fn decision_from_reply(reply: Value) -> RedisResult<Decision> {
    if let Value::ServerError(error) = reply {
        return Err(error.into());
    }
    let numbers: Vec<i64> = redis::from_redis_value(reply)?;
    let unsigned = |n: i64| u64::try_from(n).unwrap_or(0);
    match numbers.as_slice() {
        &[allowed, granted, remaining, reset_us, retry_after_us] => Ok(Decision {
            allowed: allowed == 1,
            granted: unsigned(granted),
            remaining: unsigned(remaining),
            reset_us: unsigned(reset_us),
            retry_after_us: unsigned(retry_after_us),
        }),
        other => Err(unexpected_reply(format!("script returned {other:?}"))),
    }
}

fn unexpected_reply(detail: String) -> RedisError {
    let kind = ErrorKind::Server(ServerErrorKind::ResponseError);
    RedisError::from((kind, "unexpected reply from Redis", detail))
}

/// Runs `operation` within `limit`, turning Redis errors and the timeout into a `StoreError`.
async fn bounded<T>(
    limit: Duration,
    operation: impl std::future::Future<Output = RedisResult<T>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, operation).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(StoreError(error.to_string())),
        Err(_) => Err(StoreError(format!("no answer from Redis within {limit:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_redis_key_hash_tags_the_whole_caller_key() {
        assert_eq!(
            redis_key("per-user/7af12e58ae350d9a"),
            "sluice:{per-user/7af12e58ae350d9a}"
        );
    }

    #[test]
    fn logged_urls_hide_credentials() {
        assert_eq!(
            redact("redis://:secret@10.0.0.1:6379/0"),
            "redis://***@10.0.0.1:6379/0"
        );
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(
            redact("redis://127.0.0.1:6379/a@b"),
            "redis://127.0.0.1:6379/a@b"
        );
        let cluster = RedisTarget::Cluster(vec!["redis://u:p@h1:1".into(), "redis://h2:2".into()]);
        assert_eq!(cluster.to_string(), "cluster redis://***@h1:1,redis://h2:2");
    }

    #[test]
    fn a_script_reply_becomes_a_decision() {
        let reply = Value::Array([1, 3, 17, 600_000, 0].map(Value::Int).to_vec());
        let decision = decision_from_reply(reply).unwrap();
        assert_eq!(
            decision,
            Decision {
                allowed: true,
                granted: 3,
                remaining: 17,
                reset_us: 600_000,
                retry_after_us: 0
            }
        );
        assert!(decision_from_reply(Value::Array(vec![Value::Int(1)])).is_err());
    }
}
