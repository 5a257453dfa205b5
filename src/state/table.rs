//! A bounded table of key states per key, in shared data, that grows as keys arrive.
//!
//! Envoy's shared data has no TTL and never frees an entry, and each entry costs it about a
//! hundred bytes of its own; so keys are kept in pages: one shared-data entry holds up to
//! `PAGE_SLOTS` keys (fewer when their state is wide, so that a read copies at most about
//! `PAGE_BYTES`). A table of `max_keys` keys has `max_keys / slots per page` pages (rounded up),
//! each with its share of `max_keys`; a key's page is picked by its hash. A page is created by
//! the first key that lands in it and holds only the keys it was given, so memory grows with the
//! keys held, never past `max_keys` of them.
//!
//! A page value: the page's clock (u64), then one record per key: its owner (the key's hash,
//! u64), the tag of its layout (u32), its last use and when its state will owe nothing (Unix
//! seconds modulo 2^16, u16 each: they only order records and price other layouts', within
//! hours), its width (u16), and its state words (u64 each), all little-endian. A page more than
//! half full is padded with zeros to its whole size, so that a full table's pages end up in one
//! of the host allocator's size classes rather than strewn over the twenty they grew through
//! (which left half of a full table's memory in free lists).
//!
//! **Layouts share pages.** A table's pages are named after its key alone, and each record is
//! tagged with its layout (the policies of the key, their widths, and the page count): a new
//! configuration of the same key writes its own records into the same pages and the old ones are
//! forgotten as room is needed, so configuration changes reuse memory instead of adding to it;
//! and two configurations alive at once (one draining after a reload) keep their states apart.
//!
//! **Exact from a key's first request.** A page is created with a write at a version no entry
//! has (`ABSENT`): if another worker created it meanwhile, the write fails like any lost race,
//! and the key is decided again on what that worker wrote. Every writer of a page also moves the
//! page's clock to the time it decided at, and nobody decides a page earlier than its clock: two
//! workers deciding one key at once read the clock a moment apart, and the one that read it
//! first would otherwise see the other's tokens as taken before its own request arrived.
//!
//! **Who gets a slot.** A key that finds no record of its own in its page (a new key, or one that
//! was forgotten) takes a new one, with empty state, so its limit is exact from its first
//! request. In a full page it takes the place of the record that costs least to forget: its
//! debt (`Algorithm::debt`: what its owner spent and has not earned back; a full bucket owes
//! nothing), the least recently used of equal debts. A record of another layout cannot be priced
//! so: it counts as owing half its capacity (as a key being limited) while its owner still uses
//! it (`IN_USE`) and said it owes something, and nothing otherwise: the records of a layout no
//! longer configured make room first. Forgetting a state forgives its debt: the owner, coming
//! back, can get at most that many requests more than its limit allows. So a key being limited
//! keeps its state while its page holds one that owes less, and a flood of new keys that each
//! owe little makes room by forgetting its own kind.

use crate::core::algorithm::{Debt, FULL_SHARE};
use crate::core::duration::NANOS_PER_SEC;
use crate::core::key::KeyPart;
use crate::core::text::push_base64;
use crate::state::store::{Store, StoreError, ABSENT};
use smallvec::{smallvec, SmallVec};

/// A key's record is rewritten at least this often while the key is being denied (which changes
/// no state), so that among records that owe the same, the one abandoned longest goes first.
pub const TOUCH_EVERY: u64 = NANOS_PER_SEC;
/// The debt share a record of another layout counts as while it is in use and owes something.
pub const LIMITED: u64 = FULL_SHARE / 2;
/// A record of another layout is in use while its owner wrote it this recently (a key being
/// denied rewrites it every `TOUCH_EVERY`): a layout no longer configured gives its room up.
pub const IN_USE: u64 = 10 * NANOS_PER_SEC;
/// The most keys of one page.
pub const PAGE_SLOTS: usize = 32;
/// About the most bytes of one page: wide states get fewer keys a page.
pub const PAGE_BYTES: usize = 1024;
/// The most state words of one key (the sum of its table's policies' columns).
pub const MAX_WIDTH: usize = u16::MAX as usize;
/// A page's clock may be ahead of a worker's by this much: more, and it is not trusted.
const MAX_SKEW: u64 = NANOS_PER_SEC;

