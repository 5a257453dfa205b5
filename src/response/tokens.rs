//! A metered policy's reservation, settled against what the response used. The usage is read as
//! the response passes: from its body (JSON or server-sent events, `usage::Scanner`) or from a
//! header or trailer. When the request ends, the difference between what it used and what it
//! reserved is charged (past the limit, into a bounded debt) or given back; a usage that never
//! came (the stream cut, the upstream failed, a body without usage or with nonsense in it) is
//! charged as the policy's `on_unknown` says.
//!
//! What the body said is published for the access log (`usage_text`, `sluice.usage`), as
//! counts rather than a charge: `sluice-replay` prices them by the meter and `on_unknown` of the
//! configuration it replays (`cost`, `charge_of`, `settle_op`: the same code as here), which
//! need not be the one that wrote the log.

use super::report;
use super::Books;
use crate::config::{Metered, OnUnknown, Tier, UsageSource};
use crate::core::duration::NANOS_PER_SEC;
use crate::core::usage::price::PricedAs;
use crate::core::usage::{count_from_header, Counts, Format, Reader, Reading, Served};
use crate::host::Host;
use crate::limiter::tab::{Ending, Entry, Held, Op, Tab};
use crate::limiter::{Basis, Settled};
use crate::output::metrics::UsageUnknown;
use crate::wire::protocol::SettleOp;
use smallvec::SmallVec;

/// What the response says it used, as far as it has come.
#[derive(Debug, Default)]
pub(super) struct Usage {
    /// The body's usage, when a metered policy of the tab reads it and the body is JSON or
    /// server-sent events, in its content coding.
    body: Option<Reader>,
    /// Counts read from headers, then trailers, by header name.
    headers: SmallVec<[(String, u64); 1]>,
    /// The upstream itself answered with an error (a 4xx or 5xx it sent, not one of Envoy's):
    /// it generated nothing, so a response without usage costs nothing.
    upstream_error: bool,
}

impl Usage {
    /// Reads the response's headers once, if a metered policy of the tab reads its usage.
    pub(super) fn on_headers(&mut self, tab: &Tab, filter: &impl Books, host: &impl Host) {
        let sources = || sources(tab, filter);
        if sources().next().is_none() {
            return;
        }
        let headers = host.response_headers();
        let header = |name: &str| {
            let found = headers.iter().find(|(known, _)| known == name);
            found.map(|(_, value)| value.clone())
        };
        if sources().any(UsageSource::reads_body) {
            let format = header("content-type").and_then(|value| Format::of_content_type(&value));
            self.body = format.map(|format| {
                let coding = header("content-encoding");
                Reader::new(format, coding.as_deref())
            });
        }
        self.read(sources(), header);
        self.upstream_error = upstream_error(header(":status"), host);
    }

    pub(super) fn on_trailers(&mut self, tab: &Tab, filter: &impl Books, host: &impl Host) {
        self.read(sources(tab, filter), |name| host.response_trailer(name));
    }

    /// Whether the body is read still: not once it cannot be (malformed, or not decoded).
    pub(super) fn reads_body(&self) -> bool {
        self.body.as_ref().is_some_and(Reader::reads)
    }

    pub(super) fn on_body(&mut self, chunk: &[u8]) {
        if let Some(reader) = &mut self.body {
            reader.feed(chunk);
        }
    }

    /// The counts that header sources name, where `value_of` has them.
    fn read<'p>(
        &mut self,
        sources: impl Iterator<Item = &'p UsageSource>,
        value_of: impl Fn(&str) -> Option<Vec<u8>>,
    ) {
        for source in sources {
            let UsageSource::Header(name) = source else {
                continue;
            };
            if let Some(count) = value_of(name).and_then(|v| count_from_header(&v)) {
                self.headers.retain(|(known, _)| known != name);
                self.headers.push((name.clone(), count));
            }
        }
    }

    /// What the body said it used, once the request ended as `ending` says.
    fn body_usage(&self, ending: Ending) -> BodyUsage {
        let unknown = match self.body.as_ref().map(Reader::reading) {
            Some(Reading::Found(counts)) => return Ok(counts),
            Some(Reading::Invalid(_)) => UsageUnknown::Invalid,
            Some(Reading::Missing) | None => UsageUnknown::Missing,
        };
        Err(match ending {
            Ending::Completed => unknown,
            Ending::Reset => UsageUnknown::Reset,
        })
    }

    /// The model the body says served the response.
    fn served(&self) -> Served<'_> {
        self.body.as_ref().map_or(Served::Unnamed, Reader::model)
    }

    /// The count read from the header (or trailer) `name`.
    fn header_count(&self, name: &str) -> Option<u64> {
        let found = self.headers.iter().find(|(known, _)| known == name);
        found.map(|&(_, count)| count)
    }
}

