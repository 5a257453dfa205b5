//! Time: RFC 3339 timestamps, as bypass entries give their expiry (`2026-12-01T00:00:00Z`,
//! `2026-12-01T09:30:00.5+02:00`) and access logs their start times, and a worker's clock.

use crate::core::duration::NANOS_PER_SEC;
use std::cell::Cell;

/// One worker's time: the wall clock, except that it never goes back. A clock stepping back
/// would make buckets look emptier (never fuller); this one stays where it was instead.
#[derive(Debug, Default)]
pub struct WorkerClock {
    latest: Cell<u64>,
}

impl WorkerClock {
    /// The worker's time when the wall clock reads `wall` (Unix nanoseconds).
    pub fn now(&self, wall: u64) -> u64 {
        let now = self.latest.get().max(wall);
        self.latest.set(now);
        now
    }
}

/// Unix nanoseconds of an RFC 3339 date-time, or why it is not one.
pub fn parse_rfc3339(text: &str) -> Result<u64, String> {
    let bad = || format!("{text:?} is not an RFC 3339 date-time such as 2026-12-01T00:00:00Z");
    let bytes = text.as_bytes();
    // Digit by digit, never more than four: no overflow, and fast enough for a replay's
    // million access-log lines a second.
    let number = |range: std::ops::Range<usize>| -> Result<u64, String> {
        let digits = bytes.get(range).filter(|d| !d.is_empty()).ok_or_else(bad)?;
        digits.iter().try_fold(0, |n, &b| match b {
            b'0'..=b'9' => Ok(n * 10 + u64::from(b - b'0')),
            _ => Err(bad()),
        })
    };
    let separators = [(4, b'-'), (7, b'-'), (13, b':'), (16, b':')];
    if bytes.len() < 20
        || separators.iter().any(|&(i, c)| bytes.get(i) != Some(&c))
        || !matches!(bytes.get(10), Some(b'T' | b't'))
    {
        return Err(bad());
    }
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    let (nanos, rest) = fraction(bytes, 19).ok_or_else(bad)?;
    let offset_secs: i64 = match text.get(rest..) {
        Some("Z" | "z") => 0,
        Some(zone) if zone.len() == 6 && zone.as_bytes().get(3) == Some(&b':') => {
            let sign = match zone.as_bytes().first() {
                Some(b'+') => 1,
                Some(b'-') => -1,
                _ => return Err(bad()),
            };
            let (h, m) = (number(rest + 1..rest + 3)?, number(rest + 4..rest + 6)?);
            sign * (h * 3600 + m * 60) as i64
        }
        _ => return Err(bad()),
    };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days_in_month = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    let month_days = days_in_month
        .get(month.wrapping_sub(1) as usize)
        .ok_or_else(bad)?;
    if year < 1970 || day == 0 || day > *month_days || hour > 23 || minute > 59 || second > 60 {
        return Err(bad());
    }
    let local =
        days_from_civil(year, month, day) * 86_400 + (hour * 3600 + minute * 60 + second) as i64;
    let utc = u64::try_from(local - offset_secs).map_err(|_| bad())?;
    // Unix nanoseconds in a u64 end in 2554: a later instant is refused, never wrapped.
    utc.checked_mul(NANOS_PER_SEC)
        .and_then(|n| n.checked_add(nanos))
        .ok_or_else(|| format!("{text:?} is after 2554-07-21T23:34:33Z, the latest supported"))
}

/// The fraction of a second from `at` (`.` then digits, or nothing): its nanoseconds (the first
/// nine digits, padded with zeros; finer ones are dropped) and where it ends. No allocation:
/// `sluice-replay` parses a million of these a second, most without the rest of their date-time.
pub fn fraction(bytes: &[u8], at: usize) -> Option<(u64, usize)> {
    if bytes.get(at) != Some(&b'.') {
        return Some((0, at));
    }
    let digits = bytes.get(at + 1..)?;
    let count = digits.iter().take_while(|b| b.is_ascii_digit()).count();
    if count == 0 {
        return None;
    }
    let nanos = (0..9).fold(0, |n, i| {
        let digit = digits.get(i).filter(|_| i < count);
        n * 10 + digit.map_or(0, |d| u64::from(d - b'0'))
    });
    Some((nanos, at + 1 + count))
}