const CLOCK_BYTES: usize = 8;
/// owner, tag, last use, free at, width.
const RECORD_HEADER: usize = 8 + 4 + 2 + 2 + 2;
/// The farthest ahead a record's `free_at` says: further would wrap around its u16.
const MAX_OWING_SECS: u64 = (1 << 15) - 1;

/// The policies' state words of one key, inline up to a typical layout's width.
pub type Words = SmallVec<[u64; 8]>;

/// One table: the keys of one key layout, in its pages.
#[derive(Debug, Clone)]
pub struct TableSpec {
    pub key: Vec<KeyPart>,
    /// `max_keys`: the most keys the table holds.
    pub capacity: u32,
    /// Words of state per key: the sum of its policies' columns.
    pub width: usize,
    /// Some policy of the table is global or has bypass entries: its keys' shared hashes are
    /// needed, not only their slot hashes.
    pub shares_key: bool,
    /// Tells this layout's records from others' in the same pages.
    pub tag: u32,
    /// Names the pages after the key alone: every layout of the key shares them.
    pub space: String,
    pub pages: u32,
    /// Keys per page: the slots per page, except that the pages share `capacity` out exactly.
    per_page: u32,
}

impl TableSpec {
    /// A table of `capacity` keys of `width` words; `key_id` identifies what the key reads and
    /// `layout_id` the policies' names and widths.
    pub fn new(
        key: Vec<KeyPart>,
        capacity: u32,
        width: usize,
        shares_key: bool,
        (key_id, layout_id): (u64, u64),
    ) -> TableSpec {
        let slots = (PAGE_BYTES / record_size(width)).clamp(1, PAGE_SLOTS) as u32;
        let capacity = capacity.max(1);
        let pages = capacity.div_ceil(slots);
        let tag = layout_id ^ key_id.rotate_left(17) ^ u64::from(pages).wrapping_mul(0x9e37);
        let mut space = String::with_capacity(5);
        push_base64(&mut space, key_id & 0x3fff_ffff, 5);
        TableSpec {
            key,
            capacity,
            width,
            shares_key,
            tag: (tag ^ (tag >> 32)) as u32,
            space,
            pages,
            per_page: capacity / pages,
        }
    }

    /// The page of the key `hash`.
    pub fn page_of(&self, hash: u64) -> u32 {
        (hash % u64::from(self.pages)) as u32
    }

    /// How many keys page `page` holds: `capacity` shared out, the first pages one more.
    pub fn page_capacity(&self, page: u32) -> usize {
        let extra = u32::from(page < self.capacity % self.pages);
        (self.per_page + extra) as usize
    }
}

/// A plugin's prefix for its pages' names: short, so that Envoy keeps each name inline (up to
/// 15 bytes need no allocation of their own), and apart from other plugins' of the same VM.
pub fn prefix(plugin: &str) -> String {
    let hash =
        crate::core::key::hash_values(&[plugin.to_string()], &crate::core::key::HashSecret::PUBLIC);
    let mut prefix = String::from("s");
    push_base64(&mut prefix, hash & 0x3fff_ffff, 5);
    prefix
}

/// The shared-data key of a table's page: `<prefix><space><page>`, the page in base 64.
pub fn page_name(prefix: &str, spec: &TableSpec, page: u32) -> String {
    let mut name = String::with_capacity(prefix.len() + spec.space.len() + 4);
    name.push_str(prefix);
    name.push_str(&spec.space);
    push_base64(&mut name, page.into(), 1);
    name
}

/// A key's slot as read: its page, the key's record in it (or where it goes), its state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Slot {
    pub name: String,
    /// The page's version as read; 0: the page does not exist yet.
    pub cas: u32,
    /// Whose state the slot holds once written.
    pub owner: u64,
    pub state: Words,
    /// When the key's record was last written: Unix seconds modulo 2^16.
    last_used: u16,
    /// When its record said its state owes nothing: Unix seconds modulo 2^16.
    free_at: u16,
    /// The latest time a writer of the page decided at.
    pub clock: u64,
    /// Set when the key takes a new record: what forgetting the one it replaces forgives.
    pub takeover: Option<Debt>,
    tag: u32,
    /// The page as read: its clock and its valid records.
    page: Vec<u8>,
    place: Place,
    /// The page's records once written, and how many it holds at most.
    records: usize,
    capacity: usize,
}

