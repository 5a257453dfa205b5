//! The ids of the settlements the `--memory` store applied lately (`store::Settlement::id`),
//! so that it applies each at most once, as `redis_store::SETTLE_ONCE_LUA` does in Redis: each
//! is remembered for `SETTLED_TTL_MS`, and at most `MAX_IDS` at once. Past that the oldest is
//! forgotten first, and a copy of it that came again would be applied again: at the 20 ms of a
//! filter's batches that is more than 1,600 charges and refunds a second, beyond what one
//! process without Redis is for.

use std::collections::{HashMap, VecDeque};

use crate::stores::{settled_id_key, Settlement, SETTLED_TTL_MS};

/// Ids remembered at most: about 20 MB of them.
pub const MAX_IDS: usize = 100_000;

pub struct SettledIds {
    capacity: usize,
    /// Each id's key (`settled_id_key`) and when it is forgotten, in µs.
    until: HashMap<String, u64>,
    /// The same, the oldest first: the order they are forgotten in.
    order: VecDeque<(u64, String)>,
}

impl Default for SettledIds {
    fn default() -> SettledIds {
        SettledIds::with_capacity(MAX_IDS)
    }
}

impl SettledIds {
    fn with_capacity(capacity: usize) -> SettledIds {
        SettledIds {
            capacity,
            until: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Whether `settlement` is to be applied at `now_us`: one without an id always is; one with
    /// an id only if it is not remembered, and it is from now on.
    pub fn first(&mut self, settlement: &Settlement, now_us: u64) -> bool {
        let Some(key) = settled_id_key(settlement) else {
            return true;
        };
        while self
            .order
            .front()
            .is_some_and(|&(until, _)| until <= now_us)
        {
            self.forget_oldest();
        }
        if self.until.get(&key).is_some_and(|&until| until > now_us) {
            return false;
        }
        while self.order.len() >= self.capacity.max(1) {
            self.forget_oldest();
        }
        let until = now_us.saturating_add(SETTLED_TTL_MS * 1000);
        self.until.insert(key.clone(), until);
        self.order.push_back((until, key));
        true
    }

    fn forget_oldest(&mut self) {
        let Some((until, key)) = self.order.pop_front() else {
            return;
        };
        // Unless it was remembered again since (the clock stepped back).
        if self.until.get(&key) == Some(&until) {
            self.until.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stores::{Algorithm, Namespace, SettleOp};

    const T0: u64 = 1_800_000_000_000_000;
    const TTL_US: u64 = SETTLED_TTL_MS * 1000;

    fn refund(key: &str, id: Option<&str>) -> Settlement {
        Settlement {
            namespace: Namespace::Http,
            key: key.into(),
            algorithm: Algorithm::TokenBucket {
                interval_us: 1_000,
                burst: 10,
            },
            op: SettleOp::Refund {
                tokens: 1,
                age_us: 0,
            },
            id: id.map(String::from),
        }
    }

    #[test]
    fn an_id_is_applied_once_until_it_is_forgotten() {
        let mut ids = SettledIds::default();
        let once = refund("llm/00ff", Some("00000000000000a1"));
        assert!(ids.first(&once, T0));
        assert!(!ids.first(&once, T0 + 1));
        assert!(!ids.first(&once, T0 + TTL_US - 1));
        assert!(ids.first(&once, T0 + TTL_US), "forgotten");
        let other_key = refund("llm/00ee", Some("00000000000000a1"));
        assert!(ids.first(&other_key, T0 + TTL_US), "an id is a key's");
        let without = refund("llm/00ff", None);
        assert!(ids.first(&without, T0) && ids.first(&without, T0));
    }

    #[test]
    fn past_its_capacity_the_oldest_id_is_forgotten_first() {
        let mut ids = SettledIds::with_capacity(2);
        let [a, b, c] = ["00000000000000a1", "00000000000000a2", "00000000000000a3"]
            .map(|id| refund("llm/00ff", Some(id)));
        for settlement in [&a, &b, &c] {
            assert!(ids.first(settlement, T0));
        }
        assert_eq!(ids.until.len(), 2);
        assert!(!ids.first(&c, T0) && !ids.first(&b, T0));
        assert!(ids.first(&a, T0), "forgotten for c");
    }
}
