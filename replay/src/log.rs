//! The access log: JSON lines as `log_format` makes Envoy write them, read from a file or standard
//! input, gzipped or not. A `Parser` turns each line into a `Record`: the request as the filter
//! saw it, as far as the replay reads it (`Wanted`), which the filter's code reads through
//! `RequestSource` as it reads Envoy.
//!
//! A line's fields: `start_time` (RFC 3339; required), `method`, `path`, `authority`,
//! `remote_address` (no port), `route_name`, `headers` (names in any case), `metadata`
//! (dynamic metadata namespaces to objects), `route_metadata` (the selected route's metadata
//! namespaces to objects), `response_code`, `response_code_details`; and for what a request owes
//! its policies until it ends: `duration` (milliseconds), `usage` (what the response's body said
//! it used, `sluice::response::usage_text`), `response_headers` and `response_trailers` (names
//! in any case), `body` (the request body's fields, by name as written) and `max_output_tokens`.
//! Unknown fields are ignored; `null` is an absent value, as Envoy writes one.

use crate::scan::{unescape, Scan, ScanError, Scanner, Text};
use crate::times::StartTimes;
use serde_json::Value;
use sluice::config::{Plan, UsageSource};
use sluice::core::duration::NANOS_PER_SEC;
use sluice::core::request::{Attr, BodyField, RequestSource};
use sluice::core::route::{envoy_list, envoy_map};
use sluice::core::usage::{count_from_header, Served};
use sluice::response::{read_usage_text, BodyUsage};
use smallvec::SmallVec;
use std::borrow::Cow;
use std::fmt;
use std::io::{self, BufRead, BufReader, Read};
use std::ops::Range;

/// A gzip stream starts with these two bytes.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Opens the log at `path` (`-`: standard input), gunzipping it when it is gzip.
pub fn open(path: &str) -> io::Result<Box<dyn BufRead>> {
    let input: Box<dyn Read> = if path == "-" {
        Box::new(io::stdin().lock())
    } else {
        Box::new(std::fs::File::open(path)?)
    };
    let mut reader = BufReader::with_capacity(1 << 16, input);
    if reader.fill_buf()?.starts_with(&GZIP_MAGIC) {
        let gunzipped = flate2::bufread::MultiGzDecoder::new(reader);
        return Ok(Box::new(BufReader::with_capacity(1 << 16, gunzipped)));
    }
    Ok(Box::new(reader))
}

/// Appends the next line of `input` (through its `\n`, if it has one) to `line`, and returns its
/// length, 0 at the end: `BufRead::read_until`, with `memchr`'s vectorised search for the end.
pub fn read_line(input: &mut impl BufRead, line: &mut Vec<u8>) -> io::Result<usize> {
    let mut read = 0;
    loop {
        let available = match input.fill_buf() {
            Ok(available) => available,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let (used, ended) = match memchr::memchr(b'\n', available) {
            Some(end) => (end + 1, true),
            None => (available.len(), available.is_empty()),
        };
        line.extend_from_slice(available.get(..used).unwrap_or_default());
        input.consume(used);
        read += used;
        if ended {
            return Ok(read);
        }
    }
}

/// Why a line was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineError {
    NotJson(String),
    NoStartTime,
    BadStartTime(String),
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            LineError::NotJson(e) => write!(f, "not a JSON object: {e}"),
            LineError::NoStartTime => write!(f, "no start_time"),
            LineError::BadStartTime(e) => write!(f, "start_time: {e}"),
        }
    }
}

/// What a replay keeps of each line: the values its configurations' policies read
/// (`Plan::attrs`) and its reports show. Every line is still read in full and must be what the
/// log format says (a JSON object, text fields strings, `headers` an object of strings), but
/// only these values are copied out of it: a record waiting in the reorder window is a couple
/// of hundred bytes, not its line.
#[derive(Debug, Clone, Default)]
pub struct Wanted {
    /// The text fields kept, by index.
    texts: [bool; TEXTS],
    /// The headers kept, by lower-case name.
    headers: Vec<String>,
    /// The request body's fields kept, by name as written.
    body: Vec<String>,
    /// The response headers and trailers kept, by lower-case name.
    responses: Vec<String>,
    metadata: bool,
    route_metadata: bool,
    /// `duration`, `usage` and `max_output_tokens`.
    duration: bool,
    usage: bool,
    max_output_tokens: bool,
    /// `served_model`, for spend budgets.
    served_model: bool,
}

