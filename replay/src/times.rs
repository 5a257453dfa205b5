//! Start times, read the way a log writes them: thousands of lines a second share their date,
//! time of day and offset, and differ only in the fraction of a second. The last second read is
//! remembered, so a line of the same second costs its fraction alone, not a calendar's sums.

use sluice::core::time::{fraction, parse_rfc3339};
use smallvec::SmallVec;

/// Where the fraction of a second starts in an RFC 3339 date-time (`2026-11-30T17:44:57`).
const SECONDS_END: usize = 19;

/// The last second read: its text around the fraction, and its Unix nanoseconds.
#[derive(Debug, Default)]
pub struct StartTimes {
    /// The date-time before the fraction, then what follows it (`Z`, or an offset).
    second: SmallVec<[u8; 32]>,
    nanos: u64,
}

impl StartTimes {
    /// Unix nanoseconds of an RFC 3339 date-time, or why it is not one: `parse_rfc3339`'s answer,
    /// for the same second from what was read before.
    pub fn parse(&mut self, text: &[u8]) -> Result<u64, String> {
        let (Some(head), Some((nanos, end))) =
            (text.get(..SECONDS_END), fraction(text, SECONDS_END))
        else {
            return parse_text(text);
        };
        let tail = text.get(end..).unwrap_or_default();
        let same = self.second.get(..SECONDS_END) == Some(head)
            && self.second.get(SECONDS_END..) == Some(tail);
        if let Some(time) = same.then(|| self.nanos.checked_add(nanos)).flatten() {
            return Ok(time);
        }
        let time = parse_text(text)?;
        self.second.clear();
        self.second.extend_from_slice(head);
        self.second.extend_from_slice(tail);
        self.nanos = time - nanos;
        Ok(time)
    }
}

fn parse_text(text: &[u8]) -> Result<u64, String> {
    parse_rfc3339(std::str::from_utf8(text).map_err(|e| e.to_string())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_read_before_gives_the_same_answer_as_reading_it_whole() {
        let mut times = StartTimes::default();
        for text in [
            "2026-11-30T17:44:57.603878Z",
            "2026-11-30T17:44:57.000001Z",
            "2026-11-30T17:44:57Z",
            "2026-11-30T17:44:57.5+02:00",
            "2026-11-30T17:44:57.25+02:00",
            "2026-11-30T17:44:57.1234567891Z",
            "2026-11-30T17:44:58.1Z",
            "2026-11-30T17:44:58.Z",
            "2026-11-30T17:44:58.1",
            "2026-11-30T17:44:58.1Zx",
            "2554-07-21T23:34:33.709551615Z",
            "2554-07-21T23:34:33.709551616Z",
            "2026-11-30T17:44:5",
            "2026-11-30T17:44:58.1\u{e9}",
        ] {
            let whole = parse_rfc3339(text);
            assert_eq!(times.parse(text.as_bytes()), whole, "{text}");
            assert_eq!(times.parse(text.as_bytes()), whole, "{text}, again");
        }
        assert!(times.parse(b"2026-11-30T17:44:58.1\xff").is_err());
    }
}