/// Where the key's record is, or goes, in its page.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Place {
    /// At this offset, the key's own.
    Own(usize),
    /// After the others.
    #[default]
    Append,
    /// In place of the record at this offset, of this many bytes.
    Replace(usize, usize),
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
    /// Whether the key's new state must be written: when it changed, or, for the key's own
    /// record, to mark it as used (a key only being denied is in use too). A new record is
    /// written only to hold something: taking a place for nothing would forget its owner's
    /// state for nothing.
    pub fn needs_write(&self, next: &[u64], now: u64) -> bool {
        next != &self.state[..]
            || self.takeover.is_none() && age(self.last_used, now) >= TOUCH_EVERY / NANOS_PER_SEC
    }

    /// When the key's record said its state owes nothing, as of `now` (never before it): what a
    /// write that changes one policy's words keeps for the others.
    pub fn free_at(&self, now: u64) -> u64 {
        let ahead = self.free_at.wrapping_sub(stamp(now)) as i16;
        let secs = u64::try_from(ahead).unwrap_or(0);
        now.saturating_add(secs * NANOS_PER_SEC)
    }

    /// The time to decide the slot at, for a worker whose clock says `now`: the page's clock if
    /// that is a little later (see the module's doc), else `now`.
    pub fn time(&self, now: u64) -> u64 {
        match self.clock {
            clock if clock > now && clock - now <= MAX_SKEW => clock,
            _ => now,
        }
    }
}

/// Unix seconds modulo 2^16, as records keep their times.
fn stamp(time: u64) -> u16 {
    (time / NANOS_PER_SEC) as u16
}

/// Whole seconds from `then` (a stamp) to `now`, modulo 2^16.
fn age(then: u16, now: u64) -> u64 {
    u64::from(stamp(now).wrapping_sub(then))
}

/// A record as found in a page.
struct Record<'a> {
    at: usize,
    owner: u64,
    tag: u32,
    last_used: u16,
    free_at: u16,
    words: &'a [u8],
}

impl Record<'_> {
    fn len(&self) -> usize {
        RECORD_HEADER + self.words.len()
    }

    fn state(&self) -> Words {
        self.words.chunks_exact(8).map(word).collect()
    }

    /// What forgetting the record costs at `now`: its debt for a record of this layout; for
    /// another layout's, `LIMITED` while its owner still uses it and said it owes something,
    /// else nothing.
    fn price(&self, tag: u32, now: u64, debt: &impl Fn(&[u64]) -> Debt) -> Debt {
        if self.tag == tag {
            return debt(&self.state());
        }
        let used = age(self.last_used, now) < IN_USE / NANOS_PER_SEC;
        let owes = (self.free_at.wrapping_sub(stamp(now)) as i16) > 0;
        Debt {
            share: if used && owes { LIMITED } else { 0 },
            tokens: 0,
        }
    }
}

/// The records of a page after its clock, up to its padding or the first that does not parse (a
/// page written by another version, or corrupt, is valid up to there).
fn records(page: &[u8]) -> impl Iterator<Item = Record<'_>> {
    let mut at = CLOCK_BYTES;
    std::iter::from_fn(move || {
        let header = page.get(at..at + RECORD_HEADER)?;
        let number = |range: std::ops::Range<usize>| {
            let bytes = header.get(range).unwrap_or_default();
            bytes
                .iter()
                .rev()
                .fold(0u64, |n, &b| (n << 8) | u64::from(b))
        };
        let owner = number(0..8);
        let width = number(16..18) as usize;
        let start = at + RECORD_HEADER;
        let words = page.get(start..start + 8 * width).filter(|_| owner != 0)?;
        let record = Record {
            at,
            owner,
            tag: number(8..12) as u32,
            last_used: number(12..14) as u16,
            free_at: number(14..16) as u16,
            words,
        };
        at = start + words.len();
        Some(record)
    })
}

