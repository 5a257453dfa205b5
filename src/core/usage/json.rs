//! One JSON document, read byte by byte in any chunking: a state machine that checks the syntax,
//! skips strings with `memchr`, and reads only the keys and numbers where usage can be (see the
//! module above). It holds where it stands, never what it has passed.

use memchr::memchr2;

use super::{Count, Tally, MAX_TOKENS};

/// The deepest nesting read: deeper is invalid. One bit per level records the container's kind.
pub const MAX_DEPTH: u8 = 64;
/// Keys compared are at most this long; the longest name read is 20 bytes.
const KEY_BYTES: usize = 32;
/// The levels where usage can be: a document in a top-level array, under it `response` or
/// `message`, under that `usage`.
const ROLE_LEVELS: usize = 4;

/// Why a body is invalid (`Reading::Invalid`).
pub(super) type Why = &'static str;

const MALFORMED: Why = "malformed JSON";
const TOO_DEEP: Why = "JSON nested deeper than 64 levels";
const NOT_A_NUMBER: Why = "a token count is not a number";
const NEGATIVE: Why = "a token count is negative";
const NOT_WHOLE: Why = "a token count is not a whole number";
const TOO_LARGE: Why = "a token count is above 10^12";
const CUT: Why = "the body ends inside a JSON document";

/// A JSON document being read.
#[derive(Debug, Clone, Copy)]
pub(super) struct Json {
    state: State,
    /// Containers open around the current position.
    depth: u8,
    /// Bit `d` is set when the container at depth `d + 1` is an object, clear for an array.
    objects: u64,
    /// What the containers at the first levels are; deeper ones are all `Role::Other`.
    roles: [Role; ROLE_LEVELS],
    /// What the value being read is, from its key or its array.
    meaning: Meaning,
    key: Key,
    number: Number,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A value is expected; `or_close`: or the `]` of an empty array.
    Value {
        or_close: bool,
    },
    /// A key is expected; `or_close`: or the `}` of an empty object.
    Key {
        or_close: bool,
    },
    /// Inside a string that is skipped (`key`: a key, so a colon follows). `escaped`: the last
    /// byte was a backslash.
    Skip {
        key: bool,
        escaped: bool,
    },
    /// Inside a key that is read into `Json::key`.
    Read {
        escaped: bool,
    },
    /// Inside the string of the model the response names, read into `Tally::model`.
    Model {
        escaped: bool,
    },
    Colon,
    /// After a value: a comma or the end of its container.
    Next,
    Number(Part),
    /// `matched` bytes of the literal `word` were read.
    Literal {
        word: &'static [u8],
        matched: u8,
    },
    /// The document is complete: only whitespace may follow.
    Done,
}

/// What a container is for the usage search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A top-level array: each object in it is a document.
    DocumentList,
    /// Its `usage`, `usageMetadata`, `response` and `message` members are read.
    Document,
    /// A document's `response`: its `usage` and `usageMetadata` are read.
    Wrapper,
    /// A document's `message` (Anthropic's `message_start`): read as a `Wrapper`, but its usage
    /// is a first guess that a later `message_delta` must confirm.
    Message,
    /// A usage object: its counts are read.
    Usage,
    /// The usage object of a `message`: its counts are provisional (`Counts::provisional`).
    MessageUsage,
    /// OpenAI's `prompt_tokens_details` / `input_tokens_details` of a usage: its
    /// `cached_tokens` is read.
    InputDetails,
    /// OpenAI's `completion_tokens_details` / `output_tokens_details` of a usage: its
    /// `reasoning_tokens` is read.
    OutputDetails,
    Other,
}

/// What the value being read is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Meaning {
    Document,
    Wrapper,
    Message,
    Usage,
    MessageUsage,
    InputDetails,
    OutputDetails,
    Count(Count),
    /// The model that served the response: `model` in a document, its `response` or its
    /// `message`, Gemini's `modelVersion` in a document.
    Model,
    Nothing,
}

