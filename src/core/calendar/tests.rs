use super::*;
use proptest::prelude::*;

const SEC: u64 = NANOS_PER_SEC;

/// Unix nanoseconds of an RFC 3339 instant.
fn at(text: &str) -> u64 {
    crate::core::time::parse_rfc3339(text).unwrap()
}

fn period(calendar: Calendar, now: &str) -> (String, String) {
    let p = calendar.period(at(now));
    let show = |n: u64| crate::core::time::format_rfc3339(n);
    (show(p.start), show(p.end))
}

fn berlin(unit: Unit, starts: Starts) -> Calendar {
    Calendar::new("Europe/Berlin", unit, starts).unwrap()
}

fn pair(start: &str, end: &str) -> (String, String) {
    (start.to_string(), end.to_string())
}

#[test]
fn a_month_in_berlin_starts_at_local_midnight_on_the_first_across_summer_time() {
    let month = berlin(Unit::Month, Starts::midnight());
    // March 2026 starts in winter time (+01:00) and ends in summer time (+02:00): 31 days
    // less an hour.
    assert_eq!(
        period(month, "2026-03-15T12:00:00Z"),
        pair("2026-02-28T23:00:00Z", "2026-03-31T22:00:00Z")
    );
    // October 2026 the other way: 31 days and an hour.
    assert_eq!(
        period(month, "2026-10-31T22:59:59Z"),
        pair("2026-09-30T22:00:00Z", "2026-10-31T23:00:00Z")
    );
    assert_eq!(
        period(month, "2026-10-31T23:00:00Z"),
        pair("2026-10-31T23:00:00Z", "2026-11-30T23:00:00Z")
    );
    // The last second of March in Berlin is still March; the next is April.
    assert_eq!(
        period(month, "2026-03-31T21:59:59Z").1,
        "2026-03-31T22:00:00Z"
    );
    assert_eq!(
        period(month, "2026-03-31T22:00:00Z").0,
        "2026-03-31T22:00:00Z"
    );
}

#[test]
fn a_week_runs_from_monday_midnight_and_is_an_hour_short_when_summer_time_starts() {
    let week = berlin(Unit::Week, Starts::midnight());
    // Sunday 2026-03-29 is the spring-forward day: its week ends Monday 00:00 +02:00.
    assert_eq!(
        period(week, "2026-03-29T12:00:00Z"),
        pair("2026-03-22T23:00:00Z", "2026-03-29T22:00:00Z")
    );
    let friday = Starts {
        weekday: 4,
        second: 17 * 3600,
        ..Starts::midnight()
    };
    assert_eq!(
        period(berlin(Unit::Week, friday), "2026-12-05T09:00:00Z"),
        pair("2026-12-04T16:00:00Z", "2026-12-11T16:00:00Z")
    );
}

#[test]
fn billing_day_31_starts_on_the_last_day_of_shorter_months() {
    let billing = berlin(
        Unit::Month,
        Starts {
            day: 31,
            ..Starts::midnight()
        },
    );
    assert_eq!(
        period(billing, "2026-02-10T00:00:00Z"),
        pair("2026-01-30T23:00:00Z", "2026-02-27T23:00:00Z")
    );
    assert_eq!(
        period(billing, "2026-03-10T00:00:00Z"),
        pair("2026-02-27T23:00:00Z", "2026-03-30T22:00:00Z")
    );
    // A leap year's February has its 29th.
    assert_eq!(
        period(billing, "2028-02-29T12:00:00Z").0,
        "2028-02-28T23:00:00Z"
    );
    assert_eq!(
        period(billing, "2026-04-30T12:00:00Z").0,
        "2026-04-29T22:00:00Z"
    );
}

#[test]
fn a_time_skipped_by_summer_time_starts_after_the_gap_and_a_repeated_one_at_its_first() {
    let half_past_two = Starts {
        second: 2 * 3600 + 1800,
        ..Starts::midnight()
    };
    let day = berlin(Unit::Day, half_past_two);
    // 02:30 does not exist on 2026-03-29: the day starts at 03:30 +02:00.
    assert_eq!(
        period(day, "2026-03-29T12:00:00Z"),
        pair("2026-03-29T01:30:00Z", "2026-03-30T00:30:00Z")
    );
    // 02:30 happens twice on 2026-10-25: the day starts at the first, +02:00.
    assert_eq!(
        period(day, "2026-10-25T12:00:00Z"),
        pair("2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z")
    );
}

#[test]
fn a_year_from_a_date_and_utc() {
    let fiscal = Calendar::new(
        "UTC",
        Unit::Year,
        Starts {
            month: 4,
            day: 6,
            ..Starts::midnight()
        },
    )
    .unwrap();
    assert_eq!(
        period(fiscal, "2027-01-01T00:00:00Z"),
        pair("2026-04-06T00:00:00Z", "2027-04-06T00:00:00Z")
    );
}

#[test]
fn a_zone_is_looked_up_once_and_an_unknown_one_is_refused() {
    let a = berlin(Unit::Month, Starts::midnight());
    assert_eq!(a, berlin(Unit::Month, Starts::midnight()));
    assert_ne!(a, berlin(Unit::Week, Starts::midnight()));
    assert!(matches!(
        Calendar::new("Europe/Atlantis", Unit::Month, Starts::midnight()),
        Err(CalendarError::Timezone(_))
    ));
    let bad_day = Starts {
        day: 32,
        ..Starts::midnight()
    };
    assert!(matches!(
        Calendar::new("UTC", Unit::Month, bad_day),
        Err(CalendarError::Starts("day", _))
    ));
}

