//! The `Store` over Redis (one node or a Cluster): atomic Lua calls, Redis TIME as the only clock,
//! every call bounded by `COMMAND_TIMEOUT`. Checks go in batches (`batch`): the checks that are
//! ready together, of the algorithms whose state is one string, in one `CHECKS_LUA` call (`lua`);
//! the sliding log's and concurrency's one script call per check, in the same round trip.
//! Settlements are one script call each, pipelined. Connections
//! are made and remade in the background: the store starts whether or not Redis answers, and a
//! check while it does not fails within its bound instead of waiting for it.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::try_join_all;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::{
    ErrorKind, IntoConnectionInfo, Pipeline, RedisError, RedisResult, Script, ServerErrorKind,
    Value,
};

use tokio::sync::OnceCell;

mod admin;
mod batch;
mod calendar;
mod lua;

pub use calendar::{CALENDAR_WINDOW_LUA, CALENDAR_WINDOW_REFUND_LUA};
pub use lua::{
    CHECKS_LUA, DECISION_BYTES, FIXED_WINDOW_LUA, LEAKY_BUCKET_LUA, RECORD_BYTES,
    SLIDING_WINDOW_LUA, TOKEN_BUCKET_LUA,
};

use crate::stores::quota::{self, Demand, QuotaReport};
use crate::stores::{
    released_key, settled_id_key, settled_key, state_key, Algorithm, Check, Decision, FailureKind,
    SettleOp, Settled, Settlement, Slots, Store, StoreError, Watched, SETTLED_TTL_MS,
};

// Every script below reads the clock with `TIME` (the only clock: µs since the epoch), keeps its
// state in KEYS[1] = `store::state_key` (its name holds the algorithm and its numbers), writes
// only when it grants or owes tokens, and sets a TTL on every write, so idle keys vanish: a check
// of cost 0 (the RLS's `hits_addend` 0, or a call past the limit's capacity) only reads. A
// refused check with a `debt` (ARGV[5], `store::Check::debt`) is charged anyway, the key owing at
// most `debt` tokens past its limit, and answered refused with `granted` = the tokens charged and
// the rest as the state stands after the charge: the filter's `Algorithm::owe`. Numbers are
// Lua doubles, exact below 2^53: `check` bounds the inputs so that every intermediate stays
// below it (the sliding window's products use `muldiv`). `%d` formats numbers without exponents.
// State of another type under the key reads as no state and is overwritten by the next grant.

/// Sliding log: the admission time of every token of the last `window`, so the limit holds
/// exactly over any span of `window`.
///
/// KEYS[1]: a sorted set: score = admission time in µs, member `<time>-<n>`, n = 0, 1, ...
/// among the members of that time (they are trimmed together, by score, so the next n is their
/// count: members stay unique even if the clock steps back).
/// ARGV[1]: window_us.   ARGV[2]: limit (<= 1000).   ARGV[3]: cost.   ARGV[4]: take.
/// ARGV[5]: debt.
/// Returns {allowed (1|0), granted, remaining, reset_us, retry_after_us}.
///
/// An entry is live while time > now - window. Admits if live + cost <= limit, adding
/// granted = min(take, limit - live) entries at now after trimming the expired ones. A denial or
/// a grant of 0 writes nothing; a denial's retry_after is when the (live + cost - limit)-th
/// oldest entry leaves, its reset (and a grant of 0's) when the newest does; an admission's
/// reset is the window. A denial with debt adds min(cost, limit + debt - live) entries at now
/// (the caller keeps cost within the request's bound of log entries), then answers as the log
/// stands. TTL: the window plus 1 s (the newest entry is now).
pub const SLIDING_LOG_LUA: &str = r"
local window = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local take = tonumber(ARGV[4])
local debt = tonumber(ARGV[5]) or 0
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local kind = redis.call('TYPE', KEYS[1])['ok']
local foreign = kind ~= 'zset' and kind ~= 'none'
local live_from = '(' .. string.format('%d', now - window)
local count = 0
if not foreign then
  count = redis.call('ZCOUNT', KEYS[1], live_from, '+inf')
end
-- When the newest live entry leaves the window (0 for none).
local function newest_leaves()
  if foreign then
    return 0
  end
  local newest = redis.call('ZREVRANGEBYSCORE', KEYS[1], '+inf', live_from, 'WITHSCORES', 'LIMIT', 0, 1)
  if newest[2] then
    return tonumber(newest[2]) + window - now
  end
  return 0
end
-- Adds n entries at now, after trimming the expired ones.
local function add(n)
  if foreign then
    redis.call('DEL', KEYS[1])
    foreign = false
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now - window))
  local at = string.format('%d', now)
  local first = redis.call('ZCOUNT', KEYS[1], at, at)
  local entries = {}
  for i = first, first + n - 1 do
    entries[#entries + 1] = at
    entries[#entries + 1] = at .. '-' .. string.format('%d', i)
  end
  redis.call('ZADD', KEYS[1], unpack(entries))
  redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil(window / 1000) + 1000))
end
if count + cost > limit then
  local charged = 0
  if debt > 0 and cost > 0 then
    charged = math.min(cost, math.max(limit + debt - count, 0))
  end
  if charged > 0 then
    add(charged)
    count = count + charged
  end
  local must_expire = math.max(count + cost - limit, 1)
  local retry_after = window
  if not foreign then
    local oldest = redis.call('ZRANGEBYSCORE', KEYS[1], live_from, '+inf', 'WITHSCORES', 'LIMIT', must_expire - 1, 1)
    if oldest[2] then
      retry_after = tonumber(oldest[2]) + window - now
    end
  end
  return {0, charged, math.max(limit - count, 0), newest_leaves(), retry_after}
end
local granted = math.min(take, limit - count)
if granted == 0 then
  return {1, 0, limit - count, newest_leaves(), 0}
end
add(granted)
return {1, granted, limit - count - granted, window, 0}
";

