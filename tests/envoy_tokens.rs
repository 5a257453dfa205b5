//! Token budgets in a real two-worker Envoy in front of the test kit's LLM upstream
//! (`sluice_testkit::llm`), with the official openai SDK as the client: a policy's cost read from
//! the response's usage, JSON or streamed, reserved before and settled after, with its debt, its
//! refunds, what an aborted stream is charged, per-model keys, a 100 MiB stream that neither
//! grows Envoy nor waits, and compressed answers: gzip and deflate read as plain ones are, any
//! other coding charged as `on_unknown` says, and the upstream asked only for codings sluice
//! decodes.

// Helpers report an unexpected response by panicking, as assertions do.
#![allow(clippy::panic, clippy::indexing_slicing)]

use serde_json::{json, Value};
use sluice::output::metrics::{
    keys_in_debt_gauge, tokens_counter, usage_unknown_counter, UsageUnknown,
};
use sluice_testkit::envoy::Envoy;
use sluice_testkit::llm::{openai_calls, post, Api, LlmUpstream};
use std::time::Duration;

/// A budget of `per_minute` tokens a minute per API key, read from the usage's total, each
/// request reserving `reserve`, with `extra` fields in its cost.
fn budget(name: &str, per_minute: u64, reserve: u64, extra: Value) -> Value {
    let mut cost = json!({"from_response": {"usage": "total_tokens"}, "reserve": reserve});
    for (field, value) in extra.as_object().into_iter().flatten() {
        cost[field] = value.clone();
    }
    json!({"name": name, "key": ["header:x-api-key"], "requests": per_minute, "per": "1m",
        "cost": cost})
}

fn start(policies: Value) -> (Envoy, LlmUpstream) {
    let upstream = LlmUpstream::start();
    let config = json!({"headers": "both", "policies": policies}).to_string();
    let envoy = Envoy::options(&config).upstream(upstream.addr()).start();
    (envoy, upstream)
}

fn statuses(calls: &[sluice_testkit::llm::OpenAiCall]) -> Vec<u16> {
    calls.iter().map(|c| c.status).collect()
}

#[test]
fn the_openai_sdk_is_charged_its_usage_per_minute_and_per_day_beside_a_request_rate() {
    let per_day = json!({"name": "llm-day", "key": ["header:x-api-key"], "requests": 5000,
        "per": "1d", "algorithm": "fixed_window",
        "cost": {"from_response": {"usage": "total_tokens"}, "reserve": 100}});
    let per_second =
        json!({"name": "rps", "key": ["header:x-api-key"], "requests": 50, "per": "1s"});
    let (envoy, _upstream) = start(json!([
        budget("llm", 1000, 100, json!({})),
        per_day,
        per_second
    ]));
    for stream in [false, true] {
        let key = if stream { "streaming" } else { "json" };
        let headers = [("x-api-key", key), ("x-test-usage", "input=100,output=200")];
        let calls = openai_calls(envoy.addr(), 5, stream, &headers);
        // 1,000 tokens: 300 a call, reserving 100: the fourth passes on the last 100 and leaves
        // the key owing 200; the fifth waits.
        assert_eq!(
            statuses(&calls),
            [200, 200, 200, 200, 429],
            "{key}: {calls:?}"
        );
        assert_eq!(calls[0].usage.as_ref().unwrap()["total_tokens"], 300);
        let refused = &calls[4];
        assert_eq!(refused.error_type.as_deref(), Some("RateLimitError"));
        assert_eq!(refused.headers["x-ratelimit-remaining"], "0");
        // 200 owed and 100 to reserve, at 1,000 a minute: 18 s.
        let retry: u64 = refused.headers["retry-after"].parse().unwrap();
        assert!((17..=18).contains(&retry), "{retry}");
    }
    let charged =
        envoy.wait_for_wasm_counter(&tokens_counter("llm-day", "tokens_charged_total"), 2400);
    assert_eq!(
        charged, 2400,
        "both keys' eight calls, on the daily budget too"
    );
}