#[test]
fn within_a_period_the_answer_is_the_kept_one() {
    let month = berlin(Unit::Month, Starts::midnight());
    let first = month.period(at("2026-06-10T00:00:00Z"));
    for now in [first.start, first.start + SEC, first.end - 1] {
        assert_eq!(month.period(now), first);
    }
    assert_eq!(month.end_of(month.index(&first)), first.end);
}

#[test]
fn in_microseconds_the_same_periods() {
    let month = berlin(Unit::Month, Starts::midnight());
    let (ns, us) = (month.period(at("2026-06-10T00:00:00Z")), month.in_micros());
    let p = us.period(at("2026-06-10T00:00:00Z") / 1000);
    assert_eq!((p.start, p.end), (ns.start / 1000, ns.end / 1000));
    assert_eq!(us.index(&p), month.index(&ns));
    assert_eq!(us.end_of(us.index(&p)), p.end);
    assert_ne!(
        month.fingerprint(),
        berlin(Unit::Week, Starts::midnight()).fingerprint()
    );
    assert_eq!(month.fingerprint(), us.fingerprint());
}

/// The reference: every local date from before `now` to after it, the ones the rule names,
/// each at its time through jiff's own zoned arithmetic; the last start at or before `now`
/// and the first after it.
fn brute_force(zone: &str, unit: Unit, starts: Starts, now: u64) -> (u64, u64) {
    let tz = TimeZone::get(zone).unwrap();
    let secs = (now / SEC) as i64;
    let today = Timestamp::from_second(secs)
        .unwrap()
        .to_zoned_datetime(tz.clone())
        .date();
    let reach: i64 = match unit {
        Unit::Day => 3,
        Unit::Week => 9,
        Unit::Month => 33,
        Unit::Year => 368,
    };
    let mut starts_at = vec![];
    for offset in -reach..=reach {
        let d = today.checked_add(jiff::Span::new().days(offset)).unwrap();
        let billing = |d: Date| (starts.day as i8).min(d.days_in_month());
        let named = match unit {
            Unit::Day => true,
            Unit::Week => d.weekday().to_monday_zero_offset() == starts.weekday as i8,
            Unit::Month => d.day() == billing(d),
            Unit::Year => d.month() == starts.month as i8 && d.day() == billing(d),
        };
        if named {
            let s = starts.second as i32;
            let t = jiff::civil::time((s / 3600) as i8, (s / 60 % 60) as i8, (s % 60) as i8, 0);
            let zoned = d.to_datetime(t).to_zoned_datetime(tz.clone()).unwrap();
            starts_at.push(zoned.timestamp().as_second() as u64 * SEC);
        }
    }
    let start = starts_at
        .iter()
        .copied()
        .filter(|&s| s <= now)
        .max()
        .unwrap();
    let end = starts_at
        .iter()
        .copied()
        .filter(|&s| s > now)
        .min()
        .unwrap();
    (start, end)
}

const ZONES: [&str; 7] = [
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "America/Sao_Paulo",
    "Pacific/Apia",
    "Asia/Kolkata",
    "UTC",
];

proptest! {
    #[test]
    fn matches_a_day_by_day_walk_through_the_tz_database(
        zone in 0usize..ZONES.len(),
        unit in prop::sample::select(vec![Unit::Day, Unit::Week, Unit::Month, Unit::Year]),
        month in 1u8..=12,
        day in prop_oneof![1u8..=31, 28u8..=31],
        weekday in 0u8..7,
        second in prop_oneof![0u32..86_400, Just(0), (0u32..6).prop_map(|h| h * 3600 + 1800)],
        now in at("1995-01-01T00:00:00Z")..at("2040-01-01T00:00:00Z"),
    ) {
        let zone = ZONES[zone];
        let starts = Starts { month, day, weekday, second };
        // Straight to the computation: the registry keeps at most MAX_CALENDARS.
        let p = compute(&TimeZone::get(zone).unwrap(), unit, &starts, now).unwrap();
        prop_assert_eq!((p.start, p.end), brute_force(zone, unit, starts, now));
    }
}

#[test]
fn the_reference_agrees_on_a_known_case() {
    let now = at("2026-03-15T12:00:00Z");
    let expected = (at("2026-02-28T23:00:00Z"), at("2026-03-31T22:00:00Z"));
    assert_eq!(
        brute_force("Europe/Berlin", Unit::Month, Starts::midnight(), now),
        expected
    );
}

#[test]
fn around_gives_the_periods_before_and_after_for_a_store_to_pick_from() {
    let month = berlin(Unit::Month, Starts::midnight());
    let b = month.around(at("2026-03-15T12:00:00Z"));
    let expected = [
        "2026-01-31T23:00:00Z",
        "2026-02-28T23:00:00Z",
        "2026-03-31T22:00:00Z",
        "2026-04-30T22:00:00Z",
    ]
    .map(at);
    assert_eq!(b, expected);
    let us = month.in_micros().around(at("2026-03-15T12:00:00Z") / 1000);
    assert_eq!(us, expected.map(|n| n / 1000));
    // Asking around keeps the period's own answer where it was.
    assert_eq!(month.period(at("2026-03-20T00:00:00Z")).end, expected[2]);
}

#[test]
fn the_zone_is_read_once_per_period_not_per_request() {
    let tokyo = Calendar::new("Asia/Tokyo", Unit::Week, Starts::midnight()).unwrap();
    let start = at("2026-06-10T00:00:00Z");
    let before = tokyo.computations();
    for i in 0..10_000 {
        tokyo.period(start + i * SEC);
    }
    assert_eq!(
        tokyo.computations() - before,
        1,
        "10,000 requests within one week"
    );
    // A week on: one more.
    tokyo.period(start + 7 * 86_400 * SEC);
    assert_eq!(tokyo.computations() - before, 2);
}
