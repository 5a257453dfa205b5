//! The filter fleet as this replica sees it: every Envoy whose calls said who it is (the
//! filter's `sluice::remote::announce`: its node id, the worker, the settlements that worker
//! has dropped so far, once every 10 s per worker), when it last did, and the drops of its
//! workers. Read through `GET /admin/v1/envoys` (`admin::envoys`) and the console. Kept only
//! with the admin API, and only from calls with the service's token.
//!
//! Bounded: at most `MAX_ENVOYS` Envoys of `MAX_WORKERS` workers each; one not heard from for
//! `FORGET_S` is forgotten when room is needed, and past the bound a new one is not kept (and
//! counted as `untracked`), so a caller making up names cannot grow it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

pub use sluice::remote::announce::{DROPPED, ENVOY, MAX_ENVOY_BYTES, WORKER};

pub const MAX_ENVOYS: usize = 10_000;
pub const MAX_WORKERS: usize = 256;
/// An Envoy (or a worker) not heard from for this long may be forgotten.
pub const FORGET_S: u64 = 3_600;
/// An Envoy that called in the last minute has said who it is within this long: a worker says
/// so on its first call after each 10 s (marked by its once-a-second timer), so its last saying
/// is at most 11 s before any call; a margin for the timer's lateness.
pub const RECENT_S: u64 = 75;

pub struct Fleet {
    envoys: Mutex<HashMap<Box<str>, Seen>>,
    epoch: Instant,
    untracked: AtomicU64,
}

impl Default for Fleet {
    fn default() -> Fleet {
        Fleet {
            envoys: Mutex::default(),
            epoch: Instant::now(),
            untracked: AtomicU64::new(0),
        }
    }
}

#[derive(Default)]
struct Seen {
    last_s: u64,
    /// Each worker's drops so far, and when it last said.
    workers: HashMap<u64, (u64, u64)>,
}

/// One Envoy as listed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Envoy {
    /// Its node id (empty for an Envoy without one: then every such Envoy is this one).
    pub envoy: String,
    /// Seconds since it last said who it is.
    pub last_call_s: u64,
    /// Its workers heard from in the last hour.
    pub workers: usize,
    /// The settlements those workers dropped (`sluice.settlements_dropped` in its stats).
    pub settlements_dropped: u64,
}

/// One call's announcement, read from its headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announcement<'a> {
    pub envoy: &'a str,
    pub worker: u64,
    pub dropped: u64,
}

impl<'a> Announcement<'a> {
    /// The announcement of a call with these header values, if they are what the filter sends
    /// (`WORKER` present); `None` for anything else, which is not kept.
    pub fn of(
        envoy: Option<&'a [u8]>,
        worker: Option<&[u8]>,
        dropped: Option<&[u8]>,
    ) -> Option<Announcement<'a>> {
        let envoy = envoy.unwrap_or_default();
        if envoy.len() > MAX_ENVOY_BYTES || !envoy.iter().all(u8::is_ascii_graphic) {
            return None;
        }
        let worker = std::str::from_utf8(worker?).ok()?;
        let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
        if worker.len() != 16 || !worker.chars().all(hex) {
            return None;
        }
        Some(Announcement {
            envoy: std::str::from_utf8(envoy).ok()?,
            worker: u64::from_str_radix(worker, 16).ok()?,
            dropped: std::str::from_utf8(dropped?).ok()?.parse().ok()?,
        })
    }
}

impl Fleet {
    /// Seconds since the fleet was made: its clock.
    pub fn now_s(&self) -> u64 {
        self.epoch.elapsed().as_secs()
    }

