//! Durations as users write them in the config: `"500ms"`, `"1s"`, `"10m"`, `"1h"`, `"1d"`.

pub const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Parses `<positive integer><unit>` into nanoseconds; the unit is one of ms, s, m, h, d.
pub fn parse_nanos(text: &str) -> Result<u64, String> {
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit (use ms, s, m, h or d)"))?;
    let (digits, unit) = text.split_at(digits_end);
    let unit_nanos: u64 = match unit {
        "ms" => 1_000_000,
        "s" => NANOS_PER_SEC,
        "m" => 60 * NANOS_PER_SEC,
        "h" => 3_600 * NANOS_PER_SEC,
        "d" => 86_400 * NANOS_PER_SEC,
        _ => {
            return Err(format!(
                "{text:?} has an unknown unit (use ms, s, m, h or d)"
            ))
        }
    };
    let amount: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} does not start with a whole number"))?;
    if amount == 0 {
        return Err(format!("{text:?} must be greater than zero"));
    }
    amount
        .checked_mul(unit_nanos)
        .ok_or_else(|| format!("{text:?} is too long"))
}

/// Whole seconds, rounded up: what `Retry-After` and the rate-limit headers carry.
pub fn ceil_secs(nanos: u64) -> u64 {
    nanos.div_ceil(NANOS_PER_SEC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_every_unit() {
        assert_eq!(parse_nanos("500ms"), Ok(500_000_000));
        assert_eq!(parse_nanos("1s"), Ok(NANOS_PER_SEC));
        assert_eq!(parse_nanos("10m"), Ok(600 * NANOS_PER_SEC));
        assert_eq!(parse_nanos("2h"), Ok(7_200 * NANOS_PER_SEC));
        assert_eq!(parse_nanos("1d"), Ok(86_400 * NANOS_PER_SEC));
    }

    #[test]
    fn rejects_what_is_not_a_duration() {
        for bad in [
            "",
            "s",
            "10",
            "0s",
            "-1s",
            "1.5s",
            "1 s",
            "1S",
            "1sec",
            "1us",
            "99999999999999999d",
        ] {
            assert!(parse_nanos(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn rounds_seconds_up() {
        assert_eq!(ceil_secs(0), 0);
        assert_eq!(ceil_secs(1), 1);
        assert_eq!(ceil_secs(NANOS_PER_SEC), 1);
        assert_eq!(ceil_secs(NANOS_PER_SEC + 1), 2);
    }

    proptest! {
        #[test]
        fn never_panics(text in ".{0,24}") {
            let _ = parse_nanos(&text);
        }

        #[test]
        fn round_trips_seconds(secs in 1u64..1_000_000) {
            prop_assert_eq!(parse_nanos(&format!("{secs}s")), Ok(secs * NANOS_PER_SEC));
        }
    }
}
