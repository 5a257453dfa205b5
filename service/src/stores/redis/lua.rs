//! The scripts of the algorithms whose state is one string (token bucket, fixed window, sliding
//! window, leaky bucket), each written once as a Lua function of the stored state and the time,
//! that writes nothing and returns the decision and the state to write (or none). Two kinds of
//! script call those functions, so both run the same code: the one-check scripts
//! (`TOKEN_BUCKET_LUA`, ...: `EVAL`'d one check at a time, the settlements' charges, the model
//! tests), and `CHECKS_LUA`, which decides a batch of checks in one call (`super::batch`).
//!
//! Every function is `name(stored, now, a1, a2, cost, take, debt)` where `stored` is what `GET`
//! (or `MGET`) answered for the key (a string, or anything else for no state), `now` the time in
//! µs since the epoch, `a1, a2` the algorithm's numbers (as in `Algorithm::numbers`), and returns
//! `allowed (1|0), granted, remaining, reset_us, retry_after_us, delay_us, state, ttl_ms, kept`:
//! the state to `SET` with `PX ttl_ms`, or nil to write nothing; `kept` true when the state read
//! was written in the same window (fixed and sliding window), so that the key's TTL is already
//! the one `ttl_ms` gives it (both end at a time the window fixes: to the ms, as `PX` rounds).
//! The numbers are Lua doubles, exact
//! below 2^53 (`check` bounds the inputs; see `super`'s comment over the scripts).

/// Token bucket as GCRA: the whole state is the bucket's theoretical arrival time (TAT).
/// The bucket is full when TAT <= now; each token taken moves TAT one interval later.
/// The state: the TAT in µs since the epoch (decimal string; absent = full).
/// a1: interval_us, µs per token (>= 1).   a2: burst, capacity in tokens.
/// cost: tokens needed.   take: tokens wanted (cost..=burst).   debt: tokens the bucket may owe
/// past empty.
///
/// A denial without debt or a grant of 0 writes nothing. A denial with debt moves the TAT by the
/// tokens owed, whole ones, never past now + (burst + debt) × interval: the debt refills at the
/// rate. Every write sets the TAT with a TTL of the time until the bucket is full again plus 1 s.
/// Exact because the caller keeps (burst + debt) × interval below `stores::MAX_CAPACITY_US`.
macro_rules! token_bucket_fn {
    () => {
        r"
local function token_bucket(stored, now, interval, burst, cost, take, debt)
  local capacity = burst * interval
  -- A TAT in the past means a full bucket: elapsed time beyond that is not credited.
  local tat = math.max(tonumber(stored) or 0, now)
  local available = math.floor((capacity - (tat - now)) / interval)
  if available < cost then
    local charged = 0
    if debt > 0 and cost > 0 then
      local room = math.floor((now + capacity + debt * interval - tat) / interval)
      charged = math.min(cost, math.max(room, 0))
    end
    local state, ttl_ms
    if charged > 0 then
      tat = tat + charged * interval
      available = math.floor((capacity - (tat - now)) / interval)
      state, ttl_ms = string.format('%d', tat), math.ceil((tat - now) / 1000) + 1000
    end
    local retry_after = tat + cost * interval - capacity - now
    return 0, charged, math.max(available, 0), tat - now, retry_after, 0, state, ttl_ms
  end
  local granted = math.min(take, available)
  if granted == 0 then
    return 1, 0, available, tat - now, 0, 0
  end
  tat = tat + granted * interval
  local reset = tat - now
  return 1, granted, available - granted, reset, 0, 0, string.format('%d', tat), math.ceil(reset / 1000) + 1000
end
"
    };
}

