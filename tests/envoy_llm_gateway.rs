//! An LLM gateway the provider SDKs cannot tell from the provider: through a real two-worker
//! Envoy in front of the test kit's LLM upstream, with the official `openai` and `anthropic`
//! SDKs as the judges, a policy's `api` makes its refusals the provider's own rate-limit error,
//! carrying sluice's message and wait, and puts the provider's rate-limit headers on every
//! answer, requests and tokens apart, whatever other policy (a concurrency limit) applies.

// Helpers report an unexpected response by panicking, as assertions do.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use serde_json::{json, Value};
use sluice_testkit::envoy::Envoy;
use sluice_testkit::gateway::local;
use sluice_testkit::llm::{anthropic_calls, openai_calls, post, Api, LlmUpstream, OpenAiCall};

/// Per API key: `tokens` a day read from the usage with `usage` (a minute's refilled a token every
/// 60 ms of a loaded machine's run: `601` left, not `600`), each request reserving 100,
/// 50 requests a second, and 2 in flight.
fn gateway(api: &str, tokens: u64, usage: Value) -> (Envoy, LlmUpstream) {
    local(&json!({"api": api, "policies": [
        {"name": "llm-tokens", "key": ["header:x-api-key"], "requests": tokens, "per": "1d",
            "cost": {"from_response": {"usage": usage}, "reserve": 100}},
        {"name": "llm-requests", "key": ["header:x-api-key"], "requests": 50, "per": "1s"},
        {"name": "in-flight", "key": ["header:x-api-key"], "algorithm": "concurrency",
            "requests": 2}
    ]}))
}

fn statuses(calls: &[OpenAiCall]) -> Vec<u16> {
    calls.iter().map(|c| c.status).collect()
}

fn header<'a>(call: &'a OpenAiCall, name: &str) -> &'a str {
    call.headers
        .get(name)
        .map_or_else(|| panic!("no {name}: {:?}", call.headers), String::as_str)
}

#[test]
fn the_openai_sdk_raises_its_rate_limit_error_with_sluices_message_and_reads_both_balances() {
    let (envoy, _upstream) = gateway("openai", 1000, json!("total_tokens"));
    for stream in [false, true] {
        let key = if stream { "streaming" } else { "json" };
        let headers = [("x-api-key", key), ("x-test-usage", "input=100,output=200")];
        let calls = openai_calls(envoy.addr(), 5, stream, &headers);
        assert_eq!(
            statuses(&calls),
            [200, 200, 200, 200, 429],
            "{key}: {calls:?}"
        );
        // The first answer: its reservation of 100 taken from 1,000, one request of 50; the
        // concurrency policy (1 of 2 left) hides neither.
        let first = &calls[0];
        assert_eq!(header(first, "x-ratelimit-limit-tokens"), "1000");
        assert_eq!(header(first, "x-ratelimit-remaining-tokens"), "900");
        assert_eq!(header(first, "x-ratelimit-limit-requests"), "50");
        assert_eq!(header(first, "x-ratelimit-remaining-requests"), "49");
        assert!(header(first, "x-ratelimit-reset-tokens").ends_with('s'));
        assert!(header(first, "x-ratelimit-reset-requests").ends_with('s'));
        // The second: charged 300 for the first, reserving 100.
        assert_eq!(header(&calls[1], "x-ratelimit-remaining-tokens"), "600");
        let refused = &calls[4];
        assert_eq!(refused.error_type.as_deref(), Some("RateLimitError"));
        let retry = header(refused, "retry-after").to_string();
        let error = refused.error.as_ref().unwrap();
        assert_eq!(error["code"], "rate_limit_exceeded", "{error}");
        assert_eq!(error["type"], "tokens");
        assert_eq!(
            error["message"],
            format!(
                "rate limit exceeded: policy llm-tokens, reserving 100 tokens, retry after {retry}s"
            )
        );
        let message = refused.message.as_deref().unwrap_or_default();
        assert!(message.contains("policy llm-tokens"), "{message}");
        assert!(
            message.contains(&format!("retry after {retry}s")),
            "{message}"
        );
        assert_eq!(header(refused, "x-ratelimit-remaining-tokens"), "0");
    }
}

