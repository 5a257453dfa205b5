//! A metered policy's reservation, settled against what the response used. The usage is read as
//! the response passes: from its body (JSON or server-sent events, `usage::Scanner`) or from a
//! header or trailer. When the request ends, the difference between what it used and what it
//! reserved is charged (past the limit, into a bounded debt) or given back; a usage that never
//! came (the stream cut, the upstream failed, a body without usage or with nonsense in it) is
//! charged as the policy's `on_unknown` says.

use super::report;
use crate::config::{Metered, OnUnknown, UsageSource};
use crate::duration::NANOS_PER_SEC;
use crate::filter::{Filter, Host};
use crate::limiter::Settled;
use crate::metrics::UsageUnknown;
use crate::protocol::SettleOp;
use crate::tab::{Ending, Entry, Held, Op, Tab};
use crate::usage::{count_from_header, Format, Reading, Scanner};
use smallvec::SmallVec;

/// What the response says it used, as far as it has come.
#[derive(Debug, Default)]
pub(super) struct Usage {
    /// The body's usage, when a metered policy of the tab reads it and the body is JSON or
    /// server-sent events.
    body: Option<Scanner>,
    /// Counts read from headers, then trailers, by header name.
    headers: SmallVec<[(String, u64); 1]>,
}

impl Usage {
    pub(super) fn on_headers(&mut self, tab: &Tab, filter: &Filter, host: &impl Host) {
        let sources = || sources(tab, filter);
        if sources().any(|s| matches!(s, UsageSource::Body(_))) {
            let content_type = host.response_header("content-type");
            self.body = content_type
                .and_then(|value| Format::of_content_type(&value))
                .map(Scanner::new);
        }
        self.read(sources(), |name| host.response_header(name));
    }

    pub(super) fn on_trailers(&mut self, tab: &Tab, filter: &Filter, host: &impl Host) {
        self.read(sources(tab, filter), |name| host.response_trailer(name));
    }

    pub(super) fn reads_body(&self) -> bool {
        self.body.is_some()
    }

    pub(super) fn on_body(&mut self, chunk: &[u8]) {
        if let Some(scanner) = &mut self.body {
            scanner.feed(chunk);
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

    /// What the response cost `metered`, or why that is not known.
    fn cost(&self, metered: &Metered, ending: Ending) -> Result<u64, UsageUnknown> {
        let reading = match &metered.source {
            UsageSource::Header(name) => {
                let found = self.headers.iter().find(|(known, _)| known == name);
                return found.map(|&(_, count)| count).ok_or(match ending {
                    Ending::Completed => UsageUnknown::Missing,
                    Ending::Reset => UsageUnknown::Reset,
                });
            }
            UsageSource::Body(meter) => match self.body.map(|scanner| scanner.reading()) {
                Some(Reading::Found(counts)) => meter.cost(&counts).ok_or(UsageUnknown::Missing),
                Some(Reading::Invalid(_)) => Err(UsageUnknown::Invalid),
                Some(Reading::Missing) | None => Err(UsageUnknown::Missing),
            },
        };
        match (reading, ending) {
            (Err(_), Ending::Reset) => Err(UsageUnknown::Reset),
            (reading, _) => reading,
        }
    }
}

/// The usage sources of the tab's metered policies.
fn sources<'f>(tab: &'f Tab, filter: &'f Filter) -> impl Iterator<Item = &'f UsageSource> + 'f {
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
/// own filters (`sluice.tokens.<policy>`: `%FILTER_STATE(wasm.sluice.tokens.<policy>:PLAIN)%`).
pub(super) fn settle(
    tab: &mut Tab,
    usage: &Usage,
    filter: &Filter,
    host: &impl Host,
    ending: Ending,
) -> SmallVec<[Charged; 1]> {
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
        let charged = match usage.cost(metered, ending) {
            Ok(cost) => cost,
            Err(why) => {
                let charged = match metered.on_unknown {
                    OnUnknown::Reserve => reserved,
                    OnUnknown::Tokens(tokens) => tokens,
                };
                counters.usage_unknown(entry.policy, why, charged);
                charged
            }
        };
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

/// Charges what `entry`'s request used beyond its reservation, or gives back what it did not use.
fn charge(
    entry: &mut Entry,
    metered: &Metered,
    filter: &Filter,
    host: &impl Host,
    (reserved, charged): (u64, u64),
    at: u64,
) {
    let (op, wire) = if charged >= reserved {
        let tokens = charged - reserved;
        let max_debt = metered.max_debt(&entry.tier);
        (Op::Charge(tokens), SettleOp::Charge { tokens, max_debt })
    } else {
        let tokens = reserved - charged;
        let age_ms = filter.now(host).saturating_sub(at) / (NANOS_PER_SEC / 1000);
        (Op::Refund(tokens), SettleOp::Refund { tokens, age_ms })
    };
    if matches!(op, Op::Charge(0)) {
        return;
    }
    match entry.basis {
        crate::limiter::Basis::Service => report(filter, host, entry, wire),
        _ => {
            if let Settled::Done { past_limit, .. } = filter.settle(host, entry, op) {
                filter.counters().tokens_owed(entry.policy, past_limit);
            }
        }
    }
}

/// The access-log record of a request whose metered policies settled: the admission's record,
/// or one naming the first of them as allowed, with `tokens=<policy>:<reserved>:<charged>` for
/// each (comma-separated). `None` when no policy was metered.
pub(super) fn record(
    admission: Option<String>,
    charged: &[Charged],
    filter: &Filter,
) -> Option<String> {
    let first = charged.first()?;
    let plan = filter.plan();
    let mut record =
        admission.or_else(|| crate::access_log::allowed_record(plan, first.policy, first.key))?;
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