/// Concurrency: at most `limit` slots live at once. A sorted set: member = the slot's name,
/// score = when its lease expires (µs since the epoch); a slot is live while its expiry is
/// after now, so a slot whose release is lost frees itself when its lease ends.
///
/// KEYS[1]: the sorted set.
/// ARGV[1]: limit.   ARGV[2]: lease_us.   ARGV[3]: cost, slots that must be free.
/// ARGV[4]: take, slots to take (0..=cost: 0 only asks).
/// ARGV[5]: the slot's name, or '' for `take` slots the script names itself: `<now>-<n>`, the
/// first n whose name is not taken (unique, and never a filter's name of 16 hex digits).
/// KEYS[2], with a name only: the name's tombstone (`store::released_key`).
/// Returns {allowed (1|0), granted, remaining, reset_us, retry_after_us}.
///
/// A named slot whose tombstone is there was released before this check came (the filter gave
/// up on the check, and sent the release): refused, nothing written. A named slot that is already live is the same request asking again (a retried check): it is
/// not counted against itself, and taking it again only moves its expiry. Refuses if live +
/// cost > limit, writing nothing; retry_after is 0 (nobody knows when a slot frees). Otherwise
/// drops the expired members, adds the slots at now + lease, and sets the key's TTL to cover
/// the newest expiry plus 1 s. remaining = limit - live - granted; reset = until the newest
/// live slot expires (0 for none). State of another type reads as no slots.
pub const CONCURRENCY_LUA: &str = r"
local limit = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local take = tonumber(ARGV[4])
local name = ARGV[5]
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local kind = redis.call('TYPE', KEYS[1])['ok']
local foreign = kind ~= 'zset' and kind ~= 'none'
local live_from = '(' .. string.format('%d', now)
local live = 0
if not foreign then
  live = redis.call('ZCOUNT', KEYS[1], live_from, '+inf')
  if name ~= '' then
    local score = tonumber(redis.call('ZSCORE', KEYS[1], name))
    if score ~= nil and score > now then
      live = live - 1
    end
  end
end
-- Until the newest live slot expires (0 for none).
local function newest_expires()
  if foreign then
    return 0
  end
  local newest = redis.call('ZREVRANGEBYSCORE', KEYS[1], '+inf', live_from, 'WITHSCORES', 'LIMIT', 0, 1)
  if newest[2] then
    return tonumber(newest[2]) - now
  end
  return 0
end
if live + cost > limit or (KEYS[2] and redis.call('EXISTS', KEYS[2]) == 1) then
  return {0, 0, math.max(limit - live, 0), newest_expires(), 0}
end
if take == 0 then
  return {1, 0, limit - live, newest_expires(), 0}
end
if foreign then
  redis.call('DEL', KEYS[1])
  foreign = false
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now))
local expiry = string.format('%d', now + lease)
if name ~= '' then
  redis.call('ZADD', KEYS[1], expiry, name)
else
  -- In chunks: unpack() of many thousand values would overflow Lua's stack.
  local n, added = 0, 0
  while added < take do
    local entries = {}
    while added < take and #entries < 1000 do
      local member = string.format('%d-%d', now, n)
      n = n + 1
      if not redis.call('ZSCORE', KEYS[1], member) then
        entries[#entries + 1] = expiry
        entries[#entries + 1] = member
        added = added + 1
      end
    end
    redis.call('ZADD', KEYS[1], unpack(entries))
  end
end
local reset = newest_expires()
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil(reset / 1000) + 1000))
return {1, take, limit - live - take, reset, 0}
";

/// Concurrency, the RLS's negative hits: gives back `count` slots, whichever expire soonest
/// (an anonymous slot has no name to release it by).
///
/// KEYS[1]: the sorted set of `CONCURRENCY_LUA`.
/// ARGV[1]: limit.   ARGV[2]: count.
/// Returns {allowed (1), granted (slots given back), remaining, reset_us, retry_after_us (0)}.
///
/// Drops the expired members, then `ZPOPMIN`s up to `count` (a −1 that comes after its slot
/// expired gives back another request's slot early: the slot it stood for has already freed
/// itself, so the key holds one slot less than it should until the next −1 has no slot to take).
/// The TTL is left as it is: it covers the newest expiry still there.
pub const CONCURRENCY_GIVE_BACK_LUA: &str = r"
local limit = tonumber(ARGV[1])
local count = tonumber(ARGV[2])
if redis.call('TYPE', KEYS[1])['ok'] ~= 'zset' then
  return {1, 0, limit, 0, 0}
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now))
local given = 0
if count > 0 then
  given = #redis.call('ZPOPMIN', KEYS[1], count) / 2
end
local live = redis.call('ZCARD', KEYS[1])
local reset = 0
local newest = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if newest[2] then
  reset = tonumber(newest[2]) - now
end
return {1, given, math.max(limit - live, 0), reset, 0}
";

/// Concurrency: the request that held the slot ended, or the filter gave up on its check.
///
/// KEYS[1]: the sorted set of `CONCURRENCY_LUA`.   KEYS[2]: the name's tombstone
/// (`store::released_key`).   ARGV[1]: the slot's name.   ARGV[2]: lease_us.
/// Returns 1 if the slot was live and is free now, 0 if it was not there or had expired (it is
/// removed all the same). A slot that was not there at all may still be asked for by a check
/// that comes late: its tombstone is set for a lease, and `CONCURRENCY_LUA` refuses that name
/// meanwhile. State of another type is left alone.
pub const SLOT_RELEASE_LUA: &str = r"
local kind = redis.call('TYPE', KEYS[1])['ok']
local score = nil
if kind == 'zset' then
  score = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
end
if score == nil then
  local ttl_ms = math.max(math.ceil(tonumber(ARGV[2]) / 1000), 1)
  redis.call('SET', KEYS[2], '1', 'PX', string.format('%d', ttl_ms))
  return 0
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
redis.call('ZREM', KEYS[1], ARGV[1])
if score > now then
  return 1
end
return 0
";

/// Concurrency: the request that holds the slot lives on; its lease starts again.
///
/// KEYS[1]: the sorted set of `CONCURRENCY_LUA`.
/// ARGV[1]: lease_us.   ARGV[2]: the slot's name.
/// Returns 1 if the slot was live and is now live until now + lease, else 0.
///
/// Only a live slot is renewed (`ZADD XX`): one that expired, was released or never taken is
/// left so, and its request runs on without one. A renewal that comes after its release (the
/// filter's settle calls run side by side) thus never takes a slot back. The key's TTL covers
/// the newest expiry plus 1 s.
pub const SLOT_RENEW_LUA: &str = r"
local lease = tonumber(ARGV[1])
local name = ARGV[2]
if redis.call('TYPE', KEYS[1])['ok'] ~= 'zset' then
  return 0
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local score = tonumber(redis.call('ZSCORE', KEYS[1], name))
if score == nil or score <= now then
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', string.format('%d', now + lease), name)
local newest = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local ttl_ms = math.ceil((tonumber(newest[2]) - now) / 1000) + 1000
redis.call('PEXPIRE', KEYS[1], string.format('%d', ttl_ms))
return 1
";

