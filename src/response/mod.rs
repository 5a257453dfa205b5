//! The response half of an admitted request's life. What the request still owes its policies
//! (its `tab`) is kept while the response passes: the usage a metered policy charges is read
//! from the response as it streams through (`tokens`), slots are renewed while the request lives
//! (`slots`), and all of it is settled once, when the request ends, however it ends: the
//! response completed, the client or the upstream reset the stream, Envoy destroyed it.
//!
//! The glue keeps one `Response` per admitted request that has a tab: it hands it the response's
//! headers, body chunks and trailers as they pass (never holding them back), renews it from its
//! timer, and ends it at the response's end of stream, or when the stream is destroyed first.

mod debts;
mod slots;
#[cfg(test)]
mod tests;
mod tokens;

pub use debts::{Debtor, Debtors};
pub use tokens::{charge_of, cost, read_usage_text, settle_op, usage_text, BodyUsage, Models};

use crate::config::{GlobalService, Plan};
use crate::host::Host;
use crate::limiter::tab::{Ending, Entry, Op, Tab};
use crate::limiter::Settled;
use crate::output::metrics::Counters;
use crate::wire::protocol::{SettleOp, Settlement};

/// What the response half needs of the filter that admitted the request: its plan, counters and
/// clock, and the settling of what a request owes (in this Envoy's shared data, or with its
/// service).
pub trait Books {
    fn plan(&self) -> &Plan;
    fn counters(&self) -> &Counters;
    /// This worker's clock, never going back.
    fn now(&self, host: &impl Host) -> u64;
    /// Settles `entry` with `op` in this Envoy's shared data.
    fn settle(&self, host: &impl Host, entry: &mut Entry, op: Op) -> Settled;
    /// What an entry of a global policy owes its service, with `op`, as the service names it.
    fn settlement(&self, entry: &Entry, op: SettleOp) -> Option<(&GlobalService, Settlement)>;
    /// Marks the entry's key as having entered debt (`Debtors`).
    fn entered_debt(&self, entry: &Entry);
    /// A fresh id for a settlement, that the service applies once.
    fn settlement_id(&self) -> String;
}

/// One admitted request's claims, from its admission to its end.
#[derive(Debug)]
pub struct Response {
    tab: Tab,
    usage: tokens::Usage,
    /// The record the admission left for the access log, which the end completes.
    record: Option<String>,
}

impl Response {
    /// `record`: what the admission put in the access log, if anything.
    pub fn new(tab: Tab, record: Option<String>) -> Response {
        Response {
            tab,
            usage: tokens::Usage::default(),
            record,
        }
    }

    /// The access-log record of the request should it end before its response: Envoy writes a
    /// reset stream's access log before the filter learns of its end, so the admission leaves
    /// what such an ending charges (`None` without a metered policy); the end writes the
    /// record again with what it did charge.
    pub fn record_if_reset(&self, filter: &impl Books) -> Option<String> {
        let charged = tokens::unknown_charges(&self.tab, filter);
        tokens::record(self.record.clone(), &charged, filter)
    }

    /// Whether it holds slots, to be renewed while it lives.
    pub fn holds_slots(&self) -> bool {
        self.tab.holds_slots()
    }

    /// The response's headers have come: how its body reports usage (its content type and
    /// coding), and usage they carry.
    pub fn on_headers(&mut self, filter: &impl Books, host: &impl Host) {
        self.usage.on_headers(&self.tab, filter, host);
    }

    /// Whether its body is read (a metered policy reads its usage there, and it can still be
    /// read: not once malformed or undecodable): the glue fetches each chunk only then, as
    /// fetching costs a hostcall.
    pub fn reads_body(&self) -> bool {
        self.usage.reads_body()
    }

    /// The next chunk of the response body, as Envoy passes it on.
    pub fn on_body(&mut self, chunk: &[u8]) {
        self.usage.on_body(chunk);
    }

    /// The response's trailers have come.
    pub fn on_trailers(&mut self, filter: &impl Books, host: &impl Host) {
        self.usage.on_trailers(&self.tab, filter, host);
    }

    /// Renews what it holds: slots whose epoch is behind (`slots::renew`).
    pub fn renew(&mut self, filter: &impl Books, host: &impl Host) {
        slots::renew(&mut self.tab, filter, host);
    }

    /// Settles the tab: the request ended, as `ending` says.
    pub fn end(mut self, filter: &impl Books, host: &impl Host, ending: Ending) {
        slots::release(&mut self.tab, filter, host, ending);
        let charged = tokens::settle(&mut self.tab, &self.usage, filter, host, ending);
        if let Some(record) = tokens::record(self.record, &charged, filter) {
            host.record(&record);
        }
    }
}

/// Hands what `entry` owes its service to the worker's outbox.
fn report(filter: &impl Books, host: &impl Host, entry: &Entry, op: SettleOp) {
    if let Some((service, settlement)) = filter.settlement(entry, op) {
        host.report(service, settlement);
    }
}
