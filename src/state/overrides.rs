//! The overrides an Envoy pulled from sluice-service, in its shared data: every worker reads
//! them, one worker writes them (`remote::overrides` decides which, and when).
//!
//! - **The index** (`<prefix>~`, JSON): the listing's version, when it was last pulled (Envoy's
//!   clock), the configuration it was laid out for, and per policy that has overrides its
//!   layout: how many pages (a power of two) and which hold any. Each worker keeps a copy
//!   (`View`), refreshed from it once a second: a policy the copy does not list costs a request
//!   nothing, not even a read.
//! - **The pages** (`<prefix>~<policy><log2><page>`, binary): a policy's overrides, spread by the
//!   key's hash over its pages, about `PER_PAGE` in each, sorted by hash: a request of a policy
//!   that has overrides reads one page (`lookup`), whatever their number. A page value is the
//!   policy name's hash (u64), then `WORDS` words per override: the key's hash, when it expires
//!   (Unix ms, `u64::MAX`: never), the algorithm, requests, per (ms), burst, max delay (ms, 0:
//!   none), all little-endian.
//!
//! A write (`write`) puts the pages first and the index last, so a worker reads either the old
//! set or the new. Pages of a layout that changed (more or fewer pages) stay as they were until
//! the next pull (`retired`), since a worker may still read them for up to a second; then they
//! are emptied (shared data never frees a name, so a page is emptied, not removed). An override
//! carries its expiry: it stops applying at that time in every worker, pulled again or not.

use crate::core::algorithm::Kind;
use crate::core::key::{hash_values, HashSecret};
use crate::core::text::push_base64;
use crate::state::store::Store;
use crate::wire::overrides::Listed;
use serde::{Deserialize, Serialize};

/// Overrides per page, about: a lookup copies at most a few of these.
pub const PER_PAGE: usize = 16;
/// The most pages of one policy: 2^16 (a million overrides, far past any bound).
pub const MAX_PAGES_LOG2: u32 = 16;
/// Words per override in a page.
const WORDS: usize = 7;

/// One override, as a page keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The key's hash, as other Envoys, the service and the logs know it.
    pub key: u64,
    /// Unix milliseconds; `None`: until deleted.
    pub expires_at_ms: Option<u64>,
    pub kind: Kind,
    pub requests: u64,
    pub per_ms: u64,
    pub burst: u64,
    pub max_delay_ms: Option<u64>,
}

impl Entry {
    pub fn live(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_none_or(|until| until > now_ms)
    }

    fn encode(&self, out: &mut Vec<u8>) {
        let words = [
            self.key,
            self.expires_at_ms.unwrap_or(u64::MAX),
            kind_code(self.kind),
            self.requests,
            self.per_ms,
            self.burst,
            self.max_delay_ms.unwrap_or(0),
        ];
        for word in words {
            out.extend_from_slice(&word.to_le_bytes());
        }
    }

    fn decode(bytes: &[u8]) -> Option<Entry> {
        let word = |i: usize| {
            let at = i.checked_mul(8)?;
            let chunk: [u8; 8] = bytes.get(at..at.checked_add(8)?)?.try_into().ok()?;
            Some(u64::from_le_bytes(chunk))
        };
        Some(Entry {
            key: word(0)?,
            expires_at_ms: Some(word(1)?).filter(|&t| t != u64::MAX),
            kind: kind_of(word(2)?)?,
            requests: word(3)?,
            per_ms: word(4)?,
            burst: word(5)?,
            max_delay_ms: Some(word(6)?).filter(|&ms| ms != 0),
        })
    }

    /// The override a listing names for `key`.
    pub fn of(listed: &Listed, key: u64) -> Entry {
        Entry {
            key,
            expires_at_ms: listed.expires_at_ms,
            kind: listed.algorithm,
            requests: listed.requests,
            per_ms: listed.per_ms,
            burst: listed.burst,
            max_delay_ms: listed.max_delay_ms,
        }
    }
}

const KINDS: [Kind; 6] = [
    Kind::TokenBucket,
    Kind::FixedWindow,
    Kind::SlidingWindow,
    Kind::SlidingLog,
    Kind::LeakyBucket,
    Kind::Concurrency,
];

fn kind_code(kind: Kind) -> u64 {
    KINDS.iter().position(|k| *k == kind).unwrap_or(0) as u64
}

fn kind_of(code: u64) -> Option<Kind> {
    KINDS.get(usize::try_from(code).ok()?).copied()
}

/// The index's name.
pub fn index_name(prefix: &str) -> String {
    format!("{prefix}~")
}

