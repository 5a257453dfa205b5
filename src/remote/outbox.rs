//! What this worker owes the rate-limit service once requests are admitted: the usage of their
//! responses beyond or below their reservations, the slots of global concurrency policies given
//! back and renewed (`protocol::Settlement`). They are sent in batches from the worker's timer
//! and behind each batch delivered, never on a request's path, and never lost silently: a batch
//! that fails is sent again (after `BACK_OFF`) until it is `GIVE_UP` old, and what the outbox
//! cannot hold or deliver is counted as dropped.
//!
//! The outbox is the worker's (its VM's), not a configuration's: a request admitted under a
//! configuration that has since been replaced still settles with the service it was admitted by.

use crate::config::GlobalService;
use crate::core::duration::NANOS_PER_SEC;
use crate::wire::protocol::Settlement;
use std::collections::VecDeque;

/// Settlements per call.
pub const MAX_BATCH: usize = 256;
/// Settlements the outbox holds at most, per service.
pub const CAPACITY: usize = 65_536;
/// A settlement not delivered this long after it was made is dropped.
pub const GIVE_UP: u64 = 30 * NANOS_PER_SEC;
/// Calls per service at once.
pub const MAX_IN_FLIGHT: usize = 4;
/// A call unanswered this long counts as failed (its answer, if it comes, is ignored).
pub const CALL_TIMEOUT: u64 = 5 * NANOS_PER_SEC;
/// After a failed call, nothing more is sent to its service for this long: a service that is
/// down or shedding load is not hammered by every worker's timer.
pub const BACK_OFF: u64 = NANOS_PER_SEC;

/// Settlements waiting for one service, and the calls under way to it.
#[derive(Debug)]
struct Queue {
    service: GlobalService,
    waiting: VecDeque<(Settlement, u64)>,
    in_flight: Vec<Call>,
    /// Nothing is sent before then (`BACK_OFF` after a failure).
    resume_at: u64,
}

/// One call under way: the host's token for it, when it was made, what it carries.
#[derive(Debug)]
struct Call {
    token: u32,
    sent: u64,
    batch: Vec<(Settlement, u64)>,
}

/// A batch to send now.
#[derive(Debug)]
pub struct Batch<'a> {
    pub service: &'a GlobalService,
    pub settlements: Vec<Settlement>,
}

/// The settlements of one worker, by service.
#[derive(Debug, Default)]
pub struct Outbox {
    queues: Vec<Queue>,
    /// Settlements given up: the outbox was full, or they could not be delivered in time.
    dropped: u64,
    delivered: u64,
    /// Settlements the service refused: never sent again.
    rejected: u64,
}

/// How the service answered a call (`Outbox::answered`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// A 2xx: applied, but `rejected` of them, which the service refused one by one.
    Delivered { rejected: u64 },
    /// A 4xx but 408 and 429: the service refuses the call as it is, and would again. Sent
    /// again, it would only hold back the settlements behind it (issue 31): dropped, counted as
    /// rejected.
    Refused,
    /// No answer, a timeout, a 5xx, a 408 or 429: sent again while young enough.
    Failed,
}

impl Delivery {
    /// The answer of a call with this HTTP status (`None`: no answer) and, for a 2xx, the
    /// settlements the body says it refused.
    pub fn of(status: Option<u32>, rejected: u64) -> Delivery {
        match status {
            Some(200..=299) => Delivery::Delivered { rejected },
            Some(408 | 429) => Delivery::Failed,
            Some(400..=499) => Delivery::Refused,
            _ => Delivery::Failed,
        }
    }
}

/// How many settlements a 2xx answer of `POST /v1/settle` says the service refused
/// (`{"settled": n, "rejected": m}`): 0 when it does not say.
pub fn rejected_in(body: &[u8]) -> u64 {
    #[derive(serde::Deserialize)]
    struct Answer {
        #[serde(default)]
        rejected: u64,
    }
    serde_json::from_slice::<Answer>(body).map_or(0, |a| a.rejected)
}

impl Outbox {
    /// Queues a settlement for `service`, made at `now`; false if the outbox is full (it is
    /// counted as dropped).
    pub fn push(&mut self, service: &GlobalService, settlement: Settlement, now: u64) -> bool {
        let queue = match self.queues.iter().position(|q| q.service == *service) {
            Some(i) => self.queues.get_mut(i),
            None => {
                self.queues.push(Queue {
                    service: service.clone(),
                    waiting: VecDeque::new(),
                    in_flight: Vec::new(),
                    resume_at: 0,
                });
                self.queues.last_mut()
            }
        };
        match queue {
            Some(queue) if queue.waiting.len() < CAPACITY => {
                queue.waiting.push_back((settlement, now));
                true
            }
            _ => {
                self.dropped += 1;
                false
            }
        }
    }

