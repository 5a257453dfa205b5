//! What an LLM request asks for, read from the top-level fields of its JSON body, and the rewrite
//! that makes a stream report its usage (as Envoy AI Gateway does: OpenAI sends usage in a
//! stream only when asked with `stream_options.include_usage`).
//!
//! The filter reads at most a bounded prefix of the body: fields found before the cut count, a
//! field cut in the middle is absent, and so is everything after anything malformed. Keys are
//! decoded as JSON decodes them (`"mod\u0065l"` is `model`): the upstream reads them so. Where a
//! field is written twice, the last one counts, as in the upstream's JSON parser.

use std::borrow::Cow;
use std::ops::Range;

use super::json::{is_whitespace, skip_whitespace, string_run, Run};
use super::MAX_TOKENS;

/// The longest model name read (once decoded); a longer one is absent.
pub const MAX_MODEL_BYTES: usize = 256;
/// Keys longer than this, as written, are none of the names read, even with escapes.
const MAX_KEY_BYTES: usize = 128;

/// The top-level fields of a request body that a budget may need.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestFields {
    /// `model`, a string of at most `MAX_MODEL_BYTES`.
    pub model: Option<String>,
    /// The largest of `max_tokens`, `max_completion_tokens` and `max_output_tokens` found (whole
    /// numbers up to `MAX_TOKENS`): whichever of them the upstream honours, the call's output
    /// stays within it.
    pub max_output_tokens: Option<u64>,
    /// `"stream": true`.
    pub stream: bool,
    /// `"stream_options": {"include_usage": true}`.
    pub include_usage: bool,
}

impl RequestFields {
    /// The fields of the JSON object that `prefix` starts, as far as it goes.
    pub fn read(prefix: &[u8]) -> RequestFields {
        let mut fields = RequestFields::default();
        for member in Members::new(prefix, 0) {
            let value = member.value(prefix);
            match member.name.as_deref() {
                Some("model") => fields.model = model(value),
                Some("max_tokens" | "max_completion_tokens" | "max_output_tokens") => {
                    let found = output_limit(value);
                    fields.max_output_tokens = fields.max_output_tokens.max(found);
                }
                Some("stream") => fields.stream = value == b"true",
                Some("stream_options") => {
                    fields.include_usage = include_usage(prefix, member.value.start) == Some(true);
                }
                _ => {}
            }
        }
        fields
    }
}

/// Whether a request to `path` is one whose stream `ask_stream_usage` may ask for its usage:
/// OpenAI's completions APIs (`/v1/chat/completions`, `/v1/completions`), the only ones that
/// define `stream_options.include_usage`. Other APIs' bodies (Anthropic's `/v1/messages`
/// refuses unknown fields) go as sent.
pub fn asks_stream_usage_on(path: &[u8]) -> bool {
    let path = path.split(|&b| b == b'?').next().unwrap_or_default();
    path.ends_with(b"/completions")
}

/// The UTF-8 byte-order mark, which Python's and other upstreams' JSON readers skip.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// The body as a JSON reader that skips a byte-order mark reads it: without it.
pub fn without_bom(body: &[u8]) -> &[u8] {
    body.strip_prefix(BOM).unwrap_or(body)
}

/// Whether `body` (without its byte-order mark) is one whole JSON document in UTF-8, as the
/// filter reads it. An upstream may read more (UTF-16, UTF-32): what the filter cannot read the
/// same way is refused where a policy needs it, rather than read as missing.
pub fn readable(body: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok()
}

/// The output limit a `max_tokens` value sets, read as leniently as the upstreams that honour it
/// (pydantic's lax mode: `5000`, `5000.0`, `5e3`, `"5000"`): a fraction counts as the next whole
/// number. `null` sets none. Any other value (negative, text, an object) is read as no limit
/// (`MAX_TOKENS`): whatever the upstream makes of it, the request cannot reserve less by it.
fn output_limit(value: &[u8]) -> Option<u64> {
    if value == b"null" {
        return None;
    }
    let number = match value.first() {
        Some(b'"') => serde_json::from_slice::<String>(value).ok(),
        _ => std::str::from_utf8(value).ok().map(str::to_owned),
    };
    let number = number.and_then(|n| n.trim().parse::<f64>().ok());
    Some(match number {
        Some(n) if n.is_finite() && n >= 0.0 && n < MAX_TOKENS as f64 => n.ceil() as u64,
        _ => MAX_TOKENS,
    })
}

