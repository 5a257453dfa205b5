//! A bounded table of shared-data slots per key layout. Envoy's shared data has no TTL and never
//! frees a key, so one entry per client key would grow without bound; instead each table has
//! exactly `capacity` slots (the largest `max_keys` of its policies), created up front (a write
//! that creates an entry ignores CAS, so only pre-created slots are race-free).
//!
//! A key lives in one of two candidate slots, picked by its hash. A slot stores its owner's key
//! hash, when it was last written, and the state words of every policy of the layout. A key that
//! finds neither candidate its own is new (or lost its slot), and always takes one of them with
//! empty state, so its limit is exact from its first request. It takes the one whose state costs
//! least to forget, which is its debt (`Algorithm::debt`: what its owner spent and has not earned
//! back; a full bucket owes nothing, a drained one its whole burst); of equal debts, the least
//! recently used. Forgetting a state forgives its debt: the owner, coming back, can get at most
//! that many requests more than its limit allows.
//!
//! A key being limited (owing at least half its capacity) keeps its state while there is another
//! way: when both candidates of a new key owe that much, one of their owners moves to its own
//! other candidate if what that slot holds owes less (as in cuckoo hashing). So a flood of new
//! keys that each owe little makes room by forgetting its own kind, never a drained key, and only
//! a table full of keys being limited forgets one of them, the least recently used of the
//! cheapest.

use crate::algorithm::{Debt, FULL_SHARE};
use crate::config::TableSpec;
use crate::duration::NANOS_PER_SEC;
use crate::store::{Store, StoreError};
use crate::text::push_decimal;
use smallvec::{smallvec, SmallVec};

/// A key's slot is rewritten at least this often while the key is being denied (which changes
/// no state), so that among slots that owe the same, the one abandoned longest goes first.
pub const TOUCH_EVERY: u64 = NANOS_PER_SEC / 2;
/// A slot owing this share of its capacity holds a key being limited: kept while there is room
/// elsewhere.
pub const LIMITED: u64 = FULL_SHARE / 2;

/// Words of a slot value before the policies' state: owner, last use.
const HEADER_WORDS: usize = 2;

/// The policies' state words of one slot, inline up to a typical layout's width.
pub type Words = SmallVec<[u64; 8]>;

/// A slot value as stored.
type Value = SmallVec<[u8; 80]>;

/// A key's slot as read: where it is, its version, and the policies' state words.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Slot {
    pub name: String,
    pub cas: u32,
    /// Whose state the slot holds once written.
    pub owner: u64,
    pub state: Words,
    /// When the slot was last written.
    pub last_used: u64,
    /// Set when the key takes the slot from another key (or from nobody). Boxed: a key finding
    /// its own slot, every request but its first, carries no more than a pointer.
    pub takeover: Option<Box<Takeover>>,
}

/// What taking a slot does to its previous owner.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Takeover {
    /// The debt of the state forgotten (none for an empty or idle state, or an owner moved).
    pub forgives: Debt,
    /// The previous owner's state, moved to its other candidate instead of forgotten.
    pub moves: Option<Move>,
}

/// An owner's state on its way to its other candidate slot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Move {
    to: String,
    cas: u32,
    value: Value,
    /// The debt of the state the move forgets there.
    forgives: Debt,
    /// The moved state's own debt: forgiven after all if the move loses a race.
    lost: Debt,
}

/// What a write made the table forget: keys with a debt, and the tokens they owed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Forgotten {
    pub keys: u32,
    pub tokens: u64,
}

impl Forgotten {
    fn of(debt: Debt) -> Forgotten {
        Forgotten {
            keys: u32::from(debt != Debt::default()),
            tokens: debt.tokens,
        }
    }
}

impl Slot {
    /// Whether the key's new state must be written: when it changed, or, for the key's own slot,
    /// to mark it as used (a key only being denied is in use too). A slot just taken is written
    /// only to hold something: taking it for nothing would forget its owner's state for nothing.
    pub fn needs_write(&self, next: &[u64], now: u64) -> bool {
        next != &self.state[..]
            || self.takeover.is_none() && self.last_used.saturating_add(TOUCH_EVERY) <= now
    }
}