impl Role {
    /// What the value of the member `key` of an object in this role is.
    fn member(self, key: Option<&[u8]>) -> Meaning {
        match (self, key) {
            (Role::Document | Role::Wrapper, Some(b"usage" | b"usageMetadata")) => Meaning::Usage,
            (Role::Message, Some(b"usage" | b"usageMetadata")) => Meaning::MessageUsage,
            (Role::Document, Some(b"response")) => Meaning::Wrapper,
            (Role::Document | Role::Wrapper | Role::Message, Some(b"model"))
            | (Role::Document, Some(b"modelVersion")) => Meaning::Model,
            (Role::Document, Some(b"message")) => Meaning::Message,
            (Role::Usage, Some(b"prompt_tokens_details" | b"input_tokens_details")) => {
                Meaning::InputDetails
            }
            (Role::Usage, Some(b"completion_tokens_details" | b"output_tokens_details")) => {
                Meaning::OutputDetails
            }
            (Role::Usage | Role::MessageUsage, Some(key)) => {
                Count::of_usage_key(key).map_or(Meaning::Nothing, Meaning::Count)
            }
            (Role::InputDetails, Some(b"cached_tokens")) => Meaning::Count(Count::Cached),
            (Role::OutputDetails, Some(b"reasoning_tokens")) => Meaning::Count(Count::Reasoning),
            _ => Meaning::Nothing,
        }
    }

    /// What the elements of an array in this role are.
    fn element(self) -> Meaning {
        if self == Role::DocumentList {
            Meaning::Document
        } else {
            Meaning::Nothing
        }
    }
}

/// The first `KEY_BYTES` bytes of a key as written.
#[derive(Debug, Clone, Copy)]
struct Key {
    bytes: [u8; KEY_BYTES],
    /// `TOO_LONG` once the key outgrew `bytes`.
    len: u8,
}

const TOO_LONG: u8 = KEY_BYTES as u8 + 1;

impl Key {
    fn push(&mut self, part: &[u8]) {
        let start = usize::from(self.len);
        let end = start.saturating_add(part.len());
        match self.bytes.get_mut(start..end) {
            Some(slot) => {
                slot.copy_from_slice(part);
                self.len = u8::try_from(end).unwrap_or(TOO_LONG);
            }
            None => self.len = TOO_LONG,
        }
    }

    /// The key, unless it was too long to be one of the names read.
    fn get(&self) -> Option<&[u8]> {
        self.bytes.get(..usize::from(self.len))
    }
}

/// Where a number stands in JSON's grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Minus,
    Zero,
    Integer,
    Point,
    Fraction,
    Exponent,
    ExponentSign,
    ExponentDigits,
}

impl Part {
    /// Whether a number may end here.
    fn complete(self) -> bool {
        matches!(
            self,
            Part::Zero | Part::Integer | Part::Fraction | Part::ExponentDigits
        )
    }
}

/// The number being read: its integer part (held at `MAX_TOKENS + 1` once above) and sign.
#[derive(Debug, Clone, Copy)]
struct Number {
    value: u64,
    negative: bool,
}

impl Number {
    /// The count a number that ended at `part` is, if it is one.
    fn count(self, part: Part) -> Result<u64, Why> {
        if self.negative {
            Err(NEGATIVE)
        } else if !matches!(part, Part::Zero | Part::Integer) {
            Err(NOT_WHOLE)
        } else if self.value > MAX_TOKENS {
            Err(TOO_LARGE)
        } else {
            Ok(self.value)
        }
    }
}

/// How a document stands when the body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    /// Nothing but whitespace was read.
    Empty,
    Complete,
    /// The document is cut.
    Open,
}

/// How far a string runs in the bytes that continue it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Run {
    /// It ends at the closing quote at this index.
    Closed(usize),
    /// It goes on past these bytes; `escaped`: they end on a backslash.
    Open { escaped: bool },
}

