//! Calendar windows in Redis: a fixed window whose periods follow a calendar in a time zone
//! (`sluice::core::calendar`). Redis has no time zones, and its `TIME` is the one clock, so the service
//! computes the boundaries of three periods around its own clock (the one before, the current
//! one, the next) and the script picks the period that holds `TIME`: the service's clock and
//! Redis's may disagree by far more than a request's length without a check landing in the wrong
//! period, as long as they are less than a period apart.

use sluice::core::calendar::Calendar;

/// Boundaries of three consecutive periods around now, in µs since the epoch: the previous
/// period's start, the current one's start and end, the next one's end.
pub fn boundaries(calendar: Calendar) -> [u64; 4] {
    calendar.in_micros().around(crate::stores::unix_us())
}

/// Calendar window, one check. The state: `<period start in s>:<count>`, as `FIXED_WINDOW_LUA`
/// keeps `<window index>:<count>` (a count of another period is 0).
///
/// KEYS[1]: the state.
/// ARGV[1]: limit.   ARGV[2]: cost.   ARGV[3]: take.   ARGV[4]: debt.
/// ARGV[5..8]: `boundaries`, µs: the periods [b1, b2), [b2, b3), [b3, b4).
/// Returns {allowed (1|0), granted, remaining, reset_us, retry_after_us}.
///
/// The period is the one of the three that holds `TIME` (the first before b2, the last from b3
/// on); reset and retry_after are both the time to its end, at least 1 µs. Otherwise as the
/// fixed window: admits if count + cost <= limit, granting min(take, limit - count); a denial
/// with debt counts the cost anyway, up to limit + debt; TTL to the period's end plus 1 s.
pub const CALENDAR_WINDOW_LUA: &str = r"
local limit, cost = tonumber(ARGV[1]), tonumber(ARGV[2])
local take, debt = tonumber(ARGV[3]), tonumber(ARGV[4]) or 0
local b1, b2, b3, b4 = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local start, finish = b3, b4
if now < b2 then
  start, finish = b1, b2
elseif now < b3 then
  start, finish = b2, b3
end
local index = math.floor(start / 1000000)
local count = 0
local stored = redis.pcall('GET', KEYS[1])
if type(stored) == 'string' then
  local stored_index, stored_count = string.match(stored, '^(%d+):(%d+)$')
  if stored_index and stored_index + 0 == index then
    count = stored_count + 0
  end
end
local reset = math.max(finish - now, 1)
local ttl_ms = string.format('%d', math.ceil(reset / 1000) + 1000)
if count + cost > limit then
  local charged = 0
  if debt > 0 and cost > 0 then
    charged = math.max(math.min(count + cost, limit + debt) - count, 0)
  end
  if charged > 0 then
    count = count + charged
    redis.call('SET', KEYS[1], string.format('%d:%d', index, count), 'PX', ttl_ms)
  end
  return {0, charged, math.max(limit - count, 0), reset, reset}
end
local granted = math.min(take, limit - count)
if granted > 0 then
  count = count + granted
  redis.call('SET', KEYS[1], string.format('%d:%d', index, count), 'PX', ttl_ms)
end
return {1, granted, limit - count, reset, 0}
";

/// Calendar window refund: only while the period that counted the tokens is the current one.
///
/// KEYS[1]: the state of `CALENDAR_WINDOW_LUA`.
/// ARGV[1]: tokens.   ARGV[2]: age_us.   ARGV[3..6]: `boundaries`, µs.
/// Returns min(tokens, count) if the tokens were taken in the period of `TIME`, else 0.
pub const CALENDAR_WINDOW_REFUND_LUA: &str = r"
local tokens, age = tonumber(ARGV[1]), tonumber(ARGV[2])
local b = {tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])}
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local function period(t)
  if t < b[2] then return 1 elseif t < b[3] then return 2 else return 3 end
end
local current = period(now)
if period(math.max(now - age, 0)) ~= current then
  return 0
end
local index = math.floor(b[current] / 1000000)
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
local ttl_ms = math.ceil(math.max(b[current + 1] - now, 1) / 1000) + 1000
redis.call('SET', KEYS[1], string.format('%d:%d', index, tonumber(count) - back), 'PX',
  string.format('%d', ttl_ms))
return back
";