/// Concurrency: the slots nobody renewed in time (`slot_watch`).
///
/// KEYS[1]: the sorted set of `CONCURRENCY_LUA`.   ARGV[1]: stale_within_us.
/// Returns how many live named slots (a filter's names: 16 hex digits, never `<now>-<n>`) have
/// a lease that ends within ARGV[1] of now. Writes nothing.
pub const UNRENEWED_LUA: &str = r"
if redis.call('TYPE', KEYS[1])['ok'] ~= 'zset' then
  return 0
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local until_ = string.format('%d', now + tonumber(ARGV[1]))
local stale = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. string.format('%d', now), until_)
local n = 0
for _, name in ipairs(stale) do
  if not string.find(name, '-', 1, true) then
    n = n + 1
  end
end
return n
";

/// The start of every script a charge or refund runs (the metering algorithms' check scripts,
/// which charge, and the refunds below; `Scripts::new`): a settlement with an id is applied at
/// most once. Without KEYS[2] (a check, a settlement without an id) it does nothing.
///
/// KEYS[2]: the id's key (`store::settled_id_key`), in KEYS[1]'s Cluster slot.
/// ARGV[#ARGV], the last: how long to remember the id, in ms (`store::SETTLED_TTL_MS`).
/// Returns -1, writing nothing, if the id is remembered (it was applied); otherwise remembers it
/// and the script runs on. In the same script as what it applies, so a settlement that comes
/// again while the first is applied waits for it, and finds its id.
pub const SETTLE_ONCE_LUA: &str = r"
if KEYS[2] and not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[#ARGV]) then
  return -1
end
";

// The refunds below give back what a response did not use of its reservation, taken `age_us`
// ago (when = Redis TIME - age), as far as the state still counts it: the filter's
// `Algorithm::refund`. Each returns the whole tokens given back and writes nothing when it
// gives nothing back; a write keeps the TTL rule of the algorithm's check script.

/// Token bucket refund: the TAT moves back by tokens × interval, never below now (a bucket
/// that refilled meanwhile is full: what it already earned back is not given twice).
///
/// KEYS[1]: the TAT of `TOKEN_BUCKET_LUA`.
/// ARGV[1]: interval_us.   ARGV[2]: tokens (at most `store::Algorithm::refundable`).
/// Returns the whole tokens given back (a TAT moved by part of a token is written, as the
/// filter does, and returns 0 more).
pub const TOKEN_BUCKET_REFUND_LUA: &str = r"
local interval = tonumber(ARGV[1])
local tokens = tonumber(ARGV[2])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local before = tonumber(redis.pcall('GET', KEYS[1]))
if before == nil or before <= now then
  return 0
end
local tat = math.max(before - tokens * interval, now)
local ttl_ms = math.ceil((tat - now) / 1000) + 1000
redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', string.format('%d', ttl_ms))
return math.floor((before - tat) / interval)
";

/// Fixed window refund: only while the window that counted the tokens is the current one.
///
/// KEYS[1]: `<window index>:<count>` of `FIXED_WINDOW_LUA`.
/// ARGV[1]: window_us.   ARGV[2]: tokens.   ARGV[3]: age_us.
/// Returns min(tokens, count) if the tokens were taken in this window, else 0.
pub const FIXED_WINDOW_REFUND_LUA: &str = r"
local window = tonumber(ARGV[1])
local tokens = tonumber(ARGV[2])
local age = tonumber(ARGV[3])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local start = now - math.fmod(now, window)
local index = start / window
local taken_at = math.max(now - age, 0)
if (taken_at - math.fmod(taken_at, window)) / window ~= index then
  return 0
end
local stored = redis.pcall('GET', KEYS[1])
if type(stored) ~= 'string' then
  return 0
end
local stored_index, count = string.match(stored, '^(%d+):(%d+)$')
if tonumber(stored_index) ~= index then
  return 0
end
local back = math.min(tokens, tonumber(count))
if back == 0 then
  return 0
end
local ttl_ms = math.ceil((start + window - now) / 1000) + 1000
local state = string.format('%d:%d', index, tonumber(count) - back)
redis.call('SET', KEYS[1], state, 'PX', string.format('%d', ttl_ms))
return back
";

/// Sliding window refund: from the count of the window that took the tokens, the current or
/// the previous one, while it still counts.
///
/// KEYS[1]: `<window index>:<current>:<previous>` of `SLIDING_WINDOW_LUA`.
/// ARGV[1]: window_us.   ARGV[2]: tokens.   ARGV[3]: age_us.
/// Returns min(tokens, that count), or 0 if the tokens were taken two windows ago or more.
pub const SLIDING_WINDOW_REFUND_LUA: &str = r"
local window = tonumber(ARGV[1])
local tokens = tonumber(ARGV[2])
local age = tonumber(ARGV[3])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local elapsed = math.fmod(now, window)
local index = (now - elapsed) / window
local taken_at = math.max(now - age, 0)
local taken = (taken_at - math.fmod(taken_at, window)) / window
local current, previous = 0, 0
local stored = redis.pcall('GET', KEYS[1])
if type(stored) == 'string' then
  local i, c, p = string.match(stored, '^(%d+):(%d+):(%d+)$')
  i = tonumber(i)
  if i == index then
    current, previous = tonumber(c), tonumber(p)
  elseif i ~= nil and i + 1 == index then
    previous = tonumber(c)
  end
end
local back = 0
if taken == index then
  back = math.min(tokens, current)
  current = current - back
elseif taken + 1 == index then
  back = math.min(tokens, previous)
  previous = previous - back
end
if back == 0 then
  return 0
end
local ttl_ms = math.ceil((2 * window - elapsed) / 1000) + 1000
local state = string.format('%d:%d:%d', index, current, previous)
redis.call('SET', KEYS[1], state, 'PX', string.format('%d', ttl_ms))
return back
";

/// Bound on every Redis operation, retries and reconnects included.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
/// Bound on a `PING`: short, so that readiness follows Redis within a second (`health`).
pub const PING_TIMEOUT: Duration = Duration::from_millis(500);
/// Bound on opening a Cluster connection (every seed node may be tried).
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

/// How the store reaches Redis. Neither kind waits for Redis to exist: a single node's manager
/// connects on first use and reconnects by itself after every loss; a Cluster connection is
/// opened by the first `ping` that reaches a seed node (the readiness probe calls it every
/// 250 ms), and then reconnects to each node by itself.
enum Link {
    Single(ConnectionManager),
    Cluster {
        // Boxed: a client is large, and there is one per process.
        client: Box<ClusterClient>,
        connection: OnceCell<ClusterConnection>,
    },
}

impl Link {
    /// Only checks the configuration (URLs): no I/O.
    fn new(target: &RedisTarget) -> RedisResult<Link> {
        match target {
            RedisTarget::Single(url) => {
                let info = url.as_str().into_connection_info()?;
                let client = redis::Client::open(info.set_tcp_settings(no_delay()))?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(COMMAND_TIMEOUT))
                    .set_response_timeout(Some(COMMAND_TIMEOUT))
                    // One connection attempt per (re)connection, no back-off: a check that meets
                    // a dead or refused connection starts a reconnection and waits for it
                    // (`Retry`), so while Redis is down each check fails after one refused
                    // attempt instead of waiting out a back-off between two.
                    .set_number_of_retries(0);
                let manager = ConnectionManager::new_lazy_with_config(client, config)?;
                Ok(Link::Single(manager))
            }
            RedisTarget::Cluster(urls) => {
                let client = ClusterClientBuilder::new(urls.iter().map(String::as_str))
                    .connection_timeout(COMMAND_TIMEOUT)
                    .response_timeout(COMMAND_TIMEOUT)
                    .retries(2)
                    .tcp_settings(no_delay())
                    .build()?;
                let connection = OnceCell::new();
                let client = Box::new(client);
                Ok(Link::Cluster { client, connection })
            }
        }
    }

    /// The connection as it is; never waits for a Cluster to be reached.
    fn connection(&self) -> RedisResult<Connection> {
        match self {
            Link::Single(manager) => Ok(Connection::Single(manager.clone())),
            Link::Cluster { connection, .. } => match connection.get() {
                Some(cluster) => Ok(Connection::Cluster(cluster.clone())),
                None => Err(RedisError::from((
                    ErrorKind::ClusterConnectionNotFound,
                    "not connected to the Redis Cluster yet",
                ))),
            },
        }
    }

    /// The connection, opening the Cluster's first if it has none.
    async fn connect(&self) -> RedisResult<Connection> {
        if let Link::Cluster { client, connection } = self {
            connection
                .get_or_try_init(|| client.get_async_connection())
                .await?;
        }
        self.connection()
    }
}

