//! Spend budgets through a real two-worker Envoy, with the official `openai` SDK as the client:
//! a team is refused at its money limit with the exact wait its debt gives, an unpriced model is
//! refused, charged a default price or nothing as configured, and a client who wants to pay less
//! (naming a cheap or unknown model the upstream maps to a dear one, spelling it otherwise,
//! hiding its usage) pays what was served.

// Helpers report an unexpected response by panicking, as assertions do.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use serde_json::{json, Value};
use sluice::core::usage::price::PricedAs;
use sluice::output::metrics::{tokens_counter, unknown_model_counter};
use sluice_testkit::envoy::Envoy;
use sluice_testkit::gateway::{local, GlobalGateway};
use sluice_testkit::llm::{openai_calls_of, LlmUpstream, OpenAiCall};

/// gpt-4o-mini at $0.15/$0.60 a million tokens, gpt-4o at $2.50/$10.
fn prices() -> Value {
    json!({
        "gpt-4o-mini*": {"input": 0.15, "output": 0.6},
        "gpt-4o*": {"input": 2.5, "output": 10}
    })
}

/// A spend budget of `micro` micro-dollars per `per`, keyed by `key`, each request reserving
/// what its max_tokens would cost (nothing when it says none); `cost` fields added.
fn spend(name: &str, key: &str, micro: u64, per: &str, cost: Value) -> Value {
    let mut fields = json!({"price": prices(), "reserve": {"request": "max_tokens", "default": 0}});
    for (field, value) in cost.as_object().into_iter().flatten() {
        fields[field] = value.clone();
    }
    json!({"name": name, "key": [key], "requests": micro, "per": per, "cost": fields})
}

fn gateway(policies: Value) -> (Envoy, LlmUpstream) {
    local(&json!({"api": "openai", "policies": policies}))
}

fn statuses(calls: &[OpenAiCall]) -> Vec<u16> {
    calls.iter().map(|c| c.status).collect()
}

#[test]
fn a_spend_budget_refuses_a_team_at_its_money_limit_with_the_exact_wait() {
    // Per team $0.06 every 10 minutes (100 µ$ a second); per API key $5 an hour, which these
    // calls never reach.
    let (envoy, upstream) = gateway(json!([
        spend("team-spend", "header:x-team", 60_000, "10m", json!({})),
        spend("key-spend", "header:x-api-key", 5_000_000, "1h", json!({}))
    ]));
    for stream in [false, true] {
        let team = if stream { "red" } else { "blue" };
        // Asks for gpt-4o-mini, at most 1,158 tokens out: 695 µ$ reserved (0.6 × 1,158,
        // rounded up). The upstream serves gpt-4o: 1,000 in and 2,050 out cost 2,500 + 20,500.
        let headers = [
            ("x-team", team),
            ("x-api-key", "k1"),
            ("x-test-model", "gpt-4o-2024-08-06"),
            ("x-test-usage", "input=1000,output=2050"),
        ];
        let calls = openai_calls_of(
            envoy.addr(),
            4,
            stream,
            ("gpt-4o-mini", Some(1158)),
            &headers,
        );
        assert_eq!(statuses(&calls), [200, 200, 200, 429], "{team}: {calls:?}");
        // 60,000 - 3 × 23,000 = 9,000 owed: the fourth call's 695 waits for 9,695 µ$ at 100 a
        // second, 96.95 s, less the time since the first call (a few ms each, unless the
        // machine is very busy): 97.
        let refused = &calls[3];
        let secs = |calls: &[OpenAiCall]| calls.iter().map(|c| c.elapsed.as_secs_f64()).sum();
        let (before, all): (f64, f64) = (secs(&calls[..3]), secs(&calls));
        let exact = |elapsed: f64| (96.95 - elapsed).ceil().to_string();
        let retry = &refused.headers["retry-after"];
        assert!(
            *retry == exact(before) || *retry == exact(all),
            "{retry} after {before} to {all} s: {refused:?}"
        );
        if all < 0.9 {
            assert_eq!(retry, "97");
        }
        assert_eq!(refused.error_type.as_deref(), Some("RateLimitError"));
        let error = refused.error.as_ref().unwrap();
        assert_eq!(
            error["message"],
            format!(
                "rate limit exceeded: policy team-spend, reserving 695 micro-units, retry after {retry}s"
            ),
            "{error}"
        );
        // A spend budget is no token balance: the provider's token headers do not show it.
        assert_eq!(calls[0].headers.get("x-ratelimit-remaining-tokens"), None);
    }
    let charged = tokens_counter("team-spend", "tokens_charged_total");
    assert_eq!(
        envoy.wait_for_wasm_counter(&charged, 6 * 23_000),
        6 * 23_000
    );
    assert_eq!(upstream.calls().len(), 6, "the refusals never reached it");
}

