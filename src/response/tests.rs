use super::*;
use crate::core::duration::NANOS_PER_SEC as SEC;
use crate::filter::{Admitted, Filter, Verdict};
use crate::limiter::tab::Op;
use crate::output::metrics::{
    keys_in_debt_gauge, requests_counter, slots_in_use_gauge, slots_released_counter, SlotEnd,
};
use crate::testing::{FakeHost, FakeRequest};
use serde_json::{json, Value};
use std::sync::Arc;

const T0: u64 = 1_800_000_000 * SEC;
const ALICE: &[(&str, &str)] = &[("x-user-id", "alice")];
const NO_MODEL: Models = Models {
    served: crate::core::usage::Served::Unnamed,
    asked: None,
};

fn streams(requests: u64, extra: Value) -> Value {
    let mut policy = json!({"name": "streams", "key": ["header:x-user-id"],
        "algorithm": "concurrency", "requests": requests, "lease": "10s"});
    for (field, value) in extra.as_object().into_iter().flatten() {
        policy[field] = value.clone();
    }
    policy
}

fn setup(policies: Value) -> (Filter, FakeHost) {
    let host = FakeHost::new(Arc::default(), T0);
    let config = json!({"policies": policies}).to_string();
    let filter = Filter::configure(config.as_bytes(), "test", &host, &host, &host).unwrap();
    (filter, host)
}

/// Starts a request: its response while admitted, `None` when refused.
fn start(filter: &Filter, host: &FakeHost, headers: &[(&str, &str)]) -> Option<Response> {
    *host.request.borrow_mut() =
        FakeRequest::new(headers).with_property("source.address", "10.0.0.1:5555");
    match filter.on_request_headers(host) {
        Verdict::Continue(Admitted { tab, record, .. }) => {
            Some(Response::new(tab.unwrap_or_default(), record))
        }
        Verdict::Denied => None,
        other => panic!("neither admitted nor denied: {other:?}"),
    }
}

#[test]
fn n_plus_one_requests_in_flight_get_n_slots_and_an_end_frees_one() {
    let (filter, host) = setup(json!([streams(2, json!({}))]));
    let first = start(&filter, &host, ALICE).unwrap();
    let _second = start(&filter, &host, ALICE).unwrap();
    assert!(start(&filter, &host, ALICE).is_none(), "two in flight");
    let reply = host.reply.borrow().clone().unwrap();
    assert_eq!(reply.status, 429);
    assert_eq!(reply.header("retry-after"), None, "nobody knows when");
    first.end(&filter, &host, Ending::Completed);
    assert!(
        start(&filter, &host, ALICE).is_some(),
        "one slot free again"
    );
    assert!(start(&filter, &host, &[("x-user-id", "bob")]).is_some());
}

#[test]
fn a_request_another_policy_refuses_takes_no_slot() {
    let per_user = json!({"name": "per-user", "key": ["header:x-user-id"], "requests": 1,
        "per": "1h"});
    let (filter, host) = setup(json!([streams(1, json!({})), per_user]));
    let admitted = start(&filter, &host, ALICE).unwrap();
    admitted.end(&filter, &host, Ending::Completed);
    assert!(start(&filter, &host, ALICE).is_none(), "per-user refuses");
    let (filter2, host2) = (&filter, &host);
    filter2.flush_counters(host2);
    assert_eq!(host.gauge(&slots_in_use_gauge("streams")), 0);
    let streams = requests_counter("streams", crate::limiter::PolicyOutcome::Allowed);
    assert_eq!(host.counter(&streams), 1);
}

#[test]
fn a_renewed_slot_outlives_its_lease_and_is_given_back_once() {
    let (filter, host) = setup(json!([streams(1, json!({}))]));
    let mut long = start(&filter, &host, ALICE).unwrap();
    for second in 1..=30 {
        host.now.set(T0 + second * SEC);
        long.renew(&filter, &host);
        assert!(start(&filter, &host, ALICE).is_none(), "held at {second}s");
    }
    long.end(&filter, &host, Ending::Reset);
    assert!(start(&filter, &host, ALICE).is_some());
    filter.flush_counters(&host);
    let reset = slots_released_counter("streams", SlotEnd::Reset);
    assert_eq!(host.counter(&reset), 1);
    assert_eq!(
        host.gauge(&slots_in_use_gauge("streams")),
        1,
        "the last one"
    );
}