/// A page's name: short enough for Envoy to keep inline (15 bytes with a 6-byte prefix).
pub fn page_name(prefix: &str, policy: u64, log2: u32, page: u32) -> String {
    let mut name = String::with_capacity(prefix.len() + 9);
    name.push_str(prefix);
    name.push('~');
    push_base64(&mut name, policy & 0xff_ffff, 4);
    push_base64(&mut name, u64::from(log2), 1);
    push_base64(&mut name, u64::from(page), 1);
    name
}

/// A policy name's hash, as pages are named and headed by it.
pub fn name_hash(policy: &str) -> u64 {
    hash_values(&[policy.to_string()], &HashSecret::PUBLIC)
}

/// The index: what was pulled, when, and where each policy's overrides are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Index {
    /// The listing's version (`ETag`).
    pub version: String,
    /// When the service last answered (a listing or "unchanged"), Unix ms, Envoy's clock.
    pub pulled_ms: u64,
    /// The configuration the pages were laid out for (`plan_hash`): another asks afresh.
    pub plan: u64,
    /// Overrides held, over every policy.
    pub count: u64,
    pub policies: Vec<Layout>,
    /// Pages of layouts no longer in use, emptied at the next pull.
    #[serde(default)]
    pub retired: Vec<String>,
}

/// Where one policy's overrides are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    pub name: String,
    pub log2: u32,
    /// The pages that hold any.
    pub pages: Vec<u32>,
}

/// The hash a configuration's local policies lay overrides out for.
pub fn plan_hash(local: &[&str]) -> u64 {
    let names: Vec<String> = local.iter().map(|name| (*name).to_string()).collect();
    hash_values(&names, &HashSecret::PUBLIC)
}

/// The index as stored, and its version (CAS).
pub fn read_index(store: &impl Store, prefix: &str) -> Option<(Index, u32)> {
    let (bytes, cas) = store.get(&index_name(prefix))?;
    Some((serde_json::from_slice(&bytes).ok()?, cas))
}

/// Where a policy's overrides are, as a worker's copy of the index says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyPages {
    name: u64,
    log2: u32,
}

/// One worker's copy of the index: which of its configuration's policies have overrides.
#[derive(Debug, Default)]
pub struct View {
    /// The index's version when last read.
    cas: Option<u32>,
    /// By policy (its position in the configuration).
    by_policy: Vec<Option<PolicyPages>>,
    /// When the overrides were last pulled, if ever.
    pub pulled_ms: Option<u64>,
    pub count: u64,
}

impl View {
    /// Reads the index again if it changed since the last time. `policies` names the
    /// configuration's policies by position, `None` for those overrides do not apply to here
    /// (global ones: the service applies them).
    pub fn refresh(&mut self, store: &impl Store, prefix: &str, policies: &[Option<&str>]) {
        let Some((bytes, cas)) = store.get(&index_name(prefix)) else {
            return;
        };
        if self.cas == Some(cas) {
            return;
        }
        let Ok(index) = serde_json::from_slice::<Index>(&bytes) else {
            return;
        };
        self.cas = Some(cas);
        self.pulled_ms = Some(index.pulled_ms);
        self.count = index.count;
        self.by_policy = policies
            .iter()
            .map(|name| {
                let name = (*name)?;
                let layout = index.policies.iter().find(|l| l.name == name)?;
                Some(PolicyPages {
                    name: name_hash(name),
                    log2: layout.log2,
                })
            })
            .collect();
    }

    /// Where `policy`'s overrides are, if it has any: no read when it has none.
    pub fn pages(&self, policy: usize) -> Option<PolicyPages> {
        self.by_policy.get(policy).copied().flatten()
    }
}

/// The live override of `key` under a policy that has overrides: one read of its page.
pub fn lookup(
    store: &impl Store,
    prefix: &str,
    pages: PolicyPages,
    key: u64,
    now_ms: u64,
) -> Option<Entry> {
    let page = page_of(key, pages.log2);
    let (bytes, _) = store.get(&page_name(prefix, pages.name, pages.log2, page))?;
    let (head, records) = bytes.split_first_chunk::<8>()?;
    if u64::from_le_bytes(*head) != pages.name {
        return None;
    }
    let size = WORDS * 8;
    let count = records.len() / size;
    let record = |i: usize| Entry::decode(records.get(i * size..(i + 1) * size)?);
    let (mut low, mut high) = (0, count);
    while low < high {
        let mid = low + (high - low) / 2;
        let entry = record(mid)?;
        match entry.key.cmp(&key) {
            std::cmp::Ordering::Equal => return Some(entry).filter(|e| e.live(now_ms)),
            std::cmp::Ordering::Less => low = mid + 1,
            std::cmp::Ordering::Greater => high = mid,
        }
    }
    None
}