/// `TCP_NODELAY`: a batch's request (10 KB and more at 100 checks) is sent whole at once, not
/// its last segment held back until Redis acknowledges the first (which Redis delays, 40 ms,
/// waiting for the rest of the request to answer it).
fn no_delay() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// One script per algorithm, and one per way of settling, each known to Redis by its SHA1.
struct Scripts {
    token_bucket: Script,
    fixed_window: Script,
    sliding_window: Script,
    sliding_log: Script,
    leaky_bucket: Script,
    concurrency: Script,
    give_back: Script,
    release: Script,
    renew: Script,
    unrenewed: Script,
    token_bucket_refund: Script,
    fixed_window_refund: Script,
    sliding_window_refund: Script,
    calendar_window: Script,
    calendar_window_refund: Script,
    /// `lua::CHECKS_LUA`: a batch of checks.
    checks: Script,
    /// `quota::QUOTA_REPORT_LUA`: an RLQS report.
    quota_report: Script,
    /// `quota::QUOTA_HOLD_LUA`: the share an Envoy was sent, or its stream's end.
    quota_hold: Script,
    /// `quota::REPLICA_BEAT_LUA`: an RLQS replica's heartbeat.
    replica_beat: Script,
}

impl Scripts {
    fn new() -> Scripts {
        let once = |script: &str| Script::new(&format!("{SETTLE_ONCE_LUA}{script}"));
        Scripts {
            token_bucket: once(TOKEN_BUCKET_LUA),
            fixed_window: once(FIXED_WINDOW_LUA),
            sliding_window: once(SLIDING_WINDOW_LUA),
            sliding_log: Script::new(SLIDING_LOG_LUA),
            leaky_bucket: Script::new(LEAKY_BUCKET_LUA),
            concurrency: Script::new(CONCURRENCY_LUA),
            give_back: Script::new(CONCURRENCY_GIVE_BACK_LUA),
            release: Script::new(SLOT_RELEASE_LUA),
            renew: Script::new(SLOT_RENEW_LUA),
            unrenewed: Script::new(UNRENEWED_LUA),
            token_bucket_refund: once(TOKEN_BUCKET_REFUND_LUA),
            fixed_window_refund: once(FIXED_WINDOW_REFUND_LUA),
            sliding_window_refund: once(SLIDING_WINDOW_REFUND_LUA),
            calendar_window: once(calendar::CALENDAR_WINDOW_LUA),
            calendar_window_refund: once(calendar::CALENDAR_WINDOW_REFUND_LUA),
            checks: Script::new(lua::CHECKS_LUA),
            quota_report: Script::new(quota::QUOTA_REPORT_LUA),
            quota_hold: Script::new(quota::QUOTA_HOLD_LUA),
            replica_beat: Script::new(quota::REPLICA_BEAT_LUA),
        }
    }

    fn all(&self) -> [&Script; 19] {
        [
            &self.token_bucket,
            &self.fixed_window,
            &self.sliding_window,
            &self.sliding_log,
            &self.leaky_bucket,
            &self.concurrency,
            &self.give_back,
            &self.release,
            &self.renew,
            &self.unrenewed,
            &self.token_bucket_refund,
            &self.fixed_window_refund,
            &self.sliding_window_refund,
            &self.calendar_window,
            &self.calendar_window_refund,
            &self.checks,
            &self.quota_report,
            &self.quota_hold,
            &self.replica_beat,
        ]
    }

