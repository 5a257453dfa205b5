//! The key-value store behind local buckets: proxy-wasm shared data, shared by every Envoy
//! worker. The trait mirrors the host's semantics exactly, including its traps.

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

/// An in-process store with Envoy's semantics, for tests. Thread-safe so tests can play
/// several workers at once.
#[cfg(test)]
#[derive(Default)]
pub struct MemoryStore {
    entries: std::sync::Mutex<Entries>,
}

/// Entries by key with their versions, and the last version handed out.
#[cfg(test)]
type Entries = (std::collections::HashMap<String, (Vec<u8>, u32)>, u32);

#[cfg(test)]
impl MemoryStore {
    pub fn entry_count(&self) -> usize {
        self.entries.lock().unwrap().0.len()
    }
}

#[cfg(test)]
impl Store for MemoryStore {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        self.entries.lock().unwrap().0.get(key).cloned()
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        let mut guard = self.entries.lock().unwrap();
        let (entries, version) = &mut *guard;
        if let Some((_, current)) = entries.get(key) {
            if cas != 0 && cas != *current {
                return Err(StoreError::CasMismatch);
            }
        }
        *version += 1;
        entries.insert(key.to_string(), (value.to_vec(), *version));
        Ok(())
    }
}
