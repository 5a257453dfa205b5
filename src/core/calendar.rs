//! Calendar windows: a fixed window whose boundaries are local midnights (or a chosen time of
//! day) in a named time zone: every day, every week from a weekday, every month from a day of
//! the month (a billing day), every year from a date. Zone rules come from the tz database that
//! jiff bundles; a zone is looked up once, when a configuration (or the service's first check)
//! names it, and the window around the clock is kept so that a request compares integers and
//! computes a boundary only when the last one has passed.
//!
//! Rules, documented in docs/configuration.md#calendar-windows:
//! - a day of the month past the month's end (31 in February) starts the period on the month's
//!   last day;
//! - a local time that a summer-time change skips (02:30 on a spring-forward day) starts the
//!   period as many minutes after the gap as it fell into it (03:30): RFC 5545's and Temporal's
//!   "compatible" rule; a local time that happens twice (on the autumn day) starts it at the
//!   first.

use crate::core::duration::NANOS_PER_SEC;
use jiff::civil::{Date, DateTime};
use jiff::tz::TimeZone;
use jiff::Timestamp;
use std::sync::{Mutex, MutexGuard};

/// How long a calendar period is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    /// The unit of a calendar-shaped `per`: `1d`, `1w`, `1mo`, `1y`.
    pub fn parse(per: &str) -> Option<Unit> {
        match per {
            "1d" => Some(Unit::Day),
            "1w" => Some(Unit::Week),
            "1mo" => Some(Unit::Month),
            "1y" => Some(Unit::Year),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Unit::Day => "1d",
            Unit::Week => "1w",
            Unit::Month => "1mo",
            Unit::Year => "1y",
        }
    }

    /// A period's longest length: its days and an hour of summer time (a day more for a
    /// month or a year that has it); what a store keeps a window's state for.
    pub fn longest_nanos(self) -> u64 {
        let days = match self {
            Unit::Day => 1,
            Unit::Week => 7,
            Unit::Month => 31,
            Unit::Year => 366,
        };
        (days * 86_400 + 3_600) * NANOS_PER_SEC
    }

    /// A period's nominal length, for what needs one number (the wire's `per_ms`, the
    /// `RateLimit-Policy` header's `w`): a day, 7 days, 30 days, 365 days.
    pub fn nominal_nanos(self) -> u64 {
        let days = match self {
            Unit::Day => 1,
            Unit::Week => 7,
            Unit::Month => 30,
            Unit::Year => 365,
        };
        days * 86_400 * NANOS_PER_SEC
    }
}

/// Where a period starts. Which fields apply depends on the unit: `weekday` for weeks (0 =
/// Monday .. 6 = Sunday), `day` (1..=31) for months and years, `month` (1..=12) for years,
/// `second` of the local day (0..86_400) for every unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Starts {
    pub month: u8,
    pub day: u8,
    pub weekday: u8,
    pub second: u32,
}

impl Starts {
    /// The first day of the period at local midnight; weeks from Monday, years from January.
    pub fn midnight() -> Starts {
        Starts {
            month: 1,
            day: 1,
            weekday: 0,
            second: 0,
        }
    }
}

/// A calendar period rule with its zone: a handle, cheap to copy, onto the zones registered in
/// this process. Two handles are equal when their zone name, unit and start are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Calendar {
    id: u32,
    pub unit: Unit,
    /// Nanoseconds per unit of the times it is asked about: 1, or 1000 for a caller counting
    /// in microseconds (sluice-service's memory store).
    tick: u32,
}

/// One period: its start and its end, in Unix nanoseconds (or the calendar's tick).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period {
    pub start: u64,
    pub end: u64,
}

impl Period {
    fn in_ticks(self, tick: u32) -> Period {
        let tick = u64::from(tick.max(1));
        Period {
            start: self.start / tick,
            end: self.end / tick,
        }
    }
}

/// The most distinct calendars a process keeps: a configuration names a few; the service
/// registers what its checks name, and refuses a check past this many.
pub const MAX_CALENDARS: usize = 1024;

struct Entry {
    zone_name: String,
    unit: Unit,
    starts: Starts,
    zone: TimeZone,
    /// The last period computed: requests within it compare integers and nothing else.
    latest: Option<Period>,
    /// The last `around` computed, in nanoseconds.
    around: Option<[u64; 4]>,
    /// How many times `period` read the zone's rules: once per period passed, not per request.
    computed: u64,
}

static CALENDARS: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

