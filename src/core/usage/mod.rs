//! What an LLM call used, read from its response as it streams through: the token counts an
//! upstream reports, so a policy can charge what the call cost. Pure: the filter picks the
//! `Format` from the response's content type, hands each body chunk to a `Scanner` as Envoy
//! passes it on (the body is never buffered) and asks for the `Reading` at the end of the stream.
//!
//! **What is read.** A usage object's counts: input (`prompt_tokens`, `input_tokens`,
//! `promptTokenCount`), output (`completion_tokens`, `output_tokens`, `candidatesTokenCount`),
//! total (`total_tokens`, `totalTokenCount`), and the priced kinds of `Count`: Anthropic's
//! `cache_read_input_tokens` and `cache_creation_input_tokens`, Gemini's
//! `cachedContentTokenCount` and `thoughtsTokenCount`, and one level down OpenAI's
//! `cached_tokens` (in `prompt_tokens_details` or `input_tokens_details`) and `reasoning_tokens`
//! (in `completion_tokens_details` or `output_tokens_details`). When the total is absent it is
//! input + output + the counts kept apart from them. Other members are skipped.
//!
//! **From where.** A usage object is the value of `usage` or `usageMetadata` at a document's top
//! level (OpenAI, Anthropic, Gemini, plain JSON) or one level down under `response` (the
//! Responses API's stream events) or `message` (Anthropic's `message_start`). Deeper `usage` keys
//! (tool arguments, nested data) are not usage; keys are compared as written, so a key spelt with
//! escapes matches nothing, and text inside strings is never a key. A document is the JSON body,
//! each object of a top-level JSON array (Gemini's `streamGenerateContent` without `alt=sse`), or
//! in an event stream the data of each event.
//!
//! **The model.** The model a response says served it, for spend budgets (`price`): the string
//! value of `model` in a document, its `response` or its `message` (OpenAI, the Responses API,
//! Anthropic's `message_start`), or of Gemini's `modelVersion` in a document; the last one named
//! wins, kept as written in a fixed buffer (`Model`, at most `MODEL_BYTES`).
//!
//! **What wins.** The last value seen for each count: OpenAI's stream carries `"usage": null` until
//! its last chunk, Anthropic's `message_delta` carries the cumulative `output_tokens` after
//! `message_start`'s first guess. A `null` count is no count.
//!
//! **What is invalid.** A count that is not a whole number from 0 to 10^12 (negative, fractional,
//! with an exponent, larger, a string, a bool, an object); malformed JSON (anywhere in a JSON
//! body; in an event stream, in the data of an event that holds a usage, `marker`: the others are
//! not read); nesting deeper than `MAX_DEPTH`; a body that ends
//! inside a JSON document (the last event of a stream needs no blank line after it, but its data
//! must be complete). Bytes inside strings are not checked (invalid UTF-8 there is skipped);
//! outside strings they must be JSON. Invalid is not the same as `Missing` (well-formed,
//! no count found): the caller counts them apart. Once invalid, the scanner ignores what follows.
//!
//! **Why memory is bounded.** The scanner is a fixed-size `Copy` struct: no heap. It keeps where it
//! stands, not what it read: a bit per level of nesting (64 at most), the first 32 bytes of the
//! key being read (longer keys match none of the names above), the number being read, and in an
//! event stream how much of a line's field name matches `data`. Strings are skipped, not kept: a
//! word at a time, then with `memchr`, to the next quote or backslash.
//!
//! **Compressed bodies.** A `Reader` reads a body whose `content-encoding` is gzip or deflate
//! through a `decode::Decoder`, the decoded bytes fed to the scanner as they come; a coding it
//! cannot undo, or a body that does not decode, is invalid (`decode`).
//!
//! `Meter` turns counts into what a policy charges; `count_from_header` reads a count an upstream
//! sends as a header; `request` reads what an LLM request asks for, and asks a stream to report
//! its usage.

pub mod decode;
mod json;
mod marker;
mod meter;
pub mod price;
pub mod request;
mod sse;
#[cfg(test)]
mod tests;

pub use json::MAX_DEPTH;
pub use meter::{Meter, Weights, MAX_WEIGHT};

use json::{Json, Why};
use sse::EventStream;