/// `unknown_model` set to `mode`, on a budget whose calls are 1,000 tokens in and out.
fn unknown_model_gateway(mode: Value) -> (Envoy, LlmUpstream) {
    gateway(json!([spend(
        "spend",
        "header:x-api-key",
        1_000_000,
        "1h",
        json!({"unknown_model": mode})
    )]))
}

const USAGE: (&str, &str) = ("x-test-usage", "input=1000,output=1000");

fn counted(envoy: &Envoy, priced_as: PricedAs, expected: u64) -> u64 {
    envoy.wait_for_wasm_counter(&unknown_model_counter("spend", priced_as), expected)
}

#[test]
fn an_unpriced_model_is_refused_before_the_upstream_with_openais_error() {
    let (envoy, upstream) = unknown_model_gateway(json!("refuse"));
    let headers = [("x-api-key", "k"), USAGE];
    let calls = openai_calls_of(envoy.addr(), 1, false, ("llama-3-70b", None), &headers);
    let refused = &calls[0];
    assert_eq!(refused.status, 400, "{refused:?}");
    assert_eq!(refused.error_type.as_deref(), Some("BadRequestError"));
    let error = refused.error.as_ref().unwrap();
    assert_eq!(error["code"], "model_not_priced", "{error}");
    assert_eq!(error["param"], "model");
    assert_eq!(
        error["message"],
        r#"model "llama-3-70b" has no price in spend budget "spend""#
    );
    assert!(upstream.calls().is_empty(), "never sent upstream");
    assert_eq!(counted(&envoy, PricedAs::Refused, 1), 1);
    // The same name in another case, or with whitespace around it, is the priced model.
    let calls = openai_calls_of(envoy.addr(), 1, true, (" GPT-4o-Mini ", None), &headers);
    assert_eq!(calls[0].status, 200, "{calls:?}");
}

#[test]
fn an_unpriced_model_can_be_charged_a_default_price_or_nothing() {
    let default = json!({"price": {"input": 1, "output": 2}});
    for (mode, priced_as, cost) in [
        (default, PricedAs::DefaultPrice, 1000 + 2000),
        (json!("free"), PricedAs::Free, 0),
    ] {
        let (envoy, _upstream) = unknown_model_gateway(mode);
        let headers = [("x-api-key", "k"), USAGE];
        for stream in [false, true] {
            let calls = openai_calls_of(envoy.addr(), 1, stream, ("llama-3-70b", None), &headers);
            assert_eq!(calls[0].status, 200, "{calls:?}");
        }
        assert_eq!(counted(&envoy, priced_as, 2), 2, "{priced_as:?}");
        let charged = tokens_counter("spend", "tokens_charged_total");
        assert_eq!(envoy.wait_for_wasm_counter(&charged, 2 * cost), 2 * cost);
    }
}

