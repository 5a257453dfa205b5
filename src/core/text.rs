//! Numbers written as text on the hot path (shared-data slot names, response headers) without
//! `core::fmt`: under V8 its machinery costs more than the rest of a decision.

/// Appends `n` in decimal (with `itoa`, which serde_json links anyway).
pub fn push_decimal(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// Appends `text` as a JSON string, quotes included: `"` and `\` escaped, and control
/// characters as `\u00XX`.
pub fn push_json_string(out: &mut String, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let byte = u32::from(c) as usize;
                out.push_str("\\u00");
                for digit in [byte >> 4, byte & 15] {
                    out.push(char::from(*HEX.get(digit).unwrap_or(&b'0')));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Appends `n` as 16 lower-case hex digits, zero-padded.
pub fn push_hex16(out: &mut String, n: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 16];
    for (i, slot) in digits.iter_mut().enumerate() {
        let nibble = (n >> ((15 - i) * 4)) & 0xf;
        *slot = HEX.get(nibble as usize).copied().unwrap_or(b'0');
    }
    // One append for the whole number: pushing char by char costs more than the digits.
    out.push_str(std::str::from_utf8(&digits).unwrap_or_default());
}

/// Appends `n` in base 64 (the URL-safe alphabet, most significant digit first), in at least
/// `digits` digits: short shared-data names.
pub fn push_base64(out: &mut String, n: u64, digits: u32) {
    const DIGITS: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut written = [0u8; 11];
    let (mut n, mut len) = (n, 0);
    while (n > 0 || len < digits as usize) && len < written.len() {
        let digit = DIGITS.get((n % 64) as usize).copied().unwrap_or(b'A');
        if let Some(slot) = written.get_mut(len) {
            *slot = digit;
        }
        (n, len) = (n / 64, len + 1);
    }
    let digits = written.get(..len).unwrap_or_default();
    out.extend(digits.iter().rev().map(|&b| char::from(b)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn match_core_fmt(n in any::<u64>()) {
            let (mut decimal, mut hex) = (String::new(), String::new());
            push_decimal(&mut decimal, n);
            push_hex16(&mut hex, n);
            prop_assert_eq!(decimal, n.to_string());
            prop_assert_eq!(hex, format!("{n:016x}"));
        }
    }

    #[test]
    fn base64_digits_are_distinct_and_padded() {
        let name = |n, digits| {
            let mut s = String::new();
            push_base64(&mut s, n, digits);
            s
        };
        assert_eq!(
            (name(0, 1), name(0, 3), name(63, 1), name(64, 1)),
            ("A".into(), "AAA".into(), "_".into(), "BA".into())
        );
        assert_eq!(name(u64::MAX, 1).len(), 11);
        let names: std::collections::HashSet<String> = (0..5000).map(|n| name(n, 1)).collect();
        assert_eq!(names.len(), 5000);
    }

    #[test]
    fn edges() {
        for n in [0, 9, 10, 99, 100, u64::MAX] {
            let mut s = String::from("x");
            push_decimal(&mut s, n);
            assert_eq!(s, format!("x{n}"));
        }
    }
}