    /// The script that decides `check`, and its ARGV (see each script's documentation).
    fn check(&self, check: &Check) -> Eval<'_> {
        let (cost, take, debt) = (check.cost, check.take, check.debt);
        let numbers = |script, args: &[u64]| Eval::new(script, state_key(check), args);
        match check.algorithm {
            Algorithm::TokenBucket { interval_us, burst } => {
                numbers(&self.token_bucket, &[interval_us, burst, cost, take, debt])
            }
            Algorithm::FixedWindow { limit, window_us } => {
                numbers(&self.fixed_window, &[window_us, limit, cost, take, debt])
            }
            Algorithm::CalendarWindow { limit, calendar } => {
                let [b1, b2, b3, b4] = calendar::boundaries(calendar);
                let args = [limit, cost, take, debt, b1, b2, b3, b4];
                numbers(&self.calendar_window, &args)
            }
            Algorithm::SlidingWindow { limit, window_us } => {
                numbers(&self.sliding_window, &[window_us, limit, cost, take, debt])
            }
            Algorithm::SlidingLog { limit, window_us } => {
                numbers(&self.sliding_log, &[window_us, limit, cost, take, debt])
            }
            Algorithm::LeakyBucket {
                interval_us,
                max_delay_us,
            } => numbers(&self.leaky_bucket, &[interval_us, max_delay_us, cost]),
            Algorithm::Concurrency { limit, lease_us } => match &check.slots {
                Slots::GiveBack => numbers(&self.give_back, &[limit, take]),
                Slots::Anonymous => {
                    numbers(&self.concurrency, &[limit, lease_us, cost, take]).with(String::new())
                }
                Slots::Named(name) => {
                    let eval = numbers(&self.concurrency, &[limit, lease_us, cost, take]);
                    let tombstone = released_key(check.namespace, &check.key, name);
                    eval.with(name.clone()).and_key(tombstone)
                }
            },
        }
    }

    /// The script that applies `settlement`, and its ARGV, once if it has an id; `None` for an
    /// operation the algorithm has none for (`settle::parse` refuses those).
    fn settle(&self, settlement: &Settlement) -> Option<Eval<'_>> {
        let key = settled_key(settlement);
        let eval = match (&settlement.op, settlement.algorithm) {
            (&SettleOp::Charge { tokens, max_debt }, _) => {
                let charge = Check {
                    namespace: settlement.namespace,
                    key: settlement.key.clone(),
                    algorithm: settlement.algorithm,
                    cost: tokens,
                    take: tokens,
                    debt: max_debt,
                    slots: Slots::Anonymous,
                    state_of: None,
                };
                self.check(&charge)
            }
            (&SettleOp::Refund { tokens, .. }, Algorithm::TokenBucket { interval_us, .. }) => {
                Eval::new(&self.token_bucket_refund, key, &[interval_us, tokens])
            }
            (&SettleOp::Refund { tokens, age_us }, Algorithm::FixedWindow { window_us, .. }) => {
                Eval::new(&self.fixed_window_refund, key, &[window_us, tokens, age_us])
            }
            (&SettleOp::Refund { tokens, age_us }, Algorithm::CalendarWindow { calendar, .. }) => {
                let [b1, b2, b3, b4] = calendar::boundaries(calendar);
                let args = [tokens, age_us, b1, b2, b3, b4];
                Eval::new(&self.calendar_window_refund, key, &args)
            }
            (&SettleOp::Refund { tokens, age_us }, Algorithm::SlidingWindow { window_us, .. }) => {
                Eval::new(
                    &self.sliding_window_refund,
                    key,
                    &[window_us, tokens, age_us],
                )
            }
            (SettleOp::Release { slot }, Algorithm::Concurrency { lease_us, .. }) => {
                let tombstone = released_key(settlement.namespace, &settlement.key, slot);
                let eval = Eval::new(&self.release, key, &[]).with(slot.clone());
                eval.with(lease_us.to_string()).and_key(tombstone)
            }
            (SettleOp::Renew { slot }, Algorithm::Concurrency { lease_us, .. }) => {
                Eval::new(&self.renew, key, &[lease_us]).with(slot.clone())
            }
            _ => return None,
        };
        Some(match settled_id_key(settlement) {
            Some(id_key) => eval.once(id_key),
            None => eval,
        })
    }
}

/// One script to run, with its KEYS and ARGV.
struct Eval<'s> {
    script: &'s Script,
    /// The key the script runs on first (in a Cluster, every key is in its slot), then a
    /// settlement's id key (`SETTLE_ONCE_LUA`'s KEYS[2]) or a slot's tombstone.
    keys: Vec<String>,
    args: Vec<Vec<u8>>,
}

impl<'s> Eval<'s> {
    fn new(script: &'s Script, key: String, numbers: &[u64]) -> Eval<'s> {
        let args = numbers.iter().map(|n| n.to_string().into_bytes()).collect();
        Eval {
            script,
            keys: vec![key],
            args,
        }
    }

    /// `CHECKS_LUA` of a batch: its keys, and its records in one argument.
    fn batch(script: &'s Script, keys: Vec<String>, records: Vec<u8>) -> Eval<'s> {
        Eval {
            script,
            keys,
            args: vec![records],
        }
    }

    /// At most once: with the id's key and, last, how long to remember it.
    fn once(mut self, id_key: String) -> Eval<'s> {
        self.keys.push(id_key);
        self.args.push(SETTLED_TTL_MS.to_string().into_bytes());
        self
    }

    /// KEYS, in order.
    fn keys(&self) -> impl Iterator<Item = &String> {
        self.keys.iter()
    }

    /// With a second key (KEYS[2]) in the first's Cluster slot: a slot's tombstone.
    fn and_key(mut self, key: String) -> Eval<'s> {
        self.keys.push(key);
        self
    }

    /// With one more argument after the numbers.
    fn with(mut self, text: String) -> Eval<'s> {
        self.args.push(text.into_bytes());
        self
    }
}

/// The store: its checks go through `batch::Queue`, which decides the checks that are ready
/// together in one call (`lua::CHECKS_LUA`).
pub struct RedisStore {
    core: Arc<Core>,
    queue: batch::Queue,
}

/// The link to Redis and the scripts, shared with `batch`'s task.
struct Core {
    link: Link,
    scripts: Scripts,
    /// Whether the last ping was answered. The first answer after none (at start, or once
    /// Redis is back) loads the scripts, so that checks do not meet NOSCRIPT first.
    answered: AtomicBool,
}

impl RedisStore {
    /// A store for `target`, which it reaches only when used: only a malformed URL fails here.
    pub fn new(target: &RedisTarget) -> Result<RedisStore, StoreError> {
        let link = Link::new(target).map_err(|error| failure(&error))?;
        let scripts = Scripts::new();
        let answered = AtomicBool::new(false);
        let core = Arc::new(Core {
            link,
            scripts,
            answered,
        });
        Ok(RedisStore {
            core,
            queue: batch::Queue::new(),
        })
    }
}

impl Core {
    /// SCRIPT LOAD of every script; in a Cluster the client sends each to every node.
    async fn load_scripts(&self) -> RedisResult<()> {
        for script in self.scripts.all() {
            match self.link.connection()? {
                Connection::Single(mut con) => script.load_async(&mut con).await?,
                Connection::Cluster(mut con) => script.load_async(&mut con).await?,
            };
        }
        Ok(())
    }

    async fn apply(&self, settlements: &[Settlement]) -> RedisResult<Vec<Settled>> {
        let evals = (settlements.iter())
            .map(|settlement| self.scripts.settle(settlement))
            .collect::<Option<Vec<Eval>>>()
            .ok_or_else(|| unexpected_reply("a settlement no script applies".into()))?;
        let replies = self.run(&evals, Order::AsGiven).await?;
        (settlements.iter().zip(replies))
            .map(|(settlement, reply)| settled_from_reply(settlement, reply))
            .collect()
    }

