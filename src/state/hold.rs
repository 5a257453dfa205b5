//! Requests a leaky-bucket policy admitted with a delay, waiting for their turn. Each worker
//! keeps its own queue; the root context's tick releases the due ones, so the timing precision
//! is the tick period.

/// Held requests by release time (Unix nanoseconds) and context id.
#[derive(Debug, Default)]
pub struct HoldQueue {
    held: Vec<(u64, u32)>,
}

impl HoldQueue {
    pub fn hold(&mut self, release_at: u64, context: u32) {
        self.held.push((release_at, context));
    }

    /// Forgets a request whose client went away.
    pub fn drop_context(&mut self, context: u32) {
        self.held.retain(|&(_, c)| c != context);
    }

    /// Takes out the requests due at `now`, earliest first.
    pub fn due(&mut self, now: u64) -> Vec<u32> {
        let mut due: Vec<(u64, u32)> = Vec::new();
        self.held.retain(|&entry| {
            let is_due = entry.0 <= now;
            if is_due {
                due.push(entry);
            }
            !is_due
        });
        due.sort_unstable();
        due.into_iter().map(|(_, context)| context).collect()
    }

    /// Whether the request `context` waits here.
    pub fn holds(&self, context: u32) -> bool {
        self.held.iter().any(|&(_, c)| c == context)
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_what_is_due_in_order_and_forgets_departed_clients() {
        let mut queue = HoldQueue::default();
        queue.hold(30, 3);
        queue.hold(10, 1);
        queue.hold(20, 2);
        queue.hold(15, 4);
        queue.drop_context(4);
        assert_eq!(queue.due(5), Vec::<u32>::new());
        assert_eq!(queue.due(25), [1, 2]);
        assert_eq!(queue.due(100), [3]);
        assert!(queue.is_empty());
    }
}