/// The top-level field `name` of the JSON object that `prefix` starts, if it is a string of at
/// most `MAX_MODEL_BYTES` (once decoded) written within the prefix: a key part (`body:model`).
pub fn string_field(prefix: &[u8], name: &str) -> Option<String> {
    let named = Members::new(prefix, 0).filter(|member| member.name.as_deref() == Some(name));
    named.last().and_then(|member| model(member.value(prefix)))
}

/// The model a JSON string names, decoded, if it is short enough.
fn model(value: &[u8]) -> Option<String> {
    // Each byte of a name takes at most 6 written (`\u00e9`).
    if value.len() > 2 + 6 * MAX_MODEL_BYTES {
        return None;
    }
    let model: String = serde_json::from_slice(value).ok()?;
    (model.len() <= MAX_MODEL_BYTES).then_some(model)
}

/// The `include_usage` bool of the `stream_options` object at `start`, if it has one.
fn include_usage(body: &[u8], start: usize) -> Option<bool> {
    let member = Members::new(body, start)
        .filter(|member| member.name.as_deref() == Some("include_usage"))
        .last()?;
    match member.value(body) {
        b"true" => Some(true),
        b"false" => Some(false),
        _ => None,
    }
}

/// The body of a streaming request rewritten to ask for usage in the stream: when `body` is a
/// JSON object with `"stream": true` and no `stream_options.include_usage`, the same body with
/// `"stream_options":{"include_usage":true}` added (or `"include_usage":true` added to the
/// `stream_options` it has). `None` when nothing needs changing: no stream, usage asked for
/// already, an explicit `"include_usage": false` (the client's choice), or a body that is not
/// such an object (cut, malformed, `stream_options` written twice or not an object).
pub fn ask_stream_usage(body: &[u8]) -> Option<Vec<u8>> {
    const ADD_OPTIONS: &[u8] = br#","stream_options":{"include_usage":true}"#;
    const OPTIONS: &[u8] = br#"{"include_usage":true}"#;
    let (mut stream, mut options, mut last_end) = (false, None, 0);
    let mut members = Members::new(body, 0);
    for member in members.by_ref() {
        match member.name.as_deref() {
            Some("stream") => stream = member.value(body) == b"true",
            Some("stream_options") if options.replace(member.value.clone()).is_some() => {
                return None;
            }
            _ => {}
        }
        last_end = member.value.end;
    }
    let after = body.get(members.closed()? + 1..)?;
    if !stream || !after.iter().all(|&b| is_whitespace(b)) {
        return None;
    }
    match options {
        None => Some(splice(body, last_end..last_end, ADD_OPTIONS)),
        Some(value) if body.get(value.clone())? == b"null" => Some(splice(body, value, OPTIONS)),
        Some(value) => {
            let inside = value.start + 1;
            let add: &[u8] = match options_members(body, value.start)? {
                0 => br#""include_usage":true"#,
                _ => br#""include_usage":true,"#,
            };
            Some(splice(body, inside..inside, add))
        }
    }
}

/// How many members the `stream_options` object at `start` has, if none is `include_usage`.
fn options_members(body: &[u8], start: usize) -> Option<usize> {
    let mut members = Members::new(body, start);
    let mut count = 0;
    for member in members.by_ref() {
        if member.name.as_deref() == Some("include_usage") {
            return None;
        }
        count += 1;
    }
    members.closed().map(|_| count)
}

/// `body` with the bytes in `replaced` replaced by `with`.
fn splice(body: &[u8], replaced: Range<usize>, with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + with.len());
    out.extend_from_slice(body.get(..replaced.start).unwrap_or_default());
    out.extend_from_slice(with);
    out.extend_from_slice(body.get(replaced.end..).unwrap_or_default());
    out
}

