//! The wire format between the filter and `sluice-service`. `POST /v1/check`: one request carries
//! every global check of one HTTP request, one answer per check comes back in order.
//! `POST /v1/settle`: what requests owe global policies after their admission (a response's
//! usage beyond or below its reservation, a slot given back or renewed), sent in batches by each
//! Envoy worker, never on a request's path.

use crate::core::algorithm::{Algorithm, Drain, Kind, Rate, Slots, Window};
use crate::core::calendar::{Calendar, Starts, Unit};
use serde::{Deserialize, Serialize};

const NANOS_PER_MS: u64 = 1_000_000;

/// The body of `POST /v1/check`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckRequest {
    pub checks: Vec<Check>,
}

/// One global policy's question about one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    /// `<policy>/<key hash>`: the service never sees the raw key either.
    pub key: String,
    #[serde(default)]
    pub algorithm: Kind,
    pub requests: u64,
    pub per_ms: u64,
    pub burst: u64,
    pub cost: u64,
    /// Tokens to take if at least `cost` are there: more than `cost` grants the rest to the
    /// asking Envoy. Absent: the cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub take: Option<u64>,
    /// Leaky bucket only: the longest the service may schedule a request ahead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay_ms: Option<u64>,
    /// Concurrency only: the slot's name (16 hex digits, unique per request), by which it is
    /// given back and renewed; `per_ms` is its lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<String>,
    /// A fixed window on a calendar: its periods (`per_ms` is then only their nominal length).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calendar: Option<WireCalendar>,
    /// The key's parts as an RLS descriptor names them (`rls`), for a service that speaks that
    /// protocol; never on this wire, where the key is only its hash.
    #[serde(skip)]
    pub entries: Vec<(String, String)>,
}

/// A calendar on the wire: the zone's name, the period (`1d`, `1w`, `1mo`, `1y`) and where each
/// starts (`calendar::Starts`: month 1..=12, day 1..=31, weekday 0 = Monday, second of the
/// local day).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireCalendar {
    pub timezone: String,
    pub per: String,
    pub month: u8,
    pub day: u8,
    pub weekday: u8,
    pub second: u32,
}

impl WireCalendar {
    /// The wire form of `calendar`.
    pub fn of(calendar: &Calendar) -> Option<WireCalendar> {
        let (timezone, starts) = calendar.describe()?;
        Some(WireCalendar {
            timezone,
            per: calendar.unit.name().to_string(),
            month: starts.month,
            day: starts.day,
            weekday: starts.weekday,
            second: starts.second,
        })
    }

    /// The calendar it names (looked up once per process and calendar); `None` when it names
    /// none (an unknown zone, a start out of range, too many calendars).
    pub fn calendar(&self) -> Option<Calendar> {
        let unit = Unit::parse(&self.per)?;
        let starts = Starts {
            month: self.month,
            day: self.day,
            weekday: self.weekday,
            second: self.second,
        };
        Calendar::new(&self.timezone, unit, starts).ok()
    }
}

impl Check {
    /// Tokens to take at most.
    pub fn take(&self) -> u64 {
        self.take.unwrap_or(self.cost)
    }

    /// The limit the check describes, in nanoseconds; `None` when its numbers (its cost among
    /// them) make none.
    pub fn limit(&self) -> Option<Algorithm> {
        let per = self.per_ms.checked_mul(NANOS_PER_MS)?;
        let (requests, burst) = (self.requests, self.burst);
        let limit = match self.algorithm {
            Kind::TokenBucket => Rate::new(requests, per, burst).map(Algorithm::TokenBucket),
            Kind::FixedWindow => match &self.calendar {
                Some(calendar) => Window::calendar(requests, calendar.calendar()?),
                None => Window::new(requests, per),
            }
            .map(Algorithm::FixedWindow),
            Kind::SlidingWindow => Window::new(requests, per).map(Algorithm::SlidingWindow),
            Kind::SlidingLog => Window::new(requests, per).map(Algorithm::SlidingLog),
            Kind::LeakyBucket => {
                let max_delay = self.max_delay_ms?.checked_mul(NANOS_PER_MS)?;
                Drain::new(requests, per, max_delay).map(Algorithm::LeakyBucket)
            }
            // `per` is the lease of a slot.
            Kind::Concurrency => Slots::new(requests, per).map(Algorithm::Concurrency),
        }
        .ok()?;
        limit.check_cost(self.cost).ok()?;
        Some(limit)
    }
}