/// Fixed window: at most `limit` tokens per window, windows aligned to the epoch
/// (index = floor(now / window)). Up to 2 × limit can pass across a boundary, as locally.
/// The state: `<window index>:<count>` (a count of another window is 0).
/// a1: window_us.   a2: limit.   take: cost..=limit.
/// reset and retry_after are both the time to the window's end.
///
/// Admits if count + cost <= limit, granting min(take, limit - count). A denial with debt counts
/// the cost anyway, count = min(count + cost, limit + debt): while count > limit even a cost of 0
/// is refused (envoyproxy/ratelimit's `after > limit`). TTL: to the window's end plus 1 s; a
/// grant of 0 writes nothing. `math.fmod` is exact on doubles, so the window's start is too.
macro_rules! fixed_window_fn {
    () => {
        r"
-- The state `fixed_window` wrote last, and what it holds: a key's next check in a batch reads
-- it without parsing it again.
local fixed_window_text, fixed_window_index, fixed_window_count
local function fixed_window_state(index, count)
  local text = string.format('%d:%d', index, count)
  fixed_window_text, fixed_window_index, fixed_window_count = text, index, count
  return text
end
local function fixed_window(stored, now, window, limit, cost, take, debt)
  local start = now - math.fmod(now, window)
  local index = start / window
  local count, kept = 0, false
  if stored == fixed_window_text then
    if fixed_window_index == index then
      count, kept = fixed_window_count, true
    end
  elseif type(stored) == 'string' then
    local stored_index, stored_count = string.match(stored, '^(%d+):(%d+)$')
    -- `+ 0` reads the digits as `tonumber` does, without a function call.
    if stored_index and stored_index + 0 == index then
      count, kept = stored_count + 0, true
    end
  end
  local reset = start + window - now
  local ttl_ms = math.ceil(reset / 1000) + 1000
  if count + cost > limit then
    local charged = 0
    if debt > 0 and cost > 0 then
      charged = math.max(math.min(count + cost, limit + debt) - count, 0)
    end
    local state
    if charged > 0 then
      count = count + charged
      state = fixed_window_state(index, count)
    end
    return 0, charged, math.max(limit - count, 0), reset, reset, 0, state, ttl_ms, kept
  end
  local granted = math.min(take, limit - count)
  if granted == 0 then
    return 1, 0, limit - count, reset, 0, 0
  end
  count = count + granted
  return 1, granted, limit - count, reset, 0, 0, fixed_window_state(index, count), ttl_ms, kept
end
"
    };
}

/// `ceil_muldiv(a, b, c)`, the sliding window's: ceil(a * b / c) for whole a, b, c >= 1 below
/// 2^53 whose result is below 2^53, also when a * b is not: b = q c + r, so
/// a b / c = a q + a r / c, and a r / c is found bit by bit of a (a is a count: at most 30
/// bits), every partial sum below 2 c.
macro_rules! ceil_muldiv_fn {
    () => {
        r"
local function ceil_muldiv(a, b, c)
  local product = a * b
  if product < 9007199254740992 then
    local rest = math.fmod(product, c)
    return (product - rest) / c + (rest > 0 and 1 or 0)
  end
  local r = math.fmod(b, c)
  local q = (b - r) / c
  local quotient, rest, left, bit = 0, 0, a, 1
  while bit * 2 <= a do
    bit = bit * 2
  end
  while bit >= 1 do
    quotient, rest = quotient * 2, rest * 2
    if rest >= c then
      quotient, rest = quotient + 1, rest - c
    end
    if left >= bit then
      left = left - bit
      rest = rest + r
      if rest >= c then
        quotient, rest = quotient + 1, rest - c
      end
    end
    bit = bit / 2
  end
  return a * q + quotient + (rest > 0 and 1 or 0)
end
"
    };
}

