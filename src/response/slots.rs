//! A concurrency policy's slots: renewed while their request lives, given back when it ends.

use super::report;
use super::Books;
use crate::core::algorithm::Algorithm;
use crate::host::Host;
use crate::limiter::tab::{Ending, Held, Op, Tab};
use crate::limiter::{slot_name, Settled};
use crate::output::metrics::SlotEnd;
use crate::wire::protocol::SettleOp;

/// Moves each slot whose epoch is behind to the current one, and renews each slot the service
/// keeps at half its lease. A local slot that lapsed meanwhile (renewals stalled for over half a
/// lease) is taken again if one is free; otherwise the request runs on without one.
pub(super) fn renew(tab: &mut Tab, filter: &impl Books, host: &impl Host) {
    let now = filter.now(host);
    let counters = filter.counters();
    tab.entries.retain_mut(|entry| {
        let Algorithm::Concurrency(slots) = entry.tier.algorithm else {
            return true;
        };
        let epoch = match entry.held {
            Held::Lease { id, renewed } if now >= renewed + slots.epoch.get() => {
                let slot = slot_name(id);
                report(filter, host, entry, SettleOp::Renew { slot });
                entry.held = Held::Lease { id, renewed: now };
                return true;
            }
            Held::Slot(taken) => taken.epoch,
            _ => return true,
        };
        if epoch >= slots.epoch_of(now) {
            return true;
        }
        match filter.settle(host, entry, Op::Renew) {
            Settled::Done { expired, .. } => {
                counters.slots_ended(entry.policy, SlotEnd::Expired, expired);
                true
            }
            Settled::Gone | Settled::Failed => {
                counters.slot_lost(entry.policy);
                false
            }
        }
    });
}

/// Gives back every slot of the tab: to the shared data, or to the service through the outbox.
pub(super) fn release(tab: &mut Tab, filter: &impl Books, host: &impl Host, ending: Ending) {
    let counters = filter.counters();
    let reason = match ending {
        Ending::Completed => SlotEnd::Completed,
        Ending::Reset => SlotEnd::Reset,
    };
    for entry in tab.entries.iter_mut() {
        match entry.held {
            Held::Lease { id, .. } => {
                let slot = slot_name(id);
                report(filter, host, entry, SettleOp::Release { slot });
                counters.slots_ended(entry.policy, reason, 1);
            }
            Held::Slot(_) => match filter.settle(host, entry, Op::Release) {
                Settled::Done { expired, .. } => {
                    counters.slots_ended(entry.policy, reason, 1);
                    counters.slots_ended(entry.policy, SlotEnd::Expired, expired);
                }
                Settled::Gone | Settled::Failed => counters.slot_lost(entry.policy),
            },
            Held::Reserved { .. } => {}
        }
    }
}
