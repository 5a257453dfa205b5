//! Numbers written as text on the hot path (shared-data slot names, response headers) without
//! `core::fmt`: under V8 its machinery costs more than the rest of a decision.

/// Appends `n` in decimal.
pub fn push_decimal(out: &mut String, n: u64) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    let mut rest = n;
    for slot in digits.iter_mut().rev() {
        *slot = b'0' + (rest % 10) as u8;
        start -= 1;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    for &digit in digits.iter().skip(start) {
        out.push(char::from(digit));
    }
}

/// Appends `n` as 16 lower-case hex digits, zero-padded.
pub fn push_hex16(out: &mut String, n: u64) {
    for shift in (0..16).rev() {
        let nibble = ((n >> (shift * 4)) & 0xf) as u8;
        let digit = if nibble < 10 {
            b'0' + nibble
        } else {
            b'a' + nibble - 10
        };
        out.push(char::from(digit));
    }
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