#[test]
fn a_slot_nobody_gives_back_expires_within_its_lease_and_is_counted() {
    let (filter, host) = setup(json!([streams(1, json!({}))]));
    let lost = start(&filter, &host, ALICE).unwrap();
    std::mem::forget(lost);
    host.now.set(T0 + 9 * SEC);
    assert!(start(&filter, &host, ALICE).is_none());
    host.now.set(T0 + 10 * SEC);
    assert!(start(&filter, &host, ALICE).is_some(), "a lease later");
    filter.flush_counters(&host);
    let expired = slots_released_counter("streams", SlotEnd::Expired);
    assert_eq!(host.counter(&expired), 1);
}

#[test]
fn a_global_slot_is_named_in_its_check_and_given_back_through_the_outbox() {
    let host = FakeHost::new(Arc::default(), T0);
    let config = json!({"global": {"cluster": "sluice"}, "policies": [streams(4, json!({"scope": "global"}))]});
    let filter =
        Filter::configure(config.to_string().as_bytes(), "test", &host, &host, &host).unwrap();
    *host.request.borrow_mut() = FakeRequest::new(ALICE);
    let Verdict::Waiting(pending) = filter.on_request_headers(&host) else {
        panic!("asks the service");
    };
    let slot = pending.checks()[0].slot.clone().expect("a named slot");
    let answer = br#"{"results":[{"allowed":true,"granted":1,"remaining":3,"reset_ms":0,"retry_after_ms":0}]}"#;
    let verdict = filter.on_service_response(&host, pending, Some((200, answer.to_vec())));
    let Verdict::Continue(Admitted { tab: Some(tab), .. }) = verdict else {
        panic!("admitted with a slot");
    };
    let mut response = Response::new(tab, None);
    host.now.set(T0 + 5 * SEC);
    response.renew(&filter, &host);
    response.end(&filter, &host, Ending::Completed);
    let ops: Vec<SettleOp> = host.reports.borrow().iter().map(|s| s.op.clone()).collect();
    assert_eq!(
        ops,
        [
            SettleOp::Renew { slot: slot.clone() },
            SettleOp::Release { slot }
        ],
        "renewed at half its lease of 10 s, then given back"
    );
    assert!(host.reports.borrow()[0].key.starts_with("streams/"));
}

#[test]
fn a_refusal_says_when_to_retry_only_if_the_policy_does() {
    let (filter, host) = setup(json!([streams(1, json!({"retry_after": "2s"}))]));
    let _held = start(&filter, &host, ALICE).unwrap();
    assert!(start(&filter, &host, ALICE).is_none());
    let reply = host.reply.borrow().clone().unwrap();
    assert_eq!(reply.header("retry-after"), Some("2"));
}

// --- Token budgets: a cost read from the response.

/// Alice's budget of 1,000 tokens a minute (refilled continuously), read from the usage's
/// total, each request reserving 100.
fn budget(extra: Value) -> Value {
    let mut cost = json!({"from_response": {"usage": "total_tokens"}, "reserve": 100});
    for (field, value) in extra.as_object().into_iter().flatten() {
        cost[field] = value.clone();
    }
    json!({"name": "llm", "key": ["header:x-user-id"], "requests": 1000, "per": "1m",
        "cost": cost})
}

const OPENAI_JSON: &str = "application/json";
const EVENTS: &str = "text/event-stream";

/// Runs alice's request to its end: its response's content type and body, fed in two chunks.
fn respond(filter: &Filter, host: &FakeHost, content_type: &str, body: &str) -> Option<()> {
    let mut response = start(filter, host, ALICE)?;
    *host.response.borrow_mut() = FakeRequest::new(&[("content-type", content_type)]);
    response.on_headers(filter, host);
    assert!(response.reads_body());
    let (first, rest) = body.split_at(body.len() / 2);
    response.on_body(first.as_bytes());
    response.on_body(rest.as_bytes());
    response.end(filter, host, Ending::Completed);
    Some(())
}

fn usage_json(total: u64) -> String {
    format!(
        r#"{{"id":"chatcmpl-1","choices":[],"usage":{{"prompt_tokens":1,"completion_tokens":{},"total_tokens":{total}}}}}"#,
        total - 1
    )
}