struct Read {
    index: u32,
    name: String,
    cas: u32,
    owner: u64,
    last_used: u64,
    state: Words,
}

impl Read {
    /// The slot as its owner's.
    fn own(self) -> Slot {
        Slot {
            name: self.name,
            cas: self.cas,
            owner: self.owner,
            state: self.state,
            last_used: self.last_used,
            takeover: None,
        }
    }

    /// The slot for a new owner, empty.
    fn take(self, owner: u64, takeover: Takeover, width: usize) -> Slot {
        Slot {
            name: self.name,
            cas: self.cas,
            owner,
            state: smallvec![0; width],
            last_used: 0,
            takeover: Some(Box::new(takeover)),
        }
    }

    /// The owner's other candidate, if it has one: where it can move.
    fn other_candidate(&self, capacity: u32) -> Option<u32> {
        match candidates(self.owner, capacity) {
            (a, b) if a == self.index && b != a => Some(b),
            (a, b) if b == self.index && b != a => Some(a),
            _ => None,
        }
    }

    /// What forgetting the state costs: nothing for an empty slot, or one its owner would never
    /// look in (a slot placed under another `max_keys`).
    fn debt(&self, capacity: u32, debt: &impl Fn(&[u64]) -> Debt) -> Debt {
        let (a, b) = candidates(self.owner, capacity);
        if self.owner == 0 || (a != self.index && b != self.index) {
            return Debt::default();
        }
        debt(&self.state)
    }
}

/// The shared-data key of slot `index`: `<prefix><layout id>/<index>`.
pub fn slot_name(prefix: &str, spec: &TableSpec, index: u32) -> String {
    let mut name = String::with_capacity(prefix.len() + 27);
    name.push_str(prefix);
    name.push_str(&spec.layout_id);
    name.push('/');
    push_decimal(&mut name, index.into());
    name
}

/// Creates every slot that does not exist yet, empty. Run at configuration time, before any
/// request can write a slot.
pub fn create_slots(store: &impl Store, prefix: &str, spec: &TableSpec) -> Result<(), StoreError> {
    let empty = encode(0, 0, &vec![0; spec.width]);
    for index in 0..spec.capacity {
        let name = slot_name(prefix, spec, index);
        if store.get(&name).is_none() {
            store.set(&name, &empty, 0)?;
        }
    }
    Ok(())
}

/// Finds the slot of the key `hash`, or the slot it takes: one read when the key is in its first
/// candidate, two otherwise, four when both candidates hold keys being limited. `debt` says what
/// a slot's state owes now.
pub fn find(
    store: &impl Store,
    prefix: &str,
    spec: &TableSpec,
    hash: u64,
    debt: impl Fn(&[u64]) -> Debt,
) -> Slot {
    let (a, b) = candidates(hash, spec.capacity);
    let read = |index| read(store, prefix, spec, index);
    let first = read(a);
    if first.owner == hash {
        return first.own();
    }
    let mut choices: SmallVec<[Read; 2]> = smallvec![first];
    if a != b {
        let second = read(b);
        if second.owner == hash {
            return second.own();
        }
        choices.push(second);
    }
    take(store, prefix, spec, hash, choices, &debt)
}