    /// Keeps an announcement made at `now_s`.
    pub fn note(&self, now_s: u64, said: &Announcement) {
        let mut envoys = self.envoys.lock().unwrap_or_else(PoisonError::into_inner);
        if !envoys.contains_key(said.envoy) && envoys.len() >= MAX_ENVOYS {
            envoys.retain(|_, seen| now_s.saturating_sub(seen.last_s) < FORGET_S);
            if envoys.len() >= MAX_ENVOYS {
                self.untracked.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        let seen = envoys.entry(said.envoy.into()).or_default();
        seen.last_s = now_s;
        let workers = &mut seen.workers;
        if !workers.contains_key(&said.worker) && workers.len() >= MAX_WORKERS {
            workers.retain(|_, (_, last_s)| now_s.saturating_sub(*last_s) < FORGET_S);
            if workers.len() >= MAX_WORKERS {
                return;
            }
        }
        workers.insert(said.worker, (said.dropped, now_s));
    }

    /// Every Envoy heard from in the last hour, by node id.
    pub fn envoys(&self, now_s: u64) -> Vec<Envoy> {
        let envoys = self.envoys.lock().unwrap_or_else(PoisonError::into_inner);
        let live = |last_s: u64| now_s.saturating_sub(last_s) < FORGET_S;
        let mut listed: Vec<Envoy> = (envoys.iter())
            .filter(|(_, seen)| live(seen.last_s))
            .map(|(envoy, seen)| {
                let workers = seen.workers.values().filter(|(_, last_s)| live(*last_s));
                let (count, dropped) = workers.fold((0, 0u64), |(n, sum), (dropped, _)| {
                    (n + 1, sum.saturating_add(*dropped))
                });
                Envoy {
                    envoy: envoy.to_string(),
                    last_call_s: now_s.saturating_sub(seen.last_s),
                    workers: count,
                    settlements_dropped: dropped,
                }
            })
            .collect();
        listed.sort_by(|a, b| a.envoy.cmp(&b.envoy));
        listed
    }

    /// Announcements not kept: `MAX_ENVOYS` were kept already.
    pub fn untracked(&self) -> u64 {
        self.untracked.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(envoy: &str, worker: u64, dropped: u64) -> Announcement<'_> {
        Announcement {
            envoy,
            worker,
            dropped,
        }
    }

    #[test]
    fn only_what_the_filter_sends_is_an_announcement() {
        let of = |envoy: &'static [u8], worker: &'static [u8], dropped: &'static [u8]| {
            Announcement::of(Some(envoy), Some(worker), Some(dropped))
        };
        assert_eq!(
            of(b"edge-a", b"00000000000000ff", b"3"),
            Some(said("edge-a", 255, 3))
        );
        assert_eq!(
            Announcement::of(None, Some(b"00000000000000ff"), Some(b"0")),
            Some(said("", 255, 0))
        );
        assert_eq!(of(b"edge a", b"00000000000000ff", b"3"), None);
        assert_eq!(of(&[b'x'; 129], b"00000000000000ff", b"3"), None);
        assert_eq!(of(b"edge-a", b"00000000000000FF", b"3"), None);
        assert_eq!(of(b"edge-a", b"ff", b"3"), None);
        assert_eq!(of(b"edge-a", b"00000000000000ff", b"-1"), None);
        assert_eq!(Announcement::of(Some(b"edge-a"), None, Some(b"1")), None);
    }

    #[test]
    fn envoys_are_listed_with_their_workers_drops_and_forgotten_after_an_hour() {
        let fleet = Fleet::default();
        fleet.note(0, &said("edge-b", 1, 0));
        fleet.note(5, &said("edge-a", 1, 2));
        fleet.note(6, &said("edge-a", 2, 1));
        fleet.note(16, &said("edge-a", 1, 4));
        let listed = fleet.envoys(20);
        assert_eq!(
            listed,
            [
                Envoy {
                    envoy: "edge-a".into(),
                    last_call_s: 4,
                    workers: 2,
                    settlements_dropped: 5
                },
                Envoy {
                    envoy: "edge-b".into(),
                    last_call_s: 20,
                    workers: 1,
                    settlements_dropped: 0
                },
            ]
        );
        assert_eq!(fleet.envoys(3_600).len(), 1, "edge-b is an hour old");
        assert_eq!(fleet.envoys(3_606)[0].workers, 1, "worker 2 too");
    }

    #[test]
    fn made_up_names_cannot_grow_it_past_its_bound() {
        let fleet = Fleet::default();
        for i in 0..MAX_ENVOYS + 10 {
            fleet.note(0, &said(&format!("made-up-{i}"), 1, 0));
        }
        assert_eq!(fleet.envoys(1).len(), MAX_ENVOYS);
        assert_eq!(fleet.untracked(), 10);
        for i in 0..MAX_WORKERS as u64 + 10 {
            fleet.note(1, &said("made-up-0", i, 1));
        }
        assert_eq!(fleet.envoys(2)[0].workers, MAX_WORKERS);
        fleet.note(FORGET_S, &said("new", 1, 0));
        assert_eq!(fleet.envoys(FORGET_S).len(), 2, "the old ones make room");
        assert_eq!(fleet.untracked(), 10);
    }
}
