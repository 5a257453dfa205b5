//! The heaviest keys of a stream in fixed memory: the Space-Saving count (Metwally, Agrawal and
//! El Abbadi, 2005), pruned in batches. `sluice-replay`'s top keys and `sluice-service`'s live
//! ones (`/admin/v1/top`) are this one sketch.
//!
//! A sketch keeps `kept` keys (`TopKeys::with_kept`) and counts up to `2 × kept` at once; when
//! that fills up, the `kept` counted most stay and the rest are forgotten, and a key counted
//! anew starts at the largest count forgotten so far (its `floor`). With `W` the total weight
//! added (every `add`'s weight summed):
//!
//! - a key's count is never below its true count, and at most its `error` above it, where
//!   `error ≤ floor ≤ W / kept`;
//! - a key whose true count is more than `W / kept` is always among the counted;
//! - with no more than `2 × kept` distinct keys, every count is exact (`floor` stays 0).
//!
//! Why `floor ≤ W / kept`: every counted key's count is at least the floor, and
//! `Σ (count − floor)` over the counted keys grows by exactly the weight of each `add`; a pruning
//! that raises the floor by `d` takes `d` from each of the `kept` keys it keeps, so the floor can
//! only have risen `W / kept` in all.
//!
//! Sketches of disjoint parts of one stream (the minutes of an hour) `merge`: a key absent from
//! one is counted there at that sketch's floor, so the merged counts keep both bounds, with the
//! error at most `Σ floor ≤ W / kept` for `W` the parts' total.
//!
//! Memory: at most `2 × kept` entries of a `u64` key, three `u64`s and one `V` each. An `add`
//! is one hash-map update; a pruning (once per `kept` new keys at most) sorts `2 × kept` entries.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The keys are hashes already (SipHash under a secret): a multiply and a shift spread them
/// over the table, where SipHash again would cost more than the rest of an `add`. A caller who
/// picks keys that collide slows only its own sketch, whose `2 × kept` entries bound the probe.
#[derive(Default)]
struct Spread(u64);

impl Hasher for Spread {
    fn finish(&self) -> u64 {
        let mixed = self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        mixed ^ (mixed >> 29)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

type Map<V> = HashMap<u64, Counted<V>, BuildHasherDefault<Spread>>;

/// `kept` of `TopKeys::default()`: what `sluice-replay` keeps.
pub const TRACKED: usize = 1_000;

/// One counted key: its hash, its count, how much of the count may be other keys' (the true
/// count is in `count - error ..= count`), and the key's value (a `V`) when one is shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted<V> {
    pub key: u64,
    pub count: u64,
    pub error: u64,
    pub value: Option<V>,
}

#[derive(Debug, Clone)]
pub struct TopKeys<V> {
    counted: Map<V>,
    kept: usize,
    floor: u64,
    total: u64,
}

impl<V> Default for TopKeys<V> {
    fn default() -> Self {
        TopKeys::with_kept(TRACKED)
    }
}

impl<V> TopKeys<V> {
    /// A sketch that keeps `kept` keys (at least 1) and counts at most `2 × kept` at once.
    pub fn with_kept(kept: usize) -> Self {
        TopKeys {
            counted: Map::default(),
            kept: kept.max(1),
            floor: 0,
            total: 0,
        }
    }

    /// The largest count forgotten so far: the bound of every count's error.
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// The weight added in all (`W`).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Keys counted now: at most `2 × kept`.
    pub fn len(&self) -> usize {
        self.counted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.counted.is_empty()
    }

    /// Forgets everything, keeping the memory for what comes next.
    pub fn clear(&mut self) {
        self.counted.clear();
        self.floor = 0;
        self.total = 0;
    }

    /// Forgets `key`, as if it had never been counted (its state was reset, so what it did
    /// before no longer ranks it): counted again, it starts from the floor as any new key does,
    /// so its count stays within the bounds; the other keys' are untouched.
    pub fn forget(&mut self, key: u64) -> bool {
        self.counted.remove(&key).is_some()
    }

    fn prune(&mut self) {
        let mut all: Vec<Counted<V>> = self.counted.drain().map(|(_, c)| c).collect();
        all.sort_unstable_by_key(|c| Reverse(c.count));
        let forgotten = all.split_off(self.kept.min(all.len()));
        self.floor = forgotten.iter().map(|c| c.count).fold(self.floor, u64::max);
        self.counted.extend(all.into_iter().map(|c| (c.key, c)));
    }

    /// Room for one more key, pruning if it is full.
    fn make_room(&mut self) {
        if self.counted.len() >= 2 * self.kept {
            self.prune();
        }
    }
}

impl<V: Clone> TopKeys<V> {
    /// Counts one more for `key`; `value` gives the key's value, asked only for a key not
    /// counted.
    pub fn add(&mut self, key: u64, value: impl FnOnce() -> Option<V>) {
        self.add_weighted(key, 1, value);
    }

    /// Counts `weight` more for `key` (units a request consumed); a weight of 0 counts nothing.
    pub fn add_weighted(&mut self, key: u64, weight: u64, value: impl FnOnce() -> Option<V>) {
        if weight == 0 {
            return;
        }
        self.total = self.total.saturating_add(weight);
        if let Some(counted) = self.counted.get_mut(&key) {
            counted.count = counted.count.saturating_add(weight);
            return;
        }
        self.make_room();
        let counted = Counted {
            key,
            count: self.floor.saturating_add(weight),
            error: self.floor,
            value: value(),
        };
        self.counted.insert(key, counted);
    }

