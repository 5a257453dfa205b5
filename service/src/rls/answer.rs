//! One `ShouldRateLimit` call without its I/O: `plan` validates the request, matches each
//! descriptor and turns its limits into store checks; `answer` turns the store's decisions into
//! the protocol's response (overall code, a status per descriptor, optional headers), what the
//! metrics count, and how long a leaky bucket holds the answer. The clock is injected.
//!
//! Every hit is charged, the refused ones too, as envoyproxy/ratelimit counts them: a limit's
//! checks carry a `debt` of one limit's worth (`Rate::debt`), so once over, a key stays over (and
//! `limit_remaining` is 0) until it has paid that back. A limit with `charge_refused: false`, a
//! leaky bucket, and hits a sliding log can never hold are refused without being charged: their
//! check only reads the counter.
//!
//! A concurrency limit counts slots in use: each hit takes one, and the negative hits of
//! Envoy's call when a stream is done (`is_negative_hits`) give them back; a slot whose −1 is
//! lost frees itself when its lease ends.
//!
//! A call's work is bounded whatever it asks: at most `MAX_DESCRIPTORS` descriptors of
//! `MAX_ENTRIES` entries, a check's cost at most what its limit can ever be charged
//! (`Algorithm::chargeable`), so a `hits_addend` of 2^64 - 1 is one bounded call, and at most
//! `MAX_LOG_ENTRIES` sorted-set members added (sliding-log entries and slots).

use std::borrow::Cow;
use std::collections::HashSet;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit, Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use sluice::config::HeaderStyle;
use sluice::output::headers::{each_rate_limit_header, retry_after_secs, Quota, QuotaUnit};

use sluice::core::key::HashSecret;

use crate::decision::check::{members_added, MAX_LOG_ENTRIES};
use crate::rules::config::{Config, Limit, Node, Rate, Rule, Unit};
use crate::rules::matching::{find, Entry, Match};
use crate::stores::{hashed_key_of, Algorithm, Check, Decision, Namespace, Slots};

/// The most descriptors one call may carry: Envoy sends one per `rate_limits` entry of a route
/// (a few); more is refused, as envoyproxy/ratelimit refuses what it cannot answer.
pub const MAX_DESCRIPTORS: usize = 64;
/// The most entries one descriptor may carry (one per action of its `rate_limits` entry).
pub const MAX_ENTRIES: usize = 32;

/// A request the protocol refuses, with envoyproxy/ratelimit's reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid(pub String);

/// What a request asks of the store, and what is needed to answer it afterwards.
#[derive(Debug)]
pub struct Plan<'c> {
    /// One per limit to decide, in order; empty when nothing is limited.
    pub checks: Vec<Check>,
    /// The domain is not in the configuration: every descriptor is answered OK.
    pub unknown_domain: bool,
    descriptors: Vec<Planned<'c>>,
}

#[derive(Debug)]
enum Planned<'c> {
    /// No configured limit applies (or every one was replaced).
    Free,
    Unlimited,
    Limited {
        hits: u64,
        limits: Vec<Applied<'c>>,
    },
}

#[derive(Debug)]
struct Applied<'c> {
    limit: Cow<'c, Limit>,
    /// Its check's index in `Plan::checks`.
    check: usize,
    /// The hits are more than the limit can ever admit and are not charged (`charge_refused:
    /// false`, a leaky bucket, a sliding log): refused, whatever the counter says (which the
    /// check only reads).
    beyond_capacity: bool,
    /// The metrics label with the request's values where the configuration asks for them.
    label: Cow<'c, str>,
}

/// What the metrics count for one limit of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tally<'p> {
    /// With request values when the configuration asks (`detailed_metric`, `value_to_metric`).
    pub label: &'p str,
    /// The label made of the configuration alone, for when request values must not be used.
    pub fallback: &'p str,
    pub hits: u64,
    pub over_limit: bool,
    pub shadow_mode: bool,
    /// Hits that took the count past 80% of the limit (envoyproxy/ratelimit's `near_limit`).
    pub near_limit: u64,
    /// The request's descriptor it is of, and its check's index in `Plan::checks`.
    pub descriptor: usize,
    pub check: usize,
    /// The limit's policy name (`Limit::policy`), for the top keys.
    pub policy: &'p str,
    /// Tokens the store took (for a refusal that owes, those charged).
    pub granted: u64,
}

/// The response, and what goes with it (the tallies borrow the plan's labels).
#[derive(Debug)]
pub struct Answer<'p> {
    pub response: RateLimitResponse,
    /// A leaky bucket's turn: how long to wait before answering OK.
    pub hold: Duration,
    pub tallies: Vec<Tally<'p>>,
}

/// An operator's override of a limit's key (its store key): the rate it runs at instead.
pub type Overrides<'o> = &'o dyn Fn(&str) -> Option<Rate>;

/// Validates `request` and matches each descriptor against `config`; keys are hashed under
/// `secret`, and a key `overrides` names runs at its override's rate.
pub fn plan<'c>(
    config: &'c Config,
    request: &RateLimitRequest,
    secret: &HashSecret,
    overrides: Overrides,
) -> Result<Plan<'c>, Invalid> {
    validate(request)?;
    let Some(root) = config.domain(&request.domain) else {
        let descriptors = request.descriptors.iter().map(|_| Planned::Free).collect();
        return Ok(Plan {
            checks: Vec::new(),
            unknown_domain: true,
            descriptors,
        });
    };
    let mut matched = Vec::with_capacity(request.descriptors.len());
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        matched.push(match_descriptor(config, root, descriptor, i)?);
    }
    let replaced: HashSet<&str> = (matched.iter().flatten())
        .flat_map(|m| m.limits.iter().flat_map(|l| l.replaces.iter()))
        .map(String::as_str)
        .collect();
    let mut checks = Vec::with_capacity(request.descriptors.len());
    let descriptors = (request.descriptors.iter().zip(&matched))
        .map(|(descriptor, matched)| {
            let hits = hits(request, descriptor);
            let keys = Keys {
                domain: &request.domain,
                secret,
                overrides,
            };
            planned(&keys, matched.as_ref(), &replaced, hits, &mut checks)
        })
        .collect();
    let entries = members_added(&checks);
    if entries > MAX_LOG_ENTRIES {
        return Err(Invalid(format!(
            "the sliding_log and concurrency limits of one call may take {MAX_LOG_ENTRIES} hits in all, got {entries}"
        )));
    }
    Ok(Plan {
        checks,
        unknown_domain: false,
        descriptors,
    })
}