#[test]
fn a_debt_is_refused_until_refill_covers_the_reservation_and_unused_tokens_come_back() {
    let (envoy, _upstream) = start(json!([budget("llm", 1000, 500, json!({}))]));
    let alice = |usage: &str| {
        let headers = [("x-api-key", "alice"), ("x-test-usage", usage)];
        sluice_testkit::llm::call(envoy.addr(), Api::ChatCompletions, false, &headers)
    };
    let first = alice("total=100");
    assert_eq!(first.status, 200);
    assert_eq!(
        first.header("x-ratelimit-remaining"),
        Some("500"),
        "500 reserved"
    );
    let second = alice("total=3000");
    assert_eq!(
        second.header("x-ratelimit-remaining"),
        Some("400"),
        "400 refunded before"
    );
    // 3,000 used of 500 reserved: 2,500 charged, at most one burst (1,000) past the limit.
    let refused = alice("total=1");
    assert_eq!(refused.status, 429, "{}", refused.text());
    // 1,000 owed and 500 to reserve, at 1,000 a minute: 90 s.
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((89..=90).contains(&retry), "{retry}");
    let owed = envoy.wait_for_wasm_counter(&tokens_counter("llm", "tokens_owed_total"), 1000);
    assert_eq!(owed, 1000);
    let in_debt = envoy.wait_for_wasm_counter(&keys_in_debt_gauge("llm"), 1);
    assert_eq!(in_debt, 1, "alice owes");
}

#[test]
fn a_stream_cut_by_the_upstream_or_left_by_the_client_is_charged_as_on_unknown_says() {
    let policy = budget("llm", 10_000, 100, json!({"on_unknown": 700}));
    let (envoy, _upstream) = start(json!([policy]));
    let cut = [
        ("x-api-key", "alice"),
        ("x-test-events", "10"),
        ("x-test-cut-after", "3"),
    ];
    let r = sluice_testkit::llm::call(envoy.addr(), Api::ChatCompletions, true, &cut);
    assert!(!r.complete, "the stream broke off");
    let reset = usage_unknown_counter("llm", UsageUnknown::Reset);
    assert_eq!(envoy.wait_for_wasm_counter(&reset, 1), 1);
    let charged = tokens_counter("llm", "tokens_charged_total");
    assert_eq!(envoy.wait_for_wasm_counter(&charged, 700), 700);
    // The client leaves mid-stream, after its first event.
    let mut client = std::net::TcpStream::connect(envoy.addr()).unwrap();
    let body = Api::ChatCompletions.body(true);
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\nx-api-key: bob\r\nx-test-events: 20\r\nx-test-event-ms: 200\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    std::io::Write::write_all(&mut client, request.as_bytes()).unwrap();
    let mut first = [0u8; 512];
    let read = std::io::Read::read(&mut client, &mut first).unwrap();
    assert!(read > 0, "the stream began");
    drop(client);
    assert_eq!(
        envoy.wait_for_wasm_counter(&reset, 2),
        2,
        "the client's leaving too"
    );
    assert_eq!(envoy.wait_for_wasm_counter(&charged, 1400), 1400);
    let none = [("x-api-key", "alice"), ("x-test-usage", "none")];
    sluice_testkit::llm::call(envoy.addr(), Api::Messages, false, &none);
    let missing = usage_unknown_counter("llm", UsageUnknown::Missing);
    assert_eq!(envoy.wait_for_wasm_counter(&missing, 1), 1);
}

#[test]
fn a_key_can_be_per_model_from_the_request_body() {
    let mut policy = budget("llm", 500, 100, json!({}));
    policy["key"] = json!(["header:x-api-key", "body:model"]);
    let (envoy, _upstream) = start(json!([policy]));
    let ask = |model: &str| {
        let body = json!({"messages": [{"role": "user", "content": "hi"}], "model": model});
        let headers = [("x-api-key", "alice"), ("x-test-usage", "total=450")];
        post(
            envoy.addr(),
            "/v1/chat/completions",
            &headers,
            &body.to_string(),
        )
        .unwrap()
    };
    assert_eq!(ask("small").status, 200);
    assert_eq!(
        ask("small").status,
        429,
        "50 left of small's budget: less than a reservation"
    );
    assert_eq!(ask("large").status, 200, "large has its own");
}

