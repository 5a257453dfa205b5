//! The Rate Limit Quota Service's ledger, as every store keeps it: per bucket (one key per
//! domain and bucket id, `quota_key`), per Envoy (a stream's id) its demand per budget period and
//! when it was measured, by the store's clock. A report enters one Envoy's demand and reads the
//! bucket's other live ones in one atomic step, so that any replica can hold any Envoy's stream;
//! a report older than the time to live is forgotten, and so is a bucket nobody reports. Beside
//! its demand, each Envoy's entry keeps the share it was last sent (`held`), so that a share is
//! taken only from budget the others do not hold. `QUOTA_REPORT_LUA` and `QUOTA_HOLD_LUA` are
//! Redis's ledger (one hash per bucket), `QuotaLedger` this process's.

use std::collections::{BTreeMap, HashMap};

use sluice::core::key::HashSecret;

use super::hashed_key_of;

/// One Envoy's report of one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaReport {
    /// The bucket's key (`quota_key`).
    pub key: String,
    /// The Envoy: a stream's id, unique across replicas.
    pub envoy: String,
    /// Requests (allowed and denied) since this Envoy's last report of the bucket; at most
    /// `MAX_REQUESTS`.
    pub requests: u64,
    /// The budget's period, in which demand is counted.
    pub period_ms: u64,
    /// How long a report counts; the bucket's key goes once none does.
    pub ttl_ms: u64,
    /// Replicas found dead (`REPLICA_BEAT_LUA`): their streams' entries are forgotten at once,
    /// as if their time to live had run out, so that an Envoy that moved to a live replica is
    /// not kept from the share its old stream held.
    pub dead: std::sync::Arc<[String]>,
}

/// One live Envoy's demand of a bucket: requests per budget period, and the share it holds
/// (was last sent; 0 before its first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demand {
    pub envoy: String,
    pub demand: u64,
    pub held: u64,
}

/// The most Envoys one bucket keeps: a report from another one is not entered (and its Envoy
/// is given no share).
pub const MAX_ENVOYS: u64 = 1_000;
/// The most requests one report counts (a report of more counts this many): a trillion.
pub const MAX_REQUESTS: u64 = 1 << 40;
/// The largest demand kept: doubles (Lua's numbers) are exact below 2^53.
pub const MAX_DEMAND: u64 = 1 << 50;
/// A bucket's first report from an Envoy (Envoy 1.40 sends it when the bucket is created)
/// counts its requests over one reporting interval, Envoy 1.40's 5 s.
pub const FIRST_REPORT_MS: u64 = 5_000;
/// The shortest time a later report counts over: two reports close together (a bucket created
/// just before the periodic report) do not make a moment's requests a huge rate.
pub const MIN_ELAPSED_MS: u64 = 1_000;

/// The key of the bucket `entries` (key and value, any order) in `domain`:
/// `sluice:rlqs:{<hash>}`, the hash of the domain and the entries in key order (as the RLS's
/// keys, under the public key: the values stay out of Redis, and every replica finds the
/// same key). One key, so one Cluster slot.
pub fn quota_key<'a>(domain: &'a str, entries: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let sorted: BTreeMap<&str, &str> = entries.collect();
    let parts = std::iter::once(domain.as_bytes()).chain(
        sorted
            .into_iter()
            .flat_map(|(k, v)| [k.as_bytes(), v.as_bytes()]),
    );
    format!(
        "sluice:rlqs:{{{}}}",
        hashed_key_of(&HashSecret::PUBLIC, parts)
    )
}

/// `requests` over `elapsed_ms` (`None`: a first report, over `FIRST_REPORT_MS`; at least
/// `MIN_ELAPSED_MS`) as requests per `period_ms`, at most `MAX_DEMAND`.
pub fn demand(requests: u64, period_ms: u64, elapsed_ms: Option<u64>) -> u64 {
    let over = elapsed_ms.map_or(FIRST_REPORT_MS, |e| e.max(MIN_ELAPSED_MS));
    let rate = u128::from(requests.min(MAX_REQUESTS)) * u128::from(period_ms) / u128::from(over);
    u64::try_from(rate).unwrap_or(u64::MAX).min(MAX_DEMAND)
}

/// KEYS[1] the bucket's hash (`quota_key`): field = an Envoy, value = `<demand>:<ms>:<held>`,
/// its demand, when it was measured by `TIME`, and the share it was last sent. ARGV[1] the
/// Envoy, ARGV[2] its requests since its last report, ARGV[3] the budget's period (ms), ARGV[4]
/// the time to live (ms), ARGV[5] `MAX_ENVOYS`, ARGV[6] `FIRST_REPORT_MS`, ARGV[7]
/// `MIN_ELAPSED_MS`, ARGV[8] `MAX_DEMAND`, ARGV[9] the dead replicas, space-separated (an
/// Envoy's id is `<replica>.<n>`). Forgets the fields older than the time to live and those of
/// dead replicas, enters this Envoy's demand as `demand` does, keeping what it holds (unless it
/// is new and the bucket holds `MAX_ENVOYS` others), and keeps the hash for the time to live.
/// Returns the flat list of every live Envoy, its demand and its share held, this one's last.
pub const QUOTA_REPORT_LUA: &str = r"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local ttl = tonumber(ARGV[4])
local dead = {}
for replica in string.gmatch(ARGV[9], '%S+') do
  dead[replica] = true