/// The body of the service's 200 answer: one result per check, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResponse {
    pub results: Vec<CheckResult>,
}

/// The answer to one check, durations in whole milliseconds rounded up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResult {
    pub allowed: bool,
    pub granted: u64,
    pub remaining: u64,
    pub reset_ms: u64,
    pub retry_after_ms: u64,
    /// Leaky bucket only (absent otherwise): how long the filter holds the admitted request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
}

/// The service's answer to one check, as the filter uses it: durations in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    pub allowed: bool,
    pub granted: u64,
    pub remaining: u64,
    pub reset_after: u64,
    pub retry_after: u64,
    /// How long to hold the admitted request first (leaky bucket).
    pub delay: u64,
}

impl From<CheckResult> for Answer {
    fn from(result: CheckResult) -> Answer {
        let nanos = |ms: u64| ms.saturating_mul(NANOS_PER_MS);
        Answer {
            allowed: result.allowed,
            granted: result.granted,
            remaining: result.remaining,
            reset_after: nanos(result.reset_ms),
            retry_after: nanos(result.retry_after_ms),
            delay: nanos(result.delay_ms.unwrap_or(0)),
        }
    }
}

/// A key as the service knows it: `<policy>/<key hash>` (16 hex digits): the same in every Envoy.
pub fn key(policy: &str, hash: u64) -> String {
    format!("{policy}/{hash:016x}")
}

/// Whole milliseconds, rounded up, at least 1: the wire's unit for durations.
pub fn per_ms(per_nanos: u64) -> u64 {
    per_nanos.div_ceil(NANOS_PER_MS).max(1)
}

pub fn encode(checks: &[Check]) -> Vec<u8> {
    #[derive(Serialize)]
    struct Body<'a> {
        checks: &'a [Check],
    }
    serde_json::to_vec(&Body { checks }).unwrap_or_default()
}

/// The answers, if the body is a well-formed answer to exactly `checks` whose grants make
/// sense; `None` otherwise (the caller treats it as a failed call).
pub fn decode(body: &[u8], checks: &[Check]) -> Option<Vec<Answer>> {
    let response: CheckResponse = serde_json::from_slice(body).ok()?;
    if response.results.len() != checks.len() {
        return None;
    }
    let sane = |(result, check): (CheckResult, &Check)| {
        // A take below the cost (0: a reservation of nothing) asks whether the cost fits.
        let least = check.cost.min(check.take());
        let granted = if result.allowed {
            (least..=check.take()).contains(&result.granted)
        } else {
            result.granted == 0
        };
        granted.then(|| result.into())
    };
    response.results.into_iter().zip(checks).map(sane).collect()
}

/// The longest `sluice-service` keeps a key unless told otherwise: its `--max-key-ttl` default,
/// 62 days (`sluice_service::check::DEFAULT_MAX_KEY_TTL_MS` is this). A check or settlement
/// whose key would live longer is refused; the filter refuses such a global policy when it is
/// configured (`global.max_key_ttl`, this by default).
pub const SERVICE_MAX_KEY_TTL_MS: u64 = 62 * 86_400_000;
/// The most requests (or tokens, or micro-units) a limit sluice-service checks may count in a
/// window, and its largest burst: its `MAX_REQUESTS` and `MAX_BURST`.
pub const SERVICE_MAX_COUNT: u64 = 1_000_000_000;

