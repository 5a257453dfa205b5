//! The body of `POST /v1/check`: strict parsing and validation into `Check`s, and the response.
//! Everything here happens before any storage is touched; a rejection names the field at fault.

/// The most slots of one global concurrency key: a sorted set of that many members (16-byte
/// names and their expiries) is about 0.5 MB in Redis. The filter refuses a policy of more.
pub use sluice::config::MAX_GLOBAL_SLOTS;
pub use sluice::config::MAX_SLIDING_LOG;
/// The wire format, defined once with the filter (`sluice::wire::protocol`).
pub use sluice::wire::protocol::{CheckResponse, CheckResult};

use serde::de::DeserializeOwned;
use sluice::core::algorithm::Kind;
use sluice::core::calendar::Calendar;
use sluice::wire::protocol::{Check as WireCheck, CheckRequest, WireCalendar};

use crate::stores::{Algorithm, Check, Decision, Namespace, Slots, MAX_CAPACITY_US};

pub const MAX_CHECKS: usize = 16;
/// The sliding-log entries one request may add, all its checks together: a log keeps one entry
/// per token, so this bounds the Redis memory one request can take.
pub const MAX_LOG_ENTRIES: u64 = MAX_SLIDING_LOG;
/// `--max-key-ttl`'s default: a monthly quota of any algorithm (a sliding window of 31 days
/// keeps its state for two windows).
pub const DEFAULT_MAX_KEY_TTL_MS: u64 = sluice::wire::protocol::SERVICE_MAX_KEY_TTL_MS;
const DAY_MS: u64 = 86_400_000;
pub const MAX_KEY_BYTES: usize = 200;
const MAX_REQUESTS: u64 = 1_000_000_000;
const MAX_BURST: u64 = 1_000_000_000;
/// The shortest lease of a slot: the filter renews a slot every half lease from a timer of a
/// second, and the lease must outlast a few missed renewals.
pub const MIN_LEASE_MS: u64 = 4_000;
/// A slot's name: what the filter sends (`sluice::limiter::slot_name`).
const SLOT_NAME_DIGITS: usize = 16;
/// One year.
const MAX_PER_MS: u64 = 31_536_000_000;
/// One year: the longest a leaky bucket may hold a request.
const MAX_DELAY_MS: u64 = 31_536_000_000;

/// What the operator bounds every limit by, whoever sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// `--max-key-ttl`: the longest any key's state may live (`Algorithm::lifetime_us`).
    pub max_key_ttl_ms: u64,
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds {
            max_key_ttl_ms: DEFAULT_MAX_KEY_TTL_MS,
        }
    }
}

impl Bounds {
    /// Refuses a limit whose key would outlive `--max-key-ttl`, naming the flag.
    pub fn check_lifetime(&self, algorithm: &Algorithm) -> Result<(), String> {
        self.check_lifetime_owing(algorithm, 0)
    }

    /// `check_lifetime` for a key that may owe `debt` tokens (`Algorithm::lifetime_owing_us`).
    /// Within it, a bucket that owes stays below `MAX_CAPACITY_US`: exact in the scripts.
    pub fn check_lifetime_owing(&self, algorithm: &Algorithm, debt: u64) -> Result<(), String> {
        let lifetime_ms = algorithm.lifetime_owing_us(debt).div_ceil(1000);
        if lifetime_ms <= self.max_key_ttl_ms {
            return Ok(());
        }
        Err(format!(
            "its key would live {}, more than --max-key-ttl {}",
            human_ms(lifetime_ms),
            human_ms(self.max_key_ttl_ms)
        ))
    }
}

/// `62d`, `90m`, `1500ms`: the largest unit that is exact, as the flag is written.
pub fn human_ms(ms: u64) -> String {
    let units = [(DAY_MS, "d"), (3_600_000, "h"), (60_000, "m"), (1_000, "s")];
    match units
        .iter()
        .find(|(unit, _)| ms > 0 && ms.is_multiple_of(*unit))
    {
        Some((unit, name)) => format!("{}{name}", ms / unit),
        None => format!("{ms}ms"),
    }
}

/// What bounds a check's `cost`, for error messages.
fn capacity_note(kind: Kind) -> &'static str {
    match kind {
        Kind::TokenBucket | Kind::LeakyBucket => " (burst)",
        _ => " (requests)",
    }
}

fn max_requests(kind: Kind) -> u64 {
    match kind {
        Kind::SlidingLog => MAX_SLIDING_LOG,
        Kind::Concurrency => MAX_GLOBAL_SLOTS,
        _ => MAX_REQUESTS,
    }
}

/// Why a request was refused: `detail` is `"<field>: <reason>"`, as the filter's admin path
/// says it.
pub use sluice::wire::admin::BadRequest;

