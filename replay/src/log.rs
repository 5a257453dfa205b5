//! The access log: JSON lines as `log_format` makes Envoy write them, read from a file or standard
//! input, gzipped or not. Each line becomes a `Record`: the request as the filter saw it, which
//! the filter's code reads through `RequestSource` as it reads Envoy.
//!
//! A line's fields: `start_time` (RFC 3339; required), `method`, `path`, `authority`,
//! `remote_address` (no port), `route_name`, `headers` (names in any case), `metadata`
//! (dynamic metadata namespaces to objects), `route_metadata` (the selected route's metadata
//! namespaces to objects), `response_code`, `response_code_details`. Unknown fields are ignored; `null`
//! is an absent value, as Envoy writes one.

use crate::scan::{unescape, Key, ScanError, Scanner, Text};
use crate::times::StartTimes;
use serde_json::Value;
use sluice::request::RequestSource;
use sluice::route::{envoy_list, envoy_map};
use smallvec::SmallVec;
use std::fmt;
use std::io::{self, BufRead, BufReader, Read};
use std::mem::take;
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

/// One request of the log. Its line is read into its own buffer and its values are found there,
/// not copied: a replay allocates nothing per line once it runs, and records are reused.
#[derive(Debug, Default, Clone)]
pub struct Record {
    /// The line's number in the log, from 1.
    pub line: u64,
    /// `start_time`, Unix nanoseconds.
    pub time: u64,
    pub response_code: Option<u32>,
    /// The line as read, then the values that had escapes, unescaped (and header names that
    /// had upper case, lower-cased).
    text: Vec<u8>,
    fields: Fields,
}

/// The line's text fields, as indices of `Fields::texts`.
const START_TIME: usize = 0;
const METHOD: usize = 1;
const PATH: usize = 2;
const AUTHORITY: usize = 3;
const REMOTE_ADDRESS: usize = 4;
const ROUTE_NAME: usize = 5;
const RESPONSE_CODE_DETAILS: usize = 6;
const TEXTS: usize = 7;

/// The index of the text field named `name`.
fn text_field(name: &[u8]) -> Option<usize> {
    Some(match name {
        b"start_time" => START_TIME,
        b"method" => METHOD,
        b"path" => PATH,
        b"authority" => AUTHORITY,
        b"remote_address" => REMOTE_ADDRESS,
        b"route_name" => ROUTE_NAME,
        b"response_code_details" => RESPONSE_CODE_DETAILS,
        _ => return None,
    })
}

/// Where a line's values are in the record's text.
#[derive(Debug, Default, Clone)]
struct Fields {
    /// The text fields, by `Text` index.
    texts: [Option<Range<usize>>; TEXTS],
    /// Header names, lower-cased, and values.
    headers: SmallVec<[(Range<usize>, Range<usize>); 6]>,
    /// The `metadata` and `route_metadata` objects' JSON, read when a policy asks for a value
    /// in them.
    metadata: Option<Range<usize>>,
    route_metadata: Option<Range<usize>>,
    response_code: Option<u32>,
    /// Values that could not be borrowed from the line, to go after it...
    copied: Vec<u8>,
    /// ...which is this long.
    line_len: usize,
}

impl Record {
    /// The buffer to read the next line into, emptied.
    pub fn buffer(&mut self) -> &mut Vec<u8> {
        self.text.clear();
        &mut self.text
    }

    /// Whether the line in the buffer is blank.
    pub fn is_blank(&self) -> bool {
        self.text.trim_ascii().is_empty()
    }

    /// Parses the line in the buffer, number `number`, its start time through `times`.
    pub fn parse(&mut self, number: u64, times: &mut StartTimes) -> Result<(), LineError> {
        self.line = number;
        self.fields.clear();
        let scanned = self.fields.fill(&self.text);
        self.text.extend_from_slice(&self.fields.copied);
        scanned.map_err(|e| LineError::NotJson(e.to_string()))?;
        let start = self.text(START_TIME).ok_or(LineError::NoStartTime)?;
        self.time = times.parse(start).map_err(LineError::BadStartTime)?;
        self.response_code = self.fields.response_code;
        Ok(())
    }

    fn bytes(&self, range: &Option<Range<usize>>) -> Option<&[u8]> {
        range.as_ref().and_then(|r| self.text.get(r.clone()))
    }

    /// `response_code_details`: why Envoy answered as it did (`sluice_rate_limited`, ...).
    pub fn response_code_details(&self) -> Option<&[u8]> {
        self.text(RESPONSE_CODE_DETAILS)
    }

