//! Server-sent events, framed as the HTML standard says: lines of `field: value` ending in `\n`,
//! `\r\n` or `\r`; a blank line ends an event; `:` starts a comment; the `data` lines of an event
//! are joined by `\n`; other fields (`event`, `id`, `retry`) are ignored. The data bytes go
//! straight to the event's JSON reader as they arrive: nothing is held but where the current
//! line stands and which of the 6 bytes of `[DONE]` the data has matched so far.
//!
//! The last event needs no blank line after it (a stream may close after its last data line),
//! but its data must be complete.
//!
//! Only an event whose data holds a usage that may have counts can carry one (`marker`), so
//! only such an event is read and checked: the events of a chunk before the first one that
//! holds one are skipped unread, to the last blank line `\n\n` before it, and an event that is
//! read (cut by the chunk's end, or after it) is never held against the stream without one. The
//! one rule in every chunking: nearly all of a long stream's events are text deltas, passed over
//! in one search at `memchr`'s pace.

use memchr::{memchr2, memrchr};

use super::json::{is_whitespace, Ending, Json, Why};
use super::marker::{self, Marker};
use super::{Model, Tally};

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
    /// Whether the data holds a usage that may have counts, as far as read.
    marker: Marker,
    /// Why the data is not a document, found before its end.
    broken: Option<Why>,
    /// The model named before this event, put back at its end if it holds no usage: a served
    /// model is read from the events that carry a usage alone, as only they are read in every
    /// chunking (each API names it there too).
    model_before: Option<Model>,
}

impl Data {
    fn new() -> Data {
        Data {
            done: Some(0),
            json: Json::new(),
            marker: Marker::default(),
            broken: None,
            model_before: None,
        }
    }

    /// The next bytes of the data: looked at for a usage, and read until they break.
    fn feed(&mut self, bytes: &[u8], counts: &mut Tally) -> Result<(), Why> {
        self.model_before.get_or_insert(counts.model);
        self.marker.feed(bytes);
        if self.broken.is_none() {
            self.broken = self.read(bytes, counts).err();
        }
        Ok(())
    }

    fn read(&mut self, bytes: &[u8], counts: &mut Tally) -> Result<(), Why> {
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

    /// Checks the data is `[DONE]`, a complete JSON document, or nothing, if it holds a usage.
    fn end(&mut self, counts: &mut Tally) -> Result<(), Why> {
        let checked = self.broken.map_or_else(|| self.finish(counts), Err);
        if self.marker.holds_usage() {
            return checked;
        }
        if let Some(model) = self.model_before {
            counts.model = model;
        }
        Ok(())
    }

    fn finish(&mut self, counts: &mut Tally) -> Result<(), Why> {
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
            if self.line == Line::Start && !self.has_data && !self.after_cr {
                if let Some(skipped) = skippable(rest) {
                    rest = skipped;
                    continue;
                }
            }
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

/// What follows the events `rest` starts with that end within it before the first usage that
/// may have counts (`marker`: a usage in their other lines is taken as one too), if there are
/// any: their data is not read.
fn skippable(rest: &[u8]) -> Option<&[u8]> {
    let before = rest.get(..marker::first_usage(rest).unwrap_or(rest.len()))?;
    rest.get(after_last_blank_line(before)?..)
}

/// Where the last blank line that follows a `\n` in `bytes` ends: the end of an event.
fn after_last_blank_line(bytes: &[u8]) -> Option<usize> {
    let mut end = bytes.len();
    loop {
        let at = memrchr(b'\n', bytes.get(..end)?)?;
        if at > 0 && bytes.get(at - 1) == Some(&b'\n') {
            return Some(at + 1);
        }
        end = at;
    }
}

/// The bytes before the next line end.
fn line_length(bytes: &[u8]) -> usize {
    memchr2(b'\n', b'\r', bytes).unwrap_or(bytes.len())
}