/// Whether the response is an error status the upstream sent: Envoy's own replies (a timeout,
/// an upstream reset) say nothing of what the upstream did, and are charged as unknown.
fn upstream_error(status: Option<Vec<u8>>, host: &impl Host) -> bool {
    let status = status.and_then(|s| std::str::from_utf8(&s).ok()?.parse::<u16>().ok());
    status.is_some_and(|s| s >= 400)
        && host.property(&["response", "code_details"]).as_deref() == Some(b"via_upstream")
}

/// What a response's body said it used: its counts (the total derived when it can be), or why
/// none came.
pub type BodyUsage = Result<Counts, UsageUnknown>;

/// The models a spend budget may price a response at: the one its body says served it, and the
/// one its request named (`Tab::model`).
#[derive(Debug, Clone, Copy)]
pub struct Models<'a> {
    pub served: Served<'a>,
    pub asked: Option<&'a [u8]>,
}

/// What a response cost a policy reading its usage from `source`: the body's counts priced by the
/// policy's meter (a spend budget's: by the price of the model of `models` that wins), or the
/// count of a header (or trailer) as `header_count` finds it; else why that is not known (a
/// stream reset before it came: `Reset`).
pub fn cost(
    source: &UsageSource,
    body: BodyUsage,
    header_count: impl Fn(&str) -> Option<u64>,
    ending: Ending,
    models: Models,
) -> Result<u64, UsageUnknown> {
    let reading = match source {
        UsageSource::Header(name) => header_count(name).ok_or(UsageUnknown::Missing),
        UsageSource::Body(meter) => {
            body.and_then(|counts| meter.cost(&counts).ok_or(UsageUnknown::Missing))
        }
        UsageSource::Priced { pricing, .. } => body.and_then(|counts| {
            let (cost, _) = pricing.cost(&counts, models.served, models.asked);
            cost.ok_or(UsageUnknown::Missing)
        }),
    };
    match (reading, ending) {
        (Err(_), Ending::Reset) => Err(UsageUnknown::Reset),
        (reading, _) => reading,
    }
}

/// What a response whose request reserved `reserved` is charged in all: its `cost`, or when that
/// is not known what the policy's `on_unknown` says.
pub fn charge_of(
    metered: &Metered,
    tier: &Tier,
    reserved: u64,
    cost: Result<u64, UsageUnknown>,
) -> u64 {
    match (cost, metered.on_unknown) {
        (Ok(cost), _) => cost,
        (Err(_), OnUnknown::Max) => tier
            .algorithm
            .capacity()
            .saturating_add(metered.max_debt(tier)),
        (Err(_), OnUnknown::Reserve) => reserved,
        (Err(_), OnUnknown::Tokens(tokens)) => tokens,
    }
}

/// What settling a reservation of `reserved` against a charge of `charged` does to its key: the
/// tokens used beyond it charged, or those not used refunded; `None` when they are equal.
pub fn settle_op(reserved: u64, charged: u64) -> Option<Op> {
    match charged.checked_sub(reserved) {
        Some(0) => None,
        Some(beyond) => Some(Op::Charge(beyond)),
        None => Some(Op::Refund(reserved - charged)),
    }
}

/// The body's usage as the access log shows it (filter state `sluice.usage`): the counts it
/// reported, `input=N output=N total=N` (those it has) and the priced kinds above 0
/// (`cache_read=N cache_write=N cached=N reasoning=N thoughts=N`), or why none came, `unknown=missing`,
/// `unknown=invalid`, `unknown=reset`. `read_usage_text` reads it back.
pub fn usage_text(usage: &BodyUsage) -> String {
    let counts = match usage {
        Ok(counts) => counts,
        Err(why) => return format!("unknown={}", why.as_str()),
    };
    let priced = |n: u64| (n > 0).then_some(n);
    let named = [
        ("input", counts.input),
        ("output", counts.output),
        ("total", counts.total),
        ("cache_read", priced(counts.cache_read)),
        ("cache_write", priced(counts.cache_write)),
        ("cached", priced(counts.cached)),
        ("reasoning", priced(counts.reasoning)),
        ("thoughts", priced(counts.thoughts)),
    ];
    let present = named
        .iter()
        .filter_map(|(name, n)| Some(format!("{name}={}", (*n)?)));
    present.collect::<Vec<_>>().join(" ")
}