    /// Whether some service has a whole batch waiting: more than its timer should wait for.
    pub fn has_full_batch(&self) -> bool {
        self.queues.iter().any(|q| q.waiting.len() >= MAX_BATCH)
    }

    /// Whether nothing waits or is under way.
    pub fn is_idle(&self) -> bool {
        self.queues
            .iter()
            .all(|q| q.waiting.is_empty() && q.in_flight.is_empty())
    }

    /// Sends what waits, at most `MAX_IN_FLIGHT` calls per service and none to a service backing
    /// off: `send` makes a call and returns the host's token for it, or `None` if it could not be
    /// made (the batch waits for the next tick). Calls unanswered for `CALL_TIMEOUT` count as
    /// failed first.
    pub fn flush(&mut self, now: u64, mut send: impl FnMut(Batch) -> Option<u32>) {
        for queue in &mut self.queues {
            let (late, on_time): (Vec<Call>, Vec<Call>) = std::mem::take(&mut queue.in_flight)
                .into_iter()
                .partition(|c| now.saturating_sub(c.sent) >= CALL_TIMEOUT);
            queue.in_flight = on_time;
            for call in late {
                self.dropped += requeue(queue, call.batch, now);
            }
            self.dropped += expire(&mut queue.waiting, now);
            let ready = now >= queue.resume_at;
            while ready && queue.in_flight.len() < MAX_IN_FLIGHT && !queue.waiting.is_empty() {
                let take = queue.waiting.len().min(MAX_BATCH);
                let batch: Vec<(Settlement, u64)> = queue.waiting.drain(..take).collect();
                let settlements = batch.iter().map(|(s, _)| s.clone()).collect();
                let sent = send(Batch {
                    service: &queue.service,
                    settlements,
                });
                match sent {
                    Some(token) => queue.in_flight.push(Call {
                        token,
                        sent: now,
                        batch,
                    }),
                    None => {
                        for entry in batch.into_iter().rev() {
                            queue.waiting.push_front(entry);
                        }
                        queue.resume_at = now.saturating_add(BACK_OFF);
                        break;
                    }
                }
            }
        }
        self.queues
            .retain(|q| !q.waiting.is_empty() || !q.in_flight.is_empty());
    }

    /// The answer to the call `token`: delivered, refused (dropped, never sent again: the
    /// service would refuse it again), or failed (sent again while young enough). False if no
    /// call under way has that token.
    pub fn answered(&mut self, token: u32, delivery: Delivery, now: u64) -> bool {
        for queue in &mut self.queues {
            let Some(i) = queue.in_flight.iter().position(|c| c.token == token) else {
                continue;
            };
            let call = queue.in_flight.swap_remove(i);
            let sent = call.batch.len() as u64;
            match delivery {
                Delivery::Delivered { rejected } => {
                    let rejected = rejected.min(sent);
                    self.delivered += sent - rejected;
                    self.rejected += rejected;
                }
                Delivery::Refused => self.rejected += sent,
                Delivery::Failed => self.dropped += requeue(queue, call.batch, now),
            }
            return true;
        }
        false
    }

    /// Settlements given up, delivered and rejected since the last call: for the counters.
    pub fn take_counts(&mut self) -> Counts {
        Counts {
            dropped: std::mem::take(&mut self.dropped),
            delivered: std::mem::take(&mut self.delivered),
            rejected: std::mem::take(&mut self.rejected),
        }
    }
}

/// What became of settlements since the counts were last taken.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub dropped: u64,
    pub delivered: u64,
    pub rejected: u64,
}

/// Puts a failed batch back at the front of its queue, but what is too old to try again, and
/// backs the queue off: returns how many were dropped.
fn requeue(queue: &mut Queue, batch: Vec<(Settlement, u64)>, now: u64) -> u64 {
    queue.resume_at = now.saturating_add(BACK_OFF);
    let mut dropped = 0;
    for (settlement, made) in batch.into_iter().rev() {
        if now.saturating_sub(made) < GIVE_UP {
            queue.waiting.push_front((settlement, made));
        } else {
            dropped += 1;
        }
    }
    dropped
}

