//! One JSON document, read byte by byte in any chunking: a state machine that checks the syntax,
//! skips strings with `memchr`, and reads only the keys and numbers where usage can be (see the
//! module above). It holds where it stands, never what it has passed.

use memchr::memchr2;

use super::{Count, Counts, MAX_TOKENS};

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
    /// A document's `response` or `message`: its `usage` and `usageMetadata` are read.
    Wrapper,
    /// A usage object: its counts are read.
    Usage,
    Other,
}

/// What the value being read is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Meaning {
    Document,
    Wrapper,
    Usage,
    Count(Count),
    Nothing,
}

impl Role {
    /// What the value of the member `key` of an object in this role is.
    fn member(self, key: Option<&[u8]>) -> Meaning {
        match (self, key) {
            (Role::Document | Role::Wrapper, Some(b"usage" | b"usageMetadata")) => Meaning::Usage,
            (Role::Document, Some(b"response" | b"message")) => Meaning::Wrapper,
            (Role::Usage, Some(key)) => {
                Count::of_usage_key(key).map_or(Meaning::Nothing, Meaning::Count)
            }
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
pub(super) fn string_run(bytes: &[u8], escaped: bool) -> Run {
    let mut from = usize::from(escaped);
    loop {
        let Some(rest) = bytes.get(from..) else {
            return Run::Open { escaped: true };
        };
        match memchr2(b'"', b'\\', rest) {
            None => return Run::Open { escaped: false },
            Some(offset) if rest.get(offset) == Some(&b'"') => return Run::Closed(from + offset),
            // A backslash: the byte after it is part of the string, whatever it is.
            Some(offset) => from += offset + 2,
        }
    }
}

fn is_whitespace(byte: u8) -> bool {
    matches!(byte, b' ' | b'\n' | b'\r' | b'\t')
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

    /// Reads the next bytes of the document, setting in `counts` those it finds.
    pub(super) fn feed(&mut self, bytes: &[u8], counts: &mut Counts) -> Result<(), Why> {
        let mut rest = bytes;
        while let Some((&byte, after)) = rest.split_first() {
            rest = match self.state {
                State::Skip { key, escaped } => self.skip_string(rest, key, escaped),
                State::Read { escaped } => self.read_key(rest, escaped),
                _ => {
                    self.step(byte, counts)?;
                    after
                }
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

    /// One byte outside a string.
    fn step(&mut self, byte: u8, counts: &mut Counts) -> Result<(), Why> {
        match self.state {
            State::Value { or_close } => self.value(byte, or_close),
            State::Key { or_close } => self.key(byte, or_close),
            State::Colon => self.colon(byte),
            State::Next => self.next(byte),
            State::Number(part) => self.number(byte, part, counts),
            State::Literal { word, matched } => self.literal(byte, word, matched),
            State::Done if is_whitespace(byte) => Ok(()),
            // `feed` passes strings on whole, never a byte at a time.
            State::Done | State::Skip { .. } | State::Read { .. } => Err(MALFORMED),
        }
    }

    fn value(&mut self, byte: u8, or_close: bool) -> Result<(), Why> {
        match byte {
            b' ' | b'\n' | b'\r' | b'\t' => Ok(()),
            b']' if or_close => self.close(byte),
            b'{' => self.open(true),
            b'[' => self.open(false),
            b'"' => self.scalar(State::Skip {
                key: false,
                escaped: false,
            }),
            b'-' | b'0'..=b'9' => {
                self.number = Number {
                    value: u64::from(byte.saturating_sub(b'0')),
                    negative: byte == b'-',
                };
                self.state = State::Number(match byte {
                    b'-' => Part::Minus,
                    b'0' => Part::Zero,
                    _ => Part::Integer,
                });
                Ok(())
            }
            b't' => self.scalar(State::Literal {
                word: b"true",
                matched: 1,
            }),
            b'f' => self.scalar(State::Literal {
                word: b"false",
                matched: 1,
            }),
            // A `null` count is no count.
            b'n' => {
                self.state = State::Literal {
                    word: b"null",
                    matched: 1,
                };
                Ok(())
            }
            _ => Err(MALFORMED),
        }
    }

    /// Starts a string or a literal, which no count may be.
    fn scalar(&mut self, state: State) -> Result<(), Why> {
        if let Meaning::Count(_) = self.meaning {
            return Err(NOT_A_NUMBER);
        }
        self.state = state;
        Ok(())
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
            (Meaning::Usage, true) => Role::Usage,
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

    fn key(&mut self, byte: u8, or_close: bool) -> Result<(), Why> {
        match byte {
            b' ' | b'\n' | b'\r' | b'\t' => Ok(()),
            b'}' if or_close => self.close(byte),
            // Only keys where usage can be are worth reading.
            b'"' if self.role() == Role::Other => {
                self.state = State::Skip {
                    key: true,
                    escaped: false,
                };
                Ok(())
            }
            b'"' => {
                self.key.len = 0;
                self.state = State::Read { escaped: false };
                Ok(())
            }
            _ => Err(MALFORMED),
        }
    }

    fn colon(&mut self, byte: u8) -> Result<(), Why> {
        match byte {
            b' ' | b'\n' | b'\r' | b'\t' => Ok(()),
            b':' => {
                self.meaning = self.role().member(self.key.get());
                self.state = State::Value { or_close: false };
                Ok(())
            }
            _ => Err(MALFORMED),
        }
    }

    fn next(&mut self, byte: u8) -> Result<(), Why> {
        match byte {
            b' ' | b'\n' | b'\r' | b'\t' => Ok(()),
            b',' if self.in_object() => {
                self.state = State::Key { or_close: false };
                Ok(())
            }
            b',' => {
                self.meaning = self.role().element();
                self.state = State::Value { or_close: false };
                Ok(())
            }
            b'}' | b']' => self.close(byte),
            _ => Err(MALFORMED),
        }
    }

    fn skip_string<'a>(&mut self, bytes: &'a [u8], key: bool, escaped: bool) -> &'a [u8] {
        match string_run(bytes, escaped) {
            Run::Closed(at) => {
                if key {
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

    fn read_key<'a>(&mut self, bytes: &'a [u8], escaped: bool) -> &'a [u8] {
        match string_run(bytes, escaped) {
            Run::Closed(at) => {
                self.key.push(bytes.get(..at).unwrap_or_default());
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

    fn number(&mut self, byte: u8, part: Part, counts: &mut Counts) -> Result<(), Why> {
        let next = match (part, byte) {
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
            (part, _) if part.complete() => {
                if let Meaning::Count(count) = self.meaning {
                    counts.set(count, self.number.count(part)?);
                }
                self.value_ended();
                return self.step(byte, counts);
            }
            _ => return Err(MALFORMED),
        };
        self.state = State::Number(next);
        Ok(())
    }

    fn literal(&mut self, byte: u8, word: &'static [u8], matched: u8) -> Result<(), Why> {
        if word.get(usize::from(matched)) != Some(&byte) {
            return Err(MALFORMED);
        }
        let matched = matched + 1;
        if usize::from(matched) == word.len() {
            self.value_ended();
        } else {
            self.state = State::Literal { word, matched };
        }
        Ok(())
    }
}