#[test]
fn a_response_is_charged_what_it_used_beyond_its_reservation_and_refunded_the_rest() {
    let (filter, host) = setup(json!([budget(json!({}))]));
    respond(&filter, &host, OPENAI_JSON, &usage_json(300)).unwrap();
    assert_eq!(host.published.borrow()["sluice.tokens.llm"], "300");
    respond(&filter, &host, OPENAI_JSON, &usage_json(40)).unwrap();
    filter.flush_counters(&host);
    let counter = |base: &str| host.counter(&crate::output::metrics::tokens_counter("llm", base));
    assert_eq!(counter("tokens_charged_total"), 340);
    assert_eq!(counter("tokens_refunded_total"), 60);
    // 1,000 - 340 left: 6 more reservations of 100 pass, the 7th does not.
    let passed = (0..7)
        .filter(|_| start(&filter, &host, ALICE).is_some())
        .count();
    assert_eq!(passed, 6);
}

#[test]
fn usage_past_the_budget_is_a_debt_refused_until_refill_covers_the_reservation() {
    let (filter, host) = setup(json!([budget(json!({}))]));
    respond(
        &filter,
        &host,
        EVENTS,
        &format!("data: {}\n\ndata: [DONE]\n\n", usage_json(2500)),
    )
    .unwrap();
    assert!(start(&filter, &host, ALICE).is_none(), "1,000 owed");
    let reply = host.reply.borrow().clone().unwrap();
    // 1,000 owed plus the 100 to reserve, at 1,000 a minute: 66 s.
    assert_eq!(reply.header("retry-after"), Some("66"));
    assert_eq!(
        reply.body,
        r#"{"error":"too_many_requests","policy":"llm","retry_after":66,"reserve":100}"#
    );
    let in_debt = |at: u64| {
        host.now.set(at);
        filter.review_debts(&host);
        filter.flush_counters(&host);
        host.gauge(&keys_in_debt_gauge("llm"))
    };
    assert_eq!(in_debt(T0), 1);
    assert_eq!(in_debt(T0 + 59 * SEC), 1);
    assert_eq!(in_debt(T0 + 60 * SEC), 0, "the 1,000 owed are paid back");
    host.now.set(T0 + 65 * SEC);
    assert!(start(&filter, &host, ALICE).is_none());
    host.now.set(T0 + 66 * SEC);
    assert!(start(&filter, &host, ALICE).is_some());
    filter.flush_counters(&host);
    let owed = host.counter(&crate::output::metrics::tokens_counter(
        "llm",
        "tokens_owed_total",
    ));
    assert_eq!(owed, 1000, "the debt was capped at one burst");
}

#[test]
fn usage_that_never_comes_is_charged_as_on_unknown_says() {
    let (filter, host) = setup(json!([budget(json!({"on_unknown": 700}))]));
    let mut cut = start(&filter, &host, ALICE).unwrap();
    *host.response.borrow_mut() = FakeRequest::new(&[("content-type", EVENTS)]);
    cut.on_headers(&filter, &host);
    cut.on_body(b"data: {\"choices\":[{\"delta\":{\"content\":\"hel");
    cut.end(&filter, &host, Ending::Reset);
    respond(
        &filter,
        &host,
        OPENAI_JSON,
        r#"{"usage": {"total_tokens": -5}}"#,
    )
    .unwrap();
    filter.flush_counters(&host);
    let unknown = |why| host.counter(&crate::output::metrics::usage_unknown_counter("llm", why));
    use crate::output::metrics::UsageUnknown;
    assert_eq!(
        (unknown(UsageUnknown::Reset), unknown(UsageUnknown::Invalid)),
        (1, 1)
    );
    let charged = |base| host.counter(&crate::output::metrics::tokens_counter("llm", base));
    assert_eq!(charged("tokens_charged_total"), 1400);
    assert_eq!(
        charged("tokens_unknown_total"),
        1400,
        "both on on_unknown's 700"
    );
}

