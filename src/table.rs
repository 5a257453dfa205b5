//! A bounded table of shared-data slots per key layout. Envoy's shared data has no TTL and never
//! frees a key, so one entry per client key would grow without bound; instead each table has a
//! fixed number of slots, created up front (a write that creates an entry ignores CAS, so only
//! pre-created slots are race-free).
//!
//! A key may live in one of two candidate slots. A slot stores its owner's key hash and the
//! state words of every policy of the layout. A slot whose state is idle (every bucket full,
//! every window over: the caller's `idle_at` says from when) is as good as empty and is reused
//! without loss. When both candidates hold other keys' live state, the one idle soonest is taken
//! over: that key starts again from empty (an error of at most one burst) and the eviction is
//! counted.

use crate::config::TableSpec;
use crate::store::{Store, StoreError};

/// A key's slot as read: where it is, its version, and the policies' state words.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Slot {
    pub name: String,
    pub cas: u32,
    pub state: Vec<u64>,
    /// Taking this slot resets another key's live state.
    pub evicts: bool,
}

struct Read {
    name: String,
    cas: u32,
    owner: u64,
    state: Vec<u64>,
    /// From when the state is as good as empty.
    idle_at: u64,
}

impl Read {
    fn is_free(&self, now: u64) -> bool {
        self.owner == 0 || self.idle_at <= now
    }

    fn into_slot(self, mine: bool, evicts: bool, width: usize) -> Slot {
        Slot {
            name: self.name,
            cas: self.cas,
            state: if mine { self.state } else { vec![0; width] },
            evicts,
        }
    }
}

/// The shared-data key of slot `index`: `<prefix><layout id>/<index>`.
pub fn slot_name(prefix: &str, spec: &TableSpec, index: u32) -> String {
    format!("{prefix}{:016x}/{index}", spec.layout_id)
}

/// Creates every slot that does not exist yet, empty. Run at configuration time, before any
/// request can write a slot.
pub fn create_slots(store: &impl Store, prefix: &str, spec: &TableSpec) -> Result<(), StoreError> {
    let empty = encode(0, &vec![0; spec.width]);
    for index in 0..spec.capacity {
        let name = slot_name(prefix, spec, index);
        if store.get(&name).is_none() {
            store.set(&name, &empty, 0)?;
        }
    }
    Ok(())
}

/// Finds the slot of the key `hash`, or the slot it should take: one read when the key is in
/// its first candidate, two otherwise. `idle_at` says from when a slot's state is as good as
/// empty.
pub fn find(
    store: &impl Store,
    prefix: &str,
    spec: &TableSpec,
    hash: u64,
    idle_at: impl Fn(&[u64]) -> u64,
    now: u64,
) -> Slot {
    let (a, b) = candidates(hash, spec.capacity);
    let read = |index| read(store, slot_name(prefix, spec, index), spec.width, &idle_at);
    let first = read(a);
    if first.owner == hash {
        return first.into_slot(true, false, spec.width);
    }
    if a == b {
        let evicts = !first.is_free(now);
        return first.into_slot(false, evicts, spec.width);
    }
    let second = read(b);
    if second.owner == hash {
        second.into_slot(true, false, spec.width)
    } else if first.is_free(now) {
        first.into_slot(false, false, spec.width)
    } else if second.is_free(now) {
        second.into_slot(false, false, spec.width)
    } else if first.idle_at <= second.idle_at {
        first.into_slot(false, true, spec.width)
    } else {
        second.into_slot(false, true, spec.width)
    }
}

/// Writes the key's new state into its slot, if nobody wrote the slot since it was read.
pub fn write(store: &impl Store, slot: &Slot, hash: u64, state: &[u64]) -> Result<(), StoreError> {
    store.set(&slot.name, &encode(hash, state), slot.cas)
}

fn candidates(hash: u64, capacity: u32) -> (u32, u32) {
    let capacity = u64::from(capacity.max(1));
    let second = hash.rotate_left(32).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    ((hash % capacity) as u32, (second % capacity) as u32)
}

fn read(store: &impl Store, name: String, width: usize, idle_at: impl Fn(&[u64]) -> u64) -> Read {
    let (value, cas) = store.get(&name).unwrap_or_default();
    let (owner, state) = decode(&value, width).unwrap_or((0, vec![0; width]));
    Read {
        name,
        cas,
        owner,
        idle_at: idle_at(&state),
        state,
    }
}

/// Slot value: owner key hash, then one TAT per policy, all u64 little-endian.
fn encode(owner: u64, tats: &[u64]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(8 * (1 + tats.len()));
    bytes.extend_from_slice(&owner.to_le_bytes());
    for tat in tats {
        bytes.extend_from_slice(&tat.to_le_bytes());
    }
    bytes
}

