//! Two counts of consecutive periods, the current one and the one before, stored as
//! [period index, current, previous] and rolled forward as time passes: one period on, the
//! current count becomes the previous one; two periods on, both are gone. The sliding window's
//! windows and a concurrency policy's epochs.

/// Words of state.
pub const COLUMNS: usize = 3;

/// The counts (current, previous) as of period `index`, from the stored ones.
pub fn counts(state: &[u64], index: u64) -> (u64, u64) {
    match state {
        [stored, current, previous] if *stored == index => (*current, *previous),
        [stored, current, _] if stored.checked_add(1) == Some(index) => (0, *current),
        _ => (0, 0),
    }
}

/// Stores the counts (current, previous) of period `index`.
pub fn store(state: &mut [u64], index: u64, (current, previous): (u64, u64)) {
    if let [stored, stored_current, stored_previous] = state {
        (*stored, *stored_current, *stored_previous) = (index, current, previous);
    }
}

/// Takes up to `n` back from what period `taken` counted, as of period `index`: from the current
/// count or the previous one, whichever it is; `None` when that period is gone. Returns how much
/// was taken back (at most what the period counts).
pub fn take_back(state: &mut [u64], index: u64, taken: u64, n: u64) -> Option<u64> {
    let (mut current, mut previous) = counts(state, index);
    let count = if taken == index {
        &mut current
    } else if taken.checked_add(1) == Some(index) {
        &mut previous
    } else {
        return None;
    };
    let back = n.min(*count);
    *count -= back;
    store(state, index, (current, previous));
    Some(back)
}

/// What the stored state counted that is gone as of period `index`.
pub fn gone(state: &[u64], index: u64) -> u64 {
    match state {
        [stored, ..] if *stored >= index => 0,
        [stored, _, previous] if stored.checked_add(1) == Some(index) => *previous,
        [_, current, previous] => current.saturating_add(*previous),
        _ => 0,
    }
}