/// Sliding window, the two-counter estimate: this epoch-aligned window's count plus the
/// previous window's count weighted by the part of it the last `window` still covers,
/// `previous × (window - elapsed) / window + current`. Needs `ceil_muldiv_fn`.
/// The state: `<window index>:<current>:<previous>`.
/// a1: window_us.   a2: limit.   take: cost..=limit.
///
/// With weighted = ceil(previous × (window - elapsed) / window), the tokens that fit now are
/// room = limit - current - weighted (the estimate + t <= limit exactly when t <= room, t
/// whole). Admits if room >= cost, granting min(take, room). retry_after is the filter's
/// `sliding_window::retry_after`: later in this window if only the previous window's weight is
/// in the way, else into the next window, where this window's count is the one that fades.
/// reset is when both counts have faded: the end of the next window once this one has a count
/// (after an admission it always has), else the end of this one, as locally. TTL: to the end of
/// the next window plus 1 s; a grant of 0 writes nothing. A denial with debt adds
/// min(cost, room + debt) to this window's count (the estimate at most limit + debt), which then
/// fades as any count; its retry_after and reset are from the counts after that. Counts × µs
/// exceed 2^53 (a billion × a year), so products go through `ceil_muldiv`.
macro_rules! sliding_window_fn {
    () => {
        r"
-- The state `sliding_window` wrote last, and what it holds (as `fixed_window_text`).
local sliding_window_text, sliding_window_index, sliding_window_current, sliding_window_previous
local function sliding_window_state(index, current, previous)
  local text = string.format('%d:%d:%d', index, current, previous)
  sliding_window_text, sliding_window_index = text, index
  sliding_window_current, sliding_window_previous = current, previous
  return text
end
local function sliding_window(stored, now, window, limit, cost, take, debt)
  local elapsed = math.fmod(now, window)
  local index = (now - elapsed) / window
  local current, previous, kept = 0, 0, false
  local i, c, p
  if stored == sliding_window_text then
    i, c, p = sliding_window_index, sliding_window_current, sliding_window_previous
  elseif type(stored) == 'string' then
    i, c, p = string.match(stored, '^(%d+):(%d+):(%d+)$')
  end
  if i then
    i = i + 0
    if i == index then
      current, previous, kept = c + 0, p + 0, true
    elseif i + 1 == index then
      previous = c + 0
    end
  end
  local room = limit - current - ceil_muldiv(previous, window - elapsed, window)
  local ttl_ms = math.ceil((2 * window - elapsed) / 1000) + 1000
  if room < cost then
    local charged = 0
    if debt > 0 and cost > 0 then
      charged = math.min(cost, math.max(room + debt, 0))
    end
    local state
    if charged > 0 then
      current, room = current + charged, room - charged
      state = sliding_window_state(index, current, previous)
    end
    local reset = window - elapsed
    if current > 0 then
      reset = 2 * window - elapsed
    end
    -- Time into a window, with fading as the previous count and fresh as the current, from
    -- which fading × (window - t) / window + fresh + cost <= limit; nil if never in that window.
    local function fits_at(fading, fresh)
      local fits = limit - fresh - cost
      if fits < 0 then
        return nil
      end
      if fading <= fits then
        return 0
      end
      return ceil_muldiv(fading - fits, window, fading)
    end
    local retry_after
    local t = fits_at(previous, current)
    if t then
      retry_after = math.max(t - elapsed, 1)
    else
      t = fits_at(current, 0)
      if t then
        retry_after = window - elapsed + t
      else
        retry_after = 2 * window - elapsed
      end
    end
    return 0, charged, math.max(room, 0), reset, retry_after, 0, state, ttl_ms, kept
  end
  local granted = math.min(take, room)
  if granted == 0 then
    return 1, 0, room, current > 0 and 2 * window - elapsed or window - elapsed, 0, 0
  end
  local state = sliding_window_state(index, current + granted, previous)
  return 1, granted, room - granted, 2 * window - elapsed, 0, 0, state, ttl_ms, kept
end
"
    };
}