/// A member of a JSON object: its key decoded (`None` when too long to be a name read) and where
/// its value is written.
struct Member<'a> {
    name: Option<Cow<'a, str>>,
    value: Range<usize>,
}

impl Member<'_> {
    fn value<'b>(&self, body: &'b [u8]) -> &'b [u8] {
        body.get(self.value.clone()).unwrap_or_default()
    }
}

/// The members of the JSON object at `at` in `body`, in order, up to the first that is cut off
/// or malformed. Values are skipped, not checked, but for their brackets and strings.
struct Members<'a> {
    body: &'a [u8],
    at: usize,
    walk: Walk,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// Before the `{`.
    Open,
    /// After a member: a comma or the `}`.
    Between,
    /// At the `}` at this index.
    Closed(usize),
    Stopped,
}

impl<'a> Iterator for Members<'a> {
    type Item = Member<'a>;

    fn next(&mut self) -> Option<Member<'a>> {
        let member = self.advance();
        if member.is_none() && !matches!(self.walk, Walk::Closed(_)) {
            self.walk = Walk::Stopped;
        }
        member
    }
}

impl<'a> Members<'a> {
    fn new(body: &'a [u8], at: usize) -> Members<'a> {
        Members {
            body,
            at,
            walk: Walk::Open,
        }
    }

    /// Where the object's `}` is, once the members were all read.
    fn closed(&self) -> Option<usize> {
        match self.walk {
            Walk::Closed(at) => Some(at),
            _ => None,
        }
    }

    fn advance(&mut self) -> Option<Member<'a>> {
        match self.walk {
            Walk::Closed(_) | Walk::Stopped => return None,
            Walk::Open => {
                self.eat(b'{')?;
                if self.close() {
                    return None;
                }
            }
            Walk::Between => {
                if self.close() {
                    return None;
                }
                self.eat(b',')?;
            }
        }
        let key = self.string()?;
        self.eat(b':')?;
        let value = self.value()?;
        self.walk = Walk::Between;
        Some(Member {
            name: key_name(self.body.get(key).unwrap_or_default()),
            value,
        })
    }

    /// Reads the object's `}`, if it is next.
    fn close(&mut self) -> bool {
        let closed = self.eat(b'}').is_some();
        if closed {
            self.walk = Walk::Closed(self.at - 1);
        }
        closed
    }

    /// The next byte after whitespace.
    fn peek(&mut self) -> Option<u8> {
        let rest = self.body.get(self.at..)?;
        self.at += rest.len() - skip_whitespace(rest).len();
        self.body.get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    fn value(&mut self) -> Option<Range<usize>> {
        match self.peek()? {
            b'"' => self.string(),
            b'{' | b'[' => self.container(),
            _ => self.scalar(),
        }
    }

    /// The string at `at`, quotes included.
    fn string(&mut self) -> Option<Range<usize>> {
        self.eat(b'"')?;
        let start = self.at - 1;
        match string_run(self.body.get(self.at..)?, false) {
            Run::Closed(end) => self.at += end + 1,
            Run::Open { .. } => return None,
        }
        Some(start..self.at)
    }

    /// A number or literal: everything up to the next delimiter, which must be there.
    fn scalar(&mut self) -> Option<Range<usize>> {
        let start = self.at;
        let rest = self.body.get(start..)?;
        let length = rest
            .iter()
            .position(|&b| b",}]:\"{[".contains(&b) || is_whitespace(b))?;
        self.at += length;
        (length > 0).then_some(start..self.at)
    }

    /// The object or array at `at`, to its closing bracket.
    fn container(&mut self) -> Option<Range<usize>> {
        let start = self.at;
        let mut depth = 0usize;
        while let Some(&byte) = self.body.get(self.at) {
            self.at += 1;
            match byte {
                b'{' | b'[' => depth += 1,
                b'}' | b']' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(start..self.at);
                    }
                }
                b'"' => match string_run(self.body.get(self.at..)?, false) {
                    Run::Closed(end) => self.at += end + 1,
                    Run::Open { .. } => return None,
                },
                _ => {}
            }
        }
        None
    }
}

