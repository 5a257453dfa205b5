//! The scanner against real bodies of each API, in every chunking, against a model of the rules
//! written over `serde_json::Value`, and against hostile input.

use super::*;
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{json, Map, Value};

struct Fixture {
    name: &'static str,
    body: &'static [u8],
    format: Format,
    counts: Counts,
}

const fn counts(input: u64, output: u64, total: u64) -> Counts {
    Counts {
        input: Some(input),
        output: Some(output),
        total: Some(total),
        cache_read: 0,
        cache_write: 0,
        cached: 0,
        reasoning: 0,
        thoughts: 0,
        provisional: false,
    }
}

macro_rules! fixture {
    ($file:literal, $format:ident, $input:expr, $output:expr, $total:expr) => {
        Fixture {
            name: $file,
            body: include_bytes!(concat!("fixtures/", $file)),
            format: Format::$format,
            counts: counts($input, $output, $total),
        }
    };
}

/// Bodies as each API sends them, with decoys: usage written inside strings, in tool arguments
/// and in a tool's input.
const FIXTURES: &[Fixture] = &[
    fixture!("openai_chat.json", Json, 1117, 46, 1163),
    fixture!("openai_chat_tool_call.json", Json, 82, 17, 99),
    fixture!("openai_chat_stream.sse", EventStream, 19, 10, 29),
    fixture!("openai_responses.json", Json, 36, 87, 123),
    fixture!("openai_responses_stream.sse", EventStream, 37, 11, 48),
    fixture!("anthropic_message.json", Json, 25, 15, 40),
    fixture!("anthropic_stream.sse", EventStream, 25, 15, 40),
    fixture!("gemini.json", Json, 8, 17, 25),
    fixture!("gemini_stream.sse", EventStream, 8, 17, 25),
    fixture!("gemini_stream_array.json", Json, 8, 17, 25),
];

/// Reads `body` fed in pieces cut at `cuts` (in any order, out of range ones at the end).
fn read_cut(format: Format, body: &[u8], cuts: &[usize]) -> Reading {
    let mut cuts: Vec<usize> = cuts.iter().map(|&cut| cut.min(body.len())).collect();
    cuts.sort_unstable();
    let mut scanner = Scanner::new(format);
    let mut from = 0;
    for cut in cuts.into_iter().chain([body.len()]) {
        scanner.feed(&body[from..cut]);
        from = cut;
    }
    scanner.reading()
}

fn read_bytewise(format: Format, body: &[u8]) -> Reading {
    let mut scanner = Scanner::new(format);
    for byte in body.chunks(1) {
        scanner.feed(byte);
    }
    scanner.reading()
}

fn json(body: &str) -> Reading {
    read_cut(Format::Json, body.as_bytes(), &[])
}

fn events(body: &str) -> Reading {
    read_cut(Format::EventStream, body.as_bytes(), &[])
}

fn found(input: Option<u64>, output: Option<u64>, total: Option<u64>) -> Reading {
    Reading::Found(Counts {
        input,
        output,
        total,
        ..Counts::default()
    })
}

fn cut_points() -> impl Strategy<Value = Vec<Index>> {
    prop::collection::vec(any::<Index>(), 0..24)
}

fn positions(cuts: &[Index], len: usize) -> Vec<usize> {
    cuts.iter().map(|cut| cut.index(len + 1)).collect()
}

#[test]
fn every_fixture_reads_the_usage_its_api_reports() {
    for fixture in FIXTURES {
        let reading = read_cut(fixture.format, fixture.body, &[]);
        assert_eq!(reading, Reading::Found(fixture.counts), "{}", fixture.name);
    }
}

#[test]
fn a_fixture_split_in_two_anywhere_gives_the_same_usage() {
    for fixture in FIXTURES {
        for cut in 0..=fixture.body.len() {
            let reading = read_cut(fixture.format, fixture.body, &[cut]);
            assert_eq!(
                reading,
                Reading::Found(fixture.counts),
                "{} cut at {cut}",
                fixture.name
            );
        }
    }
}

#[test]
fn a_fixture_fed_a_byte_at_a_time_gives_the_same_usage() {
    for fixture in FIXTURES {
        let reading = read_bytewise(fixture.format, fixture.body);
        assert_eq!(reading, Reading::Found(fixture.counts), "{}", fixture.name);
    }
}

#[test]
fn a_fixture_cut_short_is_invalid_not_a_smaller_usage() {
    for fixture in FIXTURES.iter().filter(|f| f.format == Format::Json) {
        let body = fixture.body.trim_ascii_end();
        let reading = read_cut(fixture.format, &body[..body.len() - 1], &[]);
        assert_eq!(
            reading,
            Reading::Invalid("the body ends inside a JSON document"),
            "{}",
            fixture.name
        );
    }
}