/// Alice's request answered with `headers` and `body` fed in 7-byte chunks: what it was
/// charged, and whether the body was still read at its end.
fn respond_encoded(
    filter: &Filter,
    host: &FakeHost,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (String, bool) {
    let mut response = start(filter, host, ALICE).unwrap();
    *host.response.borrow_mut() = FakeRequest::new(headers);
    response.on_headers(filter, host);
    for chunk in body.chunks(7) {
        if response.reads_body() {
            response.on_body(chunk);
        }
    }
    let reads = response.reads_body();
    response.end(filter, host, Ending::Completed);
    (host.published.borrow()["sluice.tokens.llm"].clone(), reads)
}

fn gzip(body: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(body).unwrap();
    encoder.finish().unwrap()
}

#[test]
fn a_gzip_response_is_charged_its_usage_and_one_sluice_cannot_decode_as_on_unknown_says() {
    let mut policy = budget(json!({"on_unknown": 700}));
    policy["requests"] = json!(100_000);
    let (filter, host) = setup(json!([policy]));
    let body = usage_json(300);
    let gzipped = gzip(body.as_bytes());
    let json_gzip = [("content-type", OPENAI_JSON), ("content-encoding", "gzip")];
    let (charged, reads) = respond_encoded(&filter, &host, &json_gzip, &gzipped);
    assert_eq!((charged.as_str(), reads), ("300", true));
    let stream = format!("data: {body}\n\ndata: [DONE]\n\n");
    let events_gzip = [("content-type", EVENTS), ("content-encoding", "x-gzip")];
    let (charged, _) = respond_encoded(&filter, &host, &events_gzip, &gzip(stream.as_bytes()));
    assert_eq!(charged, "300", "a stream");
    let json_br = [("content-type", OPENAI_JSON), ("content-encoding", "br")];
    let (charged, reads) = respond_encoded(&filter, &host, &json_br, body.as_bytes());
    assert_eq!(
        (charged.as_str(), reads),
        ("700", false),
        "br: not read past its first byte"
    );
    let (charged, _) = respond_encoded(&filter, &host, &json_gzip, body.as_bytes());
    assert_eq!(charged, "700", "labelled gzip, not gzip");
    let cut = gzipped.get(..gzipped.len() - 1).unwrap();
    let (charged, _) = respond_encoded(&filter, &host, &json_gzip, cut);
    assert_eq!(charged, "700", "cut short");
    filter.flush_counters(&host);
    let invalid = crate::output::metrics::usage_unknown_counter(
        "llm",
        crate::output::metrics::UsageUnknown::Invalid,
    );
    assert_eq!(host.counter(&invalid), 3);
}

#[test]
fn usage_can_come_in_a_header_or_a_trailer() {
    let header = json!({"from_response": {"header": "x-usage-total-tokens"}});
    let mut policy = budget(json!({}));
    policy["cost"] = header;
    let (filter, host) = setup(json!([policy]));
    let mut response = start(&filter, &host, ALICE).unwrap();
    *host.response.borrow_mut() = FakeRequest::new(&[("content-type", "text/plain")]);
    response.on_headers(&filter, &host);
    assert!(!response.reads_body(), "nothing to read there");
    *host.trailers.borrow_mut() = FakeRequest::new(&[("x-usage-total-tokens", "123")]);
    response.on_trailers(&filter, &host);
    response.end(&filter, &host, Ending::Completed);
    assert_eq!(host.published.borrow()["sluice.tokens.llm"], "123");
}

#[test]
fn the_access_log_record_carries_what_each_metered_policy_reserved_and_charged() {
    let (filter, host) = setup(json!([budget(json!({}))]));
    respond(&filter, &host, OPENAI_JSON, &usage_json(42)).unwrap();
    let records = host.records.borrow();
    let record = records.last().unwrap();
    assert!(
        record.starts_with("outcome=allowed policy=llm mode=enforce key="),
        "{record}"
    );
    assert!(record.ends_with(" tokens=llm:100:42"), "{record}");
    // The key by its hash as the logs and bypass entries name it, the same for every request
    // of the key.
    let key = |record: &str| record.split(' ').nth(3).unwrap().to_string();
    let first = key(record);
    assert_eq!(first.len(), "key=".len() + 16, "{record}");
    drop(records);
    respond(&filter, &host, OPENAI_JSON, &usage_json(7)).unwrap();
    assert_eq!(key(host.records.borrow().last().unwrap()), first);
}

#[test]
fn a_reservation_can_come_from_the_request_and_a_key_from_its_body() {
    let mut policy = budget(json!({"reserve": {"request": "max_tokens", "default": 50}}));
    policy["key"] = json!(["header:x-user-id", "body:model"]);
    let (filter, host) = setup(json!([policy]));
    assert!(filter.reads_body());
    *host.request.borrow_mut() = FakeRequest::new(ALICE);
    let body = br#"{"messages":[{"role":"user","content":"hi"}],"model":"gpt-x","max_tokens":400,"stream":true}"#;
    let Verdict::Continue(Admitted { tab: Some(tab), .. }) =
        filter.on_request_body(&host, filter.snapshot(&host), body)
    else {
        panic!("admitted");
    };
    assert!(matches!(
        tab.entries[0].held,
        crate::limiter::tab::Held::Reserved { tokens: 400, .. }
    ));
    let published = host.published.borrow().clone();
    assert_eq!(
        (
            &published["sluice.body.model"],
            &published["sluice.max_output_tokens"]
        ),
        (&"gpt-x".to_string(), &"400".to_string()),
        "for the access log"
    );
    assert_eq!(
        filter.stream_usage_body(Some(&tab), body),
        None,
        "not asked"
    );
    let other_model = br#"{"model":"gpt-y","max_tokens":700}"#;
    assert!(
        matches!(
            filter.on_request_body(&host, filter.snapshot(&host), other_model),
            Verdict::Continue(_)
        ),
        "its own budget"
    );
}

/// A filter whose one policy is a global budget of `budget`'s.
fn global_budget(host: &FakeHost) -> Filter {
    let mut policy = budget(json!({}));
    policy["scope"] = json!("global");
    let config = json!({"global": {"cluster": "sluice"}, "policies": [policy]});
    Filter::configure(config.to_string().as_bytes(), "test", host, host, host).unwrap()
}

/// A request of `global_budget` admitted by the service with its reservation of 100 tokens,
/// whose response used `used`, ending 2 s after `host`'s now.
fn serve_globally(filter: &Filter, host: &FakeHost, used: u64) {
    *host.request.borrow_mut() = FakeRequest::new(ALICE);
    let Verdict::Waiting(pending) = filter.on_request_headers(host) else {
        panic!("asks the service");
    };
    assert_eq!(
        (pending.checks()[0].cost, pending.checks()[0].take()),
        (100, 100)
    );
    let answer = br#"{"results":[{"allowed":true,"granted":100,"remaining":900,"reset_ms":6000,"retry_after_ms":0}]}"#;
    let Verdict::Continue(Admitted { tab: Some(tab), .. }) =
        filter.on_service_response(host, pending, Some((200, answer.to_vec())))
    else {
        panic!("admitted");
    };
    let mut response = Response::new(tab, None);
    *host.response.borrow_mut() = FakeRequest::new(&[("content-type", OPENAI_JSON)]);
    response.on_headers(filter, host);
    response.on_body(usage_json(used).as_bytes());
    host.now.set(host.now.get() + 2 * SEC);
    response.end(filter, host, Ending::Completed);
}

/// The id of a charge or refund.
fn id_of(op: &SettleOp) -> Option<String> {
    match op {
        SettleOp::Charge { id, .. } | SettleOp::Refund { id, .. } => id.clone(),
        _ => None,
    }
}

#[test]
fn a_global_budget_settles_through_the_outbox() {
    let host = FakeHost::new(Arc::default(), T0);
    let filter = global_budget(&host);
    serve_globally(&filter, &host, 30);
    let ops: Vec<SettleOp> = host.reports.borrow().iter().map(|s| s.op.clone()).collect();
    let id = ops.first().and_then(id_of).expect("an id");
    assert_eq!(
        ops,
        [SettleOp::Refund {
            tokens: 70,
            age_ms: 2000,
            id: Some(id),
        }]
    );
}

#[test]
fn each_settlement_of_usage_is_named_by_an_id_of_its_own() {
    let host = FakeHost::new(Arc::default(), T0);
    let filter = global_budget(&host);
    serve_globally(&filter, &host, 30);
    serve_globally(&filter, &host, 250);
    serve_globally(&filter, &host, 250);
    let ids: Vec<String> = (host.reports.borrow().iter())
        .map(|s| id_of(&s.op).expect("an id"))
        .collect();
    assert_eq!(ids.len(), 3, "a refund, then two charges");
    for id in &ids {
        let hex = id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        assert!(id.len() == 16 && hex, "{id:?}: 16 lowercase hex digits");
    }
    assert!(
        ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2],
        "{ids:?}: the same usage twice is two settlements"
    );
}