impl Wanted {
    /// What reading `attrs` takes, and `response_code_details` if `details`.
    pub fn new(attrs: &[Attr], details: bool) -> Wanted {
        let mut wanted = Wanted::default();
        wanted.keep_text(RESPONSE_CODE_DETAILS, details);
        for attr in attrs {
            match attr {
                Attr::Header(name) => wanted.headers.push(name.clone()),
                Attr::Ip => wanted.keep_text(REMOTE_ADDRESS, true),
                Attr::Path => wanted.keep_text(PATH, true),
                Attr::Method => wanted.keep_text(METHOD, true),
                Attr::Authority => wanted.keep_text(AUTHORITY, true),
                Attr::Route => wanted.keep_text(ROUTE_NAME, true),
                Attr::RouteMetadata => wanted.route_metadata = true,
                Attr::Metadata { .. } => wanted.metadata = true,
                Attr::Body(BodyField::String(name)) => wanted.body.push(name.clone()),
                Attr::Body(BodyField::MaxOutputTokens) => wanted.max_output_tokens = true,
            }
        }
        wanted
    }

    /// Also what the requests `plan`'s policies hold until they end take: their duration, and
    /// for token budgets the usage a response's body reported, or the headers and trailers some
    /// policy reads its usage from. And the path, when the plan answers a status path
    /// (`status_path`), whose requests are charged to no policy.
    pub fn settling(mut self, plan: &Plan) -> Wanted {
        self.keep_text(PATH, plan.status_path.is_some());
        let holds = |p: &sluice::config::Policy| p.holds_slots() || p.metered.is_some();
        self.duration |= plan.policies.iter().any(holds);
        for metered in plan.policies.iter().filter_map(|p| p.metered.as_ref()) {
            match &metered.source {
                UsageSource::Body(_) => self.usage = true,
                UsageSource::Priced { .. } => (self.usage, self.served_model) = (true, true),
                UsageSource::Header(name) => self.responses.push(name.clone()),
            }
        }
        self
    }

    fn keep_text(&mut self, field: usize, keep: bool) {
        if let Some(kept) = self.texts.get_mut(field) {
            *kept |= keep;
        }
    }

    fn text(&self, field: usize) -> bool {
        self.texts.get(field).copied().unwrap_or(false)
    }

    /// The names of the values kept of a line's `object`, and whether they are names in any
    /// case (headers, lower-cased) or as written (body fields).
    fn names(&self, object: Named) -> (&[String], bool) {
        match object {
            Named::Header => (&self.headers, true),
            Named::Body => (&self.body, false),
            Named::ResponseHeader | Named::ResponseTrailer => (&self.responses, true),
        }
    }
}

/// Whether `name` is one of `names` (in any case, if `any_case`).
#[inline]
fn is_named(names: &[String], any_case: bool, name: &[u8]) -> bool {
    let same = |wanted: &String| match any_case {
        true => wanted.len() == name.len() && name.eq_ignore_ascii_case(wanted.as_bytes()),
        false => wanted.as_bytes() == name,
    };
    names.iter().any(same)
}

/// How a replay reads its lines: what it keeps of them, and the last second their start times
/// gave.
#[derive(Debug, Default)]
pub struct Parser {
    wanted: Wanted,
    times: StartTimes,
}

impl Parser {
    pub fn new(wanted: Wanted) -> Parser {
        Parser {
            wanted,
            times: StartTimes::default(),
        }
    }

    /// Parses `line`, number `number` of the log, into `record`.
    pub fn parse(
        &mut self,
        line: &[u8],
        number: u64,
        record: &mut Record,
    ) -> Result<(), LineError> {
        record.line = number;
        record.fields.clear();
        let start = record.fields.fill(line, &self.wanted);
        let start = start.map_err(|e| LineError::NotJson(e.to_string()))?;
        let start = start.ok_or(LineError::NoStartTime)?;
        record.time = self.times.parse(&start).map_err(LineError::BadStartTime)?;
        record.response_code = record.fields.response_code;
        Ok(())
    }
}

/// One request of the log: the values of its line that the replay reads (`Wanted`), copied out
/// of it with escapes undone and header names lower-cased. Records are reused: once a replay
/// runs, it allocates nothing per line.
#[derive(Debug, Default, Clone)]
pub struct Record {
    /// The line's number in the log, from 1.
    pub line: u64,
    /// `start_time`, Unix nanoseconds.
    pub time: u64,
    pub response_code: Option<u32>,
    fields: Fields,
}

const NANOS_PER_MS: u64 = NANOS_PER_SEC / 1000;

/// A field of a line, by its name in the log format.
#[derive(Debug, Clone, Copy)]
enum Field {
    StartTime,
    /// A text field, by its index in `Fields::texts`.
    Text(usize),
    /// An object of named values.
    Named(Named),
    Metadata,
    RouteMetadata,
    ResponseCode,
    Duration,
    Usage,
    MaxOutputTokens,
    ServedModel,
}

/// The objects of a line whose members are named values (strings or `null`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Named {
    /// `headers`: the request's, names in any case.
    Header,
    /// `body`: the request body's fields, names as written.
    Body,
    /// `response_headers`, `response_trailers`: names in any case.
    ResponseHeader,
    ResponseTrailer,
}