/// Leaky bucket, shaping: requests leave one per interval. The state is the time the queue
/// drains (a GCRA TAT; decimal string, absent = empty); a request's turn is max(TAT, now), its
/// delay turn - now.
/// a1: interval_us (>= 1).   a2: max_delay_us.   cost (= take; take and debt are not used).
///
/// delay > max_delay: denied, nothing written, retry_after = delay - max_delay. Otherwise
/// admitted with that delay (the filter holds the request), TAT = turn + cost × interval,
/// remaining = the cost-1 requests that could still queue behind it within max_delay
/// (floor((max_delay - delay) / interval) + 1 - cost, at least 0), reset = until the queue
/// drains. TTL: until it drains plus 1 s. A cost of 0 only asks: it writes nothing. It takes no
/// debt: a queue slot it refuses is not taken (the request refused is never sent on, so it holds
/// no turn).
macro_rules! leaky_bucket_fn {
    () => {
        r"
local function leaky_bucket(stored, now, interval, max_delay, cost)
  local turn = math.max(tonumber(stored) or 0, now)
  local delay = turn - now
  if delay > max_delay then
    return 0, 0, 0, delay, delay - max_delay, 0
  end
  local drained = turn + cost * interval
  local reset = drained - now
  local remaining = math.max(math.floor((max_delay - delay) / interval) + 1 - cost, 0)
  if cost == 0 then
    return 1, 0, remaining, reset, 0, delay
  end
  return 1, cost, remaining, reset, 0, delay, string.format('%d', drained), math.ceil(reset / 1000) + 1000
end
"
    };
}

/// The one-check scripts' start: the time from `TIME`.
macro_rules! now_lua {
    () => {
        r"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
"
    };
}

/// A one-check script's end: `fn` of KEYS[1]'s state, with ARGV[1..5] (ARGV[5], the debt, may
/// be absent); its state written if it has one; {allowed, granted, remaining, reset_us,
/// retry_after_us}, and delay_us after them if `$delay`.
macro_rules! one_check_lua {
    ($fn:literal, $reply:literal) => {
        concat!(
            now_lua!(),
            "local allowed, granted, remaining, reset, retry_after, delay, state, ttl_ms = ",
            $fn,
            r"(redis.pcall('GET', KEYS[1]), now,
  tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]) or 0)
if state then
  redis.call('SET', KEYS[1], state, 'PX', string.format('%d', ttl_ms))
end
return ",
            $reply,
            "\n"
        )
    };
}

/// Token bucket, one check (`token_bucket_fn`): KEYS[1] the TAT; ARGV[1]: interval_us,
/// ARGV[2]: burst, ARGV[3]: cost, ARGV[4]: take, ARGV[5]: debt.
/// Returns {allowed (1|0), granted, remaining, reset_us, retry_after_us}.
pub const TOKEN_BUCKET_LUA: &str = concat!(
    token_bucket_fn!(),
    one_check_lua!(
        "token_bucket",
        "{allowed, granted, remaining, reset, retry_after}"
    )
);

/// Fixed window, one check (`fixed_window_fn`): KEYS[1] `<window index>:<count>`;
/// ARGV[1]: window_us, ARGV[2]: limit, ARGV[3]: cost, ARGV[4]: take, ARGV[5]: debt.
/// Returns {allowed (1|0), granted, remaining, reset_us, retry_after_us}.
pub const FIXED_WINDOW_LUA: &str = concat!(
    fixed_window_fn!(),
    one_check_lua!(
        "fixed_window",
        "{allowed, granted, remaining, reset, retry_after}"
    )
);

/// Sliding window, one check (`sliding_window_fn`): KEYS[1]
/// `<window index>:<current>:<previous>`; ARGV[1]: window_us, ARGV[2]: limit, ARGV[3]: cost,
/// ARGV[4]: take, ARGV[5]: debt.
/// Returns {allowed (1|0), granted, remaining, reset_us, retry_after_us}.
pub const SLIDING_WINDOW_LUA: &str = concat!(
    ceil_muldiv_fn!(),
    sliding_window_fn!(),
    one_check_lua!(
        "sliding_window",
        "{allowed, granted, remaining, reset, retry_after}"
    )
);

