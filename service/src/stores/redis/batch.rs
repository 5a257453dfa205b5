//! Checks that are ready together, decided in one call. Every `Store::check` puts its checks on
//! one queue; a task takes what is there, up to `MAX_BATCH` checks, and sends it at once if no
//! batch is in flight, or when it has `FILL` checks while one is, or when that one is answered
//! (at most `MAX_IN_FLIGHT`). So under load the checks that wait meanwhile go as one batch, and
//! alone a check goes at once. A batch is one `CHECKS_LUA` call for the algorithms whose
//! state is one string (one per hash tag on a Cluster: one slot per call), pipelined with one
//! script call per check of the others (sliding log, concurrency) — one round trip. Redis pays one
//! `EVALSHA`, one `TIME` and one `MGET` for the whole batch, and one `SET` per key it changes, where
//! one script per check paid for each of those per check.
//!
//! Exact as one script per check: a batch is one atomic script, its checks decided in order at one
//! time, each seeing the state the ones before it left. A call whose caller has given up (its bound
//! ran out) before its batch left is dropped, not sent.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use redis::{RedisError, RedisResult, Value};
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};

use super::lua::{Kind, DECISION_BYTES, RECORD_BYTES};
use super::{
    decision_from_reply, state_key, unexpected_reply, Core, Eval, Link, Order, COMMAND_TIMEOUT,
};
use crate::stores::{Algorithm, Check, Decision};

/// Batches sent and not yet answered, at most: one in flight while the next one fills.
pub const MAX_IN_FLIGHT: usize = 2;
/// Checks in one batch, at most (a call of more goes alone).
pub const MAX_BATCH: usize = 128;
/// Checks that send a batch while another is in flight; fewer wait for that one's answer (or
/// for more checks). One batch is then in flight under light load, two under heavy load: the
/// batches are larger for the same calls, and Redis pays each batch's cost fewer times.
pub const FILL: usize = 32;

/// One `Store::check` call waiting for its batch.
struct Job {
    checks: Vec<Check>,
    reply: oneshot::Sender<RedisResult<Vec<Decision>>>,
}

/// The queue of checks, and its task (started by the first check, on its runtime).
pub struct Queue {
    jobs: OnceLock<mpsc::UnboundedSender<Job>>,
}

impl Queue {
    pub fn new() -> Queue {
        Queue {
            jobs: OnceLock::new(),
        }
    }

    /// `checks` decided in the next batch that has room for them.
    pub async fn check(&self, core: &Arc<Core>, checks: &[Check]) -> RedisResult<Vec<Decision>> {
        if checks.is_empty() {
            return Ok(Vec::new());
        }
        let jobs = self.jobs.get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(send_batches(Arc::clone(core), receiver));
            sender
        });
        let (reply, answer) = oneshot::channel();
        let job = Job {
            checks: checks.to_vec(),
            reply,
        };
        jobs.send(job).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// A batch that was given up (its time ran out) or a task that is gone.
fn gone() -> RedisError {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "the batch of this check was given up",
    )
    .into()
}

/// The queue's task: batches of the jobs waiting, at most `MAX_IN_FLIGHT` in flight.
async fn send_batches(core: Arc<Core>, mut jobs: mpsc::UnboundedReceiver<Job>) {
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    // Told when a batch is answered.
    let answered = Arc::new(Notify::new());
    let mut next: Option<Job> = None;
    loop {
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            return;
        };
        let first = match next.take() {
            Some(job) => job,
            None => match jobs.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        let mut batch = Batch::new(first);
        loop {
            while let Ok(job) = jobs.try_recv() {
                if let Some(over) = batch.add(job) {
                    next = Some(over);
                    break;
                }
            }
            // Goes now if it is full enough, or nothing else is in flight; else grows until
            // the batch in flight is answered (as Nagle's algorithm does with a segment).
            let others = MAX_IN_FLIGHT - 1 - in_flight.available_permits();
            if batch.size >= FILL || next.is_some() || others == 0 {
                break;
            }
            tokio::select! {
                () = answered.notified() => break,
                job = jobs.recv() => match job {
                    Some(job) => next = batch.add(job),
                    None => break,
                },
            }
        }
        let mut jobs_of_batch = batch.jobs;
        jobs_of_batch.retain(|job| !job.reply.is_closed());
        if jobs_of_batch.is_empty() {
            continue;
        }
        let (core, answered) = (Arc::clone(&core), Arc::clone(&answered));
        tokio::spawn(async move {
            answer(&core, jobs_of_batch).await;
            drop(permit);
            answered.notify_one();
        });
    }
}

/// The jobs of the next batch.
struct Batch {
    jobs: Vec<Job>,
    /// Their checks.
    size: usize,
}

impl Batch {
    fn new(first: Job) -> Batch {
        Batch {
            size: first.checks.len(),
            jobs: vec![first],
        }
    }