/// Parses and validates a request body into the checks to decide, in request order.
pub fn parse(body: &[u8], bounds: &Bounds) -> Result<Vec<Check>, BadRequest> {
    let raw: CheckRequest = deserialize(body)?;
    if !(1..=MAX_CHECKS).contains(&raw.checks.len()) {
        let reason = format!(
            "must hold 1 to {MAX_CHECKS} checks, got {}",
            raw.checks.len()
        );
        return Err(BadRequest::new("checks", reason));
    }
    let checks = (raw.checks.into_iter().enumerate())
        .map(|(i, check)| validate(check, &format!("checks[{i}]"), bounds))
        .collect::<Result<Vec<Check>, BadRequest>>()?;
    let entries = log_entries(&checks);
    if entries > MAX_LOG_ENTRIES {
        let reason = format!(
            "sliding_log checks may take {MAX_LOG_ENTRIES} entries in all per request, got {entries}"
        );
        return Err(BadRequest::new("checks", reason));
    }
    Ok(checks)
}

/// The sliding-log entries `checks` may add: one per token taken.
pub fn log_entries(checks: &[Check]) -> u64 {
    (checks.iter())
        .filter(|c| matches!(c.algorithm, Algorithm::SlidingLog { .. }))
        .map(|c| c.take)
        .sum()
}

/// The sorted-set members `checks` may add: a sliding log's entry per token, a concurrency
/// slot per slot taken (slots given back add none).
pub fn members_added(checks: &[Check]) -> u64 {
    let slots: u64 = (checks.iter())
        .filter(|c| matches!(c.algorithm, Algorithm::Concurrency { .. }))
        .filter(|c| c.slots != Slots::GiveBack)
        .map(|c| c.take)
        .sum();
    log_entries(checks) + slots
}

/// The JSON body; a serde error is reported at the path where it happened.
pub(crate) fn deserialize<T: DeserializeOwned>(body: &[u8]) -> Result<T, BadRequest> {
    let mut json = serde_json::Deserializer::from_slice(body);
    let raw: T = serde_path_to_error::deserialize(&mut json).map_err(|error| {
        let path = error.path().to_string();
        // Broken JSON is reported for the body (its message has line and column); wrong
        // content at the field's path, "." being the body itself.
        let field = if error.inner().is_data() && path != "." {
            path.as_str()
        } else {
            "body"
        };
        BadRequest::new(field, error.inner())
    })?;
    json.end().map_err(|error| BadRequest::new("body", error))?;
    Ok(raw)
}

fn validate(raw: WireCheck, at: &str, bounds: &Bounds) -> Result<Check, BadRequest> {
    let field = |name: &str| format!("{at}.{name}");
    let name = raw.algorithm;
    let shape = Shape {
        name,
        requests: raw.requests,
        per_ms: raw.per_ms,
        burst: raw.burst,
        max_delay_ms: raw.max_delay_ms,
        calendar: calendar(name, raw.calendar.as_ref(), &field("calendar"))?,
    };
    let algorithm = validate_limit(&raw.key, &shape, &field, bounds)?;
    let cost = cost(name, raw.cost, raw.burst, &field("cost"))?;
    check_queue(&field("cost"), &algorithm, cost)?;
    let take = take(
        name,
        raw.take.unwrap_or(cost),
        cost,
        raw.burst,
        &field("take"),
    )?;
    let slots = slots(name, raw.slot, &field("slot"))?;
    Ok(Check {
        namespace: Namespace::Http,
        key: raw.key,
        algorithm,
        cost,
        take,
        debt: 0,
        slots,
        state_of: None,
    })
}

/// The key and the limit a check (or a settlement, which names the same state) is about:
/// every number within its bounds, the key's life within `--max-key-ttl`.
pub(crate) fn validate_limit(
    key: &str,
    shape: &Shape,
    field: &dyn Fn(&str) -> String,
    bounds: &Bounds,
) -> Result<Algorithm, BadRequest> {
    validate_key(key).map_err(|reason| BadRequest::new(&field("key"), reason))?;
    let algorithm = shape.algorithm(field)?;
    (bounds.check_lifetime(&algorithm))
        .map_err(|reason| BadRequest::new(&field(lifetime_field(shape.name)), reason))?;
    Ok(algorithm)
}

/// `1..=` the capacity; exactly 1 for a concurrency check, which takes the one slot it names.
fn cost(name: Kind, value: u64, burst: u64, field: &str) -> Result<u64, BadRequest> {
    if name == Kind::Concurrency {
        return within(field, value, 1, 1, " (one named slot)");
    }
    let capacity = burst.min(MAX_BURST);
    within(field, value, 1, capacity, capacity_note(name))
}