#[test]
fn a_client_cannot_pay_less_than_what_was_served() {
    // Unpriced models are free here: the cheapest mode for a client to aim at.
    let (envoy, _upstream) = unknown_model_gateway(json!("free"));
    let served = [("x-api-key", "k"), ("x-test-model", "gpt-4o"), USAGE];
    // Named a cheap model, a name no price lists, the dear one in capitals: served gpt-4o, each
    // pays gpt-4o's 2,500 + 10,000.
    for asked in ["gpt-4o-mini", "gpt4o-free-alias", "GPT-4O"] {
        let calls = openai_calls_of(envoy.addr(), 1, true, (asked, None), &served);
        assert_eq!(calls[0].status, 200, "{asked}: {calls:?}");
    }
    let charged = tokens_counter("spend", "tokens_charged_total");
    assert_eq!(envoy.wait_for_wasm_counter(&charged, 37_500), 37_500);
    assert_eq!(counted(&envoy, PricedAs::Free, 0), 0);
    // A stream that hides its usage is charged all the key can owe: its $1 and as much in debt.
    let hidden = [("x-api-key", "k"), ("x-test-usage", "none")];
    let calls = openai_calls_of(envoy.addr(), 2, true, ("gpt-4o-mini", None), &hidden);
    assert_eq!(statuses(&calls), [200, 429], "{calls:?}");
    let all = 37_500 + 2_000_000;
    assert_eq!(envoy.wait_for_wasm_counter(&charged, all), all);
}

#[test]
fn a_global_spend_budget_tells_the_service_only_amounts() {
    // The team budget of the first test, global: the service never sees a model or a price,
    // only the 695 µ$ reserved and the 22,305 charged beyond it.
    let policy = spend("team-spend", "header:x-team", 60_000, "10m", json!({}));
    let g = GlobalGateway::start(policy, json!({"api": "openai"}));
    let headers = [
        ("x-team", "green"),
        ("x-test-model", "gpt-4o-2024-08-06"),
        ("x-test-usage", "input=1000,output=2050"),
    ];
    let asked = ("gpt-4o-mini", Some(1158));
    let started = std::time::Instant::now();
    let calls = openai_calls_of(g.envoy.addr(), 3, false, asked, &headers);
    assert_eq!(statuses(&calls), [200, 200, 200], "{calls:?}");
    g.settled("charge", 3);
    let calls = openai_calls_of(g.envoy.addr(), 1, true, asked, &headers);
    let refused = &calls[0];
    assert_eq!(refused.status, 429, "{refused:?}");
    // 9,695 µ$ short at 100 a second, less the seconds the clients took to start.
    let retry: u64 = refused.headers["retry-after"].parse().unwrap();
    let soonest = (96.95 - started.elapsed().as_secs_f64()).ceil() as u64;
    assert!(
        (soonest..=97).contains(&retry),
        "{retry}, not {soonest} to 97"
    );
    let allowed = g.service_count("sluice_service_checks_total", &[r#"result="allowed""#]);
    assert_eq!(allowed, 3);
}

#[test]
fn layered_spend_budgets_refuse_a_key_at_its_own_limit_and_every_key_at_the_teams() {
    // Per team $0.06 and per API key $0.04, every 10 minutes; each call 23,000 µ$ of gpt-4o.
    let (envoy, _upstream) = gateway(json!([
        spend("team-spend", "header:x-team", 60_000, "10m", json!({})),
        spend("key-spend", "header:x-api-key", 40_000, "10m", json!({}))
    ]));
    let policy_of = |call: &OpenAiCall| {
        let message = call.error.as_ref().map(|e| e["message"].to_string());
        message.unwrap_or_default()
    };
    let asked = ("gpt-4o", None);
    let usage = ("x-test-usage", "input=1000,output=2050");
    // Alice's key owes after two calls: her third is refused by her own budget.
    let alice = [("x-team", "red"), ("x-api-key", "alice"), usage];
    let calls = openai_calls_of(envoy.addr(), 3, false, asked, &alice);
    assert_eq!(statuses(&calls), [200, 200, 429], "{calls:?}");
    assert!(
        policy_of(&calls[2]).contains("policy key-spend"),
        "{calls:?}"
    );
    // Bob's key is fresh, but his first call puts the team in debt: his second is the team's.
    let bob = [("x-team", "red"), ("x-api-key", "bob"), usage];
    let calls = openai_calls_of(envoy.addr(), 2, true, asked, &bob);
    assert_eq!(statuses(&calls), [200, 429], "{calls:?}");
    assert!(
        policy_of(&calls[1]).contains("policy team-spend"),
        "{calls:?}"
    );
}