    /// Adds `job` if it fits within `MAX_BATCH` (a job whose caller gave up is dropped); else
    /// gives it back, for the next batch.
    fn add(&mut self, job: Job) -> Option<Job> {
        if job.reply.is_closed() {
            return None;
        }
        if self.size + job.checks.len() > MAX_BATCH {
            return Some(job);
        }
        self.size += job.checks.len();
        self.jobs.push(job);
        None
    }
}

/// Decides every check of `batch` and answers each job (within `COMMAND_TIMEOUT`: a batch that
/// takes longer is given up, and its callers' bounds have run out).
async fn answer(core: &Core, batch: Vec<Job>) {
    let checks: Vec<&Check> = batch.iter().flat_map(|job| &job.checks).collect();
    let decided = match tokio::time::timeout(COMMAND_TIMEOUT, decide(core, &checks)).await {
        Ok(decided) => decided,
        Err(_) => return,
    };
    let mut decisions = match decided {
        Ok(decisions) => decisions.into_iter(),
        Err(error) => {
            for job in batch {
                let _ = job.reply.send(Err(error.clone()));
            }
            return;
        }
    };
    for job in batch {
        let mine: RedisResult<Vec<Decision>> = decisions.by_ref().take(job.checks.len()).collect();
        let _ = job.reply.send(mine);
    }
}

/// The record kind of a check `CHECKS_LUA` decides, with its numbers; None for the others.
fn record(check: &Check) -> Option<(Kind, [u64; 5])> {
    let (cost, take, debt) = (check.cost, check.take, check.debt);
    Some(match check.algorithm {
        Algorithm::TokenBucket { interval_us, burst } => {
            (Kind::TokenBucket, [interval_us, burst, cost, take, debt])
        }
        Algorithm::FixedWindow { limit, window_us } => {
            (Kind::FixedWindow, [window_us, limit, cost, take, debt])
        }
        Algorithm::SlidingWindow { limit, window_us } => {
            (Kind::SlidingWindow, [window_us, limit, cost, take, debt])
        }
        Algorithm::LeakyBucket {
            interval_us,
            max_delay_us,
        } => (
            Kind::LeakyBucket,
            [interval_us, max_delay_us, cost, cost, 0],
        ),
        // Its boundaries do not fit a record: one script call of its own (`super::calendar`).
        Algorithm::SlidingLog { .. }
        | Algorithm::Concurrency { .. }
        | Algorithm::CalendarWindow { .. } => return None,
    })
}

/// Where a check's decision comes from: the reply of eval `eval`, at `position` in a batch's.
#[derive(Clone, Copy)]
struct Place {
    eval: usize,
    position: Option<usize>,
}

/// The keys (each once) and the records of one `CHECKS_LUA` call.
#[derive(Default)]
struct Group {
    keys: Vec<String>,
    /// Each key's index in `keys`, from 1 (Lua's).
    index: HashMap<String, u16>,
    records: Vec<u8>,
    checks: usize,
}

