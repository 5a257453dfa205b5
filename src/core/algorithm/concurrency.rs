//! Concurrency: at most `limit` requests of a key in flight at once. A request takes a slot at
//! admission and gives it back when it ends; a slot is a lease, renewed while its request lives,
//! so that a slot whose release is lost (a crashed worker, VM or Envoy) frees itself.
//!
//! Slots are counted per epoch of half a lease, whatever the limit: the state is the current
//! epoch and the counts of it and the one before. A slot is counted in the epoch it was taken or
//! last renewed in, and is forgotten when the second epoch after that one starts: between half a
//! lease and a lease after its last renewal. A live request renews its slot once its epoch is
//! behind (see `renew`), so a stream of any length keeps it. Releasing and renewing name where
//! the slot is counted (`Taken`), which the request keeps: each is exact, and a slot that
//! expired meanwhile is not taken from another request. Nor is one the key's state counted
//! before its table forgot it: a state knows when it was first written (`born`), and a request
//! gives back only to the state it took from.

use std::num::NonZeroU64;

use super::periods::{self, counts, store};
use super::{invalid, within, Debt, Decision, Invalid, Param, MAX_PERIOD};
use crate::core::duration::NANOS_PER_SEC;

/// State: the current epoch, the slots counted in it and in the one before, and when the state
/// was first written.
pub const COLUMNS: usize = periods::COLUMNS + 1;
/// The most requests of one key in flight a policy may allow.
pub const MAX_SLOTS: u64 = 1_000_000;
/// The shortest lease: renewals run on a timer of a second, at least twice an epoch.
pub const MIN_LEASE: u64 = 4 * NANOS_PER_SEC;

/// At most `limit` requests in flight; a slot not renewed for a lease is forgotten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slots {
    pub limit: u64,
    /// Half the lease: the length of an epoch.
    pub epoch: NonZeroU64,
}

impl Slots {
    /// `limit` (`requests`) slots of `lease` nanoseconds.
    pub fn new(limit: u64, lease: u64) -> Result<Slots, Invalid> {
        let limit = within(Param::Requests, limit, MAX_SLOTS)?;
        if !(MIN_LEASE..=MAX_PERIOD).contains(&lease) {
            return Err(invalid(Param::Lease, "must be between 4s and 365d"));
        }
        let epoch = NonZeroU64::new(lease / 2).ok_or_else(|| invalid(Param::Lease, "too short"))?;
        Ok(Slots { limit, epoch })
    }

    /// The lease: a slot nobody renews is forgotten at most this long after it was last renewed.
    pub fn lease(&self) -> u64 {
        2 * self.epoch.get()
    }

    /// The epoch of `now`: what a slot taken or renewed at `now` is counted in.
    pub fn epoch_of(&self, now: u64) -> u64 {
        now / self.epoch
    }
}

/// Where a request's slot is counted: the epoch it was taken or last renewed in, and when the
/// state that counts it was first written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    pub epoch: u64,
    pub born: u64,
}

/// The state's counts: the periods' words.
fn counted(state: &[u64]) -> &[u64] {
    state.get(..periods::COLUMNS).unwrap_or_default()
}

/// The state's counts and its birth: the periods' words, and the last.
fn split(state: &mut [u64]) -> Option<(&mut [u64], &mut u64)> {
    let (counts, born) = state.split_at_mut_checked(periods::COLUMNS)?;
    Some((counts, born.first_mut()?))
}

/// Where a slot taken or renewed at `now` in `state` is counted.
pub fn taken(slots: &Slots, state: &[u64], now: u64) -> Taken {
    Taken {
        epoch: slots.epoch_of(now),
        born: state.get(periods::COLUMNS).copied().unwrap_or(0),
    }
}

/// Slots in use at `now`.
pub fn in_use(slots: &Slots, state: &[u64], now: u64) -> u64 {
    let (newer, older) = counts(counted(state), slots.epoch_of(now));
    newer.saturating_add(older)
}