#[test]
fn a_stream_is_asked_for_its_usage_when_the_policy_says_so() {
    let policy = budget("llm", 10_000, 0, json!({"ask_stream_usage": true}));
    let (envoy, upstream) = start(json!([policy]));
    let body = json!({"model": "m", "messages": [], "stream": true});
    let headers = [("x-api-key", "alice"), ("x-test-usage", "total=77")];
    let r = post(
        envoy.addr(),
        "/v1/chat/completions",
        &headers,
        &body.to_string(),
    )
    .unwrap();
    assert_eq!(r.status, 200);
    let forwarded = upstream.calls().pop().unwrap().json();
    assert_eq!(forwarded["stream_options"]["include_usage"], true);
    let charged = tokens_counter("llm", "tokens_charged_total");
    assert_eq!(envoy.wait_for_wasm_counter(&charged, 77), 77);
}

#[test]
fn a_100_mib_stream_is_read_as_it_passes_without_growing_envoy_or_delaying_its_first_byte() {
    let (envoy, _upstream) = start(json!([budget("llm", 1_000_000, 100, json!({}))]));
    let warm = [("x-api-key", "warm"), ("x-test-stream-bytes", "1048576")];
    sluice_testkit::llm::call(envoy.addr(), Api::ChatCompletions, true, &warm);
    let before = envoy.rss_kib();
    let big = [
        ("x-api-key", "alice"),
        ("x-test-stream-bytes", "104857600"),
        ("x-test-usage", "total=4242"),
    ];
    let r = sluice_testkit::llm::call(envoy.addr(), Api::ChatCompletions, true, &big);
    assert!(r.complete && r.bytes > 100 << 20, "{} bytes", r.bytes);
    let grown = envoy.rss_kib().saturating_sub(before);
    assert!(
        grown < 16 * 1024,
        "Envoy grew {grown} KiB over a 100 MiB stream"
    );
    let charged = tokens_counter("llm", "tokens_charged_total");
    assert_eq!(envoy.wait_for_wasm_counter(&charged, 4242 + 30), 4242 + 30);
    let slow = [
        ("x-api-key", "bob"),
        ("x-test-events", "5"),
        ("x-test-event-ms", "400"),
    ];
    let r = sluice_testkit::llm::call(envoy.addr(), Api::ChatCompletions, true, &slow);
    let first = r.first_body_byte.unwrap();
    assert!(
        first < Duration::from_millis(300),
        "first byte after {first:?}: held back"
    );
}

/// The RLS pair: sluice reads the usage and publishes it as filter state; Envoy's own ratelimit
/// filter charges it to `sluice-service --rls` when the stream is done
/// (`apply_on_stream_done`, `hits_addend` from `%FILTER_STATE(wasm.sluice.tokens.llm:PLAIN)%`),
/// and refuses the next request of the key once the count is over (`hits_addend` 0 before it).
const RLS_PAIR: &str = r#"
admin:
  address: { socket_address: { address: 127.0.0.1, port_value: {admin_port} } }
static_resources:
  listeners:
  - name: front
    address: { socket_address: { address: 127.0.0.1, port_value: {port} } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: front
          route_config:
            virtual_hosts:
            - name: front
              domains: ["*"]
              routes:
              - match: { prefix: / }
                route: { cluster: upstream }
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    rate_limits:
                    - actions: [{ request_headers: { header_name: x-api-key, descriptor_key: user } }]
                      hits_addend: { number: 0 }
                    - actions: [{ request_headers: { header_name: x-api-key, descriptor_key: user } }]
                      apply_on_stream_done: true
                      hits_addend: { format: "%FILTER_STATE(wasm.sluice.tokens.llm:PLAIN)%" }
          http_filters:
          - name: envoy.filters.http.wasm
            typed_config: {sluice}
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: tokens
              timeout: 1s
              failure_mode_deny: true
              rate_limit_service:
                transport_api_version: V3
                grpc_service: { envoy_grpc: { cluster_name: sluice_rls, authority: sluice-rls } }
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: upstream
    type: STATIC
    connect_timeout: 0.25s
    load_assignment:
      cluster_name: upstream
      endpoints:
      - lb_endpoints:
        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: {upstream_port} } } }
{rls_cluster}"#;