fn calendars() -> MutexGuard<'static, Vec<Entry>> {
    // One thread in the wasm VM; a panic under the lock cannot leave a period half written.
    CALENDARS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Why a calendar cannot be made, by the field at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CalendarError {
    Timezone(String),
    Starts(&'static str, String),
    Full,
}

impl Calendar {
    /// The calendar of `unit` periods in `zone_name` (an IANA name such as `Europe/Berlin`)
    /// starting at `starts`: the zone is looked up now, once per process for each distinct
    /// calendar.
    pub fn new(zone_name: &str, unit: Unit, starts: Starts) -> Result<Calendar, CalendarError> {
        check_starts(unit, &starts)?;
        let mut all = calendars();
        let same = |e: &Entry| e.zone_name == zone_name && e.unit == unit && e.starts == starts;
        if let Some(id) = all.iter().position(same) {
            return Ok(Calendar {
                id: id as u32,
                unit,
                tick: 1,
            });
        }
        if all.len() >= MAX_CALENDARS {
            return Err(CalendarError::Full);
        }
        let zone = TimeZone::get(zone_name).map_err(|_| {
            CalendarError::Timezone(format!(
                "{zone_name:?} is not a time zone of the tz database (such as \"Europe/Berlin\" or \"UTC\")"
            ))
        })?;
        all.push(Entry {
            zone_name: zone_name.to_string(),
            unit,
            starts,
            zone,
            latest: None,
            around: None,
            computed: 0,
        });
        Ok(Calendar {
            id: (all.len() - 1) as u32,
            unit,
            tick: 1,
        })
    }

    /// The same calendar asked about times in microseconds.
    pub fn in_micros(self) -> Calendar {
        Calendar { tick: 1000, ..self }
    }

    /// The window index of `period` (one `period` answered): its start in whole seconds.
    pub fn index(&self, period: &Period) -> u64 {
        period.start / (NANOS_PER_SEC / u64::from(self.tick.max(1)))
    }

    /// A name for the calendar that is the same in every process (the registry's ids are not):
    /// FNV-1a of its zone, unit and start. sluice-service names a window's state with it.
    pub fn fingerprint(&self) -> u64 {
        let Some((zone, starts)) = self.describe() else {
            return 0;
        };
        let text = format!(
            "{zone}|{}|{}|{}|{}|{}",
            self.unit.name(),
            starts.month,
            starts.day,
            starts.weekday,
            starts.second
        );
        text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    /// The period that holds `now` (Unix nanoseconds). Integer compares while `now` stays in
    /// the last period computed; a boundary computation when it has passed.
    pub fn period(&self, now: u64) -> Period {
        self.period_ns(now.saturating_mul(u64::from(self.tick.max(1))))
            .in_ticks(self.tick)
    }

    fn period_ns(&self, now: u64) -> Period {
        let mut all = calendars();
        let Some(entry) = all.get_mut(self.id as usize) else {
            return fallback(self.unit, now);
        };
        if let Some(p) = entry.latest.filter(|p| p.start <= now && now < p.end) {
            return p;
        }
        entry.computed = entry.computed.saturating_add(1);
        let period = compute(&entry.zone, self.unit, &entry.starts, now)
            .unwrap_or_else(|| fallback(self.unit, now));
        // Keep the latest: a look at an older instant (a refund's `taken_at`) does not evict it.
        if entry.latest.is_none_or(|p| p.start < period.start) {
            entry.latest = Some(period);
        }
        period
    }

    /// The period that holds `now` (ns), computed, and kept nowhere.
    fn compute_ns(&self, now: u64) -> Period {
        let zone = {
            let all = calendars();
            all.get(self.id as usize)
                .map(|e| (e.zone.clone(), e.starts))
        };
        zone.and_then(|(zone, starts)| compute(&zone, self.unit, &starts, now))
            .unwrap_or_else(|| fallback(self.unit, now))
    }

    /// The boundaries of the period before the one that holds `now`, of that one and of the
    /// next: [previous start, start, end, next end]. For a store whose own clock picks among
    /// them (sluice-service's Redis scripts). Integer compares while `now` stays in the period.
    pub fn around(&self, now: u64) -> [u64; 4] {
        let tick = u64::from(self.tick.max(1));
        let now = now.saturating_mul(tick);
        let cached = {
            let all = calendars();
            all.get(self.id as usize).and_then(|e| e.around)
        };
        let bounds = match cached {
            Some(b @ [_, start, end, _]) if start <= now && now < end => b,
            _ => {
                let current = self.compute_ns(now);
                let before = self.compute_ns(current.start.saturating_sub(1));
                let next = self.compute_ns(current.end);
                let b = [before.start, current.start, current.end, next.end];
                if let Some(entry) = calendars().get_mut(self.id as usize) {
                    entry.around = Some(b);
                }
                b
            }
        };
        bounds.map(|b| b / tick)
    }

    /// The end of the period whose index (`Calendar::index`) is `index`.
    pub fn end_of(&self, index: u64) -> u64 {
        let ticks_per_sec = NANOS_PER_SEC / u64::from(self.tick.max(1));
        self.period(index.saturating_mul(ticks_per_sec)).end
    }

    /// How many times `period` has read the zone's rules for this calendar.
    pub fn computations(&self) -> u64 {
        let all = calendars();
        all.get(self.id as usize).map_or(0, |e| e.computed)
    }

    /// The zone's name and the start, as the configuration gave them.
    pub fn describe(&self) -> Option<(String, Starts)> {
        let all = calendars();
        let entry = all.get(self.id as usize)?;
        Some((entry.zone_name.clone(), entry.starts))
    }
}

/// A period of the nominal length aligned to the epoch: only for a clock outside what the tz
/// database covers (never between 1970 and 2554).
fn fallback(unit: Unit, now: u64) -> Period {
    let length = unit.nominal_nanos();
    let start = now / length * length;
    Period {
        start,
        end: start.saturating_add(length),
    }
}

fn check_starts(unit: Unit, starts: &Starts) -> Result<(), CalendarError> {
    let bad = |field, why: &str| Err(CalendarError::Starts(field, why.to_string()));
    if starts.second >= 86_400 {
        return bad("time", "must be a time of day before 24:00:00");
    }
    if starts.weekday > 6 {
        return bad("weekday", "must be a day of the week");
    }
    match unit {
        Unit::Month | Unit::Year if !(1..=31).contains(&starts.day) => {
            bad("day", "must be a day of the month, 1 to 31")
        }
        Unit::Year if !(1..=12).contains(&starts.month) => bad("month", "must be 1 to 12"),
        _ => Ok(()),
    }
}

/// The period around `now` by the zone's rules: the boundary of the local date's own period,
/// then a step back or forward while the boundaries do not hold `now`.
fn compute(zone: &TimeZone, unit: Unit, starts: &Starts, now: u64) -> Option<Period> {
    let secs = i64::try_from(now / NANOS_PER_SEC).ok()?;
    let local = zone.to_datetime(Timestamp::from_second(secs).ok()?).date();
    let mut k = match unit {
        Unit::Day => days_since_epoch(local)?,
        Unit::Week => (days_since_epoch(local)? - week_offset(starts)).div_euclid(7),
        Unit::Month => i64::from(local.year()) * 12 + i64::from(local.month()) - 1,
        Unit::Year => i64::from(local.year()),
    };
    let at = |k: i64| boundary(zone, unit, starts, k);
    // A boundary is at most a day and the zone's offset change away from the local date's: a
    // step or two settles it.
    for _ in 0..4 {
        if at(k)? > now {
            k -= 1;
        } else if at(k + 1)? <= now {
            k += 1;
        } else {
            break;
        }
    }
    let (start, end) = (at(k)?, at(k + 1)?);
    (start <= now && now < end).then_some(Period { start, end })
}

/// Days from 1970-01-01 (a Thursday) to the day of the period's weekday in week 0.
fn week_offset(starts: &Starts) -> i64 {
    (i64::from(starts.weekday) - 3).rem_euclid(7)
}

/// The start of period `k` (Unix nanoseconds): the local date-time it starts at, resolved in
/// the zone by the rules in the module comment.
fn boundary(zone: &TimeZone, unit: Unit, starts: &Starts, k: i64) -> Option<u64> {
    let date = match unit {
        Unit::Day => date_of_days(k)?,
        Unit::Week => date_of_days(k * 7 + week_offset(starts))?,
        Unit::Month => {
            let (year, month) = (k.div_euclid(12), k.rem_euclid(12) + 1);
            day_of(i16::try_from(year).ok()?, month as i8, starts.day)?
        }
        Unit::Year => day_of(i16::try_from(k).ok()?, starts.month as i8, starts.day)?,
    };
    let second = starts.second;
    let time = DateTime::from_parts(
        date,
        jiff::civil::Time::new(
            (second / 3600) as i8,
            (second / 60 % 60) as i8,
            (second % 60) as i8,
            0,
        )
        .ok()?,
    );
    let instant = zone.to_ambiguous_timestamp(time).compatible().ok()?;
    u64::try_from(instant.as_second())
        .ok()?
        .checked_mul(NANOS_PER_SEC)
}

/// Day `day` of the month, or the month's last day when it has fewer.
fn day_of(year: i16, month: i8, day: u8) -> Option<Date> {
    let first = Date::new(year, month, 1).ok()?;
    let day = (day as i8).min(first.days_in_month());
    Date::new(year, month, day).ok()
}

/// Days from 1970-01-01, by integer arithmetic (jiff's span arithmetic would add to the wasm).
fn days_since_epoch(date: Date) -> Option<i64> {
    let year = u64::try_from(date.year()).ok()?;
    let (month, day) = (
        u64::try_from(date.month()).ok()?,
        u64::try_from(date.day()).ok()?,
    );
    Some(crate::core::time::days_from_civil(year, month, day))
}

fn date_of_days(days: i64) -> Option<Date> {
    let (year, month, day) = crate::core::time::civil_from_days(days);
    Date::new(i16::try_from(year).ok()?, month as i8, day as i8).ok()
}

#[cfg(test)]
mod tests;