fn page_of(key: u64, log2: u32) -> u32 {
    // The low bits: the table pages of the same keys use their own mixing of the hash.
    u32::try_from(key & ((1u64 << log2) - 1)).unwrap_or(0)
}

/// The pages a policy of `n` overrides is laid out in, as a power of two.
pub fn log2_for(n: usize) -> u32 {
    let pages = n.div_ceil(PER_PAGE).max(1);
    pages
        .next_power_of_two()
        .trailing_zeros()
        .min(MAX_PAGES_LOG2)
}

/// A listing's overrides of `local`'s policies, live at `now_ms`, by policy; `Err(n)` when they
/// are more than `max` (`n` of them). Overrides of other policies (global ones, which the
/// service applies; policies of another configuration) are left out and count for nothing.
pub fn select(
    listing: &[Listed],
    local: &[&str],
    max: usize,
    now_ms: u64,
) -> Result<Vec<(String, Vec<Entry>)>, usize> {
    let mut by_policy: Vec<(String, Vec<Entry>)> = Vec::new();
    let mut count = 0;
    for listed in listing {
        let Some((policy, key)) = listed.policy_and_hash() else {
            continue;
        };
        let entry = Entry::of(listed, key);
        if !local.contains(&policy) || !entry.live(now_ms) {
            continue;
        }
        count += 1;
        match by_policy.iter_mut().find(|(name, _)| name == policy) {
            Some((_, entries)) => entries.push(entry),
            None => by_policy.push((policy.to_string(), vec![entry])),
        }
    }
    if count > max {
        return Err(count);
    }
    Ok(by_policy)
}

/// Writes `selected` (from `select`) as the overrides of version `version`, pulled at `now_ms`
/// for the configuration `plan`: pages first, the index last. `old` is the index it replaces:
/// its retired pages are emptied now, its pages that hold nothing now are emptied now when
/// their layout stays, retired when it does not. Returns the index written, or `None` if the
/// store refused it.
pub fn write(
    store: &impl Store,
    prefix: &str,
    (version, plan): (&str, u64),
    selected: Vec<(String, Vec<Entry>)>,
    old: Option<&Index>,
    now_ms: u64,
) -> Option<Index> {
    empty(store, old.map(|o| o.retired.as_slice()).unwrap_or_default());
    let mut index = Index {
        version: version.to_string(),
        pulled_ms: now_ms,
        plan,
        count: 0,
        policies: Vec::new(),
        retired: Vec::new(),
    };
    let mut written = Vec::new();
    for (name, mut entries) in selected {
        entries.sort_by_key(|e| e.key);
        entries.dedup_by_key(|e| e.key);
        index.count += entries.len() as u64;
        let log2 = log2_for(entries.len());
        let hash = name_hash(&name);
        let mut pages: Vec<(u32, Vec<u8>)> = Vec::new();
        for entry in &entries {
            let page = page_of(entry.key, log2);
            let at = match pages.iter().position(|(p, _)| *p == page) {
                Some(at) => at,
                None => {
                    pages.push((page, hash.to_le_bytes().to_vec()));
                    pages.len() - 1
                }
            };
            if let Some((_, bytes)) = pages.get_mut(at) {
                entry.encode(bytes);
            }
        }
        for (page, bytes) in &pages {
            let page_name = page_name(prefix, hash, log2, *page);
            store.set(&page_name, bytes, 0).ok()?;
            written.push(page_name);
        }
        index.policies.push(Layout {
            name,
            log2,
            pages: pages.iter().map(|(p, _)| *p).collect(),
        });
    }
    let mut now_empty = Vec::new();
    for layout in old.map(|o| o.policies.as_slice()).unwrap_or_default() {
        let stays = index
            .policies
            .iter()
            .any(|l| l.name == layout.name && l.log2 == layout.log2);
        let hash = name_hash(&layout.name);
        for &page in &layout.pages {
            let name = page_name(prefix, hash, layout.log2, page);
            if written.contains(&name) {
                continue;
            }
            match stays {
                true => now_empty.push(name),
                false => index.retired.push(name),
            }
        }
    }
    empty(store, &now_empty);
    let json = serde_json::to_vec(&index).ok()?;
    store.set(&index_name(prefix), &json, 0).ok()?;
    Some(index)
}