/// The text fields a record keeps, as indices of `Fields::texts`.
const METHOD: usize = 0;
const PATH: usize = 1;
const AUTHORITY: usize = 2;
const REMOTE_ADDRESS: usize = 3;
const ROUTE_NAME: usize = 4;
const RESPONSE_CODE_DETAILS: usize = 5;
const TEXTS: usize = 6;

/// The field named `name`, if the replay knows it.
fn field(name: &[u8]) -> Option<Field> {
    Some(match name {
        b"start_time" => Field::StartTime,
        b"method" => Field::Text(METHOD),
        b"path" => Field::Text(PATH),
        b"authority" => Field::Text(AUTHORITY),
        b"remote_address" => Field::Text(REMOTE_ADDRESS),
        b"route_name" => Field::Text(ROUTE_NAME),
        b"response_code_details" => Field::Text(RESPONSE_CODE_DETAILS),
        b"headers" => Field::Named(Named::Header),
        b"metadata" => Field::Metadata,
        b"route_metadata" => Field::RouteMetadata,
        b"response_code" => Field::ResponseCode,
        _ => return field_at_the_end(name),
    })
}

/// The fields of what a request holds until it ends: apart, so that the lines of
/// configurations without any are read as fast as before they came.
fn field_at_the_end(name: &[u8]) -> Option<Field> {
    Some(match name {
        b"duration" => Field::Duration,
        b"usage" => Field::Usage,
        b"max_output_tokens" => Field::MaxOutputTokens,
        b"served_model" => Field::ServedModel,
        b"body" => Field::Named(Named::Body),
        b"response_headers" => Field::Named(Named::ResponseHeader),
        b"response_trailers" => Field::Named(Named::ResponseTrailer),
        _ => return None,
    })
}

/// Where a kept value is in `Fields::values`: four-byte offsets keep a record small.
type Span = Range<u32>;

/// Kept values, one after another: inline for the few short ones most configurations read.
type Values = SmallVec<[u8; 48]>;

/// The kept values of a line, and where each is.
#[derive(Debug, Default, Clone)]
struct Fields {
    values: Values,
    /// The text fields, by index.
    texts: [Option<Span>; TEXTS],
    /// Header names, lower-cased, and values.
    headers: SmallVec<[(Span, Span); 2]>,
    /// The `metadata` and `route_metadata` objects' JSON, read when a policy asks for a value
    /// in them.
    metadata: Option<Span>,
    route_metadata: Option<Span>,
    response_code: Option<u32>,
    /// What the line says of the end of its request, when kept: boxed, so that the records of
    /// configurations without policies that hold anything until then stay as small as before
    /// (a record waiting for its turn is a cache miss or more).
    ends: Option<Box<Ends>>,
}

/// What a line says of what its request held until it ended.
#[derive(Debug, Default, Clone)]
struct Ends {
    duration_ms: Option<u64>,
    usage: Option<Span>,
    max_output_tokens: Option<Span>,
    /// The model the response's body said served it (`sluice.model`): empty for one the filter
    /// could not read.
    served_model: Option<Span>,
    /// Body fields (names as written), response headers and trailers (names lower-cased).
    named: SmallVec<[(Named, Span, Span); 2]>,
}

impl Ends {
    fn clear(&mut self) {
        (self.duration_ms, self.usage, self.max_output_tokens) = (None, None, None);
        self.served_model = None;
        self.named.clear();
    }
}

impl Record {
    /// `response_code_details`: why Envoy answered as it did (`sluice_rate_limited`, ...), when
    /// the replay keeps it (`--check`).
    pub fn response_code_details(&self) -> Option<&[u8]> {
        self.text(RESPONSE_CODE_DETAILS)
    }

    /// `route_name`, when the replay keeps it (a policy reads it, or a route may switch the
    /// filter off).
    pub fn route_name(&self) -> Option<&[u8]> {
        self.text(ROUTE_NAME)
    }

    /// `usage`: what the response's body said it used, when the replay keeps it (a policy reads
    /// its usage there) and the line says it the way the filter writes it.
    pub fn usage(&self) -> Option<BodyUsage> {
        let usage = self.fields.ends.as_ref()?.usage.clone();
        self.bytes(&usage).and_then(read_usage_text)
    }