/// What envoyproxy/ratelimit refuses, and what no call may exceed.
fn validate(request: &RateLimitRequest) -> Result<(), Invalid> {
    if request.domain.is_empty() {
        return Err(Invalid("rate limit domain must not be empty".into()));
    }
    let descriptors = request.descriptors.len();
    if descriptors == 0 {
        return Err(Invalid(
            "rate limit descriptor list must not be empty".into(),
        ));
    }
    if descriptors > MAX_DESCRIPTORS {
        return Err(Invalid(format!(
            "rate limit descriptor list must hold at most {MAX_DESCRIPTORS} descriptors, got {descriptors}"
        )));
    }
    let crowded =
        (request.descriptors.iter().enumerate()).find(|(_, d)| d.entries.len() > MAX_ENTRIES);
    match crowded {
        Some((i, descriptor)) => Err(Invalid(format!(
            "descriptors[{i}]: a descriptor may hold at most {MAX_ENTRIES} entries, got {}",
            descriptor.entries.len()
        ))),
        None => Ok(()),
    }
}

/// A descriptor's limits: the configured ones it matches, or the override Envoy sent with it.
#[derive(Debug)]
struct Matched<'c, 'r> {
    limits: Cow<'c, [Limit]>,
    /// Keys and values for the counters' store key (`matching::Match::counted`).
    counted: Vec<&'r str>,
    /// The configured descriptor matched, whose limits' metrics labels may take request values;
    /// `None` for an override, whose label is its own.
    found: Option<Match<'c, 'r>>,
}

impl<'c> Matched<'c, '_> {
    /// Each limit with its metrics label.
    fn labelled(&self) -> impl Iterator<Item = (Cow<'c, Limit>, Cow<'c, str>)> + '_ {
        let (configured, given) = match &self.limits {
            Cow::Borrowed(limits) => (*limits, &[][..]),
            Cow::Owned(limits) => (&[][..], limits.as_slice()),
        };
        let configured = configured.iter().map(|limit| {
            let label = match &self.found {
                Some(found) => found.label_of(limit),
                None => Cow::Borrowed(limit.label.as_str()),
            };
            (Cow::Borrowed(limit), label)
        });
        let given = (given.iter()).map(|limit| {
            let label = Cow::Owned(limit.label.clone());
            (Cow::Owned(limit.clone()), label)
        });
        configured.chain(given)
    }
}

fn match_descriptor<'c: 'r, 'r>(
    config: &Config,
    root: &'c Node,
    descriptor: &'r RateLimitDescriptor,
    index: usize,
) -> Result<Option<Matched<'c, 'r>>, Invalid> {
    let entries = (descriptor.entries.iter()).map(|e| Entry {
        key: &e.key,
        value: &e.value,
    });
    if let Some(limit) = &descriptor.limit {
        let at = format!("descriptors[{index}].limit");
        let entries: Vec<Entry> = entries.collect();
        return override_limit(config, &entries, limit.requests_per_unit, limit.unit, &at)
            .map(Some);
    }
    Ok(find(root, entries).map(|found| Matched {
        limits: Cow::Borrowed(&found.node.limits),
        counted: found.counted().collect(),
        found: Some(found),
    }))
}

/// envoyproxy/ratelimit's answer to a descriptor that carries its own limit (Envoy's
/// `limit` override from dynamic metadata): a fixed window of that unit, never in shadow mode,
/// every hit charged, counted under the descriptor's keys and values. Its numbers come from the request, so its
/// metrics label is the descriptor's keys alone, and a window longer than `--max-key-ttl` is
/// refused.
fn override_limit<'c, 'r>(
    config: &Config,
    entries: &[Entry<'r>],
    requests: u32,
    unit: i32,
    at: &str,
) -> Result<Matched<'c, 'r>, Invalid> {
    // envoy.type.v3.RateLimitUnit: 1 second .. 4 day, 5 month, 6 year, 7 week.
    let unit = match unit {
        1 => Unit::Second,
        2 => Unit::Minute,
        3 => Unit::Hour,
        4 => Unit::Day,
        5 => Unit::Month,
        6 => Unit::Year,
        7 => Unit::Week,
        other => {
            let reason = format!("{at}.unit: {other} is not a known unit");
            return Err(Invalid(reason));
        }
    };
    let window_ms = unit.window_ms().unwrap_or(1_000);
    let algorithm = Algorithm::FixedWindow {
        limit: u64::from(requests),
        window_us: window_ms * 1000,
    };
    (config.bounds.check_lifetime(&algorithm))
        .map_err(|reason| Invalid(format!("{at}.unit: {reason}")))?;
    let rate = Rate {
        algorithm,
        requests,
        window_ms,
        unit,
    };
    let keys: Vec<&str> = entries.iter().map(|e| e.key).collect();
    let limit = Limit {
        rule: Rule::Limited(rate),
        name: None,
        replaces: Vec::new(),
        shadow_mode: false,
        quota_mode: false,
        detailed_metric: false,
        charge_refused: true,
        label: keys.join("."),
        policy: "override".into(),
        identity: "override".into(),
    };
    Ok(Matched {
        limits: Cow::Owned(vec![limit]),
        counted: entries.iter().flat_map(|e| [e.key, e.value]).collect(),
        found: None,
    })
}

/// What a descriptor adds to its limits: its own `hits_addend` (0 allowed: only asks), else the
/// request's (0 means 1); with `is_negative_hits` (Envoy's call when a stream is done), that
/// many taken away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hits {
    count: u64,
    negative: bool,
}

impl Hits {
    /// The hits a limit is charged and the metrics count. Negative hits charge nothing and only
    /// ask: a window or bucket takes tokens and never gives them back, and asking writes
    /// nothing. (A concurrency limit gives slots back instead: `planned`.)
    fn charged(self) -> u64 {
        if self.negative {
            0
        } else {
            self.count
        }
    }
}

fn hits(request: &RateLimitRequest, descriptor: &RateLimitDescriptor) -> Hits {
    let count = match &descriptor.hits_addend {
        Some(own) => own.value,
        None => u64::from(request.hits_addend.max(1)),
    };
    Hits {
        count,
        negative: descriptor.is_negative_hits,
    }
}

