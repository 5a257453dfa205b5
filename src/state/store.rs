//! The key-value store behind local buckets: proxy-wasm shared data, shared by every Envoy
//! worker. The trait mirrors the host's semantics exactly, including its traps; `MemoryStore`
//! is the same in one process, for the tests, and `LocalStore` in one thread, for
//! `sluice-replay`.

use smallvec::SmallVec;
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Mutex, MutexGuard};

/// Why a write did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreError {
    /// Someone wrote the entry since we read it.
    CasMismatch,
    /// The host refused for another reason.
    Failed,
}

/// A version no entry has (the host's versions count up from 1 for every write of the process, and
/// would have to wrap around to reach it): a `set` at it creates the entry, or fails as a lost
/// race if someone else created it first.
pub const ABSENT: u32 = u32::MAX;

pub trait Store {
    /// The entry's value and version (CAS), or `None` if it does not exist.
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)>;
    /// Writes if the entry is still at version `cas`. As in Envoy, `cas` 0 writes
    /// unconditionally, and so does any write that creates the entry.
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError>;
}

/// Shared data in one process, with Envoy's semantics (CAS 0 and creating writes are
/// unconditional). Thread-safe, so tests can play several workers at once.
///
/// Built for a replay's millions of reads and writes of a fixed set of slots: names and values
/// are kept inline in the map (one cache miss per read, not three), hashed with a multiply-rotate
/// hash (slot names are not chosen by clients), and overwritten in place.
#[derive(Debug, Default)]
pub struct MemoryStore {
    entries: Mutex<Entries>,
}

/// The same for one thread, as `sluice-replay`'s one worker is: no lock taken and released
/// around every read and write.
#[derive(Debug, Default)]
pub struct LocalStore {
    entries: RefCell<Entries>,
}

/// A page name (`table::page_name`) fits inline.
type Name = SmallVec<[u8; 24]>;
/// A small page fits inline.
type Value = SmallVec<[u8; 64]>;

/// Entries by name with their versions, and the last version handed out.
#[derive(Debug, Default)]
struct Entries {
    map: HashMap<Name, (Value, u32), BuildHasherDefault<SlotHasher>>,
    version: u32,
}

impl Entries {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        let (value, version) = self.map.get(key.as_bytes())?;
        Some((value.to_vec(), *version))
    }

    fn set(&mut self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        match self.map.get_mut(key.as_bytes()) {
            Some((_, current)) if cas != 0 && cas != *current => Err(StoreError::CasMismatch),
            Some((old, current)) => {
                self.version += 1;
                old.clear();
                old.extend_from_slice(value);
                *current = self.version;
                Ok(())
            }
            None => {
                self.version += 1;
                let entry = (value.into(), self.version);
                self.map.insert(key.as_bytes().into(), entry);
                Ok(())
            }
        }
    }
}

impl MemoryStore {
    pub fn entry_count(&self) -> usize {
        self.lock().map.len()
    }

    /// A panic elsewhere while holding the lock leaves whole entries behind: keep using them.
    fn lock(&self) -> MutexGuard<'_, Entries> {
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Store for MemoryStore {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        self.lock().get(key)
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        self.lock().set(key, value, cas)
    }
}

/// Neither call borrows the entries while the other holds them; were one to, it would fail as
/// the host fails, not panic.
impl Store for LocalStore {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        self.entries.try_borrow().ok()?.get(key)
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        let mut entries = self
            .entries
            .try_borrow_mut()
            .map_err(|_| StoreError::Failed)?;
        entries.set(key, value, cas)
    }
}

/// FxHash's multiply-rotate, eight bytes at a time: a few nanoseconds for a slot name, where
/// the standard SipHash takes tens.
#[derive(Debug, Default)]
struct SlotHasher(u64);

impl Hasher for SlotHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let word = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
            self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(K);
        }
        for &byte in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(byte)).wrapping_mul(K);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_at_a_stale_version_loses_and_a_creating_write_ignores_cas() {
        versions_as_envoy_keeps_them(&MemoryStore::default());
        versions_as_envoy_keeps_them(&LocalStore::default());
    }

    fn versions_as_envoy_keeps_them(store: &impl Store) {
        store.set("k", b"a", 7).unwrap();
        let (_, first) = store.get("k").unwrap();
        store.set("k", b"b", first).unwrap();
        assert_eq!(store.set("k", b"c", first), Err(StoreError::CasMismatch));
        let (value, second) = store.get("k").unwrap();
        assert_eq!((value.as_slice(), second > first), (&b"b"[..], true));
        store.set("k", b"d", 0).unwrap();
        assert_eq!(store.get("k").unwrap().0, b"d");
    }
}