    /// `served_model`: the model the response's body said served it, for a spend budget, when
    /// the replay keeps it; unnamed when the line does not say.
    pub fn served_model(&self) -> Served<'_> {
        let model = self
            .fields
            .ends
            .as_ref()
            .and_then(|e| self.bytes(&e.served_model));
        match model {
            None => Served::Unnamed,
            Some([]) => Served::Unreadable,
            Some(name) => Served::Named(name),
        }
    }

    /// `duration`, in nanoseconds, when the replay keeps it: how long the request took, from its
    /// start to its response's last byte (Envoy's `%DURATION%`, whole milliseconds).
    pub fn duration(&self) -> Option<u64> {
        let ms = self.fields.ends.as_ref()?.duration_ms?;
        Some(ms.saturating_mul(NANOS_PER_MS))
    }

    /// The count of tokens a response reported in the header or trailer `name` (lower case), as
    /// the filter reads it: the trailer's when it has one, else the header's.
    pub fn response_count(&self, name: &str) -> Option<u64> {
        let count = |object| self.named(object, name).and_then(count_from_header);
        count(Named::ResponseTrailer).or_else(|| count(Named::ResponseHeader))
    }

    /// The value named `name` in the line's `object`, when kept.
    fn named(&self, object: Named, name: &str) -> Option<&[u8]> {
        let value = |(n, v): &(Span, Span)| {
            let found = self.bytes(&Some(n.clone())) == Some(name.as_bytes());
            found.then(|| self.bytes(&Some(v.clone()))).flatten()
        };
        if object == Named::Header {
            return self.fields.headers.iter().find_map(value);
        }
        let ends = self.fields.ends.as_ref()?;
        let mut named = ends.named.iter().filter(|(o, ..)| *o == object);
        named.find_map(|(_, n, v)| value(&(n.clone(), v.clone())))
    }

    fn bytes(&self, span: &Option<Span>) -> Option<&[u8]> {
        let span = span.as_ref()?;
        self.fields
            .values
            .get(span.start as usize..span.end as usize)
    }

    /// A text field's value.
    fn text(&self, field: usize) -> Option<&[u8]> {
        self.bytes(self.fields.texts.get(field)?)
    }

    /// A value in metadata (the request's dynamic metadata, or the route's): `namespace` then a
    /// path of keys into its object.
    fn metadata_value(
        &self,
        metadata: &Option<Span>,
        namespace: &str,
        path: &[&str],
    ) -> Option<Vec<u8>> {
        let text = std::str::from_utf8(self.bytes(metadata)?).ok()?;
        let namespaces: Value = serde_json::from_str(text).ok()?;
        let mut value = namespaces.get(namespace)?;
        for key in path {
            value = value.get(key)?;
        }
        property_bytes(value)
    }
}

impl Fields {
    /// Forgets the previous line, keeping the buffers.
    fn clear(&mut self) {
        self.values.clear();
        self.headers.clear();
        self.texts = Default::default();
        (self.metadata, self.route_metadata, self.response_code) = (None, None, None);
        if let Some(ends) = &mut self.ends {
            ends.clear();
        }
    }

