//! The keys denied most, in bounded memory: the Space-Saving count (Metwally et al.), pruned in
//! batches. At most `2 × TRACKED` keys are counted; when that fills up, the `TRACKED` counted
//! most are kept and the rest forgotten, and a key counted anew starts at the largest count
//! forgotten so far (`floor`). So a count is never below the key's true count and at most `floor`
//! above it (its `error`); with no more than `2 × TRACKED` distinct keys, every count is exact.

use std::collections::HashMap;

/// Keys kept after a pruning.
pub const TRACKED: usize = 1_000;

/// One counted key: its hash, its count, how much of the count may be another key's, and the
/// key's value (a `V`) when the report shows values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted<V> {
    pub key: u64,
    pub count: u64,
    pub error: u64,
    pub value: Option<V>,
}

#[derive(Debug)]
pub struct TopKeys<V> {
    counted: HashMap<u64, Counted<V>>,
    floor: u64,
}

impl<V> Default for TopKeys<V> {
    fn default() -> Self {
        TopKeys {
            counted: HashMap::new(),
            floor: 0,
        }
    }
}

impl<V: Clone> TopKeys<V> {
    /// Counts one more for `key`; `value` gives the key's value, asked only for a key not counted.
    pub fn add(&mut self, key: u64, value: impl FnOnce() -> Option<V>) {
        if let Some(counted) = self.counted.get_mut(&key) {
            counted.count += 1;
            return;
        }
        if self.counted.len() >= 2 * TRACKED {
            self.prune();
        }
        let counted = Counted {
            key,
            count: self.floor + 1,
            error: self.floor,
            value: value(),
        };
        self.counted.insert(key, counted);
    }

    /// Raises `key`'s count to `count` if that is more: a peak (requests in flight at once)
    /// rather than a sum. A key forgotten by a pruning and seen again starts from what it shows
    /// then, so a kept peak may be below the key's true one (never above); a `TopKeys` is used
    /// either this way or with `add`, not both.
    pub fn raise(&mut self, key: u64, count: u64, value: impl FnOnce() -> Option<V>) {
        if let Some(counted) = self.counted.get_mut(&key) {
            counted.count = counted.count.max(count);
            return;
        }
        if self.counted.len() >= 2 * TRACKED {
            self.prune();
        }
        let counted = Counted {
            key,
            count,
            error: 0,
            value: value(),
        };
        self.counted.insert(key, counted);
    }

    fn prune(&mut self) {
        let mut all: Vec<Counted<V>> = self.counted.drain().map(|(_, c)| c).collect();
        all.sort_unstable_by_key(|c| std::cmp::Reverse(c.count));
        let forgotten = all.split_off(TRACKED.min(all.len()));
        self.floor = forgotten.iter().map(|c| c.count).fold(self.floor, u64::max);
        self.counted = all.into_iter().map(|c| (c.key, c)).collect();
    }

    /// The `n` keys counted most, most first (ties by key, for a stable report).
    pub fn top(&self, n: usize) -> Vec<Counted<V>> {
        let mut all: Vec<&Counted<V>> = self.counted.values().collect();
        all.sort_unstable_by(|a, b| b.count.cmp(&a.count).then(a.key.cmp(&b.key)));
        all.into_iter().take(n).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_exact_while_few_keys_are_counted() {
        let mut top = TopKeys::<String>::default();
        for (key, times) in [(1, 3), (2, 5), (3, 1)] {
            for _ in 0..times {
                top.add(key, || Some(format!("k{key}")));
            }
        }
        let counts: Vec<_> = top
            .top(2)
            .iter()
            .map(|c| (c.key, c.count, c.error))
            .collect();
        assert_eq!(counts, [(2, 5, 0), (1, 3, 0)]);
        assert_eq!(top.top(1)[0].value.as_deref(), Some("k2"));
    }

    #[test]
    fn a_raised_count_is_the_peak_seen() {
        let mut top = TopKeys::<String>::default();
        for (key, peak) in [(1, 2), (2, 1), (1, 5), (1, 3), (2, 4)] {
            top.raise(key, peak, || None);
        }
        let peaks: Vec<_> = top.top(2).iter().map(|c| (c.key, c.count)).collect();
        assert_eq!(peaks, [(1, 5), (2, 4)]);
    }

    #[test]
    fn heavy_keys_stay_on_top_of_a_flood_of_single_denials_within_the_stated_error() {
        let mut top = TopKeys::<String>::default();
        for i in 0..100_000u64 {
            top.add(1_000_000 + i, || None);
            if i % 10 == 0 {
                top.add(7, || None);
            }
            if i % 20 == 0 {
                top.add(8, || None);
            }
        }
        let best = top.top(2);
        assert_eq!((best[0].key, best[1].key), (7, 8));
        for counted in &best {
            let truth = if counted.key == 7 { 10_000 } else { 5_000 };
            assert!(counted.count >= truth && counted.count - counted.error <= truth);
        }
        assert!(top.counted.len() <= 2 * TRACKED);
    }
}
