//! The heaviest keys of local policies, per worker, published in shared data for the admin path
//! (`<path>/top`) to merge. Each worker keeps, per local policy, a `core::top_keys::Windows` (the
//! minute and hour of refusals and of what was consumed, by key hash), records every decision
//! into it on the request's path (no hostcall: `record`), and once a second sets its `Board` in a
//! worker slot of its own (`publish`): `<prefix>!t<i>` for `i` below `MAX_WORKERS`, taken lowest
//! free first, held while its board is fresher than `LAPSE_S` and taken over after, so that the
//! shared-data entries stay at most `MAX_WORKERS` per plugin however often workers come and go
//! (shared data never frees one). A reader (`read`) reads the slots up to the first never used,
//! and merges only the fresh boards.
//!
//! Memory per worker: at most `MAX_POLICIES` local policies × 20 slots (the minute's 7 and the
//! hour's 13) × 2 measures × `2 × KEPT` entries (163,840 entries, when every slot is full), each
//! with its text when `admin.top_show` names a part (at most `MAX_SHOWN_BYTES`); a board is at
//! most `MAX_POLICIES` × (1 + 2 × (3 + 2 × (2 + 3 × `PUBLISHED`))) words (196 KiB), plus with
//! `top_show` at most 4 × `PUBLISHED` texts of 16 + `MAX_SHOWN_BYTES` bytes per policy (36 KiB),
//! and a policy with nothing in the last hour adds nothing to it.

use crate::core::top_keys::{policy_id, Board, Windows};
use crate::state::store::{Store, StoreError, ABSENT};

/// Keys each sketch keeps (it counts up to twice as many): as the service's.
pub const KEPT: usize = crate::core::top_keys::KEPT_LIVE;
/// Keys a worker publishes of each window and measure: the most an answer lists.
pub const PUBLISHED: usize = KEPT;
/// The local policies recorded per worker (the first ones of the configuration).
pub const MAX_POLICIES: usize = 32;
/// Worker slots in shared data: workers beyond it are not published (the answer says how many
/// workers it merged).
pub const MAX_WORKERS: usize = 128;
/// A board older than this is a worker gone: its slot is free, and readers skip it.
pub const LAPSE_S: u64 = 10;

fn slot_name(prefix: &str, slot: usize) -> String {
    format!("{prefix}!t{slot}")
}

/// One worker's windows of its local policies, and its slot in shared data.
#[derive(Debug)]
pub struct Top {
    /// By policy index: `Some` for the recorded local policies, with their `policy_id`.
    windows: Vec<Option<(u64, Windows)>>,
    worker: u64,
    slot: Option<usize>,
}

impl Top {
    /// Windows for the first `MAX_POLICIES` local policies of `policies` (name, local);
    /// `None` when there is none. `worker` names this worker in its slot (random).
    pub fn new<'a>(policies: impl Iterator<Item = (&'a str, bool)>, worker: u64) -> Option<Top> {
        let mut kept = 0;
        let windows: Vec<Option<(u64, Windows)>> = policies
            .map(|(name, local)| {
                if !local || kept >= MAX_POLICIES {
                    return None;
                }
                kept += 1;
                Some((policy_id(name), Windows::new(KEPT)))
            })
            .collect();
        (kept > 0).then_some(Top {
            windows,
            worker,
            slot: None,
        })
    }

    /// Keeps the slot of the worker `old` was (a reload of the configuration): its board is
    /// replaced, not left beside the new one until it lapses.
    pub fn adopt(&mut self, old: &Top) {
        self.worker = old.worker;
        self.slot = old.slot;
    }

    /// One decision of a local policy's key at `now_s`: refused, or allowed having consumed
    /// `consumed`; `shown` gives the key's text, asked only for a key new to a sketch.
    pub fn record(
        &mut self,
        now_s: u64,
        (policy, key): (usize, u64),
        decided: (bool, u64),
        shown: impl FnOnce() -> Option<Box<str>>,
    ) {
        if let Some(Some((_, windows))) = self.windows.get_mut(policy) {
            windows.record(now_s, key, decided, shown);
        }
    }

    /// Whether this worker holds the first worker slot: the one worker of the Envoy that writes
    /// the minute's log record.
    pub fn holds_first_slot(&self) -> bool {
        self.slot == Some(0)
    }

    /// The recorded policies: their index in the configuration and their `policy_id`.
    pub fn policies(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        (self.windows.iter().enumerate()).filter_map(|(i, w)| Some((i, w.as_ref()?.0)))
    }

    /// Keys counted now, in every sketch of every policy.
    pub fn entries(&self) -> usize {
        self.windows
            .iter()
            .flatten()
            .map(|(_, w)| w.entries())
            .sum()
    }

    /// This worker's board at `now_s`.
    pub fn board(&self, now_s: u64) -> Board {
        Board {
            worker: self.worker,
            at_s: now_s,
            policies: (self.windows.iter().flatten())
                .filter_map(|(id, w)| w.publish(*id, now_s, PUBLISHED))
                .collect(),
        }
    }

    /// Sets this worker's board in its slot, taking one first if it has none (or lost it). A
    /// worker that has recorded nothing in the last hour and holds no slot publishes nothing
    /// (Envoy's main thread runs a root context too: it never takes one).
    pub fn publish(
        &mut self,
        store: &impl Store,
        prefix: &str,
        now_s: u64,
    ) -> Result<(), StoreError> {
        let board = self.board(now_s);
        if board.policies.is_empty() && self.slot.is_none() {
            return Ok(());
        }
        let bytes = board.to_bytes();
        if let Some(slot) = self.slot {
            let name = slot_name(prefix, slot);
            if let Some((held, cas)) = store.get(&name) {
                if header(&held).0 == self.worker {
                    match store.set(&name, &bytes, cas) {
                        Ok(()) => return Ok(()),
                        Err(StoreError::Failed) => return Err(StoreError::Failed),
                        Err(StoreError::CasMismatch) => {}
                    }
                }
            }
            self.slot = None;
        }
        for slot in 0..MAX_WORKERS {
            let name = slot_name(prefix, slot);
            let cas = match store.get(&name) {
                None => ABSENT,
                Some((held, cas)) => {
                    let (worker, at_s) = header(&held);
                    if worker != self.worker && at_s.saturating_add(LAPSE_S) > now_s {
                        continue;
                    }
                    cas
                }
            };
            match store.set(&name, &bytes, cas) {
                Ok(()) => {
                    self.slot = Some(slot);
                    return Ok(());
                }
                Err(StoreError::CasMismatch) => continue,
                Err(StoreError::Failed) => return Err(StoreError::Failed),
            }
        }
        Err(StoreError::CasMismatch)
    }
}