/// Finds the record of the key `hash` in its page, or the place it takes, at `now`: one read.
/// `debt` says what a state of this layout owes at `now`.
pub fn find(
    store: &impl Store,
    prefix: &str,
    spec: &TableSpec,
    hash: u64,
    now: u64,
    debt: impl Fn(&[u64]) -> Debt,
) -> Slot {
    // An owner of 0 would read as padding: the one hash in 2^64 that is 0 goes with 1.
    let hash = hash.max(1);
    let page = spec.page_of(hash);
    let name = page_name(prefix, spec, page);
    let (mut bytes, cas) = store.get(&name).unwrap_or_default();
    let mut slot = Slot {
        name,
        cas,
        owner: hash,
        state: smallvec![0; spec.width],
        tag: spec.tag,
        ..Slot::default()
    };
    let (mut count, mut valid) = (0, CLOCK_BYTES);
    for record in records(&bytes) {
        if record.owner == hash && record.tag == spec.tag && record.words.len() == 8 * spec.width {
            slot.state = record.state();
            slot.last_used = record.last_used;
            slot.free_at = record.free_at;
            slot.place = Place::Own(record.at);
        }
        count += 1;
        valid = record.at + record.len();
    }
    slot.clock = bytes.get(..CLOCK_BYTES).map_or(0, word);
    bytes.resize(valid, 0);
    (slot.capacity, slot.records) = (spec.page_capacity(page), count);
    if slot.place == Place::Append && count >= slot.capacity {
        let (place, price) = replace(&bytes, spec.tag, now, &debt);
        (slot.place, slot.takeover) = (place, Some(price));
    } else if slot.place == Place::Append {
        slot.takeover = Some(Debt::default());
        slot.records += 1;
    }
    slot.page = bytes;
    slot
}

/// In a full page, the record a new key replaces, and what forgetting it costs: the cheapest to
/// forget, the least recently used of equal prices. Out of line: a key's first request only.
#[inline(never)]
fn replace(page: &[u8], tag: u32, now: u64, debt: &impl Fn(&[u64]) -> Debt) -> (Place, Debt) {
    let oldest_first = |r: &Record| std::cmp::Reverse(age(r.last_used, now));
    let priced =
        records(page).map(|r| ((r.price(tag, now, debt), oldest_first(&r)), r.at, r.len()));
    match priced.min_by_key(|(price, ..)| *price) {
        Some(((price, _), at, len)) => (Place::Replace(at, len), price),
        None => (Place::Append, Debt::default()),
    }
}

/// Writes the key's new state, decided at `now` and owing nothing from `free_at` on, if nobody
/// wrote its page since it was read. Returns what the table forgot.
pub fn write(
    store: &impl Store,
    slot: &Slot,
    state: &[u64],
    now: u64,
    free_at: u64,
) -> Result<Forgotten, StoreError> {
    let cas = if slot.cas == 0 { ABSENT } else { slot.cas };
    store.set(&slot.name, &page_with(slot, state, now, free_at), cas)?;
    Ok(slot.takeover.map(Forgotten::of).unwrap_or_default())
}

/// The page as read with the key's record written in its place, padded to its whole size once
/// more than half full.
fn page_with(slot: &Slot, state: &[u64], now: u64, free_at: u64) -> Vec<u8> {
    let width = u16::try_from(state.len()).unwrap_or(u16::MAX);
    let owing = free_at.saturating_sub(now).div_ceil(NANOS_PER_SEC);
    let free_at = now.saturating_add(owing.min(MAX_OWING_SECS) * NANOS_PER_SEC);
    let mut record = Vec::with_capacity(record_size(state.len()));
    record.extend_from_slice(&slot.owner.to_le_bytes());
    record.extend_from_slice(&slot.tag.to_le_bytes());
    record.extend_from_slice(&stamp(now).to_le_bytes());
    record.extend_from_slice(&stamp(free_at).to_le_bytes());
    record.extend_from_slice(&width.to_le_bytes());
    for w in state {
        record.extend_from_slice(&w.to_le_bytes());
    }
    let page = &slot.page;
    let (before, after) = match slot.place {
        Place::Own(at) => (at, at + record.len()),
        Place::Append => (page.len(), page.len()),
        Place::Replace(at, len) => (at, at + len),
    };
    let mut bytes = Vec::with_capacity(page.len() + record.len());
    bytes.extend_from_slice(&slot.clock.max(now).to_le_bytes());
    bytes.extend_from_slice(page.get(CLOCK_BYTES..before).unwrap_or_default());
    bytes.extend_from_slice(&record);
    bytes.extend_from_slice(page.get(after..).unwrap_or_default());
    if 2 * slot.records > slot.capacity {
        let whole = CLOCK_BYTES + slot.capacity * record.len();
        bytes.resize(bytes.len().max(whole), 0);
    }
    bytes
}