/// A concurrency check names its slot (`[0-9a-f]{16}`, as the filter names them); no other
/// check has one.
fn slots(name: Kind, slot: Option<String>, field: &str) -> Result<Slots, BadRequest> {
    match (slot, name) {
        (Some(slot), Kind::Concurrency) => Ok(Slots::Named(validate_slot(slot, field)?)),
        (None, Kind::Concurrency) => Err(BadRequest::new(
            field,
            "required for concurrency: the slot's name, by which it is released and renewed",
        )),
        (Some(_), _) => Err(BadRequest::new(
            field,
            format!("only for concurrency, not {}", name.name()),
        )),
        (None, _) => Ok(Slots::Anonymous),
    }
}

/// A slot's name: 16 lowercase hex digits.
pub(crate) fn validate_slot(slot: String, field: &str) -> Result<String, BadRequest> {
    let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
    if slot.len() == SLOT_NAME_DIGITS && slot.chars().all(hex) {
        return Ok(slot);
    }
    Err(BadRequest::new(
        field,
        format!("must be {SLOT_NAME_DIGITS} lowercase hex digits, got {slot:?}"),
    ))
}

/// The field whose number makes a key live long: the bucket's, the window's, the queue's.
fn lifetime_field(kind: Kind) -> &'static str {
    match kind {
        Kind::TokenBucket => "burst",
        Kind::LeakyBucket => "max_delay_ms",
        _ => "per_ms",
    }
}

/// A limit's numbers as callers give them: per check on `/v1/check` (and per settlement on
/// `/v1/settle`), per `rate_limit` in the RLS configuration. `burst` is the token bucket's
/// capacity, a window's limit or the slots (so it must equal `requests`), or for the leaky
/// bucket what bounds `cost` beside the queue (max_delay / interval + 1). For concurrency
/// `per_ms` is a slot's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub name: Kind,
    pub requests: u64,
    pub per_ms: u64,
    pub burst: u64,
    pub max_delay_ms: Option<u64>,
    /// A fixed window's calendar (`/v1/check` and `/v1/settle` only), looked up already.
    pub calendar: Option<Calendar>,
}

impl Shape {
    /// The store's algorithm, if every number is within its bounds; `field` turns a field's
    /// name (`requests`, `per_ms`, `burst`, `max_delay_ms`) into the one the caller reports.
    pub fn algorithm(&self, field: &dyn Fn(&str) -> String) -> Result<Algorithm, BadRequest> {
        let name = self.name;
        let max_delay_ms = max_delay_ms(name, self.max_delay_ms, &field("max_delay_ms"))?;
        let requests = within(&field("requests"), self.requests, 1, max_requests(name), "")?;
        let per_ms = within(&field("per_ms"), self.per_ms, 1, MAX_PER_MS, "")?;
        let window_us = per_ms * 1000;
        let burst = burst(name, self.burst, requests, &field("burst"))?;
        Ok(match name {
            Kind::TokenBucket => {
                let interval_us = interval_us(requests, per_ms);
                check_capacity(&field("burst"), interval_us, burst)?;
                Algorithm::TokenBucket { interval_us, burst }
            }
            Kind::FixedWindow => match self.calendar {
                Some(calendar) => Algorithm::CalendarWindow {
                    limit: requests,
                    calendar,
                },
                None => Algorithm::FixedWindow {
                    limit: requests,
                    window_us,
                },
            },
            Kind::SlidingWindow => Algorithm::SlidingWindow {
                limit: requests,
                window_us,
            },
            Kind::SlidingLog => Algorithm::SlidingLog {
                limit: requests,
                window_us,
            },
            Kind::LeakyBucket => Algorithm::LeakyBucket {
                interval_us: interval_us(requests, per_ms),
                max_delay_us: max_delay_ms * 1000,
            },
            Kind::Concurrency => {
                let lease_ms = within(&field("per_ms"), per_ms, MIN_LEASE_MS, MAX_PER_MS, "")?;
                Algorithm::Concurrency {
                    limit: requests,
                    lease_us: lease_ms * 1000,
                }
            }
        })
    }
}

/// The calendar a check's or settlement's `calendar` names, looked up once per process and
/// calendar (`sluice::core::calendar`): a fixed window's only.
pub fn calendar(
    name: Kind,
    wire: Option<&WireCalendar>,
    field: &str,
) -> Result<Option<Calendar>, BadRequest> {
    match (wire, name) {
        (None, _) => Ok(None),
        (Some(wire), Kind::FixedWindow) => wire.calendar().map(Some).ok_or_else(|| {
            let reason = format!(
                "names no calendar this service knows: time zone {:?}, per {:?} (1d, 1w, 1mo or \
                 1y), starts in range, at most {} calendars",
                wire.timezone,
                wire.per,
                sluice::core::calendar::MAX_CALENDARS
            );
            BadRequest::new(field, reason)
        }),
        (Some(_), _) => Err(BadRequest::new(field, "fixed_window only")),
    }
}