end
local fields = redis.call('HGETALL', KEYS[1])
local live, others, last, kept = {}, 0, nil, '0'
for i = 1, #fields, 2 do
  local demand, at, held = string.match(fields[i + 1], '^(%d+):(%d+):(%d+)$')
  at = tonumber(at)
  if at == nil or now - at > ttl or dead[string.match(fields[i], '^([^.]*)')] then
    redis.call('HDEL', KEYS[1], fields[i])
  elseif fields[i] == ARGV[1] then
    last = at
    kept = held
  else
    others = others + 1
    live[#live + 1] = fields[i]
    live[#live + 1] = demand
    live[#live + 1] = held
  end
end
if last == nil and others >= tonumber(ARGV[5]) then
  return live
end
local over = tonumber(ARGV[6])
if last ~= nil then
  over = math.max(now - last, tonumber(ARGV[7]))
end
local demand = math.min(math.floor(tonumber(ARGV[2]) * tonumber(ARGV[3]) / over), tonumber(ARGV[8]))
local text = string.format('%d', demand)
redis.call('HSET', KEYS[1], ARGV[1], text .. ':' .. string.format('%d', now) .. ':' .. kept)
redis.call('PEXPIRE', KEYS[1], ttl)
live[#live + 1] = ARGV[1]
live[#live + 1] = text
live[#live + 1] = kept
return live
";

/// KEYS[1] the bucket's hash, ARGV[1] an Envoy, ARGV[2] the share it was just sent, or `-` to
/// forget the Envoy (its stream ended). A share is entered only in an entry that is still
/// there, keeping its demand and time; returns 1 if the entry was there.
pub const QUOTA_HOLD_LUA: &str = r"
local value = redis.call('HGET', KEYS[1], ARGV[1])
if not value then
  return 0
end
if ARGV[2] == '-' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return 1
end
local demand, at = string.match(value, '^(%d+):(%d+):')
if demand == nil then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], demand .. ':' .. at .. ':' .. ARGV[2])
return 1
";

/// The key of the replicas' heartbeats: field = a replica, value = when it last beat, by
/// `TIME` (ms). One key, in one Cluster slot.
pub const REPLICAS_KEY: &str = "sluice:rlqs:replicas";

/// A replica that has not beaten for this long is dead: its streams' entries are forgotten
/// (`QuotaReport::dead`). Three beats (`rlqs::replicas::BEAT_EVERY`).
pub const DEAD_AFTER_MS: u64 = 3_000;

/// A dead replica's heartbeat is forgotten this long after its last: longer than its streams'
/// entries can live, so the list of the dead stays short.
pub const FORGET_AFTER_MS: u64 = 60_000;

/// KEYS[1] `REPLICAS_KEY`; ARGV[1] this replica, ARGV[2] `DEAD_AFTER_MS`, ARGV[3]
/// `FORGET_AFTER_MS`. Enters this replica's beat now, forgets the beats older than ARGV[3], and
/// returns the replicas whose last beat is older than ARGV[2].
pub const REPLICA_BEAT_LUA: &str = r"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], now)
local beats = redis.call('HGETALL', KEYS[1])
local dead = {}
for i = 1, #beats, 2 do
  local at = tonumber(beats[i + 1])
  if at == nil or now - at > tonumber(ARGV[3]) then
    redis.call('HDEL', KEYS[1], beats[i])
  elseif now - at > tonumber(ARGV[2]) then
    dead[#dead + 1] = beats[i]
  end
end
return dead
";

/// The ledger in this process's memory (`--memory`): what `QUOTA_REPORT_LUA` keeps, by the
/// system clock. One process is one replica, so no stream of it belongs to a dead one.
#[derive(Default, Debug)]
pub struct QuotaLedger {
    /// Per bucket key, per Envoy: (demand, when in ms, share held).
    buckets: HashMap<String, HashMap<String, (u64, u64, u64)>>,
    /// When every bucket was last swept of its old reports.
    swept_ms: u64,
}

impl QuotaLedger {
    /// As `QUOTA_REPORT_LUA`, at `now_ms`.
    pub fn report(&mut self, report: &QuotaReport, now_ms: u64) -> Vec<Demand> {
        let ttl = report.ttl_ms;
        if now_ms.saturating_sub(self.swept_ms) > ttl {
            self.buckets.retain(|_, envoys| {
                envoys.retain(|_, (_, at, _)| now_ms.saturating_sub(*at) <= ttl);
                !envoys.is_empty()
            });
            self.swept_ms = now_ms;
        }
        let envoys = self.buckets.entry(report.key.clone()).or_default();
        envoys.retain(|_, (_, at, _)| now_ms.saturating_sub(*at) <= ttl);
        let last = envoys.get(&report.envoy).map(|&(_, at, _)| at);
        let kept = envoys.get(&report.envoy).map_or(0, |&(_, _, held)| held);
        let others = envoys.len() - usize::from(last.is_some());
        let mut live: Vec<Demand> = (envoys.iter())
            .filter(|(envoy, _)| **envoy != report.envoy)
            .map(|(envoy, &(demand, _, held))| Demand {
                envoy: envoy.clone(),
                demand,
                held,
            })
            .collect();
        if last.is_none() && others as u64 >= MAX_ENVOYS {
            return live;
        }
        let elapsed = last.map(|at| now_ms.saturating_sub(at));
        let demand = demand(report.requests, report.period_ms, elapsed);
        envoys.insert(report.envoy.clone(), (demand, now_ms, kept));
        live.push(Demand {
            envoy: report.envoy.clone(),
            demand,
            held: kept,
        });
        live
    }

    /// As `QUOTA_HOLD_LUA`: `envoy` of bucket `key` holds `held` (`None`: is forgotten).
    pub fn hold(&mut self, key: &str, envoy: &str, held: Option<u64>) -> bool {
        let Some(envoys) = self.buckets.get_mut(key) else {
            return false;
        };
        let found = match held {
            None => envoys.remove(envoy).is_some(),
            Some(held) => envoys.get_mut(envoy).map(|entry| entry.2 = held).is_some(),
        };
        if envoys.is_empty() {
            self.buckets.remove(key);
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(envoy: &str, requests: u64) -> QuotaReport {
        QuotaReport {
            key: quota_key("api", [("name", "b")].into_iter()),
            envoy: envoy.to_owned(),
            requests,
            period_ms: 60_000,
            ttl_ms: 15_000,
            dead: std::sync::Arc::new([]),
        }
    }

    fn demands(live: &[Demand]) -> Vec<(&str, u64)> {
        let mut pairs: Vec<(&str, u64)> = live.iter().map(|d| (&*d.envoy, d.demand)).collect();
        pairs.sort_unstable();
        pairs
    }

    #[test]
    fn a_first_report_counts_over_5_s_a_later_one_over_the_time_since() {
        let mut ledger = QuotaLedger::default();
        // 50 in a first report: 600 a minute.
        assert_eq!(
            demands(&ledger.report(&report("a", 50), 1_000)),
            [("a", 600)]
        );
        // 100 in the next 10 s: 600 a minute; the other Envoy is read too.
        let live = ledger.report(&report("b", 10), 2_000);
        assert_eq!(demands(&live), [("a", 600), ("b", 120)]);
        assert_eq!(
            demands(&ledger.report(&report("a", 100), 11_000))[0],
            ("a", 600)
        );
        // Two reports 10 ms apart count over a second.
        assert_eq!(
            demands(&ledger.report(&report("a", 10), 11_010))[0],
            ("a", 600)
        );
    }

    #[test]
    fn silent_envoys_are_forgotten_after_the_ttl_and_a_bucket_holds_a_bounded_number() {
        let mut ledger = QuotaLedger::default();
        ledger.report(&report("a", 50), 0);
        let live = ledger.report(&report("b", 50), 15_001);
        assert_eq!(demands(&live), [("b", 600)]);
        for envoy in 0..MAX_ENVOYS + 10 {
            ledger.report(&report(&envoy.to_string(), 1), 16_000);
        }
        let live = ledger.report(&report("late", 1), 16_000);
        assert_eq!(live.len() as u64, MAX_ENVOYS);
        assert!(live.iter().all(|d| d.envoy != "late"));
        // Once everyone is silent, the buckets go.
        ledger.report(&report("z", 1), 60_000);
        assert_eq!(ledger.buckets.len(), 1);
    }

    #[test]
    fn huge_counts_are_bounded_and_keys_tell_buckets_and_domains_apart() {
        assert_eq!(demand(u64::MAX, u64::MAX, Some(1)), MAX_DEMAND);
        let key = |domain, value| quota_key(domain, [("name", value)].into_iter());
        assert_ne!(key("api", "a"), key("api", "b"));
        assert_ne!(key("api", "a"), key("web", "a"));
        let both = quota_key("api", [("y", "2"), ("x", "1")].into_iter());
        assert_eq!(both, quota_key("api", [("x", "1"), ("y", "2")].into_iter()));
        assert!(both.starts_with("sluice:rlqs:{") && both.ends_with('}'));
    }
}