    /// Raises `key`'s count to `count` if that is more: a peak (requests in flight at once)
    /// rather than a sum. A key forgotten by a pruning and seen again starts from what it shows
    /// then, so a kept peak may be below the key's true one (never above); a `TopKeys` is used
    /// either this way or with `add`, not both.
    pub fn raise(&mut self, key: u64, count: u64, value: impl FnOnce() -> Option<V>) {
        if let Some(counted) = self.counted.get_mut(&key) {
            counted.count = counted.count.max(count);
            return;
        }
        self.make_room();
        let counted = Counted {
            key,
            count,
            error: 0,
            value: value(),
        };
        self.counted.insert(key, counted);
    }

    /// The `n` keys counted most, most first (ties by key, for a stable report).
    pub fn top(&self, n: usize) -> Vec<Counted<V>> {
        let mut all: Vec<&Counted<V>> = self.counted.values().collect();
        all.sort_unstable_by(|a, b| b.count.cmp(&a.count).then(a.key.cmp(&b.key)));
        all.into_iter().take(n).cloned().collect()
    }

    /// The `n` keys counted most over `sketches` of disjoint parts of one stream, most first:
    /// a key is counted in each sketch that counts it, and at that sketch's floor in each
    /// other (its error too), so every count keeps the bounds of the module's comment.
    pub fn merge(sketches: &[&TopKeys<V>], n: usize) -> Vec<Counted<V>> {
        let mut merged: Map<V> = Map::default();
        for sketch in sketches {
            for counted in sketch.counted.values() {
                merged.entry(counted.key).or_insert_with(|| Counted {
                    key: counted.key,
                    count: 0,
                    error: 0,
                    value: counted.value.clone(),
                });
            }
        }
        for counted in merged.values_mut() {
            for sketch in sketches {
                let (count, error) = match sketch.counted.get(&counted.key) {
                    Some(own) => (own.count, own.error),
                    None => (sketch.floor, sketch.floor),
                };
                counted.count = counted.count.saturating_add(count);
                counted.error = counted.error.saturating_add(error);
            }
        }
        let mut all: Vec<Counted<V>> = merged.into_values().collect();
        all.sort_unstable_by(|a, b| b.count.cmp(&a.count).then(a.key.cmp(&b.key)));
        all.truncate(n);
        all
    }
}

/// One span of a `Ring`: the refusals and the consumption of its keys, and the count allowed.
#[derive(Debug, Clone)]
pub struct Slot<V> {
    /// The slot's index in time plus 1; 0: never used.
    pub epoch: u64,
    pub refused: TopKeys<V>,
    pub consumed: TopKeys<V>,
    pub allowed: u64,
}

/// A sliding window of sketches: `slots` spans of `width_s` seconds, the oldest reused for the
/// newest. The service's `/admin/v1/top` and the filter's per-worker top keys both keep these.
#[derive(Debug, Clone)]
pub struct Ring<V> {
    width_s: u64,
    slots: Vec<Slot<V>>,
}

impl<V: Clone> Ring<V> {
    pub fn new(width_s: u64, slots: usize, kept: usize) -> Ring<V> {
        let slot = Slot {
            epoch: 0,
            refused: TopKeys::with_kept(kept),
            consumed: TopKeys::with_kept(kept),
            allowed: 0,
        };
        Ring {
            width_s: width_s.max(1),
            slots: vec![slot; slots.max(1)],
        }
    }

    /// The slot of `now_s`, emptied first if it last held an older span.
    pub fn at(&mut self, now_s: u64) -> Option<&mut Slot<V>> {
        let index = now_s / self.width_s;
        let len = self.slots.len() as u64;
        let slot = self.slots.get_mut(usize::try_from(index % len).ok()?)?;
        if slot.epoch != index + 1 {
            slot.refused.clear();
            slot.consumed.clear();
            slot.allowed = 0;
            slot.epoch = index + 1;
        }
        Some(slot)
    }

    /// Forgets `key`'s refusals in every slot (`TopKeys::forget`); its consumption stays.
    pub fn forget_refusals(&mut self, key: u64) -> bool {
        let mut forgot = false;
        for slot in &mut self.slots {
            forgot |= slot.refused.forget(key);
        }
        forgot
    }

    /// Every slot, live or not (for counting memory).
    pub fn slots(&self) -> &[Slot<V>] {
        &self.slots
    }

    /// The slots of the span that ends at `now_s`.
    pub fn live(&self, now_s: u64) -> impl Iterator<Item = &Slot<V>> {
        let newest = now_s / self.width_s + 1;
        let oldest = newest.saturating_sub(self.slots.len() as u64 - 1);
        (self.slots.iter()).filter(move |s| s.epoch != 0 && (oldest..=newest).contains(&s.epoch))
    }
}

/// What one part of a stream (one filter worker's window) publishes: its top keys and its
/// floor, the count of any key it does not list (the sum of its sketches' floors).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Part {
    pub floor: u64,
    pub top: Vec<(u64, u64, u64)>,
}

impl Part {
    /// A window's `n` top keys of `sketches` (its live slots), as a worker publishes them. Its
    /// floor bounds the count of every key it leaves out: the sum of the sketches' floors (a key
    /// none counts) or the count of the first key past the `n` listed (a key counted, not
    /// listed), whichever is more; so it is at most `Σ floor + W / (n + 1)`.
    pub fn of<V: Clone>(sketches: &[&TopKeys<V>], n: usize) -> Part {
        Part::with_values(sketches, n).0
    }

    /// `of`, and the values of the keys it lists that have one.
    pub fn with_values<V: Clone>(sketches: &[&TopKeys<V>], n: usize) -> (Part, Vec<(u64, V)>) {
        let floors = sketches
            .iter()
            .map(|s| s.floor())
            .fold(0u64, u64::saturating_add);
        let mut merged = TopKeys::merge(sketches, n.saturating_add(1));
        let past = if merged.len() > n { merged.pop() } else { None };
        let top = merged.iter().map(|c| (c.key, c.count, c.error)).collect();
        let values = (merged.into_iter())
            .filter_map(|c| Some((c.key, c.value?)))
            .collect();
        let part = Part {
            floor: past.map_or(floors, |c| c.count.max(floors)),
            top,
        };
        (part, values)
    }

