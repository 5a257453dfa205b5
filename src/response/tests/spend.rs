//! Spend budgets through the filter: a key charged usage × the served model's price, in
//! micro-units, and the ways a client who wants to pay less could try.

use super::*;
use crate::core::usage::price::PricedAs;
use crate::output::metrics::unknown_model_counter;
use crate::output::reply::LocalReply;

/// Alice's $1 an hour, gpt-4o-mini at $0.15/$0.60 a million and gpt-4o at $2.50/$10, each
/// request reserving what its max_tokens would cost (1,000 µ$ when it says none).
fn spend(extra: Value) -> Value {
    let mut cost = json!({
        "price": {
            "gpt-4o-mini*": {"input": 0.15, "output": 0.6},
            "gpt-4o*": {"input": 2.5, "output": 10}
        },
        "reserve": {"request": "max_tokens", "default": 1000}
    });
    for (field, value) in extra.as_object().into_iter().flatten() {
        cost[field] = value.clone();
    }
    json!({"name": "spend", "key": ["header:x-user-id"], "requests": 1_000_000, "per": "1h",
        "cost": cost})
}

/// Alice's request with `body`: its response while admitted, else the refusal.
fn ask(filter: &Filter, host: &FakeHost, body: &str) -> Result<Response, Box<LocalReply>> {
    *host.request.borrow_mut() = FakeRequest::new(ALICE);
    match filter.on_request_body(host, filter.snapshot(host), body.as_bytes()) {
        Verdict::Continue(Admitted { tab, record, .. }) => {
            Ok(Response::new(tab.unwrap_or_default(), record))
        }
        Verdict::Denied => Err(Box::new(host.reply.borrow().clone().unwrap())),
        other => panic!("neither admitted nor denied: {other:?}"),
    }
}

/// What the admitted request reserved.
fn reserved(response: &Response) -> u64 {
    match response.tab.entries[0].held {
        crate::limiter::tab::Held::Reserved { tokens, .. } => tokens,
        other => panic!("{other:?}"),
    }
}

/// Ends `response` with a JSON `body`; what the policy charged in all.
fn answer(filter: &Filter, host: &FakeHost, mut response: Response, body: &str) -> u64 {
    *host.response.borrow_mut() = FakeRequest::new(&[("content-type", "application/json")]);
    response.on_headers(filter, host);
    response.on_body(body.as_bytes());
    response.end(filter, host, Ending::Completed);
    host.published.borrow()["sluice.tokens.spend"]
        .parse()
        .unwrap()
}

fn served(model: &str, input: u64, output: u64) -> String {
    json!({"model": model, "choices": [],
        "usage": {"prompt_tokens": input, "completion_tokens": output,
            "total_tokens": input + output}})
    .to_string()
}

fn unknown_models(filter: &Filter, host: &FakeHost, priced_as: PricedAs) -> u64 {
    filter.flush_counters(host);
    host.counter(&unknown_model_counter("spend", priced_as))
}