/// How long sluice-service keeps the state of `check`'s limit when its key may owe `debt`
/// tokens past it, in ms: `store::Algorithm::lifetime_owing_us` of the numbers the service reads
/// from the check (a bucket refills its burst and its debt, a window lasts its window, two for
/// the sliding window, a queue its longest wait and its drain, a slot its lease).
pub fn key_lifetime_ms(check: &Check, debt: u64) -> u64 {
    let window_us = check.per_ms.saturating_mul(1000);
    let interval_us = (window_us / check.requests.max(1)).max(1);
    // A calendar's period at its longest, as the service keeps it (`store::Algorithm`).
    let calendar = (check.calendar.as_ref()).and_then(|c| Unit::parse(&c.per));
    let lifetime_us = match check.algorithm {
        Kind::FixedWindow if calendar.is_some() => {
            calendar.map_or(window_us, |unit| unit.longest_nanos() / 1000)
        }
        Kind::TokenBucket => interval_us.saturating_mul(check.burst.saturating_add(debt)),
        Kind::FixedWindow | Kind::SlidingLog | Kind::Concurrency => window_us,
        Kind::SlidingWindow => window_us.saturating_mul(2),
        Kind::LeakyBucket => {
            let max_delay_us = check.max_delay_ms.unwrap_or(0).saturating_mul(1000);
            let capacity = max_delay_us / interval_us + 1;
            max_delay_us.saturating_add(interval_us.saturating_mul(capacity))
        }
    };
    lifetime_us.div_ceil(1000)
}

/// The body of `POST /v1/settle`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettleRequest {
    pub settlements: Vec<Settlement>,
}

/// What one request owes one key of a global policy, named as its check named it (the key and
/// the limit's numbers), so that the service settles the same state. (Flattened, so its unknown
/// fields are refused by `SettleOp`'s variants.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settlement {
    pub key: String,
    pub algorithm: Kind,
    pub requests: u64,
    pub per_ms: u64,
    pub burst: u64,
    /// As a check's: the calendar of a fixed window that follows one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calendar: Option<WireCalendar>,
    #[serde(flatten)]
    pub op: SettleOp,
}

/// What to do to the key's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum SettleOp {
    /// Charge what a response used beyond its reservation, whatever is left: the key may owe
    /// up to `max_debt` tokens past its limit (the rest is forgiven).
    Charge {
        tokens: u64,
        max_debt: u64,
        /// The settlement's name (16 hex digits, made when it was): the service applies it at
        /// most once, however often a lost answer makes it come again. Absent: applied each time.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
    },
    /// Give back what a response did not use of a reservation made `age_ms` ago, as far as the
    /// window that counted it still does.
    Refund {
        tokens: u64,
        age_ms: u64,
        /// As a charge's: applied at most once.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
    },
    /// The request that holds the slot ended.
    Release { slot: String },
    /// The request that holds the slot lives on: its lease starts again.
    Renew { slot: String },
}

