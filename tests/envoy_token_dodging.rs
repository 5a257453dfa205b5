//! Token budgets that only honest clients respect are no budgets: through a real two-worker Envoy
//! (and the real service for global budgets), a client that hides its usage, leaves early, or
//! shapes its body pays at least what an honest one pays; a global budget asks the service for
//! every request; `ask_stream_usage` changes only the bodies of the API that defines it.

// Helpers report an unexpected response by panicking, as assertions do.
#![allow(clippy::panic, clippy::indexing_slicing)]

use serde_json::{json, Value};
use sluice::output::metrics::tokens_counter;
use sluice_testkit::envoy::Envoy;
use sluice_testkit::gateway::GlobalGateway;
use sluice_testkit::llm::{call, post, post_bytes, Api, LlmResponse, LlmUpstream};

/// `per_minute` tokens a minute per API key, read from the usage's total; `cost` fields added.
fn budget(per_minute: u64, cost: Value) -> Value {
    let mut fields = json!({"from_response": {"usage": "total_tokens"}});
    for (field, value) in cost.as_object().into_iter().flatten() {
        fields[field] = value.clone();
    }
    json!({"name": "llm", "key": ["header:x-api-key"], "requests": per_minute, "per": "1m",
        "cost": fields})
}

fn local(policy: Value) -> (Envoy, LlmUpstream) {
    sluice_testkit::gateway::local(&json!({"headers": "both", "policies": [policy]}))
}

/// A global budget (failing closed) served by a real service over a real Redis.
fn global(policy: Value) -> GlobalGateway {
    GlobalGateway::start(policy, json!({}))
}

fn chat(envoy: &Envoy, headers: &[(&str, &str)], body: &Value) -> LlmResponse {
    post(
        envoy.addr(),
        "/v1/chat/completions",
        headers,
        &body.to_string(),
    )
    .unwrap_or_else(|e| panic!("POST: {e}"))
}