/// What a call's store keys are made of: its domain, hashed under the operator's secret; and
/// the keys whose limits an operator overrode.
struct Keys<'r> {
    domain: &'r str,
    secret: &'r HashSecret,
    overrides: Overrides<'r>,
}

fn planned<'c>(
    keys: &Keys,
    matched: Option<&Matched<'c, '_>>,
    replaced: &HashSet<&str>,
    given: Hits,
    checks: &mut Vec<Check>,
) -> Planned<'c> {
    let hits = given.charged();
    let Some(matched) = matched else {
        return Planned::Free;
    };
    if matched.limits.iter().any(|l| l.rule == Rule::Unlimited) {
        return Planned::Unlimited;
    }
    let kept = (matched.labelled())
        .filter(|(l, _)| !l.name.as_deref().is_some_and(|n| replaced.contains(n)));
    let mut limits = Vec::new();
    for (limit, label) in kept {
        let Rule::Limited(rate) = &limit.rule else {
            continue;
        };
        let parts = [keys.domain, limit.identity.as_str()].into_iter();
        let parts = parts.chain(matched.counted.iter().copied());
        let key = hashed_key_of(keys.secret, parts.map(str::as_bytes));
        // An overridden limit's check decides its configured state (`Check::state_of`), so
        // the usage so far carries over to the override and back.
        let configured = rate.algorithm;
        let (limit, state_of) = match overridden(keys, &key, rate) {
            Some(rate) => {
                let mut owned = limit.into_owned();
                owned.rule = Rule::Limited(rate);
                (Cow::Owned(owned), Some(configured))
            }
            None => (limit, None),
        };
        let Rule::Limited(rate) = &limit.rule else {
            continue;
        };
        let (mut check, beyond_capacity) = match rate.algorithm {
            Algorithm::Concurrency { .. } if given.negative => (give_back(key, rate, given), false),
            _ => charge(key, rate, limit.charge_refused, hits),
        };
        check.state_of = state_of;
        checks.push(check);
        limits.push(Applied {
            label,
            limit,
            check: checks.len() - 1,
            beyond_capacity,
        });
    }
    if limits.is_empty() {
        Planned::Free
    } else {
        Planned::Limited { hits, limits }
    }
}

/// The override of `key`, if it is of the configured rate's algorithm (one of another is left
/// alone, as `/v1/check` leaves it).
fn overridden(keys: &Keys, key: &str, configured: &Rate) -> Option<Rate> {
    let rate = (keys.overrides)(key)?;
    (rate.algorithm.kind() == configured.algorithm.kind()).then_some(rate)
}

/// The check that charges `hits` to a limit, and whether they are beyond its capacity (then it
/// only reads).
fn charge(key: String, rate: &Rate, charge_refused: bool, hits: u64) -> (Check, bool) {
    let debt = rate.debt(charge_refused);
    let beyond_capacity = hits > rate.capacity() && (debt == 0 || holds_each_hit(rate));
    let (cost, debt) = if beyond_capacity {
        (0, 0)
    } else {
        (hits.min(rate.algorithm.chargeable(debt)), debt)
    };
    let check = Check {
        namespace: Namespace::Rls,
        key,
        algorithm: rate.algorithm,
        cost,
        take: cost,
        debt,
        slots: Slots::Anonymous,
        state_of: None,
    };
    (check, beyond_capacity)
}

/// A concurrency limit's negative hits: that many slots given back, the ones that expire
/// soonest (more than the limit holds give back every slot).
fn give_back(key: String, rate: &Rate, hits: Hits) -> Check {
    Check {
        namespace: Namespace::Rls,
        key,
        algorithm: rate.algorithm,
        cost: 0,
        take: hits.count.min(rate.capacity()),
        debt: 0,
        slots: Slots::GiveBack,
        state_of: None,
    }
}

/// A sliding log keeps an entry per hit: hits it can never admit are not logged, so that a
/// call's entries stay within `MAX_LOG_ENTRIES` however many hits it asks for.
fn holds_each_hit(rate: &Rate) -> bool {
    matches!(rate.algorithm, Algorithm::SlidingLog { .. })
}

impl Plan<'_> {
    /// `--stop-cache-key-increment-when-overlimit`'s first round trip: every check at its cost,
    /// taking and owing nothing, so the scripts only read, to learn which limits this call would
    /// take over. A leaky bucket's admission does not depend on the cost: it is asked at 0.
    pub fn peeks(&self) -> Vec<Check> {
        (self.checks.iter())
            .map(|check| Check {
                cost: match check.algorithm {
                    Algorithm::LeakyBucket { .. } => 0,
                    _ => check.cost,
                },
                take: 0,
                debt: 0,
                ..check.clone()
            })
            .collect()
    }

    /// The second: if some limits would go over (their peek refused, or hits they can never
    /// admit), only those are charged and the call's other limits only read, as
    /// envoyproxy/ratelimit increments only the keys that reach their limit; otherwise every
    /// check as planned.
    pub fn stopping_increments(&self, peeks: &[Decision]) -> Vec<Check> {
        let beyond = self.beyond_capacity();
        let over: Vec<bool> = (0..self.checks.len())
            .map(|i| beyond.contains(&i) || peeks.get(i).is_some_and(|peek| !peek.allowed))
            .collect();
        if !over.contains(&true) {
            return self.checks.clone();
        }
        (self.checks.iter().zip(over))
            .map(|(check, over)| match over {
                true => check.clone(),
                false => Check {
                    cost: 0,
                    take: 0,
                    debt: 0,
                    ..check.clone()
                },
            })
            .collect()
    }

    /// The checks whose hits their limit can never admit.
    fn beyond_capacity(&self) -> Vec<usize> {
        (self.descriptors.iter())
            .flat_map(|planned| match planned {
                Planned::Limited { limits, .. } => limits.as_slice(),
                _ => &[],
            })
            .filter(|applied| applied.beyond_capacity)
            .map(|applied| applied.check)
            .collect()
    }
}

/// How a decided limit came out.
struct Outcome<'a, 'c> {
    applied: &'a Applied<'c>,
    rate: &'a Rate,
    decision: Decision,
}

impl Outcome<'_, '_> {
    /// Denied and not in shadow mode: this limit refuses the request.
    fn refuses(&self) -> bool {
        !self.decision.allowed && !self.applied.limit.shadow_mode
    }