/// An instant (Unix nanoseconds) in RFC 3339, UTC: `2026-12-01T00:00:00Z`, with microseconds
/// when it has a fraction of a second (`2026-12-01T00:00:00.250000Z`), as access logs write it.
pub fn format_rfc3339(nanos: u64) -> String {
    let (secs, fraction) = (nanos / NANOS_PER_SEC, nanos % NANOS_PER_SEC);
    let (days, of_day) = ((secs / 86_400) as i64, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    let time = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    );
    match fraction / 1_000 {
        0 => format!("{time}Z"),
        micros => format!("{time}.{micros:06}Z"),
    }
}

/// The date of a day count since 1970-01-01: the inverse of `days_from_civil`.
pub(crate) fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (year_of_era + era * 400 + i64::from(month <= 2), month, day)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
pub(crate) fn days_from_civil(year: u64, month: u64, day: u64) -> i64 {
    let y = year as i64 - i64::from(month <= 2);
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let m = month as i64;
    let day_of_year = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day as i64 - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_utc_offsets_and_fractions() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(
            parse_rfc3339("2026-12-01T00:00:00Z"),
            Ok(1_796_083_200 * NANOS_PER_SEC)
        );
        assert_eq!(
            parse_rfc3339("2026-12-01T02:00:00.25+02:00"),
            Ok(1_796_083_200 * NANOS_PER_SEC + 250_000_000)
        );
        assert_eq!(
            parse_rfc3339("2024-02-29T12:00:00-01:30"),
            Ok(1_709_213_400 * NANOS_PER_SEC)
        );
    }

    #[test]
    fn rejects_what_is_not_a_date_time() {
        for bad in [
            "",
            "2026-12-01",
            "2026-12-01 00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2025-02-29T00:00:00Z",
            "2026-12-01T24:00:00Z",
            "2026-12-01T00:00:00",
            "2026-12-01T00:00:00+0200",
            "tomorrow",
            "2554-07-21T23:34:34Z",
            "2554-07-21T23:34:33.9Z",
            "9999-12-31T23:59:59Z",
        ] {
            assert!(parse_rfc3339(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_fraction_gives_nanoseconds_and_finer_digits_are_dropped() {
        let t = |fraction: &str| parse_rfc3339(&format!("1970-01-01T00:00:01.{fraction}Z"));
        assert_eq!(t("5"), Ok(1_500_000_000));
        assert_eq!(t("123456"), Ok(1_123_456_000));
        assert_eq!(t("1234567891"), Ok(1_123_456_789));
        assert!(parse_rfc3339("1970-01-01T00:00:01.Z").is_err());
    }

    #[test]
    fn a_workers_clock_never_goes_back() {
        let clock = WorkerClock::default();
        assert_eq!(clock.now(5), 5);
        assert_eq!(clock.now(3), 5);
        assert_eq!(clock.now(9), 9);
    }

    #[test]
    fn the_latest_instant_in_u64_nanoseconds_is_accepted() {
        assert_eq!(
            parse_rfc3339("2554-07-21T23:34:33.709551615Z"),
            Ok(u64::MAX)
        );
    }

    #[test]
    fn formats_as_access_logs_write_it() {
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(
            format_rfc3339(1_709_213_400 * NANOS_PER_SEC + 250_000_999),
            "2024-02-29T13:30:00.250000Z"
        );
    }

    proptest! {
        #[test]
        fn formatting_then_parsing_gives_the_microsecond(nanos in 0..u64::MAX) {
            let micros = nanos - nanos % 1_000;
            prop_assert_eq!(parse_rfc3339(&format_rfc3339(nanos)), Ok(micros));
        }

        #[test]
        fn never_panics(text in ".{0,40}") {
            let _ = parse_rfc3339(&text);
        }
    }
}