#[test]
fn envoys_own_ratelimit_filter_charges_the_usage_sluice_read_when_the_stream_is_done() {
    use sluice_testkit::envoy::{grpc_cluster, wasm_path, EnvoyOptions};
    let redis = sluice_testkit::redis::RedisServer::start();
    let limits = "domain: tokens\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n";
    let rls = sluice_testkit::service::Rls::start(&["--redis", &redis.url()], limits, &[]);
    let upstream = LlmUpstream::start();
    // sluice only meters here: a shadow policy with room for anything.
    let mut meter = budget("llm", 1_000_000_000, 0, json!({}));
    meter["mode"] = json!("shadow");
    let plugin = json!({"policies": [meter]}).to_string();
    let sluice = json!({"@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
        "config": {"name": "sluice", "root_id": "sluice",
        "allow_on_headers_stop_iteration": true, "vm_config": {"vm_id": "sluice",
        "runtime": "envoy.wasm.runtime.v8", "code": {"local": {"filename": wasm_path()}}},
        "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue",
        "value": plugin}}});
    let bootstrap = RLS_PAIR
        .replace("{sluice}", &sluice.to_string())
        .replace("{rls_cluster}", &grpc_cluster("sluice_rls", rls.address()))
        .replace("{upstream_port}", &upstream.addr().port().to_string());
    let envoy = EnvoyOptions::bootstrap(&bootstrap).start();
    let ask = |usage: &str| {
        let headers = [("x-api-key", "alice"), ("x-test-usage", usage)];
        sluice_testkit::llm::call(envoy.addr(), Api::ChatCompletions, true, &headers).status
    };
    assert_eq!(ask("total=1500"), 200, "within the limit when it starts");
    let refused = sluice_testkit::wait_for(Duration::from_secs(5), || {
        (ask("total=1") == 429).then_some(())
    });
    assert!(
        refused.is_some(),
        "the 1,500 tokens charged after the stream refuse the next"
    );
}