#[test]
fn a_key_is_charged_usage_times_the_served_models_price_in_micro_units() {
    let (filter, host) = setup(json!([spend(json!({}))]));
    let response = ask(
        &filter,
        &host,
        r#"{"model":"gpt-4o-mini","max_tokens":1000}"#,
    )
    .unwrap();
    assert_eq!(
        reserved(&response),
        600,
        "1,000 out at mini's $0.60 a million"
    );
    // The upstream served gpt-4o: 1,000 in at $2.50 and 500 out at $10 a million.
    let body = served("gpt-4o-2024-08-06", 1000, 500);
    assert_eq!(answer(&filter, &host, response, &body), 2500 + 5000);
    let published = host.published.borrow().clone();
    assert_eq!(
        published["sluice.model"], "gpt-4o-2024-08-06",
        "for the log"
    );
    assert_eq!(published["sluice.body.model"], "gpt-4o-mini");
    // No model in the response: the request's. 3 in and 1 out of mini: 0.45 + 0.6 µ$,
    // rounded up once.
    let response = ask(&filter, &host, r#"{"model":"gpt-4o-mini"}"#).unwrap();
    assert_eq!(reserved(&response), 1000, "the default");
    let body = r#"{"usage":{"prompt_tokens":3,"completion_tokens":1}}"#;
    assert_eq!(answer(&filter, &host, response, body), 2);
    filter.flush_counters(&host);
    let charged = crate::output::metrics::tokens_counter("spend", "tokens_charged_total");
    assert_eq!(host.counter(&charged), 7502);
}

#[test]
fn a_key_at_its_money_limit_is_refused_until_it_refills() {
    let (filter, host) = setup(json!([spend(json!({}))]));
    // $1 of gpt-4o output is 100,000 tokens: 99,000 of it used up, 10 µ$ a token.
    let response = ask(&filter, &host, r#"{"model":"gpt-4o","max_tokens":10}"#).unwrap();
    assert_eq!(
        answer(&filter, &host, response, &served("gpt-4o", 0, 99_000)),
        990_000
    );
    let over = r#"{"model":"gpt-4o","max_tokens":1001}"#;
    let refusal = ask(&filter, &host, over).unwrap_err();
    assert_eq!(refusal.status, 429, "{}", refusal.body);
    // 10,010 µ$ reserved of 10,000 left: 10 µ$ short, at $1 an hour 36 ms, so 1 s.
    assert_eq!(refusal.header("retry-after"), Some("1"));
    assert!(ask(&filter, &host, r#"{"model":"gpt-4o","max_tokens":1000}"#).is_ok());
}

#[test]
fn an_unpriced_model_is_refused_before_the_upstream_in_the_apis_shape() {
    let mut policy = spend(json!({}));
    policy["api"] = json!("openai");
    let (filter, host) = setup(json!([policy]));
    let refusal = ask(&filter, &host, r#"{"model":"llama-3-70b"}"#).unwrap_err();
    assert_eq!(
        (refusal.status, refusal.details),
        (400, crate::output::reply::MODEL_NOT_PRICED)
    );
    let body: Value = serde_json::from_str(&refusal.body).unwrap();
    assert_eq!(body["error"]["code"], "model_not_priced");
    assert_eq!(body["error"]["param"], "model");
    assert_eq!(
        body["error"]["message"],
        r#"model "llama-3-70b" has no price in spend budget "spend""#
    );
    assert_eq!(unknown_models(&filter, &host, PricedAs::Refused), 1);
    // A name spelt in another case or with whitespace around it is the priced model.
    let response = ask(
        &filter,
        &host,
        r#"{"model":" GPT-4o-MINI\n","max_tokens":100}"#,
    )
    .unwrap();
    assert_eq!(reserved(&response), 60);
}

#[test]
fn a_request_naming_no_model_reserves_at_the_dearest_price_and_pays_what_was_served() {
    let (filter, host) = setup(json!([spend(json!({}))]));
    let response = ask(&filter, &host, r#"{"max_tokens":100}"#).unwrap();
    assert_eq!(
        reserved(&response),
        1000,
        "100 out at gpt-4o's $10 a million"
    );
    let body = served("gpt-4o-mini", 1000, 100);
    assert_eq!(answer(&filter, &host, response, &body), 150 + 60);
    // Nor a model in the response: charged as the dearest entry would charge it.
    let response = ask(&filter, &host, r#"{"max_tokens":100}"#).unwrap();
    let body = r#"{"usage":{"prompt_tokens":1000,"completion_tokens":100}}"#;
    assert_eq!(answer(&filter, &host, response, body), 2500 + 1000);
    assert_eq!(unknown_models(&filter, &host, PricedAs::Dearest), 1);
}

#[test]
fn unpriced_models_can_be_charged_a_default_price_or_nothing() {
    let default = json!({"unknown_model": {"price": {"input": 1, "output": 20}}});
    let (filter, host) = setup(json!([spend(default)]));
    let response = ask(&filter, &host, r#"{"model":"llama","max_tokens":100}"#).unwrap();
    assert_eq!(
        reserved(&response),
        2000,
        "the dearest: the default's $20 out"
    );
    let body = served("llama-3", 1000, 100);
    assert_eq!(answer(&filter, &host, response, &body), 1000 + 2000);
    assert_eq!(unknown_models(&filter, &host, PricedAs::DefaultPrice), 1);

    let (filter, host) = setup(json!([spend(json!({"unknown_model": "free"}))]));
    let response = ask(&filter, &host, r#"{"model":"llama","max_tokens":100}"#).unwrap();
    assert_eq!(
        reserved(&response),
        1000,
        "gpt-4o's, in case the upstream serves it"
    );
    assert_eq!(
        answer(&filter, &host, response, &served("llama-3", 1000, 100)),
        0
    );
    assert_eq!(unknown_models(&filter, &host, PricedAs::Free), 1);
}

#[test]
fn a_client_cannot_pay_less_by_naming_a_cheap_model_or_hiding_the_usage() {
    let (filter, host) = setup(json!([spend(json!({"unknown_model": "free"}))]));
    // Asks for mini, or for a name no price lists, and is served gpt-4o: pays gpt-4o's price.
    for asked in ["gpt-4o-mini", "gpt4o-free-alias"] {
        let body = format!(r#"{{"model":"{asked}","max_tokens":10}}"#);
        let response = ask(&filter, &host, &body).unwrap();
        let charged = answer(&filter, &host, response, &served("gpt-4o", 1000, 0));
        assert_eq!(charged, 2500, "{asked}");
    }
    // A response without usage is charged as on_unknown says: by default all the key can owe.
    let response = ask(&filter, &host, r#"{"model":"gpt-4o-mini"}"#).unwrap();
    let charged = answer(
        &filter,
        &host,
        response,
        r#"{"model":"gpt-4o","choices":[]}"#,
    );
    assert_eq!(charged, 2 * 1_000_000);
}

#[test]
fn a_spend_budget_reports_micro_units_not_tokens() {
    let mut policy = spend(json!({}));
    policy["api"] = json!("openai");
    let (filter, host) = setup(json!([policy]));
    *host.request.borrow_mut() = FakeRequest::new(ALICE);
    let body = br#"{"model":"gpt-4o","max_tokens":10}"#;
    let Verdict::Continue(admitted) = filter.on_request_body(&host, filter.snapshot(&host), body)
    else {
        panic!("admitted");
    };
    let mut headers = Vec::new();
    filter.each_response_header(&admitted.reported.unwrap(), |name, value| {
        headers.push(format!("{name}: {value}"));
    });
    assert!(
        headers.iter().all(|h| !h.contains("-tokens")),
        "no token headers from money: {headers:?}"
    );
}
#[test]
fn a_reservation_below_the_default_takes_only_itself() {
    // A token budget too: a request whose max_tokens asks less than the default reserved the
    // default from the bucket (lent as if `lease`), while its tab gave back only its own.
    let policy = budget(json!({"reserve": {"request": "max_tokens", "default": 500}}));
    let (filter, host) = setup(json!([policy]));
    for _ in 0..10 {
        *host.request.borrow_mut() = FakeRequest::new(ALICE);
        let body = br#"{"max_tokens":10}"#;
        let Verdict::Continue(Admitted { tab, record, .. }) =
            filter.on_request_body(&host, filter.snapshot(&host), body)
        else {
            panic!("1,000 tokens hold 10 requests reserving 100");
        };
        let mut response = Response::new(tab.unwrap(), record);
        *host.response.borrow_mut() = FakeRequest::new(&[("content-type", "application/json")]);
        response.on_headers(&filter, &host);
        response.on_body(usage_json(100).as_bytes());
        response.end(&filter, &host, Ending::Completed);
    }
    assert!(start(&filter, &host, ALICE).is_none(), "1,000 used");
}

#[test]
fn the_refusal_of_an_unpriced_model_is_json_in_each_apis_shape_whatever_the_name() {
    use crate::config::Api;
    use crate::output::reply::unpriced_model;
    let model = "m\"\\\u{1}é";
    let message = format!(
        "model {} has no price in spend budget \"spend\"",
        json!(model)
    );
    let bodies = [
        (
            Api::Generic,
            json!({"error": "model_not_priced", "policy": "spend", "model": model}),
        ),
        (
            Api::Openai,
            json!({"error": {"message": message, "type": "invalid_request_error",
                "param": "model", "code": "model_not_priced"}}),
        ),
        (
            Api::Anthropic,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}}),
        ),
        (
            Api::Gemini,
            json!({"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}),
        ),
    ];
    for (api, expected) in bodies {
        let reply = unpriced_model(api, "spend", model);
        let body: Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(body, expected, "{api:?}");
        assert_eq!(reply.header("content-type"), Some("application/json"));
    }
}

#[test]
fn only_an_enforcing_spend_budget_that_applies_refuses_a_model() {
    let refuses = |policies: Value| {
        let (filter, host) = setup(policies);
        ask(&filter, &host, r#"{"model":"llama"}"#).is_err()
    };
    let mut shadow = spend(json!({}));
    shadow["mode"] = json!("shadow");
    assert!(!refuses(json!([shadow])));
    let mut canary = spend(json!({}));
    canary["rollout"] = json!({"enforce_percent": 50});
    assert!(!refuses(json!([canary])));
    let mut elsewhere = spend(json!({}));
    elsewhere["match"] = json!({"path_prefix": "/v2/"});
    assert!(!refuses(json!([elsewhere])));
    // The default policy applies only where no other does.
    let requests = json!({"name": "requests", "key": ["header:x-user-id"], "requests": 100,
        "per": "1m"});
    let mut default = spend(json!({}));
    default["name"] = json!("default-spend");
    let config = json!({"policies": [requests], "default": default}).to_string();
    let host = FakeHost::new(Arc::default(), T0);
    let filter = Filter::configure(config.as_bytes(), "test", &host, &host, &host).unwrap();
    assert!(ask(&filter, &host, r#"{"model":"llama"}"#).is_ok());
    assert!(refuses(json!([spend(json!({}))])));
}

#[test]
fn anthropic_gets_its_input_and_output_token_headers_from_budgets_counting_each_alone() {
    let budget = |name: &str, usage: Value, tokens: u64| {
        json!({"name": name, "key": ["header:x-user-id"], "requests": tokens, "per": "1m",
            "cost": {"from_response": {"usage": usage}, "reserve": 100}})
    };
    let policies = json!([
        budget("input", json!("input_tokens"), 8000),
        budget(
            "output",
            json!({"output_tokens": 1, "reasoning_tokens": 2}),
            4000
        ),
        budget("all", json!("total_tokens"), 20_000),
        spend(json!({})),
    ]);
    let config = json!({"api": "anthropic", "policies": policies}).to_string();
    let host = FakeHost::new(Arc::default(), T0);
    let filter = Filter::configure(config.as_bytes(), "test", &host, &host, &host).unwrap();
    *host.request.borrow_mut() = FakeRequest::new(ALICE);
    let body = br#"{"model":"gpt-4o","max_tokens":10}"#;
    let Verdict::Continue(admitted) = filter.on_request_body(&host, filter.snapshot(&host), body)
    else {
        panic!("admitted");
    };
    let mut headers = std::collections::BTreeMap::new();
    filter.each_response_header(&admitted.reported.unwrap(), |name, value| {
        headers.insert(name, value.to_string());
    });
    assert_eq!(headers["anthropic-ratelimit-input-tokens-limit"], "8000");
    assert_eq!(
        headers["anthropic-ratelimit-input-tokens-remaining"],
        "7900"
    );
    assert_eq!(headers["anthropic-ratelimit-output-tokens-limit"], "4000");
    assert_eq!(
        headers["anthropic-ratelimit-output-tokens-remaining"],
        "3900"
    );
    // The tokens family: the tightest token budget of any kind (the spend budget is none).
    assert_eq!(headers["anthropic-ratelimit-tokens-limit"], "4000");
    assert!(headers["anthropic-ratelimit-input-tokens-reset"].ends_with('Z'));
}

#[test]
fn a_gemini_call_names_its_model_in_the_path_and_is_priced_by_its_model_version() {
    let gemini = json!({"gemini-2.0-flash*": {"input": 0.1, "output": 0.4},
        "gemini-2.5-pro*": {"input": 1.25, "output": 10, "reasoning": 10}});
    let (filter, host) = setup(json!([spend(json!({"price": gemini}))]));
    // generateContent's body has no model, and its output cap is generationConfig's: the
    // request reserves the default, and is not refused.
    let response = ask(
        &filter,
        &host,
        r#"{"contents":[{"parts":[{"text":"hi"}]}]}"#,
    )
    .unwrap();
    assert_eq!(reserved(&response), 1000);
    let body = json!({"candidates": [], "modelVersion": "gemini-2.5-pro",
        "usageMetadata": {"promptTokenCount": 1000, "candidatesTokenCount": 100,
            "thoughtsTokenCount": 200, "totalTokenCount": 1300}});
    // 1,000 in at $1.25, 100 out and 200 thinking at $10 a million.
    assert_eq!(
        answer(&filter, &host, response, &body.to_string()),
        1250 + 1000 + 2000
    );
}