fn word(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes.try_into().unwrap_or_default())
}

/// Bytes of one key's record of `width` words.
pub fn record_size(width: usize) -> usize {
    RECORD_HEADER + 8 * width
}

/// Every key of the table's pages (their owners), page by page: what tests compare before and
/// after a request.
#[cfg(test)]
pub fn owners(store: &impl Store, prefix: &str, spec: &TableSpec) -> Vec<u64> {
    (0..spec.pages)
        .flat_map(|page| {
            let (bytes, _) = store
                .get(&page_name(prefix, spec, page))
                .unwrap_or_default();
            let mine = records(&bytes).filter(|r| r.tag == spec.tag);
            mine.map(|r| r.owner).collect::<Vec<_>>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::store::MemoryStore;

    /// Tokens owed out of a capacity of 4: the first state word, as the tests write it.
    fn owes(state: &[u64]) -> Debt {
        let tokens = state.first().copied().unwrap_or(0);
        Debt {
            share: tokens * FULL_SHARE / 4,
            tokens,
        }
    }

    fn spec(capacity: u32) -> TableSpec {
        TableSpec::new(Vec::new(), capacity, 1, false, (7, 9))
    }

    const NOW: u64 = 100 * NANOS_PER_SEC;

    /// Finds the key's slot at `now` and writes `tokens` owed into it: what the table forgot.
    fn put(store: &MemoryStore, spec: &TableSpec, hash: u64, tokens: u64, now: u64) -> Forgotten {
        let slot = find(store, "p/", spec, hash, now, owes);
        write(store, &slot, &[tokens], now, now + tokens * NANOS_PER_SEC).unwrap()
    }

    /// What the key's record holds, if it has one.
    fn owed_by(store: &MemoryStore, spec: &TableSpec, hash: u64) -> Option<u64> {
        let slot = find(store, "p/", spec, hash, NOW, owes);
        slot.takeover.is_none().then(|| slot.state[0])
    }

    /// Key hashes spread over all 64 bits, as real ones are.
    fn hashes() -> impl Iterator<Item = u64> {
        (1u64..).map(|i| i.wrapping_mul(0x2545_f491_4f6c_dd1d))
    }

    /// Keys that land in page `page`.
    fn keys_in(spec: &TableSpec, page: u32) -> impl Iterator<Item = u64> + '_ {
        hashes().filter(move |&h| spec.page_of(h) == page)
    }

    #[test]
    fn pages_share_max_keys_out_exactly_and_fit_their_bytes() {
        for capacity in [1, 31, 32, 33, 1000, 10_000, 1_000_000] {
            let spec = spec(capacity);
            let total: usize = (0..spec.pages).map(|p| spec.page_capacity(p)).sum();
            assert_eq!(total, capacity as usize, "{capacity}");
            assert!(spec.page_capacity(0) <= PAGE_SLOTS);
        }
        let wide = TableSpec::new(Vec::new(), 100, 1000, false, (7, 9));
        assert_eq!(
            (wide.pages, wide.page_capacity(0)),
            (100, 1),
            "a key a page"
        );
        let mid = TableSpec::new(Vec::new(), 100, 6, false, (7, 9));
        assert!(mid.page_capacity(0) * record_size(6) <= PAGE_BYTES);
    }

    #[test]
    fn page_names_fit_inline_in_envoy() {
        let spec = TableSpec::new(Vec::new(), 10_000_000, 1, false, (u64::MAX, 9));
        let name = page_name(
            &prefix("a-plugin-name-of-some-length"),
            &spec,
            spec.pages - 1,
        );
        assert!(name.len() <= 15, "{name}");
    }

    #[test]
    fn a_page_is_created_by_its_first_key_and_holds_only_its_keys() {
        let (store, spec) = (MemoryStore::default(), spec(10_000));
        assert_eq!(store.entry_count(), 0, "nothing up front");
        let mut keys = keys_in(&spec, 3);
        let (a, b) = (keys.next().unwrap(), keys.next().unwrap());
        put(&store, &spec, a, 1, NOW);
        put(&store, &spec, b, 2, NOW);
        assert_eq!(store.entry_count(), 1);
        let (value, _) = store.get(&page_name("p/", &spec, 3)).unwrap();
        assert_eq!(value.len(), CLOCK_BYTES + 2 * record_size(1));
        assert_eq!(
            (owed_by(&store, &spec, a), owed_by(&store, &spec, b)),
            (Some(1), Some(2))
        );
    }

    #[test]
    fn a_page_more_than_half_full_is_padded_to_its_whole_size_and_reads_the_same() {
        let (store, spec) = (MemoryStore::default(), spec(4));
        let keys: Vec<u64> = keys_in(&spec, 0).take(4).collect();
        let size = |store: &MemoryStore| store.get(&page_name("p/", &spec, 0)).unwrap().0.len();
        put(&store, &spec, keys[0], 1, NOW);
        put(&store, &spec, keys[1], 1, NOW);
        assert_eq!(
            size(&store),
            CLOCK_BYTES + 2 * record_size(1),
            "half full: as it is"
        );
        put(&store, &spec, keys[2], 1, NOW);
        let whole = CLOCK_BYTES + 4 * record_size(1);
        assert_eq!(size(&store), whole);
        put(&store, &spec, keys[3], 2, NOW);
        assert_eq!(size(&store), whole);
        let owed: Vec<Option<u64>> = keys.iter().map(|&k| owed_by(&store, &spec, k)).collect();
        assert_eq!(owed, [Some(1), Some(1), Some(1), Some(2)]);
    }

    #[test]
    fn two_workers_creating_one_page_at_once_lose_neither_key() {
        let (store, spec) = (MemoryStore::default(), spec(10_000));
        let mut keys = keys_in(&spec, 5);
        let (a, b) = (keys.next().unwrap(), keys.next().unwrap());
        let for_a = find(&store, "p/", &spec, a, NOW, owes);
        let for_b = find(&store, "p/", &spec, b, NOW, owes);
        write(&store, &for_a, &[1], NOW, NOW).unwrap();
        assert_eq!(
            write(&store, &for_b, &[1], NOW, NOW),
            Err(StoreError::CasMismatch),
            "the page exists now: a lost race"
        );
        put(&store, &spec, b, 1, NOW);
        assert_eq!(
            (owed_by(&store, &spec, a), owed_by(&store, &spec, b)),
            (Some(1), Some(1))
        );
    }

    #[test]
    fn a_stale_write_is_refused() {
        let (store, spec) = (MemoryStore::default(), spec(10));
        put(&store, &spec, 42, 0, NOW);
        let slot = find(&store, "p/", &spec, 42, NOW, owes);
        write(&store, &slot, &[1], NOW, NOW).unwrap();
        assert_eq!(
            write(&store, &slot, &[2], NOW, NOW),
            Err(StoreError::CasMismatch)
        );
    }

    #[test]
    fn a_new_key_in_a_full_page_takes_the_place_that_owes_least_and_forgives_its_debt() {
        let (store, spec) = (MemoryStore::default(), spec(2));
        let mut keys = keys_in(&spec, 0);
        let (light, heavy, new) = (
            keys.next().unwrap(),
            keys.next().unwrap(),
            keys.next().unwrap(),
        );
        put(&store, &spec, heavy, 3, NOW);
        put(&store, &spec, light, 1, NOW + NANOS_PER_SEC);
        assert_eq!(
            put(&store, &spec, new, 1, NOW + 2 * NANOS_PER_SEC),
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
        let (store, spec) = (MemoryStore::default(), spec(2));
        let [old, recent, new, newer] = {
            let mut keys = keys_in(&spec, 0);
            [(); 4].map(|_| keys.next().unwrap())
        };
        put(&store, &spec, old, 1, NOW);
        put(&store, &spec, recent, 1, NOW + NANOS_PER_SEC);
        put(&store, &spec, new, 0, NOW + 2 * NANOS_PER_SEC);
        assert_eq!(owed_by(&store, &spec, old), None);
        assert_eq!(owed_by(&store, &spec, recent), Some(1));
        let reused = put(&store, &spec, newer, 2, NOW + 3 * NANOS_PER_SEC);
        assert_eq!(reused, Forgotten::default(), "new's state owed nothing");
    }

    #[test]
    fn a_table_full_of_keys_being_limited_forgets_the_least_recently_used() {
        let (store, spec) = (MemoryStore::default(), spec(1));
        put(&store, &spec, 1, 4, NOW);
        assert_eq!(
            put(&store, &spec, 2, 1, NOW + 1),
            Forgotten { keys: 1, tokens: 4 }
        );
        assert_eq!(owed_by(&store, &spec, 1), None);
    }

    #[test]
    fn two_keys_taking_one_place_at_once_never_share_its_state() {
        let (store, spec) = (MemoryStore::default(), spec(1));
        put(&store, &spec, 1, 2, NOW);
        let for_two = find(&store, "p/", &spec, 2, NOW, owes);
        let for_three = find(&store, "p/", &spec, 3, NOW, owes);
        assert_eq!(
            (for_two.state[0], for_three.state[0]),
            (0, 0),
            "both start empty"
        );
        write(&store, &for_two, &[1], NOW, NOW).unwrap();
        assert_eq!(
            write(&store, &for_three, &[1], NOW, NOW),
            Err(StoreError::CasMismatch)
        );
        let again = find(&store, "p/", &spec, 3, NOW, owes);
        assert_eq!(
            (again.owner, again.state[0]),
            (3, 0),
            "read again: two's state is not three's"
        );
        assert_eq!(owed_by(&store, &spec, 2), Some(1));
    }

    #[test]
    fn layouts_of_one_key_share_its_pages_and_keep_their_states_apart() {
        let store = MemoryStore::default();
        let old = TableSpec::new(Vec::new(), 1, 1, false, (7, 1));
        let new = TableSpec::new(Vec::new(), 1, 2, false, (7, 2));
        assert_eq!(page_name("p/", &old, 0), page_name("p/", &new, 0));
        put(&store, &old, 42, 3, NOW);
        let slot = find(&store, "p/", &new, 42, NOW, owes);
        assert_eq!(
            slot.state,
            Words::from_slice(&[0, 0]),
            "not the old layout's state"
        );
        assert_eq!(
            slot.takeover,
            Some(Debt {
                share: LIMITED,
                tokens: 0
            }),
            "the old record owes until its free_at"
        );
        write(&store, &slot, &[5, 6], NOW, NOW).unwrap();
        assert_eq!(store.entry_count(), 1, "the same page, reused");
        let later = find(&store, "p/", &old, 7, NOW + 4 * NANOS_PER_SEC, owes);
        assert_eq!(
            later.takeover,
            Some(Debt::default()),
            "the new record owes nothing"
        );
    }

    #[test]
    fn nobody_decides_a_page_earlier_than_its_clock_unless_that_is_far_ahead() {
        let (store, spec) = (MemoryStore::default(), spec(10));
        put(&store, &spec, 42, 1, NOW + 500);
        let slot = find(&store, "p/", &spec, 43, NOW, owes);
        assert_eq!((slot.clock, slot.time(NOW)), (NOW + 500, NOW + 500));
        assert_eq!(slot.time(NOW + 600), NOW + 600);
        assert_eq!(
            slot.time(NOW + 500 - 2 * MAX_SKEW),
            NOW + 500 - 2 * MAX_SKEW
        );
    }

    #[test]
    fn a_corrupt_page_is_valid_up_to_its_first_bad_record_and_is_rewritten_whole() {
        let (store, spec) = (MemoryStore::default(), spec(10));
        put(&store, &spec, 42, 1, NOW);
        let name = page_name("p/", &spec, spec.page_of(42));
        let (mut value, _) = store.get(&name).unwrap();
        value.extend_from_slice(&[9; 30]);
        store.set(&name, &value, 0).unwrap();
        assert_eq!(owed_by(&store, &spec, 42), Some(1));
        put(&store, &spec, 42, 2, NOW);
        let (value, _) = store.get(&name).unwrap();
        assert_eq!(
            value.len(),
            CLOCK_BYTES + record_size(1),
            "the garbage is gone"
        );
        for garbage in [vec![], vec![1, 2, 3]] {
            store.set(&name, &garbage, 0).unwrap();
            assert_eq!(owed_by(&store, &spec, 42), None);
            put(&store, &spec, 42, 2, NOW);
            assert_eq!(owed_by(&store, &spec, 42), Some(2));
        }
    }
}