/// A key as JSON decodes it, from the string as written (quotes included).
fn key_name(written: &[u8]) -> Option<Cow<'_, str>> {
    let inner = written.get(1..written.len().saturating_sub(1))?;
    if !inner.contains(&b'\\') {
        return std::str::from_utf8(inner).ok().map(Cow::Borrowed);
    }
    if written.len() > MAX_KEY_BYTES {
        return None;
    }
    serde_json::from_slice(written).ok().map(Cow::Owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    /// A chat request whose messages and tools hold the same names deeper down.
    const CHAT: &str = r#"{
  "model": "gpt-4o-mini",
  "messages": [
    {"role": "system", "content": "Reply with {\"model\": \"x\", \"stream\": false}"},
    {"role": "user", "content": "hi", "model": "decoy", "max_tokens": 99999}
  ],
  "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
    "properties": {"stream": {"type": "boolean"}, "max_tokens": {"type": "integer"}}}}}],
  "temperature": 0.2,
  "max_completion_tokens": 512,
  "stream": true,
  "stream_options": {"include_usage": true}
}"#;

    fn read(body: &str) -> RequestFields {
        RequestFields::read(body.as_bytes())
    }

    fn asked(body: &str) -> Option<String> {
        ask_stream_usage(body.as_bytes()).map(|out| String::from_utf8(out).unwrap())
    }

    #[test]
    fn the_top_level_fields_of_a_chat_request_are_read_and_deeper_ones_are_not() {
        let expected = RequestFields {
            model: Some("gpt-4o-mini".into()),
            max_output_tokens: Some(512),
            stream: true,
            include_usage: true,
        };
        assert_eq!(read(CHAT), expected);
        assert_eq!(read("{}"), RequestFields::default());
    }

    #[test]
    fn the_output_cap_is_the_largest_of_the_names_apis_give_it() {
        let capped = |body: &str| read(body).max_output_tokens;
        assert_eq!(capped(r#"{"max_tokens": 1024}"#), Some(1024));
        assert_eq!(capped(r#"{"max_output_tokens": 300}"#), Some(300));
        let both = r#"{"max_completion_tokens": 200, "max_tokens": 100}"#;
        assert_eq!(capped(both), Some(200));
        assert_eq!(
            capped(r#"{"max_tokens": 100, "max_output_tokens": null}"#),
            Some(100)
        );
    }

    #[test]
    fn models_of_the_wrong_kind_or_too_long_are_absent_and_odd_output_limits_ask_the_most() {
        let longest = "m".repeat(MAX_MODEL_BYTES);
        assert_eq!(
            read(&format!(r#"{{"model": "{longest}"}}"#)).model,
            Some(longest.clone())
        );
        assert_eq!(read(&format!(r#"{{"model": "{longest}x"}}"#)).model, None);
        assert_eq!(read(r#"{"model": 5}"#).model, None);
        // Read as leniently as pydantic reads them; what no reader takes for a number asks for
        // no limit.
        let caps = [
            ("1.5", 2),
            ("1e3", 1000),
            (r#""100""#, 100),
            ("5000.0", 5000),
        ];
        for (cap, tokens) in caps {
            let body = format!(r#"{{"max_tokens": {cap}}}"#);
            assert_eq!(read(&body).max_output_tokens, Some(tokens), "{cap}");
        }
        for cap in ["-1", "1000000000001", "true", r#""many""#, "{}"] {
            let body = format!(r#"{{"max_tokens": {cap}}}"#);
            assert_eq!(read(&body).max_output_tokens, Some(MAX_TOKENS), "{cap}");
        }
        assert!(!read(r#"{"stream": "true"}"#).stream);
        assert!(!read(r#"{"stream_options": {"include_usage": 1}}"#).include_usage);
        assert_eq!(read("[1, 2]"), RequestFields::default());
    }

    #[test]
    fn keys_and_model_names_are_read_as_json_decodes_them() {
        let escaped = r#"{"mod\u0065l": "gpt\u002d4o \"mini\"", "str\u0065am": true}"#;
        let fields = read(escaped);
        assert_eq!(fields.model.as_deref(), Some("gpt-4o \"mini\""));
        assert!(fields.stream);
    }

    #[test]
    fn a_field_written_twice_counts_as_the_last() {
        let body = r#"{"model": "cheap", "stream": true, "model": "dear", "stream": false}"#;
        let fields = read(body);
        assert_eq!(
            (fields.model.as_deref(), fields.stream),
            (Some("dear"), false)
        );
    }

    #[test]
    fn a_body_cut_by_the_bound_keeps_the_fields_before_the_cut() {
        let fields = |prefix: &str| read(prefix);
        assert_eq!(fields(r#"{"max_tokens": 12"#).max_output_tokens, None);
        assert_eq!(fields(r#"{"max_tokens": 12,"#).max_output_tokens, Some(12));
        assert_eq!(fields(r#"{"model": "gpt-4"#).model, None);
        assert!(!fields(r#"{"stream": tr"#).stream);
        let cut = r#"{"model": "m", "messages": [{"role": "user", "content": "a long"#;
        assert_eq!(fields(cut).model.as_deref(), Some("m"));
        let full = read(CHAT);
        for end in 0..=CHAT.len() {
            let prefix = read(&CHAT[..end]);
            assert!(
                prefix.model.is_none() || prefix.model == full.model,
                "{end}"
            );
            assert!(
                prefix.max_output_tokens.is_none()
                    || prefix.max_output_tokens == full.max_output_tokens
            );
            assert!(!prefix.stream || full.stream);
            assert!(!prefix.include_usage || full.include_usage);
        }
    }

    #[test]
    fn a_stream_without_stream_options_is_asked_for_its_usage() {
        let body = r#"{"model": "m", "stream": true}"#;
        let expected = r#"{"model": "m", "stream": true,"stream_options":{"include_usage":true}}"#;
        assert_eq!(asked(body).as_deref(), Some(expected));
        let pretty = "{\n  \"stream\": true\n}\n";
        let expected = "{\n  \"stream\": true,\"stream_options\":{\"include_usage\":true}\n}\n";
        assert_eq!(asked(pretty).as_deref(), Some(expected));
    }

    #[test]
    fn stream_options_without_include_usage_get_it_added() {
        let empty = r#"{"stream_options": { }, "stream": true}"#;
        let expected = r#"{"stream_options": {"include_usage":true }, "stream": true}"#;
        assert_eq!(asked(empty).as_deref(), Some(expected));
        let other = r#"{"stream": true, "stream_options": {"continuous_usage_stats": true}}"#;
        let expected = r#"{"stream": true, "stream_options": {"include_usage":true,"continuous_usage_stats": true}}"#;
        assert_eq!(asked(other).as_deref(), Some(expected));
        let null = r#"{"stream": true, "stream_options": null}"#;
        let expected = r#"{"stream": true, "stream_options": {"include_usage":true}}"#;
        assert_eq!(asked(null).as_deref(), Some(expected));
    }

    #[test]
    fn nothing_is_rewritten_unless_a_whole_object_streams_without_usage() {
        let unchanged = [
            r#"{"model": "m"}"#,
            r#"{"stream": false}"#,
            r#"{"stream": "true"}"#,
            r#"{"stream": true, "stream_options": {"include_usage": true}}"#,
            r#"{"stream": true, "stream_options": {"include_usage": false}}"#,
            r#"{"stream": true, "stream_options": {"include\u005fusage": false}}"#,
            r#"{"stream": true, "stream_options": {}, "stream_options": {}}"#,
            r#"{"stream": true, "stream_options": "yes"}"#,
            r#"{"stream": true, "stream_options": {"a": 1"#,
            r#"{"stream": true, "messages": [1, 2"#,
            r#"{"stream": true} {}"#,
            r#"{"stream": true,}"#,
            r#"[{"stream": true}]"#,
            "",
        ];
        for body in unchanged {
            assert_eq!(asked(body), None, "{body}");
        }
        assert!(asked(CHAT).is_none(), "usage asked for already");
    }

    /// The names of the members of the object at `start`, each once.
    fn unique_names(body: &[u8], start: usize) -> bool {
        let names: Vec<_> = Members::new(body, start).map(|m| m.name).collect();
        let unique: std::collections::HashSet<_> = names.iter().collect();
        unique.len() == names.len()
    }

    fn request() -> impl Strategy<Value = Value> {
        let options = prop::option::of(prop_oneof![
            Just(json!(null)),
            Just(json!({})),
            Just(json!({"include_usage": true})),
            Just(json!({"include_usage": false})),
            Just(json!({"continuous_usage_stats": true, "x": [1, {"y": "}"}]})),
        ]);
        let stream = prop::option::of(prop_oneof![Just(json!(true)), Just(json!(false))]);
        let messages =
            prop::collection::vec("[a-z \"\\\\{}\\[\\]]{0,30}", 0..4).prop_map(|texts| {
                json!(texts
                    .iter()
                    .map(|t| json!({"role": "user", "content": t}))
                    .collect::<Vec<_>>())
            });
        (
            stream,
            options,
            messages,
            prop::option::of(0u64..100_000),
            "[a-z0-9.-]{1,20}",
        )
            .prop_map(|(stream, options, messages, cap, model)| {
                let mut request = json!({"model": model, "messages": messages});
                let object = request.as_object_mut().unwrap();
                stream.map(|s| object.insert("stream".into(), s));
                options.map(|o| object.insert("stream_options".into(), o));
                cap.map(|c| object.insert("max_tokens".into(), json!(c)));
                request
            })
    }

    proptest! {
        #[test]
        fn a_rewritten_stream_asks_for_usage_and_keeps_everything_else(
            request in request(),
            pretty in any::<bool>(),
        ) {
            let body = if pretty {
                serde_json::to_vec_pretty(&request).unwrap()
            } else {
                serde_json::to_vec(&request).unwrap()
            };
            let streams = request["stream"] == json!(true);
            let asks = request["stream_options"].get("include_usage").is_some();
            match ask_stream_usage(&body) {
                Some(out) => {
                    prop_assert!(streams && !asks);
                    let mut expected = request.clone();
                    let options = &mut expected["stream_options"];
                    if options.is_null() {
                        *options = json!({});
                    }
                    options["include_usage"] = json!(true);
                    let rewritten: Value = serde_json::from_slice(&out).unwrap();
                    prop_assert_eq!(rewritten, expected);
                    prop_assert!(unique_names(&out, 0));
                    let fields = RequestFields::read(&out);
                    prop_assert!(fields.stream && fields.include_usage);
                    prop_assert_eq!(ask_stream_usage(&out), None);
                }
                None => prop_assert!(!streams || asks),
            }
        }

        #[test]
        fn a_prefix_of_a_request_reads_some_of_its_fields_and_nothing_else(
            request in request(),
            pretty in any::<bool>(),
            cut in any::<prop::sample::Index>(),
        ) {
            let body = if pretty {
                serde_json::to_vec_pretty(&request).unwrap()
            } else {
                serde_json::to_vec(&request).unwrap()
            };
            let full = RequestFields::read(&body);
            prop_assert_eq!(full.model.as_deref(), request["model"].as_str());
            prop_assert_eq!(full.max_output_tokens, request["max_tokens"].as_u64());
            let prefix = RequestFields::read(&body[..cut.index(body.len() + 1)]);
            prop_assert!(prefix.model.is_none() || prefix.model == full.model);
            prop_assert!(prefix.max_output_tokens.is_none() || prefix.max_output_tokens == full.max_output_tokens);
            prop_assert!(!prefix.stream || full.stream);
            prop_assert!(!prefix.include_usage || full.include_usage);
        }

        #[test]
        fn random_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..256)) {
            let fields = RequestFields::read(&body);
            prop_assert!(fields.model.is_none_or(|m| m.len() <= MAX_MODEL_BYTES));
            if let Some(out) = ask_stream_usage(&body) {
                prop_assert!(out.len() > body.len());
            }
        }
    }
}