    /// For a denial, until the request would pass; else until the limit is back to its best.
    /// Nobody knows when a slot frees, so a concurrency limit gives until its newest slot's
    /// lease ends (when every slot is free at the latest, if none is renewed), either way.
    fn until_reset_us(&self) -> u64 {
        if self.decision.allowed || !self.knows_retry() {
            self.decision.reset_us
        } else {
            self.decision.retry_after_us
        }
    }

    /// Whether a denial says when to retry: all but concurrency.
    fn knows_retry(&self) -> bool {
        !matches!(self.rate.algorithm, Algorithm::Concurrency { .. })
    }
}

/// Builds the response from the store's `decisions` (one per `plan.checks`, in order).
/// `now_ns` is Unix time in nanoseconds, for the legacy reset header.
pub fn answer<'p>(
    plan: &'p Plan,
    decisions: &[Decision],
    style: HeaderStyle,
    now_ns: u64,
) -> Answer<'p> {
    let mut statuses = Vec::with_capacity(plan.descriptors.len());
    let mut outcomes = Vec::with_capacity(plan.checks.len());
    let mut tallies = Vec::with_capacity(plan.checks.len());
    for (index, planned) in plan.descriptors.iter().enumerate() {
        let status = match planned {
            Planned::Free => DescriptorStatus {
                code: Code::Ok.into(),
                ..Default::default()
            },
            Planned::Unlimited => DescriptorStatus {
                code: Code::Ok.into(),
                limit_remaining: u32::MAX,
                ..Default::default()
            },
            Planned::Limited { hits, limits } => {
                let first = outcomes.len();
                outcomes.extend(decide(limits, decisions));
                let decided = outcomes.get(first..).unwrap_or_default();
                tallies.extend(decided.iter().map(|o| tally(o, *hits, index)));
                descriptor_status(decided)
            }
        };
        statuses.push(status);
    }
    let over = overall_over(&outcomes);
    let response = RateLimitResponse {
        overall_code: if over { Code::OverLimit } else { Code::Ok }.into(),
        statuses,
        response_headers_to_add: headers(&outcomes, over, style, now_ns),
        ..Default::default()
    };
    let hold = if over {
        Duration::ZERO
    } else {
        hold(&outcomes)
    };
    Answer {
        response,
        hold,
        tallies,
    }
}

fn decide<'a, 'c, 'd>(
    limits: &'a [Applied<'c>],
    decisions: &'d [Decision],
) -> impl Iterator<Item = Outcome<'a, 'c>> + use<'a, 'c, 'd> {
    limits.iter().filter_map(|applied| {
        let Rule::Limited(rate) = &applied.limit.rule else {
            return None;
        };
        let mut decision = *decisions.get(applied.check)?;
        if applied.beyond_capacity {
            decision = beyond_capacity(decision, rate);
        }
        Some(Outcome {
            applied,
            rate,
            decision,
        })
    })
}

/// What the counter said, as a refusal: nothing taken, nothing held. The hits never fit, so the
/// wait given is until the limit is back to its best, or a window when it is there already.
fn beyond_capacity(read: Decision, rate: &Rate) -> Decision {
    let window_us = rate.window_ms.saturating_mul(1000);
    Decision {
        allowed: false,
        granted: 0,
        retry_after_us: if read.reset_us > 0 {
            read.reset_us
        } else {
            window_us
        },
        delay_us: read.delay_us.map(|_| 0),
        ..read
    }
}