/// A token budget as a balance: refilled one token a millisecond up to `burst`, a request
/// admitted while its reservation is covered (a reservation of 0: while a token is left), its
/// usage beyond the reservation owed down to `-max_debt` (the rest forgiven), what it did not use
/// given back up to `burst`.
struct Balance {
    tokens: i64,
    burst: i64,
    max_debt: i64,
    at: u64,
}

impl Balance {
    fn refill(&mut self, now_ms: u64) {
        let elapsed = i64::try_from(now_ms - self.at).unwrap();
        self.tokens = (self.tokens + elapsed).min(self.burst);
        self.at = now_ms;
    }

    fn admit(&mut self, reserve: i64) -> bool {
        let covered = self.tokens >= reserve.max(1);
        if covered {
            self.tokens -= reserve;
        }
        covered
    }

    fn settle(&mut self, reserved: i64, used: i64) {
        if used >= reserved {
            let owed = (used - reserved).min(self.tokens + self.max_debt);
            self.tokens -= owed.max(0);
        } else {
            self.tokens = (self.tokens + reserved - used).min(self.burst);
        }
    }
}

proptest::proptest! {
    /// Requests of one key reserve what they ask for (`max_tokens`), overlap, and settle what
    /// their responses used: the filter admits exactly the requests the balance admits, so a
    /// key's charge never exceeds its refill plus its burst plus `max_debt`.
    #[test]
    fn reserve_and_settle_match_a_balance_of_tokens(
        steps in proptest::collection::vec((0u64..40, 0u64..3, 0i64..80, 0i64..160), 1..120),
    ) {
        let (burst, max_debt) = (50, 30);
        let policy = json!({"name": "llm", "key": ["header:x-user-id"], "requests": 1000,
            "per": "1s", "burst": burst, "cost": {"from_response": {"usage": "total_tokens"},
            "reserve": {"request": "max_tokens", "default": 0}, "max_debt": max_debt}});
        let (filter, host) = setup(json!([policy]));
        let mut model = Balance { tokens: burst, burst, max_debt, at: 0 };
        let mut open: Vec<(Response, i64, i64)> = Vec::new();
        let mut now_ms = 0;
        for (gap, action, asked, used) in steps {
            now_ms += gap;
            host.now.set(T0 + now_ms * 1_000_000);
            model.refill(now_ms);
            if action == 0 && !open.is_empty() {
                let (response, reserved, used) = open.remove(0);
                *host.response.borrow_mut() = FakeRequest::new(&[("content-type", OPENAI_JSON)]);
                let mut response = response;
                response.on_headers(&filter, &host);
                response.on_body(format!(r#"{{"usage":{{"total_tokens":{used}}}}}"#).as_bytes());
                response.end(&filter, &host, Ending::Completed);
                model.settle(reserved, used);
                continue;
            }
            *host.request.borrow_mut() = FakeRequest::new(ALICE);
            let body = format!(r#"{{"model":"m","max_tokens":{asked}}}"#);
            let reserve = asked.min(burst);
            let verdict = filter.on_request_body(&host, filter.snapshot(&host), body.as_bytes());
            let admitted = matches!(verdict, Verdict::Continue(_));
            proptest::prop_assert_eq!(admitted, model.admit(reserve), "at {} ms", now_ms);
            if let Verdict::Continue(Admitted { tab: Some(tab), record, .. }) = verdict {
                open.push((Response::new(tab, record), reserve, used));
            }
        }
    }
}

#[test]
fn the_usage_a_body_reported_is_published_as_counts_and_read_back_alike() {
    let (filter, host) = setup(json!([budget(json!({}))]));
    respond(&filter, &host, OPENAI_JSON, &usage_json(300)).unwrap();
    let published = host.published.borrow()["sluice.usage"].clone();
    assert_eq!(published, "input=1 output=299 total=300");
    let counts = crate::core::usage::Counts {
        input: Some(1),
        output: Some(299),
        total: Some(300),
        ..crate::core::usage::Counts::default()
    };
    assert_eq!(read_usage_text(published.as_bytes()), Some(Ok(counts)));
    let mut cut = start(&filter, &host, ALICE).unwrap();
    cut.on_headers(&filter, &host);
    cut.end(&filter, &host, Ending::Reset);
    assert_eq!(host.published.borrow()["sluice.usage"], "unknown=reset");
}

#[test]
fn usage_text_reads_back_as_written_and_nothing_else_reads() {
    use crate::core::usage::Counts;
    use crate::output::metrics::UsageUnknown;
    let some = |input, output, total| Counts {
        input,
        output,
        total,
        ..Counts::default()
    };
    let written = [
        Ok(some(Some(10), Some(20), Some(30))),
        Ok(some(None, None, Some(7))),
        Ok(some(Some(0), None, None)),
        Ok(some(None, Some(crate::core::usage::MAX_TOKENS), None)),
        Ok(Counts {
            cache_read: 5000,
            cache_write: 1000,
            cached: 3,
            reasoning: 4,
            thoughts: 5,
            ..some(Some(20), Some(30), Some(6050))
        }),
        Err(UsageUnknown::Missing),
        Err(UsageUnknown::Invalid),
        Err(UsageUnknown::Reset),
    ];
    for usage in written {
        assert_eq!(read_usage_text(usage_text(&usage).as_bytes()), Some(usage));
    }
    for other in [
        "",
        "-",
        "unknown=",
        "unknown=later",
        "input=",
        "input=-1",
        "input=1 input=2",
        "tokens=5",
        "input=1  output=2",
        "input=1.5",
        "cache_read=0",
        "cache_read=1 cache_read=2",
    ] {
        assert_eq!(read_usage_text(other.as_bytes()), None, "{other:?}");
    }
}

#[test]
fn a_charge_is_the_cost_else_what_on_unknown_says_settled_against_the_reservation() {
    use crate::config::{Metered, OnUnknown, Reserve, UsageSource};
    use crate::output::metrics::UsageUnknown;
    let meter = crate::core::usage::Meter::parse(
        &serde_json::json!({"input_tokens": 1, "output_tokens": 4}),
    )
    .unwrap();
    let metered = |on_unknown| Metered {
        source: UsageSource::Body(meter),
        reserve: Reserve::Tokens(100),
        max_debt: None,
        on_unknown,
        ask_stream_usage: false,
    };
    let counts = crate::core::usage::Counts {
        input: Some(10),
        output: Some(20),
        total: None,
        ..crate::core::usage::Counts::default()
    };
    let source = &metered(OnUnknown::Reserve).source;
    let no_header = |_: &str| None;
    assert_eq!(
        cost(source, Ok(counts), no_header, Ending::Completed, NO_MODEL),
        Ok(90)
    );
    let missing = Err(UsageUnknown::Missing);
    assert_eq!(
        cost(source, missing, no_header, Ending::Reset, NO_MODEL),
        Err(UsageUnknown::Reset)
    );
    let header = UsageSource::Header("x-usage".into());
    let found = |name: &str| (name == "x-usage").then_some(42);
    assert_eq!(
        cost(&header, missing, found, Ending::Reset, NO_MODEL),
        Ok(42)
    );
    let unknown = Err(UsageUnknown::Invalid);
    let (filter, _) = setup(json!([budget(json!({}))]));
    let tier = &filter.plan().policies[0].tier;
    let charge = |on_unknown, cost| charge_of(&metered(on_unknown), tier, 100, cost);
    assert_eq!(charge(OnUnknown::Reserve, unknown), 100);
    assert_eq!(charge(OnUnknown::Tokens(7), unknown), 7);
    assert_eq!(charge(OnUnknown::Tokens(7), Ok(90)), 90);
    // As much as the key can owe: its capacity and, by default, as much again in debt.
    let capacity = tier.algorithm.capacity();
    assert_eq!(charge(OnUnknown::Max, unknown), 2 * capacity);
    assert_eq!(charge(OnUnknown::Max, Ok(90)), 90);
    assert_eq!(settle_op(100, 90), Some(Op::Refund(10)));
    assert_eq!(settle_op(100, 130), Some(Op::Charge(30)));
    assert_eq!(settle_op(100, 100), None);
}

#[test]
fn a_key_that_reserves_nothing_is_charged_its_usage_all_the_same() {
    // A reservation of 0 writes no record for a new key: its first charge makes one.
    let (filter, host) = setup(json!([budget(json!({"reserve": 0}))]));
    respond(&filter, &host, OPENAI_JSON, &usage_json(600)).unwrap();
    respond(&filter, &host, OPENAI_JSON, &usage_json(600)).unwrap();
    assert!(
        start(&filter, &host, ALICE).is_none(),
        "1,200 of 1,000 used"
    );
}

mod spend;
