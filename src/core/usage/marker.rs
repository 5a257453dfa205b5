//! Whether a document can carry a count: only one that holds `"usage` can (`usage` and
//! `usageMetadata` are the only keys counts hang from, and a key's own quotes are never escaped),
//! and not when that is OpenAI's `"usage":null`, which every chunk of its streams but the last
//! carries. The rule is on bytes: text that quotes the word (`\"usage\"`) is taken for one too,
//! and only costs its document a full read.

const USAGE: &[u8] = b"\"usage";
/// What follows `USAGE` in a usage that has no counts.
const NULL: &[u8] = b"\":null";

/// Where `bytes` first hold a usage that may have counts.
pub(super) fn first_usage(bytes: &[u8]) -> Option<usize> {
    each_usage(bytes).find(|&at| {
        let after = bytes.get(at + USAGE.len()..).unwrap_or_default();
        !after.starts_with(NULL)
    })
}

/// Where `bytes` hold `USAGE`, found by its `g` (the rarest of its bytes in JSON and English
/// text) with `memchr`, which runs 16 bytes at a time on wasm32's SIMD128 where `memmem` would
/// go byte by byte.
fn each_usage(bytes: &[u8]) -> impl Iterator<Item = usize> + '_ {
    const G_AT: usize = 4;
    memchr::memchr_iter(b'g', bytes).filter_map(|g| {
        let at = g.checked_sub(G_AT)?;
        (bytes.get(at..at + USAGE.len()) == Some(USAGE)).then_some(at)
    })
}

/// Whether bytes that come in pieces hold a usage that may have counts (`first_usage`), with
/// the same answer in every chunking.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Marker {
    /// Bytes matched of `USAGE` then `NULL` (0 to 11), or `FOUND`.
    matched: u8,
}

const FOUND: u8 = u8::MAX;
const MARKS: usize = USAGE.len() + NULL.len();

impl Marker {
    pub(super) fn holds_usage(self) -> bool {
        // A usage cut before its `":null` ends may have counts.
        self.matched == FOUND || usize::from(self.matched) >= USAGE.len()
    }

    pub(super) fn feed(&mut self, bytes: &[u8]) {
        let mut rest = bytes;
        while self.matched != FOUND {
            if self.matched == 0 {
                // Only a quote starts a match.
                let Some(at) = memchr::memchr(b'"', rest) else {
                    return;
                };
                rest = rest.get(at..).unwrap_or_default();
            }
            let Some((&byte, after)) = rest.split_first() else {
                return;
            };
            self.step(byte);
            rest = after;
        }
    }

    fn step(&mut self, byte: u8) {
        let at = usize::from(self.matched);
        let expected = USAGE.iter().chain(NULL).nth(at);
        self.matched = match expected {
            Some(&b) if b == byte && at + 1 == MARKS => 0,
            Some(&b) if b == byte => self.matched + 1,
            // A usage that is not `":null`: a count may follow.
            _ if at >= USAGE.len() => FOUND,
            _ if byte == b'"' => 1,
            _ => 0,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn marked(pieces: &[&[u8]]) -> bool {
        let mut marker = Marker::default();
        pieces.iter().for_each(|piece| marker.feed(piece));
        marker.holds_usage()
    }

    #[test]
    fn a_usage_with_counts_is_marked_and_openais_null_usage_is_not() {
        for (bytes, holds) in [
            (&br#"{"usage":{"total_tokens":1}}"#[..], true),
            (br#"{"usageMetadata":{}}"#, true),
            (br#"{"usage": null}"#, true),
            (br#"{"usage":null}"#, false),
            (br#"{"usage":null,"usage":null}"#, false),
            (br#"{"usage":null,"x":{"usage":1}}"#, true),
            (br#"{"content":"say \"usage\""}"#, true),
            (br#"{"a":"""usage"#, true),
            (br#"{"a":1}"#, false),
        ] {
            assert_eq!(
                first_usage(bytes).is_some(),
                holds,
                "{}",
                String::from_utf8_lossy(bytes)
            );
            assert_eq!(
                marked(&[bytes]),
                holds,
                "{}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    proptest! {
        #[test]
        fn every_chunking_marks_what_the_whole_marks(
            parts in prop::collection::vec(prop::sample::select(vec![
                &b"\"usage"[..], b"\":null", b"\"", b"M", b"x", b":", b"null", b"\"usage\":null",
            ]), 0..12),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        ) {
            let bytes = parts.concat();
            let mut at: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
            at.sort_unstable();
            let mut pieces = Vec::new();
            let mut from = 0;
            for cut in at {
                pieces.push(&bytes[from..cut]);
                from = cut;
            }
            pieces.push(&bytes[from..]);
            prop_assert_eq!(marked(&pieces), first_usage(&bytes).is_some());
        }
    }
}