#[test]
fn the_anthropic_sdk_raises_its_rate_limit_error_with_sluices_message_and_reads_both_balances() {
    let usage = json!({"input_tokens": 1, "output_tokens": 1});
    let (envoy, _upstream) = gateway("anthropic", 1000, usage);
    for stream in [false, true] {
        let key = if stream { "streaming" } else { "json" };
        let headers = [("x-api-key", key), ("x-test-usage", "input=100,output=200")];
        let calls = anthropic_calls(envoy.addr(), 5, stream, &headers);
        assert_eq!(
            statuses(&calls),
            [200, 200, 200, 200, 429],
            "{key}: {calls:?}"
        );
        let first = &calls[0];
        assert_eq!(header(first, "anthropic-ratelimit-tokens-limit"), "1000");
        assert_eq!(header(first, "anthropic-ratelimit-tokens-remaining"), "900");
        assert_eq!(header(first, "anthropic-ratelimit-requests-limit"), "50");
        assert_eq!(
            header(first, "anthropic-ratelimit-requests-remaining"),
            "49"
        );
        for reset in [
            "anthropic-ratelimit-tokens-reset",
            "anthropic-ratelimit-requests-reset",
        ] {
            let at = header(first, reset);
            assert!(at.len() == 20 && at.ends_with('Z'), "{reset}: {at}");
        }
        assert_eq!(
            header(&calls[1], "anthropic-ratelimit-tokens-remaining"),
            "600"
        );
        let refused = &calls[4];
        assert_eq!(refused.error_type.as_deref(), Some("RateLimitError"));
        let retry = header(refused, "retry-after").to_string();
        let body = refused.error.as_ref().unwrap();
        assert_eq!(body["type"], "error", "{body}");
        assert_eq!(body["error"]["type"], "rate_limit_error");
        assert_eq!(
            body["error"]["message"],
            format!(
                "rate limit exceeded: policy llm-tokens, reserving 100 tokens, retry after {retry}s"
            )
        );
        let message = refused.message.as_deref().unwrap_or_default();
        assert!(message.contains("policy llm-tokens"), "{message}");
    }
}

#[test]
fn a_gemini_route_refuses_with_googles_resource_exhausted_and_a_policys_api_wins() {
    let upstream = LlmUpstream::start();
    let config = json!({"api": "openai", "policies": [
        {"name": "gemini-rpm", "match": {"path_prefix": "/v1beta/"}, "api": "gemini",
            "key": ["header:x-goog-api-key"], "requests": 1, "per": "1m"},
        {"name": "chat-rpm", "match": {"path_prefix": "/v1/"},
            "key": ["header:x-api-key"], "requests": 1, "per": "1m"}
    ]})
    .to_string();
    let envoy = Envoy::options(&config).upstream(upstream.addr()).start();
    let gemini = [("x-goog-api-key", "k")];
    let path = "/v1beta/models/test-model:generateContent";
    post(envoy.addr(), path, &gemini, "{}").unwrap();
    let refused = post(envoy.addr(), path, &gemini, "{}").unwrap();
    assert_eq!(refused.status, 429);
    let retry = refused.header("retry-after").unwrap().to_string();
    assert_eq!(
        refused.json(),
        json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED",
            "message": format!("rate limit exceeded: policy gemini-rpm, retry after {retry}s")}})
    );
    assert_eq!(refused.header("x-ratelimit-limit-requests"), None);
    let chat = [("x-api-key", "k")];
    let body = Api::ChatCompletions.body(false);
    let first = post(envoy.addr(), Api::ChatCompletions.path(), &chat, &body).unwrap();
    assert_eq!(first.header("x-ratelimit-remaining-requests"), Some("0"));
    let refused = post(envoy.addr(), Api::ChatCompletions.path(), &chat, &body).unwrap();
    assert_eq!(refused.status, 429);
    assert_eq!(refused.json()["error"]["type"], "requests");
}

/// What one call answered with usage `shape` is charged, JSON and streamed, by a daily budget
/// metering `usage`: the token balance the provider headers give before it less the one after.
fn charged_by_weights(api: &str, usage: Value, shape: &str, path_api: Api) -> Vec<u64> {
    let upstream = LlmUpstream::start();
    let config = json!({"api": api, "policies": [
        {"name": "llm-tokens", "key": ["header:x-api-key"], "requests": 1_000_000, "per": "1d",
            "algorithm": "fixed_window", "cost": {"from_response": {"usage": usage}, "reserve": 1}}
    ]})
    .to_string();
    let envoy = Envoy::options(&config).upstream(upstream.addr()).start();
    let mut remaining: Vec<u64> = Vec::new();
    for stream in [false, true] {
        let key = if stream { "stream" } else { "json" };
        let headers = [("x-api-key", key), ("x-test-usage", shape)];
        let body = path_api.body(stream);
        for _ in 0..2 {
            let r = post(envoy.addr(), path_api.path(), &headers, &body).unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
            let name = match api {
                "anthropic" => "anthropic-ratelimit-tokens-remaining",
                _ => "x-ratelimit-remaining-tokens",
            };
            remaining.push(r.header(name).unwrap().parse().unwrap());
        }
    }
    // The second call's reservation of 1 replaces the first's, settled.
    remaining.chunks(2).map(|pair| pair[0] - pair[1]).collect()
}

