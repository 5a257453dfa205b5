//! Puts records back in the order the filter decided them. Envoy writes an access-log line when
//! its request ends, so a long request's line comes after those of shorter ones that started
//! later; the filter decided it when it started. Records are held for `window` of log time and
//! released in `start_time` order (ties in log order). A record that arrives more than `window`
//! after later ones were released is late: it is released at once, and the worker's clock, which
//! never goes back, decides it at the time already reached.
//!
//! Memory: at most `MAX_HELD` records are held, whatever the log's length; past that the
//! earliest is released before its window ends.

use crate::log::Record;
use std::collections::VecDeque;

/// Records held at most: a busy Envoy's seconds of traffic, a few tens of MB.
pub const MAX_HELD: usize = 100_000;

#[derive(Debug)]
pub struct Reorder {
    window: u64,
    /// Boxed: a record moves in and out several times, its box costs one pointer each time.
    held: VecDeque<Box<Record>>,
    /// The latest start time seen.
    newest: u64,
    /// The start time of the last record released.
    released: u64,
    /// Records released before their turn: their start time was before one released already.
    pub late: u64,
    /// Spent records, for their buffers to be reused (boxed as they travel).
    #[allow(clippy::vec_box)]
    pool: Vec<Box<Record>>,
}

impl Reorder {
    pub fn new(window: u64) -> Reorder {
        Reorder {
            window,
            held: VecDeque::new(),
            newest: 0,
            released: 0,
            late: 0,
            pool: Vec::new(),
        }
    }

    /// A record to parse the next line into.
    pub fn blank(&mut self) -> Box<Record> {
        self.pool.pop().unwrap_or_default()
    }

    /// Gives back a record that is done with, or was never filled.
    pub fn recycle(&mut self, record: Box<Record>) {
        self.pool.push(record);
    }

    /// Holds a record until its turn.
    pub fn push(&mut self, record: Box<Record>) {
        self.newest = self.newest.max(record.time);
        // In a log in order this is the end, found in one comparison.
        let at = match self.held.back() {
            Some(last) if last.time > record.time => {
                self.held.partition_point(|r| r.time <= record.time)
            }
            _ => self.held.len(),
        };
        self.held.insert(at, record);
    }

    /// The next record whose window has passed (or that no longer fits).
    pub fn ready(&mut self) -> Option<Box<Record>> {
        let front = self.held.front()?;
        let due = front.time.saturating_add(self.window) <= self.newest;
        if due || self.held.len() > MAX_HELD {
            self.release()
        } else {
            None
        }
    }

    /// The next record, its window passed or not: at the end of the log.
    pub fn release(&mut self) -> Option<Box<Record>> {
        let record = self.held.pop_front()?;
        if record.time < self.released {
            self.late += 1;
        }
        self.released = self.released.max(record.time);
        Some(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(line: u64, time: u64) -> Box<Record> {
        let mut record = Box::<Record>::default();
        record.line = line;
        record.time = time;
        record
    }

    fn drain(order: &mut Reorder, ready_only: bool) -> Vec<u64> {
        let next = |o: &mut Reorder| if ready_only { o.ready() } else { o.release() };
        std::iter::from_fn(|| next(order)).map(|r| r.line).collect()
    }

    #[test]
    fn records_within_the_window_come_out_in_start_order_ties_in_log_order() {
        let mut order = Reorder::new(10);
        for (line, time) in [(1, 100), (2, 105), (3, 101), (4, 105), (5, 103)] {
            order.push(record(line, time));
        }
        assert_eq!(
            drain(&mut order, true),
            Vec::<u64>::new(),
            "none has waited 10"
        );
        order.push(record(6, 112));
        assert_eq!(drain(&mut order, true), [1, 3]);
        assert_eq!(drain(&mut order, false), [5, 2, 4, 6]);
        assert_eq!(order.late, 0);
    }

    #[test]
    fn a_record_later_than_the_window_is_released_at_once_and_counted_late() {
        let mut order = Reorder::new(10);
        order.push(record(1, 100));
        order.push(record(2, 150));
        assert_eq!(drain(&mut order, true), [1]);
        order.push(record(3, 120));
        assert_eq!(drain(&mut order, true), [3]);
        assert_eq!(order.late, 0, "120 is after the 100 released");
        order.push(record(4, 90));
        assert_eq!(drain(&mut order, true), [4]);
        assert_eq!(order.late, 1);
    }

    #[test]
    fn no_more_than_max_held_records_wait() {
        let mut order = Reorder::new(u64::MAX);
        for line in 0..=MAX_HELD as u64 {
            order.push(record(line, 1));
        }
        assert_eq!(drain(&mut order, true), [0]);
    }
}
