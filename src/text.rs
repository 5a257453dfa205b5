//! Numbers written as text on the hot path (shared-data slot names, response headers) without
//! `core::fmt`: under V8 its machinery costs more than the rest of a decision.

/// Appends `n` in decimal (with `itoa`, which serde_json links anyway).
pub fn push_decimal(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
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
    fn edges() {
        for n in [0, 9, 10, 99, 100, u64::MAX] {
            let mut s = String::from("x");
            push_decimal(&mut s, n);
            assert_eq!(s, format!("x{n}"));
        }
    }
}