/// `None` for a value of another layout or size: such a slot counts as empty.
fn decode(bytes: &[u8], width: usize) -> Option<(u64, Vec<u64>)> {
    if bytes.len() != 8 * (1 + width) {
        return None;
    }
    let mut words = bytes
        .chunks_exact(8)
        .map(|chunk| u64::from_le_bytes(chunk.try_into().unwrap_or_default()));
    let owner = words.next()?;
    Some((owner, words.collect()))
}

/// Bytes of shared data per slot value (the host adds its own per-entry overhead).
pub fn value_size(width: usize) -> usize {
    8 * (1 + width)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    /// Idle when the latest of its words (token-bucket TATs here) has passed.
    fn max(state: &[u64]) -> u64 {
        state.iter().copied().max().unwrap_or(0)
    }

    fn spec(capacity: u32, width: usize) -> TableSpec {
        TableSpec {
            key: Vec::new(),
            capacity,
            width,
            layout_id: 7,
        }
    }

    #[test]
    fn slots_are_created_once_and_up_front() {
        let store = MemoryStore::default();
        let spec = spec(100, 2);
        create_slots(&store, "p/", &spec).unwrap();
        assert_eq!(store.entry_count(), 100);
        let (value, cas) = store.get(&slot_name("p/", &spec, 3)).unwrap();
        assert_eq!(value, vec![0; value_size(2)]);
        create_slots(&store, "p/", &spec).unwrap();
        assert_eq!(
            store.get(&slot_name("p/", &spec, 3)).unwrap().1,
            cas,
            "not rewritten"
        );
    }

    #[test]
    fn a_key_finds_its_own_slot_again() {
        let store = MemoryStore::default();
        let spec = spec(10, 1);
        create_slots(&store, "p/", &spec).unwrap();
        let mut slot = find(&store, "p/", &spec, 42, max, 100);
        assert_eq!(slot.state, [0]);
        slot.state = vec![500];
        write(&store, &slot, 42, &slot.state).unwrap();
        let again = find(&store, "p/", &spec, 42, max, 100);
        assert_eq!((again.name, again.state), (slot.name, vec![500]));
    }

    #[test]
    fn a_stale_write_is_refused() {
        let store = MemoryStore::default();
        let spec = spec(10, 1);
        create_slots(&store, "p/", &spec).unwrap();
        let slot = find(&store, "p/", &spec, 42, max, 100);
        write(&store, &slot, 42, &slot.state).unwrap();
        assert_eq!(
            write(&store, &slot, 42, &slot.state),
            Err(StoreError::CasMismatch)
        );
    }

    #[test]
    fn live_keys_never_share_a_slot_and_full_buckets_are_reused() {
        let store = MemoryStore::default();
        let spec = spec(1, 1);
        create_slots(&store, "p/", &spec).unwrap();
        let mut slot = find(&store, "p/", &spec, 1, max, 100);
        slot.state = vec![200];
        write(&store, &slot, 1, &slot.state).unwrap();
        let other = find(&store, "p/", &spec, 2, max, 150);
        assert_eq!(
            (other.state.clone(), other.evicts),
            (vec![0], true),
            "live: eviction"
        );
        let later = find(&store, "p/", &spec, 2, max, 200);
        assert_eq!(
            (later.state, later.evicts),
            (vec![0], false),
            "full: free reuse"
        );
    }

    #[test]
    fn the_second_candidate_takes_a_colliding_key() {
        let store = MemoryStore::default();
        let spec = spec(1000, 1);
        create_slots(&store, "p/", &spec).unwrap();
        let (a, _) = candidates(1, 1000);
        let twin = (2..)
            .find(|&h| candidates(h, 1000).0 == a && candidates(h, 1000).1 != a)
            .unwrap();
        let mut first = find(&store, "p/", &spec, 1, max, 100);
        first.state = vec![10_000];
        write(&store, &first, 1, &first.state).unwrap();
        let mut second = find(&store, "p/", &spec, twin, max, 100);
        assert!(!second.evicts);
        assert_ne!(second.name, first.name);
        second.state = vec![20_000];
        write(&store, &second, twin, &second.state).unwrap();
        assert_eq!(find(&store, "p/", &spec, 1, max, 100).state, [10_000]);
        assert_eq!(find(&store, "p/", &spec, twin, max, 100).state, [20_000]);
    }

    #[test]
    fn a_slot_of_another_layout_counts_as_empty() {
        assert_eq!(decode(&[1, 2, 3], 1), None);
        assert_eq!(decode(&encode(9, &[1, 2]), 2), Some((9, vec![1, 2])));
    }
}
