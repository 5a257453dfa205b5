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
