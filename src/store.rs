//! The key-value store behind local buckets: proxy-wasm shared data, shared by every Envoy
//! worker. The trait mirrors the host's semantics exactly, including its traps; `MemoryStore`
//! is the same in one process, for `sluice-replay` and the tests.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// Why a write did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreError {
    /// Someone wrote the entry since we read it.
    CasMismatch,
    /// The host refused for another reason.
    Failed,
}

pub trait Store {
    /// The entry's value and version (CAS), or `None` if it does not exist.
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)>;
    /// Writes if the entry is still at version `cas`. As in Envoy, `cas` 0 writes
    /// unconditionally, and so does any write that creates the entry.
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError>;
}

/// Shared data in one process, with Envoy's semantics (CAS 0 and creating writes are
/// unconditional). Thread-safe, so tests can play several workers at once.
#[derive(Debug, Default)]
pub struct MemoryStore {
    entries: Mutex<Entries>,
}

/// Entries by key with their versions, and the last version handed out.
type Entries = (HashMap<String, (Vec<u8>, u32)>, u32);

impl MemoryStore {
    pub fn entry_count(&self) -> usize {
        self.lock().0.len()
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
        self.lock().0.get(key).cloned()
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        let mut guard = self.lock();
        let (entries, version) = &mut *guard;
        match entries.get_mut(key) {
            Some((_, current)) if cas != 0 && cas != *current => Err(StoreError::CasMismatch),
            // Overwritten in place: a replay writes millions of times to a fixed set of slots.
            Some((old, current)) => {
                *version += 1;
                old.clear();
                old.extend_from_slice(value);
                *current = *version;
                Ok(())
            }
            None => {
                *version += 1;
                entries.insert(key.to_string(), (value.to_vec(), *version));
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_at_a_stale_version_loses_and_a_creating_write_ignores_cas() {
        let store = MemoryStore::default();
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