    /// Reads the JSON object `line`, keeping the `wanted` values; returns the text of its
    /// `start_time`.
    fn fill<'l>(&mut self, line: &'l [u8], wanted: &Wanted) -> Scan<Option<Cow<'l, [u8]>>> {
        let mut start = None;
        let mut scanner = Scanner::new(line);
        let mut key_scratch = Vec::new();
        scanner.object(&mut key_scratch, |s, key| match field(key.text) {
            Some(Field::StartTime) => {
                start = s.string_or_null()?.map(|t| text_of(line, &t)).transpose()?;
                Ok(())
            }
            Some(Field::Text(index)) => {
                let kept = match s.string_or_null()? {
                    Some(text) => self.keep(line, text, wanted.text(index))?,
                    None => None,
                };
                if let Some(slot) = self.texts.get_mut(index) {
                    *slot = kept;
                }
                Ok(())
            }
            Some(Field::Named(object)) => self.named(line, s, wanted, object),
            Some(Field::Metadata) => {
                self.metadata = self.keep_json(line, s.raw_value()?, wanted.metadata)?;
                Ok(())
            }
            Some(Field::RouteMetadata) => {
                self.route_metadata =
                    self.keep_json(line, s.raw_value()?, wanted.route_metadata)?;
                Ok(())
            }
            Some(Field::ResponseCode) => {
                let code = s.code()?.and_then(|c| u32::try_from(c).ok());
                self.response_code = code.filter(|&c| c > 0);
                Ok(())
            }
            Some(Field::Duration) => {
                let ms = s.code()?;
                if wanted.duration {
                    self.ends().duration_ms = ms;
                }
                Ok(())
            }
            Some(Field::Usage) => {
                if let Some(kept) = self.string(line, s, wanted.usage)? {
                    self.ends().usage = Some(kept);
                }
                Ok(())
            }
            Some(Field::MaxOutputTokens) => {
                if let Some(kept) = self.string(line, s, wanted.max_output_tokens)? {
                    self.ends().max_output_tokens = Some(kept);
                }
                Ok(())
            }
            Some(Field::ServedModel) => {
                if let Some(kept) = self.string(line, s, wanted.served_model)? {
                    self.ends().served_model = Some(kept);
                }
                Ok(())
            }
            None => s.skip(),
        })?;
        scanner.end()?;
        Ok(start)
    }

    /// An object of named values (`headers`...): the wanted ones kept, header names
    /// lower-cased, `null` values left out.
    fn named(&mut self, line: &[u8], s: &mut Scanner, wanted: &Wanted, object: Named) -> Scan<()> {
        if s.null()? {
            return Ok(());
        }
        let mut name_scratch = Vec::new();
        let (names, any_case) = wanted.names(object);
        s.object(&mut name_scratch, |s, name| {
            let Some(value) = s.string_or_null()? else {
                return Ok(());
            };
            if !is_named(names, any_case, name.text) {
                return self.keep(line, value, false).map(drop);
            }
            let name = if any_case && name.text.iter().any(u8::is_ascii_uppercase) {
                let lower = name.text.iter().map(u8::to_ascii_lowercase);
                self.keep_bytes(|values| values.extend(lower))?
            } else {
                self.keep_bytes(|values| values.extend_from_slice(name.text))?
            };
            if let Some(value) = self.keep(line, value, true)? {
                match object {
                    Named::Header => self.headers.push((name, value)),
                    _ => self.ends().named.push((object, name, value)),
                }
            }
            Ok(())
        })
    }

    /// Where what the line says of its request's end goes.
    fn ends(&mut self) -> &mut Ends {
        self.ends.get_or_insert_with(Box::default)
    }

    /// A string value (or `null`), kept if `wanted`.
    fn string(&mut self, line: &[u8], s: &mut Scanner, wanted: bool) -> Scan<Option<Span>> {
        match s.string_or_null()? {
            Some(text) => self.keep(line, text, wanted),
            None => Ok(None),
        }
    }

    /// Keeps a string value's text, escapes undone, if `wanted`; either way, a bad escape is an
    /// error.
    #[inline]
    fn keep(&mut self, line: &[u8], text: Text, wanted: bool) -> Scan<Option<Span>> {
        if !wanted && !text.escaped {
            return Ok(None);
        }
        self.copy(line, text, wanted)
    }

    /// `keep`, for a value that is wanted or has escapes to check.
    fn copy(&mut self, line: &[u8], text: Text, wanted: bool) -> Scan<Option<Span>> {
        match (wanted, text.escaped) {
            (false, _) => text_of(line, &text).map(|_| None),
            (true, false) => {
                let raw = line.get(text.raw).unwrap_or_default();
                self.keep_bytes(|values| values.extend_from_slice(raw))
                    .map(Some)
            }
            (true, true) => {
                let raw = line.get(text.raw.clone()).unwrap_or_default();
                let mut unescaped = Ok(());
                let span = self.keep_bytes(|values| unescaped = unescape(raw, values))?;
                unescaped.map_err(|at| bad_escape(&text, at))?;
                Ok(Some(span))
            }
        }
    }

    /// Keeps a JSON value's text, if `wanted`.
    #[inline]
    fn keep_json(&mut self, line: &[u8], json: Range<usize>, wanted: bool) -> Scan<Option<Span>> {
        if !wanted {
            return Ok(None);
        }
        let raw = line.get(json).unwrap_or_default();
        self.keep_bytes(|values| values.extend_from_slice(raw))
            .map(Some)
    }

    /// Appends a value with `append`, and returns its place.
    fn keep_bytes(&mut self, append: impl FnOnce(&mut Values)) -> Scan<Span> {
        let start = self.values.len();
        append(&mut self.values);
        span(start, self.values.len(), start)
    }
}

/// A string value's text: as it is in the line, or unescaped.
fn text_of<'l>(line: &'l [u8], text: &Text) -> Scan<Cow<'l, [u8]>> {
    let raw = line.get(text.raw.clone()).unwrap_or_default();
    if !text.escaped {
        return Ok(Cow::Borrowed(raw));
    }
    let mut unescaped = Vec::new();
    unescape(raw, &mut unescaped).map_err(|at| bad_escape(text, at))?;
    Ok(Cow::Owned(unescaped))
}

fn bad_escape(text: &Text, at: usize) -> ScanError {
    ScanError {
        at: text.raw.start + at,
        expected: "a valid escape",
    }
}

/// A kept value's place, if the kept values are under 4 GiB (`at`: where in the line it was).
fn span(start: usize, end: usize, at: usize) -> Scan<Span> {
    match (u32::try_from(start), u32::try_from(end)) {
        (Ok(start), Ok(end)) => Ok(start..end),
        _ => Err(ScanError {
            at,
            expected: "values under 4 GiB",
        }),
    }
}

/// A metadata value as Envoy hands it to the filter: a string as its bytes, a number (a protobuf
/// `Value` holds doubles) as 8 little-endian bytes, a bool as one byte, an object as Envoy's
/// serialized map of its entries, a list as that of its items as keys (`sluice::core::route`).
fn property_bytes(value: &Value) -> Option<Vec<u8>> {
    Some(match value {
        Value::Null => return None,
        Value::String(s) => s.as_bytes().to_vec(),
        Value::Number(n) => n.as_f64()?.to_le_bytes().to_vec(),
        Value::Bool(b) => vec![u8::from(*b)],
        Value::Object(entries) => {
            let entries: Vec<(&[u8], Vec<u8>)> = entries
                .iter()
                .map(|(k, v)| (k.as_bytes(), property_bytes(v).unwrap_or_default()))
                .collect();
            let entries: Vec<(&[u8], &[u8])> = entries.iter().map(|(k, v)| (*k, &v[..])).collect();
            envoy_map(&entries)
        }
        Value::Array(items) => {
            let items: Vec<Vec<u8>> = items
                .iter()
                .map(|i| property_bytes(i).unwrap_or_default())
                .collect();
            envoy_list(&items)
        }
    })
}