    /// Runs every eval, one reply each, in order.
    async fn run(&self, evals: &[Eval<'_>], order: Order) -> RedisResult<Vec<Value>> {
        let replies = match self.link.connection()? {
            Connection::Single(con) => self.eval_pipelined(&con, evals).await?,
            Connection::Cluster(con) => self.eval_on_cluster(&con, evals, order).await?,
        };
        if replies.len() != evals.len() {
            let detail = format!("{} replies for {} scripts", replies.len(), evals.len());
            return Err(unexpected_reply(detail));
        }
        Ok(replies)
    }

    /// One node: all evals in one pipeline, which Redis runs in order. Evals that met NOSCRIPT
    /// (the script cache was flushed, or Redis restarted) are run again, once, after loading
    /// the scripts. One round trip of the request that lost its connection is sent again
    /// (`Retry`).
    async fn eval_pipelined(
        &self,
        con: &ConnectionManager,
        evals: &[Eval<'_>],
    ) -> RedisResult<Vec<Value>> {
        let mut retry = Retry::once();
        let mut replies = query(con, &pipeline(evals.iter()), &mut retry).await?;
        let missing: Vec<usize> = (replies.iter().enumerate())
            .filter(|(_, reply)| is_noscript(reply))
            .map(|(i, _)| i)
            .collect();
        if missing.is_empty() {
            return Ok(replies);
        }
        retry.run(|| self.load_scripts()).await?;
        let again = missing.iter().filter_map(|&i| evals.get(i));
        let rerun = query(con, &pipeline(again), &mut retry).await?;
        for (i, reply) in missing.into_iter().zip(rerun) {
            if let Some(slot) = replies.get_mut(i) {
                *slot = reply;
            }
        }
        Ok(replies)
    }

    /// Cluster: checks all in flight at once. The client multiplexes them over one connection
    /// per node, so each node gets its checks in one round trip; it follows MOVED/ASK per command,
    /// retries after a lost connection by itself (up to `retries` times, see `open`), and
    /// `invoke_async` reloads the script on NOSCRIPT. (A redis-rs pipeline must stay within one
    /// slot, and checks of one request are in different slots.) Settlements one after another:
    /// a renewal and the release that follows it must reach their key in that order, and
    /// nothing waits for them.
    async fn eval_on_cluster(
        &self,
        con: &ClusterConnection,
        evals: &[Eval<'_>],
        order: Order,
    ) -> RedisResult<Vec<Value>> {
        if order == Order::Any {
            return try_join_all(evals.iter().map(|eval| invoke(con, eval))).await;
        }
        let mut replies = Vec::with_capacity(evals.len());
        for eval in evals {
            replies.push(invoke(con, eval).await?);
        }
        Ok(replies)
    }

    /// On a single node, a ping that meets the failure of the last reconnection (Redis was down)
    /// is sent again on the new one (`Retry`): readiness comes back at the first probe after
    /// Redis does, not the second.
    async fn ping(connection: Connection) -> RedisResult<()> {
        let ping = redis::cmd("PING");
        match connection {
            Connection::Single(con) => {
                let attempt = || {
                    let (mut con, ping) = (con.clone(), &ping);
                    async move { ping.exec_async(&mut con).await }
                };
                Retry::once().run(attempt).await
            }
            Connection::Cluster(mut con) => ping.exec_async(&mut con).await,
        }
    }
}

impl Core {
    /// `quota::QUOTA_REPORT_LUA` of `report` (through `run`: NOSCRIPT is answered by loading
    /// the scripts, a lost connection by one retry).
    async fn report_quota(&self, report: &QuotaReport) -> RedisResult<Vec<Demand>> {
        let numbers = [
            report.requests.min(quota::MAX_REQUESTS),
            report.period_ms,
            report.ttl_ms,
            quota::MAX_ENVOYS,
            quota::FIRST_REPORT_MS,
            quota::MIN_ELAPSED_MS,
            quota::MAX_DEMAND,
        ];
        let mut eval = Eval::new(&self.scripts.quota_report, report.key.clone(), &[]);
        eval = eval.with(report.envoy.clone());
        for number in numbers {
            eval = eval.with(number.to_string());
        }
        eval = eval.with(report.dead.join(" "));
        let reply = self.run(&[eval], Order::AsGiven).await?;
        let fields = match reply.into_iter().next() {
            Some(Value::Array(fields)) => fields,
            Some(Value::ServerError(error)) => return Err(error.into()),
            other => return Err(unexpected_reply(format!("{other:?}"))),
        };
        let triples = fields.chunks_exact(3).map(|entry| {
            let (envoy, demand, held) = (
                entry.first().and_then(text),
                entry.get(1).and_then(text),
                entry.get(2).and_then(text),
            );
            let demand = demand.and_then(|d| d.parse().ok());
            let held = held.and_then(|h| h.parse().ok());
            match (envoy, demand, held) {
                (Some(envoy), Some(demand), Some(held)) => Ok(Demand {
                    envoy,
                    demand,
                    held,
                }),
                _ => Err(unexpected_reply(format!("{entry:?}"))),
            }
        });
        triples.collect()
    }

    /// `quota::QUOTA_HOLD_LUA` for `envoy` of `key`: `held`, or `-` to forget it.
    async fn hold_quota(&self, key: &str, envoy: &str, held: Option<u64>) -> RedisResult<bool> {
        let held = held.map_or_else(|| "-".to_owned(), |h| h.to_string());
        let eval = Eval::new(&self.scripts.quota_hold, key.to_owned(), &[])
            .with(envoy.to_owned())
            .with(held);
        let reply = self.run(&[eval], Order::AsGiven).await?;
        match reply.into_iter().next() {
            Some(Value::Int(found)) => Ok(found == 1),
            Some(Value::ServerError(error)) => Err(error.into()),
            other => Err(unexpected_reply(format!("{other:?}"))),
        }
    }

    async fn beat_replica(&self, replica: &str) -> RedisResult<Vec<String>> {
        let eval = Eval::new(
            &self.scripts.replica_beat,
            quota::REPLICAS_KEY.to_owned(),
            &[],
        )
        .with(replica.to_owned())
        .with(quota::DEAD_AFTER_MS.to_string())
        .with(quota::FORGET_AFTER_MS.to_string());
        let reply = self.run(&[eval], Order::AsGiven).await?;
        match reply.into_iter().next() {
            Some(Value::Array(dead)) => Ok(dead.iter().filter_map(text).collect()),
            Some(Value::ServerError(error)) => Err(error.into()),
            other => Err(unexpected_reply(format!("{other:?}"))),
        }
    }
}

/// A bulk string's text (lossy), else nothing.
fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        _ => None,
    }
}

impl RedisStore {
    async fn count_unrenewed(&self, keys: &[Watched]) -> RedisResult<Vec<u64>> {
        let evals: Vec<Eval> = (keys.iter())
            .map(|w| {
                Eval::new(
                    &self.core.scripts.unrenewed,
                    w.key.clone(),
                    &[w.stale_within_us],
                )
            })
            .collect();
        let replies = self.core.run(&evals, Order::Any).await?;
        (replies.into_iter())
            .map(|reply| match reply {
                Value::Int(n) => Ok(u64::try_from(n).unwrap_or(0)),
                other => Err(unexpected_reply(format!("{other:?}"))),
            })
            .collect()
    }
}

impl Store for RedisStore {
    async fn check(&self, checks: &[Check]) -> Result<Vec<Decision>, StoreError> {
        bounded(COMMAND_TIMEOUT, self.queue.check(&self.core, checks)).await
    }

