//! The LLM upstream answers as the three APIs do, shaped by the test's headers, and the official
//! openai SDK talks to it through a real Envoy with the sluice filter and no policy that applies.

use serde_json::{json, Value};
use sluice_testkit::envoy::{Envoy, EnvoyOptions};
use sluice_testkit::llm::{call, openai_calls, post, Api, LlmResponse, LlmUpstream, SseEvent};
use std::time::Duration;

/// The filter with a policy for no request of these tests (it refuses an empty list).
const NO_POLICY: &str = r#"{"policies": [
    {"name": "elsewhere", "match": {"path_prefix": "/elsewhere/"}, "key": ["ip"], "requests": 1, "per": "1s"}
]}"#;

/// The data of the events named `name` (or, for OpenAI's chat chunks, of every unnamed one).
fn data_of(r: &LlmResponse, name: Option<&str>) -> Vec<Value> {
    let events = r.events().into_iter();
    let named = events.filter(|e| e.event.as_deref() == name && e.data != "[DONE]");
    named.map(|e| e.json()).collect()
}

fn last_event(r: &LlmResponse) -> SseEvent {
    r.events().pop().expect("a stream with events")
}

fn envoy_to(upstream: &LlmUpstream) -> EnvoyOptions {
    Envoy::options(NO_POLICY)
        .concurrency(1)
        .upstream(upstream.addr())
}