    /// The bytes a worker sets in shared data: the floor, then each key's key, count and
    /// error, all little-endian `u64`s.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + 24 * self.top.len());
        out.extend_from_slice(&self.floor.to_le_bytes());
        for &(key, count, error) in &self.top {
            for n in [key, count, error] {
                out.extend_from_slice(&n.to_le_bytes());
            }
        }
        out
    }

    /// `to_bytes` read back; `None` for bytes not of that shape.
    pub fn from_bytes(bytes: &[u8]) -> Option<Part> {
        let mut words = bytes.chunks_exact(8);
        if !words.remainder().is_empty() || (bytes.len() / 8) % 3 != 1 {
            return None;
        }
        let mut next = || Some(u64::from_le_bytes(words.next()?.try_into().ok()?));
        let floor = next()?;
        let mut top = Vec::with_capacity(bytes.len() / 24);
        while let Some(key) = next() {
            top.push((key, next()?, next()?));
        }
        Some(Part { floor, top })
    }

    /// The `n` keys counted most over disjoint `parts`, with `TopKeys::merge`'s rule: a key a
    /// part does not list is counted there at its floor, with that much error.
    pub fn merge(parts: &[Part], n: usize) -> Vec<Counted<()>> {
        let mut merged: Map<()> = Map::default();
        for part in parts {
            for &(key, _, _) in &part.top {
                merged.entry(key).or_insert(Counted {
                    key,
                    count: 0,
                    error: 0,
                    value: None,
                });
            }
        }
        for counted in merged.values_mut() {
            for part in parts {
                let own = part.top.iter().find(|(k, _, _)| *k == counted.key);
                let (count, error) = own.map_or((part.floor, part.floor), |&(_, c, e)| (c, e));
                counted.count = counted.count.saturating_add(count);
                counted.error = counted.error.saturating_add(error);
            }
        }
        let mut all: Vec<Counted<()>> = merged.into_values().collect();
        all.sort_unstable_by(|a, b| b.count.cmp(&a.count).then(a.key.cmp(&b.key)));
        all.truncate(n);
        all
    }
}

/// The spans of a policy's minute ring (seven of 10 s: the last 60 to 70 s) and hour ring
/// (thirteen of 5 min: the last 60 to 65 min), in the service and in each filter worker alike.
pub const MINUTE_SLOT_S: u64 = 10;
/// Keys each live sketch keeps (the service's and each filter worker's); also the most keys a
/// live answer lists.
pub const KEPT_LIVE: usize = 64;
pub const MINUTE_SLOTS: usize = 7;
pub const HOUR_SLOT_S: u64 = 300;
pub const HOUR_SLOTS: usize = 13;

/// The longest text a key shows (longer is cut, on a character boundary).
pub const MAX_SHOWN_BYTES: usize = 128;

/// How a key shows, in the service (an RLS key's entries) and the filter (a local key's parts)
/// alike: each part as `name=value` when its value is given (the operator lets it be shown),
/// else as `name=#` (never shown), separated by spaces; control characters as `?` (a terminal
/// or a log must not take a request's bytes for commands), at most `MAX_SHOWN_BYTES`.
pub fn shown_text<'e>(parts: impl Iterator<Item = (&'e str, Option<&'e [u8]>)>) -> String {
    let mut text = String::new();
    for (name, value) in parts {
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(name);
        match value {
            Some(value) => {
                text.push('=');
                text.push_str(&String::from_utf8_lossy(value));
            }
            None => text.push_str("=#"),
        }
        if text.len() > MAX_SHOWN_BYTES {
            break;
        }
    }
    let mut text: String = (text.chars())
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    let mut end = text.len().min(MAX_SHOWN_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text
}

/// What the keys are ranked by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// Requests refused (each refused check of a limit is one).
    Refused,
    /// Tokens granted: requests, or the units of a cost (an LLM call's reservation).
    Consumed,
}

impl By {
    pub fn name(self) -> &'static str {
        match self {
            By::Refused => "refused",
            By::Consumed => "consumed",
        }
    }

    /// `refused` or `consumed`.
    pub fn of(name: &str) -> Option<By> {
        [By::Refused, By::Consumed]
            .into_iter()
            .find(|b| b.name() == name)
    }
}

/// Over how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    Minute,
    Hour,
}

impl Window {
    pub fn name(self) -> &'static str {
        match self {
            Window::Minute => "1m",
            Window::Hour => "1h",
        }
    }

    /// `1m` or `1h`.
    pub fn of(name: &str) -> Option<Window> {
        [Window::Minute, Window::Hour]
            .into_iter()
            .find(|w| w.name() == name)
    }
}

/// One policy's counts in one span.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Totals {
    pub allowed: u64,
    pub refused: u64,
    pub consumed: u64,
}

impl Totals {
    fn add(self, other: Totals) -> Totals {
        Totals {
            allowed: self.allowed.saturating_add(other.allowed),
            refused: self.refused.saturating_add(other.refused),
            consumed: self.consumed.saturating_add(other.consumed),
        }
    }