/// A leaky bucket admits no request beyond what its queue holds: one request now and one per
/// interval within `max_delay` (the filter's `burst` may count a few more, in its nanoseconds).
fn check_queue(field: &str, algorithm: &Algorithm, cost: u64) -> Result<(), BadRequest> {
    let Algorithm::LeakyBucket { .. } = algorithm else {
        return Ok(());
    };
    let queue = algorithm.capacity();
    if cost <= queue {
        return Ok(());
    }
    let reason = format!(
        "{cost} is more than the queue holds for leaky_bucket: max_delay_ms / interval + 1 = {queue}"
    );
    Err(BadRequest::new(field, reason))
}

/// Required for the leaky bucket (0..=a year), refused for the others.
fn max_delay_ms(name: Kind, value: Option<u64>, field: &str) -> Result<u64, BadRequest> {
    match (value, name) {
        (Some(ms), Kind::LeakyBucket) => within(field, ms, 0, MAX_DELAY_MS, ""),
        (None, Kind::LeakyBucket) => Err(BadRequest::new(
            field,
            "required for leaky_bucket: the longest a request may be held",
        )),
        (Some(_), _) => Err(BadRequest::new(
            field,
            format!("only for leaky_bucket, not {}", name.name()),
        )),
        (None, _) => Ok(0),
    }
}

/// The token bucket's capacity; a window's limit (so it must equal `requests`); for the leaky
/// bucket what bounds `cost` beside its queue (`check_queue`).
fn burst(name: Kind, value: u64, requests: u64, field: &str) -> Result<u64, BadRequest> {
    match name {
        Kind::TokenBucket => within(field, value, 1, MAX_BURST, ""),
        Kind::LeakyBucket => within(field, value, 1, u64::MAX, ""),
        _ if value == requests => Ok(value),
        _ => Err(BadRequest::new(
            field,
            format!(
                "must equal requests ({requests}) for {}, got {value}",
                name.name()
            ),
        )),
    }
}

/// `cost..=burst`, or 0 for the algorithms a response's usage is settled against (admit if
/// `cost` fits, reserve nothing); exactly `cost` for the leaky bucket, which has no leases, and
/// for concurrency, whose check takes its one named slot.
fn take(name: Kind, value: u64, cost: u64, burst: u64, field: &str) -> Result<u64, BadRequest> {
    match name {
        Kind::LeakyBucket | Kind::Concurrency if value != cost => Err(BadRequest::new(
            field,
            format!("must equal cost ({cost}) for {}, got {value}", name.name()),
        )),
        Kind::LeakyBucket | Kind::Concurrency => Ok(value),
        Kind::TokenBucket | Kind::FixedWindow | Kind::SlidingWindow if value == 0 => Ok(0),
        _ => within(field, value, cost, burst, " (cost..=burst)"),
    }
}

/// µs per token, at least 1: rates above one token per µs are capped there (the contract).
pub fn interval_us(requests: u64, per_ms: u64) -> u64 {
    (per_ms * 1000 / requests).max(1)
}

fn check_capacity(field: &str, interval_us: u64, burst: u64) -> Result<(), BadRequest> {
    let capacity = interval_us.checked_mul(burst);
    if capacity.is_some_and(|capacity| capacity <= MAX_CAPACITY_US) {
        return Ok(());
    }
    let max_ms = MAX_CAPACITY_US / 1000;
    let reason = format!(
        "the bucket takes too long to fill: burst × per_ms / requests must be at most {max_ms} ms"
    );
    Err(BadRequest::new(field, reason))
}

/// `value` if it is in `min..=max`; `bounds_note` says where the bounds come from.
pub(crate) fn within(
    field: &str,
    value: u64,
    min: u64,
    max: u64,
    bounds_note: &str,
) -> Result<u64, BadRequest> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(BadRequest::new(
            field,
            format!("{value} is not in {min}..={max}{bounds_note}"),
        ))
    }
}

fn validate_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "must be 1 to {MAX_KEY_BYTES} bytes, got {}",
            key.len()
        ));
    }
    match key.chars().find(|&c| !is_key_char(c)) {
        Some(c) => Err(format!(
            "character {c:?} is not allowed (only A-Z a-z 0-9 _ . : / -)"
        )),
        None => Ok(()),
    }
}

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '/' | '-')
}

impl From<Decision> for CheckResult {
    fn from(decision: Decision) -> Self {
        CheckResult {
            allowed: decision.allowed,
            granted: decision.granted,
            remaining: decision.remaining,
            reset_ms: ceil_ms(decision.reset_us),
            retry_after_ms: ceil_ms(decision.retry_after_us),
            delay_ms: decision.delay_us.map(ceil_ms),
        }
    }
}