/// Takes `cost` slots (one per request) if that many are free at `now`. Nobody can say when a
/// slot frees, so a refusal gives no time to retry; `reset_after` is when the slots counted now
/// are forgotten at the latest.
pub fn admit(slots: &Slots, state: &mut [u64], now: u64, cost: u64) -> Decision {
    let epoch = slots.epoch_of(now);
    let (newer, older) = counts(counted(state), epoch);
    let used = newer.saturating_add(older);
    let reset_after = (epoch + 2).saturating_mul(slots.epoch.get()) - now;
    if used.saturating_add(cost) > slots.limit {
        return Decision {
            allowed: false,
            remaining: slots.limit.saturating_sub(used),
            reset_after,
            ..Decision::default()
        };
    }
    if let Some((counts, born)) = split(state) {
        store(counts, epoch, (newer + cost, older));
        if *born == 0 {
            *born = now.max(1);
        }
    }
    Decision {
        allowed: true,
        remaining: slots.limit - used - cost,
        reset_after,
        ..Decision::default()
    }
}

/// Gives back the slot counted where `taken` says; false if it had expired (it is counted
/// nowhere any more), or the state is another than the one it was taken from: nothing is taken
/// from the slots of others.
pub fn release(slots: &Slots, state: &mut [u64], now: u64, taken: Taken) -> bool {
    match split(state) {
        Some((counts, born)) if *born == taken.born => {
            periods::take_back(counts, slots.epoch_of(now), taken.epoch, 1) == Some(1)
        }
        _ => false,
    }
}

/// Moves the slot counted where `taken` says to the epoch of `now`, if it is behind: where it is
/// counted from now on. A slot that expired meanwhile (its renewal came over half a lease late),
/// or that the key's forgotten state counted, is taken again if one is free; `None` if none is:
/// the request runs on uncounted.
pub fn renew(slots: &Slots, state: &mut [u64], now: u64, taken: Taken) -> Option<Taken> {
    let epoch = slots.epoch_of(now);
    if taken.epoch >= epoch {
        return Some(taken);
    }
    if release(slots, state, now, taken) {
        if let Some((counts, _)) = split(state) {
            let (newer, older) = self::counts(counts, epoch);
            store(counts, epoch, (newer + 1, older));
        }
        return Some(Taken { epoch, ..taken });
    }
    let admitted = admit(slots, state, now, 1).allowed;
    admitted.then(|| self::taken(slots, state, now))
}

/// Slots the stored state counts that are forgotten at `now`: taken, never given back, and not
/// renewed for a lease. Releases that never came: a crashed worker, VM or Envoy.
pub fn expired(slots: &Slots, state: &[u64], now: u64) -> u64 {
    periods::gone(counted(state), slots.epoch_of(now))
}