    /// A ring's totals slot by slot, oldest first, ending with the slot of `now_s` (partly
    /// elapsed): as many as the ring has slots, a slot with nothing recorded in its span all 0.
    pub fn series<V: Clone>(ring: &Ring<V>, now_s: u64) -> Vec<Totals> {
        let newest = now_s / ring.width_s + 1;
        let len = ring.slots.len() as u64;
        (0..len)
            .map(|back| newest.saturating_sub(len - 1 - back))
            .map(|epoch| {
                let slot = ring.slots.iter().find(|s| s.epoch == epoch && epoch != 0);
                slot.map_or(Totals::default(), |s| Totals {
                    allowed: s.allowed,
                    refused: s.refused.total(),
                    consumed: s.consumed.total(),
                })
            })
            .collect()
    }

    /// The totals of a ring's slots live at `now_s`.
    pub fn of<V: Clone>(ring: &Ring<V>, now_s: u64) -> Totals {
        ring.live(now_s).fold(Totals::default(), |t, s| {
            t.add(Totals {
                allowed: s.allowed,
                refused: s.refused.total(),
                consumed: s.consumed.total(),
            })
        })
    }
}

/// One policy's minute and hour in one filter worker: what it refused and what it let through,
/// by key hash.
#[derive(Debug, Clone)]
pub struct Windows {
    minute: Ring<Box<str>>,
    hour: Ring<Box<str>>,
}

impl Windows {
    /// Rings whose sketches keep `kept` keys.
    pub fn new(kept: usize) -> Windows {
        Windows {
            minute: Ring::new(MINUTE_SLOT_S, MINUTE_SLOTS, kept),
            hour: Ring::new(HOUR_SLOT_S, HOUR_SLOTS, kept),
        }
    }

    /// One decision of `key` at `now_s`: refused, or allowed having consumed `consumed`.
    /// `shown` gives the key's text (`shown_text`), asked at most once, and only for a key new
    /// to a sketch.
    pub fn record(
        &mut self,
        now_s: u64,
        key: u64,
        (refused, consumed): (bool, u64),
        shown: impl FnOnce() -> Option<Box<str>>,
    ) {
        let mut shown = Some(shown);
        let mut text: Option<Box<str>> = None;
        let mut value = || {
            if let Some(shown) = shown.take() {
                text = shown();
            }
            text.clone()
        };
        for ring in [&mut self.minute, &mut self.hour] {
            let Some(slot) = ring.at(now_s) else {
                continue;
            };
            if refused {
                slot.refused.add(key, &mut value);
            } else {
                slot.allowed += 1;
            }
            slot.consumed.add_weighted(key, consumed, &mut value);
        }
    }

    /// Keys counted now, in every sketch (at most `2 × kept` each, 40 sketches).
    pub fn entries(&self) -> usize {
        let slots = self.minute.slots().iter().chain(self.hour.slots());
        slots.map(|s| s.refused.len() + s.consumed.len()).sum()
    }

    /// What a worker publishes of the policy at `now_s`, its `n` top keys of each window and
    /// measure; `None` when nothing is live in the last hour (nothing to publish).
    pub fn publish(&self, policy: u64, now_s: u64, n: usize) -> Option<PolicyPart> {
        self.hour.live(now_s).next()?;
        let mut shown: Vec<(u64, Box<str>)> = Vec::new();
        let mut window = |ring: &Ring<Box<str>>| {
            let live: Vec<&Slot<Box<str>>> = ring.live(now_s).collect();
            let refused: Vec<&TopKeys<Box<str>>> = live.iter().map(|s| &s.refused).collect();
            let consumed: Vec<&TopKeys<Box<str>>> = live.iter().map(|s| &s.consumed).collect();
            let (refused, texts) = Part::with_values(&refused, n);
            shown.extend(texts);
            let (consumed, texts) = Part::with_values(&consumed, n);
            shown.extend(texts);
            WindowPart {
                totals: Totals::of(ring, now_s),
                refused,
                consumed,
            }
        };
        let (minute, hour) = (window(&self.minute), window(&self.hour));
        shown.sort_unstable_by_key(|(key, _)| *key);
        shown.dedup_by_key(|(key, _)| *key);
        Some(PolicyPart {
            policy,
            minute,
            hour,
            shown,
        })
    }
}

/// One window of one policy as one worker publishes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WindowPart {
    pub totals: Totals,
    pub refused: Part,
    pub consumed: Part,
}

/// One policy as one worker publishes it; `policy` names it (`policy_id` of its name), and
/// `shown` gives the text of each key listed that has one (`shown_text`), by key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PolicyPart {
    pub policy: u64,
    pub minute: WindowPart,
    pub hour: WindowPart,
    pub shown: Vec<(u64, Box<str>)>,
}

impl PolicyPart {
    pub fn window(&self, window: Window) -> &WindowPart {
        match window {
            Window::Minute => &self.minute,
            Window::Hour => &self.hour,
        }
    }
}

impl WindowPart {
    pub fn part(&self, by: By) -> &Part {
        match by {
            By::Refused => &self.refused,
            By::Consumed => &self.consumed,
        }
    }
}

/// A policy's name as the published parts name it: FNV-1a, the same in every worker.
pub fn policy_id(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// What one filter worker publishes once a second: who it is (`worker`, its random name), when
/// (`at_s`, seconds of the wall clock), and each policy it recorded anything of in the hour.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Board {
    pub worker: u64,
    pub at_s: u64,
    pub policies: Vec<PolicyPart>,
}

