//! Server-sent events, framed as the HTML standard says: lines of `field: value` ending in `\n`,
//! `\r\n` or `\r`; a blank line ends an event; `:` starts a comment; the `data` lines of an event
//! are joined by `\n`; other fields (`event`, `id`, `retry`) are ignored. The data bytes go
//! straight to the event's JSON reader as they arrive: nothing is held but where the current
//! line stands and which of the 6 bytes of `[DONE]` the data has matched so far.
//!
//! The last event needs no blank line after it (a stream may close after its last data line),
//! but its data must be complete.

use memchr::memchr2;

use super::json::{is_whitespace, Ending, Json, Why};
use super::Tally;

const DATA: &[u8] = b"data";
/// What OpenAI sends as the last event's data.
const DONE: &[u8] = b"[DONE]";

const EVENT_CUT: Why = "an event's data ends inside a JSON document";

/// An event stream being read.
#[derive(Debug, Clone, Copy)]
pub(super) struct EventStream {
    line: Line,
    /// The last byte was a `\r`: a `\n` right after it ends no other line.
    after_cr: bool,
    /// The current event has had a `data` line.
    has_data: bool,
    data: Data,
}

/// Where the current line stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    Start,
    /// In the field name, whose first `matched` bytes are those of `data`.
    Name {
        matched: u8,
    },
    /// `data:` was read: the value follows, after an optional space.
    ValueStart,
    Value,
    /// A comment, or a field other than `data`.
    Ignored,
}

/// The data of one event: `[DONE]`, or a JSON document.
#[derive(Debug, Clone, Copy)]
struct Data {
    /// How many bytes of `[DONE]` the data matched (whitespace aside); `None` once it did not.
    done: Option<u8>,
    json: Json,
}

impl Data {
    fn new() -> Data {
        Data {
            done: Some(0),
            json: Json::new(),
        }
    }

    fn feed(&mut self, bytes: &[u8], counts: &mut Tally) -> Result<(), Why> {
        let Some(matched) = self.done else {
            return self.json.feed(bytes, counts);
        };
        let mut matched = usize::from(matched);
        for (at, &byte) in bytes.iter().enumerate() {
            let between = matched == 0 || matched == DONE.len();
            if DONE.get(matched) == Some(&byte) {
                matched += 1;
            } else if !(between && is_whitespace(byte)) {
                // Not `[DONE]`: the JSON reader gets what was held back, then the rest.
                self.done = None;
                self.json
                    .feed(DONE.get(..matched).unwrap_or_default(), counts)?;
                return self.json.feed(bytes.get(at..).unwrap_or_default(), counts);
            }
        }
        self.done = u8::try_from(matched).ok();
        Ok(())
    }

    /// Checks the data is `[DONE]`, a complete JSON document, or nothing.
    fn end(&mut self, counts: &mut Tally) -> Result<(), Why> {
        match self.done {
            Some(matched) if usize::from(matched) == DONE.len() => return Ok(()),
            Some(matched) => {
                let held = DONE.get(..usize::from(matched)).unwrap_or_default();
                self.json.feed(held, counts)?;
            }
            None => {}
        }
        match self.json.ending() {
            Ending::Open => Err(EVENT_CUT),
            Ending::Empty | Ending::Complete => Ok(()),
        }
    }
}

impl EventStream {
    pub(super) fn new() -> EventStream {
        EventStream {
            line: Line::Start,
            after_cr: false,
            has_data: false,
            data: Data::new(),
        }
    }

    /// Reads the next bytes of the stream, setting in `counts` those its events' data carry (and the model they name).
    pub(super) fn feed(&mut self, bytes: &[u8], counts: &mut Tally) -> Result<(), Why> {
        let mut rest = bytes;
        while let Some((&byte, after)) = rest.split_first() {
            if std::mem::take(&mut self.after_cr) && byte == b'\n' {
                rest = after;
                continue;
            }
            rest = match (self.line, byte) {
                (_, b'\n' | b'\r') => {
                    self.after_cr = byte == b'\r';
                    self.end_line(counts)?;
                    after
                }
                (Line::Value, _) => {
                    let (value, next) = rest
                        .split_at_checked(line_length(rest))
                        .unwrap_or((rest, &[]));
                    self.data.feed(value, counts)?;
                    next
                }
                (Line::Ignored, _) => rest.get(line_length(rest)..).unwrap_or_default(),
                (Line::ValueStart, _) => {
                    self.line = Line::Value;
                    if byte == b' ' {
                        after
                    } else {
                        rest
                    }
                }
                (Line::Start, _) => {
                    self.line = self.name(0, byte, counts)?;
                    after
                }
                (Line::Name { matched }, _) => {
                    self.line = self.name(matched, byte, counts)?;
                    after
                }
            };
        }
        Ok(())
    }

    /// Ends the stream: its last line and event, if they had no end of their own.
    pub(super) fn end(&mut self, counts: &mut Tally) -> Result<(), Why> {
        if self.line != Line::Start {
            self.end_line(counts)?;
        }
        self.end_event(counts)
    }

    /// The next byte of a field name, `matched` bytes of which are those of `data`.
    fn name(&mut self, matched: u8, byte: u8, counts: &mut Tally) -> Result<Line, Why> {
        let is_data = usize::from(matched) == DATA.len();
        Ok(match byte {
            b':' if is_data => {
                self.start_data_line(counts)?;
                Line::ValueStart
            }
            _ if DATA.get(usize::from(matched)) == Some(&byte) => Line::Name {
                matched: matched + 1,
            },
            _ => Line::Ignored,
        })
    }

    fn end_line(&mut self, counts: &mut Tally) -> Result<(), Why> {
        match self.line {
            Line::Start => self.end_event(counts)?,
            // `data` alone: a data line with an empty value.
            Line::Name { matched } if usize::from(matched) == DATA.len() => {
                self.start_data_line(counts)?;
            }
            _ => {}
        }
        self.line = Line::Start;
        Ok(())
    }

    fn start_data_line(&mut self, counts: &mut Tally) -> Result<(), Why> {
        if self.has_data {
            self.data.feed(b"\n", counts)?;
        }
        self.has_data = true;
        Ok(())
    }

    fn end_event(&mut self, counts: &mut Tally) -> Result<(), Why> {
        if std::mem::take(&mut self.has_data) {
            let mut data = std::mem::replace(&mut self.data, Data::new());
            data.end(counts)?;
        }
        Ok(())
    }
}

/// The bytes before the next line end.
fn line_length(bytes: &[u8]) -> usize {
    memchr2(b'\n', b'\r', bytes).unwrap_or(bytes.len())
}