/// What forgetting the state forgives: the slots in use, which would be free for others.
pub fn debt(slots: &Slots, state: &[u64], now: u64) -> Debt {
    Debt::of(in_use(slots, state, now).into(), slots.limit.into(), 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SEC: u64 = NANOS_PER_SEC;
    const T0: u64 = 1_800_000_000 * SEC;

    fn slots(limit: u64) -> Slots {
        Slots::new(limit, 60 * SEC).unwrap()
    }

    #[test]
    fn n_plus_one_requests_get_n_slots_and_a_release_frees_one() {
        let (four, mut state) = (slots(4), [0; COLUMNS]);
        let taken: Vec<bool> = (0..5)
            .map(|_| admit(&four, &mut state, T0, 1).allowed)
            .collect();
        assert_eq!(taken, [true, true, true, true, false]);
        let first = super::taken(&four, &state, T0);
        assert!(release(&four, &mut state, T0 + SEC, first));
        assert!(admit(&four, &mut state, T0 + SEC, 1).allowed);
        assert_eq!(in_use(&four, &state, T0 + SEC), 4);
    }

    #[test]
    fn a_refusal_gives_no_time_to_retry() {
        let (one, mut state) = (slots(1), [0; COLUMNS]);
        admit(&one, &mut state, T0, 1);
        let refused = admit(&one, &mut state, T0, 1);
        assert_eq!((refused.allowed, refused.retry_after), (false, 0));
    }

    #[test]
    fn a_slot_nobody_renews_is_forgotten_within_a_lease() {
        let (one, mut state) = (slots(1), [0; COLUMNS]);
        admit(&one, &mut state, T0, 1);
        assert!(!admit(&one, &mut state, T0 + 29 * SEC, 1).allowed);
        let lease = one.lease();
        assert!(admit(&one, &mut state, T0 + lease, 1).allowed, "expired");
    }

    #[test]
    fn a_renewed_slot_outlives_its_lease_and_a_late_release_takes_nothing_from_others() {
        let (one, mut state) = (slots(1), [0; COLUMNS]);
        admit(&one, &mut state, T0, 1);
        let mut taken = super::taken(&one, &state, T0);
        for minute in 1..=10 {
            let now = T0 + minute * 31 * SEC;
            taken = renew(&one, &mut state, now, taken).unwrap();
            assert!(!admit(&one, &mut state, now, 1).allowed, "still held");
        }
        let later = T0 + 10 * 31 * SEC + one.lease();
        assert!(admit(&one, &mut state, later, 1).allowed, "expired at last");
        assert!(!release(&one, &mut state, later, taken), "not another's");
        assert_eq!(in_use(&one, &state, later), 1);
    }

    #[test]
    fn slots_nobody_gave_back_are_counted_as_expired_once_forgotten() {
        let (four, mut state) = (slots(4), [0; COLUMNS]);
        admit(&four, &mut state, T0, 1);
        admit(&four, &mut state, T0, 1);
        let half = four.epoch.get();
        admit(&four, &mut state, T0 + half, 1);
        assert_eq!(expired(&four, &state, T0 + half), 0);
        assert_eq!(expired(&four, &state, T0 + 2 * half), 2, "the first two");
        assert_eq!(expired(&four, &state, T0 + 3 * half), 3, "all three");
    }

    #[test]
    fn a_release_to_a_state_forgotten_and_made_again_takes_nothing_from_it() {
        let (two, mut state) = (slots(2), [0; COLUMNS]);
        admit(&two, &mut state, T0, 1);
        let before = super::taken(&two, &state, T0);
        let mut again = [0; COLUMNS];
        admit(&two, &mut again, T0 + 1, 1);
        assert!(!release(&two, &mut again, T0 + 2, before));
        assert_eq!(
            in_use(&two, &again, T0 + 2),
            1,
            "the new request's slot stays"
        );
    }

    #[test]
    fn a_corrupt_state_never_overflows() {
        let mut state = [u64::MAX; COLUMNS];
        let (two, now) = (slots(2), u64::MAX - 1);
        let corrupt = Taken {
            epoch: u64::MAX,
            born: u64::MAX,
        };
        admit(&two, &mut state, now, 1);
        release(&two, &mut state, now, corrupt);
        renew(
            &two,
            &mut state,
            now,
            Taken {
                epoch: 0,
                ..corrupt
            },
        );
        debt(&two, &state, now);
    }

    /// One request of the model: where its slot is counted while it holds one, `None` once
    /// refused or ended.
    type Held = Option<Taken>;

    proptest! {
        /// Against a model that knows every request: the slots in use are exactly the live
        /// requests' whose last renewal is recent, never more than the limit.
        #[test]
        fn matches_the_requests_that_hold_a_slot(
            limit in 1u64..6,
            steps in prop::collection::vec((0u64..20, 0u8..4, 0usize..8), 1..200),
        ) {
            let four = Slots::new(limit, 60 * SEC).unwrap();
            let mut state = [0; COLUMNS];
            let mut requests: Vec<Held> = Vec::new();
            let mut now = T0;
            for (gap, action, pick) in steps {
                now += gap * SEC;
                let current = four.epoch_of(now);
                for held in requests.iter_mut() {
                    if held.is_some_and(|t| t.epoch + 2 <= current) {
                        *held = None;
                    }
                }
                let live = requests.iter().flatten().count() as u64;
                prop_assert_eq!(in_use(&four, &state, now), live);
                let count = requests.len().max(1);
                let held = requests.get_mut(pick % count);
                match (action, held) {
                    (0, _) => {
                        let d = admit(&four, &mut state, now, 1);
                        prop_assert_eq!(d.allowed, live < limit);
                        requests.push(d.allowed.then(|| taken(&four, &state, now)));
                    }
                    (1, Some(held)) if held.is_some() => {
                        prop_assert!(held.is_some_and(|t| release(&four, &mut state, now, t)));
                        *held = None;
                    }
                    (2, Some(held)) if held.is_some() => {
                        *held = held.and_then(|t| renew(&four, &mut state, now, t));
                    }
                    _ => {}
                }
                prop_assert!(in_use(&four, &state, now) <= limit);
            }
        }
    }
}
