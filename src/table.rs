//! A bounded table of shared-data slots per key layout. Envoy's shared data has no TTL and never
//! frees a key, so one entry per client key would grow without bound; instead each table has a
//! fixed number of slots, created up front (a write that creates an entry ignores CAS, so only
//! pre-created slots are race-free).
//!
//! A key may live in one of two candidate slots. A slot stores its owner's key hash, when it was
//! last used, and the state words of every policy of the layout. A slot used within `RECENT` is
//! in active use and is never taken from its key, whatever its state. A new key takes:
//! 1. a candidate not in active use whose state is idle (every bucket full, every window over:
//!    the caller's `idle_at` says from when): as good as empty, reused without loss;
//! 2. else the least recently used candidate not in active use: that key is forgotten and starts
//!    again from empty (an error of at most one burst), counted as an eviction;
//! 3. else, when both candidates are in active use, the table's one overflow slot, which all such
//!    keys share. A flood of new keys can thus never displace a key in active use: the flood ends
//!    up sharing one budget, and the keys in use keep their exact limits.

use crate::config::TableSpec;
use crate::duration::NANOS_PER_SEC;
use crate::store::{Store, StoreError};
use crate::text::{push_decimal, push_hex16};
use smallvec::{smallvec, SmallVec};

/// A key used this recently is in active use: never evicted.
pub const RECENT: u64 = NANOS_PER_SEC;
/// The owner of the overflow slot, shared by the keys that found no slot of their own.
pub const OVERFLOW_KEY: u64 = 0x6f76_6572_666c_6f77;

/// Words of a slot value before the policies' state: owner, last use.
const HEADER_WORDS: usize = 2;

/// The policies' state words of one slot, inline up to a typical layout's width.
pub type Words = SmallVec<[u64; 8]>;

/// A key's slot as read: where it is, its version, and the policies' state words.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Slot {
    pub name: String,
    pub cas: u32,
    /// Whose state the slot holds once written: the key, or `OVERFLOW_KEY`.
    pub owner: u64,
    pub state: Words,
    /// When the slot was last written.
    pub last_used: u64,
    /// Taking this slot forgets another key's live state.
    pub evicts: bool,
}

impl Slot {
    /// The shared overflow slot rather than the key's own.
    pub fn is_overflow(&self) -> bool {
        self.owner == OVERFLOW_KEY
    }

    /// Whether a write that changes no state should still go, to mark the slot as in use: a
    /// key that is only being denied is in use too, and must not be evicted for a fresh start.
    pub fn needs_touch(&self, now: u64) -> bool {
        self.last_used.saturating_add(RECENT / 2) <= now
    }
}

struct Read {
    name: String,
    cas: u32,
    owner: u64,
    last_used: u64,
    state: Words,
}

impl Read {
    /// `idle_at` says from when a state is as good as empty (asked only of other keys' slots).
    fn is_idle(&self, idle_at: impl Fn(&[u64]) -> u64, now: u64) -> bool {
        self.owner == 0 || idle_at(&self.state) <= now
    }

    fn in_use(&self, now: u64) -> bool {
        self.last_used.saturating_add(RECENT) > now
    }

    /// The slot for `owner`: its state if it already is the owner's, else empty.
    fn take(self, owner: u64, evicts: bool, width: usize) -> Slot {
        let (state, last_used) = if self.owner == owner {
            (self.state, self.last_used)
        } else {
            (smallvec![0; width], 0)
        };
        Slot {
            name: self.name,
            cas: self.cas,
            owner,
            state,
            last_used,
            evicts,
        }
    }
}

/// The shared-data key of slot `index`: `<prefix><layout id>/<index>`. The overflow slot is the
/// one past the last.
pub fn slot_name(prefix: &str, spec: &TableSpec, index: u32) -> String {
    let mut name = String::with_capacity(prefix.len() + 27);
    name.push_str(prefix);
    push_hex16(&mut name, spec.layout_id);
    name.push('/');
    push_decimal(&mut name, index.into());
    name
}