    async fn unrenewed(&self, keys: &[Watched]) -> Result<Vec<u64>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        bounded(COMMAND_TIMEOUT, async { self.count_unrenewed(keys).await }).await
    }

    async fn settle(&self, settlements: &[Settlement]) -> Result<Vec<Settled>, StoreError> {
        bounded(COMMAND_TIMEOUT, self.core.apply(settlements)).await
    }

    /// Opening a Cluster connection has a bound of its own: a ping's would cut it short every
    /// time, and the Cluster would never be reached over a slow network.
    async fn ping(&self) -> Result<(), StoreError> {
        let answer = async {
            let connection = bounded(CONNECT_TIMEOUT, self.core.link.connect()).await?;
            bounded(PING_TIMEOUT, Core::ping(connection)).await?;
            if !self.core.answered.load(Relaxed) {
                bounded(COMMAND_TIMEOUT, self.core.load_scripts()).await?;
            }
            Ok(())
        }
        .await;
        self.core.answered.store(answer.is_ok(), Relaxed);
        answer
    }

    async fn words(&self, state_key: &str) -> Result<Option<Vec<u64>>, StoreError> {
        bounded(COMMAND_TIMEOUT, self.core.words(state_key)).await
    }

    async fn reset(&self, state_key: &str) -> Result<bool, StoreError> {
        bounded(COMMAND_TIMEOUT, self.core.delete(state_key)).await
    }

    async fn put_override(&self, name: &str, value: &str, max: u64) -> Result<bool, StoreError> {
        bounded(COMMAND_TIMEOUT, self.core.put_override(name, value, max)).await
    }

    async fn delete_override(&self, name: &str) -> Result<bool, StoreError> {
        bounded(COMMAND_TIMEOUT, self.core.delete_override(name)).await
    }

    /// Page by page, each page within the command's bound. A field changed during the scan may
    /// come twice (the last read wins) or not at all; the version, read before, changes with it,
    /// so the next ask reads again.
    async fn overrides(&self) -> Result<Vec<(String, String)>, StoreError> {
        let mut kept = HashMap::new();
        let mut cursor = 0;
        loop {
            let (next, page) = bounded(COMMAND_TIMEOUT, self.core.overrides_page(cursor)).await?;
            kept.extend(page);
            if next == 0 {
                return Ok(kept.into_iter().collect());
            }
            cursor = next;
        }
    }

    async fn overrides_version(&self) -> Result<u64, StoreError> {
        bounded(COMMAND_TIMEOUT, self.core.overrides_version()).await
    }

    async fn report_quota(&self, report: &QuotaReport) -> Result<Vec<Demand>, StoreError> {
        bounded(COMMAND_TIMEOUT, self.core.report_quota(report)).await
    }

    async fn hold_quota(
        &self,
        key: &str,
        envoy: &str,
        held: Option<u64>,
    ) -> Result<bool, StoreError> {
        bounded(COMMAND_TIMEOUT, self.core.hold_quota(key, envoy, held)).await
    }

    async fn beat_replica(&self, replica: &str) -> Result<Vec<String>, StoreError> {
        bounded(COMMAND_TIMEOUT, self.core.beat_replica(replica)).await
    }
}

/// A request's one retry of a round trip to Redis that lost its connection.
///
/// The connection manager notices a dead connection (Redis restarted, the network reset it)
/// only when a command fails on it, and reconnects for the next command: without a retry, the
/// first check after a Redis restart answers 503 and the filter's breaker waits a full back-off
/// before it calls again. A refused connection is retried too: it can be a reconnection that
/// failed while Redis was down, met by the first check after Redis is back.
///
/// The scripts charge tokens, so a retry is not free. A refused connection sent nothing, but a
/// connection that died may have taken the reply with it after Redis ran the scripts: the retry
/// then charges that request twice. That is the worst case, once per request: tokens taken
/// twice (an under-admission), never tokens given back (an over-admission). A settlement's id
/// is found the second time (`SETTLE_ONCE_LUA`): only one without an id, from an older filter,
/// is applied twice, a refund then giving back twice. Anything Redis
/// answered (a script error, OOM, ...) and timeouts (the script may still run) are not retried.
/// Both attempts together stay within `COMMAND_TIMEOUT` (`Store::check`).
struct Retry {
    left: bool,
}

impl Retry {
    fn once() -> Retry {
        Retry { left: true }
    }

    /// Runs `attempt`, and once more if it lost its connection and the retry is still left.
    async fn run<T, F>(&mut self, mut attempt: impl FnMut() -> F) -> RedisResult<T>
    where
        F: std::future::Future<Output = RedisResult<T>>,
    {
        match attempt().await {
            Err(error) if self.left && connection_lost(&error) => {
                self.left = false;
                attempt().await
            }
            result => result,
        }
    }
}

/// Broken pipe, reset, end of file, refused: redis-rs's "connection dropped" kinds (which include
/// refusal). Not a timeout.
fn connection_lost(error: &RedisError) -> bool {
    error.is_connection_dropped()
}

/// Sends `pipe` and reads its replies, through `retry`. The manager is a handle to a shared
/// connection: each attempt takes its own clone, and the second gets the reconnected one.
async fn query(
    con: &ConnectionManager,
    pipe: &Pipeline,
    retry: &mut Retry,
) -> RedisResult<Vec<Value>> {
    retry
        .run(|| {
            let mut con = con.clone();
            async move { pipe.query_async::<Vec<Value>>(&mut con).await }
        })
        .await
}

/// EVALSHA (EVAL after NOSCRIPT) of one eval on a Cluster.
async fn invoke(con: &ClusterConnection, eval: &Eval<'_>) -> RedisResult<Value> {
    let mut con = con.clone();
    let mut invocation = eval.script.prepare_invoke();
    for key in eval.keys() {
        invocation.key(key);
    }
    invocation.arg(&eval.args[..]);
    invocation.invoke_async::<Value>(&mut con).await
}

/// Whether evals may run in any order (checks: each on its own key's state, every one
/// answered) or must run as given (settlements: several may settle one key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    Any,
    AsGiven,
}