impl Board {
    /// Little-endian `u64`s: worker, at_s, the number of policies, then for each its id and,
    /// for the minute then the hour, the three totals and the refused and consumed parts, each
    /// its number of keys followed by `Part::to_bytes`; then the number of texts shown, each
    /// its key, its length in bytes and its UTF-8 bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let word = |out: &mut Vec<u8>, n: u64| out.extend_from_slice(&n.to_le_bytes());
        word(&mut out, self.worker);
        word(&mut out, self.at_s);
        word(&mut out, self.policies.len() as u64);
        for policy in &self.policies {
            word(&mut out, policy.policy);
            for window in [&policy.minute, &policy.hour] {
                let Totals {
                    allowed,
                    refused,
                    consumed,
                } = window.totals;
                for n in [allowed, refused, consumed] {
                    word(&mut out, n);
                }
                for part in [&window.refused, &window.consumed] {
                    word(&mut out, part.top.len() as u64);
                    out.extend_from_slice(&part.to_bytes());
                }
            }
            word(&mut out, policy.shown.len() as u64);
            for (key, text) in &policy.shown {
                word(&mut out, *key);
                word(&mut out, text.len() as u64);
                out.extend_from_slice(text.as_bytes());
            }
        }
        out
    }

    /// `to_bytes` read back; `None` for bytes not of that shape.
    pub fn from_bytes(bytes: &[u8]) -> Option<Board> {
        let mut rest = bytes;
        let word = |rest: &mut &[u8]| -> Option<u64> {
            let (head, tail) = rest.split_at_checked(8)?;
            *rest = tail;
            Some(u64::from_le_bytes(head.try_into().ok()?))
        };
        let worker = word(&mut rest)?;
        let at_s = word(&mut rest)?;
        let count = word(&mut rest)?;
        // Each policy takes at least 14 words: no count of policies the bytes cannot hold.
        if count > (rest.len() / 112) as u64 {
            return None;
        }
        let mut policies = Vec::new();
        for _ in 0..count {
            let policy = word(&mut rest)?;
            let mut windows = [WindowPart::default(), WindowPart::default()];
            for window in &mut windows {
                let (allowed, refused, consumed) =
                    (word(&mut rest)?, word(&mut rest)?, word(&mut rest)?);
                window.totals = Totals {
                    allowed,
                    refused,
                    consumed,
                };
                for part in [&mut window.refused, &mut window.consumed] {
                    let keys = usize::try_from(word(&mut rest)?).ok()?;
                    let len = keys.checked_mul(24)?.checked_add(8)?;
                    let (head, tail) = rest.split_at_checked(len)?;
                    rest = tail;
                    *part = Part::from_bytes(head)?;
                }
            }
            let texts = usize::try_from(word(&mut rest)?).ok()?;
            if texts > rest.len() / 16 {
                return None;
            }
            let mut shown = Vec::with_capacity(texts);
            for _ in 0..texts {
                let key = word(&mut rest)?;
                let len = usize::try_from(word(&mut rest)?).ok()?;
                if len > MAX_SHOWN_BYTES {
                    return None;
                }
                let (text, tail) = rest.split_at_checked(len)?;
                rest = tail;
                shown.push((key, std::str::from_utf8(text).ok()?.into()));
            }
            let [minute, hour] = windows;
            policies.push(PolicyPart {
                policy,
                minute,
                hour,
                shown,
            });
        }
        if !rest.is_empty() {
            return None;
        }
        Some(Board {
            worker,
            at_s,
            policies,
        })
    }
}

/// The ranking of one policy over every worker's part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranking {
    pub totals: Totals,
    /// The bound of every key's `error`: the sum of the parts' floors.
    pub error_bound: u64,
    /// The keys, with their text when a worker gave one.
    pub keys: Vec<Counted<Box<str>>>,
}

/// A ranking by refusals as the minute's log record writes it, after the policy: its counts,
/// its error bound and its keys as `KEY=COUNT` (16 hex digits: the key's hash only, never its
/// text), most first, separated by spaces.
pub fn log_fields(ranking: &Ranking) -> String {
    let Totals {
        allowed,
        refused,
        consumed,
    } = ranking.totals;
    let top: Vec<String> = (ranking.keys.iter())
        .map(|c| format!("{:016x}={}", c.key, c.count))
        .collect();
    format!(
        "allowed={allowed} refused={refused} consumed={consumed} error_bound={} top=\"{}\"",
        ranking.error_bound,
        top.join(" ")
    )
}