/// The largest count read: a million tokens a second for 11 days. Anything larger is a broken
/// upstream, and sums of a few stay far inside u64.
pub const MAX_TOKENS: u64 = 1_000_000_000_000;

/// One of the counts an upstream reports. Which count includes which differs by provider:
/// OpenAI's `prompt_tokens` include its `cached_tokens` and its `completion_tokens` its
/// `reasoning_tokens`; Gemini's `promptTokenCount` includes its `cachedContentTokenCount`, but
/// its `candidatesTokenCount` leaves out its `thoughtsTokenCount`; Anthropic's `input_tokens`
/// leave out both its cache counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    Input,
    Output,
    Total,
    /// Input tokens read from a cache, counted apart from `Input` (Anthropic's
    /// `cache_read_input_tokens`).
    CacheRead,
    /// Input tokens written to a cache, apart from `Input` (Anthropic's
    /// `cache_creation_input_tokens`).
    CacheWrite,
    /// Input tokens read from a cache, among `Input` (OpenAI's `cached_tokens` in
    /// `prompt_tokens_details` or `input_tokens_details`, Gemini's `cachedContentTokenCount`).
    Cached,
    /// Reasoning tokens among `Output` (OpenAI's `reasoning_tokens` in
    /// `completion_tokens_details` or `output_tokens_details`).
    Reasoning,
    /// Reasoning tokens apart from `Output` (Gemini's `thoughtsTokenCount`).
    Thoughts,
}

impl Count {
    /// The count a usage object's member names, in any of the APIs read (the details members
    /// `cached_tokens` and `reasoning_tokens` are read one level down, `json`).
    fn of_usage_key(key: &[u8]) -> Option<Count> {
        match key {
            b"prompt_tokens" | b"input_tokens" | b"promptTokenCount" => Some(Count::Input),
            b"completion_tokens" | b"output_tokens" | b"candidatesTokenCount" => {
                Some(Count::Output)
            }
            b"total_tokens" | b"totalTokenCount" => Some(Count::Total),
            b"cache_read_input_tokens" => Some(Count::CacheRead),
            b"cache_creation_input_tokens" => Some(Count::CacheWrite),
            b"cachedContentTokenCount" => Some(Count::Cached),
            b"thoughtsTokenCount" => Some(Count::Thoughts),
            _ => None,
        }
    }
}

/// The counts a response reported; `None` for those it did not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub input: Option<u64>,
    pub output: Option<u64>,
    pub total: Option<u64>,
    /// The counts of priced kinds (`Count::CacheRead` and on), 0 when not reported.
    pub cache_read: u64,
    pub cache_write: u64,
    pub cached: u64,
    pub reasoning: u64,
    pub thoughts: u64,
    /// The last count came from Anthropic's `message_start`, a first guess at the output that
    /// only a later `message_delta` makes a usage: a stream left before it has no usage.
    pub provisional: bool,
}

impl Counts {
    /// `count`: the total, when not reported, is every token the provider counts if input and
    /// output are reported: input + output, and the counts kept apart from them (Anthropic's
    /// cache reads and writes, Gemini's thoughts).
    pub fn get(&self, count: Count) -> Option<u64> {
        match count {
            Count::Input => self.input,
            Count::Output => self.output,
            Count::Total => self.total.or_else(|| {
                let apart = [self.cache_read, self.cache_write, self.thoughts];
                let sum = self.input?.saturating_add(self.output?);
                Some(apart.iter().fold(sum, |sum, n| sum.saturating_add(*n)))
            }),
            Count::CacheRead => Some(self.cache_read),
            Count::CacheWrite => Some(self.cache_write),
            Count::Cached => Some(self.cached),
            Count::Reasoning => Some(self.reasoning),
            Count::Thoughts => Some(self.thoughts),
        }
    }

    fn set(&mut self, count: Count, value: u64) {
        match count {
            Count::Input => self.input = Some(value),
            Count::Output => self.output = Some(value),
            Count::Total => self.total = Some(value),
            Count::CacheRead => self.cache_read = value,
            Count::CacheWrite => self.cache_write = value,
            Count::Cached => self.cached = value,
            Count::Reasoning => self.reasoning = value,
            Count::Thoughts => self.thoughts = value,
        }
    }