    /// A text field's value.
    fn text(&self, field: usize) -> Option<&[u8]> {
        self.bytes(self.fields.texts.get(field)?)
    }

    /// A value in metadata (the request's dynamic metadata, or the route's): `namespace` then a
    /// path of keys into its object.
    fn metadata_value(
        &self,
        metadata: &Option<Range<usize>>,
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
    fn clear(&mut self) {
        let (mut headers, mut copied) = (take(&mut self.headers), take(&mut self.copied));
        headers.clear();
        copied.clear();
        *self = Fields {
            headers,
            copied,
            ..Fields::default()
        };
    }

    /// Finds the values of the JSON object `line`.
    fn fill(&mut self, line: &[u8]) -> Result<(), ScanError> {
        self.line_len = line.len();
        let mut scanner = Scanner::new(line);
        let mut key_scratch = Vec::new();
        scanner.object(&mut key_scratch, |s, key| match key.text {
            b"headers" => self.headers(line, s),
            b"metadata" => {
                self.metadata = Some(s.raw_value()?);
                Ok(())
            }
            b"route_metadata" => {
                self.route_metadata = Some(s.raw_value()?);
                Ok(())
            }
            b"response_code" => {
                let code = s.code()?.and_then(|c| u32::try_from(c).ok());
                self.response_code = code.filter(|&c| c > 0);
                Ok(())
            }
            name => {
                let Some(field) = text_field(name) else {
                    return s.skip();
                };
                let text = s.string_or_null()?;
                let range = text.map(|t| self.place(line, t)).transpose()?;
                if let Some(slot) = self.texts.get_mut(field) {
                    *slot = range;
                }
                Ok(())
            }
        })?;
        scanner.end()
    }

    /// The `headers` object: names lower-cased, `null` values left out.
    fn headers(&mut self, line: &[u8], s: &mut Scanner) -> Result<(), ScanError> {
        if s.null()? {
            return Ok(());
        }
        let mut name_scratch = Vec::new();
        s.object(&mut name_scratch, |s, name| {
            if let Some(value) = s.string_or_null()? {
                let name = self.place_name(name);
                let value = self.place(line, value)?;
                self.headers.push((name, value));
            }
            Ok(())
        })
    }

    /// Where a string's text is: in the line when it has no escapes, else unescaped after it.
    fn place(&mut self, line: &[u8], text: Text) -> Result<Range<usize>, ScanError> {
        if !text.escaped {
            return Ok(text.raw);
        }
        let start = self.line_len + self.copied.len();
        let raw = line.get(text.raw.clone()).unwrap_or_default();
        unescape(raw, &mut self.copied).map_err(|at| ScanError {
            at: text.raw.start + at,
            expected: "a valid escape",
        })?;
        Ok(start..self.line_len + self.copied.len())
    }

    /// Where a header name is, lower-cased: in the line when it already is, else after it.
    fn place_name(&mut self, name: Key) -> Range<usize> {
        match name.in_line {
            Some(range) if !name.text.iter().any(u8::is_ascii_uppercase) => range,
            _ => {
                let start = self.line_len + self.copied.len();
                self.copied
                    .extend(name.text.iter().map(u8::to_ascii_lowercase));
                start..self.line_len + self.copied.len()
            }
        }
    }
}

/// A metadata value as Envoy hands it to the filter: a string as its bytes, a number (a protobuf
/// `Value` holds doubles) as 8 little-endian bytes, a bool as one byte, an object as Envoy's
/// serialized map of its entries, a list as that of its items as keys (`sluice::route`).
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
            _ => self.fields.headers.iter().find_map(|(n, v)| {
                let found = self.text.get(n.clone()) == Some(name.as_bytes());
                found.then(|| self.text.get(v.clone())).flatten()
            }),
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

    fn record(line: &str) -> Result<Record, LineError> {
        let mut record = Record::default();
        record.buffer().extend_from_slice(line.as_bytes());
        record.parse(7, &mut StartTimes::default()).map(|()| record)
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
    fn a_reused_record_forgets_the_previous_line() {
        let mut r = record(LINE).unwrap();
        r.buffer()
            .extend_from_slice(br#"{"start_time":"2026-11-30T17:44:58Z"}"#);
        r.parse(8, &mut StartTimes::default()).unwrap();
        assert_eq!(
            (r.line, r.header("x-user-id"), r.response_code),
            (8, None, None)
        );
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