/// Leaky bucket, one check (`leaky_bucket_fn`): KEYS[1] the TAT; ARGV[1]: interval_us,
/// ARGV[2]: max_delay_us, ARGV[3]: cost (= take).
/// Returns {allowed (1|0), granted, remaining, reset_us, retry_after_us, delay_us}.
pub const LEAKY_BUCKET_LUA: &str = concat!(
    leaky_bucket_fn!(),
    one_check_lua!(
        "leaky_bucket",
        "{allowed, granted, remaining, reset, retry_after, delay}"
    )
);

/// The algorithms `CHECKS_LUA` decides, by the code of their records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    TokenBucket = 1,
    FixedWindow = 2,
    SlidingWindow = 3,
    LeakyBucket = 4,
}

/// Bytes of one check's record in `CHECKS_LUA`'s ARGV[1]: its `Kind` (a byte), its key's index
/// in KEYS (from 1, a little-endian u16), then a1, a2, cost, take, debt as little-endian doubles
/// (`struct` format `<BHddddd`; the script counts its records by this size).
pub const RECORD_BYTES: usize = 1 + 2 + 5 * 8;
/// Bytes of one decision in `CHECKS_LUA`'s reply: allowed, granted, remaining, reset_us,
/// retry_after_us, delay_us as little-endian doubles.
pub const DECISION_BYTES: usize = 6 * 8;

/// A batch of checks in one call, read from one clock: `TIME` once, every state read with one
/// `MGET`, each check decided by its algorithm's function in order (a key's later checks see
/// its earlier ones' state), and each key's last state written once, with its TTL, at the end
/// (`KEEPTTL` where the key already has that TTL: a `SET` of fewer arguments, and no expiry to
/// write). `struct` unpacks every record in one call and packs every decision in one.
/// What Redis holds afterwards, and every answer, are those of the one-check scripts run one
/// after another at that time: one `SET` of a key's last state and TTL leaves what its
/// successive `SET`s would have.
///
/// KEYS: the checks' state keys, each once (a hot key's checks name it by its index: the
/// request, the `MGET` and the script's tables hold it once).
/// ARGV[1]: the checks' records, `RECORD_BYTES` each, in order.
/// Returns one string: the decisions, `DECISION_BYTES` each, in order (`<dddddd`).
///
/// `MGET` answers nil for a key of another type, as the one-check scripts' `GET` (by `pcall`)
/// reads it as no state; `SET` overwrites it, as theirs do.
pub const CHECKS_LUA: &str = concat!(
    token_bucket_fn!(),
    fixed_window_fn!(),
    ceil_muldiv_fn!(),
    sliding_window_fn!(),
    leaky_bucket_fn!(),
    now_lua!(),
    r"
local decide = {token_bucket, fixed_window, sliding_window, leaky_bucket}
local records = ARGV[1]
local n = #records / 43
local states = redis.call('MGET', unpack(KEYS))
local fields = {struct.unpack(string.rep('BHddddd', n, ''), records)}
-- Per key index: its TTL to write, and whether it keeps the one it has (nil: nothing to write).
local ttls, keep = {}, {}
local out = {}
for i = 1, n do
  local r, o = 7 * i - 6, 6 * i - 5
  local k = fields[r + 1]
  local allowed, granted, remaining, reset, retry_after, delay, state, ttl_ms, kept =
    decide[fields[r]](states[k], now, fields[r + 2], fields[r + 3], fields[r + 4], fields[r + 5], fields[r + 6])
  if state then
    if keep[k] == nil then
      keep[k] = kept or false
    end
    states[k], ttls[k] = state, ttl_ms
  end
  out[o], out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] =
    allowed, granted, remaining, reset, retry_after, delay
end
for k = 1, #KEYS do
  if keep[k] then
    redis.call('SET', KEYS[k], states[k], 'KEEPTTL')
  elseif keep[k] == false then
    redis.call('SET', KEYS[k], states[k], 'PX', string.format('%d', ttls[k]))
  end
end
return struct.pack(string.rep('d', 6 * n, ''), unpack(out))
"
);