#[test]
fn a_global_budget_is_exact_across_two_envoys_its_usage_settled_after_the_response() {
    let redis = sluice_testkit::redis::RedisServer::start();
    let service = sluice_testkit::service::Service::start(&redis.url());
    let upstream = LlmUpstream::start();
    // 1,000 tokens a day: no refill to speak of during the test.
    let mut policy = budget("llm", 1000, 100, json!({}));
    (policy["per"], policy["scope"]) = (json!("1d"), json!("global"));
    policy["failure_mode"] = json!("closed");
    let config = json!({"headers": "both", "policies": [policy],
        "global": {"cluster": "sluice_service", "authority": "sluice-service", "timeout": "500ms"}})
    .to_string();
    let envoy = || {
        Envoy::options(&config)
            .service(&[service.addr])
            .upstream(upstream.addr())
            .start()
    };
    let (first, second) = (envoy(), envoy());
    let ask = |envoy: &Envoy, usage: &str| {
        let headers = [("x-api-key", "alice"), ("x-test-usage", usage)];
        sluice_testkit::llm::call(envoy.addr(), Api::ChatCompletions, false, &headers)
    };
    assert_eq!(ask(&first, "total=800").status, 200);
    // The 700 beyond its reservation leave the first Envoy's outbox after the response, from
    // its next tick: the second Envoy then finds 200 left, and reserves 100 of them.
    let settled = sluice_testkit::wait_for(Duration::from_secs(5), || {
        let metrics = sluice_testkit::http::get(service.addr, "/metrics").text();
        metrics
            .contains(r#"sluice_service_settlements_total{op="charge",result="applied"} 1"#)
            .then_some(())
    });
    assert!(
        settled.is_some(),
        "the first Envoy's usage settled within 5 s"
    );
    let second_ask = ask(&second, "total=500");
    assert_eq!(second_ask.status, 200);
    assert_eq!(second_ask.header("x-ratelimit-remaining"), Some("100"));
    let refused = sluice_testkit::wait_for(Duration::from_secs(5), || {
        (ask(&first, "total=1").status == 429).then_some(())
    });
    assert!(
        refused.is_some(),
        "owing 400 after the second's usage, through either Envoy"
    );
}

/// Calls of each API, plain, gzip and deflate, JSON and streamed, each reporting its own total:
/// each is charged exactly that, whatever its coding, and none is unknown.
#[test]
fn gzip_and_deflate_responses_are_charged_their_usage_as_plain_ones_are() {
    let policy = budget("llm", 1_000_000, 10, json!({"on_unknown": 5000}));
    let (envoy, _upstream) = start(json!([policy]));
    let mut expected = 0;
    let mut total = 100;
    for coding in ["identity", "gzip", "x-gzip", "deflate"] {
        for api in Api::ALL {
            for stream in [false, true] {
                total += 1;
                // Input and output: Anthropic reports no total.
                let usage = format!("input={total},output=1");
                let mut headers = vec![("x-api-key", "alice"), ("x-test-usage", &usage)];
                if coding != "identity" {
                    headers.push(("x-test-content-encoding", coding));
                }
                let charged = total + 1;
                let r = sluice_testkit::llm::call(envoy.addr(), api, stream, &headers);
                assert_eq!(r.status, 200, "{coding} {api:?} {stream}");
                let label = (coding != "identity").then_some(coding);
                assert_eq!(r.header("content-encoding"), label, "passed on as it came");
                expected += charged;
            }
        }
    }
    let charged = tokens_counter("llm", "tokens_charged_total");
    assert_eq!(envoy.wait_for_wasm_counter(&charged, expected), expected);
    for why in UsageUnknown::ALL {
        let unknown = envoy.wasm_counter(&usage_unknown_counter("llm", why));
        assert_eq!(unknown.unwrap_or(0), 0, "{why:?}");
    }
}

/// The openai SDK asks for gzip (`accept-encoding: gzip, deflate`), and gets it from an upstream
/// that compresses: its calls are charged their usage as uncompressed ones are.
#[test]
fn the_openai_sdk_is_charged_its_usage_when_the_upstream_answers_in_gzip() {
    let policy = budget("llm", 1000, 100, json!({"on_unknown": 5000}));
    let (envoy, upstream) = start(json!([policy]));
    for stream in [false, true] {
        let key = if stream { "streaming" } else { "json" };
        let headers = [
            ("x-api-key", key),
            ("x-test-usage", "input=100,output=200"),
            ("x-test-content-encoding", "negotiate"),
        ];
        let calls = openai_calls(envoy.addr(), 5, stream, &headers);
        // As plain: 300 a call against 1,000, reserving 100: the fifth is refused.
        assert_eq!(
            statuses(&calls),
            [200, 200, 200, 200, 429],
            "{key}: {calls:?}"
        );
        assert_eq!(calls[0].usage.as_ref().unwrap()["total_tokens"], 300);
    }
    let asked = upstream.calls()[0].headers["accept-encoding"].clone();
    assert!(asked.contains("gzip") && !asked.contains("br"), "{asked}");
    let charged = tokens_counter("llm", "tokens_charged_total");
    assert_eq!(envoy.wait_for_wasm_counter(&charged, 2400), 2400);
}

/// A coding sluice cannot undo (`br` here), two codings stacked, or a body that is not what its
/// `content-encoding` says: the usage is unknown, charged as `on_unknown` says.
#[test]
fn a_response_in_a_coding_sluice_cannot_decode_is_charged_as_on_unknown_says() {
    let policy = budget("llm", 1_000_000, 10, json!({"on_unknown": 700}));
    let (envoy, _upstream) = start(json!([policy]));
    for (coding, stream) in [
        ("br", false),
        ("br", true),
        ("gzip, gzip", false),
        ("zstd", true),
    ] {
        let headers = [
            ("x-api-key", "alice"),
            ("x-test-usage", "total=30"),
            ("x-test-content-encoding", coding),
        ];
        let r = sluice_testkit::llm::call(envoy.addr(), Api::ChatCompletions, stream, &headers);
        assert_eq!(r.status, 200, "{coding}");
    }
    let invalid = usage_unknown_counter("llm", UsageUnknown::Invalid);
    assert_eq!(envoy.wait_for_wasm_counter(&invalid, 4), 4);
    let charged = tokens_counter("llm", "tokens_charged_total");
    assert_eq!(envoy.wait_for_wasm_counter(&charged, 2800), 2800);
}

/// What the upstream was asked for (`None`: no `accept-encoding`), for each `accept-encoding` in
/// `asked`, sent to `envoy` with `headers`.
fn accept_encodings_seen(
    envoy: &Envoy,
    upstream: &LlmUpstream,
    headers: &[(&str, &str)],
    asked: &[&str],
) -> Vec<Option<String>> {
    asked
        .iter()
        .map(|accept| {
            let mut all = headers.to_vec();
            all.push(("accept-encoding", accept));
            let r = sluice_testkit::llm::call(envoy.addr(), Api::ChatCompletions, false, &all);
            assert_eq!(r.status, 200, "{}", r.text());
            let Some(last) = upstream.calls().pop() else {
                panic!("the upstream saw no call");
            };
            last.headers.get("accept-encoding").cloned()
        })
        .collect()
}

/// A request that a policy metering response bodies admitted asks the upstream only for codings
/// sluice decodes, with the weights the client gave them: `br` and `zstd` never come back. A
/// request no such policy meters is left as it was.
#[test]
fn the_upstream_is_asked_only_for_codings_sluice_decodes() {
    let metered = budget("llm", 1_000_000, 10, json!({}));
    let other = json!({"name": "rps", "key": ["header:x-user-id"], "requests": 100, "per": "1s"});
    let asked = [
        "br, gzip;q=0.5",
        "gzip, deflate, br, zstd",
        "br",
        "identity, br;q=0.9",
        "*",
    ];
    let narrowed = [
        Some("gzip;q=0.5"),
        Some("gzip, deflate"),
        None,
        Some("identity"),
        None,
    ];
    let narrowed = narrowed.map(|n| n.map(String::from)).to_vec();
    let (envoy, upstream) = start(json!([metered.clone(), other.clone()]));
    let key = [("x-api-key", "alice")];
    assert_eq!(
        accept_encodings_seen(&envoy, &upstream, &key, &asked),
        narrowed
    );
    let unmetered = [("x-user-id", "bob")];
    let as_sent = asked.map(|a| Some(a.to_string())).to_vec();
    assert_eq!(
        accept_encodings_seen(&envoy, &upstream, &unmetered, &asked),
        as_sent
    );
    // The header twice: however Envoy holds the two, no br goes on.
    let twice = [
        ("x-api-key", "alice"),
        ("accept-encoding", "br"),
        ("accept-encoding", "gzip"),
    ];
    let r = sluice_testkit::llm::call(envoy.addr(), Api::ChatCompletions, false, &twice);
    assert_eq!(r.status, 200);
    let seen = upstream
        .calls()
        .pop()
        .unwrap()
        .headers
        .get("accept-encoding")
        .cloned();
    assert!(!seen.clone().unwrap_or_default().contains("br"), "{seen:?}");
    drop(envoy);
    // A request decided from its body: its headers go on first, narrowed then.
    let mut per_model = metered;
    per_model["key"] = json!(["header:x-api-key", "body:model"]);
    let (envoy, upstream) = start(json!([per_model, other]));
    assert_eq!(
        accept_encodings_seen(&envoy, &upstream, &key, &asked),
        narrowed
    );
}

/// A gzip stream that decodes to 100 MiB is metered as it passes: Envoy does not grow by it (the
/// decoder keeps its window, not the body), and no event waits for the next to be decoded.
#[test]
fn a_gzip_stream_is_metered_as_it_passes_without_growing_envoy_or_holding_an_event() {
    let (envoy, _upstream) = start(json!([budget("llm", 1_000_000, 100, json!({}))]));
    let gzip = ("x-test-content-encoding", "gzip");
    let warm = [
        ("x-api-key", "warm"),
        ("x-test-stream-bytes", "1048576"),
        gzip,
    ];
    sluice_testkit::llm::call(envoy.addr(), Api::ChatCompletions, true, &warm);
    let before = envoy.rss_kib();
    let big = [
        ("x-api-key", "alice"),
        ("x-test-stream-bytes", "104857600"),
        ("x-test-usage", "total=4242"),
        gzip,
    ];
    let r = sluice_testkit::llm::call(envoy.addr(), Api::ChatCompletions, true, &big);
    assert!(r.complete, "{} bytes", r.bytes);
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    let grown = envoy.rss_kib().saturating_sub(before);
    assert!(grown < 16 * 1024, "Envoy grew {grown} KiB over the stream");
    let charged = tokens_counter("llm", "tokens_charged_total");
    assert_eq!(envoy.wait_for_wasm_counter(&charged, 4242 + 30), 4242 + 30);
    let slow = [
        ("x-api-key", "bob"),
        ("x-test-events", "5"),
        ("x-test-event-ms", "400"),
        gzip,
    ];
    let r = sluice_testkit::llm::call(envoy.addr(), Api::ChatCompletions, true, &slow);
    let first = r.first_body_byte.unwrap();
    assert!(
        first < Duration::from_millis(300),
        "first byte after {first:?}"
    );
    assert_eq!(envoy.wait_for_wasm_counter(&charged, 4242 + 60), 4242 + 60);
}