#[test]
fn json_answers_carry_the_usage_asked_for() {
    let upstream = LlmUpstream::start();
    let usage = [("x-test-usage", "input=10,output=20")];
    let chat = call(upstream.addr(), Api::ChatCompletions, false, &usage);
    assert_eq!(chat.status, 200);
    assert_eq!(chat.header("content-type"), Some("application/json"));
    let chat = chat.json();
    assert_eq!(
        chat["usage"],
        json!({"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30})
    );
    assert_eq!(
        chat["choices"][0]["message"]["content"],
        "lorem iplorem iplorem ip"
    );

    let responses = call(upstream.addr(), Api::Responses, false, &usage).json();
    assert_eq!(responses["object"], "response");
    assert_eq!(responses["usage"]["input_tokens"], 10);
    assert_eq!(responses["usage"]["output_tokens"], 20);
    assert_eq!(responses["usage"]["total_tokens"], 30);

    let messages = call(upstream.addr(), Api::Messages, false, &usage).json();
    assert_eq!(messages["type"], "message");
    assert_eq!(
        messages["usage"],
        json!({"input_tokens": 10, "output_tokens": 20})
    );
}

#[test]
fn a_chat_stream_reports_its_usage_in_a_last_chunk_when_asked() {
    let upstream = LlmUpstream::start();
    let r = call(upstream.addr(), Api::ChatCompletions, true, &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert!(r.complete);
    let chunks = data_of(&r, None);
    // A role chunk, 3 content chunks, a finish chunk and the usage chunk.
    assert_eq!(chunks.len(), 6, "{}", r.text());
    let (usage_chunk, others) = chunks.split_last().unwrap();
    assert!(others
        .iter()
        .all(|c| c["usage"].is_null() && c["object"] == "chat.completion.chunk"));
    assert_eq!(others[1]["choices"][0]["delta"]["content"], "lorem ip");
    assert_eq!(others[4]["choices"][0]["finish_reason"], "stop");
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["total_tokens"], 30);
    assert_eq!(last_event(&r).data, "[DONE]");

    // Without stream_options.include_usage, as OpenAI does: no usage at all.
    let body = r#"{"model": "m", "messages": [], "stream": true}"#;
    let r = post(upstream.addr(), Api::ChatCompletions.path(), &[], body).unwrap();
    let chunks = data_of(&r, None);
    assert_eq!(chunks.len(), 5);
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
}

#[test]
fn a_responses_stream_ends_with_response_completed_and_its_usage() {
    let upstream = LlmUpstream::start();
    let r = call(
        upstream.addr(),
        Api::Responses,
        true,
        &[("x-test-events", "5")],
    );
    let names: Vec<String> = r.events().into_iter().filter_map(|e| e.event).collect();
    assert_eq!(
        names[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert_eq!(
        names
            .iter()
            .filter(|n| *n == "response.output_text.delta")
            .count(),
        5
    );
    assert_eq!(names.last().map(String::as_str), Some("response.completed"));
    let created = &data_of(&r, Some("response.created"))[0];
    assert!(created["response"]["usage"].is_null());
    let completed = &data_of(&r, Some("response.completed"))[0];
    assert_eq!(completed["type"], "response.completed");
    assert_eq!(
        completed["response"]["usage"]["total_tokens"], 30,
        "{completed}"
    );
    let done = &data_of(&r, Some("response.output_text.done"))[0];
    assert_eq!(done["text"], "lorem ip".repeat(5));
}

#[test]
fn a_messages_stream_counts_output_in_message_delta() {
    let upstream = LlmUpstream::start();
    let usage = [("x-test-usage", "input=7,output=40")];
    let r = call(upstream.addr(), Api::Messages, true, &usage);
    let start = &data_of(&r, Some("message_start"))[0];
    assert_eq!(
        start["message"]["usage"],
        json!({"input_tokens": 7, "output_tokens": 1})
    );
    assert_eq!(data_of(&r, Some("content_block_delta")).len(), 3);
    let delta = &data_of(&r, Some("message_delta"))[0];
    assert_eq!(delta["usage"], json!({"output_tokens": 40}));
    assert_eq!(last_event(&r).event.as_deref(), Some("message_stop"));
}

#[test]
fn usage_controls_total_none_bad_header_and_trailer() {
    let upstream = LlmUpstream::start();
    let addr = upstream.addr();
    let total_only = [("x-test-usage", "total=30")];
    let chat = call(addr, Api::ChatCompletions, false, &total_only).json();
    assert_eq!(
        chat["usage"],
        json!({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 30})
    );

    let none = [("x-test-usage", "none"), ("x-test-usage-header", "x-usage")];
    for api in Api::ALL {
        let r = call(addr, api, false, &none);
        assert!(r.json().get("usage").is_none(), "{api:?}: {}", r.text());
        assert_eq!(r.header("x-usage"), None);
        let r = call(addr, api, true, &none);
        assert!(!r.text().contains("_tokens"), "{api:?}: {}", r.text());
    }

    let bad = [("x-test-usage", "bad")];
    let chat = call(addr, Api::ChatCompletions, false, &bad).json();
    assert_eq!(chat["usage"]["total_tokens"], "many");
    let huge = [("x-test-usage", "input=-5,total=99999999999999999999")];
    let chat = call(addr, Api::ChatCompletions, false, &huge);
    assert!(
        chat.text().contains(r#""prompt_tokens": -5"#),
        "{}",
        chat.text()
    );
    assert!(chat
        .text()
        .contains(r#""total_tokens": 99999999999999999999"#));

    let reported = [
        ("x-test-usage", "input=1,output=2"),
        ("x-test-usage-header", "x-usage-total-tokens"),
        ("x-test-usage-trailer", "x-usage-trailer"),
    ];
    let r = call(addr, Api::Messages, true, &reported);
    assert_eq!(r.header("x-usage-total-tokens"), Some("3"));
    assert_eq!(r.header("trailer"), Some("x-usage-trailer"));
    assert_eq!(r.trailer("x-usage-trailer"), Some("3"));
}

#[test]
fn event_counts_sizes_and_delays() {
    let upstream = LlmUpstream::start();
    let shape = [("x-test-events", "200"), ("x-test-event-bytes", "100")];
    let r = call(upstream.addr(), Api::ChatCompletions, true, &shape);
    let chunks = data_of(&r, None);
    let contents: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .filter(|text| !text.is_empty())
        .collect();
    assert_eq!(contents.len(), 200);
    assert!(contents.iter().all(|text| text.len() == 100));

    let slow = [("x-test-first-byte-ms", "300"), ("x-test-event-ms", "50")];
    let r = call(upstream.addr(), Api::Messages, true, &slow);
    let first = r.first_body_byte.unwrap();
    assert!(first >= Duration::from_millis(300), "{first:?}");
    // 9 events, 8 waits of 50 ms after the first. The client sees the first byte a little after
    // the upstream's first wait starts (seen: 2 ms), so the span it measures may be that short.
    let lag = Duration::from_millis(10);
    assert!(
        r.elapsed + lag >= first + Duration::from_millis(400),
        "{r:?}"
    );
}

#[test]
fn a_cut_stream_ends_without_its_last_chunk_and_a_reset_gets_no_answer() {
    let upstream = LlmUpstream::start();
    let r = call(
        upstream.addr(),
        Api::Messages,
        true,
        &[("x-test-cut-after", "3")],
    );
    assert_eq!(r.status, 200);
    assert!(!r.complete);
    assert_eq!(r.events().len(), 3);
    assert_eq!(last_event(&r).event.as_deref(), Some("ping"));

    let r = call(
        upstream.addr(),
        Api::ChatCompletions,
        false,
        &[("x-test-cut-after", "10")],
    );
    assert!(!r.complete);
    assert_eq!(r.bytes, 10);

    let body = Api::ChatCompletions.body(false);
    let reset = post(
        upstream.addr(),
        Api::ChatCompletions.path(),
        &[("x-test-reset", "1")],
        &body,
    );
    assert!(reset.is_err(), "{reset:?}");
}

#[test]
fn a_status_comes_with_the_apis_error_and_no_usage() {
    let upstream = LlmUpstream::start();
    let status = [("x-test-status", "503")];
    for api in Api::ALL {
        let r = call(upstream.addr(), api, true, &status);
        assert_eq!(r.status, 503);
        let error = r.json();
        assert!(error["error"]["message"].is_string(), "{api:?}: {error}");
        assert!(!r.text().contains("_tokens"));
    }
    assert_eq!(
        call(upstream.addr(), Api::Messages, false, &status).json()["type"],
        "error"
    );
    let r = call(
        upstream.addr(),
        Api::Messages,
        false,
        &[("x-test-events", "many")],
    );
    assert_eq!(r.status, 400);
    assert!(r.text().contains("x-test-events"), "{}", r.text());
}

#[test]
fn slow_paths_answer_late_and_calls_are_recorded() {
    let upstream = LlmUpstream::start();
    let started = std::time::Instant::now();
    let r = sluice_testkit::http::get(upstream.addr(), "/slow?ms=300");
    assert_eq!((r.status, r.text().as_str()), (200, "ok"));
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(
        sluice_testkit::http::get(upstream.addr(), "/healthz").status,
        200
    );

    call(
        upstream.addr(),
        Api::ChatCompletions,
        true,
        &[("x-api-key", "alice")],
    );
    let calls = upstream.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(
        (calls[0].method.as_str(), calls[0].path.as_str()),
        ("GET", "/slow?ms=300")
    );
    assert_eq!(calls[1].path, "/v1/chat/completions");
    assert_eq!(calls[1].headers["x-api-key"], "alice");
    assert_eq!(calls[1].json()["stream_options"]["include_usage"], true);
}

#[test]
fn the_openai_sdk_through_envoy_gets_the_usage() {
    let upstream = LlmUpstream::start();
    let envoy = envoy_to(&upstream).start();
    let headers = [
        ("authorization", "Bearer sk-alice"),
        ("x-test-usage", "input=11,output=22"),
    ];
    let calls = openai_calls(envoy.addr(), 2, false, &headers);
    for c in &calls {
        assert_eq!((c.status, c.error_type.as_deref()), (200, None), "{c:?}");
        assert_eq!(c.usage.as_ref().unwrap()["total_tokens"], 33);
        assert_eq!(c.content, "lorem iplorem iplorem ip");
    }
    let streamed = openai_calls(envoy.addr(), 2, true, &headers);
    for c in &streamed {
        assert_eq!((c.status, c.error_type.as_deref()), (200, None), "{c:?}");
        assert_eq!(c.usage.as_ref().unwrap()["prompt_tokens"], 11);
        assert!(c.first_chunk.is_some_and(|t| t <= c.elapsed));
    }
    let refused = openai_calls(envoy.addr(), 1, true, &[("x-test-status", "429")]);
    assert_eq!(refused[0].status, 429);
    assert_eq!(refused[0].error_type.as_deref(), Some("RateLimitError"));
    assert!(refused[0].error.is_some());

    let forwarded = upstream.calls();
    assert_eq!(forwarded.len(), 5);
    assert_eq!(forwarded[0].headers["authorization"], "Bearer sk-alice");
    assert!(forwarded[0]
        .headers
        .contains_key("x-envoy-expected-rq-timeout-ms"));
    assert_eq!(forwarded[2].json()["stream_options"]["include_usage"], true);

    let anthropic = call(envoy.addr(), Api::Messages, true, &[("x-api-key", "alice")]);
    let delta = &data_of(&anthropic, Some("message_delta"))[0];
    assert_eq!(delta["usage"]["output_tokens"], 20);
}

#[test]
fn envoy_passes_a_cut_stream_and_a_usage_trailer_on() {
    let upstream = LlmUpstream::start();
    let trailers = "{ enable_trailers: true }";
    let envoy = envoy_to(&upstream)
        .hcm_option("http_protocol_options", trailers)
        .start();
    let reported = [("x-test-usage-trailer", "x-usage-total-tokens")];
    let r = call(envoy.addr(), Api::ChatCompletions, true, &reported);
    assert!(r.complete);
    assert_eq!(r.trailer("x-usage-total-tokens"), Some("30"), "{r:?}");

    let r = call(
        envoy.addr(),
        Api::ChatCompletions,
        true,
        &[("x-test-cut-after", "2")],
    );
    assert_eq!(r.status, 200);
    assert!(!r.complete);
    assert_eq!(r.events().len(), 2);

    let r = call(
        envoy.addr(),
        Api::ChatCompletions,
        true,
        &[("x-test-reset", "1")],
    );
    assert_eq!(r.status, 503);
}

#[test]
fn without_enable_trailers_envoy_drops_the_trailer() {
    let upstream = LlmUpstream::start();
    let envoy = envoy_to(&upstream).start();
    let reported = [("x-test-usage-trailer", "x-usage-total-tokens")];
    let r = call(envoy.addr(), Api::ChatCompletions, true, &reported);
    assert!(r.complete);
    assert_eq!(r.trailer("x-usage-total-tokens"), None, "{r:?}");
}

#[test]
fn a_route_timeout_cuts_a_slow_upstream() {
    let upstream = LlmUpstream::start();
    let envoy = envoy_to(&upstream)
        .route_timeout(Duration::from_secs(1))
        .start();
    let started = std::time::Instant::now();
    let r = envoy.get("/slow?ms=5000", &[]);
    let waited = started.elapsed();
    assert_eq!(r.status, 504, "{}", r.text());
    assert!(
        // Envoy's timers may fire a millisecond or so before the second is up.
        waited >= Duration::from_millis(950) && waited < Duration::from_secs(4),
        "{waited:?}"
    );
}

#[test]
fn a_100_mib_stream_through_envoy_takes_seconds() {
    const SIZE: u64 = 100 << 20;
    let upstream = LlmUpstream::start();
    let envoy = envoy_to(&upstream).route_timeout(Duration::ZERO).start();
    let size = SIZE.to_string();
    for api in Api::ALL {
        let r = call(envoy.addr(), api, true, &[("x-test-stream-bytes", &size)]);
        eprintln!(
            "100 MiB {api:?} stream through Envoy: {:?} ({:.0} MiB/s), first body byte after {:?}; the upstream's RSS {} KiB",
            r.elapsed,
            r.bytes as f64 / (1 << 20) as f64 / r.elapsed.as_secs_f64(),
            r.first_body_byte.unwrap_or_default(),
            upstream.rss_kib(),
        );
        assert!(r.complete);
        assert!(
            r.bytes.abs_diff(SIZE) < 64 * 1024,
            "{api:?}: {} bytes",
            r.bytes
        );
        assert!(
            r.elapsed < Duration::from_secs(30),
            "{api:?}: {:?}",
            r.elapsed
        );
        // The body keeps its last MiB, which ends with the usage.
        let tail = r.text();
        let tail = &tail[tail.len() - 2048..];
        assert!(
            tail.contains(r#""output_tokens": 20"#) || tail.contains(r#""total_tokens": 30"#),
            "{api:?}: {tail}"
        );
    }
    // Generated as it is sent: the upstream holds one event at a time, not the stream.
    assert!(upstream.rss_kib() < 64 * 1024, "{} KiB", upstream.rss_kib());
}