/// EVALSHA per eval; errors stay in the replies so NOSCRIPT can be told from the rest.
fn pipeline<'a, 's: 'a>(evals: impl Iterator<Item = &'a Eval<'s>>) -> Pipeline {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for eval in evals {
        let command = pipe.cmd("EVALSHA").arg(eval.script.get_hash());
        command.arg(eval.keys().count());
        for key in eval.keys() {
            command.arg(key);
        }
        command.arg(&eval.args[..]);
    }
    pipe
}

/// What a settlement did: -1 if its id had been applied (`SETTLE_ONCE_LUA`); else what it
/// changed, a charge's `granted` (the tokens charged), the number a refund, release or renewal
/// script returns.
fn settled_from_reply(settlement: &Settlement, reply: Value) -> RedisResult<Settled> {
    match reply {
        Value::ServerError(error) => return Err(error.into()),
        Value::Int(-1) if settlement.id.is_some() => return Ok(Settled::Duplicate),
        _ => {}
    }
    if let SettleOp::Charge { .. } = settlement.op {
        let charged = decision_from_reply(&settlement.algorithm, reply)?.granted;
        return Ok(Settled::Applied(charged));
    }
    let n: i64 = redis::from_redis_value(reply)?;
    Ok(Settled::Applied(u64::try_from(n).unwrap_or(0)))
}

fn is_noscript(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(error) if error.code() == "NOSCRIPT")
}

/// `{allowed, granted, remaining, reset_us, retry_after_us}` from a script, plus `delay_us` from
/// the leaky bucket's; or the error Redis answered instead.
fn decision_from_reply(algorithm: &Algorithm, reply: Value) -> RedisResult<Decision> {
    if let Value::ServerError(error) = reply {
        return Err(error.into());
    }
    let numbers: Vec<i64> = redis::from_redis_value(reply)?;
    let unsigned = |n: i64| u64::try_from(n).unwrap_or(0);
    let leaky = matches!(algorithm, Algorithm::LeakyBucket { .. });
    let (fields, delay_us) = match (numbers.as_slice(), leaky) {
        (&[a, g, r, reset, retry], false) => ([a, g, r, reset, retry], None),
        (&[a, g, r, reset, retry, delay], true) => ([a, g, r, reset, retry], Some(delay)),
        (other, _) => {
            let name = algorithm.name();
            return Err(unexpected_reply(format!(
                "{name} script returned {other:?}"
            )));
        }
    };
    let [allowed, granted, remaining, reset_us, retry_after_us] = fields;
    Ok(Decision {
        allowed: allowed == 1,
        granted: unsigned(granted),
        remaining: unsigned(remaining),
        reset_us: unsigned(reset_us),
        retry_after_us: unsigned(retry_after_us),
        delay_us: delay_us.map(unsigned),
    })
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
        Ok(Err(error)) => Err(failure(&error)),
        Err(_) => Err(StoreError {
            kind: FailureKind::Timeout,
            detail: format!("no answer from Redis within {limit:?}"),
        }),
    }
}

fn failure(error: &RedisError) -> StoreError {
    StoreError {
        kind: failure_kind(error),
        detail: error.to_string(),
    }
}

/// The few kinds an operator tells apart (`FailureKind`), from redis-rs's many.
fn failure_kind(error: &RedisError) -> FailureKind {
    if error.is_timeout() {
        FailureKind::Timeout
    } else if error.is_io_error()
        || error.is_connection_dropped()
        || error.kind() == ErrorKind::ClusterConnectionNotFound
    {
        FailureKind::Connection
    } else if matches!(error.kind(), ErrorKind::Server(_) | ErrorKind::Extension) {
        FailureKind::Server
    } else {
        FailureKind::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn io_error(kind: std::io::ErrorKind) -> RedisError {
        std::io::Error::from(kind).into()
    }

    #[test]
    fn only_a_dead_or_refused_connection_counts_as_lost() {
        use std::io::ErrorKind::{BrokenPipe, ConnectionRefused, ConnectionReset, TimedOut};
        for kind in [BrokenPipe, ConnectionReset, ConnectionRefused] {
            assert!(connection_lost(&io_error(kind)), "{kind:?}");
        }
        assert!(!connection_lost(&io_error(TimedOut)));
        assert!(!connection_lost(&unexpected_reply("a script error".into())));
        let noscript = ErrorKind::Server(ServerErrorKind::NoScript);
        assert!(!connection_lost(&RedisError::from((noscript, "NOSCRIPT"))));
    }

    /// Runs `retry` over an attempt that always fails with `error`; how many attempts ran.
    async fn attempts(retry: &mut Retry, error: &RedisError) -> usize {
        let mut calls = 0;
        let result: RedisResult<()> = retry
            .run(|| {
                calls += 1;
                let error = error.clone();
                async move { Err(error) }
            })
            .await;
        assert!(result.is_err());
        calls
    }

    #[tokio::test]
    async fn a_request_retries_once_and_only_after_a_lost_connection() {
        let lost = io_error(std::io::ErrorKind::BrokenPipe);
        let timeout = io_error(std::io::ErrorKind::TimedOut);
        assert_eq!(attempts(&mut Retry::once(), &timeout).await, 1);
        let mut retry = Retry::once();
        assert_eq!(attempts(&mut retry, &lost).await, 2);
        // Spent: a second round trip of the same request that loses its connection fails.
        assert_eq!(attempts(&mut retry, &lost).await, 1);
    }

    const BUCKET: Algorithm = Algorithm::TokenBucket {
        interval_us: 1,
        burst: 20,
    };
    const LEAKY: Algorithm = Algorithm::LeakyBucket {
        interval_us: 1,
        max_delay_us: 0,
    };

    fn reply(numbers: &[i64]) -> Value {
        Value::Array(numbers.iter().copied().map(Value::Int).collect())
    }

    #[test]
    fn a_script_reply_becomes_a_decision() {
        let decision = decision_from_reply(&BUCKET, reply(&[1, 3, 17, 600_000, 0])).unwrap();
        assert_eq!(
            decision,
            Decision {
                allowed: true,
                granted: 3,
                remaining: 17,
                reset_us: 600_000,
                retry_after_us: 0,
                delay_us: None,
            }
        );
        assert!(decision_from_reply(&BUCKET, reply(&[1])).is_err());
    }

    #[test]
    fn only_the_leaky_bucket_reply_carries_a_delay() {
        let leaky = decision_from_reply(&LEAKY, reply(&[1, 1, 2, 300, 0, 200])).unwrap();
        assert_eq!(leaky.delay_us, Some(200));
        assert!(decision_from_reply(&LEAKY, reply(&[1, 1, 2, 300, 0])).is_err());
        assert!(decision_from_reply(&BUCKET, reply(&[1, 1, 2, 300, 0, 200])).is_err());
    }
}
