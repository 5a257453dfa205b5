//! The access log: JSON lines as `log_format` makes Envoy write them, read from a file or standard
//! input, gzipped or not. Each line becomes a `Record`: the request as the filter saw it, which
//! the filter's code reads through `RequestSource` as it reads Envoy.
//!
//! A line's fields: `start_time` (RFC 3339; required), `method`, `path`, `authority`,
//! `remote_address` (no port), `route_name`, `headers` (names in any case), `metadata`
//! (dynamic metadata namespaces to objects), `response_code`. Unknown fields are ignored; `null`
//! is an absent value, as Envoy writes one.

use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use sluice::request::RequestSource;
use smallvec::SmallVec;
use std::borrow::Cow;
use std::fmt;
use std::io::{self, BufRead, BufReader, Read};
use std::marker::PhantomData;
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

/// One request of the log. Its text lives in one buffer, reused from record to record: a replay
/// allocates nothing per line once it runs.
#[derive(Debug, Default, Clone)]
pub struct Record {
    /// The line's number in the log, from 1.
    pub line: u64,
    /// `start_time`, Unix nanoseconds.
    pub time: u64,
    pub response_code: Option<u32>,
    text: Vec<u8>,
    method: Option<Range<usize>>,
    path: Option<Range<usize>>,
    authority: Option<Range<usize>>,
    remote_address: Option<Range<usize>>,
    route_name: Option<Range<usize>>,
    /// Header names, lower-cased, and values.
    headers: SmallVec<[(Range<usize>, Range<usize>); 6]>,
    /// The `metadata` object's JSON, read when a policy asks for a value in it.
    metadata: Option<Range<usize>>,
}

/// A line as JSON: borrowed wherever no escape forces a copy.
#[derive(Deserialize)]
struct Line<'a> {
    #[serde(borrow)]
    start_time: Option<Text<'a>>,
    #[serde(borrow)]
    method: Option<Text<'a>>,
    #[serde(borrow)]
    path: Option<Text<'a>>,
    #[serde(borrow)]
    authority: Option<Text<'a>>,
    #[serde(borrow)]
    remote_address: Option<Text<'a>>,
    #[serde(borrow)]
    route_name: Option<Text<'a>>,
    #[serde(borrow)]
    headers: Option<Headers<'a>>,
    #[serde(borrow)]
    metadata: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "status")]
    response_code: Option<u32>,
}

impl Record {
    /// Parses `line` (number `number`) into this record, replacing what it held.
    pub fn parse(&mut self, number: u64, line: &[u8]) -> Result<(), LineError> {
        let parsed: Line =
            serde_json::from_slice(line).map_err(|e| LineError::NotJson(e.to_string()))?;
        let start = parsed.start_time.as_deref().ok_or(LineError::NoStartTime)?;
        self.time = sluice::time::parse_rfc3339(start).map_err(LineError::BadStartTime)?;
        self.line = number;
        self.response_code = parsed.response_code;
        self.text.clear();
        self.headers.clear();
        self.method = self.keep(parsed.method.as_deref());
        self.path = self.keep(parsed.path.as_deref());
        self.authority = self.keep(parsed.authority.as_deref());
        self.remote_address = self.keep(parsed.remote_address.as_deref());
        self.route_name = self.keep(parsed.route_name.as_deref());
        for (name, value) in parsed.headers.iter().flat_map(|h| &h.0) {
            let start = self.text.len();
            self.text
                .extend(name.bytes().map(|b| b.to_ascii_lowercase()));
            let name = start..self.text.len();
            if let Some(value) = self.keep(Some(&**value)) {
                self.headers.push((name, value));
            }
        }
        self.metadata = self.keep(parsed.metadata.map(RawValue::get));
        Ok(())
    }

    /// Copies a value into the record's text; where it is.
    fn keep(&mut self, value: Option<&str>) -> Option<Range<usize>> {
        let start = self.text.len();
        self.text.extend_from_slice(value?.as_bytes());
        Some(start..self.text.len())
    }