/// The candidate a new key takes: the cheapest to forget, unless both hold keys being limited and
/// one of those can move somewhere cheaper. Out of line: a key's first request only.
#[inline(never)]
fn take(
    store: &impl Store,
    prefix: &str,
    spec: &TableSpec,
    hash: u64,
    choices: SmallVec<[Read; 2]>,
    debt: &impl Fn(&[u64]) -> Debt,
) -> Slot {
    let capacity = spec.capacity;
    let mut priced: SmallVec<[(Read, Debt); 2]> = choices
        .into_iter()
        .map(|c| {
            let owed = c.debt(capacity, debt);
            (c, owed)
        })
        .collect();
    let cheapest = (priced.iter().enumerate())
        .min_by_key(|(_, (c, owed))| (*owed, c.last_used))
        .map_or(0, |(i, _)| i);
    let floor = priced
        .get(cheapest)
        .map_or(Debt::default(), |(_, owed)| *owed);
    if floor.share >= LIMITED {
        let candidates: SmallVec<[u32; 2]> = priced.iter().map(|(c, _)| c.index).collect();
        let moves = priced.iter().enumerate().filter_map(|(i, (owner, _))| {
            let to = owner.other_candidate(capacity)?;
            let there = read(store, prefix, spec, to);
            let owed = there.debt(capacity, debt);
            let movable = !candidates.contains(&to) && there.owner != owner.owner && owed < floor;
            movable.then_some((i, there, owed))
        });
        let best = moves.min_by_key(|(_, there, owed)| (*owed, there.last_used));
        if let Some((i, there, forgives)) = best {
            let (owner, lost) = priced.swap_remove(i);
            let moves = Move {
                to: there.name,
                cas: there.cas,
                value: encode(owner.owner, owner.last_used, &owner.state),
                forgives,
                lost,
            };
            let takeover = Takeover {
                forgives: Debt::default(),
                moves: Some(moves),
            };
            return owner.take(hash, takeover, spec.width);
        }
    }
    let (victim, forgives) = priced.swap_remove(cheapest);
    let takeover = Takeover {
        forgives,
        moves: None,
    };
    victim.take(hash, takeover, spec.width)
}

/// Writes the slot's new state, used at `now`, if nobody wrote the slot since it was read; then
/// moves the previous owner, if it moves. Returns what the table forgot.
pub fn write(
    store: &impl Store,
    slot: &Slot,
    state: &[u64],
    now: u64,
) -> Result<Forgotten, StoreError> {
    store.set(&slot.name, &encode(slot.owner, now, state), slot.cas)?;
    let Some(takeover) = &slot.takeover else {
        return Ok(Forgotten::default());
    };
    Ok(match &takeover.moves {
        None => Forgotten::of(takeover.forgives),
        Some(m) => match store.set(&m.to, &m.value, m.cas) {
            Ok(()) => Forgotten::of(m.forgives),
            // Someone wrote the destination meanwhile: the moved state is lost after all.
            Err(_) => Forgotten::of(m.lost),
        },
    })
}

/// The key's two candidate slots (the same one when the table has one slot).
pub fn candidates(hash: u64, capacity: u32) -> (u32, u32) {
    let capacity = u64::from(capacity.max(1));
    let second = hash.rotate_left(32).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    ((hash % capacity) as u32, (second % capacity) as u32)
}

fn read(store: &impl Store, prefix: &str, spec: &TableSpec, index: u32) -> Read {
    let name = slot_name(prefix, spec, index);
    let (value, cas) = store.get(&name).unwrap_or_default();
    let (owner, last_used, state) =
        decode(&value, spec.width).unwrap_or_else(|| (0, 0, smallvec![0; spec.width]));
    Read {
        index,
        name,
        cas,
        owner,
        last_used,
        state,
    }
}