#[test]
fn keys_inside_strings_are_never_keys() {
    assert_eq!(
        json(r#"{"note": "\"usage\": {\"prompt_tokens\": 5}"}"#),
        Reading::Missing
    );
    assert_eq!(
        json(r#"{"a\"usage\"": {"prompt_tokens": 5}}"#),
        Reading::Missing
    );
    assert_eq!(
        json(r#"{"a": "\\", "usage": {"total_tokens": 3}}"#),
        found(None, None, Some(3)),
        "an escaped backslash does not escape the quote after it"
    );
    assert_eq!(
        json(r#"{"usag\u0065": {"total_tokens": 3}}"#),
        Reading::Missing,
        "keys are compared as written"
    );
}

#[test]
fn usage_is_read_at_the_top_level_or_under_response_or_message_only() {
    let deeper = [
        r#"{"data": {"usage": {"total_tokens": 5}}}"#,
        r#"{"choices": [{"usage": {"total_tokens": 5}}]}"#,
        r#"{"response": {"response": {"usage": {"total_tokens": 5}}}}"#,
        r#"{"message": {"content": [{"input": {"usage": {"total_tokens": 5}}}]}}"#,
        r#"{"usage": {"details": {"total_tokens": 5}}}"#,
        r#"[[{"usage": {"total_tokens": 5}}]]"#,
    ];
    for body in deeper {
        assert_eq!(json(body), Reading::Missing, "{body}");
    }
    let one_level_down = r#"{"type": "message_start", "message": {"usage": {"input_tokens": 3}}}"#;
    assert_eq!(json(one_level_down), Reading::Missing, "a first guess only");
    let confirmed =
        r#"[{"message": {"usage": {"input_tokens": 3}}}, {"usage": {"output_tokens": 2}}]"#;
    assert_eq!(json(confirmed), found(Some(3), Some(2), Some(5)));
    let gemini = r#"{"response": {"usageMetadata": {"totalTokenCount": 4}}}"#;
    assert_eq!(json(gemini), found(None, None, Some(4)));
}

#[test]
fn unknown_members_and_nested_objects_in_usage_are_skipped_but_the_priced_details() {
    let body = r#"{"usage": {"prompt_tokens_details": {"prompt_tokens": 7, "cached_tokens": 2},
        "x": [1, {"total_tokens": 2}], "cache_creation": {"cache_read_input_tokens": 9},
        "cache_read_input_tokens": 100, "service_tier": "standard", "prompt_tokens": 3}}"#;
    let Reading::Found(counts) = json(body) else {
        panic!("{body}")
    };
    assert_eq!(
        (counts.input, counts.output, counts.total),
        (Some(3), None, None)
    );
    assert_eq!((counts.cached, counts.cache_read), (2, 100));
}

#[test]
fn every_priced_kind_is_read_where_its_provider_writes_it() {
    let anthropic = r#"{"type": "message", "usage": {"input_tokens": 20, "output_tokens": 30,
        "cache_creation_input_tokens": 1000, "cache_read_input_tokens": 5000,
        "cache_creation": {"ephemeral_5m_input_tokens": 1000}}}"#;
    let openai_chat = r#"{"usage": {"prompt_tokens": 1000, "completion_tokens": 500,
        "total_tokens": 1500, "prompt_tokens_details": {"cached_tokens": 800, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 300}}}"#;
    let openai_responses = concat!(
        r#"data: {"type": "response.completed", "response": {"usage": {"input_tokens": 1000, "#,
        r#""input_tokens_details": {"cached_tokens": 800}, "output_tokens": 500, "#,
        r#""output_tokens_details": {"reasoning_tokens": 300}, "total_tokens": 1500}}}"#,
        "\n\n"
    );
    let gemini = r#"{"usageMetadata": {"promptTokenCount": 100, "candidatesTokenCount": 30,
        "cachedContentTokenCount": 40, "thoughtsTokenCount": 70, "totalTokenCount": 200}}"#;
    let read = |reading: Reading| match reading {
        Reading::Found(c) => (
            c.input,
            c.output,
            c.total,
            [
                c.cache_read,
                c.cache_write,
                c.cached,
                c.reasoning,
                c.thoughts,
            ],
        ),
        other => panic!("{other:?}"),
    };
    // Anthropic's total is every token it counts: the cache reads and writes are apart.
    assert_eq!(
        read(json(anthropic)),
        (Some(20), Some(30), Some(6050), [5000, 1000, 0, 0, 0])
    );
    let openai = (Some(1000), Some(500), Some(1500), [0, 0, 800, 300, 0]);
    assert_eq!(read(json(openai_chat)), openai);
    assert_eq!(read(events(openai_responses)), openai);
    assert_eq!(
        read(json(gemini)),
        (Some(100), Some(30), Some(200), [0, 0, 40, 0, 70])
    );
    // Details read only in a usage object, their counts only where they belong.
    let elsewhere = r#"{"prompt_tokens_details": {"cached_tokens": 5}, "usage":
        {"prompt_tokens": 1, "completion_tokens_details": {"cached_tokens": 6},
         "prompt_tokens_details": {"reasoning_tokens": 7}}}"#;
    assert_eq!(read(json(elsewhere)), (Some(1), None, None, [0; 5]));
    let bad = r#"{"usage": {"prompt_tokens_details": {"cached_tokens": "5"}}}"#;
    assert!(matches!(json(bad), Reading::Invalid(_)));
}