/// Creates every slot (and the overflow slot) that does not exist yet, empty. Run at
/// configuration time, before any request can write a slot.
pub fn create_slots(store: &impl Store, prefix: &str, spec: &TableSpec) -> Result<(), StoreError> {
    let empty = encode(0, 0, &vec![0; spec.width]);
    for index in 0..=spec.capacity {
        let name = slot_name(prefix, spec, index);
        if store.get(&name).is_none() {
            store.set(&name, &empty, 0)?;
        }
    }
    Ok(())
}

/// Finds the slot of the key `hash`, or the slot it should take: one read when the key is in
/// its first candidate, two otherwise, three when it overflows. `idle_at` says from when a
/// slot's state is as good as empty.
pub fn find(
    store: &impl Store,
    prefix: &str,
    spec: &TableSpec,
    hash: u64,
    idle_at: impl Fn(&[u64]) -> u64,
    now: u64,
) -> Slot {
    let (a, b) = candidates(hash, spec.capacity);
    let read = |index| read(store, slot_name(prefix, spec, index), spec.width);
    let width = spec.width;
    let first = read(a);
    if first.owner == hash {
        return first.take(hash, false, width);
    }
    let mut choices = vec![first];
    if a != b {
        let second = read(b);
        if second.owner == hash {
            return second.take(hash, false, width);
        }
        choices.push(second);
    }
    choices.retain(|c| !c.in_use(now));
    if let Some(idle) = choices.iter().position(|c| c.is_idle(&idle_at, now)) {
        return choices.swap_remove(idle).take(hash, false, width);
    }
    if let Some(oldest) = choices.into_iter().min_by_key(|c| c.last_used) {
        return oldest.take(hash, true, width);
    }
    read(spec.capacity).take(OVERFLOW_KEY, false, width)
}

/// Writes the slot's new state, used at `now`, if nobody wrote the slot since it was read.
pub fn write(store: &impl Store, slot: &Slot, state: &[u64], now: u64) -> Result<(), StoreError> {
    store.set(&slot.name, &encode(slot.owner, now, state), slot.cas)
}

fn candidates(hash: u64, capacity: u32) -> (u32, u32) {
    let capacity = u64::from(capacity.max(1));
    let second = hash.rotate_left(32).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    ((hash % capacity) as u32, (second % capacity) as u32)
}

fn read(store: &impl Store, name: String, width: usize) -> Read {
    let (value, cas) = store.get(&name).unwrap_or_default();
    let (owner, last_used, state) =
        decode(&value, width).unwrap_or_else(|| (0, 0, smallvec![0; width]));
    Read {
        name,
        cas,
        owner,
        last_used,
        state,
    }
}

/// Slot value: owner key hash, last use, then the policies' state words, all u64 little-endian.
fn encode(owner: u64, last_used: u64, state: &[u64]) -> SmallVec<[u8; 80]> {
    let mut bytes = SmallVec::with_capacity(value_size(state.len()));
    for word in [owner, last_used].iter().chain(state) {
        bytes.extend_from_slice(&word.to_le_bytes());
    }
    bytes
}

/// `None` for a value of another layout or size: such a slot counts as empty.
fn decode(bytes: &[u8], width: usize) -> Option<(u64, u64, Words)> {
    if bytes.len() != value_size(width) {
        return None;
    }
    let mut words = bytes
        .chunks_exact(8)
        .map(|chunk| u64::from_le_bytes(chunk.try_into().unwrap_or_default()));
    let (owner, last_used) = (words.next()?, words.next()?);
    Some((owner, last_used, words.collect()))
}