/// Where the string that `bytes` continue (after its opening quote) ends. `escaped`: the bytes
/// before ended on a backslash, so the first one is escaped.
#[inline(always)]
pub(super) fn string_run(bytes: &[u8], escaped: bool) -> Run {
    let mut from = usize::from(escaped);
    loop {
        let Some(rest) = bytes.get(from..) else {
            return Run::Open { escaped: true };
        };
        match quote_or_backslash(rest) {
            None => return Run::Open { escaped: false },
            Some(offset) if rest.get(offset) == Some(&b'"') => return Run::Closed(from + offset),
            // A backslash: the byte after it is part of the string, whatever it is.
            Some(offset) => from += offset + 2,
        }
    }
}

/// The first quote or backslash in `bytes`. Most keys and ids end before a call to `memchr`
/// pays off: their first words are looked at eight bytes at a time.
#[inline(always)]
fn quote_or_backslash(bytes: &[u8]) -> Option<usize> {
    const INLINE_WORDS: usize = 4;
    let mut words = bytes.chunks_exact(8);
    for (n, word) in words.by_ref().take(INLINE_WORDS).enumerate() {
        let word = u64::from_le_bytes(word.try_into().unwrap_or_default());
        let found = bytes_equal(word, b'"') | bytes_equal(word, b'\\');
        if found != 0 {
            return Some(n * 8 + found.trailing_zeros() as usize / 8);
        }
    }
    let searched = bytes.len() - words.remainder().len() - words.len() * 8;
    let rest = bytes.get(searched..).unwrap_or_default();
    let found = match rest.len() {
        0..8 => rest.iter().position(|&b| b == b'"' || b == b'\\'),
        _ => memchr2(b'"', b'\\', rest),
    };
    found.map(|at| searched + at)
}

/// The high bit of each byte of `word` equal to `byte`, from the lowest up to the first such byte
/// (bits above it may be set too: only its position is exact).
fn bytes_equal(word: u64, byte: u8) -> u64 {
    const ONES: u64 = u64::MAX / 255;
    let zero_where_equal = word ^ (ONES * u64::from(byte));
    zero_where_equal.wrapping_sub(ONES) & !zero_where_equal & (ONES << 7)
}

/// JSON's whitespace.
pub(super) fn is_whitespace(byte: u8) -> bool {
    matches!(byte, b' ' | b'\n' | b'\r' | b'\t')
}

pub(super) fn skip_whitespace(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|&b| !is_whitespace(b));
    bytes
        .get(start.unwrap_or(bytes.len())..)
        .unwrap_or_default()
}

impl Json {
    pub(super) fn new() -> Json {
        Json {
            state: State::Value { or_close: false },
            depth: 0,
            objects: 0,
            roles: [Role::Other; ROLE_LEVELS],
            meaning: Meaning::Document,
            key: Key {
                bytes: [0; KEY_BYTES],
                len: 0,
            },
            number: Number {
                value: 0,
                negative: false,
            },
        }
    }

    /// Reads the next bytes of the document, setting in `counts` those it finds. Each turn reads
    /// a token (a string, a number, a literal, a punctuation mark, a run of whitespace), or what
    /// the bytes hold of it. The readers of tokens are `#[inline(always)]`: a call per token cost
    /// more than most tokens (inlined, an OpenAI stream reads at 1.4 GiB/s rather than 1.0).
    pub(super) fn feed(&mut self, bytes: &[u8], counts: &mut Tally) -> Result<(), Why> {
        let mut rest = bytes;
        while let Some((&byte, after)) = rest.split_first() {
            rest = match self.state {
                State::Skip { key, escaped } => self.skip_string(rest, key, escaped),
                State::Read { escaped } => self.read_key(rest, escaped),
                State::Model { escaped } => self.read_model(rest, escaped, counts),
                State::Number(part) => self.number(rest, part, counts)?,
                State::Literal { word, matched } => self.literal(rest, word, matched)?,
                _ if is_whitespace(byte) => skip_whitespace(after),
                State::Value { or_close } => self.value(byte, after, or_close, counts)?,
                State::Key { or_close } => self.key(byte, after, or_close, counts)?,
                State::Colon => self.colon(byte, after, counts)?,
                State::Next => self.next(byte, after, counts)?,
                State::Done => return Err(MALFORMED),
            };
        }
        Ok(())
    }