/// Rounds up: a client that waits `retry_after_ms` must find its tokens there.
fn ceil_ms(us: u64) -> u64 {
    us.div_ceil(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNBOUNDED: Bounds = Bounds {
        max_key_ttl_ms: u64::MAX,
    };

    /// Without `--max-key-ttl`'s bound, which has tests of its own.
    fn parse(body: &[u8]) -> Result<Vec<Check>, BadRequest> {
        super::parse(body, &UNBOUNDED)
    }

    fn one_check(fields: &str) -> String {
        format!(r#"{{"checks": [{{{fields}}}]}}"#)
    }

    const VALID: &str = r#""key": "per-user/7af12e58ae350d9a", "requests": 100, "per_ms": 60000, "burst": 20, "cost": 1"#;

    fn detail(body: &str) -> String {
        parse(body.as_bytes()).unwrap_err().detail
    }

    #[test]
    fn a_valid_check_becomes_a_bucket_with_take_defaulting_to_cost() {
        let checks = parse(one_check(VALID).as_bytes()).unwrap();
        let expected = Check {
            namespace: Namespace::Http,
            key: "per-user/7af12e58ae350d9a".into(),
            algorithm: Algorithm::TokenBucket {
                interval_us: 600_000,
                burst: 20,
            },
            cost: 1,
            take: 1,
            debt: 0,
            slots: Slots::Anonymous,
            state_of: None,
        };
        assert_eq!(checks, [expected]);
    }

    #[test]
    fn algorithm_token_bucket_is_the_default_and_unknown_names_are_refused() {
        let explicit = one_check(&format!(r#"{VALID}, "algorithm": "token_bucket""#));
        assert_eq!(
            parse(explicit.as_bytes()).unwrap(),
            parse(one_check(VALID).as_bytes()).unwrap()
        );
        let other = one_check(&format!(r#"{VALID}, "algorithm": "gcra""#));
        assert!(detail(&other).starts_with("checks[0].algorithm: unknown variant `gcra`"));
    }

    const WINDOW: &str =
        r#""key": "k", "requests": 10, "per_ms": 60000, "burst": 10, "cost": 2, "take": 5"#;

    #[test]
    fn the_window_algorithms_become_a_limit_per_window_in_microseconds() {
        for (name, expected) in [
            (
                "fixed_window",
                Algorithm::FixedWindow {
                    limit: 10,
                    window_us: 60_000_000,
                },
            ),
            (
                "sliding_window",
                Algorithm::SlidingWindow {
                    limit: 10,
                    window_us: 60_000_000,
                },
            ),
            (
                "sliding_log",
                Algorithm::SlidingLog {
                    limit: 10,
                    window_us: 60_000_000,
                },
            ),
        ] {
            let body = one_check(&format!(r#"{WINDOW}, "algorithm": "{name}""#));
            let checks = parse(body.as_bytes()).unwrap();
            assert_eq!(
                checks,
                [Check {
                    namespace: Namespace::Http,
                    key: "k".into(),
                    algorithm: expected,
                    cost: 2,
                    take: 5,
                    debt: 0,
                    slots: Slots::Anonymous,
                    state_of: None,
                }]
            );
        }
    }

    #[test]
    fn a_leaky_bucket_drains_one_request_per_interval_and_holds_at_most_max_delay() {
        let body = one_check(
            r#""key": "k", "algorithm": "leaky_bucket", "requests": 10, "per_ms": 1000, "burst": 6, "cost": 1, "max_delay_ms": 500"#,
        );
        let checks = parse(body.as_bytes()).unwrap();
        let expected = Algorithm::LeakyBucket {
            interval_us: 100_000,
            max_delay_us: 500_000,
        };
        assert_eq!(checks[0].algorithm, expected);
        assert_eq!((checks[0].cost, checks[0].take), (1, 1));
    }

    #[test]
    fn each_algorithm_has_its_own_fields_and_bounds() {
        let leaky = r#""key": "k", "algorithm": "leaky_bucket", "requests": 10, "per_ms": 1000, "burst": 6, "cost": 2"#;
        let cases = [
            (
                one_check(&format!(r#"{VALID}, "max_delay_ms": 5"#)),
                "checks[0].max_delay_ms: only for leaky_bucket, not token_bucket",
            ),
            (
                one_check(&format!(
                    r#"{WINDOW}, "algorithm": "sliding_log", "max_delay_ms": 5"#
                )),
                "checks[0].max_delay_ms: only for leaky_bucket, not sliding_log",
            ),
            (
                one_check(leaky),
                "checks[0].max_delay_ms: required for leaky_bucket",
            ),
            (
                one_check(&format!(r#"{leaky}, "max_delay_ms": 31536000001"#)),
                "checks[0].max_delay_ms: 31536000001 is not in 0..=31536000000",
            ),
            (
                one_check(&format!(r#"{leaky}, "max_delay_ms": 500, "take": 3"#)),
                "checks[0].take: must equal cost (2) for leaky_bucket, got 3",
            ),
            (
                one_check(
                    &format!(r#"{leaky}, "max_delay_ms": 500, "cost": 7"#)
                        .replace(r#""cost": 2, "#, ""),
                ),
                "checks[0].cost: 7 is not in 1..=6 (burst)",
            ),
            (
                one_check(
                    &format!(r#"{WINDOW}, "algorithm": "fixed_window""#)
                        .replace(r#""burst": 10"#, r#""burst": 11"#),
                ),
                "checks[0].burst: must equal requests (10) for fixed_window, got 11",
            ),
            (
                one_check(
                    &format!(r#"{WINDOW}, "algorithm": "sliding_window""#)
                        .replace(r#""take": 5"#, r#""take": 11"#),
                ),
                "checks[0].take: 11 is not in 2..=10 (cost..=burst)",
            ),
            (
                one_check(
                    &format!(r#"{WINDOW}, "algorithm": "fixed_window""#)
                        .replace(r#""cost": 2"#, r#""cost": 12"#),
                ),
                "checks[0].cost: 12 is not in 1..=10 (requests)",
            ),
            (
                one_check(
                    r#""key": "k", "algorithm": "sliding_log", "requests": 1001, "per_ms": 1000, "burst": 1001, "cost": 1"#,
                ),
                "checks[0].requests: 1001 is not in 1..=1000",
            ),
        ];
        for (body, expected) in cases {
            let got = detail(&body);
            assert!(
                got.starts_with(expected),
                "{body}\n  gave {got:?}\n  expected {expected:?}"
            );
        }
    }

    const SLOTS: &str = r#""key": "streams/00000000000000ff", "algorithm": "concurrency", "requests": 4, "per_ms": 10000, "burst": 4, "cost": 1"#;

    #[test]
    fn a_concurrency_check_names_its_slot_and_becomes_slots_with_a_lease() {
        let body = one_check(&format!(
            r#"{SLOTS}, "take": 1, "slot": "00000000000000aa""#
        ));
        let checks = parse(body.as_bytes()).unwrap();
        let expected = Algorithm::Concurrency {
            limit: 4,
            lease_us: 10_000_000,
        };
        assert_eq!(checks[0].algorithm, expected);
        assert_eq!(checks[0].slots, Slots::Named("00000000000000aa".into()));
    }

    #[test]
    fn concurrency_has_its_own_bounds_and_only_it_names_a_slot() {
        let slot = r#""slot": "00000000000000aa""#;
        let cases = [
            (one_check(SLOTS), "checks[0].slot: required for concurrency"),
            (
                one_check(&format!(r#"{VALID}, {slot}"#)),
                "checks[0].slot: only for concurrency, not token_bucket",
            ),
            (
                one_check(&format!(r#"{SLOTS}, "slot": "00000000000000AA""#)),
                "checks[0].slot: must be 16 lowercase hex digits",
            ),
            (
                one_check(&format!(r#"{SLOTS}, {slot}"#).replace("10000,", "3999,")),
                "checks[0].per_ms: 3999 is not in 4000..=",
            ),
            (
                one_check(
                    &format!(r#"{SLOTS}, {slot}"#)
                        .replace(r#""requests": 4, "#, r#""requests": 10001, "#),
                ),
                "checks[0].requests: 10001 is not in 1..=10000",
            ),
            (
                one_check(&format!(r#"{SLOTS}, {slot}"#).replace(r#""cost": 1"#, r#""cost": 2"#)),
                "checks[0].cost: 2 is not in 1..=1 (one named slot)",
            ),
            (
                one_check(&format!(r#"{SLOTS}, {slot}, "take": 0"#)),
                "checks[0].take: must equal cost (1) for concurrency, got 0",
            ),
        ];
        for (body, expected) in cases {
            let got = detail(&body);
            assert!(
                got.starts_with(expected),
                "{body}\n  gave {got:?}\n  expected {expected:?}"
            );
        }
        let month = one_check(&format!(r#"{SLOTS}, {slot}"#).replace("10000,", "5356800001,"));
        let refused = super::parse(month.as_bytes(), &Bounds::default()).unwrap_err();
        assert!(refused
            .detail
            .starts_with("checks[0].per_ms: its key would live"));
    }

    #[test]
    fn a_take_of_nothing_is_accepted_where_usage_is_settled() {
        for algorithm in ["token_bucket", "fixed_window", "sliding_window"] {
            let body = one_check(&format!(r#"{WINDOW}, "algorithm": "{algorithm}""#))
                .replace(r#""take": 5"#, r#""take": 0"#);
            assert_eq!(parse(body.as_bytes()).unwrap()[0].take, 0, "{algorithm}");
        }
        let log = one_check(&format!(r#"{WINDOW}, "algorithm": "sliding_log""#))
            .replace(r#""take": 5"#, r#""take": 0"#);
        assert!(detail(&log).starts_with("checks[0].take: 0 is not in 2..=10"));
    }

    #[test]
    fn a_sliding_log_of_a_thousand_is_accepted() {
        let body = one_check(
            r#""key": "k", "algorithm": "sliding_log", "requests": 1000, "per_ms": 1000, "burst": 1000, "cost": 1"#,
        );
        assert!(parse(body.as_bytes()).is_ok());
    }

    #[test]
    fn a_leaky_bucket_admits_no_more_than_its_queue_holds() {
        // 10 a second, held at most 500 ms: one now and five more within the delay.
        let leaky = r#""key": "k", "algorithm": "leaky_bucket", "requests": 10, "per_ms": 1000, "max_delay_ms": 500"#;
        let fits = one_check(&format!(r#"{leaky}, "burst": 6, "cost": 6"#));
        assert!(parse(fits.as_bytes()).is_ok());
        let body = one_check(&format!(r#"{leaky}, "burst": 7, "cost": 7"#));
        assert_eq!(
            detail(&body),
            "checks[0].cost: 7 is more than the queue holds for leaky_bucket: max_delay_ms / interval + 1 = 6"
        );
        // A burst above the queue, as the filter counts it in nanoseconds at rates past one a
        // microsecond, is fine while the cost fits.
        let fast = r#""key": "k", "algorithm": "leaky_bucket", "requests": 10000000, "per_ms": 1000, "max_delay_ms": 1"#;
        assert!(
            parse(one_check(&format!(r#"{fast}, "burst": 10001, "cost": 1"#)).as_bytes()).is_ok()
        );
        let year = r#""key": "k", "algorithm": "leaky_bucket", "requests": 1, "per_ms": 31536000000, "max_delay_ms": 0"#;
        let body = one_check(&format!(r#"{year}, "burst": 2, "cost": 2"#));
        assert!(detail(&body).starts_with("checks[0].cost: 2 is more than the queue holds"));
    }

    #[test]
    fn a_key_that_would_outlive_max_key_ttl_is_refused_naming_the_flag() {
        let bounds = Bounds::default();
        let refused = |body: String| super::parse(body.as_bytes(), &bounds).unwrap_err().detail;
        let month = 31 * DAY_MS;
        let monthly = |algorithm: &str| {
            one_check(&format!(
                r#""key": "k", "algorithm": "{algorithm}", "requests": 100, "per_ms": {month}, "burst": 100, "cost": 1"#
            ))
        };
        for algorithm in [
            "fixed_window",
            "sliding_window",
            "sliding_log",
            "token_bucket",
        ] {
            assert!(
                super::parse(monthly(algorithm).as_bytes(), &bounds).is_ok(),
                "{algorithm}"
            );
        }
        let century =
            r#""key": "k", "requests": 1, "per_ms": 31536000000, "burst": 146, "cost": 1"#;
        assert_eq!(
            refused(one_check(century)),
            "checks[0].burst: its key would live 53290d, more than --max-key-ttl 62d"
        );
        let year = one_check(
            r#""key": "k", "algorithm": "fixed_window", "requests": 1, "per_ms": 31536000000, "burst": 1, "cost": 1"#,
        );
        assert_eq!(
            refused(year),
            "checks[0].per_ms: its key would live 365d, more than --max-key-ttl 62d"
        );
        let tight = Bounds {
            max_key_ttl_ms: 1_000,
        };
        let held = one_check(
            r#""key": "k", "algorithm": "leaky_bucket", "requests": 10, "per_ms": 1000, "burst": 6, "cost": 1, "max_delay_ms": 500"#,
        );
        let detail = super::parse(held.as_bytes(), &tight).unwrap_err().detail;
        assert_eq!(
            detail,
            "checks[0].max_delay_ms: its key would live 1100ms, more than --max-key-ttl 1s"
        );
    }

    #[test]
    fn a_request_adds_at_most_a_thousand_sliding_log_entries() {
        let log = |take: u64| {
            format!(
                r#"{{"key": "k", "algorithm": "sliding_log", "requests": 1000, "per_ms": 1000, "burst": 1000, "cost": 1, "take": {take}}}"#
            )
        };
        let body = |takes: &[u64]| {
            let checks: Vec<String> = takes.iter().map(|&t| log(t)).collect();
            format!(r#"{{"checks": [{}]}}"#, checks.join(","))
        };
        assert!(parse(body(&[500, 500]).as_bytes()).is_ok());
        assert_eq!(
            detail(&body(&[1000, 1])),
            "checks: sliding_log checks may take 1000 entries in all per request, got 1001"
        );
    }

    #[test]
    fn the_interval_is_at_least_one_microsecond() {
        let fast =
            one_check(r#""key": "k", "requests": 1000000000, "per_ms": 1, "burst": 1, "cost": 1"#);
        let expected = Algorithm::TokenBucket {
            interval_us: 1,
            burst: 1,
        };
        assert_eq!(parse(fast.as_bytes()).unwrap()[0].algorithm, expected);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            ("{", "body: EOF while parsing"),
            (r#"{"checks": []}"#, "checks: must hold 1 to 16"),
            (
                r#"{"checks": [{}], "x": 1}"#,
                "checks[0]: missing field `key`",
            ),
            (
                &one_check(&format!(r#"{VALID}, "extra": 1"#)),
                "checks[0].extra: unknown field `extra`",
            ),
            (
                &one_check(&VALID.replace("\"requests\": 100", "\"requests\": 0")),
                "checks[0].requests: 0 is not in",
            ),
            (
                &one_check(&VALID.replace("\"per_ms\": 60000", "\"per_ms\": -5")),
                "checks[0].per_ms: invalid value: integer `-5`",
            ),
            (
                &one_check(&VALID.replace("\"burst\": 20", "\"burst\": 1e30")),
                "checks[0].burst: invalid type: floating point",
            ),
            (
                &one_check(&VALID.replace("\"cost\": 1", "\"cost\": 21")),
                "checks[0].cost: 21 is not in 1..=20 (burst)",
            ),
            (
                &one_check(
                    &format!(r#"{VALID}, "cost": 2, "take": 1"#).replace("\"cost\": 1,", ""),
                ),
                "checks[0].take: 1 is not in 2..=20",
            ),
            (
                &one_check(&VALID.replace("per-user/", "per user/")),
                "checks[0].key: character ' '",
            ),
            (
                &format!("{} 1", one_check(VALID)),
                "body: trailing characters",
            ),
        ];
        for (body, expected) in cases {
            let got = detail(body);
            assert!(
                got.starts_with(expected),
                "{body}\n  gave {got:?}\n  expected {expected:?}"
            );
        }
    }

    #[test]
    fn keys_are_one_to_two_hundred_bytes() {
        let long = "k".repeat(MAX_KEY_BYTES);
        let ok = one_check(&VALID.replace("per-user/7af12e58ae350d9a", &long));
        assert!(parse(ok.as_bytes()).is_ok());
        let too_long = one_check(&VALID.replace("per-user/7af12e58ae350d9a", &format!("{long}k")));
        assert!(detail(&too_long).starts_with("checks[0].key: must be 1 to 200 bytes, got 201"));
        let empty = one_check(&VALID.replace("per-user/7af12e58ae350d9a", ""));
        assert!(detail(&empty).starts_with("checks[0].key: must be 1 to 200 bytes, got 0"));
    }

    #[test]
    fn buckets_too_large_for_exact_lua_arithmetic_are_refused() {
        let year = r#""key": "k", "requests": 1, "per_ms": 31536000000, "cost": 1"#;
        let largest = MAX_CAPACITY_US / 31_536_000_000_000;
        let fits = one_check(&format!(r#"{year}, "burst": {largest}"#));
        assert!(parse(fits.as_bytes()).is_ok());
        let too_big = one_check(&format!(r#"{year}, "burst": {}"#, largest + 1));
        assert!(detail(&too_big).starts_with("checks[0].burst: the bucket takes too long to fill"));
    }

    #[test]
    fn durations_in_the_response_round_up_to_whole_milliseconds() {
        let decision = Decision {
            allowed: false,
            granted: 0,
            remaining: 0,
            reset_us: 4_000_001,
            retry_after_us: 999_999,
            delay_us: Some(1),
        };
        let result = CheckResult::from(decision);
        assert_eq!(
            (result.reset_ms, result.retry_after_ms, result.delay_ms),
            (4001, 1000, Some(1))
        );
    }

    #[test]
    fn delay_ms_is_in_the_response_only_for_the_leaky_bucket() {
        let mut decision = Decision {
            allowed: true,
            granted: 1,
            remaining: 0,
            reset_us: 1000,
            retry_after_us: 0,
            delay_us: None,
        };
        let json = |d: Decision| serde_json::to_string(&CheckResult::from(d)).unwrap();
        assert_eq!(
            json(decision),
            r#"{"allowed":true,"granted":1,"remaining":0,"reset_ms":1,"retry_after_ms":0}"#
        );
        decision.delay_us = Some(0);
        assert!(json(decision).ends_with(r#""retry_after_ms":0,"delay_ms":0}"#));
    }
}