/// Bytes of shared data per slot value (the host adds its own per-entry overhead).
pub fn value_size(width: usize) -> usize {
    8 * (HEADER_WORDS + width)
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

    const NOW: u64 = 100 * NANOS_PER_SEC;

    /// Finds the key's slot at `now` and writes `state` into it.
    fn put(store: &MemoryStore, spec: &TableSpec, hash: u64, state: u64, now: u64) -> Slot {
        let slot = find(store, "p/", spec, hash, max, now);
        write(store, &slot, &[state], now).unwrap();
        slot
    }

    #[test]
    fn slots_are_created_once_and_up_front() {
        let store = MemoryStore::default();
        let spec = spec(100, 2);
        create_slots(&store, "p/", &spec).unwrap();
        assert_eq!(store.entry_count(), 101, "100 slots and the overflow slot");
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
        let slot = put(&store, &spec, 42, NOW + 500, NOW);
        let again = find(&store, "p/", &spec, 42, max, NOW);
        assert_eq!(
            (again.name, again.state),
            (slot.name, Words::from_slice(&[NOW + 500]))
        );
    }

    #[test]
    fn a_stale_write_is_refused() {
        let store = MemoryStore::default();
        let spec = spec(10, 1);
        create_slots(&store, "p/", &spec).unwrap();
        let slot = find(&store, "p/", &spec, 42, max, NOW);
        write(&store, &slot, &[1], NOW).unwrap();
        assert_eq!(
            write(&store, &slot, &[2], NOW),
            Err(StoreError::CasMismatch)
        );
    }

    #[test]
    fn an_idle_slot_is_reused_and_an_old_live_one_evicted() {
        let store = MemoryStore::default();
        let spec = spec(1, 1);
        create_slots(&store, "p/", &spec).unwrap();
        put(&store, &spec, 1, NOW + 10 * RECENT, NOW);
        let idle = find(&store, "p/", &spec, 2, max, NOW + 10 * RECENT);
        assert_eq!(
            (idle.is_overflow(), idle.evicts, idle.state),
            (false, false, Words::from_slice(&[0]))
        );
        let old = find(&store, "p/", &spec, 2, max, NOW + RECENT);
        assert_eq!(
            (old.is_overflow(), old.evicts, old.state),
            (false, true, Words::from_slice(&[0]))
        );
    }

    #[test]
    fn a_key_in_active_use_keeps_its_slot_even_when_its_state_is_idle() {
        let store = MemoryStore::default();
        let spec = spec(1, 1);
        create_slots(&store, "p/", &spec).unwrap();
        let mine = put(&store, &spec, 1, NOW, NOW);
        let newcomer = find(&store, "p/", &spec, 2, max, NOW + RECENT - 1);
        assert!(newcomer.is_overflow(), "idle but in use: not free");
        assert_eq!(
            find(&store, "p/", &spec, 1, max, NOW + RECENT - 1).name,
            mine.name
        );
    }

    #[test]
    fn keys_in_active_use_are_never_evicted_newcomers_share_the_overflow() {
        let store = MemoryStore::default();
        let spec = spec(1, 1);
        create_slots(&store, "p/", &spec).unwrap();
        let mine = put(&store, &spec, 1, NOW + 10 * RECENT, NOW);
        let newcomer = put(&store, &spec, 2, NOW + 5, NOW + 1);
        assert!(newcomer.is_overflow());
        let other = find(&store, "p/", &spec, 3, max, NOW + 2);
        assert_eq!(
            (other.is_overflow(), other.state),
            (true, Words::from_slice(&[NOW + 5])),
            "shares the budget"
        );
        let again = find(&store, "p/", &spec, 1, max, NOW + 3);
        assert_eq!(
            (again.name, again.state),
            (mine.name, Words::from_slice(&[NOW + 10 * RECENT]))
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
        let first = put(&store, &spec, 1, NOW + 10_000, NOW);
        let second = put(&store, &spec, twin, NOW + 20_000, NOW);
        assert!(!second.evicts);
        assert_ne!(second.name, first.name);
        assert_eq!(
            find(&store, "p/", &spec, 1, max, NOW).state[..],
            [NOW + 10_000]
        );
        assert_eq!(
            find(&store, "p/", &spec, twin, max, NOW).state[..],
            [NOW + 20_000]
        );
    }

    #[test]
    fn a_slot_of_another_layout_counts_as_empty() {
        assert_eq!(decode(&[1, 2, 3], 1), None);
        assert_eq!(
            decode(&encode(9, 5, &[1, 2]), 2),
            Some((9, 5, Words::from_slice(&[1, 2])))
        );
    }
}