    fn is_empty(&self) -> bool {
        (self.input, self.output, self.total) == (None, None, None)
    }
}

/// The longest name of a model read from a response; a longer one is read as a name that no
/// price matches.
pub const MODEL_BYTES: usize = 96;

/// The model a response says served it, as written (the last one named wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Model {
    bytes: [u8; MODEL_BYTES],
    /// How many bytes of `bytes` are the name; `MODEL_BYTES + 1` once it outgrew them.
    len: u8,
    /// A name was read (a string value of one of the members that name it).
    seen: bool,
}

impl Default for Model {
    fn default() -> Model {
        Model {
            bytes: [0; MODEL_BYTES],
            len: 0,
            seen: false,
        }
    }
}

/// What a response said of its model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served<'a> {
    /// It named none.
    Unnamed,
    /// This one, as written.
    Named(&'a [u8]),
    /// One too long to be read (more than `MODEL_BYTES`), or written with a backslash escape:
    /// a model, but one that no price matches.
    Unreadable,
}

impl Model {
    fn push(&mut self, part: &[u8]) {
        let start = usize::from(self.len);
        let end = start.saturating_add(part.len());
        match self.bytes.get_mut(start..end) {
            Some(slot) => {
                slot.copy_from_slice(part);
                self.len = u8::try_from(end).unwrap_or(u8::MAX);
            }
            None => self.len = u8::MAX,
        }
    }

    /// The model named.
    pub fn served(&self) -> Served<'_> {
        let name = self.bytes.get(..usize::from(self.len));
        match name {
            _ if !self.seen => Served::Unnamed,
            Some(name) if !name.contains(&b'\\') => Served::Named(name),
            _ => Served::Unreadable,
        }
    }
}

/// What a scanner collects as it reads: the counts, and the model the response names.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    counts: Counts,
    model: Model,
}

/// What a response body says it used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// At least one count (the total derived when it can be).
    Found(Counts),
    /// A well-formed body without counts.
    Missing,
    /// Why the body could not be read: for logs and metrics.
    Invalid(&'static str),
}

/// How a response body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One JSON document.
    Json,
    /// Server-sent events (`text/event-stream`), each event's data a JSON document.
    EventStream,
}

impl Format {
    /// The format of a response with this `content-type`: JSON for `application/json` and
    /// `application/*+json`, events for `text/event-stream`; `None` for anything else (an HTML
    /// error page is not worth reading).
    pub fn of_content_type(value: &[u8]) -> Option<Format> {
        let media = value.split(|&b| b == b';').next().unwrap_or_default();
        let media = media.trim_ascii();
        let suffixed_json = media.len() > b"application/+json".len()
            && starts_with_ignoring_case(media, b"application/")
            && ends_with_ignoring_case(media, b"+json");
        if media.eq_ignore_ascii_case(b"text/event-stream") {
            Some(Format::EventStream)
        } else if media.eq_ignore_ascii_case(b"application/json") || suffixed_json {
            Some(Format::Json)
        } else {
            None
        }
    }
}

fn starts_with_ignoring_case(bytes: &[u8], prefix: &[u8]) -> bool {
    let head = bytes.get(..prefix.len());
    head.is_some_and(|head| head.eq_ignore_ascii_case(prefix))
}

fn ends_with_ignoring_case(bytes: &[u8], suffix: &[u8]) -> bool {
    let start = bytes.len().checked_sub(suffix.len());
    let tail = start.and_then(|start| bytes.get(start..));
    tail.is_some_and(|tail| tail.eq_ignore_ascii_case(suffix))
}

/// Reads the usage in a response body fed chunk by chunk, in any chunking.
#[derive(Debug, Clone, Copy)]
pub struct Scanner {
    body: Body,
    tally: Tally,
    failure: Option<Why>,
}

#[derive(Debug, Clone, Copy)]
enum Body {
    Json(Json),
    EventStream(EventStream),
}

impl Scanner {
    pub fn new(format: Format) -> Scanner {
        let body = match format {
            Format::Json => Body::Json(Json::new()),
            Format::EventStream => Body::EventStream(EventStream::new()),
        };
        Scanner {
            body,
            tally: Tally::default(),
            failure: None,
        }
    }