impl RequestSource for Record {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        let value = match name {
            ":method" => self.text(METHOD),
            ":path" => self.text(PATH),
            ":authority" => self.text(AUTHORITY),
            _ => self.named(Named::Header, name),
        };
        value.map(<[u8]>::to_vec)
    }

    /// What the filter read of the request's body, as its access log recorded it.
    fn body_field(&self, field: &BodyField) -> Option<Vec<u8>> {
        let value = match field {
            BodyField::String(name) => self.named(Named::Body, name),
            BodyField::MaxOutputTokens => {
                let ends = self.fields.ends.as_ref()?;
                self.bytes(&ends.max_output_tokens)
            }
        };
        value.map(<[u8]>::to_vec)
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        match path {
            ["source", "address"] => self.text(REMOTE_ADDRESS).map(<[u8]>::to_vec),
            ["xds", "route_name"] => self.text(ROUTE_NAME).map(<[u8]>::to_vec),
            ["metadata", "filter_metadata", namespace, keys @ ..] => {
                self.metadata_value(&self.fields.metadata, namespace, keys)
            }
            ["xds", "route_metadata", "filter_metadata", namespace, keys @ ..] => {
                self.metadata_value(&self.fields.route_metadata, namespace, keys)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Every value the tests read kept.
    fn everything() -> Wanted {
        let headers = ["x-user-id", "x-plan", "x-other", "k"].map(|h| Attr::Header(h.into()));
        let metadata = Attr::Metadata {
            namespace: "acme".into(),
            path: vec!["sub".into()],
        };
        let fields = [
            Attr::Method,
            Attr::Path,
            Attr::Authority,
            Attr::Ip,
            Attr::Route,
        ];
        let mut attrs: Vec<Attr> = headers.into_iter().chain(fields).collect();
        attrs.extend([Attr::RouteMetadata, metadata]);
        Wanted::new(&attrs, true)
    }

    fn record(line: &str) -> Result<Record, LineError> {
        parsed(line, everything())
    }

    fn parsed(line: &str, wanted: Wanted) -> Result<Record, LineError> {
        let mut record = Record::default();
        let parsed = Parser::new(wanted).parse(line.as_bytes(), 7, &mut record);
        parsed.map(|()| record)
    }

    fn text(value: Option<Vec<u8>>) -> Option<String> {
        value.map(|v| String::from_utf8(v).unwrap())
    }

    const LINE: &str = r#"{"start_time":"2026-11-30T17:44:57.603878Z","method":"GET","path":"/api/x?q=1","authority":"api.example.com","remote_address":"10.0.0.7","route_name":"api","headers":{"X-User-Id":"alice","x-plan":null},"metadata":{"acme":{"sub":"u1","n":2,"ok":true}},"response_code":429,"bytes":17}"#;

    #[test]
    fn a_line_gives_the_request_as_the_filter_reads_it() {
        let r = record(LINE).unwrap();
        assert_eq!((r.line, r.response_code), (7, Some(429)));
        assert_eq!(r.time, 1_796_060_697_603_878_000);
        assert_eq!(text(r.header(":method")).as_deref(), Some("GET"));
        assert_eq!(text(r.header(":path")).as_deref(), Some("/api/x?q=1"));
        assert_eq!(
            text(r.header(":authority")).as_deref(),
            Some("api.example.com")
        );
        assert_eq!(
            text(r.property(&["source", "address"])).as_deref(),
            Some("10.0.0.7")
        );
        assert_eq!(
            text(r.property(&["xds", "route_name"])).as_deref(),
            Some("api")
        );
        let sub = r.property(&["metadata", "filter_metadata", "acme", "sub"]);
        assert_eq!(text(sub).as_deref(), Some("u1"));
        let n = r.property(&["metadata", "filter_metadata", "acme", "n"]);
        assert_eq!(n, Some(2f64.to_le_bytes().to_vec()));
        let ok = r.property(&["metadata", "filter_metadata", "acme", "ok"]);
        assert_eq!(ok, Some(vec![1]));
        assert_eq!(
            r.property(&["metadata", "filter_metadata", "other", "sub"]),
            None
        );
    }

    #[test]
    fn route_metadata_reads_as_envoy_serializes_it() {
        let r = record(r#"{"start_time":"2026-11-30T17:44:57Z","route_metadata":{"sluice":{"policies":["a","b"],"disabled":true}}}"#).unwrap();
        let sluice = r.property(&["xds", "route_metadata", "filter_metadata", "sluice"]);
        let list = envoy_list(&["a", "b"]);
        let expected = envoy_map(&[(b"disabled", &[1]), (b"policies", &list)]);
        assert_eq!(sluice, Some(expected));
    }

    #[test]
    fn what_a_request_holds_until_it_ends_is_read_as_the_filter_wrote_it() {
        let config = r#"{"policies": [{"name": "llm", "key": ["body:model", "body:Team"],
            "requests": 1000, "per": "1h", "cost": {"from_response": {"usage": "total_tokens"},
            "reserve": {"request": "max_tokens", "default": 5}}},
            {"name": "h", "key": ["body:model"], "requests": 1000, "per": "1h",
            "cost": {"from_response": {"header": "x-usage"}}}]}"#;
        let plan = sluice::config::parse(config.as_bytes()).unwrap();
        let wanted = Wanted::new(&plan.attrs, false).settling(&plan);
        let line = r#"{"start_time":"2026-11-30T17:44:57Z","duration":1234,"usage":"input=3 total=9","body":{"model":"gpt-4o","team":"lower","Team":"a"},"max_output_tokens":"300","response_headers":{"X-Usage":"17"},"response_trailers":{"x-usage":null}}"#;
        let r = parsed(line, wanted).unwrap();
        assert_eq!(r.duration(), Some(1_234_000_000));
        let counts = sluice::core::usage::Counts {
            input: Some(3),
            output: None,
            total: Some(9),
            ..Default::default()
        };
        assert_eq!(r.usage(), Some(Ok(counts)));
        let model = r.body_field(&BodyField::String("model".into()));
        assert_eq!(text(model).as_deref(), Some("gpt-4o"));
        let team = r.body_field(&BodyField::String("Team".into()));
        assert_eq!(
            text(team).as_deref(),
            Some("a"),
            "body fields are named as written"
        );
        let asked = r.body_field(&BodyField::MaxOutputTokens);
        assert_eq!(text(asked).as_deref(), Some("300"));
        assert_eq!(r.response_count("x-usage"), Some(17));
        let r = record(
            r#"{"start_time":"2026-11-30T17:44:57Z","duration":"7","usage":"unknown=reset"}"#,
        );
        let r = r.unwrap();
        assert_eq!(r.duration(), None, "not kept either");
        assert_eq!(r.usage(), None, "not kept: no policy here reads it");
    }

    #[test]
    fn a_spend_budget_reads_the_model_the_response_named() {
        let config = r#"{"policies": [{"name": "spend", "key": ["global"], "requests": 9,
            "per": "1h", "cost": {"price": {"m*": {"input": 1, "output": 1}}}}]}"#;
        let plan = sluice::config::parse(config.as_bytes()).unwrap();
        let wanted = Wanted::new(&plan.attrs, false).settling(&plan);
        let served = |model: &str| {
            let line = format!(r#"{{"start_time":"2026-11-30T17:44:57Z","served_model":{model}}}"#);
            let r = parsed(&line, wanted.clone()).unwrap();
            format!("{:?}", r.served_model())
        };
        assert_eq!(served("\"m-1\""), format!("{:?}", Served::Named(b"m-1")));
        assert_eq!(served("\"\""), "Unreadable");
        assert_eq!(served("null"), "Unnamed");
    }

    #[test]
    fn a_trailers_count_wins_over_the_headers_as_in_the_filter() {
        let config = r#"{"policies": [{"name": "h", "key": ["global"], "requests": 9, "per": "1h",
            "cost": {"from_response": {"header": "x-usage"}}}]}"#;
        let plan = sluice::config::parse(config.as_bytes()).unwrap();
        let wanted = Wanted::new(&plan.attrs, false).settling(&plan);
        let line = |header: &str, trailer: &str| {
            format!(
                r#"{{"start_time":"2026-11-30T17:44:57Z","response_headers":{{"x-usage":{header}}},"response_trailers":{{"x-usage":{trailer}}}}}"#
            )
        };
        let count = |header, trailer| {
            parsed(&line(header, trailer), wanted.clone())
                .unwrap()
                .response_count("x-usage")
        };
        assert_eq!(count(r#""5""#, r#""8""#), Some(8));
        assert_eq!(count(r#""5""#, r#""many""#), Some(5));
        assert_eq!(count("null", "null"), None);
    }

    #[test]
    fn header_names_match_in_any_case_and_null_is_absent() {
        let r = record(LINE).unwrap();
        assert_eq!(text(r.header("x-user-id")).as_deref(), Some("alice"));
        assert_eq!(r.header("x-plan"), None);
        assert_eq!(r.header("x-other"), None);
    }

    #[test]
    fn only_start_time_is_required_and_escapes_are_read() {
        let r = record(r#"{"start_time":"2026-11-30T17:44:57Z","headers":{"k":"a\"b"}}"#).unwrap();
        assert_eq!(text(r.header("k")).as_deref(), Some("a\"b"));
        assert_eq!((r.header(":path"), r.response_code), (None, None));
        let r = record(r#"{"start_time":"2026-11-30T17:44:57Z","response_code":"503"}"#).unwrap();
        assert_eq!(r.response_code, Some(503));
        let r = record(r#"{"start_time":"2026-11-30T17:44:57Z","response_code":0}"#).unwrap();
        assert_eq!(r.response_code, None, "0: Envoy sent no response");
    }

    #[test]
    fn bad_lines_say_why() {
        assert!(matches!(record("GET /api"), Err(LineError::NotJson(_))));
        assert!(matches!(record("[1]"), Err(LineError::NotJson(_))));
        assert_eq!(
            record(r#"{"method":"GET"}"#).unwrap_err(),
            LineError::NoStartTime
        );
        assert!(matches!(
            record(r#"{"start_time":"yesterday"}"#),
            Err(LineError::BadStartTime(_))
        ));
        let error = record(r#"{"start_time":"2026-11-30T17:44:57Z","headers":[1]}"#);
        assert!(matches!(error, Err(LineError::NotJson(_))), "{error:?}");
    }

    #[test]
    fn only_the_values_wanted_are_kept_yet_every_field_is_checked() {
        let per_user = Wanted::new(&[Attr::Header("x-user-id".into())], false);
        let r = parsed(LINE, per_user.clone()).unwrap();
        assert_eq!(text(r.header("x-user-id")).as_deref(), Some("alice"));
        assert_eq!(
            (r.header(":path"), r.property(&["xds", "route_name"])),
            (None, None)
        );
        assert_eq!(
            (r.response_code, r.response_code_details()),
            (Some(429), None)
        );
        for bad in [
            r#"{"start_time":"2026-11-30T17:44:57Z","path":7}"#,
            r#"{"start_time":"2026-11-30T17:44:57Z","path":"/a\q"}"#,
            r#"{"start_time":"2026-11-30T17:44:57Z","headers":{"x-plan":"\q"}}"#,
            r#"{"start_time":"2026-11-30T17:44:57Z","headers":{"x-plan":1}}"#,
        ] {
            assert!(
                matches!(parsed(bad, per_user.clone()), Err(LineError::NotJson(_))),
                "{bad}"
            );
            assert!(matches!(record(bad), Err(LineError::NotJson(_))), "{bad}");
        }
    }

    #[test]
    fn a_reused_record_forgets_the_previous_line() {
        let mut parser = Parser::new(everything());
        let mut r = Record::default();
        parser.parse(LINE.as_bytes(), 7, &mut r).unwrap();
        let next = br#"{"start_time":"2026-11-30T17:44:58Z"}"#;
        parser.parse(next, 8, &mut r).unwrap();
        assert_eq!(
            (r.line, r.header("x-user-id"), r.response_code),
            (8, None, None)
        );
    }

    #[test]
    fn an_escaped_start_time_and_header_name_are_read() {
        let r = record(r#"{"start_time":"2026-11-30T17:44:57\u002e5Z","headers":{"X-Us\u0065r-Id":"a\u00e9"}}"#).unwrap();
        assert_eq!(r.time, 1_796_060_697_500_000_000);
        assert_eq!(text(r.header("x-user-id")).as_deref(), Some("a\u{e9}"));
    }

    #[test]
    fn lines_are_read_as_read_until_reads_them_across_buffer_boundaries() {
        let text = b"{\"a\":1}\n\n{\"b\":2}\r\nlast without an end";
        for capacity in [1, 2, 3, 7, 64] {
            let mut ours = io::BufReader::with_capacity(capacity, &text[..]);
            let mut std = &text[..];
            loop {
                let (mut a, mut b) = (Vec::new(), Vec::new());
                let read = read_line(&mut ours, &mut a).unwrap();
                assert_eq!(read, std.read_until(b'\n', &mut b).unwrap());
                assert_eq!(a, b, "capacity {capacity}");
                if read == 0 {
                    break;
                }
            }
        }
    }

    #[test]
    fn gzip_is_read_as_plain_text() {
        let dir = std::env::temp_dir().join(format!("sluice-replay-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (plain, gzipped) = (dir.join("a.log"), dir.join("a.log.gz"));
        std::fs::write(&plain, format!("{LINE}\n{LINE}\n")).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(format!("{LINE}\n{LINE}\n").as_bytes())
            .unwrap();
        std::fs::write(&gzipped, gz.finish().unwrap()).unwrap();
        for path in [&plain, &gzipped] {
            let lines: Vec<String> = open(path.to_str().unwrap())
                .unwrap()
                .lines()
                .map(Result::unwrap)
                .collect();
            assert_eq!(lines, [LINE, LINE], "{}", path.display());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
