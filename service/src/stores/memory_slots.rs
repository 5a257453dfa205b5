//! The slots of concurrency limits kept in this process (`--memory`): per state key, each slot's
//! name and when its lease expires, in microseconds of the system clock. What the Redis scripts
//! (`redis_store::CONCURRENCY_LUA` and the others) do to their sorted sets, done to a map, so
//! that both stores answer alike.

use std::collections::HashMap;

use crate::stores::Decision;

/// Every key's slots: state key → slot name → expiry (µs since the epoch). A slot is live while
/// its expiry is after now. And the names released before any check took them (a check the
/// filter gave up on, overtaken by its release): state key → slot name → until when a check
/// naming it is refused (`released_key`'s tombstone in Redis).
#[derive(Debug, Default)]
pub struct SlotTable {
    keys: HashMap<String, HashMap<String, u64>>,
    released: HashMap<String, HashMap<String, u64>>,
}

/// How many slots, and which, a check takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask<'a> {
    pub limit: u64,
    pub lease_us: u64,
    /// Slots that must be free.
    pub cost: u64,
    /// Slots to take (0..=cost).
    pub take: u64,
    /// The slot's name; `None`: `take` slots named here, `<now>-<n>`.
    pub name: Option<&'a str>,
}

impl SlotTable {
    /// Takes the slots if they are free at `now` (`CONCURRENCY_LUA`). A named slot released
    /// before (a tombstone) is refused, and nothing is written.
    pub fn acquire(&mut self, key: &str, ask: Ask, now: u64) -> Decision {
        let buried = ask
            .name
            .is_some_and(|name| self.is_released(key, name, now));
        let slots = self.keys.entry(key.to_string()).or_default();
        let mine = ask
            .name
            .is_some_and(|n| slots.get(n).is_some_and(|&e| e > now));
        let live = live(slots, now) - u64::from(mine);
        if buried {
            let decision = answer(false, 0, ask.limit.saturating_sub(live), slots, now);
            self.forget_if_empty(key);
            return decision;
        }
        if live + ask.cost > ask.limit || ask.take == 0 {
            let allowed = live + ask.cost <= ask.limit;
            let decision = answer(allowed, 0, ask.limit.saturating_sub(live), slots, now);
            self.forget_if_empty(key);
            return decision;
        }
        slots.retain(|_, &mut expiry| expiry > now);
        let expiry = now + ask.lease_us;
        match ask.name {
            Some(name) => {
                slots.insert(name.to_string(), expiry);
            }
            None => {
                let mut n = 0;
                for _ in 0..ask.take {
                    while slots.contains_key(&anonymous(now, n)) {
                        n += 1;
                    }
                    slots.insert(anonymous(now, n), expiry);
                }
            }
        }
        answer(true, ask.take, ask.limit - live - ask.take, slots, now)
    }

    /// Gives back `count` slots, those that expire soonest (`CONCURRENCY_GIVE_BACK_LUA`).
    pub fn give_back(&mut self, key: &str, limit: u64, count: u64, now: u64) -> Decision {
        let Some(slots) = self.keys.get_mut(key) else {
            return answer(true, 0, limit, &HashMap::new(), now);
        };
        slots.retain(|_, &mut expiry| expiry > now);
        // ZPOPMIN's order: by expiry, then by name.
        let mut soonest: Vec<(u64, String)> = slots.iter().map(|(n, &e)| (e, n.clone())).collect();
        soonest.sort();
        let given = soonest
            .len()
            .min(usize::try_from(count).unwrap_or(usize::MAX));
        for (_, name) in soonest.iter().take(given) {
            slots.remove(name);
        }
        let remaining = limit.saturating_sub(slots.len() as u64);
        let decision = answer(true, given as u64, remaining, slots, now);
        self.forget_if_empty(key);
        decision
    }

    /// Frees the slot: 1 if it was live, else 0 (`SLOT_RELEASE_LUA`). A slot that was not there
    /// at all is buried for `lease_us`: its check may still come (the filter gave up on it), and
    /// must not take it then.
    pub fn release(&mut self, key: &str, slot: &str, lease_us: u64, now: u64) -> u64 {
        let removed = self.keys.get_mut(key).and_then(|slots| slots.remove(slot));
        self.forget_if_empty(key);
        if removed.is_none() {
            let buried = self.released.entry(key.to_string()).or_default();
            buried.insert(slot.to_string(), now.saturating_add(lease_us));
        }
        u64::from(removed.is_some_and(|expiry| expiry > now))
    }

    /// Starts a live slot's lease again: 1, else 0 (`SLOT_RENEW_LUA`). A slot that expired, was
    /// released or never taken stays so: a renewal that comes late, after its release, must not
    /// take it back.
    pub fn renew(&mut self, key: &str, lease_us: u64, slot: &str, now: u64) -> u64 {
        let held = self.keys.get_mut(key).and_then(|slots| slots.get_mut(slot));
        match held {
            Some(expiry) if *expiry > now => {
                *expiry = now + lease_us;
                1
            }
            _ => 0,
        }
    }

    /// The key's live named slots whose lease ends within `within` of `now` (`UNRENEWED_LUA`):
    /// slots not renewed in time. Anonymous slots (`<now>-<n>`, the RLS's) are never renewed.
    pub fn stale(&self, key: &str, now: u64, within: u64) -> u64 {
        let Some(slots) = self.keys.get(key) else {
            return 0;
        };
        let stale = slots.iter().filter(|(name, &expiry)| {
            !name.contains('-') && expiry > now && expiry <= now.saturating_add(within)
        });
        stale.count() as u64
    }