    /// Reads the next bytes of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.failure.is_some() {
            return;
        }
        let fed = match &mut self.body {
            Body::Json(json) => json.feed(chunk, &mut self.tally),
            Body::EventStream(events) => events.feed(chunk, &mut self.tally),
        };
        if let Err(why) = fed {
            self.failure = Some(why);
        }
    }

    /// What the body says, taking what was fed as the whole body.
    pub fn reading(&self) -> Reading {
        let mut at_end = *self;
        match at_end.end() {
            Err(why) => Reading::Invalid(why),
            Ok(()) if at_end.tally.counts.is_empty() || at_end.tally.counts.provisional => {
                Reading::Missing
            }
            Ok(()) => {
                let counts = at_end.tally.counts;
                Reading::Found(Counts {
                    total: counts.get(Count::Total),
                    ..counts
                })
            }
        }
    }

    fn end(&mut self) -> Result<(), Why> {
        if let Some(why) = self.failure {
            return Err(why);
        }
        match &mut self.body {
            Body::Json(json) => json.end(),
            Body::EventStream(events) => events.end(&mut self.tally),
        }
    }

    /// The model the body named so far (the last one named).
    pub fn model(&self) -> Served<'_> {
        self.tally.model.served()
    }
}

/// Reads the usage of a response body in its content coding: the body decoded as it comes
/// (`decode`), and the decoded bytes scanned (`Scanner`), never kept.
#[derive(Debug)]
pub struct Reader {
    scanner: Scanner,
    /// `Err` for a coding sluice cannot undo.
    decoder: Result<decode::Decoder, decode::Unsupported>,
    /// Why the body cannot be read, once known: nothing more is fed then.
    failure: Option<&'static str>,
}

impl Reader {
    /// A reader of a body in `format` whose `content-encoding` is `coding` (`None`: none).
    pub fn new(format: Format, content_encoding: Option<&[u8]>) -> Reader {
        let coding = decode::Coding::of_content_encoding(content_encoding);
        Reader {
            scanner: Scanner::new(format),
            decoder: coding.map(decode::Decoder::new),
            failure: None,
        }
    }

    /// Whether more of the body is worth feeding: false once it cannot be read.
    pub fn reads(&self) -> bool {
        self.failure.is_none() && self.scanner.failure.is_none()
    }

    /// Reads the next bytes of the body. A body in a coding sluice cannot undo is invalid once
    /// a byte of it comes (a response without a body reads as it would without a coding).
    pub fn feed(&mut self, chunk: &[u8]) {
        if !self.reads() || chunk.is_empty() {
            return;
        }
        let scanner = &mut self.scanner;
        let fed = match &mut self.decoder {
            Ok(decoder) => decoder
                .feed(chunk, &mut |bytes| scanner.feed(bytes))
                .map_err(decode::Error::reason),
            Err(decode::Unsupported) => Err("unsupported content-encoding"),
        };
        if let Err(why) = fed {
            self.failure = Some(why);
        }
        if !self.reads() {
            // Frees the inflater.
            self.decoder = Ok(decode::Decoder::new(decode::Coding::Identity));
        }
    }

    /// The model the body named so far.
    pub fn model(&self) -> Served<'_> {
        self.scanner.model()
    }

    /// What the body says, taking what was fed as the whole body.
    pub fn reading(&self) -> Reading {
        if let Some(why) = self.failure {
            return Reading::Invalid(why);
        }
        match self.decoder.as_ref().map(decode::Decoder::finish) {
            Ok(Err(error)) if self.scanner.failure.is_none() => Reading::Invalid(error.reason()),
            _ => self.scanner.reading(),
        }
    }
}

/// A count an upstream sends in a header or trailer (`x-usage-total-tokens: 1234`): ASCII digits,
/// with optional whitespace around them, at most `MAX_TOKENS`.
pub fn count_from_header(value: &[u8]) -> Option<u64> {
    whole_number(value.trim_ascii())
}

/// `digits` as a count: only ASCII digits, at least one, at most `MAX_TOKENS`.
fn whole_number(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits
        .iter()
        .try_fold(0u64, |n, &b| {
            let digit = u64::from(b.checked_sub(b'0').filter(|d| *d <= 9)?);
            n.checked_mul(10)?.checked_add(digit)
        })
        .filter(|&n| n <= MAX_TOKENS)
}
