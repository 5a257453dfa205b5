//! What the admin API asks of Redis beside checks and settlements: forgetting one key's state
//! (`Store::reset`, a plain `DEL`: every algorithm's state is one key), and the overrides, the
//! fields of one hash, `OVERRIDES_KEY` (`PUT_OVERRIDE_LUA` keeps their number bounded).

use redis::{Cmd, FromRedisValue, RedisResult, Script};

use super::{Connection, Core};

/// The hash of every override: field = the override's name, value = its JSON. One key, so that
/// listing them is one `HSCAN`; in a Cluster it lives on one node.
pub const OVERRIDES_KEY: &str = "sluice:admin:overrides";

/// The field of `OVERRIDES_KEY` that every set and delete increments (no override's name, which
/// is `<namespace>:<key>`, starts with `#`): a replica reads it each second and the whole hash
/// only when it changed.
pub const VERSION_FIELD: &str = "#version";

/// How many fields `overrides_page` asks for at once: a few hundred kilobytes.
const OVERRIDES_PAGE: u64 = 1_000;

/// KEYS[1] the overrides' hash; ARGV[1] the name, ARGV[2] the value, ARGV[3] the most
/// overrides. Sets the field unless it is new and the hash holds the most already (its version
/// field aside), and counts the change. Returns 1 if set, 0 if refused at the bound.
pub const PUT_OVERRIDE_LUA: &str = r"
local kept = redis.call('HLEN', KEYS[1]) - redis.call('HEXISTS', KEYS[1], '#version')
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 and kept >= tonumber(ARGV[3]) then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[1], '#version', 1)
return 1
";

/// KEYS[1] the overrides' hash; ARGV[1] the name. Deletes the field and counts the change;
/// returns 1 if it was there.
pub const DELETE_OVERRIDE_LUA: &str = r"
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('HINCRBY', KEYS[1], '#version', 1)
return 1
";

impl Core {
    /// Deletes `key`; whether it was there.
    pub(super) async fn delete(&self, key: &str) -> RedisResult<bool> {
        let mut command = redis::cmd("DEL");
        command.arg(key);
        let deleted: i64 = self.query(&command).await?;
        Ok(deleted > 0)
    }

    /// The string state at `key` (token bucket, fixed, calendar and sliding windows: decimal
    /// numbers joined by `:`) as words, in the order the filter's algorithms keep them; `None`
    /// without one. Only for those algorithms: another's state is no string (`WRONGTYPE`).
    pub(super) async fn words(&self, key: &str) -> RedisResult<Option<Vec<u64>>> {
        let mut command = redis::cmd("GET");
        command.arg(key);
        let stored: Option<String> = self.query(&command).await?;
        Ok(stored.and_then(|text| text.split(':').map(|n| n.parse().ok()).collect()))
    }

    pub(super) async fn put_override(
        &self,
        name: &str,
        value: &str,
        max: u64,
    ) -> RedisResult<bool> {
        let script = Script::new(PUT_OVERRIDE_LUA);
        let mut invocation = script.key(OVERRIDES_KEY);
        invocation.arg(name).arg(value).arg(max);
        let stored: i64 = match self.link.connect().await? {
            Connection::Single(mut con) => invocation.invoke_async(&mut con).await?,
            Connection::Cluster(mut con) => invocation.invoke_async(&mut con).await?,
        };
        Ok(stored == 1)
    }

    pub(super) async fn delete_override(&self, name: &str) -> RedisResult<bool> {
        let script = Script::new(DELETE_OVERRIDE_LUA);
        let mut invocation = script.key(OVERRIDES_KEY);
        invocation.arg(name);
        let deleted: i64 = match self.link.connect().await? {
            Connection::Single(mut con) => invocation.invoke_async(&mut con).await?,
            Connection::Cluster(mut con) => invocation.invoke_async(&mut con).await?,
        };
        Ok(deleted == 1)
    }

    /// One page of the overrides from `cursor` (0 starts), and the cursor of the next (0 ends).
    /// Pages, not one `HGETALL`: 100,000 overrides are tens of megabytes, which one command
    /// would hold Redis and the connection for, and past any one command's time bound.
    pub(super) async fn overrides_page(
        &self,
        cursor: u64,
    ) -> RedisResult<(u64, Vec<(String, String)>)> {
        let mut command = redis::cmd("HSCAN");
        command
            .arg(OVERRIDES_KEY)
            .arg(cursor)
            .arg("COUNT")
            .arg(OVERRIDES_PAGE);
        let (next, mut kept): (u64, Vec<(String, String)>) = self.query(&command).await?;
        kept.retain(|(name, _)| name != VERSION_FIELD);
        Ok((next, kept))
    }

    pub(super) async fn overrides_version(&self) -> RedisResult<u64> {
        let mut command = redis::cmd("HGET");
        command.arg(OVERRIDES_KEY).arg(VERSION_FIELD);
        let version: Option<u64> = self.query(&command).await?;
        Ok(version.unwrap_or(0))
    }

    async fn query<T: FromRedisValue>(&self, command: &Cmd) -> RedisResult<T> {
        match self.link.connect().await? {
            Connection::Single(mut con) => command.query_async(&mut con).await,
            Connection::Cluster(mut con) => command.query_async(&mut con).await,
        }
    }
}