/// What `usage_text` wrote; `None` for any other text.
pub fn read_usage_text(text: &[u8]) -> Option<BodyUsage> {
    let text = std::str::from_utf8(text).ok()?;
    if let Some(why) = text.strip_prefix("unknown=") {
        let known = UsageUnknown::ALL.into_iter().find(|w| w.as_str() == why);
        return known.map(Err);
    }
    let mut counts = Counts::default();
    for pair in text.split(' ') {
        let (name, value) = pair.split_once('=')?;
        let value = count_from_header(value.as_bytes())?;
        let slot = match name {
            "input" => &mut counts.input,
            "output" => &mut counts.output,
            "total" => &mut counts.total,
            _ => {
                let priced = match name {
                    "cache_read" => &mut counts.cache_read,
                    "cache_write" => &mut counts.cache_write,
                    "cached" => &mut counts.cached,
                    "reasoning" => &mut counts.reasoning,
                    "thoughts" => &mut counts.thoughts,
                    _ => return None,
                };
                if *priced > 0 || value == 0 {
                    return None;
                }
                *priced = value;
                continue;
            }
        };
        if slot.replace(value).is_some() {
            return None;
        }
    }
    (counts != Counts::default()).then_some(Ok(counts))
}

/// The usage sources of the tab's metered policies.
fn sources<'f>(tab: &'f Tab, filter: &'f impl Books) -> impl Iterator<Item = &'f UsageSource> + 'f {
    tab.entries.iter().filter_map(move |entry| {
        let policy = filter.plan().policies.get(entry.policy)?;
        Some(&policy.metered.as_ref()?.source)
    })
}

/// One metered policy's part in a request: what it reserved, and what it was charged in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Charged {
    pub policy: usize,
    pub key: Option<u64>,
    pub reserved: u64,
    pub charged: u64,
}

/// Settles every reservation of the tab against the usage read: locally in shared data, or
/// through the outbox for a global policy. Each policy's charge is also published for Envoy's
/// own filters (`sluice.tokens.<policy>`: `%FILTER_STATE(wasm.sluice.tokens.<policy>:PLAIN)%`),
/// and when a policy read the body, what it said (`sluice.usage`: `usage_text`).
pub(super) fn settle(
    tab: &mut Tab,
    usage: &Usage,
    filter: &impl Books,
    host: &impl Host,
    ending: Ending,
) -> SmallVec<[Charged; 1]> {
    let body = usage.body_usage(ending);
    if sources(tab, filter).any(UsageSource::reads_body) {
        host.publish("sluice.usage", &usage_text(&body));
    }
    let models = Models {
        served: usage.served(),
        asked: tab.model.as_deref(),
    };
    if sources(tab, filter).any(|s| s.pricing().is_some()) {
        // For the access log and sluice-replay: empty for a name that could not be read.
        let name = match models.served {
            Served::Named(name) => Some(String::from_utf8_lossy(name)),
            Served::Unreadable => Some("".into()),
            Served::Unnamed => None,
        };
        if let Some(name) = name {
            host.publish("sluice.model", &name);
        }
    }
    let mut settled = SmallVec::new();
    for entry in tab.entries.iter_mut() {
        let Held::Reserved {
            tokens: reserved,
            at,
        } = entry.held
        else {
            continue;
        };
        let Some(policy) = filter.plan().policies.get(entry.policy) else {
            continue;
        };
        let Some(metered) = &policy.metered else {
            continue;
        };
        let counters = filter.counters();
        let cost = match cost(
            &metered.source,
            body,
            |name| usage.header_count(name),
            ending,
            models,
        ) {
            Err(_) if usage.upstream_error => Ok(0),
            cost => cost,
        };
        if let Some((pricing, _)) = metered.source.pricing() {
            let priced_as = pricing.priced_as(models.served, models.asked);
            if priced_as != PricedAs::Listed && !usage.upstream_error {
                counters.unknown_model(entry.policy, priced_as);
            }
        }
        let charged = charge_of(metered, &entry.tier, reserved, cost);
        if let Err(why) = cost {
            counters.usage_unknown(entry.policy, why, charged);
        }
        counters.tokens_settled(entry.policy, charged, reserved.saturating_sub(charged));
        let mut name = String::with_capacity(14 + policy.name.len());
        name.push_str("sluice.tokens.");
        name.push_str(&policy.name);
        host.publish(&name, &charged.to_string());
        charge(entry, metered, filter, host, (reserved, charged), at);
        settled.push(Charged {
            policy: entry.policy,
            key: entry.key,
            reserved,
            charged,
        });
    }
    settled
}