/// Every check's decision (or the error of the call that had it), in order; an error for all if
/// the round trip failed.
async fn decide(core: &Core, checks: &[&Check]) -> RedisResult<Vec<RedisResult<Decision>>> {
    let cluster = matches!(core.link, Link::Cluster { .. });
    let mut groups: Vec<Group> = Vec::new();
    // A Cluster's calls, by hash tag: the caller's key (`store::state_key`).
    let mut by_tag: HashMap<&str, usize> = HashMap::new();
    let mut singles = Vec::new();
    let mut places = Vec::with_capacity(checks.len());
    for (i, check) in checks.iter().enumerate() {
        let Some((kind, numbers)) = record(check) else {
            places.push(Place {
                eval: usize::MAX,
                position: None,
            });
            singles.push(i);
            continue;
        };
        let tag = if cluster { check.key.as_str() } else { "" };
        let g = match by_tag.get(tag) {
            // A call of at most `MAX_BATCH` checks: Lua's `unpack` of its keys and numbers
            // stays far within its stack.
            Some(&g) if groups.get(g).is_some_and(|group| group.checks < MAX_BATCH) => g,
            _ => {
                groups.push(Group::default());
                by_tag.insert(tag, groups.len() - 1);
                groups.len() - 1
            }
        };
        let Some(group) = groups.get_mut(g) else {
            return Err(unexpected_reply("a batch without its group".into()));
        };
        places.push(Place {
            eval: g,
            position: Some(group.checks),
        });
        group.checks += 1;
        let key = state_key(check);
        let next = u16::try_from(group.keys.len() + 1).unwrap_or(u16::MAX);
        let index = match group.index.get(&key) {
            Some(&index) => index,
            None => {
                group.index.insert(key.clone(), next);
                group.keys.push(key);
                next
            }
        };
        group.records.reserve(RECORD_BYTES);
        group.records.push(kind as u8);
        group.records.extend_from_slice(&index.to_le_bytes());
        for n in numbers {
            // Below 2^53 (`check` bounds every number): exact as a double.
            group.records.extend_from_slice(&(n as f64).to_le_bytes());
        }
    }
    let batches = groups.len();
    let mut evals: Vec<Eval> = groups
        .into_iter()
        .map(|group| Eval::batch(&core.scripts.checks, group.keys, group.records))
        .collect();
    for (n, &i) in singles.iter().enumerate() {
        if let (Some(check), Some(place)) = (checks.get(i), places.get_mut(i)) {
            evals.push(core.scripts.check(check));
            place.eval = batches + n;
        }
    }
    let replies = core.run(&evals, Order::Any).await?;
    let mut decoded: Vec<Option<RedisResult<Vec<Decision>>>> = Vec::new();
    decoded.resize_with(batches, || None);
    let mut replies: Vec<Option<Value>> = replies.into_iter().map(Some).collect();
    let mut decisions = Vec::with_capacity(checks.len());
    for (check, place) in checks.iter().zip(places) {
        let reply = replies.get_mut(place.eval);
        let decision = match (place.position, reply) {
            (Some(position), Some(reply)) => {
                let slot = decoded.get_mut(place.eval);
                match slot {
                    Some(slot) => {
                        let batch = slot.get_or_insert_with(|| {
                            decode(reply.take().unwrap_or(Value::Nil), position)
                        });
                        match batch {
                            Ok(all) => all.get(position).cloned().ok_or_else(|| {
                                unexpected_reply(format!("no decision {position} in a batch"))
                            }),
                            Err(error) => Err(error.clone()),
                        }
                    }
                    None => Err(unexpected_reply("a batch without its reply".into())),
                }
            }
            (None, Some(reply)) => {
                decision_from_reply(&check.algorithm, reply.take().unwrap_or(Value::Nil))
            }
            (_, None) => Err(unexpected_reply("a check without its reply".into())),
        };
        let leaky = matches!(check.algorithm, Algorithm::LeakyBucket { .. });
        decisions.push(decision.map(|mut d| {
            if place.position.is_some() && !leaky {
                d.delay_us = None;
            }
            d
        }));
    }
    Ok(decisions)
}

/// `CHECKS_LUA`'s reply: a decision per `DECISION_BYTES` (at least `position` + 1 of them).
fn decode(reply: Value, position: usize) -> RedisResult<Vec<Decision>> {
    let bytes = match reply {
        Value::BulkString(bytes) => bytes,
        Value::ServerError(error) => return Err(error.into()),
        other => {
            return Err(unexpected_reply(format!(
                "the batch script returned {other:?}"
            )))
        }
    };
    if bytes.len() % DECISION_BYTES != 0 || bytes.len() / DECISION_BYTES <= position {
        let detail = format!("the batch script returned {} bytes", bytes.len());
        return Err(unexpected_reply(detail));
    }
    let number = |field: &[u8]| -> u64 {
        let mut le = [0u8; 8];
        le.copy_from_slice(field);
        let n = f64::from_le_bytes(le);
        // Negative (as the scripts' `unsigned` clamp) and NaN are 0; whole and below 2^53.
        if n > 0.0 {
            n as u64
        } else {
            0
        }
    };
    Ok(bytes
        .chunks_exact(DECISION_BYTES)
        .map(|record| {
            let mut fields = record.chunks_exact(8).map(number);
            let mut next = || fields.next().unwrap_or(0);
            Decision {
                allowed: next() == 1,
                granted: next(),
                remaining: next(),
                reset_us: next(),
                retry_after_us: next(),
                delay_us: Some(next()),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stores::redis::lua::CHECKS_LUA;

    #[test]
    fn a_batch_reply_becomes_decisions() {
        let mut bytes = Vec::new();
        for n in [
            1.0f64, 3.0, 17.0, 600_000.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0, 7.0, -2.0,
        ] {
            bytes.extend_from_slice(&n.to_le_bytes());
        }
        let decisions = decode(Value::BulkString(bytes.clone()), 1).unwrap();
        assert_eq!(decisions.len(), 2);
        assert!(decisions[0].allowed);
        assert_eq!(decisions[0].granted, 3);
        assert_eq!(decisions[0].remaining, 17);
        assert_eq!(decisions[0].reset_us, 600_000);
        assert!(!decisions[1].allowed);
        assert_eq!(decisions[1].reset_us, 5);
        assert_eq!(decisions[1].delay_us, Some(0));
        assert!(decode(Value::BulkString(bytes.clone()), 2).is_err());
        bytes.pop();
        assert!(decode(Value::BulkString(bytes), 0).is_err());
    }

    #[test]
    fn a_record_is_its_kind_its_key_and_five_doubles() {
        assert_eq!(RECORD_BYTES, 43);
        assert!(CHECKS_LUA.contains("local n = #records / 43\n"));
    }
}