/// Slot value: owner key hash, last use, then the policies' state words, all u64 little-endian.
fn encode(owner: u64, last_used: u64, state: &[u64]) -> Value {
    let mut bytes: Value = smallvec![0; value_size(state.len())];
    // Into eight-byte chunks: each word one store, not a call to copy eight bytes.
    let words = [owner, last_used].into_iter().chain(state.iter().copied());
    for (chunk, word) in bytes.chunks_exact_mut(8).zip(words) {
        chunk.copy_from_slice(&word.to_le_bytes());
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

/// Every slot's owner (0: none), in slot order: what tests compare before and after a request.
#[cfg(test)]
pub fn owners(store: &impl Store, prefix: &str, spec: &TableSpec) -> Vec<u64> {
    (0..spec.capacity)
        .map(|index| read(store, prefix, spec, index).owner)
        .collect()
}

/// Bytes of shared data per slot value (the host adds its own per-entry overhead).
pub fn value_size(width: usize) -> usize {
    8 * (HEADER_WORDS + width)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    /// Tokens owed out of a capacity of 4: the first state word, as the tests write it.
    fn owes(state: &[u64]) -> Debt {
        let tokens = state.first().copied().unwrap_or(0);
        Debt {
            share: tokens * FULL_SHARE / 4,
            tokens,
        }
    }

    fn spec(capacity: u32) -> TableSpec {
        TableSpec {
            key: Vec::new(),
            capacity,
            width: 1,
            layout_id: "0000000000000007".into(),
            shares_key: false,
        }
    }

    const NOW: u64 = 100 * NANOS_PER_SEC;

    fn table(capacity: u32) -> (MemoryStore, TableSpec) {
        let store = MemoryStore::default();
        let spec = spec(capacity);
        create_slots(&store, "p/", &spec).unwrap();
        (store, spec)
    }

    /// Finds the key's slot at `now` and writes `tokens` owed into it: what the table forgot.
    fn put(store: &MemoryStore, spec: &TableSpec, hash: u64, tokens: u64, now: u64) -> Forgotten {
        let slot = find(store, "p/", spec, hash, owes);
        write(store, &slot, &[tokens], now).unwrap()
    }

    /// What the key's slot holds, if it has one.
    fn owed_by(store: &MemoryStore, spec: &TableSpec, hash: u64) -> Option<u64> {
        let slot = find(store, "p/", spec, hash, owes);
        slot.takeover.is_none().then(|| slot.state[0])
    }

    /// Key hashes spread over all 64 bits, as real ones are.
    fn hashes() -> impl Iterator<Item = u64> {
        (1u64..).map(|i| i.wrapping_mul(0x2545_f491_4f6c_dd1d))
    }

    /// Keys whose two candidates are `pair`, in either order.
    fn keys_on(pair: (u32, u32), capacity: u32) -> impl Iterator<Item = u64> {
        hashes().filter(move |&h| {
            let c = candidates(h, capacity);
            c == pair || c == (pair.1, pair.0)
        })
    }

    #[test]
    fn slots_are_created_once_up_front_and_exactly_max_keys_of_them() {
        let (store, spec) = table(100);
        assert_eq!(store.entry_count(), 100);
        let (value, cas) = store.get(&slot_name("p/", &spec, 3)).unwrap();
        assert_eq!(value, vec![0; value_size(1)]);
        create_slots(&store, "p/", &spec).unwrap();
        let again = store.get(&slot_name("p/", &spec, 3)).unwrap().1;
        assert_eq!(again, cas, "not rewritten");
    }

    #[test]
    fn a_key_finds_its_own_slot_again() {
        let (store, spec) = table(10);
        put(&store, &spec, 42, 3, NOW);
        assert_eq!(owed_by(&store, &spec, 42), Some(3));
    }

    #[test]
    fn a_stale_write_is_refused() {
        let (store, spec) = table(10);
        let slot = find(&store, "p/", &spec, 42, owes);
        write(&store, &slot, &[1], NOW).unwrap();
        assert_eq!(
            write(&store, &slot, &[2], NOW),
            Err(StoreError::CasMismatch)
        );
    }

    #[test]
    fn a_new_key_takes_the_candidate_that_owes_least_and_forgives_its_debt() {
        let (store, spec) = table(64);
        let mut keys = keys_on((3, 9), 64);
        let (light, heavy, new) = (
            keys.next().unwrap(),
            keys.next().unwrap(),
            keys.next().unwrap(),
        );
        put(&store, &spec, heavy, 3, NOW);
        put(&store, &spec, light, 1, NOW + 1);
        assert_eq!(
            put(&store, &spec, new, 1, NOW + 2),
            Forgotten { keys: 1, tokens: 1 }
        );
        assert_eq!(
            owed_by(&store, &spec, light),
            None,
            "forgotten, though used later"
        );
        assert_eq!(owed_by(&store, &spec, heavy), Some(3));
        assert_eq!(owed_by(&store, &spec, new), Some(1));
    }

    #[test]
    fn of_equal_debts_the_least_recently_used_goes_and_an_idle_state_costs_nothing() {
        let (store, spec) = table(64);
        let mut keys = keys_on((3, 9), 64);
        let [old, recent, new, newer] = [(); 4].map(|_| keys.next().unwrap());
        put(&store, &spec, old, 1, NOW);
        put(&store, &spec, recent, 1, NOW + 1);
        put(&store, &spec, new, 0, NOW + 2);
        assert_eq!(owed_by(&store, &spec, old), None);
        assert_eq!(owed_by(&store, &spec, recent), Some(1));
        let reused = put(&store, &spec, newer, 2, NOW + 3);
        assert_eq!(reused, Forgotten::default(), "new's state owed nothing");
    }

    /// The first key whose candidates are `first` then `second`.
    fn key_at(first: u32, second: u32) -> u64 {
        hashes()
            .find(|&h| candidates(h, 64) == (first, second))
            .unwrap()
    }

    /// Drained keys in slots 3 (other candidate 20) and 9 (other candidate 30), a key owing 1 in
    /// slot 20, and a newcomer whose candidates are 3 and 9.
    fn two_drained_keys(store: &MemoryStore, spec: &TableSpec) -> (u64, u64, u64) {
        let (a, b) = (key_at(3, 20), key_at(9, 30));
        put(store, spec, a, 4, NOW);
        put(store, spec, b, 4, NOW + 1);
        put(store, spec, key_at(20, 41), 1, NOW + 2);
        (a, b, key_at(3, 9))
    }

    #[test]
    fn when_both_candidates_hold_keys_being_limited_one_moves_to_its_other_candidate() {
        let (store, spec) = table(64);
        let (a, b, newcomer) = two_drained_keys(&store, &spec);
        let forgot = put(&store, &spec, newcomer, 1, NOW + 3);
        assert_eq!(forgot, Forgotten::default(), "b moved to the empty slot 30");
        assert_eq!(owed_by(&store, &spec, newcomer), Some(1));
        assert_eq!(
            (owed_by(&store, &spec, a), owed_by(&store, &spec, b)),
            (Some(4), Some(4))
        );
        let moved = find(&store, "p/", &spec, b, owes);
        assert_eq!(moved.name, slot_name("p/", &spec, 30));
    }

    #[test]
    fn a_table_full_of_keys_being_limited_forgets_the_least_recently_used() {
        let (store, spec) = table(1);
        put(&store, &spec, 1, 4, NOW);
        assert_eq!(
            put(&store, &spec, 2, 1, NOW + 1),
            Forgotten { keys: 1, tokens: 4 }
        );
        assert_eq!(owed_by(&store, &spec, 1), None);
    }

    #[test]
    fn two_keys_taking_one_slot_at_once_never_share_its_state() {
        let (store, spec) = table(1);
        put(&store, &spec, 1, 2, NOW);
        let for_two = find(&store, "p/", &spec, 2, owes);
        let for_three = find(&store, "p/", &spec, 3, owes);
        assert_eq!(
            (for_two.state[0], for_three.state[0]),
            (0, 0),
            "both start empty"
        );
        write(&store, &for_two, &[1], NOW).unwrap();
        assert_eq!(
            write(&store, &for_three, &[1], NOW),
            Err(StoreError::CasMismatch)
        );
        let again = find(&store, "p/", &spec, 3, owes);
        assert_eq!(
            (again.owner, again.state[0]),
            (3, 0),
            "read again: two's state is not three's"
        );
        assert_eq!(owed_by(&store, &spec, 2), Some(1));
    }

    #[test]
    fn a_move_that_loses_its_race_forgets_the_moved_key_and_says_so() {
        let (store, spec) = table(64);
        let (_, b, newcomer) = two_drained_keys(&store, &spec);
        let slot = find(&store, "p/", &spec, newcomer, owes);
        let to = slot_name("p/", &spec, 30);
        store.set(&to, &encode(99, NOW, &[0]), 0).unwrap();
        assert_eq!(
            write(&store, &slot, &[1], NOW + 3),
            Ok(Forgotten { keys: 1, tokens: 4 })
        );
        assert_eq!(owed_by(&store, &spec, b), None);
    }

    #[test]
    fn a_slot_its_owner_would_never_look_in_costs_nothing() {
        let (store, spec) = table(64);
        let stray = hashes()
            .find(|&h| candidates(h, 64).0 != 5 && candidates(h, 64).1 != 5)
            .unwrap();
        store
            .set(&slot_name("p/", &spec, 5), &encode(stray, NOW, &[4]), 0)
            .unwrap();
        let key = hashes().find(|&h| candidates(h, 64).0 == 5).unwrap();
        assert_eq!(put(&store, &spec, key, 1, NOW), Forgotten::default());
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