/// Drops what waited too long: returns how many.
fn expire(waiting: &mut VecDeque<(Settlement, u64)>, now: u64) -> u64 {
    let before = waiting.len();
    waiting.retain(|(_, made)| now.saturating_sub(*made) < GIVE_UP);
    (before - waiting.len()) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Protocol;
    use crate::core::algorithm::Kind;
    use crate::wire::protocol::SettleOp;

    const T0: u64 = 1_800_000_000 * NANOS_PER_SEC;
    const OK: Delivery = Delivery::Delivered { rejected: 0 };

    fn service(cluster: &str) -> GlobalService {
        GlobalService {
            overrides: None,
            cluster: cluster.into(),
            authority: cluster.into(),
            timeout_ms: 50,
            authorization: None,
            protocol: Protocol::Sluice {
                path: "/v1/check".into(),
            },
            max_key_ttl_ms: crate::wire::protocol::SERVICE_MAX_KEY_TTL_MS,
        }
    }

    fn release(n: u64) -> Settlement {
        Settlement {
            calendar: None,
            key: format!("streams/{n:016x}"),
            algorithm: Kind::Concurrency,
            requests: 4,
            per_ms: 300_000,
            burst: 4,
            op: SettleOp::Release {
                slot: format!("{n:016x}"),
            },
        }
    }

    /// Flushes at `now`, every call made: the batches' sizes, each call's token its index.
    fn flush(outbox: &mut Outbox, now: u64, tokens: &mut u32) -> Vec<usize> {
        let mut sizes = Vec::new();
        outbox.flush(now, |batch| {
            sizes.push(batch.settlements.len());
            *tokens += 1;
            Some(*tokens)
        });
        sizes
    }

    #[test]
    fn settlements_go_in_batches_of_at_most_max_batch_per_call() {
        let (mut outbox, mut tokens) = (Outbox::default(), 0);
        for n in 0..(MAX_BATCH as u64 + 10) {
            assert!(outbox.push(&service("a"), release(n), T0));
        }
        assert_eq!(flush(&mut outbox, T0, &mut tokens), [MAX_BATCH, 10]);
        assert!(outbox.answered(1, OK, T0));
        assert!(outbox.answered(2, OK, T0));
        assert!(outbox.is_idle());
        assert_eq!(outbox.take_counts().delivered, MAX_BATCH as u64 + 10);
    }

    #[test]
    fn a_failed_batch_is_sent_again_until_it_is_too_old_then_counted_as_dropped() {
        let (mut outbox, mut tokens) = (Outbox::default(), 0);
        outbox.push(&service("a"), release(1), T0);
        flush(&mut outbox, T0, &mut tokens);
        outbox.answered(1, Delivery::Failed, T0 + NANOS_PER_SEC);
        assert_eq!(
            flush(&mut outbox, T0 + NANOS_PER_SEC + BACK_OFF, &mut tokens),
            [1]
        );
        outbox.answered(2, Delivery::Failed, T0 + GIVE_UP);
        assert!(outbox.is_idle(), "too old to try again");
        assert_eq!(outbox.take_counts().dropped, 1);
    }

    fn charge(id: &str) -> Settlement {
        Settlement {
            op: SettleOp::Charge {
                tokens: 250,
                max_debt: 1000,
                id: Some(id.into()),
            },
            ..release(7)
        }
    }

    #[test]
    fn a_batch_sent_again_carries_the_same_ids_so_the_service_applies_it_once() {
        let (mut outbox, mut batches) = (Outbox::default(), Vec::new());
        let made = [charge("00000000000000a1"), charge("00000000000000a2")];
        for settlement in &made {
            outbox.push(&service("a"), settlement.clone(), T0);
        }
        let mut send = |outbox: &mut Outbox, now| {
            outbox.flush(now, |batch| {
                batches.push(batch.settlements);
                Some(batches.len() as u32)
            })
        };
        send(&mut outbox, T0);
        // Its answer lost: the service may well have applied it.
        assert!(outbox.answered(1, Delivery::Failed, T0 + NANOS_PER_SEC));
        send(&mut outbox, T0 + NANOS_PER_SEC + BACK_OFF);
        assert_eq!(batches.len(), 2);
        assert_eq!(batches[0], made, "as made");
        assert_eq!(batches[1], made, "the same ids again");
    }

    #[test]
    fn an_unanswered_call_counts_as_failed_after_its_timeout() {
        let (mut outbox, mut tokens) = (Outbox::default(), 0);
        outbox.push(&service("a"), release(1), T0);
        flush(&mut outbox, T0, &mut tokens);
        assert!(flush(&mut outbox, T0 + CALL_TIMEOUT, &mut tokens).is_empty());
        assert!(!outbox.answered(1, OK, T0 + CALL_TIMEOUT), "ignored");
        let again = T0 + CALL_TIMEOUT + BACK_OFF;
        assert_eq!(flush(&mut outbox, again, &mut tokens), [1]);
        assert!(outbox.answered(2, OK, again));
    }

    #[test]
    fn each_service_has_its_own_queue_and_calls() {
        let (mut outbox, mut tokens) = (Outbox::default(), 0);
        outbox.push(&service("a"), release(1), T0);
        outbox.push(&service("b"), release(2), T0);
        let mut clusters = Vec::new();
        outbox.flush(T0, |batch| {
            clusters.push(batch.service.cluster.clone());
            tokens += 1;
            Some(tokens)
        });
        assert_eq!(clusters, ["a", "b"]);
    }

    #[test]
    fn a_call_that_cannot_be_made_leaves_its_batch_waiting_in_order() {
        let mut outbox = Outbox::default();
        for n in 0..3 {
            outbox.push(&service("a"), release(n), T0);
        }
        outbox.flush(T0, |_| None);
        let mut keys = Vec::new();
        outbox.flush(T0 + BACK_OFF, |batch| {
            keys.extend(batch.settlements.iter().map(|s| s.key.clone()));
            Some(1)
        });
        assert_eq!(keys.len(), 3);
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:?}");
    }

    #[test]
    fn a_failed_call_backs_its_service_off() {
        let (mut outbox, mut tokens) = (Outbox::default(), 0);
        for n in 0..(MAX_IN_FLIGHT * MAX_BATCH + 1) as u64 {
            outbox.push(&service("a"), release(n), T0);
        }
        assert_eq!(flush(&mut outbox, T0, &mut tokens).len(), MAX_IN_FLIGHT);
        assert!(outbox.answered(1, OK, T0));
        assert_eq!(flush(&mut outbox, T0, &mut tokens), [1]);
        assert!(outbox.answered(2, Delivery::Failed, T0));
        outbox.push(&service("b"), release(0), T0);
        let sent = |outbox: &mut Outbox, now| {
            let mut clusters = Vec::new();
            outbox.flush(now, |batch| {
                clusters.push(batch.service.cluster.clone());
                Some(99)
            });
            clusters
        };
        assert_eq!(
            sent(&mut outbox, T0 + BACK_OFF - 1),
            ["b"],
            "only a backs off"
        );
        assert_eq!(sent(&mut outbox, T0 + BACK_OFF), ["a"]);
    }

    #[test]
    fn a_full_batch_waiting_is_told() {
        let mut outbox = Outbox::default();
        for n in 0..MAX_BATCH as u64 {
            assert!(!outbox.has_full_batch());
            outbox.push(&service("a"), release(n), T0);
        }
        assert!(outbox.has_full_batch());
    }

    #[test]
    fn a_full_outbox_drops_and_counts() {
        let mut outbox = Outbox::default();
        for n in 0..CAPACITY as u64 {
            outbox.push(&service("a"), release(n), T0);
        }
        assert!(!outbox.push(&service("a"), release(0), T0));
        assert_eq!(outbox.take_counts().dropped, 1);
    }

    /// Issue 31, finding 3: a batch the service refuses (a 400: a charge whose debt would
    /// outlive its --max-key-ttl) went back to the front of the queue, again and again, and the
    /// releases behind it were lost with it.
    #[test]
    fn a_batch_the_service_refuses_is_dropped_at_once_and_holds_nothing_back() {
        let (mut outbox, mut tokens) = (Outbox::default(), 0);
        outbox.push(&service("a"), charge("00000000000000a1"), T0);
        assert_eq!(flush(&mut outbox, T0, &mut tokens), [1]);
        outbox.push(&service("a"), release(2), T0);
        assert!(outbox.answered(1, Delivery::of(Some(400), 0), T0));
        assert_eq!(
            flush(&mut outbox, T0, &mut tokens),
            [1],
            "no back-off: the release goes"
        );
        assert!(outbox.answered(2, Delivery::of(Some(200), 0), T0));
        assert!(outbox.is_idle(), "the refused batch is not sent again");
        let counts = outbox.take_counts();
        assert_eq!(
            (counts.rejected, counts.delivered, counts.dropped),
            (1, 1, 0)
        );
    }

    #[test]
    fn what_an_answer_says_of_its_settlements() {
        assert_eq!(
            Delivery::of(Some(200), 2),
            Delivery::Delivered { rejected: 2 }
        );
        assert_eq!(Delivery::of(Some(401), 0), Delivery::Refused);
        assert_eq!(Delivery::of(Some(429), 0), Delivery::Failed);
        assert_eq!(Delivery::of(Some(503), 0), Delivery::Failed);
        assert_eq!(Delivery::of(None, 0), Delivery::Failed);
        assert_eq!(rejected_in(br#"{"settled":1,"rejected":2}"#), 2);
        assert_eq!(rejected_in(br#"{"settled":1}"#), 0);
        assert_eq!(rejected_in(b"garbled"), 0);
    }
}
