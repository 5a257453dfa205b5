//! A policy's `calendar`: its fixed windows follow calendar periods in a time zone. Read here
//! into a `calendar::Calendar` once a tier's `per` says which period; the zone is looked up at
//! configuration time, never per request.

use super::input::RawCalendar;
use super::{error, ConfigError};
use crate::core::calendar::{Calendar, CalendarError, Starts, Unit};

/// The calendar of `raw` (the policy at `at`) for a `per` of `unit`; every error names its
/// field. A start field that does not apply to `unit` is refused for the policy's own `per`
/// (`strict`), and left out for a tier's, whose period may differ (a daily trial tier of a
/// monthly quota starting on the 15th).
pub(super) fn calendar(
    at: &str,
    raw: &RawCalendar,
    unit: Unit,
    strict: bool,
) -> Result<Calendar, ConfigError> {
    let field = |name: &str| format!("{at}.calendar.starts.{name}");
    let starts = raw.starts.as_ref();
    // Whether a given start field is read for `unit`: refused if it never could be.
    let applies = |name: &str, applies: bool, units: &str| match (applies, strict) {
        (true, _) => Ok(true),
        (false, true) => Err(error(
            field(name),
            format!("applies to a per of {units} only, not {}", unit.name()),
        )),
        (false, false) => Ok(false),
    };
    let mut parsed = Starts::midnight();
    if let Some(weekday) = starts.and_then(|s| s.weekday.as_deref()) {
        if applies("weekday", unit == Unit::Week, "1w")? {
            parsed.weekday = weekday_of(weekday).ok_or_else(|| {
                error(
                    field("weekday"),
                    format!("{weekday:?} is not a day of the week (monday to sunday)"),
                )
            })?;
        }
    }
    if let Some(day) = starts.and_then(|s| s.day) {
        if applies("day", matches!(unit, Unit::Month | Unit::Year), "1mo or 1y")? {
            parsed.day = day;
        }
    }
    if let Some(month) = starts.and_then(|s| s.month) {
        if applies("month", unit == Unit::Year, "1y")? {
            parsed.month = month;
        }
    }
    if let Some(time) = starts.and_then(|s| s.time.as_deref()) {
        parsed.second = time_of_day(time).ok_or_else(|| {
            error(
                field("time"),
                format!("{time:?} is not a local time of day such as \"00:00\" or \"06:30:15\""),
            )
        })?;
    }
    Calendar::new(&raw.timezone, unit, parsed).map_err(|e| match e {
        CalendarError::Timezone(reason) => error(format!("{at}.calendar.timezone"), reason),
        CalendarError::Starts(name, reason) => error(field(name), reason),
        CalendarError::Full => error(format!("{at}.calendar"), "too many distinct calendars"),
    })
}

/// The unit of a calendar-shaped `per` (at `field`), or why it is not one.
pub(super) fn unit(field: &str, per: &str) -> Result<Unit, ConfigError> {
    Unit::parse(per).ok_or_else(|| {
        error(
            field,
            format!("{per:?}: a calendar window is one of \"1d\", \"1w\", \"1mo\" or \"1y\""),
        )
    })
}

/// Monday = 0 .. Sunday = 6.
fn weekday_of(name: &str) -> Option<u8> {
    let days = [
        "monday",
        "tuesday",
        "wednesday",
        "thursday",
        "friday",
        "saturday",
        "sunday",
    ];
    days.iter().position(|d| *d == name).map(|i| i as u8)
}

/// Seconds into the local day of `HH:MM` or `HH:MM:SS`.
fn time_of_day(text: &str) -> Option<u32> {
    let mut parts = text.split(':');
    let mut number = |max: u32| -> Option<u32> {
        let part = parts.next()?;
        if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        part.parse().ok().filter(|n| *n <= max)
    };
    let (hour, minute) = (number(23)?, number(59)?);
    let second = if text.len() > 5 { number(59)? } else { 0 };
    if parts.next().is_some() {
        return None;
    }
    Some(hour * 3600 + minute * 60 + second)
}
