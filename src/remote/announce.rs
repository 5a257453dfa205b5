//! Who calls sluice-service: at first and then every `EVERY`, a worker's next call to the service (a check, a
//! batch of settlements, a pull of the overrides) carries who it is (`ENVOY`, the Envoy's node
//! id; `WORKER`, this VM's own id) and how many settlements it has dropped so far (`DROPPED`).
//! The service lists the Envoys that called lately from these (`GET /admin/v1/envoys`): no call
//! of its own, and no header on the other calls.

use crate::core::duration::NANOS_PER_SEC;

/// How often a worker says who it is.
pub const EVERY: u64 = 10 * NANOS_PER_SEC;
pub const ENVOY: &str = "x-sluice-envoy";
pub const WORKER: &str = "x-sluice-worker";
pub const DROPPED: &str = "x-sluice-dropped";
/// The longest node id sent: the service keeps no more.
pub const MAX_ENVOY_BYTES: usize = 128;

/// One worker's announcements.
#[derive(Debug, Default)]
pub struct Announcer {
    envoy: String,
    worker: String,
    dropped: u64,
    /// When the next one is due (on the root's clock, ns); 0: at the first tick.
    next: u64,
    due: bool,
}

/// The headers of one announcement.
pub type Headers = [(&'static str, String); 3];

impl Announcer {
    /// A worker of the Envoy whose node id is `node_id` (as a header can carry it: visible
    /// ASCII, at most `MAX_ENVOY_BYTES`; empty when Envoy has none), named `worker`.
    pub fn new(node_id: &[u8], worker: u64) -> Announcer {
        let visible = node_id.iter().filter(|b| b.is_ascii_graphic());
        Announcer {
            envoy: visible
                .take(MAX_ENVOY_BYTES)
                .map(|&b| char::from(b))
                .collect(),
            worker: format!("{worker:016x}"),
            due: true,
            ..Announcer::default()
        }
    }

    /// Counts settlements dropped since the last count.
    pub fn dropped(&mut self, dropped: u64) {
        self.dropped = self.dropped.saturating_add(dropped);
    }

    /// The root's once-a-second tick at `now`: an announcement is due every `EVERY`.
    pub fn tick(&mut self, now: u64) {
        if now >= self.next {
            self.due = true;
            self.next = now.saturating_add(EVERY);
        }
    }

    /// The headers for the call about to be made, if an announcement is due (then not again
    /// until the next is).
    pub fn take(&mut self) -> Option<Headers> {
        if !std::mem::take(&mut self.due) {
            return None;
        }
        Some([
            (ENVOY, self.envoy.clone()),
            (WORKER, self.worker.clone()),
            (DROPPED, self.dropped.to_string()),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_call_in_ten_seconds_says_who_calls_and_what_was_dropped() {
        let mut announcer = Announcer::new(b"edge-a\n\x00~ok", 0xab);
        assert_eq!(
            announcer.take().unwrap()[2].1,
            "0",
            "the first call says at once"
        );
        assert_eq!(announcer.take(), None);
        announcer.dropped(2);
        announcer.tick(5 * NANOS_PER_SEC);
        let headers = announcer.take().unwrap();
        assert_eq!(
            headers.map(|(_, value)| value),
            ["edge-a~ok", "00000000000000ab", "2"]
        );
        assert_eq!(announcer.take(), None, "once");
        announcer.dropped(3);
        announcer.tick(14 * NANOS_PER_SEC);
        assert_eq!(announcer.take(), None, "not within 10 s");
        announcer.tick(15 * NANOS_PER_SEC);
        assert_eq!(
            announcer.take().unwrap()[2].1,
            "5",
            "what was dropped, in all"
        );
        let long = Announcer::new(&[b'x'; 300], 1);
        assert_eq!(long.envoy.len(), MAX_ENVOY_BYTES);
    }
}
