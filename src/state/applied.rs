//! The admin path's writes applied once (`filter::admin`): each write's `id`, remembered in one
//! shared-data entry of this plugin (`<prefix>!a`) for `REMEMBERED_MS`, so that a write sent
//! twice (a retry, or the same call to every worker) changes the key once. Bounded: at most
//! `MAX_IDS` ids, the oldest forgotten first; shared data never frees an entry, so one entry
//! serves every write.

use crate::state::store::{Store, StoreError, ABSENT};

/// How long an id is remembered: ten minutes.
pub const REMEMBERED_MS: u64 = 10 * 60 * 1000;
/// The most ids remembered at once (16 bytes each).
pub const MAX_IDS: usize = 256;
/// Attempts at a contended entry.
const ATTEMPTS: u32 = 8;

fn name(prefix: &str) -> String {
    format!("{prefix}!a")
}

fn entries(bytes: &[u8]) -> impl Iterator<Item = (u64, u64)> + '_ {
    bytes.chunks_exact(16).map(|chunk| {
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk.get(at..at + 8).unwrap_or(&[0; 8]));
            u64::from_le_bytes(w)
        };
        (word(0), word(8))
    })
}

/// Claims `id` at `now_ms`: true if it was not applied within `REMEMBERED_MS` (the caller
/// applies the write), false if it was (a duplicate).
pub fn claim(store: &impl Store, prefix: &str, id: u64, now_ms: u64) -> Result<bool, StoreError> {
    let name = name(prefix);
    for _ in 0..ATTEMPTS {
        let (bytes, cas) = store.get(&name).unwrap_or((Vec::new(), ABSENT));
        let live: Vec<(u64, u64)> = entries(&bytes)
            .filter(|&(_, at)| at.saturating_add(REMEMBERED_MS) > now_ms)
            .collect();
        if live.iter().any(|&(seen, _)| seen == id) {
            return Ok(false);
        }
        let skip = (live.len() + 1).saturating_sub(MAX_IDS);
        let mut next = Vec::with_capacity(16 * MAX_IDS);
        for (seen, at) in live.into_iter().skip(skip).chain([(id, now_ms)]) {
            next.extend_from_slice(&seen.to_le_bytes());
            next.extend_from_slice(&at.to_le_bytes());
        }
        match store.set(&name, &next, cas) {
            Ok(()) => return Ok(true),
            Err(StoreError::CasMismatch) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::CasMismatch)
}

/// Forgets `id`: its write failed after it was claimed, so that a retry applies it.
pub fn release(store: &impl Store, prefix: &str, id: u64) {
    let name = name(prefix);
    for _ in 0..ATTEMPTS {
        let Some((bytes, cas)) = store.get(&name) else {
            return;
        };
        let mut next = Vec::with_capacity(bytes.len());
        for (seen, at) in entries(&bytes).filter(|&(seen, _)| seen != id) {
            next.extend_from_slice(&seen.to_le_bytes());
            next.extend_from_slice(&at.to_le_bytes());
        }
        if !matches!(store.set(&name, &next, cas), Err(StoreError::CasMismatch)) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::store::MemoryStore;

    #[test]
    fn an_id_is_claimed_once_within_its_time_and_the_bound_forgets_the_oldest() {
        let store = MemoryStore::default();
        assert_eq!(claim(&store, "p", 7, 1_000), Ok(true));
        assert_eq!(claim(&store, "p", 7, 2_000), Ok(false), "sent twice");
        assert_eq!(claim(&store, "q", 7, 2_000), Ok(true), "another plugin's");
        assert_eq!(
            claim(&store, "p", 7, 1_000 + REMEMBERED_MS),
            Ok(true),
            "forgotten"
        );
        for id in 100..100 + MAX_IDS as u64 {
            assert_eq!(claim(&store, "p", id, 5_000), Ok(true));
        }
        assert_eq!(store.get("p!a").unwrap().0.len(), 16 * MAX_IDS);
        assert_eq!(claim(&store, "p", 7, 5_000), Ok(true), "pushed out");
        assert_eq!(
            claim(&store, "p", 100 + MAX_IDS as u64 - 1, 5_000),
            Ok(false)
        );
    }

    #[test]
    fn a_released_id_can_be_claimed_again() {
        let store = MemoryStore::default();
        assert_eq!(claim(&store, "p", 9, 1_000), Ok(true));
        release(&store, "p", 9);
        assert_eq!(claim(&store, "p", 9, 1_000), Ok(true));
    }
}
