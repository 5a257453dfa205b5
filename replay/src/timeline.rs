//! Requests and denials over time, for the chart, in bounded memory: at most `BUCKETS` buckets
//! from the first request on, each one second wide at first; when the log runs past the last,
//! neighbours merge and buckets get twice as wide.

use sluice::core::duration::NANOS_PER_SEC;

pub const BUCKETS: usize = 512;

/// What one bucket counts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub requests: u64,
    pub denied: u64,
    pub shadow_denied: u64,
}

impl Counts {
    fn merge(self, other: Counts) -> Counts {
        Counts {
            requests: self.requests + other.requests,
            denied: self.denied + other.denied,
            shadow_denied: self.shadow_denied + other.shadow_denied,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeline {
    /// When the first bucket starts (Unix nanoseconds, a whole second).
    pub start: u64,
    /// Nanoseconds per bucket.
    pub width: u64,
    pub buckets: Vec<Counts>,
}

impl Timeline {
    /// A timeline from the second of `start` on.
    pub fn new(start: u64) -> Timeline {
        Timeline {
            start: start - start % NANOS_PER_SEC,
            width: NANOS_PER_SEC,
            buckets: Vec::new(),
        }
    }

    /// Adds `counts` to the bucket of time `at` (times before the start count in the first).
    pub fn add(&mut self, at: u64, counts: Counts) {
        let mut index = (at.saturating_sub(self.start) / self.width) as usize;
        while index >= BUCKETS {
            self.widen();
            index /= 2;
        }
        if self.buckets.len() <= index {
            self.buckets.resize(index + 1, Counts::default());
        }
        if let Some(bucket) = self.buckets.get_mut(index) {
            *bucket = bucket.merge(counts);
        }
    }

    fn widen(&mut self) {
        self.width *= 2;
        self.buckets = self
            .buckets
            .chunks(2)
            .map(|pair| pair.iter().fold(Counts::default(), |a, &b| a.merge(b)))
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = NANOS_PER_SEC;
    const ONE: Counts = Counts {
        requests: 1,
        denied: 1,
        shadow_denied: 0,
    };

    #[test]
    fn buckets_are_seconds_until_the_log_outgrows_them_then_twice_as_wide() {
        let mut timeline = Timeline::new(100 * SEC + 7);
        timeline.add(100 * SEC + 9, ONE);
        timeline.add(102 * SEC, ONE);
        assert_eq!(timeline.buckets.len(), 3);
        assert_eq!(timeline.buckets[2].requests, 1);
        timeline.add((100 + BUCKETS as u64) * SEC, ONE);
        assert_eq!(timeline.width, 2 * SEC);
        assert_eq!(timeline.buckets.len(), BUCKETS / 2 + 1);
        assert_eq!(
            timeline.buckets[1].denied, 1,
            "second 102 is in the second bucket"
        );
        let total: u64 = timeline.buckets.iter().map(|b| b.requests).sum();
        assert_eq!(total, 3);
    }
}