/// A board's worker and time, from its first two words.
fn header(bytes: &[u8]) -> (u64, u64) {
    let word = |at: usize| {
        let word: Option<[u8; 8]> = bytes.get(at..at + 8).and_then(|w| w.try_into().ok());
        u64::from_le_bytes(word.unwrap_or_default())
    };
    (word(0), word(8))
}

/// Every worker's board fresh at `now_s` (published within `LAPSE_S`).
pub fn read(store: &impl Store, prefix: &str, now_s: u64) -> Vec<Board> {
    let mut boards = Vec::new();
    for slot in 0..MAX_WORKERS {
        let Some((bytes, _)) = store.get(&slot_name(prefix, slot)) else {
            break;
        };
        let Some(board) = Board::from_bytes(&bytes) else {
            continue;
        };
        if board.at_s.saturating_add(LAPSE_S) > now_s {
            boards.push(board);
        }
    }
    boards
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::top_keys::{rank, By, Window};
    use crate::state::store::MemoryStore;

    fn top(worker: u64) -> Top {
        let policies = [("global", false), ("api", true), ("user", true)];
        Top::new(policies.into_iter(), worker).unwrap()
    }

    #[test]
    fn two_workers_publish_in_slots_of_their_own_and_a_reader_merges_them() {
        let store = MemoryStore::default();
        let (mut a, mut b) = (top(1), top(2));
        for key in 0..1_000 {
            a.record(100, (1, 10 + key), (true, 0), || None);
            b.record(100, (1, 5_000 + key), (true, 0), || None);
        }
        for _ in 0..300 {
            a.record(100, (1, 7), (true, 0), || None);
            b.record(100, (1, 7), (true, 0), || None);
        }
        b.record(100, (2, 9), (false, 3), || None);
        b.record(100, (0, 9), (true, 0), || None);
        a.publish(&store, "p", 100).unwrap();
        b.publish(&store, "p", 100).unwrap();
        a.publish(&store, "p", 101).unwrap();
        assert_eq!((a.slot, b.slot), (Some(0), Some(1)));
        let boards = read(&store, "p", 101);
        assert_eq!(boards.len(), 2);
        let api = rank(&boards, policy_id("api"), Window::Minute, By::Refused, 1);
        assert_eq!(api.totals.refused, 2_600);
        assert_eq!(api.keys[0].key, 7);
        assert!(api.keys[0].count >= 600 && api.keys[0].count - api.keys[0].error <= 600);
        let user = rank(&boards, policy_id("user"), Window::Hour, By::Consumed, 5);
        assert_eq!((user.keys.len(), user.totals.consumed), (1, 3));
        let global = rank(&boards, policy_id("global"), Window::Hour, By::Refused, 5);
        assert!(global.keys.is_empty());
    }

    #[test]
    fn a_gone_worker_lapses_and_its_slot_is_taken_over_so_slots_stay_bounded() {
        let store = MemoryStore::default();
        let mut gone = top(1);
        gone.record(100, (1, 7), (true, 0), || None);
        gone.publish(&store, "p", 100).unwrap();
        let mut next = top(2);
        next.publish(&store, "p", 105).unwrap();
        assert_eq!(next.slot, None, "nothing recorded, nothing published");
        next.record(105, (2, 1), (true, 0), || None);
        next.publish(&store, "p", 105).unwrap();
        assert_eq!(next.slot, Some(1));
        assert_eq!(read(&store, "p", 109).len(), 2);
        assert_eq!(
            read(&store, "p", 110).len(),
            1,
            "the gone worker's board lapsed"
        );
        let mut third = top(3);
        third.record(110, (2, 1), (true, 0), || None);
        third.publish(&store, "p", 110).unwrap();
        assert_eq!(third.slot, Some(0), "the lapsed slot is taken over");
        // A reload keeps its worker's slot.
        let mut reloaded = top(4);
        reloaded.adopt(&third);
        reloaded.publish(&store, "p", 111).unwrap();
        assert_eq!(reloaded.slot, Some(0));
        assert_eq!(read(&store, "p", 111).len(), 2);
        for slot in 2..MAX_WORKERS {
            assert!(store.get(&slot_name("p", slot)).is_none());
        }
    }

    #[test]
    fn without_local_policies_nothing_is_kept() {
        assert!(Top::new([("global", false)].into_iter(), 1).is_none());
        let many: Vec<String> = (0..MAX_POLICIES + 5).map(|i| format!("p{i}")).collect();
        let top = Top::new(many.iter().map(|n| (n.as_str(), true)), 1).unwrap();
        assert_eq!(top.windows.iter().flatten().count(), MAX_POLICIES);
    }
}