/// The `limit` keys of `policy` ranked `by` over `window`, over the `boards` of every worker
/// (a worker that recorded nothing of the policy adds nothing).
pub fn rank(boards: &[Board], policy: u64, window: Window, by: By, limit: usize) -> Ranking {
    let policies: Vec<&PolicyPart> = (boards.iter())
        .flat_map(|b| b.policies.iter().filter(|p| p.policy == policy))
        .collect();
    let windows: Vec<&WindowPart> = policies.iter().map(|p| p.window(window)).collect();
    let parts: Vec<Part> = windows.iter().map(|w| w.part(by).clone()).collect();
    let text = |key: u64| {
        let mut texts = policies.iter().flat_map(|p| p.shown.iter());
        texts.find(|(k, _)| *k == key).map(|(_, text)| text.clone())
    };
    let keys = (Part::merge(&parts, limit).into_iter())
        .map(|c| Counted {
            value: text(c.key),
            key: c.key,
            count: c.count,
            error: c.error,
        })
        .collect();
    Ranking {
        totals: (windows.iter()).fold(Totals::default(), |t, w| t.add(w.totals)),
        error_bound: parts.iter().map(|p| p.floor).fold(0, u64::saturating_add),
        keys,
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_rings_series_is_its_slots_oldest_first_with_empty_spans_as_zero() {
        let mut ring: Ring<()> = Ring::new(10, 3, 4);
        for (now_s, key) in [(0, 1), (5, 2), (25, 1)] {
            if let Some(slot) = ring.at(now_s) {
                slot.refused.add(key, || None);
                slot.allowed += 1;
            }
        }
        let refused = |now_s| -> Vec<u64> {
            Totals::series(&ring, now_s)
                .iter()
                .map(|t| t.refused)
                .collect()
        };
        assert_eq!(refused(25), [2, 0, 1], "0-10 s, 10-20 s, 20-30 s");
        assert_eq!(
            refused(35),
            [0, 1, 0],
            "the first span gone, the next empty"
        );
        assert_eq!(refused(1_000), [0, 0, 0]);
        let allowed: u64 = Totals::series(&ring, 25).iter().map(|t| t.allowed).sum();
        assert_eq!(allowed, Totals::of(&ring, 25).allowed);
    }

    #[test]
    fn a_forgotten_key_leaves_the_refusals_and_comes_back_from_the_floor() {
        let mut ring: Ring<()> = Ring::new(10, 3, 2);
        for (now_s, key, times) in [(0, 1, 5), (12, 1, 3), (12, 2, 2), (12, 3, 1), (12, 4, 1)] {
            let slot = ring.at(now_s).unwrap();
            for _ in 0..times {
                slot.refused.add(key, || None);
                slot.consumed.add(key, || None);
            }
        }
        assert!(ring.forget_refusals(1));
        assert!(!ring.forget_refusals(1), "once");
        let refused: Vec<&TopKeys<()>> = ring.live(12).map(|s| &s.refused).collect();
        let ranked = TopKeys::merge(&refused, 4);
        assert!(
            ranked.iter().all(|c| c.key != 1 || c.count == c.error),
            "{ranked:?}"
        );
        assert_eq!(ranked.first().map(|c| c.key), Some(2));
        let consumed: Vec<&TopKeys<()>> = ring.live(12).map(|s| &s.consumed).collect();
        assert_eq!(
            TopKeys::merge(&consumed, 1)[0].count,
            8,
            "consumption stays"
        );
        let slot = ring.at(12).unwrap();
        slot.refused.add(1, || None);
        let again = slot.refused.top(4);
        let one = again.iter().find(|c| c.key == 1).unwrap();
        assert!(one.count >= 1 && one.count - one.error <= 1, "{one:?}");
    }

    #[test]
    fn a_part_reads_back_from_its_bytes_and_refuses_other_shapes() {
        let part = Part {
            floor: 7,
            top: vec![(1, 20, 7), (u64::MAX, 9, 0)],
        };
        assert_eq!(Part::from_bytes(&part.to_bytes()), Some(part.clone()));
        assert_eq!(
            Part::from_bytes(&Part::default().to_bytes()),
            Some(Part::default())
        );
        let bytes = part.to_bytes();
        assert_eq!(Part::from_bytes(&bytes[..bytes.len() - 8]), None);
        assert_eq!(Part::from_bytes(&bytes[..bytes.len() - 1]), None);
        assert_eq!(Part::from_bytes(&[]), None);
    }

    #[test]
    fn parts_of_two_workers_merge_like_their_sketches() {
        let mut a: TopKeys<()> = TopKeys::with_kept(2);
        let mut b: TopKeys<()> = TopKeys::with_kept(2);
        for key in 0..50u64 {
            a.add_weighted(key, if key < 3 { 100 } else { 1 }, || None);
            b.add_weighted(key + 1000, 1, || None);
            b.add_weighted(key % 3, 50, || None);
        }
        let direct = TopKeys::merge(&[&a, &b], 3);
        let parts = [Part::of(&[&a], 8), Part::of(&[&b], 8)];
        let merged = Part::merge(&parts, 3);
        let keys: Vec<u64> = merged.iter().map(|c| c.key).collect();
        assert_eq!(keys, direct.iter().map(|c| c.key).collect::<Vec<_>>());
        let mut top3 = keys.clone();
        top3.sort_unstable();
        assert_eq!(top3, vec![0, 1, 2]);
        for c in &merged {
            let truth = 100 + 50 * 17 - if c.key == 2 { 50 } else { 0 };
            assert!(
                c.count >= truth && c.count - c.error <= truth,
                "{c:?} {truth}"
            );
        }
    }

    #[test]
    fn a_part_bounds_the_keys_it_leaves_out_by_the_first_one_past_its_list() {
        let mut a: TopKeys<()> = TopKeys::with_kept(8);
        for (key, times) in [(1u64, 9u64), (2, 7), (3, 5)] {
            a.add_weighted(key, times, || None);
        }
        let part = Part::of(&[&a], 2);
        assert_eq!(part.top.len(), 2);
        assert_eq!(
            part.floor, 5,
            "key 3 is counted but not listed: the floor covers it"
        );
        let merged = Part::merge(&[part, Part::default()], 3);
        assert!(merged.iter().all(|c| c.key != 3));
    }

    /// A worker's board of one policy: `light` keys refused once each and `heavy` keys refused
    /// that many times, all at `now_s`.
    fn board(worker: u64, light: std::ops::Range<u64>, heavy: &[(u64, u64)]) -> Board {
        let mut windows = Windows::new(64);
        for key in light {
            windows.record(5, key, (true, 0), || None);
            windows.record(5, key, (false, 1), || None);
        }
        for &(key, times) in heavy {
            for _ in 0..times {
                windows.record(5, key, (true, 0), || Some(format!("user=u{key}").into()));
            }
        }
        let policy = windows.publish(policy_id("api"), 5, 64);
        Board {
            worker,
            at_s: 5,
            policies: policy.into_iter().collect(),
        }
    }

    #[test]
    fn a_key_shows_the_parts_given_and_hides_the_others_as_a_hash() {
        let parts = [
            ("header:x-user", Some(&b"alice"[..])),
            ("header:x-api-key", None),
        ];
        assert_eq!(
            shown_text(parts.into_iter()),
            "header:x-user=alice header:x-api-key=#"
        );
        let sneaky = [("user", Some(&b"a\x1b[2J\nb"[..]))];
        assert_eq!(shown_text(sneaky.into_iter()), "user=a?[2J?b");
        let long = "é".repeat(200);
        let parts = [("user", Some(long.as_bytes()))];
        assert!(shown_text(parts.into_iter()).len() <= MAX_SHOWN_BYTES);
    }

    #[test]
    fn a_board_reads_back_from_its_bytes_and_refuses_other_shapes() {
        let board = board(9, 0..500, &[(7, 40)]);
        let bytes = board.to_bytes();
        assert_eq!(Board::from_bytes(&bytes), Some(board.clone()));
        for cut in [1, 8, 24, bytes.len() - 8] {
            assert_eq!(Board::from_bytes(&bytes[..bytes.len() - cut]), None);
        }
        let mut longer = bytes.clone();
        longer.extend_from_slice(&[0; 8]);
        assert_eq!(Board::from_bytes(&longer), None);
        let mut lying = bytes;
        lying[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(Board::from_bytes(&lying), None);
        let empty = Board::default();
        assert_eq!(Board::from_bytes(&empty.to_bytes()), Some(empty));
    }

    #[test]
    fn three_heavy_keys_top_two_workers_floods_within_the_stated_error() {
        // 20,000 light keys over two workers, each refused once, and three heavy keys.
        let heavy = [(1u64, 1_800u64), (2, 1_500), (3, 1_200)];
        let split = |share: u64| heavy.map(|(k, t)| (k, t * share / 3));
        let boards = [
            board(1, 10_000..20_000, &split(2)),
            board(2, 20_000..30_000, &split(1)),
        ];
        let ranking = rank(&boards, policy_id("api"), Window::Minute, By::Refused, 3);
        let refused: u64 = 20_000 + heavy.iter().map(|h| h.1).sum::<u64>();
        assert_eq!(ranking.totals.refused, refused);
        assert_eq!(ranking.totals.allowed, 20_000);
        assert!(ranking.error_bound <= 2 * refused / 64, "{ranking:?}");
        for (counted, (key, times)) in ranking.keys.iter().zip(heavy) {
            assert_eq!(counted.key, key, "{ranking:?}");
            assert_eq!(
                counted.value.as_deref(),
                Some(format!("user=u{key}").as_str())
            );
            assert!(counted.count >= times && counted.count - counted.error <= times);
            assert!(counted.error <= ranking.error_bound);
        }
        let logged = log_fields(&rank(
            &boards,
            policy_id("api"),
            Window::Minute,
            By::Refused,
            2,
        ));
        assert!(
            logged.starts_with(&format!(
                "allowed=20000 refused={refused} consumed=20000 error_bound="
            )),
            "{logged}"
        );
        let (one, two) = (format!("top=\"{:016x}=", 1), format!(" {:016x}=", 2));
        assert!(logged.contains(&one) && logged.contains(&two), "{logged}");
        assert!(
            !logged.contains("user="),
            "a key's text is never logged: {logged}"
        );
        let hour = rank(&boards, policy_id("api"), Window::Hour, By::Consumed, 1);
        assert_eq!(hour.totals.consumed, 20_000);
        assert!(
            rank(&boards, policy_id("other"), Window::Minute, By::Refused, 3)
                .keys
                .is_empty()
        );
    }

    #[test]
    fn a_policy_idle_for_an_hour_publishes_nothing_and_its_memory_is_bounded() {
        let mut windows = Windows::new(4);
        for key in 0..1_000 {
            windows.record(0, key, (true, 1), || None);
        }
        assert!(windows.entries() <= 2 * 2 * 2 * 4, "{}", windows.entries());
        assert!(windows.publish(1, 60, 4).is_some());
        assert!(windows.publish(1, 3_900, 4).is_none());
    }

    #[test]
    fn a_ring_keeps_only_its_last_spans_and_reuses_the_oldest_slot() {
        let mut ring: Ring<()> = Ring::new(10, 3, 4);
        for now_s in [0, 10, 20, 30] {
            let Some(slot) = ring.at(now_s) else {
                panic!("no slot")
            };
            slot.refused.add(now_s, || None);
            slot.allowed += 1;
        }
        // At 30 s the live spans are 10..40 (three slots of 10 s): the span 0..10 was reused.
        let live: Vec<u64> = ring.live(30).map(|s| s.refused.top(1)[0].key).collect();
        assert_eq!(live.len(), 3, "{live:?}");
        assert!(!live.contains(&0), "{live:?}");
        assert_eq!(ring.slots().len(), 3);
        assert_eq!(ring.live(1_000).count(), 0);
    }
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn counts_are_exact_while_few_keys_are_counted() {
        let mut top = TopKeys::<String>::default();
        for (key, times) in [(1, 3), (2, 5), (3, 1)] {
            for _ in 0..times {
                top.add(key, || Some(format!("k{key}")));
            }
        }
        let counts: Vec<_> = top
            .top(2)
            .iter()
            .map(|c| (c.key, c.count, c.error))
            .collect();
        assert_eq!(counts, [(2, 5, 0), (1, 3, 0)]);
        assert_eq!(top.top(1)[0].value.as_deref(), Some("k2"));
        assert_eq!((top.total(), top.floor()), (9, 0));
    }

    #[test]
    fn a_raised_count_is_the_peak_seen() {
        let mut top = TopKeys::<String>::default();
        for (key, peak) in [(1, 2), (2, 1), (1, 5), (1, 3), (2, 4)] {
            top.raise(key, peak, || None);
        }
        let peaks: Vec<_> = top.top(2).iter().map(|c| (c.key, c.count)).collect();
        assert_eq!(peaks, [(1, 5), (2, 4)]);
    }

    #[test]
    fn heavy_keys_stay_on_top_of_a_flood_of_single_denials_within_the_stated_error() {
        let mut top = TopKeys::<String>::default();
        for i in 0..100_000u64 {
            top.add(1_000_000 + i, || None);
            if i % 10 == 0 {
                top.add(7, || None);
            }
            if i % 20 == 0 {
                top.add(8, || None);
            }
        }
        let best = top.top(2);
        assert_eq!((best[0].key, best[1].key), (7, 8));
        for counted in &best {
            let truth = if counted.key == 7 { 10_000 } else { 5_000 };
            assert!(counted.count >= truth && counted.count - counted.error <= truth);
        }
        assert!(top.len() <= 2 * TRACKED);
        assert!(top.floor() <= top.total() / TRACKED as u64);
    }

    #[test]
    fn weights_count_units_and_a_weight_of_nothing_counts_nothing() {
        let mut top = TopKeys::<()>::with_kept(2);
        top.add_weighted(1, 1_500, || None);
        top.add_weighted(2, 0, || None);
        top.add_weighted(1, 500, || None);
        let counts: Vec<_> = top.top(5).iter().map(|c| (c.key, c.count)).collect();
        assert_eq!(counts, [(1, 2_000)]);
        assert_eq!(top.total(), 2_000);
    }

    #[test]
    fn a_cleared_sketch_starts_over() {
        let mut top = TopKeys::<()>::with_kept(1);
        for key in 0..10 {
            top.add(key, || None);
        }
        assert!(top.floor() > 0);
        top.clear();
        assert_eq!((top.len(), top.floor(), top.total()), (0, 0, 0));
    }

    #[test]
    fn merged_sketches_add_up_each_keys_counts_and_keep_the_first_value() {
        let mut a = TopKeys::<&str>::with_kept(4);
        let mut b = TopKeys::<&str>::with_kept(4);
        a.add_weighted(1, 5, || Some("one"));
        a.add_weighted(2, 1, || Some("two"));
        b.add_weighted(1, 2, || Some("uno"));
        b.add_weighted(3, 4, || Some("three"));
        let merged = TopKeys::merge(&[&a, &b], 2);
        let counts: Vec<_> = merged.iter().map(|c| (c.key, c.count, c.error)).collect();
        assert_eq!(counts, [(1, 7, 0), (3, 4, 0)]);
        assert_eq!(merged[0].value, Some("one"));
    }

    /// Exact counts of the same stream, to hold the sketch to.
    fn exact(stream: &[(u64, u64)]) -> HashMap<u64, u64> {
        let mut counts = HashMap::new();
        for &(key, weight) in stream {
            *counts.entry(key).or_default() += weight;
        }
        counts
    }

    /// Holds `counted` (of a sketch or a merge over a stream of total `total`) to the bounds
    /// against the `truth`.
    fn within_bounds(
        counted: &[Counted<()>],
        truth: &HashMap<u64, u64>,
        kept: u64,
        total: u64,
    ) -> Result<(), TestCaseError> {
        let bound = total / kept;
        for c in counted {
            let true_count = truth.get(&c.key).copied().unwrap_or(0);
            prop_assert!(c.count >= true_count, "{c:?} under {true_count}");
            prop_assert!(c.count - c.error <= true_count, "{c:?} over {true_count}");
            prop_assert!(c.error <= bound, "{c:?} error over {bound}");
        }
        for (&key, &true_count) in truth {
            if true_count > bound {
                prop_assert!(
                    counted.iter().any(|c| c.key == key),
                    "key {key} ({true_count} > {bound}) missing"
                );
            }
        }
        Ok(())
    }

    /// Streams of skewed keys: a few heavy among many light ones.
    fn stream() -> impl Strategy<Value = Vec<(u64, u64)>> {
        let key = prop_oneof![1 => 0..5u64, 3 => 0..400u64];
        prop::collection::vec((key, 1..20u64), 0..3_000)
    }

    proptest! {
        #[test]
        fn every_count_is_within_its_error_of_exact_counting(
            stream in stream(),
            kept in 1..40usize,
        ) {
            let mut top = TopKeys::<()>::with_kept(kept);
            for &(key, weight) in &stream {
                top.add_weighted(key, weight, || None);
            }
            let truth = exact(&stream);
            let total: u64 = stream.iter().map(|&(_, w)| w).sum();
            prop_assert_eq!(top.total(), total);
            prop_assert!(top.len() <= 2 * kept);
            prop_assert!(top.floor() <= total / kept as u64);
            within_bounds(&top.top(usize::MAX), &truth, kept as u64, total)?;
        }

        #[test]
        fn merging_the_sketches_of_a_streams_parts_keeps_the_bounds(
            stream in stream(),
            parts in 1..8usize,
            kept in 1..40usize,
        ) {
            let mut sketches = vec![TopKeys::<()>::with_kept(kept); parts];
            for (i, &(key, weight)) in stream.iter().enumerate() {
                sketches[i * parts / stream.len().max(1)].add_weighted(key, weight, || None);
            }
            let refs: Vec<&TopKeys<()>> = sketches.iter().collect();
            let merged = TopKeys::merge(&refs, usize::MAX);
            let total: u64 = stream.iter().map(|&(_, w)| w).sum();
            within_bounds(&merged, &exact(&stream), kept as u64, total)?;
        }

        #[test]
        fn few_distinct_keys_are_counted_exactly(
            stream in prop::collection::vec((0..8u64, 1..50u64), 0..500),
        ) {
            let mut top = TopKeys::<()>::with_kept(4);
            for &(key, weight) in &stream {
                top.add_weighted(key, weight, || None);
            }
            let truth = exact(&stream);
            for c in top.top(usize::MAX) {
                prop_assert_eq!((c.count, c.error), (truth[&c.key], 0));
            }
        }
    }
}
