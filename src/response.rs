//! The response half of an admitted request's life. What the request still owes its policies
//! (its `tab`) is kept while the response passes, its slots are renewed while it lives, and all
//! of it is settled once, when the request ends, however it ends: the response completed, the
//! client or the upstream reset the stream, Envoy destroyed it.
//!
//! The glue keeps one `Response` per admitted request that has a tab, renews it from its timer
//! (`renew`) and ends it (`end`) from the last callback the stream gets.

use crate::algorithm::Algorithm;
use crate::filter::{Filter, Host};
use crate::limiter::slot_name;
use crate::limiter::Settled;
use crate::metrics::SlotEnd;
use crate::protocol::SettleOp;
use crate::tab::{Ending, Entry, Held, Op, Tab};

/// One admitted request's claims, from its admission to its end.
#[derive(Debug)]
pub struct Response {
    tab: Tab,
}

impl Response {
    pub fn new(tab: Tab) -> Response {
        Response { tab }
    }

    /// Whether it holds slots, to be renewed while it lives.
    pub fn holds_slots(&self) -> bool {
        self.tab.holds_slots()
    }

    /// Moves each slot whose epoch is behind to the current one. A slot that lapsed meanwhile
    /// (renewals stalled for over half a lease) is taken again if one is free; otherwise the
    /// request runs on without one.
    pub fn renew(&mut self, filter: &Filter, host: &impl Host) {
        let now = filter.now(host);
        let counters = filter.counters();
        self.tab.entries.retain_mut(|entry| {
            let Algorithm::Concurrency(slots) = entry.tier.algorithm else {
                return true;
            };
            let epoch = match entry.held {
                Held::Lease { id, renewed } if now >= renewed + slots.epoch.get() => {
                    report(
                        filter,
                        host,
                        entry,
                        SettleOp::Renew {
                            slot: slot_name(id),
                        },
                    );
                    entry.held = Held::Lease { id, renewed: now };
                    return true;
                }
                Held::Slot { epoch } => epoch,
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

    /// Settles the tab: the request ended, as `ending` says.
    pub fn end(mut self, filter: &Filter, host: &impl Host, ending: Ending) {
        let counters = filter.counters();
        let reason = match ending {
            Ending::Completed => SlotEnd::Completed,
            Ending::Reset => SlotEnd::Reset,
        };
        for entry in self.tab.entries.iter_mut() {
            if let Held::Lease { id, .. } = entry.held {
                report(
                    filter,
                    host,
                    entry,
                    SettleOp::Release {
                        slot: slot_name(id),
                    },
                );
                counters.slots_ended(entry.policy, reason, 1);
                continue;
            }
            match filter.settle(host, entry, Op::Release) {
                Settled::Done { expired, .. } => {
                    counters.slots_ended(entry.policy, reason, 1);
                    counters.slots_ended(entry.policy, SlotEnd::Expired, expired);
                }
                Settled::Gone | Settled::Failed => counters.slot_lost(entry.policy),
            }
        }
    }
}

/// Hands what `entry` owes its service to the worker's outbox.
fn report(filter: &Filter, host: &impl Host, entry: &Entry, op: SettleOp) {
    if let Some((service, settlement)) = filter.settlement(entry, op) {
        host.report(service, settlement);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::duration::NANOS_PER_SEC as SEC;
    use crate::filter::{Admitted, Verdict};
    use crate::metrics::{requests_counter, slots_in_use_gauge, slots_released_counter};
    use crate::testing::{FakeHost, FakeRequest};
    use serde_json::{json, Value};
    use std::sync::Arc;

    const T0: u64 = 1_800_000_000 * SEC;
    const ALICE: &[(&str, &str)] = &[("x-user-id", "alice")];

    fn streams(requests: u64, extra: Value) -> Value {
        let mut policy = json!({"name": "streams", "key": ["header:x-user-id"],
            "algorithm": "concurrency", "requests": requests, "lease": "10s"});
        for (field, value) in extra.as_object().into_iter().flatten() {
            policy[field] = value.clone();
        }
        policy
    }

    fn setup(policies: Value) -> (Filter, FakeHost) {
        let host = FakeHost::new(Arc::default(), T0);
        let config = json!({"policies": policies}).to_string();
        let filter = Filter::configure(config.as_bytes(), "test", &host, &host, &host).unwrap();
        (filter, host)
    }

    /// Starts a request: its response while admitted, `None` when refused.
    fn start(filter: &Filter, host: &FakeHost, headers: &[(&str, &str)]) -> Option<Response> {
        *host.request.borrow_mut() =
            FakeRequest::new(headers).with_property("source.address", "10.0.0.1:5555");
        match filter.on_request_headers(host) {
            Verdict::Continue(Admitted { tab, .. }) => Some(Response::new(tab.unwrap_or_default())),
            Verdict::Denied => None,
            other => panic!("neither admitted nor denied: {other:?}"),
        }
    }

    #[test]
    fn n_plus_one_requests_in_flight_get_n_slots_and_an_end_frees_one() {
        let (filter, host) = setup(json!([streams(2, json!({}))]));
        let first = start(&filter, &host, ALICE).unwrap();
        let _second = start(&filter, &host, ALICE).unwrap();
        assert!(start(&filter, &host, ALICE).is_none(), "two in flight");
        let reply = host.reply.borrow().clone().unwrap();
        assert_eq!(reply.status, 429);
        assert_eq!(reply.header("retry-after"), None, "nobody knows when");
        first.end(&filter, &host, Ending::Completed);
        assert!(
            start(&filter, &host, ALICE).is_some(),
            "one slot free again"
        );
        assert!(start(&filter, &host, &[("x-user-id", "bob")]).is_some());
    }

    #[test]
    fn a_request_another_policy_refuses_takes_no_slot() {
        let per_user = json!({"name": "per-user", "key": ["header:x-user-id"], "requests": 1,
            "per": "1h"});
        let (filter, host) = setup(json!([streams(1, json!({})), per_user]));
        let admitted = start(&filter, &host, ALICE).unwrap();
        admitted.end(&filter, &host, Ending::Completed);
        assert!(start(&filter, &host, ALICE).is_none(), "per-user refuses");
        let (filter2, host2) = (&filter, &host);
        filter2.flush_counters(host2);
        assert_eq!(host.gauge(&slots_in_use_gauge("streams")), 0);
        let streams = requests_counter("streams", crate::limiter::PolicyOutcome::Allowed);
        assert_eq!(host.counter(&streams), 1);
    }

    #[test]
    fn a_renewed_slot_outlives_its_lease_and_is_given_back_once() {
        let (filter, host) = setup(json!([streams(1, json!({}))]));
        let mut long = start(&filter, &host, ALICE).unwrap();
        for second in 1..=30 {
            host.now.set(T0 + second * SEC);
            long.renew(&filter, &host);
            assert!(start(&filter, &host, ALICE).is_none(), "held at {second}s");
        }
        long.end(&filter, &host, Ending::Reset);
        assert!(start(&filter, &host, ALICE).is_some());
        filter.flush_counters(&host);
        let reset = slots_released_counter("streams", SlotEnd::Reset);
        assert_eq!(host.counter(&reset), 1);
        assert_eq!(
            host.gauge(&slots_in_use_gauge("streams")),
            1,
            "the last one"
        );
    }

    #[test]
    fn a_slot_nobody_gives_back_expires_within_its_lease_and_is_counted() {
        let (filter, host) = setup(json!([streams(1, json!({}))]));
        let lost = start(&filter, &host, ALICE).unwrap();
        std::mem::forget(lost);
        host.now.set(T0 + 9 * SEC);
        assert!(start(&filter, &host, ALICE).is_none());
        host.now.set(T0 + 10 * SEC);
        assert!(start(&filter, &host, ALICE).is_some(), "a lease later");
        filter.flush_counters(&host);
        let expired = slots_released_counter("streams", SlotEnd::Expired);
        assert_eq!(host.counter(&expired), 1);
    }

    #[test]
    fn a_global_slot_is_named_in_its_check_and_given_back_through_the_outbox() {
        let host = FakeHost::new(Arc::default(), T0);
        let config = json!({"global": {"cluster": "sluice"}, "policies": [streams(4, json!({"scope": "global"}))]});
        let filter =
            Filter::configure(config.to_string().as_bytes(), "test", &host, &host, &host).unwrap();
        *host.request.borrow_mut() = FakeRequest::new(ALICE);
        let Verdict::Waiting(pending) = filter.on_request_headers(&host) else {
            panic!("asks the service");
        };
        let slot = pending.checks()[0].slot.clone().expect("a named slot");
        let answer = br#"{"results":[{"allowed":true,"granted":1,"remaining":3,"reset_ms":0,"retry_after_ms":0}]}"#;
        let verdict = filter.on_service_response(&host, pending, Some((200, answer.to_vec())));
        let Verdict::Continue(Admitted { tab: Some(tab), .. }) = verdict else {
            panic!("admitted with a slot");
        };
        let mut response = Response::new(tab);
        host.now.set(T0 + 5 * SEC);
        response.renew(&filter, &host);
        response.end(&filter, &host, Ending::Completed);
        let ops: Vec<SettleOp> = host.reports.borrow().iter().map(|s| s.op.clone()).collect();
        assert_eq!(
            ops,
            [
                SettleOp::Renew { slot: slot.clone() },
                SettleOp::Release { slot }
            ],
            "renewed at half its lease of 10 s, then given back"
        );
        assert!(host.reports.borrow()[0].key.starts_with("streams/"));
    }

    #[test]
    fn a_refusal_says_when_to_retry_only_if_the_policy_does() {
        let (filter, host) = setup(json!([streams(1, json!({"retry_after": "2s"}))]));
        let _held = start(&filter, &host, ALICE).unwrap();
        assert!(start(&filter, &host, ALICE).is_none());
        let reply = host.reply.borrow().clone().unwrap();
        assert_eq!(reply.header("retry-after"), Some("2"));
    }
}