/// What each metered policy of the tab charges a request that ends before its usage comes.
pub(super) fn unknown_charges(tab: &Tab, filter: &impl Books) -> SmallVec<[Charged; 1]> {
    let reserved = tab.entries.iter().filter_map(|entry| match entry.held {
        Held::Reserved { tokens, .. } => Some((entry, tokens)),
        _ => None,
    });
    let charged = reserved.filter_map(|(entry, reserved)| {
        let policy = filter.plan().policies.get(entry.policy)?;
        let metered = policy.metered.as_ref()?;
        Some(Charged {
            policy: entry.policy,
            key: entry.key,
            reserved,
            charged: charge_of(metered, &entry.tier, reserved, Err(UsageUnknown::Reset)),
        })
    });
    charged.collect()
}

/// Charges what `entry`'s request used beyond its reservation, or gives back what it did not use.
fn charge(
    entry: &mut Entry,
    metered: &Metered,
    filter: &impl Books,
    host: &impl Host,
    (reserved, charged): (u64, u64),
    at: u64,
) {
    let basis = entry.basis;
    if basis == Basis::Emergency && charged > 0 {
        // Admitted while the service could not answer: the service never saw the reservation,
        // so it is told the whole charge, and the key's budget across Envoys pays for it.
        // Under the limit the service knows: the request's own, not an emergency budget's.
        let service_entry = Entry {
            tier: filter
                .plan()
                .policies
                .get(entry.policy)
                .filter(|policy| policy.emergency().is_some())
                .map_or(entry.tier, |policy| policy.tier),
            ..*entry
        };
        let op = charge_op(metered, filter, &service_entry, charged);
        report(filter, host, &service_entry, op);
    }
    let Some(op) = settle_op(reserved, charged) else {
        return;
    };
    if basis != Basis::Service {
        let settled = filter.settle(host, entry, op);
        if let Settled::Done {
            past_limit,
            into_debt,
            ..
        } = settled
        {
            filter.counters().tokens_owed(entry.policy, past_limit);
            // An emergency budget's state is not where `owes` looks.
            if into_debt && basis != Basis::Emergency {
                filter.entered_debt(entry);
            }
        }
        return;
    }
    let wire = match op {
        Op::Charge(tokens) => charge_op(metered, filter, entry, tokens),
        Op::Refund(tokens) => {
            let age_ms = filter.now(host).saturating_sub(at) / (NANOS_PER_SEC / 1000);
            // Named once, here: the outbox sends this very settlement again after a failed
            // call, and the service applies its id once.
            let id = Some(filter.settlement_id());
            SettleOp::Refund { tokens, age_ms, id }
        }
        // Not a reservation's: `settle_op` makes neither.
        Op::Release | Op::Renew => return,
    };
    report(filter, host, entry, wire);
}

/// A charge of `tokens` to `entry`'s key at the service, into at most the policy's debt.
fn charge_op(metered: &Metered, filter: &impl Books, entry: &Entry, tokens: u64) -> SettleOp {
    SettleOp::Charge {
        tokens,
        max_debt: metered.max_debt(&entry.tier),
        id: Some(filter.settlement_id()),
    }
}

/// The access-log record of a request whose metered policies settled: the admission's record,
/// or one naming the first of them as allowed, with `tokens=<policy>:<reserved>:<charged>` for
/// each (comma-separated). `None` when no policy was metered.
pub(super) fn record(
    admission: Option<String>,
    charged: &[Charged],
    filter: &impl Books,
) -> Option<String> {
    let first = charged.first()?;
    let plan = filter.plan();
    let mut record = admission
        .or_else(|| crate::output::access_log::allowed_record(plan, first.policy, first.key))?;
    record.push_str(" tokens=");
    for (i, c) in charged.iter().enumerate() {
        let Some(policy) = plan.policies.get(c.policy) else {
            continue;
        };
        if i > 0 {
            record.push(',');
        }
        record.push_str(&policy.name);
        for n in [c.reserved, c.charged] {
            record.push(':');
            record.push_str(&n.to_string());
        }
    }
    Some(record)
}