    fn bytes(&self, range: &Option<Range<usize>>) -> Option<&[u8]> {
        range.as_ref().and_then(|r| self.text.get(r.clone()))
    }

    /// A value in the dynamic metadata: `namespace` then a path of keys into its object.
    fn metadata_value(&self, namespace: &str, path: &[&str]) -> Option<Vec<u8>> {
        let text = std::str::from_utf8(self.bytes(&self.metadata)?).ok()?;
        let namespaces: Value = serde_json::from_str(text).ok()?;
        let mut value = namespaces.get(namespace)?;
        for key in path {
            value = value.get(key)?;
        }
        property_bytes(value)
    }
}

/// A metadata value as Envoy hands it to the filter: a string as its bytes, a number (a protobuf
/// `Value` holds doubles) as 8 little-endian bytes, a bool as one byte; objects and lists as their
/// JSON text, where Envoy would give a serialized protobuf.
fn property_bytes(value: &Value) -> Option<Vec<u8>> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(s.as_bytes().to_vec()),
        Value::Number(n) => Some(n.as_f64()?.to_le_bytes().to_vec()),
        Value::Bool(b) => Some(vec![u8::from(*b)]),
        other => Some(other.to_string().into_bytes()),
    }
}

impl RequestSource for Record {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        let value = match name {
            ":method" => self.bytes(&self.method),
            ":path" => self.bytes(&self.path),
            ":authority" => self.bytes(&self.authority),
            _ => self.headers.iter().find_map(|(n, v)| {
                let found = self.text.get(n.clone()) == Some(name.as_bytes());
                found.then(|| self.text.get(v.clone())).flatten()
            }),
        };
        value.map(<[u8]>::to_vec)
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        match path {
            ["source", "address"] => self.bytes(&self.remote_address).map(<[u8]>::to_vec),
            ["xds", "route_name"] => self.bytes(&self.route_name).map(<[u8]>::to_vec),
            ["metadata", "filter_metadata", namespace, keys @ ..] => {
                self.metadata_value(namespace, keys)
            }
            _ => None,
        }
    }
}

/// A JSON string, borrowed from the line unless it has escapes. (serde's own `Cow<str>` always
/// copies outside a derived struct's direct fields.)
struct Text<'a>(Cow<'a, str>);

impl std::ops::Deref for Text<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for TextVisitor<'a> {
            type Value = Text<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Borrowed(text)))
            }
            fn visit_str<E>(self, text: &str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(text.to_string())))
            }
        }
        deserializer.deserialize_str(TextVisitor(PhantomData))
    }
}

/// The `headers` object: names to values, `null` values left out.
struct Headers<'a>(SmallVec<[(Text<'a>, Text<'a>); 6]>);

impl<'de: 'a, 'a> Deserialize<'de> for Headers<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct HeadersVisitor<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for HeadersVisitor<'a> {
            type Value = Headers<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of header names to values")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Headers<'a>, M::Error> {
                let mut headers = SmallVec::new();
                while let Some((name, value)) = map.next_entry::<Text, Option<Text>>()? {
                    if let Some(value) = value {
                        headers.push((name, value));
                    }
                }
                Ok(Headers(headers))
            }
        }
        deserializer.deserialize_map(HeadersVisitor(PhantomData))
    }
}

/// `response_code`: a number as Envoy's typed JSON writes it, or a string of one; anything else
/// (`null`, `0` for no response) is no code.
fn status<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Code<'a> {
        Number(u32),
        Text(&'a str),
        Other(IgnoredAny),
    }
    Ok(match Code::deserialize(deserializer)? {
        Code::Number(n) => Some(n),
        Code::Text(t) => t.parse().ok(),
        Code::Other(_) => None,
    }
    .filter(|&code| code > 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn record(line: &str) -> Result<Record, LineError> {
        let mut record = Record::default();
        record.parse(7, line.as_bytes()).map(|()| record)
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
        r.parse(8, br#"{"start_time":"2026-11-30T17:44:58Z"}"#)
            .unwrap();
        assert_eq!(
            (r.line, r.header("x-user-id"), r.response_code),
            (8, None, None)
        );
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