    /// Forgets the keys with no live slot, and tombstones past their time: memory holds only
    /// keys whose slots are in use.
    pub fn forget_idle(&mut self, now: u64) {
        self.keys.retain(|_, slots| live(slots, now) > 0);
        self.released.retain(|_, buried| {
            buried.retain(|_, &mut until| until > now);
            !buried.is_empty()
        });
    }

    /// Frees every slot of `key` (the admin API's reset); whether it had any.
    pub fn forget(&mut self, key: &str) -> bool {
        self.keys.remove(key).is_some()
    }

    fn is_released(&self, key: &str, slot: &str, now: u64) -> bool {
        let until = self.released.get(key).and_then(|buried| buried.get(slot));
        until.is_some_and(|&until| until > now)
    }

    fn forget_if_empty(&mut self, key: &str) {
        if self.keys.get(key).is_some_and(HashMap::is_empty) {
            self.keys.remove(key);
        }
    }
}

fn live(slots: &HashMap<String, u64>, now: u64) -> u64 {
    slots.values().filter(|&&expiry| expiry > now).count() as u64
}

/// The name of the `n`th anonymous slot taken at `now`, as the script names it.
fn anonymous(now: u64, n: u64) -> String {
    format!("{now}-{n}")
}

/// The decision as the slots stand: reset is until the newest live slot expires.
fn answer(
    allowed: bool,
    granted: u64,
    remaining: u64,
    slots: &HashMap<String, u64>,
    now: u64,
) -> Decision {
    let newest = slots.values().copied().filter(|&e| e > now).max();
    Decision {
        allowed,
        granted,
        remaining,
        reset_us: newest.map_or(0, |expiry| expiry - now),
        retry_after_us: 0,
        delay_us: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: u64 = 4_000_000;

    fn named(name: &str) -> Ask<'_> {
        Ask {
            limit: 2,
            lease_us: LEASE,
            cost: 1,
            take: 1,
            name: Some(name),
        }
    }

    #[test]
    fn two_slots_admit_two_requests_and_a_release_frees_one() {
        let mut table = SlotTable::default();
        assert!(table.acquire("k", named("a"), 10).allowed);
        assert_eq!(table.acquire("k", named("b"), 10).remaining, 0);
        assert!(!table.acquire("k", named("c"), 10).allowed);
        assert_eq!(table.release("k", "a", LEASE, 11), 1);
        assert!(table.acquire("k", named("c"), 11).allowed);
    }

    #[test]
    fn a_slot_asked_for_again_is_counted_once() {
        let mut table = SlotTable::default();
        table.acquire("k", named("a"), 10);
        let again = table.acquire("k", named("a"), 20);
        assert!(again.allowed);
        assert_eq!((again.remaining, again.reset_us), (1, LEASE));
    }

    #[test]
    fn a_lost_slot_frees_itself_when_its_lease_ends_unless_renewed() {
        let mut table = SlotTable::default();
        table.acquire("k", named("a"), 0);
        table.acquire("k", named("b"), 0);
        assert_eq!(table.renew("k", LEASE, "a", LEASE - 1), 1);
        assert!(!table.acquire("k", named("c"), LEASE - 1).allowed);
        assert!(table.acquire("k", named("c"), LEASE).allowed, "b expired");
        assert_eq!(table.release("k", "b", LEASE, LEASE), 0, "b had expired");
        assert_eq!(table.renew("k", LEASE, "b", LEASE), 0, "not taken back");
    }

    #[test]
    fn a_check_that_comes_after_its_slots_release_takes_nothing() {
        let mut table = SlotTable::default();
        assert_eq!(table.release("k", "a", LEASE, 10), 0, "never taken");
        let late = table.acquire("k", named("a"), 20);
        assert!(!late.allowed);
        assert_eq!(late.remaining, 2, "nothing taken");
        assert!(
            table.acquire("k", named("b"), 20).allowed,
            "other names are free"
        );
        assert!(
            table.acquire("k", named("a"), 10 + LEASE).allowed,
            "the tombstone lasts a lease"
        );
    }

    #[test]
    fn a_renewal_that_comes_after_its_slots_release_does_not_take_it_back() {
        let mut table = SlotTable::default();
        table.acquire("k", named("a"), 10);
        assert_eq!(table.release("k", "a", LEASE, 11), 1);
        assert_eq!(table.renew("k", LEASE, "a", 12), 0);
        assert_eq!(table.acquire("k", named("b"), 13).remaining, 1, "a is free");
        assert_eq!(table.renew("k", LEASE, "never", 14), 0, "never created");
    }

    #[test]
    fn anonymous_slots_are_given_back_soonest_expiry_first() {
        let mut table = SlotTable::default();
        let anonymous = Ask {
            limit: 3,
            name: None,
            ..named("")
        };
        table.acquire("k", anonymous, 0);
        table.acquire(
            "k",
            Ask {
                take: 2,
                cost: 2,
                ..anonymous
            },
            5,
        );
        let back = table.give_back("k", 3, 2, 6);
        assert_eq!(
            (back.granted, back.remaining, back.reset_us),
            (2, 2, LEASE - 1)
        );
        assert_eq!(table.give_back("k", 3, 5, 6).granted, 1);
        assert!(table.keys.is_empty());
    }
}