/// The service answered that nothing changed: the index says it was pulled now, and the pages
/// retired at the last change are emptied.
pub fn touch(store: &impl Store, prefix: &str, mut index: Index, now_ms: u64) -> Option<Index> {
    empty(store, &index.retired);
    index.retired.clear();
    index.pulled_ms = now_ms;
    let json = serde_json::to_vec(&index).ok()?;
    store.set(&index_name(prefix), &json, 0).ok()?;
    Some(index)
}

fn empty(store: &impl Store, pages: &[String]) {
    for page in pages {
        let _ = store.set(page, &[], 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::store::MemoryStore;

    const PREFIX: &str = "sAAAAA";
    const NOW: u64 = 1_800_000_000_000;

    fn listed(policy: &str, key: u64, requests: u64, expires_at_ms: Option<u64>) -> Listed {
        Listed {
            key: format!("{policy}/{key:016x}"),
            algorithm: Kind::TokenBucket,
            requests,
            per_ms: 60_000,
            burst: requests,
            max_delay_ms: None,
            expires_at_ms,
        }
    }

    fn pulled(store: &MemoryStore, listing: &[Listed], old: Option<&Index>) -> Index {
        let selected = select(listing, &["api", "chat"], 1000, NOW).unwrap();
        write(store, PREFIX, ("\"v\"", 7), selected, old, NOW).unwrap()
    }

    fn view(store: &MemoryStore) -> View {
        let mut view = View::default();
        view.refresh(store, PREFIX, &[Some("api"), Some("chat"), None]);
        view
    }

    fn found(store: &MemoryStore, policy: usize, key: u64, now_ms: u64) -> Option<u64> {
        let pages = view(store).pages(policy)?;
        lookup(store, PREFIX, pages, key, now_ms).map(|e| e.requests)
    }

    #[test]
    fn an_override_is_found_by_its_policy_and_key_in_one_read() {
        let store = MemoryStore::default();
        let index = pulled(&store, &[listed("api", 42, 100, None)], None);
        assert_eq!((index.count, index.policies.len()), (1, 1));
        let view = view(&store);
        assert_eq!(view.pages(1), None, "chat has none: no read");
        assert_eq!(view.pages(2), None, "a global policy is never looked up");
        let pages = view.pages(0).unwrap();
        assert_eq!(
            lookup(&store, PREFIX, pages, 42, NOW).map(|e| e.requests),
            Some(100)
        );
        assert_eq!(lookup(&store, PREFIX, pages, 43, NOW), None);
    }

    #[test]
    fn ten_thousand_overrides_are_each_found_and_a_page_holds_a_few_dozen_at_most() {
        let store = MemoryStore::default();
        let keys: Vec<u64> = (0..10_000u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let listing: Vec<Listed> = keys.iter().map(|&k| listed("api", k, 5, None)).collect();
        let selected = select(&listing, &["api"], 10_000, NOW).unwrap();
        let index = write(&store, PREFIX, ("\"v\"", 7), selected, None, NOW).unwrap();
        assert_eq!(index.policies[0].log2, 10, "1,024 pages of about 10");
        let mut view = View::default();
        view.refresh(&store, PREFIX, &[Some("api")]);
        let pages = view.pages(0).unwrap();
        for &key in &keys {
            assert_eq!(
                lookup(&store, PREFIX, pages, key, NOW).map(|e| e.key),
                Some(key)
            );
        }
        let largest = (0..1024)
            .filter_map(|p| store.get(&page_name(PREFIX, name_hash("api"), 10, p)))
            .map(|(bytes, _)| bytes.len())
            .max()
            .unwrap();
        assert!(largest <= 8 + 40 * WORDS * 8, "{largest} bytes");
    }

    #[test]
    fn an_override_stops_applying_when_it_expires_without_a_pull() {
        let store = MemoryStore::default();
        pulled(&store, &[listed("api", 42, 100, Some(NOW + 5_000))], None);
        assert_eq!(found(&store, 0, 42, NOW + 4_999), Some(100));
        assert_eq!(found(&store, 0, 42, NOW + 5_000), None);
    }

    #[test]
    fn expired_and_foreign_overrides_are_not_pulled_and_count_for_nothing() {
        let listing = [
            listed("api", 1, 10, Some(NOW - 1)),
            listed("global-user", 2, 10, None),
            listed("api", 3, 10, None),
            Listed {
                key: "api/not-a-hash".into(),
                ..listed("api", 4, 10, None)
            },
        ];
        let selected = select(&listing, &["api"], 1, NOW).unwrap();
        assert_eq!(selected.len(), 1);
        assert_eq!(selected[0].1.iter().map(|e| e.key).collect::<Vec<_>>(), [3]);
    }

    #[test]
    fn more_than_the_bound_is_refused_whole() {
        let listing: Vec<Listed> = (0..3).map(|k| listed("api", k, 1, None)).collect();
        assert_eq!(select(&listing, &["api"], 2, NOW).err(), Some(3));
        assert!(select(&listing, &["api"], 3, NOW).is_ok());
    }

    #[test]
    fn a_new_set_replaces_the_old_and_deleted_overrides_stop_at_once() {
        let store = MemoryStore::default();
        let first = pulled(
            &store,
            &[listed("api", 1, 10, None), listed("chat", 2, 20, None)],
            None,
        );
        assert_eq!(found(&store, 1, 2, NOW), Some(20));
        let second = pulled(&store, &[listed("api", 1, 11, None)], Some(&first));
        assert_eq!(found(&store, 0, 1, NOW), Some(11), "replaced in place");
        assert_eq!(found(&store, 1, 2, NOW), None, "chat has none now");
        assert_eq!(
            second.retired.len(),
            1,
            "chat's page, emptied at the next pull"
        );
        let old_page = &second.retired[0].clone();
        assert!(!store.get(old_page).unwrap().0.is_empty(), "still readable");
        let third = touch(&store, PREFIX, second, NOW + 2000).unwrap();
        assert!(store.get(old_page).unwrap().0.is_empty(), "emptied");
        assert!(third.retired.is_empty());
        assert_eq!(third.pulled_ms, NOW + 2000);
    }

    #[test]
    fn a_page_left_empty_in_the_same_layout_is_emptied_at_once() {
        let store = MemoryStore::default();
        let keys: Vec<u64> = (0..50).collect();
        let listing: Vec<Listed> = keys.iter().map(|&k| listed("api", k, 5, None)).collect();
        let first = pulled(&store, &listing, None);
        assert_eq!(first.policies[0].log2, 2);
        // Page 3 holds keys 3, 7, ..., 47: without them, 38 keys still take four pages.
        let kept: Vec<Listed> = (listing.iter())
            .filter(|l| l.policy_and_hash().unwrap().1 % 4 != 3)
            .cloned()
            .collect();
        let second = pulled(&store, &kept, Some(&first));
        assert_eq!(second.policies[0].log2, 2);
        assert!(second.retired.is_empty());
        assert_eq!(found(&store, 0, 7, NOW), None);
        assert_eq!(found(&store, 0, 8, NOW), Some(5));
    }

    #[test]
    fn a_worker_rereads_the_index_only_when_it_changed() {
        let store = MemoryStore::default();
        let mut view = View::default();
        view.refresh(&store, PREFIX, &[Some("api")]);
        assert_eq!(
            (view.pages(0), view.pulled_ms),
            (None, None),
            "never pulled"
        );
        let index = pulled(&store, &[listed("api", 1, 10, None)], None);
        view.refresh(&store, PREFIX, &[Some("api")]);
        assert!(view.pages(0).is_some());
        assert_eq!(view.pulled_ms, Some(NOW));
        touch(&store, PREFIX, index, NOW + 2000).unwrap();
        view.refresh(&store, PREFIX, &[Some("api")]);
        assert_eq!(view.pulled_ms, Some(NOW + 2000));
    }

    #[test]
    fn page_names_fit_inline_in_envoy() {
        let prefix = crate::state::table::prefix("a-plugin-name-of-some-length");
        let name = page_name(&prefix, u64::MAX, MAX_PAGES_LOG2, (1 << MAX_PAGES_LOG2) - 1);
        assert!(name.len() <= 15, "{name}");
        assert_ne!(index_name(&prefix), page_name(&prefix, 0, 0, 0));
    }

    #[test]
    fn an_entry_survives_its_encoding() {
        let entry = Entry {
            key: 9,
            expires_at_ms: Some(NOW),
            kind: Kind::LeakyBucket,
            requests: 3,
            per_ms: 1000,
            burst: 3,
            max_delay_ms: Some(500),
        };
        let mut bytes = Vec::new();
        entry.encode(&mut bytes);
        assert_eq!(Entry::decode(&bytes), Some(entry));
        let forever = Entry {
            expires_at_ms: None,
            max_delay_ms: None,
            ..entry
        };
        bytes.clear();
        forever.encode(&mut bytes);
        assert_eq!(Entry::decode(&bytes), Some(forever));
    }
}