/// The descriptor is over its limit if one of its limits refuses; it reports that limit, else
/// the one with the fewest requests remaining.
fn descriptor_status(outcomes: &[Outcome]) -> DescriptorStatus {
    let reported = (outcomes.iter().find(|o| o.refuses()))
        .or_else(|| outcomes.iter().min_by_key(|o| o.decision.remaining));
    let Some(outcome) = reported else {
        return DescriptorStatus {
            code: Code::Ok.into(),
            ..Default::default()
        };
    };
    let limit = &outcome.applied.limit;
    DescriptorStatus {
        code: if outcome.refuses() {
            Code::OverLimit
        } else {
            Code::Ok
        }
        .into(),
        current_limit: Some(RateLimit {
            name: limit.name.clone().unwrap_or_default(),
            requests_per_unit: outcome.rate.requests,
            unit: proto_unit(outcome.rate.unit).into(),
        }),
        limit_remaining: u32::try_from(outcome.decision.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(proto_duration(outcome.until_reset_us())),
        quota: None,
    }
}

/// OVER_LIMIT if a limit refuses, except that limits in quota mode refuse only all together.
fn overall_over(outcomes: &[Outcome]) -> bool {
    let (quota, enforced): (Vec<&Outcome>, Vec<&Outcome>) =
        outcomes.iter().partition(|o| o.applied.limit.quota_mode);
    enforced.iter().any(|o| o.refuses()) || (!quota.is_empty() && quota.iter().all(|o| o.refuses()))
}

/// The rate-limit headers of the limit that refused, else of the one with the fewest requests
/// remaining (limits in shadow mode never add headers), and `retry-after` on a refusal.
fn headers(outcomes: &[Outcome], over: bool, style: HeaderStyle, now_ns: u64) -> Vec<HeaderValue> {
    let mut headers = Vec::new();
    if style == HeaderStyle::None {
        return headers;
    }
    let reported = if over {
        outcomes.iter().find(|o| o.refuses())
    } else {
        (outcomes.iter().filter(|o| !o.applied.limit.shadow_mode))
            .min_by_key(|o| o.decision.remaining)
    };
    let Some(outcome) = reported else {
        return headers;
    };
    let decision = &outcome.decision;
    let retry_after = decision.retry_after_us.saturating_mul(1000);
    let quota = Quota {
        policy: &outcome.applied.limit.policy,
        limit: outcome.rate.capacity(),
        requests: u64::from(outcome.rate.requests),
        per_nanos: outcome.rate.window_ms.saturating_mul(1_000_000),
        remaining: decision.remaining,
        reset_after: decision.reset_us.saturating_mul(1000),
        retry_after: (!decision.allowed && outcome.knows_retry()).then_some(retry_after),
        unit: QuotaUnit::Requests,
    };
    let mut add = |key: &str, value: &str| {
        headers.push(HeaderValue {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        });
    };
    each_rate_limit_header(style, &quota, &[], now_ns, &mut add);
    if over && outcome.knows_retry() {
        add("retry-after", &retry_after_secs(retry_after).to_string());
    }
    headers
}

/// The longest turn among the admitting leaky buckets that enforce.
fn hold(outcomes: &[Outcome]) -> Duration {
    (outcomes.iter())
        .filter(|o| !o.applied.limit.shadow_mode)
        .filter_map(|o| o.decision.delay_us)
        .max()
        .map_or(Duration::ZERO, Duration::from_micros)
}

fn tally<'p>(outcome: &Outcome<'p, '_>, hits: u64, descriptor: usize) -> Tally<'p> {
    let (decision, rate) = (&outcome.decision, outcome.rate);
    let capacity = rate.capacity();
    let used = capacity.saturating_sub(decision.remaining);
    let threshold = capacity * 4 / 5;
    let near_limit = if decision.allowed && used > threshold {
        hits.min(used - threshold)
    } else {
        0
    };
    Tally {
        label: &outcome.applied.label,
        fallback: &outcome.applied.limit.label,
        hits,
        over_limit: !decision.allowed,
        shadow_mode: !decision.allowed && outcome.applied.limit.shadow_mode,
        near_limit,
        descriptor,
        check: outcome.applied.check,
        policy: &outcome.applied.limit.policy,
        granted: decision.granted,
    }
}

fn proto_unit(unit: Unit) -> rate_limit::Unit {
    match unit {
        Unit::Unknown => rate_limit::Unit::Unknown,
        Unit::Second => rate_limit::Unit::Second,
        Unit::Minute => rate_limit::Unit::Minute,
        Unit::Hour => rate_limit::Unit::Hour,
        Unit::Day => rate_limit::Unit::Day,
        Unit::Week => rate_limit::Unit::Week,
        Unit::Month => rate_limit::Unit::Month,
        Unit::Year => rate_limit::Unit::Year,
    }
}

/// Rounded up to whole milliseconds, as the store's durations are everywhere else.
fn proto_duration(us: u64) -> ProtoDuration {
    let ms = us.div_ceil(1000);
    ProtoDuration {
        seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
        nanos: i32::try_from(ms % 1000 * 1_000_000).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::check::Bounds;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry as ProtoEntry, RateLimitOverride,
    };
    use envoy_types::pb::google::protobuf::UInt64Value;
    use std::path::PathBuf;

    const CONFIG: &str = "domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10, name: per_user}
  - key: user
    rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 2, burst: 4}
  - key: vip
    rate_limit: {unit: minute, requests_per_unit: 100, replaces: [{name: per_user}]}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: internal
    rate_limit: {unlimited: true}
  - key: quota_a
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: quota_b
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: shaped
    rate_limit: {algorithm: leaky_bucket, unit: second, requests_per_unit: 10, max_delay: 500ms}
  - key: strict
    rate_limit: {unit: minute, requests_per_unit: 10, charge_refused: false}
  - key: logged
    rate_limit: {algorithm: sliding_log, unit: minute, requests_per_unit: 10}
  - key: streams
    rate_limit: {algorithm: concurrency, requests_per_unit: 3}
";

    fn config() -> Config {
        let files = [(PathBuf::from("d.yaml"), CONFIG.to_string())];
        Config::from_files(&files, &Bounds::default()).unwrap()
    }

    /// Keys hashed under the public secret.
    fn plan_public<'c>(
        config: &'c Config,
        request: &RateLimitRequest,
    ) -> Result<Plan<'c>, Invalid> {
        plan(config, request, &HashSecret::PUBLIC, &|_| None)
    }

    fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: (entries.iter())
                .map(|&(key, value)| ProtoEntry {
                    key: key.into(),
                    value: value.into(),
                })
                .collect(),
            ..Default::default()
        }
    }

    fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
        RateLimitRequest {
            domain: "d".into(),
            descriptors,
            hits_addend: 0,
        }
    }

    fn allowed(remaining: u64) -> Decision {
        Decision {
            allowed: true,
            granted: 1,
            remaining,
            reset_us: 1_500_000,
            retry_after_us: 0,
            delay_us: None,
        }
    }

    fn denied() -> Decision {
        Decision {
            allowed: false,
            granted: 0,
            remaining: 0,
            retry_after_us: 2_000_001,
            ..allowed(0)
        }
    }

    fn codes(answer: &Answer) -> Vec<Code> {
        let statuses = &answer.response.statuses;
        statuses
            .iter()
            .map(|s| Code::try_from(s.code).unwrap())
            .collect()
    }

    fn overall(answer: &Answer) -> Code {
        Code::try_from(answer.response.overall_code).unwrap()
    }

    #[test]
    fn negative_hits_give_a_concurrency_limits_slots_back_and_only_ask_a_window() {
        let config = config();
        let negative = |key: &str, hits: u64| {
            let mut one = descriptor(&[(key, "a")]);
            one.hits_addend = Some(UInt64Value { value: hits });
            one.is_negative_hits = true;
            one
        };
        let call = request(vec![negative("streams", 5), negative("strict", 5)]);
        let plan = plan_public(&config, &call).unwrap();
        let ops: Vec<(u64, u64, &Slots)> = (plan.checks.iter())
            .map(|c| (c.cost, c.take, &c.slots))
            .collect();
        assert_eq!(
            ops,
            [(0, 3, &Slots::GiveBack), (0, 0, &Slots::Anonymous)],
            "every slot of three at most; the window only asked"
        );
        let taking = request(vec![descriptor(&[("streams", "a")])]);
        let check = &plan_public(&config, &taking).unwrap().checks[0];
        assert_eq!((check.cost, check.take, check.debt), (1, 1, 0));
    }

    #[test]
    fn a_refused_slot_says_no_retry_and_resets_when_the_newest_lease_ends() {
        let config = config();
        let call = request(vec![descriptor(&[("streams", "a")])]);
        let plan = plan_public(&config, &call).unwrap();
        let refused = Decision {
            retry_after_us: 0,
            reset_us: 4_000_000,
            ..denied()
        };
        let answer = answer(&plan, &[refused], HeaderStyle::Both, 0);
        let status = &answer.response.statuses[0];
        assert_eq!(status.duration_until_reset.unwrap().seconds, 4);
        let headers = &answer.response.response_headers_to_add;
        assert!(
            headers.iter().all(|h| h.key != "retry-after"),
            "{headers:?}"
        );
    }

    #[test]
    fn empty_domains_and_descriptor_lists_are_refused_as_envoyproxy_ratelimit_does() {
        let config = config();
        let no_domain = RateLimitRequest {
            domain: String::new(),
            ..request(vec![descriptor(&[("user", "a")])])
        };
        assert_eq!(
            plan_public(&config, &no_domain).unwrap_err().0,
            "rate limit domain must not be empty"
        );
        let none = request(Vec::new());
        assert_eq!(
            plan_public(&config, &none).unwrap_err().0,
            "rate limit descriptor list must not be empty"
        );
    }

    #[test]
    fn an_unknown_domain_or_descriptor_is_answered_ok_without_asking_the_store() {
        let config = config();
        let unknown = RateLimitRequest {
            domain: "other".into(),
            ..request(vec![descriptor(&[("user", "a")])])
        };
        let plan_unknown = plan_public(&config, &unknown).unwrap();
        assert!(plan_unknown.unknown_domain && plan_unknown.checks.is_empty());
        let unmatched =
            plan_public(&config, &request(vec![descriptor(&[("nobody", "a")])])).unwrap();
        assert!(unmatched.checks.is_empty());
        let answer = answer(&unmatched, &[], HeaderStyle::Both, 0);
        assert_eq!(
            (overall(&answer), codes(&answer)),
            (Code::Ok, vec![Code::Ok])
        );
        assert_eq!(answer.response.statuses[0].current_limit, None);
        assert!(answer.response.response_headers_to_add.is_empty());
    }

    #[test]
    fn a_descriptor_over_any_of_its_limits_makes_the_answer_over_limit() {
        let config = config();
        let plan = plan_public(&config, &request(vec![descriptor(&[("user", "a")])])).unwrap();
        assert_eq!(plan.checks.len(), 2);
        let keys: Vec<String> = plan.checks.iter().map(crate::stores::state_key).collect();
        assert_ne!(keys[0], keys[1]);
        let answer = answer(&plan, &[allowed(7), denied()], HeaderStyle::None, 0);
        assert_eq!(
            (overall(&answer), codes(&answer)),
            (Code::OverLimit, vec![Code::OverLimit])
        );
        let status = &answer.response.statuses[0];
        let limit = status.current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (2, rate_limit::Unit::Second.into())
        );
        let until = status.duration_until_reset.unwrap();
        assert_eq!((until.seconds, until.nanos), (2, 1_000_000));
    }

    #[test]
    fn an_allowed_descriptor_reports_its_limit_with_the_fewest_remaining() {
        let config = config();
        let plan = plan_public(&config, &request(vec![descriptor(&[("user", "a")])])).unwrap();
        let answer = answer(&plan, &[allowed(7), allowed(3)], HeaderStyle::None, 0);
        let status = &answer.response.statuses[0];
        assert_eq!((overall(&answer), status.limit_remaining), (Code::Ok, 3));
        let until = status.duration_until_reset.unwrap();
        assert_eq!((until.seconds, until.nanos), (1, 500_000_000));
    }

    #[test]
    fn replaces_drops_the_named_limit_from_the_request() {
        let config = config();
        let both = request(vec![
            descriptor(&[("user", "a")]),
            descriptor(&[("vip", "a")]),
        ]);
        let plan = plan_public(&config, &both).unwrap();
        // The user's per_user limit is replaced; its token bucket and the vip limit stay.
        assert_eq!(plan.checks.len(), 2);
        let per_user = Algorithm::FixedWindow {
            limit: 10,
            window_us: 60_000_000,
        };
        assert!(plan.checks.iter().all(|c| c.algorithm != per_user));
    }

    #[test]
    fn shadow_mode_counts_but_answers_ok_and_unlimited_answers_the_most_remaining() {
        let config = config();
        let both = request(vec![
            descriptor(&[("trial", "a")]),
            descriptor(&[("internal", "a")]),
        ]);
        let plan = plan_public(&config, &both).unwrap();
        assert_eq!(plan.checks.len(), 1);
        let answer = answer(&plan, &[denied()], HeaderStyle::Both, 0);
        assert_eq!(
            (overall(&answer), codes(&answer)),
            (Code::Ok, vec![Code::Ok, Code::Ok])
        );
        assert_eq!(answer.response.statuses[1].limit_remaining, u32::MAX);
        assert!(answer.response.response_headers_to_add.is_empty());
        let tally = &answer.tallies[0];
        assert!(tally.over_limit && tally.shadow_mode);
    }

    #[test]
    fn quota_mode_limits_refuse_only_when_all_of_them_are_over() {
        let config = config();
        let quotas = request(vec![
            descriptor(&[("quota_a", "x")]),
            descriptor(&[("quota_b", "x")]),
        ]);
        let plan = plan_public(&config, &quotas).unwrap();
        let one = answer(&plan, &[denied(), allowed(1)], HeaderStyle::None, 0);
        assert_eq!(
            (overall(&one), codes(&one)),
            (Code::Ok, vec![Code::OverLimit, Code::Ok])
        );
        let both = answer(&plan, &[denied(), denied()], HeaderStyle::None, 0);
        assert_eq!(overall(&both), Code::OverLimit);
    }

    fn costs(plan: &Plan) -> Vec<(u64, u64)> {
        plan.checks.iter().map(|c| (c.cost, c.debt)).collect()
    }

    #[test]
    fn every_hit_is_charged_the_key_owing_up_to_one_limits_worth() {
        let config = config();
        let mut heavy = request(vec![descriptor(&[("user", "a")])]);
        heavy.hits_addend = 5;
        // 10 a minute and a bucket of 4: each may owe its capacity.
        assert_eq!(
            costs(&plan_public(&config, &heavy).unwrap()),
            [(5, 10), (5, 4)]
        );
        heavy.hits_addend = 11;
        assert_eq!(
            costs(&plan_public(&config, &heavy).unwrap()),
            [(11, 10), (8, 4)]
        );
        heavy.hits_addend = u32::MAX;
        let plan = plan_public(&config, &heavy).unwrap();
        assert_eq!(
            costs(&plan),
            [(20, 10), (8, 4)],
            "never more than can be charged"
        );
        let charged = Decision {
            granted: 20,
            ..denied()
        };
        let answer = answer(&plan, &[charged, allowed(4)], HeaderStyle::None, 0);
        let status = &answer.response.statuses[0];
        assert_eq!(
            (overall(&answer), status.limit_remaining),
            (Code::OverLimit, 0)
        );
        let mut asking = descriptor(&[("user", "a")]);
        asking.hits_addend = Some(UInt64Value { value: 0 });
        let plan = plan_public(&config, &request(vec![asking])).unwrap();
        assert_eq!(costs(&plan), [(0, 10), (0, 4)], "only asks");
        let mut refund = descriptor(&[("user", "a")]);
        refund.hits_addend = Some(UInt64Value { value: 4 });
        refund.is_negative_hits = true;
        let refunding = plan_public(&config, &request(vec![refund])).unwrap();
        assert_eq!(refunding.checks[0].cost, 0, "tokens are never given back");
    }

    #[test]
    fn with_charge_refused_false_hits_beyond_a_limit_are_refused_and_only_read() {
        let config = config();
        let mut heavy = request(vec![descriptor(&[("strict", "a")])]);
        heavy.hits_addend = 5;
        assert_eq!(costs(&plan_public(&config, &heavy).unwrap()), [(5, 0)]);
        heavy.hits_addend = 11;
        let plan = plan_public(&config, &heavy).unwrap();
        assert_eq!(costs(&plan), [(0, 0)]);
        let answer = answer(&plan, &[allowed(10)], HeaderStyle::None, 0);
        assert_eq!(
            (overall(&answer), codes(&answer)),
            (Code::OverLimit, vec![Code::OverLimit])
        );
        let status = &answer.response.statuses[0];
        assert_eq!(status.limit_remaining, 10, "what the counter holds");
        let until = status.duration_until_reset.unwrap();
        assert_eq!(
            (until.seconds, until.nanos),
            (1, 500_000_000),
            "until its best"
        );
        let fresh = Decision {
            reset_us: 0,
            ..allowed(10)
        };
        let at_best = super::answer(&plan, &[fresh], HeaderStyle::None, 0);
        let until = at_best.response.statuses[0].duration_until_reset.unwrap();
        assert_eq!(
            (until.seconds, until.nanos),
            (60, 0),
            "a window when at its best"
        );
    }

    #[test]
    fn a_sliding_log_logs_no_hits_beyond_what_it_holds() {
        let config = config();
        let mut heavy = request(vec![descriptor(&[("logged", "a")])]);
        heavy.hits_addend = 10;
        assert_eq!(costs(&plan_public(&config, &heavy).unwrap()), [(10, 10)]);
        heavy.hits_addend = 11;
        assert_eq!(costs(&plan_public(&config, &heavy).unwrap()), [(0, 0)]);
    }

    #[test]
    fn stopping_increments_charges_only_the_limits_a_call_takes_over() {
        let config = config();
        let both = request(vec![
            descriptor(&[("quota_a", "x")]),
            descriptor(&[("strict", "x")]),
        ]);
        let plan = plan_public(&config, &both).unwrap();
        let peeks = plan.peeks();
        assert!(peeks
            .iter()
            .all(|c| c.take == 0 && c.debt == 0 && c.cost == 1));
        assert_eq!(
            plan.stopping_increments(&[allowed(3), allowed(3)]),
            plan.checks
        );
        let second_over = plan.stopping_increments(&[allowed(3), denied()]);
        assert_eq!(costs_of(&second_over), [(0, 0), (1, 0)]);
        let mut flood = both.clone();
        flood.hits_addend = 11;
        let plan = plan_public(&config, &flood).unwrap();
        let beyond = plan.stopping_increments(&[allowed(0), allowed(10)]);
        assert_eq!(
            costs_of(&beyond),
            [(0, 0), (0, 0)],
            "strict can never hold 11"
        );
    }

    fn costs_of(checks: &[Check]) -> Vec<(u64, u64)> {
        checks.iter().map(|c| (c.cost, c.debt)).collect()
    }

    #[test]
    fn a_leaky_bucket_refuses_hits_beyond_its_queue_and_holds_nothing() {
        let config = config();
        let mut flood = request(vec![descriptor(&[("shaped", "a")])]);
        flood.descriptors[0].hits_addend = Some(UInt64Value { value: u64::MAX });
        let plan = plan_public(&config, &flood).unwrap();
        assert_eq!(plan.checks[0].cost, 0, "only reads");
        let read = Decision {
            delay_us: Some(0),
            ..allowed(6)
        };
        let answer = answer(&plan, &[read], HeaderStyle::None, 0);
        assert_eq!(overall(&answer), Code::OverLimit);
        assert_eq!(answer.hold, Duration::ZERO);
        assert_eq!(answer.tallies[0].hits, u64::MAX);
        flood.descriptors[0].hits_addend = Some(UInt64Value { value: 6 });
        assert_eq!(plan_public(&config, &flood).unwrap().checks[0].cost, 6);
    }

    #[test]
    fn calls_past_the_descriptor_or_entry_caps_are_refused() {
        let config = config();
        let many = vec![descriptor(&[("user", "a")]); MAX_DESCRIPTORS + 1];
        assert_eq!(
            plan_public(&config, &request(many)).unwrap_err().0,
            "rate limit descriptor list must hold at most 64 descriptors, got 65"
        );
        let fits = vec![descriptor(&[("user", "a")]); MAX_DESCRIPTORS];
        assert!(plan_public(&config, &request(fits)).is_ok());
        let entries = vec![("user", "a"); MAX_ENTRIES + 1];
        let wide = request(vec![descriptor(&[("user", "a")]), descriptor(&entries)]);
        assert_eq!(
            plan_public(&config, &wide).unwrap_err().0,
            "descriptors[1]: a descriptor may hold at most 32 entries, got 33"
        );
    }

    #[test]
    fn a_limit_of_zero_says_so_in_every_header() {
        let files = [(
            PathBuf::from("d.yaml"),
            "domain: d\ndescriptors:\n  - key: blocked\n    rate_limit: {unit: minute, requests_per_unit: 0}\n"
                .to_string(),
        )];
        let config = Config::from_files(&files, &Bounds::default()).unwrap();
        let plan = plan_public(&config, &request(vec![descriptor(&[("blocked", "x")])])).unwrap();
        let refused = Decision {
            reset_us: 30_000_000,
            retry_after_us: 30_000_000,
            ..denied()
        };
        let answer = answer(&plan, &[refused], HeaderStyle::Both, 0);
        let headers: Vec<(&str, &str)> = (answer.response.response_headers_to_add.iter())
            .map(|h| (h.key.as_str(), h.value.as_str()))
            .collect();
        assert_eq!(
            headers,
            [
                ("x-ratelimit-limit", "0"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "30"),
                ("ratelimit-policy", "\"blocked\";q=0;w=60"),
                ("ratelimit", "\"blocked\";r=0;t=30"),
                ("retry-after", "30"),
            ]
        );
    }

    #[test]
    fn the_headers_are_the_refusing_limits_with_retry_after() {
        let config = config();
        let plan = plan_public(&config, &request(vec![descriptor(&[("user", "a")])])).unwrap();
        let now = 1_700_000_000 * 1_000_000_000;
        // The token bucket refuses: 2 a second with a burst of 4 is a quota of 4 in 2 s; `t` is
        // the wait, as retry-after.
        let answer = answer(&plan, &[allowed(7), denied()], HeaderStyle::Both, now);
        let headers: Vec<(&str, &str)> = (answer.response.response_headers_to_add.iter())
            .map(|h| (h.key.as_str(), h.value.as_str()))
            .collect();
        assert_eq!(
            headers,
            [
                ("x-ratelimit-limit", "4"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "1700000002"),
                ("ratelimit-policy", "\"user_2\";q=4;w=2"),
                ("ratelimit", "\"user_2\";r=0;t=3"),
                ("retry-after", "3"),
            ]
        );
    }

    #[test]
    fn a_leaky_bucket_holds_an_allowed_answer_for_its_turn() {
        let config = config();
        let plan = plan_public(&config, &request(vec![descriptor(&[("shaped", "a")])])).unwrap();
        let turn = Decision {
            delay_us: Some(200_000),
            ..allowed(3)
        };
        assert_eq!(
            answer(&plan, &[turn], HeaderStyle::None, 0).hold,
            Duration::from_millis(200)
        );
    }

    #[test]
    fn a_limit_sent_with_the_descriptor_overrides_the_configuration() {
        let config = config();
        let mut overridden = descriptor(&[("user", "a")]);
        overridden.limit = Some(RateLimitOverride {
            requests_per_unit: 42,
            unit: 2,
        });
        let plan = plan_public(&config, &request(vec![overridden])).unwrap();
        let expected = Algorithm::FixedWindow {
            limit: 42,
            window_us: 60_000_000,
        };
        assert_eq!(
            plan.checks.iter().map(|c| c.algorithm).collect::<Vec<_>>(),
            [expected]
        );
        let mut unknown_unit = descriptor(&[("user", "a")]);
        unknown_unit.limit = Some(RateLimitOverride {
            requests_per_unit: 1,
            unit: 0,
        });
        let refused = plan_public(&config, &request(vec![unknown_unit])).unwrap_err();
        assert_eq!(
            refused.0,
            "descriptors[0].limit.unit: 0 is not a known unit"
        );
        let mut yearly = descriptor(&[("user", "a")]);
        yearly.limit = Some(RateLimitOverride {
            requests_per_unit: 1,
            unit: 6,
        });
        let refused = plan_public(&config, &request(vec![yearly])).unwrap_err();
        assert_eq!(
            refused.0,
            "descriptors[0].limit.unit: its key would live 365d, more than --max-key-ttl 62d"
        );
    }

    #[test]
    fn an_operators_override_of_a_key_runs_it_at_its_own_rate_deciding_the_configured_state() {
        let config = config();
        let call = request(vec![descriptor(&[("user", "a")])]);
        let keys: Vec<String> = (plan_public(&config, &call).unwrap().checks.iter())
            .map(|c| c.key.clone())
            .collect();
        let window = Algorithm::FixedWindow {
            limit: 1_000,
            window_us: 60_000_000,
        };
        // The first limit's key (10 a minute, a window) is overridden; a token bucket offered
        // for the second limit's key (a token bucket) too, a window for a bucket is left alone.
        let overrides = |key: &str| {
            (key == keys[0] || key == keys[1]).then(|| Rate::overridden(window, 1_000, 60_000))
        };
        let plan = plan(&config, &call, &HashSecret::PUBLIC, &overrides).unwrap();
        let configured = Algorithm::FixedWindow {
            limit: 10,
            window_us: 60_000_000,
        };
        let first = &plan.checks[0];
        assert_eq!(
            (first.algorithm, first.state_of, first.cost, first.debt),
            (window, Some(configured), 1, 1_000),
            "the override's numbers; the usage of the configured window carries over"
        );
        assert_eq!(plan.checks[1].state_of, None);
        let answer = answer(&plan, &[denied(), allowed(7)], HeaderStyle::None, 0);
        let limit = answer.response.statuses[0].current_limit.clone().unwrap();
        assert_eq!(
            (overall(&answer), limit.requests_per_unit, limit.unit),
            (Code::OverLimit, 1_000, rate_limit::Unit::Minute.into()),
            "the refusal names the overridden limit"
        );
    }

    #[test]
    fn an_overrides_metrics_label_holds_no_request_value() {
        let config = config();
        let mut overridden = descriptor(&[("user", &"x".repeat(10_000))]);
        overridden.limit = Some(RateLimitOverride {
            requests_per_unit: 42,
            unit: 2,
        });
        let plan = plan_public(&config, &request(vec![overridden])).unwrap();
        let answer = answer(&plan, &[allowed(41)], HeaderStyle::None, 0);
        assert_eq!(answer.tallies[0].label, "user");
        assert_eq!(answer.tallies[0].fallback, "user");
    }

    #[test]
    fn near_limit_counts_the_hits_past_eighty_percent() {
        let config = config();
        let mut heavy = request(vec![descriptor(&[("user", "a")])]);
        heavy.hits_addend = 3;
        let plan = plan_public(&config, &heavy).unwrap();
        // 10 per minute: 9 used after this call, 8 is the threshold.
        let answer = answer(&plan, &[allowed(1), allowed(4)], HeaderStyle::None, 0);
        assert_eq!(answer.tallies[0].near_limit, 1);
        assert_eq!(answer.tallies[0].hits, 3);
        assert_eq!(answer.tallies[0].label, "user");
        assert_eq!(answer.tallies[1].label, "user#2");
    }
}