#[test]
fn null_counts_and_null_usage_are_no_counts() {
    assert_eq!(json(r#"{"usage": null}"#), Reading::Missing);
    assert_eq!(json(r#"{"usage": {}}"#), Reading::Missing);
    assert_eq!(
        json(r#"{"usage": {"prompt_tokens": null, "completion_tokens": 4}}"#),
        found(None, Some(4), None)
    );
    assert_eq!(
        json(r#"{"usage": "n/a", "message": 3, "response": [1]}"#),
        Reading::Missing
    );
}

#[test]
fn a_total_not_reported_is_input_plus_output_when_both_are() {
    let both = r#"{"usage": {"input_tokens": 2, "output_tokens": 3}}"#;
    assert_eq!(json(both), found(Some(2), Some(3), Some(5)));
    let input_only = r#"{"usage": {"input_tokens": 2}}"#;
    assert_eq!(json(input_only), found(Some(2), None, None));
    let reported = r#"{"usage": {"input_tokens": 2, "output_tokens": 3, "total_tokens": 9}}"#;
    assert_eq!(json(reported), found(Some(2), Some(3), Some(9)));
}

#[test]
fn within_a_document_the_last_value_of_a_count_wins() {
    let body = r#"{"usage": {"prompt_tokens": 1, "input_tokens": 2}, "usageMetadata": {"promptTokenCount": 3}}"#;
    assert_eq!(json(body), found(Some(3), None, None));
}

#[test]
fn counts_that_are_not_whole_numbers_up_to_10_12_are_invalid() {
    let cases = [
        ("-1", "a token count is negative"),
        ("-0", "a token count is negative"),
        ("1.0", "a token count is not a whole number"),
        ("1e3", "a token count is not a whole number"),
        ("1000000000001", "a token count is above 10^12"),
        ("99999999999999999999999999", "a token count is above 10^12"),
        (r#""5""#, "a token count is not a number"),
        ("true", "a token count is not a number"),
        ("{}", "a token count is not a number"),
        ("[5]", "a token count is not a number"),
    ];
    for (value, why) in cases {
        let body = format!(r#"{{"usage": {{"total_tokens": {value}}}}}"#);
        assert_eq!(json(&body), Reading::Invalid(why), "{value}");
    }
    let largest = r#"{"usage": {"total_tokens": 1000000000000, "prompt_tokens": 0}}"#;
    assert_eq!(json(largest), found(Some(0), None, Some(MAX_TOKENS)));
    let elsewhere = r#"{"temperature": -1.5e3, "usage": {"tokens": "x", "total_tokens": 1}}"#;
    assert_eq!(
        json(elsewhere),
        found(None, None, Some(1)),
        "only counts are counts"
    );
}

#[test]
fn malformed_json_is_invalid_rather_than_missing() {
    let malformed = [
        r#"{"usage": {"prompt_tokens": 1,}}"#,
        r#"{"a" 1}"#,
        r#"{"a": 1]"#,
        "[1}",
        r#"{"a": tru}"#,
        r#"{"a": nul}"#,
        r#"{"a": 01}"#,
        r#"{"a": 1.}"#,
        r#"{"a": -}"#,
        r#"{"a": 1e}"#,
        "{} {}",
        r#"{"a": 1}x"#,
        "{,}",
        r#"{"a": 1,, "b": 2}"#,
        "{'a': 1}",
        "{a: 1}",
        "]",
        r#"{"a": 12x}"#,
        "{\"a\": \u{1}}",
    ];
    for body in malformed {
        assert_eq!(json(body), Reading::Invalid("malformed JSON"), "{body}");
    }
    for well_formed in [
        "{}",
        "[]",
        "null",
        "12",
        r#""text""#,
        r#"[{}, [], 1.5e-3, "a"]"#,
    ] {
        assert_eq!(json(well_formed), Reading::Missing, "{well_formed}");
    }
}

#[test]
fn a_body_that_ends_inside_its_document_is_invalid() {
    for body in [
        r#"{"usage": {"prompt_tokens": 5"#,
        r#"{"usage": {"prompt_tokens": 5}"#,
        r#"{"a": "b"#,
        "[1,",
    ] {
        assert_eq!(
            json(body),
            Reading::Invalid("the body ends inside a JSON document"),
            "{body}"
        );
    }
}

#[test]
fn an_empty_body_is_missing_not_invalid() {
    assert_eq!(json(""), Reading::Missing);
    assert_eq!(json(" \r\n\t"), Reading::Missing);
    assert_eq!(events(""), Reading::Missing);
}

#[test]
fn nesting_is_bounded_and_deeper_is_invalid() {
    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    assert_eq!(json(&nested(usize::from(MAX_DEPTH))), Reading::Missing);
    let deeper = json(&nested(usize::from(MAX_DEPTH) + 1));
    assert_eq!(
        deeper,
        Reading::Invalid("JSON nested deeper than 64 levels")
    );
    let flood = vec![b'['; 4 << 20];
    let reading = read_cut(Format::Json, &flood, &[]);
    assert_eq!(
        reading,
        Reading::Invalid("JSON nested deeper than 64 levels")
    );
}

#[test]
fn bytes_that_are_not_utf8_are_skipped_in_strings_and_malformed_elsewhere() {
    let in_string = b"{\"a\": \"\xff\xfe\xc3\", \"usage\": {\"total_tokens\": 3}}";
    assert_eq!(
        read_cut(Format::Json, in_string, &[]),
        found(None, None, Some(3))
    );
    let outside = b"{\"a\": \xff}";
    assert_eq!(
        read_cut(Format::Json, outside, &[]),
        Reading::Invalid("malformed JSON")
    );
}

#[test]
fn keys_too_long_to_be_a_name_match_nothing_and_are_skipped_whole() {
    let long = "usage".repeat(20);
    let body = format!(
        r#"{{"{long}": {{"total_tokens": 1}}, "usage": {{"{long}": 5, "total_tokens": 2}}}}"#
    );
    assert_eq!(json(&body), found(None, None, Some(2)));
}

#[test]
fn a_top_level_array_is_read_as_a_list_of_documents() {
    let body = r#"[{"usage": {"total_tokens": 1}}, 7, {"usageMetadata": {"totalTokenCount": 2}}]"#;
    assert_eq!(json(body), found(None, None, Some(2)));
}

#[test]
fn once_invalid_the_scanner_stays_invalid_and_ignores_what_follows() {
    let mut scanner = Scanner::new(Format::EventStream);
    scanner.feed(b"data: {\"usage\": ]\n\n");
    scanner.feed(br#"data: {"usage": {"total_tokens": 5}}"#);
    scanner.feed(b"\n\n");
    assert_eq!(scanner.reading(), Reading::Invalid("malformed JSON"));
}

#[test]
fn reading_does_not_end_the_scan() {
    let mut scanner = Scanner::new(Format::Json);
    scanner.feed(br#"{"usage": {"total_tokens": 5}"#);
    assert_eq!(
        scanner.reading(),
        Reading::Invalid("the body ends inside a JSON document")
    );
    scanner.feed(b"}");
    assert_eq!(scanner.reading(), found(None, None, Some(5)));
}

/// Only a `Copy` type can hold no heap allocation: no `Vec`, `Box` or `String` is `Copy`.
fn holds_no_heap<T: Copy>() -> usize {
    std::mem::size_of::<T>()
}

#[test]
fn the_scanner_is_a_small_fixed_size_value_whatever_it_reads() {
    // 240 bytes, and the served model's name (`MODEL_BYTES`) twice since spend budgets: the one
    // read, and the one before an event that may prove to carry no usage.
    assert!(
        holds_no_heap::<Scanner>() <= 240 + 2 * (MODEL_BYTES + 2),
        "{} bytes",
        holds_no_heap::<Scanner>()
    );
    let mut scanner = Scanner::new(Format::EventStream);
    let chunk = format!("data: {{\"text\": \"{}\"}}\n\n", "x".repeat(64 << 10));
    for _ in 0..128 {
        scanner.feed(chunk.as_bytes());
    }
    assert_eq!(scanner.reading(), Reading::Missing, "8 MiB of events read");
}

#[test]
fn an_openai_stream_takes_the_usage_of_its_last_chunk_over_the_nulls() {
    let stream = "data: {\"choices\": [], \"usage\": null}\n\n\
                  data: {\"choices\": [], \"usage\": {\"prompt_tokens\": 4, \"completion_tokens\": 6, \"total_tokens\": 10}}\n\n\
                  data: {\"choices\": [], \"usage\": null}\n\n\
                  data: [DONE]\n\n";
    assert_eq!(events(stream), found(Some(4), Some(6), Some(10)));
}

#[test]
fn across_events_the_last_value_of_each_count_wins() {
    let stream =
        "data: {\"message\": {\"usage\": {\"input_tokens\": 25, \"output_tokens\": 1}}}\n\n\
                  data: {\"usage\": {\"output_tokens\": 15}}\n\n";
    assert_eq!(events(stream), found(Some(25), Some(15), Some(40)));
}

#[test]
fn events_end_with_any_line_ending() {
    let stream = ": comment\nevent: message_delta\ndata: {\"usage\":\ndata: {\"output_tokens\": 15}}\n\ndata: [DONE]\n\n";
    let expected = found(None, Some(15), None);
    for ending in ["\r\n", "\r"] {
        let body = stream.replace('\n', ending);
        assert_eq!(events(&body), expected, "{body:?}");
        assert_eq!(
            read_bytewise(Format::EventStream, body.as_bytes()),
            expected
        );
    }
    let mixed = "data: {\"usage\":\r\ndata: {\"output_tokens\": 15}}\r\r\ndata: [DONE]\n\r";
    assert_eq!(events(mixed), expected);
}

#[test]
fn the_data_lines_of_an_event_are_one_document_joined_by_newlines() {
    let split = "data: {\"usage\":\ndata: {\"total_tokens\": 7}}\n\n";
    assert_eq!(events(split), found(None, None, Some(7)));
    let number_split = "data: {\"usage\": {\"total_tokens\": 12\ndata: 3}}\n\n";
    assert_eq!(events(number_split), Reading::Invalid("malformed JSON"));
    let empty_line = "data: {\"usage\":\ndata\ndata: {\"total_tokens\": 7}}\n\n";
    assert_eq!(events(empty_line), found(None, None, Some(7)));
}

#[test]
fn comments_and_fields_other_than_data_are_ignored() {
    let stream = ": keep-alive {\nevent: {bogus\nid: 5\nretry: 100\ndatum: {\ndata_: {\nDATA: {\n\
                  data:{\"usage\": {\"total_tokens\": 1}}\n\n\
                  data:    {\"usage\": {\"total_tokens\": 2}}\n\n";
    assert_eq!(events(stream), found(None, None, Some(2)));
}

#[test]
fn done_ends_an_openai_stream_and_any_other_data_is_json() {
    assert_eq!(events("data: [DONE]\n\n"), Reading::Missing);
    assert_eq!(events("data:[DONE] \n\n"), Reading::Missing);
    assert_eq!(events("data: [1]\n\n"), Reading::Missing);
    for not_done in [
        "data: [DONE] x \"usage\n\n",
        "data: [DON \"usage\n\n",
        "data: [DONE]\ndata: [DONE] \"usage\n\n",
    ] {
        assert_eq!(
            events(not_done),
            Reading::Invalid("malformed JSON"),
            "{not_done:?}"
        );
    }
    assert_eq!(
        events("data: [\"usage\"\n\n"),
        Reading::Invalid("an event's data ends inside a JSON document")
    );
}

#[test]
fn a_malformed_event_that_could_hold_usage_makes_the_whole_stream_invalid() {
    let stream = "data: {\"usage\": {\"total_tokens\": 3}}\n\ndata: {oops \"usage\"}\n\n";
    assert_eq!(events(stream), Reading::Invalid("malformed JSON"));
    let cut = "data: {\"usage\": {\"total_tokens\": 3}}\n\ndata: {\"usage\": {";
    assert_eq!(
        events(cut),
        Reading::Invalid("an event's data ends inside a JSON document")
    );
}

#[test]
fn events_that_cannot_hold_usage_are_not_read() {
    let usage = "data: {\"usage\": {\"total_tokens\": 3}}\n\n";
    let others = ["data: hello\n\n", "data: {oops}\n\n", "data: {\"a\": [\n\n"];
    let streams = others
        .iter()
        .flat_map(|other| [format!("{other}{usage}"), format!("{usage}{other}")]);
    // The last event cut short does not count either, if it could not hold usage.
    for stream in streams.chain([format!("{usage}data: {{\"a\"")]) {
        // Whole in one chunk (skipped unread), and a byte at a time (read, not held against it).
        assert_eq!(events(&stream), found(None, None, Some(3)), "{stream:?}");
        let bytewise = read_bytewise(Format::EventStream, stream.as_bytes());
        assert_eq!(bytewise, found(None, None, Some(3)), "{stream:?}");
    }
    // A count needs its key: a usage spelt with an escape is no usage, and is not read either.
    let escaped = "data: {\"\\u0075sage\": {\"total_tokens\": 3}}\n\n";
    assert_eq!(events(escaped), Reading::Missing);
}

#[test]
fn the_last_event_needs_no_blank_line_but_its_data_must_be_complete() {
    let unterminated = "data: {\"usage\": {\"total_tokens\": 3}}";
    assert_eq!(events(unterminated), found(None, None, Some(3)));
    assert_eq!(
        events(&format!("{unterminated}\n")),
        found(None, None, Some(3))
    );
    let cut = "data: {\"usage\": {\"total_tokens\": 3}";
    assert_eq!(
        events(cut),
        Reading::Invalid("an event's data ends inside a JSON document")
    );
    let cut_before_blank_line = "data: {\"usage\": {\"total_tokens\": 3}\n\n";
    assert_eq!(
        events(cut_before_blank_line),
        Reading::Invalid("an event's data ends inside a JSON document")
    );
}

#[test]
fn events_without_data_are_nothing() {
    assert_eq!(events("event: ping\n\n: hi\n\n\n\n"), Reading::Missing);
    assert_eq!(events("data\n\ndata:\n\ndata: \n\n"), Reading::Missing);
}

#[test]
fn a_count_from_a_header_is_digits_with_whitespace_around_at_most() {
    assert_eq!(count_from_header(b"1234"), Some(1234));
    assert_eq!(count_from_header(b" 12 \t"), Some(12));
    assert_eq!(count_from_header(b"1000000000000"), Some(MAX_TOKENS));
    for refused in [
        "",
        " ",
        "1.0",
        "-1",
        "+1",
        "0x10",
        "1 2",
        "1000000000001",
        "99999999999999999999999",
    ] {
        assert_eq!(count_from_header(refused.as_bytes()), None, "{refused:?}");
    }
}

#[test]
fn the_content_type_chooses_how_the_body_is_framed() {
    let format = |value: &str| Format::of_content_type(value.as_bytes());
    assert_eq!(format("application/json"), Some(Format::Json));
    assert_eq!(
        format("Application/JSON; charset=utf-8"),
        Some(Format::Json)
    );
    assert_eq!(format("application/vnd.api+json"), Some(Format::Json));
    assert_eq!(format("text/event-stream"), Some(Format::EventStream));
    assert_eq!(
        format(" Text/Event-Stream ;charset=UTF-8"),
        Some(Format::EventStream)
    );
    for other in [
        "",
        "text/html",
        "application/x-ndjson",
        "+json",
        "application/",
        "text/plain+json",
    ] {
        assert_eq!(format(other), None, "{other:?}");
    }
}

/// The rules of the module, written over a parsed document: `Err` for an invalid count.
fn expected_counts(document: &Value, counts: &mut Counts) -> Result<(), ()> {
    match document {
        Value::Array(items) => items
            .iter()
            .filter_map(Value::as_object)
            .try_for_each(|object| expected_document(object, counts)),
        Value::Object(object) => expected_document(object, counts),
        _ => Ok(()),
    }
}

fn expected_document(document: &Map<String, Value>, counts: &mut Counts) -> Result<(), ()> {
    for (key, value) in document {
        match (key.as_str(), value) {
            ("usage" | "usageMetadata", Value::Object(usage)) => {
                expected_usage(usage, counts, false)?
            }
            ("response" | "message", Value::Object(wrapper)) => {
                for (inner, value) in wrapper {
                    if let ("usage" | "usageMetadata", Value::Object(usage)) =
                        (inner.as_str(), value)
                    {
                        expected_usage(usage, counts, key == "message")?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// `provisional`: the usage of Anthropic's `message_start`, which a later count must confirm.
fn expected_usage(
    usage: &Map<String, Value>,
    counts: &mut Counts,
    provisional: bool,
) -> Result<(), ()> {
    for (key, value) in usage {
        let details = match key.as_str() {
            "prompt_tokens_details" | "input_tokens_details" => {
                Some(("cached_tokens", Count::Cached))
            }
            "completion_tokens_details" | "output_tokens_details" => {
                Some(("reasoning_tokens", Count::Reasoning))
            }
            _ => None,
        };
        if let (Some((name, count)), Value::Object(members), false) = (details, value, provisional)
        {
            for (member, value) in members {
                if member == name {
                    expected_count(count, value, counts, false)?;
                }
            }
            continue;
        }
        let Some(count) = Count::of_usage_key(key.as_bytes()) else {
            continue;
        };
        expected_count(count, value, counts, provisional)?;
    }
    Ok(())
}

fn expected_count(
    count: Count,
    value: &Value,
    counts: &mut Counts,
    provisional: bool,
) -> Result<(), ()> {
    match value {
        Value::Null => {}
        Value::Number(n) => {
            counts.set(count, n.as_u64().filter(|&n| n <= MAX_TOKENS).ok_or(())?);
            counts.provisional = provisional;
        }
        _ => return Err(()),
    }
    Ok(())
}

fn expected_reading(documents: &[Value]) -> Reading {
    let mut counts = Counts::default();
    for document in documents {
        if expected_counts(document, &mut counts).is_err() {
            return Reading::Invalid("");
        }
    }
    if counts.is_empty() || counts.provisional {
        Reading::Missing
    } else {
        Reading::Found(Counts {
            total: counts.get(Count::Total),
            ..counts
        })
    }
}

/// Equal readings, any reason of invalidity matching the model's.
fn same_reading(read: Reading, expected: Reading) -> bool {
    match (read, expected) {
        (Reading::Invalid(_), Reading::Invalid(_)) => true,
        (read, expected) => read == expected,
    }
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "usage", "usageMetadata", "response", "message", "prompt_tokens", "input_tokens",
            "completion_tokens", "output_tokens", "total_tokens", "promptTokenCount",
            "candidatesTokenCount", "totalTokenCount", "choices", "prompt_tokens_details",
            "completion_tokens_details", "input_tokens_details", "cached_tokens",
            "reasoning_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
            "cachedContentTokenCount", "thoughtsTokenCount",
        ])
        .prop_map(String::from),
        1 => "[a-z_\"\\\\ é]{0,40}",
    ]
}

fn count_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => (0..=MAX_TOKENS).prop_map(Value::from),
        1 => Just(Value::Null),
        1 => any::<i64>().prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        1 => (-1e20f64..1e20).prop_map(Value::from),
        1 => any::<bool>().prop_map(Value::from),
        1 => "[0-9]{1,3}".prop_map(Value::from),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<String>().prop_map(Value::from),
        "[\"\\\\/a-z{}\\[\\]:,]{0,20}".prop_map(Value::from),
        count_value(),
    ];
    leaf.prop_recursive(6, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..6)
                .prop_map(|members| Value::Object(members.into_iter().collect())),
        ]
    })
}

fn usage_object() -> impl Strategy<Value = Value> {
    let details = prop::collection::btree_map(key(), count_value(), 0..3)
        .prop_map(|members| Value::Object(members.into_iter().collect()));
    let member = prop_oneof![4 => count_value(), 1 => details];
    prop::collection::btree_map(key(), member, 0..5)
        .prop_map(|members| Value::Object(members.into_iter().collect()))
}

/// A document shaped like an API's: usage objects where they are read, among other members.
fn usage_document() -> impl Strategy<Value = Value> {
    (
        prop::option::of(usage_object()),
        prop::option::of(usage_object()),
        prop::sample::select(vec!["usage", "usageMetadata"]),
        prop::sample::select(vec!["response", "message", "data"]),
        prop::collection::btree_map(key(), value(), 0..4),
    )
        .prop_map(|(top, wrapped, name, wrapper, others)| {
            let mut document: Map<String, Value> = others.into_iter().collect();
            if let Some(usage) = wrapped {
                document.insert(wrapper.into(), json!({ (name): usage, "id": "x" }));
            }
            if let Some(usage) = top {
                document.insert(name.into(), usage);
            }
            Value::Object(document)
        })
}

fn document() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => usage_document(),
        1 => value(),
        1 => prop::collection::vec(usage_document(), 0..4).prop_map(Value::Array),
    ]
}

/// An event stream of `documents`, as servers write them: comments, other fields, documents
/// pretty-printed over several data lines, `[DONE]` at the end.
fn event_stream(documents: &[Value], ending: &str, pretty: bool, done: bool) -> String {
    let mut stream = String::new();
    for (n, document) in documents.iter().enumerate() {
        stream += &format!(": ping {n}{ending}event: e{n}{ending}id: {n}{ending}");
        let text = if pretty {
            serde_json::to_string_pretty(document).unwrap()
        } else {
            serde_json::to_string(document).unwrap()
        };
        for line in text.lines() {
            stream += &format!("data: {line}{ending}");
        }
        stream += ending;
    }
    if done {
        stream += &format!("data: [DONE]{ending}{ending}");
    }
    stream
}

/// Fragments of JSON and of event streams, for input that is nearly right.
fn fragments() -> impl Strategy<Value = Vec<u8>> {
    let fragment = prop::sample::select(vec![
        "{",
        "}",
        "[",
        "]",
        ":",
        ",",
        "\"usage\"",
        "\"usageMetadata\"",
        "\"response\"",
        "\"message\"",
        "\"prompt_tokens\"",
        "\"total_tokens\"",
        "\"output_tokens\"",
        "\"x\"",
        "\"\\\"\"",
        "\"\\\\\"",
        "\"",
        "\\",
        "0",
        "12",
        "-3",
        "1.5",
        "1e2",
        "1000000000001",
        "null",
        "true",
        "false",
        " ",
        "\n",
        "\r",
        "\r\n",
        "data: ",
        "data:",
        "[DONE]",
        ": c",
        "event: e",
        "\u{ff}",
    ]);
    prop::collection::vec(fragment, 0..48).prop_map(|parts| parts.concat().into_bytes())
}

proptest! {
    #[test]
    fn a_fixture_split_at_random_points_gives_the_same_usage(
        which in any::<Index>(),
        cuts in cut_points(),
    ) {
        let fixture = which.get(FIXTURES);
        let cuts = positions(&cuts, fixture.body.len());
        let reading = read_cut(fixture.format, fixture.body, &cuts);
        prop_assert_eq!(reading, Reading::Found(fixture.counts), "{}", fixture.name);
    }

    #[test]
    fn a_json_body_reads_as_the_rules_say_in_any_chunking(
        document in document(),
        pretty in any::<bool>(),
        cuts in cut_points(),
    ) {
        let body = if pretty {
            serde_json::to_vec_pretty(&document).unwrap()
        } else {
            serde_json::to_vec(&document).unwrap()
        };
        let expected = expected_reading(std::slice::from_ref(&document));
        let whole = read_cut(Format::Json, &body, &[]);
        prop_assert!(same_reading(whole, expected), "{:?} read as {:?}", document, whole);
        prop_assert_eq!(read_cut(Format::Json, &body, &positions(&cuts, body.len())), whole);
        prop_assert_eq!(read_bytewise(Format::Json, &body), whole);
    }

    #[test]
    fn an_event_stream_reads_as_the_rules_say_in_any_chunking(
        documents in prop::collection::vec(document(), 0..6),
        ending in prop::sample::select(vec!["\n", "\r\n", "\r"]),
        pretty in any::<bool>(),
        done in any::<bool>(),
        cuts in cut_points(),
    ) {
        let stream = event_stream(&documents, ending, pretty, done);
        let body = stream.as_bytes();
        let whole = read_cut(Format::EventStream, body, &[]);
        prop_assert!(same_reading(whole, expected_reading(&documents)), "{:?} read as {:?}", stream, whole);
        prop_assert_eq!(read_cut(Format::EventStream, body, &positions(&cuts, body.len())), whole);
        prop_assert_eq!(read_bytewise(Format::EventStream, body), whole);
    }

    #[test]
    fn a_count_of_any_length_is_read_exactly_or_refused_as_too_large(
        digits in prop_oneof!["0", "[1-9][0-9]{0,12}", "[1-9][0-9]{0,1000}"],
        cuts in cut_points(),
    ) {
        let body = format!(r#"{{"usage": {{"prompt_tokens": {digits}}}}}"#);
        let expected = match digits.parse::<u64>() {
            Ok(n) if n <= MAX_TOKENS => found(Some(n), None, None),
            _ => Reading::Invalid("a token count is above 10^12"),
        };
        prop_assert_eq!(read_cut(Format::Json, body.as_bytes(), &positions(&cuts, body.len())), expected);
    }

    #[test]
    fn random_bytes_never_panic_and_read_the_same_in_any_chunking(
        body in prop::collection::vec(any::<u8>(), 0..512),
        cuts in cut_points(),
    ) {
        for format in [Format::Json, Format::EventStream] {
            let whole = read_cut(format, &body, &[]);
            prop_assert_eq!(read_cut(format, &body, &positions(&cuts, body.len())), whole);
            prop_assert_eq!(read_bytewise(format, &body), whole);
        }
    }

    #[test]
    fn nearly_json_reads_the_same_in_any_chunking_and_json_is_never_malformed(
        body in fragments(),
        cuts in cut_points(),
    ) {
        for format in [Format::Json, Format::EventStream] {
            let whole = read_cut(format, &body, &[]);
            prop_assert_eq!(read_cut(format, &body, &positions(&cuts, body.len())), whole);
            prop_assert_eq!(read_bytewise(format, &body), whole);
        }
        if serde_json::from_slice::<Value>(&body).is_ok() {
            let reading = read_cut(Format::Json, &body, &[]);
            let syntax = ["malformed JSON", "the body ends inside a JSON document"];
            prop_assert!(!matches!(reading, Reading::Invalid(why) if syntax.contains(&why)));
        }
    }
}

mod compressed {
    //! `Reader`: the scanner behind the decoder, for a body in a content coding.
    use super::*;
    use flate2::write::{GzEncoder, ZlibEncoder};
    use flate2::Compression;
    use std::io::Write;

    fn gzip(body: &[u8]) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
        encoder.write_all(body).unwrap();
        encoder.finish().unwrap()
    }

    fn zlib(body: &[u8]) -> Vec<u8> {
        let mut encoder = ZlibEncoder::new(Vec::new(), Compression::fast());
        encoder.write_all(body).unwrap();
        encoder.finish().unwrap()
    }

    fn read(format: Format, coding: Option<&str>, chunks: &[&[u8]]) -> Reading {
        let mut reader = Reader::new(format, coding.map(str::as_bytes));
        for chunk in chunks {
            reader.feed(chunk);
        }
        reader.reading()
    }

    #[test]
    fn every_fixture_compressed_reads_the_usage_it_reads_plain() {
        for fixture in FIXTURES {
            let expected = Reading::Found(fixture.counts);
            let plain = read(fixture.format, None, &[fixture.body]);
            assert_eq!(plain, expected, "{}", fixture.name);
            for (coding, body) in [
                ("gzip", gzip(fixture.body)),
                ("x-gzip", gzip(fixture.body)),
                ("deflate", zlib(fixture.body)),
            ] {
                let reading = read(fixture.format, Some(coding), &[&body]);
                assert_eq!(reading, expected, "{} in {coding}", fixture.name);
                let (head, tail) = body.split_at(body.len() / 2);
                let halves = read(fixture.format, Some(coding), &[head, tail]);
                assert_eq!(halves, expected, "{} in {coding}, halves", fixture.name);
            }
        }
    }

    #[test]
    fn a_compressed_stream_split_anywhere_reads_the_same_usage() {
        let fixture = FIXTURES.iter().find(|f| f.name == "anthropic_stream.sse");
        let fixture = fixture.unwrap();
        let body = gzip(fixture.body);
        for cut in 0..=body.len() {
            let (head, tail) = body.split_at(cut);
            let reading = read(fixture.format, Some("gzip"), &[head, tail]);
            assert_eq!(reading, Reading::Found(fixture.counts), "cut at {cut}");
        }
    }

    #[test]
    fn a_body_that_does_not_decode_or_is_cut_short_is_invalid() {
        let body = br#"{"usage": {"total_tokens": 5}}"#;
        let gzipped = gzip(body);
        let cut = &gzipped[..gzipped.len() - 4];
        let truncated = read(Format::Json, Some("gzip"), &[cut]);
        assert_eq!(truncated, Reading::Invalid("compressed body cut short"));
        let corrupt = read(Format::Json, Some("gzip"), &[body]);
        assert_eq!(corrupt, Reading::Invalid("corrupt compressed body"));
        let unlabelled = read(Format::Json, None, &[&gzipped]);
        assert_eq!(unlabelled, Reading::Invalid("malformed JSON"));
    }

    #[test]
    fn a_coding_sluice_cannot_undo_is_invalid_once_a_byte_comes() {
        let body = br#"{"usage": {"total_tokens": 5}}"#;
        for coding in ["br", "zstd", "gzip, gzip", "gzip,br"] {
            let mut reader = Reader::new(Format::Json, Some(coding.as_bytes()));
            assert!(reader.reads());
            reader.feed(b"");
            assert_eq!(reader.reading(), Reading::Missing, "{coding}: no body yet");
            reader.feed(body);
            assert!(!reader.reads(), "{coding}: nothing more is fed");
            let why = Reading::Invalid("unsupported content-encoding");
            assert_eq!(reader.reading(), why, "{coding}");
        }
    }

    #[test]
    fn once_the_body_cannot_be_read_nothing_more_is_decoded() {
        let mut reader = Reader::new(Format::Json, Some(b"gzip"));
        reader.feed(&gzip(b"{\"usage\": nonsense"));
        assert!(!reader.reads(), "malformed");
        reader.feed(&gzip(b"more"));
        assert_eq!(reader.reading(), Reading::Invalid("malformed JSON"));
        let mut reader = Reader::new(Format::Json, Some(b"gzip"));
        reader.feed(b"\x1f\x8b\x08\x00 not deflate");
        assert!(!reader.reads(), "corrupt");
    }
}

/// The model each fixture's API says served it, in any chunking.
const SERVED: &[(&str, &str)] = &[
    ("openai_chat.json", "gpt-4o-2024-08-06"),
    ("openai_chat_tool_call.json", "gpt-4o-mini-2024-07-18"),
    ("openai_chat_stream.sse", "gpt-4o-mini-2024-07-18"),
    ("openai_responses.json", "gpt-4.1-2025-04-14"),
    ("openai_responses_stream.sse", "gpt-4.1-2025-04-14"),
    ("anthropic_message.json", "claude-sonnet-4-20250514"),
    ("anthropic_stream.sse", "claude-sonnet-4-20250514"),
    ("gemini.json", "gemini-2.0-flash"),
    ("gemini_stream.sse", "gemini-2.0-flash"),
    ("gemini_stream_array.json", "gemini-2.0-flash"),
];

#[test]
fn every_fixture_names_the_model_that_served_it_in_any_chunking() {
    for fixture in FIXTURES {
        let (_, model) = SERVED
            .iter()
            .find(|(name, _)| *name == fixture.name)
            .unwrap();
        for cut in 0..=fixture.body.len() {
            let mut scanner = Scanner::new(fixture.format);
            scanner.feed(&fixture.body[..cut]);
            scanner.feed(&fixture.body[cut..]);
            assert_eq!(
                scanner.model(),
                Served::Named(model.as_bytes()),
                "{} cut at {cut}",
                fixture.name
            );
        }
    }
}

#[test]
fn only_a_documents_own_model_is_the_served_one() {
    let served = |format: Format, body: &str| {
        let mut scanner = Scanner::new(format);
        scanner.feed(body.as_bytes());
        let model = scanner.model();
        match model {
            Served::Named(name) => format!("named {}", String::from_utf8_lossy(name)),
            other => format!("{other:?}"),
        }
    };
    // Deeper `model` keys (a message's role, tool arguments) are not the served model.
    let deep = r#"{"choices": [{"message": {"model": "decoy"}}], "x": {"model": "decoy"}}"#;
    assert_eq!(served(Format::Json, deep), "Unnamed");
    assert_eq!(
        served(
            Format::Json,
            r#"{"model": "decoy-in-\"quotes\"", "model": "last"}"#
        ),
        "named last"
    );
    assert_eq!(served(Format::Json, r#"{"model": 5}"#), "Unnamed");
    assert_eq!(served(Format::Json, r#"{"model": null}"#), "Unnamed");
    assert_eq!(
        served(Format::Json, r#"{"model": "gpt\u002d4o"}"#),
        "Unreadable"
    );
    let long = format!(r#"{{"model": "{}"}}"#, "m".repeat(MODEL_BYTES + 1));
    assert_eq!(served(Format::Json, &long), "Unreadable");
    let longest = format!(r#"{{"model": "{}"}}"#, "m".repeat(MODEL_BYTES));
    assert!(served(Format::Json, &longest).starts_with("named m"));
    // Anthropic names it in message_start's message, the Responses API in its response.
    // In a stream, an event that carries a usage names it: one without is not read.
    let anthropic =
        "data: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-x\",\"usage\":{}}}\n\n";
    let unread = "data: {\"type\":\"ping\",\"model\":\"other\"}\n\n";
    assert_eq!(
        served(Format::EventStream, &format!("{anthropic}{unread}")),
        "named claude-x"
    );
    assert_eq!(served(Format::EventStream, anthropic), "named claude-x");
    let responses =
        "data: {\"type\":\"response.completed\",\"response\":{\"model\":\"gpt-4.1\",\"usage\":{}}}\n\n";
    assert_eq!(served(Format::EventStream, responses), "named gpt-4.1");
}