pub fn encode_settlements(settlements: &[Settlement]) -> Vec<u8> {
    #[derive(Serialize)]
    struct Body<'a> {
        settlements: &'a [Settlement],
    }
    serde_json::to_vec(&Body { settlements }).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(take: u64) -> Check {
        Check {
            calendar: None,
            key: "per-user/00000000000000ff".into(),
            algorithm: Kind::TokenBucket,
            requests: 100,
            per_ms: 60_000,
            burst: 20,
            cost: 1,
            take: Some(take),
            max_delay_ms: None,
            slot: None,
            entries: Vec::new(),
        }
    }

    #[test]
    fn encodes_settlements_as_documented() {
        let settlement = |op| Settlement {
            calendar: None,
            key: "llm/00000000000000ff".into(),
            algorithm: Kind::TokenBucket,
            requests: 1000,
            per_ms: 60_000,
            burst: 1000,
            op,
        };
        let body = encode_settlements(&[
            settlement(SettleOp::Charge {
                tokens: 250,
                max_debt: 1000,
                id: Some("00000000000000c1".into()),
            }),
            settlement(SettleOp::Release {
                slot: "00000000000000aa".into(),
            }),
        ]);
        let text = String::from_utf8(body).unwrap();
        assert_eq!(
            text,
            r#"{"settlements":[{"key":"llm/00000000000000ff","algorithm":"token_bucket","requests":1000,"per_ms":60000,"burst":1000,"op":"charge","tokens":250,"max_debt":1000,"id":"00000000000000c1"},{"key":"llm/00000000000000ff","algorithm":"token_bucket","requests":1000,"per_ms":60000,"burst":1000,"op":"release","slot":"00000000000000aa"}]}"#
        );
        let back: SettleRequest = serde_json::from_str(&text).unwrap();
        assert_eq!(back.settlements.len(), 2);
    }

    #[test]
    fn an_id_is_optional_and_only_charges_and_refunds_carry_one() {
        let parse = |op: &str| {
            let body = format!(
                r#"{{"settlements":[{{"key":"k","algorithm":"token_bucket","requests":1,"per_ms":1,"burst":1,{op}}}]}}"#
            );
            serde_json::from_str::<SettleRequest>(&body)
        };
        let older = parse(r#""op":"refund","tokens":1,"age_ms":0"#).unwrap();
        let refund = SettleOp::Refund {
            tokens: 1,
            age_ms: 0,
            id: None,
        };
        assert_eq!(older.settlements[0].op, refund, "an older filter's");
        let release = r#""op":"release","slot":"00000000000000aa","id":"00000000000000aa""#;
        let refused = parse(release).unwrap_err().to_string();
        assert!(refused.contains("unknown field `id`"), "{refused}");
    }

    #[test]
    fn a_take_of_nothing_asks_whether_the_cost_fits() {
        let peek = Check {
            cost: 1,
            ..check(0)
        };
        let body = br#"{"results":[{"allowed":true,"granted":0,"remaining":15,"reset_ms":0,"retry_after_ms":0}]}"#;
        assert!(decode(body, &[peek]).is_some());
    }

    #[test]
    fn encodes_the_documented_request() {
        let body = String::from_utf8(encode(&[check(1)])).unwrap();
        assert_eq!(
            body,
            r#"{"checks":[{"key":"per-user/00000000000000ff","algorithm":"token_bucket","requests":100,"per_ms":60000,"burst":20,"cost":1,"take":1}]}"#
        );
    }

    #[test]
    fn decodes_answers_in_order() {
        let body = br#"{"results":[{"allowed":true,"granted":5,"remaining":15,"reset_ms":3000,"retry_after_ms":0}]}"#;
        let answers = decode(body, &[check(5)]).unwrap();
        assert_eq!(
            answers,
            [Answer {
                allowed: true,
                granted: 5,
                remaining: 15,
                reset_after: 3_000_000_000,
                retry_after: 0,
                delay: 0
            }]
        );
    }

    #[test]
    fn refuses_answers_that_do_not_fit_the_question() {
        let one = br#"{"results":[{"allowed":true,"granted":1,"remaining":0,"reset_ms":0,"retry_after_ms":0}]}"#;
        assert!(decode(one, &[check(1), check(1)]).is_none(), "too few");
        let greedy = br#"{"results":[{"allowed":true,"granted":9,"remaining":0,"reset_ms":0,"retry_after_ms":0}]}"#;
        assert!(decode(greedy, &[check(5)]).is_none(), "more than asked");
        let free = br#"{"results":[{"allowed":false,"granted":1,"remaining":0,"reset_ms":0,"retry_after_ms":9}]}"#;
        assert!(
            decode(free, &[check(1)]).is_none(),
            "a denial grants nothing"
        );
        assert!(decode(b"<html>", &[check(1)]).is_none());
    }

    #[test]
    fn per_is_whole_milliseconds() {
        assert_eq!(per_ms(60_000_000_000), 60_000);
        assert_eq!(per_ms(1), 1);
    }
}