    /// How the document stands if the body ends here.
    pub(super) fn ending(&self) -> Ending {
        match self.state {
            State::Done => Ending::Complete,
            State::Number(part) if self.depth == 0 && part.complete() => Ending::Complete,
            State::Value { .. } if self.depth == 0 => Ending::Empty,
            _ => Ending::Open,
        }
    }

    /// Checks that a JSON body ends here.
    pub(super) fn end(&self) -> Result<(), Why> {
        match self.ending() {
            Ending::Open => Err(CUT),
            Ending::Empty | Ending::Complete => Ok(()),
        }
    }

    /// The first byte of a value, then what the bytes `after` it hold of the value.
    #[inline(always)]
    fn value<'a>(
        &mut self,
        byte: u8,
        after: &'a [u8],
        or_close: bool,
        counts: &mut Tally,
    ) -> Result<&'a [u8], Why> {
        match byte {
            b']' if or_close => self.close(byte).map(|()| after),
            b'{' | b'[' => self.open(byte == b'{').map(|()| after),
            b'"' if self.meaning == Meaning::Model => {
                counts.model = super::Model::default();
                counts.model.seen = true;
                Ok(self.read_model(after, false, counts))
            }
            b'"' => {
                self.not_a_count()?;
                Ok(self.skip_string(after, false, false))
            }
            b'-' | b'0'..=b'9' => {
                self.number = Number {
                    value: u64::from(byte.saturating_sub(b'0')),
                    negative: byte == b'-',
                };
                let part = match byte {
                    b'-' => Part::Minus,
                    b'0' => Part::Zero,
                    _ => Part::Integer,
                };
                self.number(after, part, counts)
            }
            b't' | b'f' => {
                self.not_a_count()?;
                let word: &[u8] = if byte == b't' { b"true" } else { b"false" };
                self.literal(after, word, 1)
            }
            // A `null` count is no count.
            b'n' => self.literal(after, b"null", 1),
            _ => Err(MALFORMED),
        }
    }

    /// Refuses a string or a literal where a count is expected.
    fn not_a_count(&self) -> Result<(), Why> {
        match self.meaning {
            Meaning::Count(_) => Err(NOT_A_NUMBER),
            _ => Ok(()),
        }
    }

    fn open(&mut self, object: bool) -> Result<(), Why> {
        if self.depth >= MAX_DEPTH {
            return Err(TOO_DEEP);
        }
        let role = match (self.meaning, object) {
            (Meaning::Count(_), _) => return Err(NOT_A_NUMBER),
            (Meaning::Document, true) => Role::Document,
            (Meaning::Document, false) if self.depth == 0 => Role::DocumentList,
            (Meaning::Wrapper, true) => Role::Wrapper,
            (Meaning::Message, true) => Role::Message,
            (Meaning::Usage, true) => Role::Usage,
            (Meaning::MessageUsage, true) => Role::MessageUsage,
            (Meaning::InputDetails, true) => Role::InputDetails,
            (Meaning::OutputDetails, true) => Role::OutputDetails,
            _ => Role::Other,
        };
        if let Some(slot) = self.roles.get_mut(usize::from(self.depth)) {
            *slot = role;
        }
        let bit = 1u64 << self.depth;
        self.objects = if object {
            self.objects | bit
        } else {
            self.objects & !bit
        };
        self.depth += 1;
        self.meaning = role.element();
        self.state = if object {
            State::Key { or_close: true }
        } else {
            State::Value { or_close: true }
        };
        Ok(())
    }

    /// The role of the innermost open container.
    fn role(&self) -> Role {
        let level = usize::from(self.depth).wrapping_sub(1);
        self.roles.get(level).copied().unwrap_or(Role::Other)
    }

    fn in_object(&self) -> bool {
        self.depth > 0 && (self.objects >> (self.depth - 1)) & 1 == 1
    }

    fn close(&mut self, byte: u8) -> Result<(), Why> {
        if self.depth == 0 || self.in_object() != (byte == b'}') {
            return Err(MALFORMED);
        }
        self.depth -= 1;
        self.value_ended();
        Ok(())
    }

    fn value_ended(&mut self) {
        self.state = if self.depth == 0 {
            State::Done
        } else {
            State::Next
        };
    }

    /// The first byte of a key, then the rest of it. Compact JSON's `"key":value` is read in one
    /// turn: colon and value follow the key at once when they are there.
    #[inline(always)]
    fn key<'a>(
        &mut self,
        byte: u8,
        after: &'a [u8],
        or_close: bool,
        counts: &mut Tally,
    ) -> Result<&'a [u8], Why> {
        let rest = match byte {
            b'}' if or_close => return self.close(byte).map(|()| after),
            // Only keys where usage can be are worth reading.
            b'"' if self.role() == Role::Other => self.skip_string(after, true, false),
            b'"' => {
                self.key.len = 0;
                self.read_key(after, false)
            }
            _ => return Err(MALFORMED),
        };
        match rest.split_first() {
            Some((&b':', value)) if self.state == State::Colon => self.colon(b':', value, counts),
            _ => Ok(rest),
        }
    }

    #[inline(always)]
    fn colon<'a>(
        &mut self,
        byte: u8,
        after: &'a [u8],
        counts: &mut Tally,
    ) -> Result<&'a [u8], Why> {
        if byte != b':' {
            return Err(MALFORMED);
        }
        self.state = State::Value { or_close: false };
        match after.split_first() {
            Some((&first, value)) if !is_whitespace(first) => {
                self.value(first, value, false, counts)
            }
            _ => Ok(after),
        }
    }

    /// A comma or the end of a container, then the key after a comma if it is there.
    #[inline(always)]
    fn next<'a>(&mut self, byte: u8, after: &'a [u8], counts: &mut Tally) -> Result<&'a [u8], Why> {
        match byte {
            b',' if self.in_object() => {
                self.state = State::Key { or_close: false };
                if let Some((&b'"', key)) = after.split_first() {
                    return self.key(b'"', key, false, counts);
                }
            }
            b',' => {
                self.meaning = self.role().element();
                self.state = State::Value { or_close: false };
            }
            b'}' | b']' => self.close(byte)?,
            _ => return Err(MALFORMED),
        }
        Ok(after)
    }

    #[inline(always)]
    fn skip_string<'a>(&mut self, bytes: &'a [u8], key: bool, escaped: bool) -> &'a [u8] {
        match string_run(bytes, escaped) {
            Run::Closed(at) => {
                if key {
                    self.meaning = Meaning::Nothing;
                    self.state = State::Colon;
                } else {
                    self.value_ended();
                }
                bytes.get(at + 1..).unwrap_or_default()
            }
            Run::Open { escaped } => {
                self.state = State::Skip { key, escaped };
                &[]
            }
        }
    }

    #[inline(always)]
    fn read_key<'a>(&mut self, bytes: &'a [u8], escaped: bool) -> &'a [u8] {
        match string_run(bytes, escaped) {
            Run::Closed(at) => {
                // A key whole in these bytes is matched where it lies, one split from its copy.
                let last = bytes.get(..at).unwrap_or_default();
                let key = if self.key.len == 0 {
                    Some(last)
                } else {
                    self.key.push(last);
                    self.key.get()
                };
                self.meaning = self.role().member(key);
                self.state = State::Colon;
                bytes.get(at + 1..).unwrap_or_default()
            }
            Run::Open { escaped } => {
                self.key.push(bytes);
                self.state = State::Read { escaped };
                &[]
            }
        }
    }

    /// What `bytes` hold of the model's name, the rest of which is read as it was written (a
    /// name written with escapes matches no price).
    #[inline(always)]
    fn read_model<'a>(&mut self, bytes: &'a [u8], escaped: bool, counts: &mut Tally) -> &'a [u8] {
        match string_run(bytes, escaped) {
            Run::Closed(at) => {
                counts.model.push(bytes.get(..at).unwrap_or_default());
                self.value_ended();
                bytes.get(at + 1..).unwrap_or_default()
            }
            Run::Open { escaped } => {
                counts.model.push(bytes);
                self.state = State::Model { escaped };
                &[]
            }
        }
    }

    /// What `bytes` hold of a number now at `part`: its end is left for the next token.
    #[inline(always)]
    fn number<'a>(
        &mut self,
        bytes: &'a [u8],
        mut part: Part,
        counts: &mut Tally,
    ) -> Result<&'a [u8], Why> {
        for (at, &byte) in bytes.iter().enumerate() {
            match self.number_part(part, byte) {
                Some(next) => part = next,
                None if part.complete() => {
                    if let Meaning::Count(count) = self.meaning {
                        counts.counts.set(count, self.number.count(part)?);
                        counts.counts.provisional = self.role() == Role::MessageUsage;
                    }
                    self.value_ended();
                    return Ok(bytes.get(at..).unwrap_or_default());
                }
                None => return Err(MALFORMED),
            }
        }
        self.state = State::Number(part);
        Ok(&[])
    }

    /// Where a number at `part` stands after `byte`, its integer's digits taken in; `None` when
    /// `byte` is not part of it.
    #[inline(always)]
    fn number_part(&mut self, part: Part, byte: u8) -> Option<Part> {
        Some(match (part, byte) {
            (Part::Minus, b'0') => Part::Zero,
            (Part::Minus | Part::Integer, b'0'..=b'9') => {
                let digit = u64::from(byte - b'0');
                let value = self.number.value.saturating_mul(10).saturating_add(digit);
                self.number.value = value.min(MAX_TOKENS + 1);
                Part::Integer
            }
            (Part::Zero | Part::Integer, b'.') => Part::Point,
            (Part::Point | Part::Fraction, b'0'..=b'9') => Part::Fraction,
            (Part::Zero | Part::Integer | Part::Fraction, b'e' | b'E') => Part::Exponent,
            (Part::Exponent, b'+' | b'-') => Part::ExponentSign,
            (Part::Exponent | Part::ExponentSign | Part::ExponentDigits, b'0'..=b'9') => {
                Part::ExponentDigits
            }
            _ => return None,
        })
    }

    /// What `bytes` hold of the literal `word`, `matched` bytes of which were read.
    #[inline(always)]
    fn literal<'a>(
        &mut self,
        bytes: &'a [u8],
        word: &'static [u8],
        matched: u8,
    ) -> Result<&'a [u8], Why> {
        let expected = word.get(usize::from(matched)..).unwrap_or_default();
        let length = expected.len().min(bytes.len());
        if bytes.get(..length) != expected.get(..length) {
            return Err(MALFORMED);
        }
        if length == expected.len() {
            self.value_ended();
        } else {
            let matched = matched + length as u8;
            self.state = State::Literal { word, matched };
        }
        Ok(bytes.get(length..).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `string_run` a byte at a time.
    fn run_bytewise(bytes: &[u8], mut escaped: bool) -> Run {
        for (at, &byte) in bytes.iter().enumerate() {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => return Run::Closed(at),
                _ => {}
            }
        }
        Run::Open { escaped }
    }

    proptest! {
        #[test]
        fn a_string_ends_where_a_byte_at_a_time_reading_says(
            bytes in prop::collection::vec(
                prop_oneof![30 => Just(b'a'), 1 => Just(b'"'), 1 => Just(b'\\'), 1 => any::<u8>()],
                0..200,
            ),
            escaped in any::<bool>(),
        ) {
            prop_assert_eq!(string_run(&bytes, escaped), run_bytewise(&bytes, escaped));
        }
    }
}