#[test]
fn anthropic_cache_tokens_are_charged_apart_from_the_input_by_their_weights() {
    let shape = "input=20,output=30,cache_read=5000,cache_write=1000";
    // By default every token Anthropic counts: 6,050 (the response was charged 50).
    let plain = json!({"input_tokens": 1, "output_tokens": 1});
    assert_eq!(
        charged_by_weights("anthropic", plain, shape, Api::Messages),
        [6050, 6050]
    );
    // Cache reads at a tenth of the input, writes at 1.25 times, in tenths of a token.
    let priced = json!({"input_tokens": 10, "output_tokens": 10,
        "cache_read_input_tokens": 1, "cache_creation_input_tokens": 12});
    let expected = 200 + 300 + 5000 + 12_000;
    assert_eq!(
        charged_by_weights("anthropic", priced, shape, Api::Messages),
        [expected, expected]
    );
}

#[test]
fn openai_cached_and_reasoning_tokens_are_charged_once_by_their_weights() {
    let shape = "input=1000,output=500,cached=800,reasoning=300";
    let plain = json!({"prompt_tokens": 1, "completion_tokens": 1});
    assert_eq!(
        charged_by_weights("openai", plain, shape, Api::ChatCompletions),
        [1500, 1500]
    );
    let priced = json!({"prompt_tokens": 4, "cached_tokens": 1, "completion_tokens": 16});
    let expected = 200 * 4 + 800 + 500 * 16;
    for api in [Api::ChatCompletions, Api::Responses] {
        assert_eq!(
            charged_by_weights("openai", priced.clone(), shape, api),
            [expected, expected],
            "{api:?}"
        );
    }
}

#[test]
fn the_anthropic_sdk_reads_input_and_output_token_balances_from_budgets_counting_each() {
    // A day's budgets: no token refills while the calls run, however slowly.
    let budget = |name: &str, usage: &str, tokens: u64| {
        json!({"name": name, "key": ["header:x-api-key"], "requests": tokens, "per": "1d",
            "cost": {"from_response": {"usage": usage}, "reserve": 100}})
    };
    let (envoy, _upstream) = local(&json!({"api": "anthropic", "policies": [
        budget("input-tokens", "input_tokens", 1000),
        budget("output-tokens", "output_tokens", 500),
    ]}));
    for stream in [false, true] {
        let key = if stream { "streaming" } else { "json" };
        let headers = [("x-api-key", key), ("x-test-usage", "input=100,output=200")];
        let calls = anthropic_calls(envoy.addr(), 2, stream, &headers);
        assert_eq!(statuses(&calls), [200, 200], "{key}: {calls:?}");
        let (first, second) = (&calls[0], &calls[1]);
        assert_eq!(
            header(first, "anthropic-ratelimit-input-tokens-limit"),
            "1000"
        );
        assert_eq!(
            header(first, "anthropic-ratelimit-input-tokens-remaining"),
            "900"
        );
        assert_eq!(
            header(first, "anthropic-ratelimit-output-tokens-limit"),
            "500"
        );
        assert_eq!(
            header(first, "anthropic-ratelimit-output-tokens-remaining"),
            "400"
        );
        // Charged 100 in and 200 out, each reserving 100 again.
        let input = header(second, "anthropic-ratelimit-input-tokens-remaining");
        let output = header(second, "anthropic-ratelimit-output-tokens-remaining");
        assert_eq!((input, output), ("800", "200"));
        // The tokens family is the tighter of the two.
        assert_eq!(
            header(second, "anthropic-ratelimit-tokens-remaining"),
            "200"
        );
        for side in ["input", "output"] {
            let at = header(first, &format!("anthropic-ratelimit-{side}-tokens-reset"));
            assert!(at.len() == 20 && at.ends_with('Z'), "{side}: {at}");
        }
    }
}