#[test]
fn a_global_budget_asks_the_service_for_every_request_whatever_it_reserves() {
    // 10,000 tokens a minute, nothing reserved: calls of 4,000 pass while the key has tokens
    // left, into one burst of debt at most.
    let g = global(budget(10_000, json!({})));
    let headers = [("x-api-key", "alice"), ("x-test-usage", "total=4000")];
    let mut passed = 0;
    for charged in 1..=10 {
        if call(g.envoy.addr(), Api::ChatCompletions, false, &headers).status == 200 {
            passed += 1;
            g.settled("charge", charged);
        }
    }
    assert_eq!(passed, 3, "10,000, 6,000 and 2,000 left; then 2,000 owed");
    let allowed = g.service_count("sluice_service_checks_total", &[r#"result="allowed""#]);
    assert_eq!(allowed, 3, "every request admitted was asked about");
    let denied = g.service_count("sluice_service_checks_total", &[r#"result="denied""#]);
    assert_eq!(
        denied, 1,
        "later ones wait out the refusal's retry-after here"
    );
}

#[test]
fn a_global_budget_takes_exactly_what_a_request_reserves_and_gives_back_what_it_did_not_use() {
    let reserve = json!({"reserve": {"request": "max_tokens", "default": 500}});
    let mut policy = budget(10_000, reserve);
    policy["per"] = json!("1d");
    let g = global(policy);
    let body = json!({"model": "m", "messages": [], "max_tokens": 100});
    let headers = [("x-api-key", "alice"), ("x-test-usage", "total=50")];
    for refunds in 1..=10 {
        assert_eq!(chat(&g.envoy, &headers, &body).status, 200);
        g.settled("refund", refunds);
    }
    // 10 calls of 50: 500 used; this one reserves its 100.
    let last = chat(&g.envoy, &headers, &body);
    let remaining: u64 = last
        .header("x-ratelimit-remaining")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (9_400..=9_401).contains(&remaining),
        "{remaining}: 10,000 less 500 used and 100 reserved"
    );
}

#[test]
fn ask_stream_usage_reaches_the_upstream_through_a_global_budget() {
    let g = global(budget(10_000, json!({"ask_stream_usage": true})));
    let body = json!({"model": "m", "messages": [], "stream": true});
    let headers = [("x-api-key", "alice"), ("x-test-usage", "total=3000")];
    for charged in 1..=3 {
        assert_eq!(chat(&g.envoy, &headers, &body).status, 200);
        g.settled("charge", charged);
    }
    let forwarded = g.upstream.calls().pop().unwrap().json();
    assert_eq!(forwarded["stream_options"]["include_usage"], true);
    assert_eq!(
        chat(&g.envoy, &headers, &body).status,
        200,
        "1,000 left: into debt"
    );
    g.settled("charge", 4);
    assert_eq!(
        chat(&g.envoy, &headers, &body).status,
        429,
        "each stream charged its 3,000"
    );
}

#[test]
fn ask_stream_usage_leaves_other_apis_bodies_as_sent() {
    let (envoy, upstream) = local(budget(10_000, json!({"ask_stream_usage": true})));
    let sent = Api::Messages.body(true);
    let r = post(
        envoy.addr(),
        "/v1/messages",
        &[("x-api-key", "alice")],
        &sent,
    )
    .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        upstream.calls().pop().unwrap().body,
        sent,
        "Anthropic's body byte for byte"
    );
}

#[test]
fn a_client_that_hides_its_usage_is_charged_the_most_its_key_can_owe() {
    let (envoy, _upstream) = local(budget(10_000, json!({})));
    let hidden = json!({"model": "m", "messages": [], "stream": true,
        "stream_options": {"include_usage": false}});
    let headers = [("x-api-key", "mallory"), ("x-test-usage", "total=3000")];
    assert_eq!(chat(&envoy, &headers, &hidden).status, 200);
    let charged = tokens_counter("llm", "tokens_charged_total");
    assert_eq!(
        envoy.wait_for_wasm_counter(&charged, 20_000),
        20_000,
        "the capacity and a burst of debt"
    );
    assert_eq!(
        chat(&envoy, &headers, &hidden).status,
        429,
        "where an honest client's 3,000 leave room for more"
    );
}

#[test]
fn an_anthropic_stream_left_before_its_final_usage_is_charged_as_unknown() {
    let (envoy, _upstream) = local(budget(10_000, json!({"on_unknown": 5000})));
    // message_start (its usage a first guess of 1 output token), content_block_start, cut.
    let headers = [
        ("x-api-key", "alice"),
        ("x-test-events", "10"),
        ("x-test-cut-after", "2"),
        ("x-test-usage", "input=10,output=2000"),
    ];
    let r = call(envoy.addr(), Api::Messages, true, &headers);
    assert!(!r.complete, "the stream broke off");
    let charged = tokens_counter("llm", "tokens_charged_total");
    assert_eq!(envoy.wait_for_wasm_counter(&charged, 5000), 5000);
}

#[test]
fn output_limits_are_read_as_the_upstream_reads_them() {
    let reserve = json!({"reserve": {"request": "max_tokens", "default": 500}});
    let (envoy, _upstream) = local(budget(10_000, reserve));
    for (key, limit) in [
        ("a", json!(5000.0)),
        ("b", json!("5000")),
        ("c", json!(5000)),
    ] {
        let body = json!({"model": "m", "messages": [], "max_tokens": limit});
        let r = chat(&envoy, &[("x-api-key", key)], &body);
        assert_eq!(r.header("x-ratelimit-remaining"), Some("5000"), "{limit}");
    }
    let odd = json!({"model": "m", "messages": [], "max_tokens": "lots"});
    let r = chat(&envoy, &[("x-api-key", "d")], &odd);
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some("0"),
        "an unreadable limit reserves the whole budget"
    );
}

#[test]
fn an_error_the_upstream_answers_costs_nothing() {
    let (envoy, _upstream) = local(budget(10_000, json!({})));
    let failing = [("x-api-key", "alice"), ("x-test-status", "400")];
    assert_eq!(
        call(envoy.addr(), Api::ChatCompletions, false, &failing).status,
        400
    );
    let r = call(
        envoy.addr(),
        Api::ChatCompletions,
        false,
        &[("x-api-key", "alice")],
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("10000"));
}

#[test]
fn a_per_model_key_cannot_be_hidden_by_the_shape_of_the_body() {
    let mut policy = budget(500, json!({"reserve": 100}));
    policy["key"] = json!(["header:x-api-key", "body:model"]);
    let (envoy, upstream) = local(policy);
    let headers = [("x-api-key", "alice"), ("x-test-usage", "total=450")];
    let plain = json!({"model": "small", "messages": []}).to_string();
    let send = |body: &[u8]| {
        post_bytes(envoy.addr(), "/v1/chat/completions", &headers, body)
            .unwrap()
            .status
    };
    assert_eq!(send(plain.as_bytes()), 200);
    let with_bom = [b"\xEF\xBB\xBF".as_slice(), plain.as_bytes()].concat();
    assert_eq!(
        send(&with_bom),
        429,
        "a byte-order mark names the same model"
    );
    let padding = "x".repeat(300 * 1024);
    let padded = json!({"pad": padding, "model": "small", "messages": []}).to_string();
    let big = [("x-api-key", "alice"), ("x-test-usage", "total=450")];
    let r = post(envoy.addr(), "/v1/chat/completions", &big, &padded).unwrap();
    assert_eq!(r.status, 429, "a model after 300 KiB is read");
    let utf16: Vec<u8> = plain.encode_utf16().flat_map(u16::to_le_bytes).collect();
    let before = upstream.calls().len();
    let r = post_bytes(envoy.addr(), "/v1/chat/completions", &headers, &utf16).unwrap();
    assert_eq!(
        r.status, 400,
        "UTF-16, which the filter cannot read, is refused"
    );
    assert_eq!(r.json()["error"], "unreadable_request_body");
    assert_eq!(
        upstream.calls().len(),
        before,
        "and never reaches the upstream"
    );
}

#[test]
fn a_stream_its_client_leaves_is_logged_with_what_it_was_charged() {
    let upstream = LlmUpstream::start();
    let policy = budget(10_000, json!({"reserve": 100, "on_unknown": 700}));
    let config = json!({"policies": [policy]}).to_string();
    let envoy = Envoy::options(&config)
        .upstream(upstream.addr())
        .access_log(r#"{"text_format": "%FILTER_STATE(wasm.sluice:PLAIN)%\n"}"#)
        .start();
    let mut client = std::net::TcpStream::connect(envoy.addr()).unwrap();
    let body = Api::ChatCompletions.body(true);
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\nx-api-key: bob\r\nx-test-events: 20\r\n\
         x-test-event-ms: 200\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    std::io::Write::write_all(&mut client, request.as_bytes()).unwrap();
    let mut first = [0u8; 512];
    assert!(
        std::io::Read::read(&mut client, &mut first).unwrap() > 0,
        "the stream began"
    );
    drop(client);
    let lines = envoy.access_log(1);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("tokens=llm:100:700"), "{lines:?}");
}
