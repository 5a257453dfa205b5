use super::*;
use crate::core::duration::NANOS_PER_SEC as SEC;
use crate::limiter::PolicyOutcome::{Allowed, Bypassed, CanaryShadowDenied, Denied, ShadowDenied};
use crate::output::metrics::{degraded_counter, requests_counter};
use crate::remote::overrides::Answer;
use crate::state::store::MemoryStore;
use crate::testing::{FakeHost, FakeRequest};
use crate::wire::exact::ExactStore;
use crate::wire::protocol::{CheckRequest, CheckResponse};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::sync::Arc;

const T0: u64 = 1_800_000_000 * SEC;

/// The rate-limit headers the glue would add to the response.
fn response_headers(filter: &Filter, reported: &Reported) -> Vec<(&'static str, String)> {
    let mut headers = Vec::new();
    filter.each_response_header(reported, |name, value| {
        headers.push((name, value.to_string()));
    });
    headers
}

/// A filter on its own worker and store.
fn setup(config: Value) -> (Filter, FakeHost) {
    let host = FakeHost::new(Arc::default(), T0);
    (configure(&config, &host), host)
}

fn configure(config: &Value, host: &FakeHost) -> Filter {
    Filter::configure(config.to_string().as_bytes(), "test", host, host, host).unwrap()
}

fn send(filter: &Filter, host: &FakeHost, headers: &[(&str, &str)]) -> Verdict {
    *host.request.borrow_mut() =
        FakeRequest::new(headers).with_property("source.address", "10.0.0.1:5555");
    filter.on_request_headers(host)
}

fn statuses(filter: &Filter, host: &FakeHost, n: usize, headers: &[(&str, &str)]) -> Vec<u16> {
    (0..n)
        .map(|_| match send(filter, host, headers) {
            Verdict::Continue(_) => 200,
            Verdict::Denied => 429,
            Verdict::Waiting(_) | Verdict::Hold { .. } => {
                panic!("only for policies that neither call nor hold")
            }
        })
        .collect()
}

fn per_user(burst: u64) -> Value {
    json!({"name": "per-user", "key": ["header:x-user-id"], "requests": 1, "per": "1s", "burst": burst})
}

const ALICE: &[(&str, &str)] = &[("x-user-id", "alice")];

#[test]
fn eight_rapid_requests_with_burst_five_give_five_200s_then_three_429s() {
    let (filter, host) = setup(json!({"policies": [per_user(5)]}));
    assert_eq!(
        statuses(&filter, &host, 8, ALICE),
        [200, 200, 200, 200, 200, 429, 429, 429]
    );
    host.now.set(T0 + 2 * SEC);
    assert_eq!(statuses(&filter, &host, 3, ALICE), [200, 200, 429]);
}

#[test]
fn a_denial_is_a_json_429_with_retry_after_and_headers() {
    let (filter, host) = setup(json!({"headers": "both", "policies": [per_user(1)]}));
    statuses(&filter, &host, 2, ALICE);
    assert_eq!(host.replies.get(), 1);
    let reply = host.reply.borrow();
    let reply = reply.as_ref().unwrap();
    assert_eq!((reply.status, reply.details), (429, "sluice_rate_limited"));
    assert_eq!(
        reply.body,
        r#"{"error":"too_many_requests","policy":"per-user","retry_after":1}"#
    );
    let header = |name: &str| reply.header(name);
    assert_eq!(header("content-type"), Some("application/json"));
    assert_eq!(header("retry-after"), Some("1"));
    assert_eq!(header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(header("ratelimit"), Some(r#""per-user";r=0;t=1"#));
}

#[test]
fn a_refusal_by_several_policies_names_each_with_what_it_has_left_and_its_wait() {
    let per_minute = json!({"name": "per-minute", "key": ["header:x-user-id"], "requests": 2,
                            "per": "1m"});
    let policies = json!({"policies": [per_user(2), per_minute]});
    let (filter, host) = setup(policies.clone());
    assert_eq!(statuses(&filter, &host, 3, ALICE), [200, 200, 429]);
    let reply = host.reply.borrow().clone().unwrap();
    // The longest wait decides and comes first: a client must wait out both.
    assert_eq!(
        reply.body,
        r#"{"error":"too_many_requests","policy":"per-minute","retry_after":30,"policies":[{"policy":"per-minute","remaining":0,"retry_after":30},{"policy":"per-user","remaining":0,"retry_after":1}]}"#
    );
    assert_eq!(reply.header("retry-after"), Some("30"));
    let record = host.records.borrow().last().cloned().unwrap();
    assert!(
        record.starts_with("outcome=denied policy=per-minute "),
        "{record}"
    );
    assert!(
        record.ends_with(" refused=per-minute:0:30,per-user:0:1"),
        "{record}"
    );

    let (filter, host) = setup(policies);
    let grpc = &[("x-user-id", "alice"), ("content-type", "application/grpc")];
    assert_eq!(statuses(&filter, &host, 3, grpc), [200, 200, 429]);
    let message = host.reply.borrow().clone().unwrap().body;
    assert_eq!(
        message,
        "too_many_requests: policy per-minute, retry after 30s; also policy per-user (retry after 1s)"
    );
}

#[test]
fn the_draft_fields_list_as_many_policies_as_header_policies_allows_the_tightest_first() {
    let policy = |name: &str, burst: u64| {
        json!({"name": name, "key": ["header:x-user-id"], "requests": 100, "per": "1s",
               "burst": burst})
    };
    let policies = json!([policy("wide", 50), policy("tight", 5), policy("middle", 20)]);
    let headers = |config: Value| {
        let (filter, host) = setup(config);
        let Verdict::Continue(admitted) = send(&filter, &host, ALICE) else {
            panic!("admitted");
        };
        let mut headers = Vec::new();
        let reported = admitted.reported.unwrap();
        filter.each_response_header(&reported, |name, value| {
            headers.push((name, value.to_string()));
        });
        headers
    };
    let two = headers(json!({"headers": "both", "header_policies": 2, "policies": policies}));
    let field = |headers: &[(&str, String)], name: &str| {
        headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        field(&two, "ratelimit").as_deref(),
        Some(r#""tight";r=4;t=1, "middle";r=19;t=1"#)
    );
    assert_eq!(
        field(&two, "ratelimit-policy").as_deref(),
        Some(r#""tight";q=100;w=1, "middle";q=100;w=1"#)
    );
    // The legacy fields hold one policy: the tightest.
    assert_eq!(field(&two, "x-ratelimit-remaining").as_deref(), Some("4"));
    let one = headers(json!({"headers": "draft", "policies": policies}));
    assert_eq!(
        field(&one, "ratelimit").as_deref(),
        Some(r#""tight";r=4;t=1"#)
    );
}

#[test]
fn a_refusal_by_one_policy_of_several_names_it_alone() {
    let generous = json!({"name": "generous", "key": ["header:x-user-id"], "requests": 100,
                          "per": "1s"});
    let (filter, host) = setup(json!({"policies": [per_user(1), generous]}));
    assert_eq!(statuses(&filter, &host, 2, ALICE), [200, 429]);
    let reply = host.reply.borrow().clone().unwrap();
    assert_eq!(
        reply.body,
        r#"{"error":"too_many_requests","policy":"per-user","retry_after":1}"#
    );
    let record = host.records.borrow().last().cloned().unwrap();
    assert!(!record.contains("refused="), "{record}");
}

#[test]
fn a_grpc_denial_is_resource_exhausted_with_the_rate_limit_headers_and_no_content_type() {
    let (filter, host) = setup(json!({"headers": "both", "policies": [per_user(1)]}));
    let grpc = &[("x-user-id", "alice"), ("content-type", "application/grpc")];
    assert_eq!(statuses(&filter, &host, 2, grpc), [200, 429]);
    let reply = host.reply.borrow().clone().unwrap();
    assert_eq!(reply.grpc_status.code(), 8);
    assert_eq!(
        reply.body,
        "too_many_requests: policy per-user, retry after 1s"
    );
    assert_eq!(reply.header("content-type"), None);
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(reply.header("ratelimit"), Some(r#""per-user";r=0;t=1"#));
}

#[test]
fn a_policys_denial_overrides_the_top_level_one_field_by_field() {
    let mut own = per_user(1);
    own["denial"] = json!({"status": 503, "grpc_status": "unavailable"});
    let mut other = per_user(1);
    other["name"] = json!("other");
    other["key"] = json!(["header:x-other"]);
    let config = json!({"denial": {"status": 420, "body": "calm down", "content_type": "text/plain"},
        "policies": [own, other]});
    let (filter, host) = setup(config);
    assert_eq!(statuses(&filter, &host, 2, ALICE), [200, 429]);
    let reply = host.reply.borrow().clone().unwrap();
    assert_eq!((reply.status, reply.body.as_str()), (503, "calm down"));
    assert_eq!(reply.header("content-type"), Some("text/plain"));
    assert_eq!(reply.grpc_status.code(), 14);
    let other_user = &[("x-other", "o")];
    assert_eq!(statuses(&filter, &host, 2, other_user), [200, 429]);
    let reply = host.reply.borrow().clone().unwrap();
    assert_eq!((reply.status, reply.grpc_status.code()), (420, 8));
}

#[test]
fn denials_shadow_denials_and_bypasses_are_recorded_for_the_access_log_and_nothing_else() {
    let mut shadow = per_user(1);
    (shadow["name"], shadow["mode"]) = (json!("trial"), json!("shadow"));
    let config = json!({"policies": [per_user(2), shadow], "bypass": [{"key": ["carol"],
        "policies": ["per-user"], "owner": "o", "reason": "r", "expires": "2030-01-01T00:00:00Z"}]});
    let (filter, host) = setup(config);
    assert_eq!(statuses(&filter, &host, 3, ALICE), [200, 200, 429]);
    statuses(&filter, &host, 1, &[("x-user-id", "carol")]);
    let records = host.records.borrow().clone();
    let fields = |r: &str| r.rsplit_once(" key=").unwrap().0.to_string();
    let fields: Vec<String> = records.iter().map(|r| fields(r)).collect();
    assert_eq!(
        fields,
        [
            "outcome=shadow_denied policy=trial mode=shadow",
            "outcome=denied policy=per-user mode=enforce",
            "outcome=bypassed policy=per-user mode=enforce",
        ],
        "the first request had nothing to record"
    );
}

#[test]
fn an_allowed_request_reads_no_content_type_and_records_nothing() {
    let (filter, host) = setup(json!({"policies": [per_user(5)]}));
    send(&filter, &host, ALICE);
    assert_eq!(host.request.borrow().reads.get(), 1, "x-user-id only");
    assert!(host.records.borrow().is_empty());
}

#[test]
fn allowed_responses_report_the_most_restrictive_policy() {
    let config = json!({"policies": [
        {"name": "roomy", "key": ["header:x-user-id"], "requests": 100, "per": "1s"},
        {"name": "tight", "key": ["ip"], "requests": 1, "per": "1s", "burst": 3},
    ]});
    let (filter, host) = setup(config);
    let Verdict::Continue(Admitted {
        reported: Some(reported),
        ..
    }) = send(&filter, &host, ALICE)
    else {
        panic!("allowed")
    };
    let headers = response_headers(&filter, &reported);
    assert_eq!(headers[0], ("x-ratelimit-limit", "3".to_string()));
    assert_eq!(headers[1], ("x-ratelimit-remaining", "2".to_string()));
}

#[test]
fn keys_are_isolated() {
    let (filter, host) = setup(json!({"policies": [per_user(2)]}));
    assert_eq!(statuses(&filter, &host, 3, ALICE), [200, 200, 429]);
    assert_eq!(
        statuses(&filter, &host, 2, &[("x-user-id", "bob")]),
        [200, 200]
    );
}

#[test]
fn a_request_without_the_key_passes_unless_missing_keys_share_a_bucket() {
    let (filter, host) = setup(json!({"policies": [per_user(1)]}));
    assert_eq!(statuses(&filter, &host, 3, &[]), [200, 200, 200]);
    let mut shared = per_user(1);
    shared["missing_key"] = json!("shared");
    let (filter, host) = setup(json!({"policies": [shared]}));
    assert_eq!(
        statuses(&filter, &host, 2, &[("x-user-id", "")]),
        [200, 429]
    );
    assert_eq!(statuses(&filter, &host, 1, ALICE), [200]);
}

#[test]
fn a_layered_denial_charges_no_other_policy() {
    let config = json!({"policies": [
        {"name": "per-second", "key": ["header:x-user-id"], "requests": 2, "per": "1s"},
        {"name": "per-minute", "key": ["header:x-user-id"], "requests": 3, "per": "1m"},
        {"name": "per-ip", "key": ["ip"], "requests": 10, "per": "1m"},
    ]});
    let (filter, host) = setup(config);
    assert_eq!(statuses(&filter, &host, 4, ALICE), [200, 200, 429, 429]);
    host.now.set(T0 + 1_100 * SEC / 1000);
    assert_eq!(
        statuses(&filter, &host, 2, ALICE),
        [200, 429],
        "per-minute has one left"
    );
    filter.flush_counters(&host);
    assert_eq!(host.counter(&requests_counter("per-ip", Allowed)), 3);
    let Verdict::Continue(Admitted {
        reported: Some(r), ..
    }) = send(&filter, &host, &[("x-user-id", "bob")])
    else {
        panic!()
    };
    let remaining_ip = response_headers(&filter, &r);
    assert_eq!(
        remaining_ip[1].1, "1",
        "bob's per-second bucket is the tightest"
    );
    assert_eq!(host.counter(&requests_counter("per-minute", Denied)), 1);
}

#[test]
fn shadow_policies_count_but_never_deny_or_report() {
    let mut shadow = per_user(1);
    shadow["mode"] = json!("shadow");
    let (filter, host) = setup(json!({"policies": [shadow]}));
    let verdicts: Vec<Verdict> = (0..3).map(|_| send(&filter, &host, ALICE)).collect();
    assert!(verdicts
        .iter()
        .all(|v| matches!(v, Verdict::Continue(Admitted { reported: None, .. }))));
    filter.flush_counters(&host);
    assert_eq!(host.counter(&requests_counter("per-user", ShadowDenied)), 2);
    assert_eq!(host.counter(&requests_counter("per-user", Allowed)), 1);
    assert_eq!(host.replies.get(), 0);
}

/// The first user ids whose keys a rollout of `percent` enforces for, and does not.
fn canary_and_rest(percent: u32) -> (String, String) {
    let inside = |id: &String| {
        let key = crate::core::key::hash_values(
            std::slice::from_ref(id),
            &crate::core::key::HashSecret::PUBLIC,
        );
        crate::core::key::rollout_position(key) < percent * 10_000
    };
    let ids = || (0..).map(|i| format!("user-{i}"));
    (
        ids().find(inside).unwrap(),
        ids().find(|id| !inside(id)).unwrap(),
    )
}

#[test]
fn a_rollout_enforces_for_its_keys_and_runs_in_shadow_for_the_rest_which_the_default_limits() {
    let mut canary_policy = per_user(1);
    canary_policy["rollout"] = json!({"enforce_percent": 30});
    let baseline = json!({"name": "baseline", "key": ["header:x-user-id"], "requests": 1,
        "per": "1s", "burst": 3});
    let (filter, host) = setup(json!({"policies": [canary_policy], "default": baseline}));
    let (canary, rest) = canary_and_rest(30);
    assert_eq!(
        statuses(&filter, &host, 3, &[("x-user-id", &canary)]),
        [200, 429, 429]
    );
    assert_eq!(
        statuses(&filter, &host, 4, &[("x-user-id", &rest)]),
        [200, 200, 200, 429],
        "outside the canary the new limit is shadow, and the default still limits"
    );
    filter.flush_counters(&host);
    let count = |policy, outcome| host.counter(&requests_counter(policy, outcome));
    assert_eq!(count("per-user", Denied), 2);
    assert_eq!(count("per-user", CanaryShadowDenied), 3);
    assert_eq!(count("per-user", ShadowDenied), 0);
    assert_eq!(count("baseline", Denied), 1);
    let records = host.records.borrow();
    let modes: Vec<&str> = records
        .iter()
        .map(|r| r.split(' ').nth(2).unwrap())
        .collect();
    assert_eq!(
        modes,
        [
            "mode=canary",
            "mode=canary",
            "mode=canary_shadow",
            "mode=canary_shadow",
            "mode=enforce"
        ],
        "the access log tells the canary from the rest"
    );
}

#[test]
fn tiers_give_premium_keys_their_own_rate() {
    let mut tiered = per_user(1);
    tiered["tiers"] = json!({"by": "header:x-plan", "values": {"premium": {"requests": 10, "per": "1s", "burst": 3}}});
    let (filter, host) = setup(json!({"policies": [tiered]}));
    assert_eq!(statuses(&filter, &host, 2, ALICE), [200, 429]);
    let premium = &[("x-user-id", "carol"), ("x-plan", "premium")];
    assert_eq!(statuses(&filter, &host, 4, premium), [200, 200, 200, 429]);
    let unknown = &[("x-user-id", "dave"), ("x-plan", "gold")];
    assert_eq!(statuses(&filter, &host, 2, unknown), [200, 429]);
}

#[test]
fn cost_takes_several_tokens() {
    let mut costly = per_user(5);
    costly["cost"] = json!(2);
    let (filter, host) = setup(json!({"policies": [costly]}));
    assert_eq!(statuses(&filter, &host, 3, ALICE), [200, 200, 429]);
}

#[test]
fn the_default_policy_applies_only_when_nothing_matched() {
    let mut api = per_user(1);
    api["match"] = json!({"path_prefix": "/api/"});
    let config = json!({"policies": [api], "default": {"name": "baseline", "key": ["ip"], "requests": 1, "per": "1s", "burst": 2}});
    let (filter, host) = setup(config);
    let other = &[(":path", "/static/x"), ("x-user-id", "alice")];
    assert_eq!(statuses(&filter, &host, 3, other), [200, 200, 429]);
    let api = &[(":path", "/api/x"), ("x-user-id", "alice")];
    assert_eq!(statuses(&filter, &host, 2, api), [200, 429]);
}

#[test]
fn each_attribute_is_read_once_per_request() {
    let mut p = per_user(5);
    p["match"] = json!({"path_prefix": "/api/", "methods": ["GET"], "headers": [{"name": "x-user-id", "present": true}]});
    let mut q = p.clone();
    q["name"] = json!("again");
    let (filter, host) = setup(json!({"policies": [p, q]}));
    send(
        &filter,
        &host,
        &[(":path", "/api/x"), (":method", "GET"), ("x-user-id", "a")],
    );
    assert_eq!(host.request.borrow().reads.get(), 3);
}

#[test]
fn a_clock_stepping_back_gives_no_extra_tokens() {
    let (filter, host) = setup(json!({"policies": [per_user(2)]}));
    assert_eq!(statuses(&filter, &host, 2, ALICE), [200, 200]);
    host.now.set(T0 + 5 * SEC);
    assert_eq!(statuses(&filter, &host, 2, ALICE), [200, 200]);
    host.now.set(T0);
    assert_eq!(statuses(&filter, &host, 1, ALICE), [429]);
}

#[test]
fn counters_reach_the_host_only_when_flushed() {
    let (filter, host) = setup(json!({"policies": [per_user(1)]}));
    statuses(&filter, &host, 3, ALICE);
    assert_eq!(host.counter(&requests_counter("per-user", Denied)), 0);
    filter.flush_counters(&host);
    assert_eq!(host.counter(&requests_counter("per-user", Denied)), 2);
    assert_eq!(host.counter(&requests_counter("per-user", Allowed)), 1);
}

/// `workers` filters on their own threads and one store, each sending `each` requests for
/// alice at once; what `report` makes of each one's admitted count and host.
// wasm32-wasip1 has no threads; Envoy's own workers race in the integration tests.
#[cfg(not(target_arch = "wasm32"))]
fn race<T: Send + 'static>(
    config: &Value,
    workers: usize,
    each: usize,
    report: fn(usize, &Filter, &FakeHost) -> T,
) -> Vec<T> {
    let store = Arc::new(MemoryStore::default());
    configure(config, &FakeHost::new(store.clone(), T0));
    let threads: Vec<_> = (0..workers)
        .map(|_| {
            let (store, config) = (store.clone(), config.clone());
            std::thread::spawn(move || {
                let host = FakeHost::new(store, T0);
                let filter = configure(&config, &host);
                let statuses = statuses(&filter, &host, each, ALICE);
                report(
                    statuses.iter().filter(|&&s| s == 200).count(),
                    &filter,
                    &host,
                )
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[cfg(not(target_arch = "wasm32"))]
#[test]
fn workers_racing_on_one_fresh_key_never_over_admit() {
    let results = race(
        &json!({"policies": [per_user(50)]}),
        4,
        500,
        |admitted, filter, host| {
            filter.flush_counters(host);
            let counter = |name| host.counter(name);
            (
                admitted,
                counter("sluice.cas_retries"),
                counter("sluice.cas_exhausted"),
            )
        },
    );
    let admitted: usize = results.iter().map(|r| r.0).sum();
    assert_eq!(admitted, 50, "{results:?}");
}

/// 64 keys, five tokens an hour per user: no refill gets in the way.
fn small_table() -> Value {
    json!({"policies": [{"name": "per-user", "key": ["header:x-user-id"], "requests": 1,
        "per": "1h", "burst": 5, "max_keys": 64}]})
}

#[test]
fn a_flood_of_new_keys_frees_no_drained_key_and_gives_every_newcomer_its_burst() {
    let (filter, host) = setup(small_table());
    assert_eq!(
        statuses(&filter, &host, 6, ALICE),
        [200, 200, 200, 200, 200, 429]
    );
    for i in 0..5_000u64 {
        host.now.set(T0 + i * 100_000);
        statuses(
            &filter,
            &host,
            1,
            &[("x-user-id", &format!("attacker-{i}"))],
        );
        if i % 1_000 == 500 {
            let newcomer = format!("newcomer-{i}");
            let got = statuses(&filter, &host, 8, &[("x-user-id", &newcomer)]);
            assert_eq!(
                got,
                [200, 200, 200, 200, 200, 429, 429, 429],
                "newcomer {i}"
            );
        }
    }
    let entries = host.store.entry_count();
    assert_eq!(
        entries,
        2 + 1,
        "two pages of 32 keys whatever the number of keys, and the hash secret"
    );
    assert_eq!(
        statuses(&filter, &host, 1, ALICE),
        [429],
        "alice stays drained"
    );
    filter.flush_counters(&host);
    let evictions = host.counter("sluice.evictions");
    assert!(evictions > 4_000, "{evictions}");
    assert_eq!(
        host.counter("sluice.forgiven"),
        evictions,
        "only attackers were forgotten, each owing its one request"
    );
}

#[test]
fn a_slot_whose_bucket_is_full_again_is_reused_without_counting_an_eviction() {
    let mut one_slot = per_user(1);
    one_slot["max_keys"] = json!(1);
    let (filter, host) = setup(json!({ "policies": [one_slot] }));
    assert_eq!(statuses(&filter, &host, 2, ALICE), [200, 429]);
    host.now.set(T0 + SEC);
    assert_eq!(
        statuses(&filter, &host, 2, &[("x-user-id", "bob")]),
        [200, 429]
    );
    filter.flush_counters(&host);
    assert_eq!(host.counter("sluice.evictions"), 0, "alice owed nothing");
    assert_eq!(
        statuses(&filter, &host, 1, ALICE),
        [200],
        "bob's slot was the only one"
    );
    filter.flush_counters(&host);
    assert_eq!(
        (
            host.counter("sluice.evictions"),
            host.counter("sluice.forgiven")
        ),
        (1, 1)
    );
}

#[test]
fn configure_refuses_bad_json() {
    let host = FakeHost::new(Arc::default(), T0);
    let err = Filter::configure(
        br#"{"policies": [{"name": "x"}]}"#,
        "t",
        &host,
        &host,
        &host,
    )
    .unwrap_err();
    assert!(err.to_string().starts_with("policies[0]"), "{err}");
}

/// The rate-limit service, answering in its wire format as the exact store decides.
#[derive(Default)]
struct FakeService(RefCell<ExactStore>);

impl FakeService {
    fn answer(&self, body: &[u8], now: u64) -> Vec<u8> {
        let request: CheckRequest = serde_json::from_slice(body).unwrap();
        let mut store = self.0.borrow_mut();
        let results = request.checks.iter().map(|c| store.check(c, now).unwrap());
        let response = CheckResponse {
            results: results.collect(),
        };
        serde_json::to_vec(&response).unwrap()
    }
}

/// Sends one request through the filter, answering its calls from `service` (or failing
/// them when `service` is `None`). Returns the final status.
fn serve(
    filter: &Filter,
    host: &FakeHost,
    service: Option<&FakeService>,
    headers: &[(&str, &str)],
) -> u16 {
    let mut verdict = send(filter, host, headers);
    loop {
        match verdict {
            Verdict::Continue(_) | Verdict::Hold { .. } => return 200,
            Verdict::Denied => return host.reply.borrow().as_ref().unwrap().status as u16,
            Verdict::Waiting(pending) => {
                let body = host.call.borrow().clone().unwrap();
                let reply = service.map(|s| (200, s.answer(&body, host.now.get())));
                verdict = filter.on_service_response(host, pending, reply);
            }
        }
    }
}

fn global(policy: Value) -> Value {
    json!({"global": {"cluster": "ratelimit", "authority": "ratelimit"}, "policies": [policy]})
}

fn global_per_user(burst: u64) -> Value {
    let mut p = per_user(burst);
    p["scope"] = json!("global");
    p
}

#[test]
fn only_global_metered_and_concurrency_policies_owe_the_service_settlements() {
    let streams = json!({"name": "streams", "algorithm": "concurrency", "key": ["header:x-user-id"], "requests": 4});
    let mut global_streams = streams.clone();
    global_streams["scope"] = json!("global");
    let mut tokens = global_per_user(5);
    tokens["cost"] = json!({"from_response": {"usage": "total_tokens"}});
    let settles = |config: Value| setup(config).0.settles();
    assert!(settles(global(global_streams)));
    assert!(settles(global(tokens)));
    assert!(!settles(global(global_per_user(5))));
    assert!(
        !settles(json!({"policies": [streams]})),
        "local slots stay in shared data"
    );
}

#[test]
fn a_strict_global_policy_asks_the_service_then_remembers_a_denial() {
    let (filter, host) = setup(global(global_per_user(3)));
    let service = FakeService::default();
    let statuses: Vec<u16> = (0..5)
        .map(|_| serve(&filter, &host, Some(&service), ALICE))
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    assert_eq!(
        host.calls.get(),
        4,
        "the fifth is denied from the over-limit cache"
    );
    host.now.set(T0 + SEC);
    assert_eq!(serve(&filter, &host, Some(&service), ALICE), 200);
    assert_eq!(host.calls.get(), 5);
}

#[test]
fn envoys_sharing_the_service_admit_exactly_the_global_limit() {
    let service = FakeService::default();
    let envoys: Vec<(Filter, FakeHost)> =
        (0..3).map(|_| setup(global(global_per_user(10)))).collect();
    let admitted = (0..40)
        .filter(|i| {
            let (filter, host) = &envoys[i % 3];
            serve(filter, host, Some(&service), ALICE) == 200
        })
        .count();
    assert_eq!(admitted, 10);
}

#[test]
fn a_lease_serves_a_hot_key_with_one_call_per_lease() {
    let mut p = global_per_user(10);
    p["lease"] = json!(5);
    let (filter, host) = setup(global(p));
    let service = FakeService::default();
    let statuses: Vec<u16> = (0..12)
        .map(|_| serve(&filter, &host, Some(&service), ALICE))
        .collect();
    assert_eq!(statuses, [vec![200; 10], vec![429; 2]].concat());
    assert_eq!(
        host.calls.get(),
        3,
        "two leases of 5, then one denial cached"
    );
}

#[test]
fn leased_tokens_lapse_rather_than_outlive_their_ttl() {
    let mut p = global_per_user(10);
    p["lease"] = json!(5);
    let (filter, host) = setup(global(p));
    let service = FakeService::default();
    assert_eq!(serve(&filter, &host, Some(&service), ALICE), 200);
    host.now.set(T0 + crate::limiter::GRANT_TTL);
    assert_eq!(serve(&filter, &host, Some(&service), ALICE), 200);
    assert_eq!(host.calls.get(), 2, "the lapsed lease was not spent");
}

#[test]
fn a_fixed_window_lease_ends_with_its_window() {
    let mut p = global_per_user(10);
    (p["algorithm"], p["burst"], p["requests"]) = (json!("fixed_window"), Value::Null, json!(10));
    p["lease"] = json!(5);
    let (filter, host) = setup(global(p));
    let service = FakeService::default();
    // Half-way through a one-second window: it ends 500 ms later, before the lease's 1 s.
    let ms = 1_000_000;
    host.now.set(T0 + 500 * ms);
    assert_eq!(serve(&filter, &host, Some(&service), ALICE), 200);
    host.now.set(T0 + 900 * ms);
    assert_eq!(serve(&filter, &host, Some(&service), ALICE), 200);
    assert_eq!(host.calls.get(), 1, "spent from the lease");
    host.now.set(T0 + 1_100 * ms);
    assert_eq!(serve(&filter, &host, Some(&service), ALICE), 200);
    assert_eq!(host.calls.get(), 2, "the lease ended with the window");
}

#[test]
fn a_service_that_cannot_be_reached_fails_open_to_the_emergency_budget() {
    let mut p = global_per_user(10);
    p["emergency"] = json!({"requests": 1, "per": "1s", "burst": 2});
    let (filter, host) = setup(global(p));
    host.service_reachable.set(false);
    let statuses: Vec<u16> = (0..3).map(|_| serve(&filter, &host, None, ALICE)).collect();
    assert_eq!(statuses, [200, 200, 429]);
    filter.flush_counters(&host);
    assert_eq!(host.counter(&degraded_counter("per-user")), 3);
    assert_eq!(host.counter("sluice.callout_failures"), 3);
}

#[test]
fn a_policy_that_fails_closed_answers_503() {
    let mut p = global_per_user(10);
    p["failure_mode"] = json!("closed");
    let (filter, host) = setup(global(p));
    assert_eq!(serve(&filter, &host, None, ALICE), 503);
    let reply = host.reply.borrow().clone().unwrap();
    assert_eq!(
        reply.body,
        r#"{"error":"rate_limit_unavailable","policy":"per-user","retry_after":1}"#
    );
    assert_eq!(reply.details, "sluice_unavailable");
    assert_eq!(reply.header("retry-after"), Some("1"));
}

#[test]
fn a_non_200_or_garbled_reply_is_a_failure() {
    let mut p = global_per_user(10);
    p["failure_mode"] = json!("closed");
    let (filter, host) = setup(global(p));
    for reply in [(503, b"{}".to_vec()), (200, b"not json".to_vec())] {
        let Verdict::Waiting(pending) = send(&filter, &host, ALICE) else {
            panic!()
        };
        assert!(matches!(
            filter.on_service_response(&host, pending, Some(reply)),
            Verdict::Denied
        ));
    }
}

#[test]
fn after_repeated_failures_the_service_is_left_alone_for_a_backoff() {
    let (filter, host) = setup(global(global_per_user(100)));
    host.service_reachable.set(false);
    for _ in 0..10 {
        serve(&filter, &host, None, ALICE);
    }
    assert_eq!(
        host.calls.get(),
        crate::remote::breaker::FAILURES_TO_OPEN as usize
    );
    host.service_reachable.set(true);
    host.now.set(T0 + crate::remote::breaker::BACKOFF);
    assert_eq!(
        serve(&filter, &host, Some(&FakeService::default()), ALICE),
        200
    );
    assert_eq!(host.calls.get(), 4, "one probe");
}

#[test]
fn a_local_denial_spares_the_service_a_call() {
    let config = json!({"global": {"cluster": "c", "authority": "a"}, "policies": [
        per_user(1),
        {"name": "global-user", "scope": "global", "key": ["header:x-user-id"], "requests": 10, "per": "1s"},
    ]});
    let (filter, host) = setup(config);
    let service = FakeService::default();
    assert_eq!(serve(&filter, &host, Some(&service), ALICE), 200);
    assert_eq!(serve(&filter, &host, Some(&service), ALICE), 429);
    assert_eq!(host.calls.get(), 1);
}

#[test]
fn a_global_denial_charges_no_local_bucket() {
    let config = json!({"global": {"cluster": "c", "authority": "a"}, "policies": [
        {"name": "per-user", "key": ["header:x-user-id"], "requests": 1, "per": "1m", "burst": 5},
        {"name": "global-user", "scope": "global", "key": ["header:x-user-id"], "requests": 1, "per": "1s", "burst": 1},
    ]});
    let (filter, host) = setup(config);
    let service = FakeService::default();
    assert_eq!(serve(&filter, &host, Some(&service), ALICE), 200);
    assert_eq!(
        serve(&filter, &host, Some(&service), ALICE),
        429,
        "denied by the service"
    );
    host.now.set(T0 + SEC);
    assert_eq!(serve(&filter, &host, Some(&service), ALICE), 200);
    let fresh_service_each_time =
        (0..5).filter(|_| serve(&filter, &host, Some(&FakeService::default()), ALICE) == 200);
    assert_eq!(
        fresh_service_each_time.count(),
        3,
        "the local bucket was charged twice, not three times"
    );
}

fn bypassed_alice(expires: &str) -> Value {
    json!({"policies": [per_user(1)], "bypass": [{"key": ["alice"], "policies": ["per-user"],
        "owner": "oncall@example.com", "reason": "INC-42 migration", "expires": expires}]})
}

#[test]
fn a_bypassed_key_passes_and_is_counted_until_the_entry_expires() {
    let (filter, host) = setup(bypassed_alice("2027-06-01T00:00:00Z"));
    assert_eq!(statuses(&filter, &host, 3, ALICE), [200, 200, 200]);
    assert_eq!(
        statuses(&filter, &host, 2, &[("x-user-id", "bob")]),
        [200, 429]
    );
    filter.flush_counters(&host);
    assert_eq!(host.counter(&requests_counter("per-user", Bypassed)), 3);
    let (filter, host) = setup(bypassed_alice("2020-01-01T00:00:00Z"));
    assert_eq!(
        statuses(&filter, &host, 2, ALICE),
        [200, 429],
        "expired: ignored"
    );
}

#[test]
fn a_key_that_takes_another_keys_slot_never_spends_its_grant() {
    let mut p = global_per_user(20);
    (p["lease"], p["max_keys"]) = (json!(5), json!(1));
    let (filter, host) = setup(global(p));
    let service = FakeService::default();
    assert_eq!(serve(&filter, &host, Some(&service), ALICE), 200);
    assert_eq!(host.calls.get(), 1, "alice holds four granted tokens");
    let bob = &[("x-user-id", "bob")];
    assert_eq!(serve(&filter, &host, Some(&service), bob), 200);
    assert_eq!(
        host.calls.get(),
        2,
        "bob took the slot, but not alice's tokens"
    );
    filter.flush_counters(&host);
    assert_eq!(
        (
            host.counter("sluice.evictions"),
            host.counter("sluice.forgiven")
        ),
        (1, 0),
        "forgetting a grant forgives nothing: the service decides"
    );
}

/// `per_user(burst)` refilling one token an hour, leasing `lease` tokens to a worker.
fn leasing(burst: u64, lease: u64) -> Value {
    let mut p = per_user(burst);
    (p["per"], p["lease"]) = (json!("1h"), json!(lease));
    json!({ "policies": [p] })
}

fn remaining(filter: &Filter, host: &FakeHost, headers: &[(&str, &str)]) -> String {
    let Verdict::Continue(Admitted {
        reported: Some(reported),
        ..
    }) = send(filter, host, headers)
    else {
        panic!("not admitted");
    };
    let headers = response_headers(filter, &reported);
    headers
        .into_iter()
        .find(|(n, _)| *n == "x-ratelimit-remaining")
        .unwrap()
        .1
}

#[test]
fn a_local_lease_serves_a_hot_key_with_one_read_and_write_per_lease() {
    let (filter, host) = setup(leasing(50, 10));
    assert_eq!(
        remaining(&filter, &host, ALICE),
        "49",
        "a first visit takes no lease"
    );
    host.store_calls.set(0);
    let left: Vec<String> = (0..11).map(|_| remaining(&filter, &host, ALICE)).collect();
    assert_eq!(
        left,
        ["48", "47", "46", "45", "44", "43", "42", "41", "40", "39", "38"]
    );
    assert_eq!(
        host.store_calls.get(),
        4,
        "a read and a CAS per lease of 10"
    );
}

#[test]
fn tokens_a_worker_still_holds_go_back_to_the_bucket() {
    let (filter, host) = setup(leasing(20, 10));
    assert_eq!(
        statuses(&filter, &host, 2, ALICE),
        [200, 200],
        "the second leases 10"
    );
    host.now.set(T0 + crate::state::ledger::LOAN_TTL);
    let later = statuses(&filter, &host, 25, ALICE);
    assert_eq!(later, [vec![200; 18], vec![429; 7]].concat(), "none lost");
}

#[test]
fn more_hot_keys_than_the_ledger_holds_each_get_exactly_their_burst() {
    let (filter, host) = setup(leasing(10, 5));
    let users: Vec<String> = (0..40).map(|i| format!("user-{i}")).collect();
    let mut admitted = vec![0; users.len()];
    for _ in 0..15 {
        for (user, count) in users.iter().zip(&mut admitted) {
            host.now.set(host.now.get() + 1_000_000);
            if let Verdict::Continue(_) = send(&filter, &host, &[("x-user-id", user)]) {
                *count += 1;
            }
        }
    }
    assert_eq!(admitted, vec![10; users.len()]);
}

#[test]
fn a_key_that_comes_back_later_than_a_lease_lasts_takes_none() {
    let (filter, host) = setup(leasing(20, 10));
    for left in (15..20).rev() {
        host.store_calls.set(0);
        assert_eq!(remaining(&filter, &host, ALICE), left.to_string());
        assert!(
            host.store_calls.get() >= 2,
            "every request visits the bucket"
        );
        host.now
            .set(host.now.get() + crate::state::ledger::LOAN_TTL);
    }
}

#[test]
fn a_request_denied_by_another_policy_gives_its_leased_token_back() {
    let per_key = json!({"name": "per-key", "key": ["header:x-api-key"], "requests": 1,
        "per": "1h", "burst": 2});
    let mut config = leasing(10, 5);
    config["policies"].as_array_mut().unwrap().push(per_key);
    let (filter, host) = setup(config);
    let with_key = &[("x-user-id", "alice"), ("x-api-key", "k1")];
    assert_eq!(statuses(&filter, &host, 3, with_key), [200, 200, 429]);
    // alice's bucket: 10, less 1, then a lease of 5 (one spent; the denied request's token
    // came back): 4 held, 4 left.
    let alone = statuses(&filter, &host, 10, ALICE);
    assert_eq!(alone, [vec![200; 8], vec![429; 2]].concat());
}

#[cfg(not(target_arch = "wasm32"))]
#[test]
fn workers_racing_with_leases_never_over_admit() {
    let results = race(&leasing(50, 4), 4, 500, |admitted, _, _| admitted);
    let admitted: usize = results.iter().sum();
    assert!((50 - 4 * 3..=50).contains(&admitted), "{results:?}");
}

proptest::proptest! {
    /// Workers leasing from one bucket at random moments, handing back what they hold when
    /// leases expire: what they admit never exceeds what the bucket gives (its burst plus the
    /// refill so far). (`workers_racing_with_leases_never_over_admit` bounds the shortfall.)
    #[test]
    fn leasing_workers_admit_what_the_bucket_gives(
        lease in 1u64..8,
        extra in 0u64..20,
        steps in proptest::collection::vec((0usize..3, 0u64..400), 1..300),
    ) {
        let (burst, rate_per_sec) = (lease + extra, 10);
        let mut p = per_user(burst);
        (p["requests"], p["lease"], p["max_keys"]) = (json!(rate_per_sec), json!(lease), json!(4));
        let config = json!({ "policies": [p] });
        let store = Arc::new(MemoryStore::default());
        let workers: Vec<(Filter, FakeHost)> = (0..3)
            .map(|_| {
                let host = FakeHost::new(store.clone(), T0);
                (configure(&config, &host), host)
            })
            .collect();
        let (mut now, mut admitted) = (T0, 0);
        for (worker, ms) in steps {
            now += ms * 1_000_000;
            let (filter, host) = &workers[worker];
            host.now.set(now);
            if matches!(send(filter, host, ALICE), Verdict::Continue(_)) {
                admitted += 1;
            }
            let given = burst + (now - T0) * rate_per_sec / SEC;
            proptest::prop_assert!(admitted <= given, "{admitted} > {given}");
        }
    }
}

/// Global slots, 2 per user, failing closed; with `other`, a second global policy.
fn global_streams(other: Option<Value>) -> Value {
    let streams = json!({"name": "streams", "scope": "global", "algorithm": "concurrency",
        "key": ["header:x-user-id"], "requests": 2, "failure_mode": "closed"});
    let policies: Vec<Value> = std::iter::once(streams).chain(other).collect();
    json!({"global": {"cluster": "ratelimit", "authority": "ratelimit"}, "policies": policies})
}

/// The slot the request's call names, and the reply that answers its checks `allowed` each.
fn slot_and_reply(host: &FakeHost, allowed: &[bool]) -> (String, (u32, Vec<u8>)) {
    let request: CheckRequest =
        serde_json::from_slice(&host.call.borrow().clone().unwrap()).unwrap();
    let slot = request.checks[0].slot.clone().expect("a named slot");
    let results = allowed
        .iter()
        .map(|&allowed| crate::wire::protocol::CheckResult {
            allowed,
            granted: u64::from(allowed),
            remaining: 0,
            reset_ms: 1_000,
            retry_after_ms: if allowed { 0 } else { 1_000 },
            delay_ms: None,
        })
        .collect();
    let body = serde_json::to_vec(&CheckResponse { results }).unwrap();
    (slot, (200, body))
}

/// The slots released through the outbox, by name.
fn released(host: &FakeHost) -> Vec<String> {
    let reports = host.reports.borrow();
    let releases = reports.iter().filter_map(|s| match &s.op {
        SettleOp::Release { slot } => Some(slot.clone()),
        _ => None,
    });
    releases.collect()
}

/// Issue 31, finding 1: the call failed or timed out, but the service may have taken the slot
/// (or may yet, when the check comes late): the slot is released.
#[test]
fn a_check_that_fails_gives_back_the_slot_it_named() {
    let (filter, host) = setup(global_streams(None));
    let Verdict::Waiting(pending) = send(&filter, &host, ALICE) else {
        panic!("asks the service")
    };
    let (slot, _) = slot_and_reply(&host, &[true]);
    assert!(matches!(
        filter.on_service_response(&host, pending, None),
        Verdict::Denied
    ));
    assert_eq!(released(&host), [slot]);
    filter.flush_counters(&host);
    let unused = crate::output::metrics::slots_released_counter("streams", SlotEnd::Unused);
    assert_eq!(host.counter(&unused), 1);
}

/// Issue 31, finding 1: the request ended (a reset) while its check was under way.
#[test]
fn a_request_that_ends_while_its_check_is_under_way_gives_back_its_slot() {
    let (filter, host) = setup(global_streams(None));
    let Verdict::Waiting(pending) = send(&filter, &host, ALICE) else {
        panic!("asks the service")
    };
    let (slot, _) = slot_and_reply(&host, &[true]);
    filter.abandon(&host, pending);
    assert_eq!(released(&host), [slot]);
}

/// Issue 31, finding 2: the service granted the slot, another global policy refused. The slot
/// is released, and not kept as a grant either: the next request of the key within a second
/// asks the service for a slot of its own (the review saw one admitted meanwhile, the only slot
/// still held at the service).
#[test]
fn a_request_another_policy_refuses_gives_back_the_slot_it_was_granted() {
    let mut config = global_streams(Some(json!({"name": "tight", "scope": "global",
        "key": ["header:x-user-id"], "requests": 1, "per": "1h"})));
    config["policies"][0]["key"] = json!(["header:x-tenant"]);
    let (filter, host) = setup(config);
    let alice = [("x-tenant", "acme"), ("x-user-id", "alice")];
    let Verdict::Waiting(pending) = send(&filter, &host, &alice) else {
        panic!("asks the service")
    };
    let (slot, reply) = slot_and_reply(&host, &[true, false]);
    assert!(matches!(
        filter.on_service_response(&host, pending, Some(reply)),
        Verdict::Denied
    ));
    assert_eq!(host.reply.borrow().as_ref().unwrap().status, 429);
    assert_eq!(released(&host), [slot]);
    let bob = [("x-tenant", "acme"), ("x-user-id", "bob")];
    assert!(matches!(send(&filter, &host, &bob), Verdict::Waiting(_)));
    let asked: CheckRequest = serde_json::from_slice(&host.call.borrow().clone().unwrap()).unwrap();
    assert_eq!(
        asked.checks.len(),
        2,
        "a slot of bob's own: {:?}",
        asked.checks
    );
}

/// An admitted request keeps its slot (renewed, released when it ends); one the service
/// refused has none to give back.
#[test]
fn an_admitted_request_keeps_its_slot_and_a_refused_check_took_none() {
    let (filter, host) = setup(global_streams(None));
    for allowed in [true, false] {
        let Verdict::Waiting(pending) = send(&filter, &host, ALICE) else {
            panic!("asks the service")
        };
        let (_, reply) = slot_and_reply(&host, &[allowed]);
        filter.on_service_response(&host, pending, Some(reply));
    }
    assert!(released(&host).is_empty(), "{:?}", host.reports.borrow());
}

#[test]
fn only_a_request_that_a_policy_metering_response_bodies_admitted_narrows_accept_encoding() {
    let body = json!({"name": "llm", "key": ["header:x-api-key"], "requests": 1000, "per": "1m",
        "cost": {"from_response": {"usage": "total_tokens"}}});
    let header = json!({"name": "by-header", "key": ["header:x-user-id"], "requests": 1000,
        "per": "1m", "cost": {"from_response": {"header": "x-usage"}}});
    let rps = json!({"name": "rps", "key": ["header:x-user-id"], "requests": 10, "per": "1s"});
    let (filter, host) = setup(json!({"policies": [body, header.clone(), rps.clone()]}));
    assert!(filter.meters_bodies());
    let meters = |headers: &[(&str, &str)]| match send(&filter, &host, headers) {
        Verdict::Continue(admitted) => filter.meters_body(admitted.tab.as_ref()),
        other => panic!("{other:?}"),
    };
    assert!(meters(&[("x-api-key", "k"), ("x-user-id", "alice")]));
    assert!(!meters(&[("x-user-id", "alice")]), "llm does not apply");
    let (filter, _) = setup(json!({"policies": [header, rps]}));
    assert!(!filter.meters_bodies(), "a usage header needs no decoding");
}

/// A global budget's reservation the service took for a request another policy refused is
/// refunded at once: kept as a grant it would never be spent, as no grant pays a budget.
#[test]
fn a_request_another_policy_refuses_gives_back_the_reservation_it_was_granted() {
    let budget = json!({"name": "llm", "scope": "global", "key": ["header:x-user-id"],
        "requests": 1000, "per": "1m", "failure_mode": "closed",
        "cost": {"from_response": {"usage": "total_tokens"}, "reserve": 300}});
    let tight = json!({"name": "tight", "scope": "global", "key": ["header:x-user-id"],
        "requests": 1, "per": "1h", "failure_mode": "closed"});
    let config = json!({"global": {"cluster": "ratelimit", "authority": "ratelimit"},
        "policies": [budget, tight]});
    let (filter, host) = setup(config);
    let Verdict::Waiting(pending) = send(&filter, &host, ALICE) else {
        panic!("asks the service")
    };
    let results = [true, false].map(|allowed| crate::wire::protocol::CheckResult {
        allowed,
        granted: if allowed { 300 } else { 0 },
        remaining: 0,
        reset_ms: 1_000,
        retry_after_ms: if allowed { 0 } else { 1_000 },
        delay_ms: None,
    });
    let body = serde_json::to_vec(&CheckResponse {
        results: results.to_vec(),
    })
    .unwrap();
    let verdict = filter.on_service_response(&host, pending, Some((200, body)));
    assert!(matches!(verdict, Verdict::Denied));
    let reports = host.reports.borrow();
    let refunds: Vec<u64> = (reports.iter())
        .filter_map(|s| match s.op {
            SettleOp::Refund { tokens, .. } => Some(tokens),
            _ => None,
        })
        .collect();
    assert_eq!(refunds, [300]);
}

// --- The status path: a client's own quota.

const STATUS: &str = "/api/ratelimit/status";

fn with_status(mut config: Value) -> Value {
    config["status_path"] = json!(STATUS);
    config
}

/// Sends a request with `method` and `path`; the reply's status and parsed JSON body, or
/// `None` when the filter let the request through.
fn ask(
    filter: &Filter,
    host: &FakeHost,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Option<(u32, Value)> {
    let mut all = vec![(":method", method), (":path", path)];
    all.extend_from_slice(headers);
    host.reply.borrow_mut().take();
    match send(filter, host, &all) {
        Verdict::Denied => {
            let reply = host.reply.borrow().clone().unwrap();
            Some((reply.status, serde_json::from_str(&reply.body).unwrap()))
        }
        _ => None,
    }
}

fn status_of(filter: &Filter, host: &FakeHost, headers: &[(&str, &str)]) -> Value {
    let (code, body) = ask(filter, host, "GET", STATUS, headers).expect("answered");
    assert_eq!(code, 200);
    body
}

#[test]
fn the_status_path_shows_a_client_its_own_quota_as_its_requests_headers_do_and_charges_nothing() {
    let config = with_status(json!({"policies": [
        per_user(5),
        {"name": "per-ip", "key": ["ip"], "requests": 100, "per": "1h"},
    ]}));
    let (filter, host) = setup(config);
    for _ in 0..2 {
        send(
            &filter,
            &host,
            &[(":path", "/api/x"), ("x-user-id", "alice")],
        );
    }
    let Verdict::Continue(Admitted {
        reported: Some(reported),
        ..
    }) = send(
        &filter,
        &host,
        &[(":path", "/api/x"), ("x-user-id", "alice")],
    )
    else {
        panic!("allowed")
    };
    let headers = response_headers(&filter, &reported);
    let (touched, calls) = (host.store_calls.get(), host.calls.get());
    let alice = status_of(&filter, &host, ALICE);
    assert_eq!(
        host.store_calls.get(),
        touched + 2,
        "a read per table, no write"
    );
    assert_eq!(host.calls.get(), calls);
    let per_user_line = &alice["policies"][0];
    assert_eq!(per_user_line["policy"], "per-user");
    assert_eq!(
        headers[0],
        ("x-ratelimit-limit", per_user_line["limit"].to_string())
    );
    assert_eq!(
        headers[1],
        (
            "x-ratelimit-remaining",
            per_user_line["remaining"].to_string()
        )
    );
    assert_eq!(
        (
            &per_user_line["unit"],
            &per_user_line["window"],
            &per_user_line["source"]
        ),
        (&json!("requests"), &json!(1), &json!("local"))
    );
    assert_eq!(
        alice["policies"][1]["remaining"], 97,
        "per-ip: three requests"
    );
    assert_eq!(status_of(&filter, &host, ALICE), alice, "nothing charged");
    let bob = status_of(&filter, &host, &[("x-user-id", "bob")]);
    assert_eq!(bob["policies"][0]["remaining"], 5, "bob's own key");
    let anonymous = status_of(&filter, &host, &[]);
    assert_eq!(
        anonymous["policies"].as_array().map(Vec::len),
        Some(1),
        "per-user needs its key: only per-ip applies"
    );
    let reply = host.reply.borrow().clone().unwrap();
    assert_eq!(
        (
            reply.header("content-type"),
            reply.header("cache-control"),
            reply.details
        ),
        (Some("application/json"), Some("no-store"), "sluice_status")
    );
}

#[test]
fn other_methods_get_a_405_and_other_paths_are_ordinary_requests() {
    let (filter, host) = setup(with_status(json!({"policies": [per_user(4)]})));
    let before = host.store_calls.get();
    let (code, body) = ask(&filter, &host, "POST", STATUS, ALICE).unwrap();
    assert_eq!((code, &body["error"]), (405, &json!("method_not_allowed")));
    assert_eq!(
        host.reply.borrow().as_ref().unwrap().header("allow"),
        Some("GET, HEAD")
    );
    assert_eq!(host.store_calls.get(), before, "a 405 reads nothing");
    assert_eq!(
        ask(&filter, &host, "HEAD", STATUS, ALICE).map(|r| r.0),
        Some(200)
    );
    for path in [
        "/api/ratelimit/status?key=bob",
        "/api/ratelimit/status/",
        "/API/ratelimit/status",
    ] {
        assert_eq!(
            ask(&filter, &host, "GET", path, ALICE),
            None,
            "{path}: forwarded"
        );
    }
    let left = status_of(&filter, &host, ALICE)["policies"][0]["remaining"].clone();
    assert_eq!(left, 1, "the three above were charged");
    let (off, host) = setup(json!({"policies": [per_user(2)]}));
    assert_eq!(
        ask(&off, &host, "GET", STATUS, ALICE),
        None,
        "off unless configured"
    );
}

#[test]
fn a_global_policy_is_told_from_what_this_envoy_heard_without_calling_the_service() {
    let mut config = with_status(global(global_per_user(10)));
    config["policies"][0]["lease"] = json!(4);
    let (filter, host) = setup(config);
    let line = |host: &FakeHost| status_of(&filter, host, ALICE)["policies"][0].clone();
    let unheard = line(&host);
    assert_eq!(
        (&unheard["remaining"], &unheard["source"], &unheard["limit"]),
        (&Value::Null, &json!("unknown"), &json!(10))
    );
    let service = FakeService::default();
    assert_eq!(serve(&filter, &host, Some(&service), ALICE), 200);
    let calls = host.calls.get();
    let heard = line(&host);
    assert_eq!(host.calls.get(), calls, "the status asked nothing");
    assert_eq!(
        (&heard["remaining"], &heard["source"]),
        (&json!(9), &json!("local_estimate")),
        "the service's 6 left and the 3 granted tokens here"
    );
}

/// A configuration that pulls the service's overrides, with these policies.
fn pulling(policies: Value) -> Value {
    json!({"global": {"cluster": "sluice", "overrides": {}}, "policies": policies})
}

/// The service's listing of overrides of `(policy, key value, requests, burst, expires)`, each
/// per second.
fn listing(overrides: &[(&str, &str, u64, u64, Option<u64>)]) -> Vec<u8> {
    use crate::core::key::{hash_values, HashSecret};
    use crate::wire::overrides::{version_of, Listed, Listing};
    let overrides: Vec<Listed> = overrides
        .iter()
        .map(|&(policy, key, requests, burst, expires_at_ms)| Listed {
            key: format!(
                "{policy}/{:016x}",
                hash_values(&[key.to_string()], &HashSecret::PUBLIC)
            ),
            algorithm: crate::core::algorithm::Kind::TokenBucket,
            requests,
            per_ms: 1000,
            burst,
            max_delay_ms: None,
            expires_at_ms,
        })
        .collect();
    let version = version_of(&overrides);
    serde_json::to_vec(&Listing { version, overrides }).unwrap()
}

/// This worker pulls (it is due) and the service answers `answer`; the worker's copy of the
/// index is read again at the next tick.
fn pull(filter: &Filter, host: &FakeHost, answer: Answer) {
    let call = filter.overrides_tick(host, host).expect("a pull due");
    assert_eq!(call.path, "/v1/overrides");
    filter.overrides_answered(host, answer);
    filter.overrides_tick(host, host);
}

#[test]
fn an_override_pulled_raises_one_keys_local_limit_and_the_others_keep_the_policys() {
    let (filter, host) = setup(pulling(json!([per_user(2)])));
    pull(
        &filter,
        &host,
        Answer::Listing(listing(&[("per-user", "alice", 1, 5, None)])),
    );
    assert_eq!(
        statuses(&filter, &host, 7, ALICE),
        [200, 200, 200, 200, 200, 429, 429]
    );
    let bob = &[("x-user-id", "bob")];
    assert_eq!(statuses(&filter, &host, 3, bob), [200, 200, 429]);
    filter.flush_counters(&host);
    assert_eq!(host.gauge("sluice.overrides_held"), 1);
    assert_eq!(host.gauge("sluice.overrides_age_seconds"), 0);
}

#[test]
fn an_override_keeps_the_usage_so_far_and_expires_on_time_without_a_pull() {
    let (filter, host) = setup(pulling(json!([per_user(2)])));
    assert_eq!(statuses(&filter, &host, 3, ALICE), [200, 200, 429]);
    let until_ms = (T0 + 10 * SEC) / 1_000_000;
    pull(
        &filter,
        &host,
        Answer::Listing(listing(&[("per-user", "alice", 1, 5, Some(until_ms))])),
    );
    assert_eq!(
        statuses(&filter, &host, 4, ALICE),
        [200, 200, 200, 429],
        "two of five used already"
    );
    host.now.set(T0 + 10 * SEC);
    // Ten seconds refilled the policy's bucket of two: no more.
    assert_eq!(statuses(&filter, &host, 3, ALICE), [200, 200, 429]);
}

#[test]
fn the_overrides_held_stay_in_force_while_the_service_cannot_answer_and_their_age_grows() {
    let (filter, host) = setup(pulling(json!([per_user(2)])));
    pull(
        &filter,
        &host,
        Answer::Listing(listing(&[("per-user", "alice", 1, 5, None)])),
    );
    for second in [2, 4, 6] {
        host.now.set(T0 + second * SEC);
        pull(&filter, &host, Answer::Failed(None));
    }
    filter.flush_counters(&host);
    assert_eq!(host.counter("sluice.overrides_pull_failures"), 3);
    assert_eq!(host.gauge("sluice.overrides_age_seconds"), 6);
    assert_eq!(host.gauge("sluice.overrides_held"), 1);
    assert_eq!(
        statuses(&filter, &host, 6, ALICE),
        [200, 200, 200, 200, 200, 429]
    );
    // The service is back: nothing changed, and the age is 0 again.
    host.now.set(T0 + 8 * SEC);
    pull(&filter, &host, Answer::Unchanged);
    filter.flush_counters(&host);
    assert_eq!(host.gauge("sluice.overrides_age_seconds"), 0);
}

#[test]
fn a_policy_without_overrides_reads_no_more_shared_data_and_one_with_reads_one_page_more() {
    let policies =
        json!([per_user(100), {"name": "per-ip", "key": ["ip"], "requests": 100, "per": "1s"}]);
    let reads = |config: Value, listed: &[(&str, &str, u64, u64, Option<u64>)]| {
        let (filter, host) = setup(config);
        if !listed.is_empty() {
            pull(&filter, &host, Answer::Listing(listing(listed)));
        }
        let before = host.store_calls.get();
        statuses(&filter, &host, 10, &[("x-user-id", "bob")]);
        host.store_calls.get() - before
    };
    let without = reads(json!({"policies": policies}), &[]);
    assert_eq!(
        reads(pulling(policies.clone()), &[]),
        without,
        "pulled, none held"
    );
    let per_ip = reads(
        pulling(policies.clone()),
        &[("per-ip", "10.9.9.9", 1, 1, None)],
    );
    let per_user_held = reads(
        pulling(policies.clone()),
        &[("per-user", "alice", 1, 1, None)],
    );
    assert_eq!(
        per_ip,
        without + 10,
        "per-ip has overrides: a page read per request"
    );
    assert_eq!(per_user_held, without + 10);
}

#[test]
fn a_listing_past_the_bound_leaves_the_overrides_held() {
    let config = json!({"global": {"cluster": "sluice", "overrides": {"max": 1}},
        "policies": [per_user(2)]});
    let (filter, host) = setup(config);
    pull(
        &filter,
        &host,
        Answer::Listing(listing(&[("per-user", "alice", 1, 5, None)])),
    );
    host.now.set(T0 + 2 * SEC);
    let two = listing(&[
        ("per-user", "alice", 1, 9, None),
        ("per-user", "bob", 1, 9, None),
    ]);
    pull(&filter, &host, Answer::Listing(two));
    filter.flush_counters(&host);
    assert_eq!(host.counter("sluice.overrides_pull_failures"), 1);
    assert_eq!(
        statuses(&filter, &host, 6, ALICE)[4..],
        [200, 429],
        "five, as before"
    );
}

#[test]
fn the_status_path_shows_a_keys_override_as_its_requests_meet_it() {
    let (filter, host) = setup(with_status(pulling(json!([per_user(2)]))));
    pull(
        &filter,
        &host,
        Answer::Listing(listing(&[("per-user", "alice", 1, 5, None)])),
    );
    let limit = |headers| status_of(&filter, &host, headers)["policies"][0]["limit"].clone();
    assert_eq!(limit(ALICE), json!(5));
    assert_eq!(limit(&[("x-user-id", "bob")]), json!(2));
}

// --- The admin path: a local key seen, reset and credited on the listener named for it.

const ADMIN_TOKEN: &str = "0123456789abcdef0123456789abcdef";
const READ_TOKEN: &str = "fedcba9876543210fedcba9876543210";

fn with_admin(mut config: Value) -> Value {
    config["admin"] =
        json!({"listener": "ops", "token_env": "ADMIN_T", "read_token_env": "READ_T"});
    config
}

fn admin_host() -> FakeHost {
    FakeHost::new(Arc::default(), T0)
        .with_env("ADMIN_T", &format!("alice {ADMIN_TOKEN}"))
        .with_env("READ_T", READ_TOKEN)
}

/// Calls the admin path on a listener named `listener` (none: a listener without the
/// metadata); the reply, or `None` when the request went on as an ordinary one.
fn admin_call(
    filter: &Filter,
    host: &FakeHost,
    (listener, token): (Option<&str>, Option<&str>),
    (method, path): (&str, &str),
    body: Value,
) -> Option<(u32, Value)> {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![(":method", method), (":path", path), ("x-user-id", "eve")];
    if let Some(bearer) = &bearer {
        headers.push(("authorization", bearer));
    }
    let mut request = FakeRequest::new(&headers).with_property("source.address", "10.0.0.1:5555");
    if let Some(listener) = listener {
        request = request.with_property(
            "xds.listener_metadata.filter_metadata.sluice.listener",
            listener,
        );
    }
    *host.request.borrow_mut() = request;
    host.reply.borrow_mut().take();
    let verdict = match filter.route(host) {
        Route::Admin => filter.answer_admin(host, body.to_string().as_bytes()),
        route => filter.on_routed_headers(host, route),
    };
    match verdict {
        Verdict::Denied => {
            let reply = host.reply.borrow().clone()?;
            let value = serde_json::from_str(&reply.body).unwrap_or(Value::Null);
            Some((reply.status, value))
        }
        _ => None,
    }
}

const SHOW: &str = "/sluice/admin/v1/keys/show";
const RESET: &str = "/sluice/admin/v1/keys/reset";
const CREDIT: &str = "/sluice/admin/v1/keys/credit";

#[test]
fn the_admin_path_shows_resets_and_credits_a_local_key_once_on_its_listener_only() {
    let host = admin_host();
    let filter = configure(&with_admin(json!({"policies": [per_user(5)]})), &host);
    assert_eq!(
        statuses(&filter, &host, 6, ALICE),
        [200, 200, 200, 200, 200, 429]
    );
    let ops = (Some("ops"), Some(ADMIN_TOKEN));
    let alice = json!({"policy": "per-user", "key": ["alice"]});
    let (code, shown) = admin_call(&filter, &host, ops, ("POST", SHOW), alice.clone()).unwrap();
    assert_eq!(code, 200, "{shown}");
    assert_eq!(
        (shown["remaining"].clone(), shown["capacity"].clone()),
        (json!(0), json!(5))
    );
    assert_eq!(
        (shown["source"].clone(), shown["algorithm"].clone()),
        (json!("policy"), json!("token_bucket"))
    );
    let reset = json!({"policy": "per-user", "key": ["alice"], "reason": "INC-42", "id": "00000000000000aa"});
    let (code, written) = admin_call(&filter, &host, ops, ("POST", RESET), reset.clone()).unwrap();
    assert_eq!((code, written["outcome"].clone()), (200, json!("done")));
    assert_eq!(statuses(&filter, &host, 1, ALICE), [200]);
    let (_, again) = admin_call(&filter, &host, ops, ("POST", RESET), reset).unwrap();
    assert_eq!(again["outcome"], "duplicate", "applied once");
    assert_eq!(
        statuses(&filter, &host, 5, ALICE),
        [200, 200, 200, 200, 429]
    );
    let credit = json!({"policy": "per-user", "key": ["alice"], "reason": "goodwill", "tokens": 2, "id": "00000000000000bb"});
    let (_, credited) = admin_call(&filter, &host, ops, ("POST", CREDIT), credit.clone()).unwrap();
    assert_eq!(
        (credited["outcome"].clone(), credited["credited"].clone()),
        (json!("done"), json!(2))
    );
    let (_, twice) = admin_call(&filter, &host, ops, ("POST", CREDIT), credit).unwrap();
    assert_eq!(twice["outcome"], "duplicate");
    assert_eq!(statuses(&filter, &host, 3, ALICE), [200, 200, 429]);
    filter.flush_counters(&host);
    assert_eq!(host.counter("sluice.admin_writes"), 4);
    // Another listener, or none named: the path is an ordinary request, decided and forwarded.
    for listener in [None, Some("public"), Some("ops2")] {
        let call = admin_call(
            &filter,
            &host,
            (listener, Some(ADMIN_TOKEN)),
            ("POST", RESET),
            json!({}),
        );
        assert_eq!(call, None, "{listener:?}");
    }
}

#[test]
fn without_a_token_every_admin_call_is_401_and_a_read_token_cannot_write() {
    let host = admin_host();
    let filter = configure(&with_admin(json!({"policies": [per_user(5)]})), &host);
    let alice = json!({"policy": "per-user", "key": ["alice"]});
    for token in [
        None,
        Some("wrong"),
        Some(&ADMIN_TOKEN[1..]),
        Some("0123456789abcdef0123456789abcdeF"),
    ] {
        for path in [SHOW, RESET, "/sluice/admin/v1/nothing", "/sluice/admin/v1"] {
            let (code, body) = admin_call(
                &filter,
                &host,
                (Some("ops"), token),
                ("POST", path),
                alice.clone(),
            )
            .unwrap();
            assert_eq!(
                (code, body["error"].clone()),
                (401, json!("unauthorized")),
                "{token:?} {path}"
            );
        }
    }
    let read = (Some("ops"), Some(READ_TOKEN));
    assert_eq!(
        admin_call(&filter, &host, read, ("POST", SHOW), alice.clone())
            .unwrap()
            .0,
        200
    );
    let reset = json!({"policy": "per-user", "key": ["alice"], "reason": "r"});
    assert_eq!(
        admin_call(&filter, &host, read, ("POST", RESET), reset.clone())
            .unwrap()
            .0,
        403
    );
    assert_eq!(
        admin_call(&filter, &host, read, ("GET", SHOW), alice.clone())
            .unwrap()
            .0,
        405
    );
    assert_eq!(
        admin_call(
            &filter,
            &host,
            read,
            ("POST", "/sluice/admin/v1/keys"),
            alice
        )
        .unwrap()
        .0,
        404
    );
    let bad = json!({"policy": "per-user", "key": ["alice"], "reason": "r", "tokens": 99, "id": "0000000000000001"});
    let (code, body) = admin_call(
        &filter,
        &host,
        (Some("ops"), Some(ADMIN_TOKEN)),
        ("POST", CREDIT),
        bad,
    )
    .unwrap();
    assert_eq!(code, 400);
    assert!(
        body["detail"].as_str().unwrap().starts_with("tokens:"),
        "{body}"
    );
    filter.flush_counters(&host);
    assert_eq!(host.counter("sluice.admin_unauthorized"), 17);
}

#[test]
fn a_request_off_the_admin_path_reads_no_listener_and_no_more_than_without_it() {
    let reads = |config: Value| {
        let host = admin_host();
        let filter = configure(&config, &host);
        send(
            &filter,
            &host,
            &[(":path", "/api/x"), ("x-user-id", "alice")],
        );
        let reads = host.request.borrow().reads.get();
        reads
    };
    let plain = json!({"status_path": "/api/ratelimit/status", "policies": [per_user(5)]});
    assert_eq!(
        reads(with_admin(plain.clone())),
        reads(plain),
        "the one :path read serves both"
    );
    let without = json!({"policies": [per_user(5)]});
    assert_eq!(
        reads(with_admin(without.clone())),
        reads(without) + 1,
        ":path, and no property"
    );
    // A policy that matches the path takes the :path routing read: nothing more at all.
    let matching = json!({"policies": [{"name": "api", "match": {"path_prefix": "/api/"},
        "key": ["header:x-user-id"], "requests": 5, "per": "1s"}]});
    assert_eq!(reads(with_admin(matching.clone())), reads(matching.clone()));
    let mut both = with_admin(matching.clone());
    both["status_path"] = json!("/api/ratelimit/status");
    assert_eq!(reads(both), reads(matching));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Whatever body a caller with the admin token sends, the answer is a 200 or a 400 that
    /// names a field, and nothing else changes: no panic, no write but a reset or credit of a
    /// key it names.
    #[test]
    fn any_admin_body_gets_a_200_or_a_400_naming_its_field(
        body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
        fields in proptest::collection::vec(("[a-z_]{1,10}", "[ -~]{0,20}"), 0..6),
        endpoint in 0usize..3,
    ) {
        let host = admin_host();
        let filter = configure(&with_admin(json!({"policies": [per_user(5)]})), &host);
        let path = [SHOW, RESET, CREDIT][endpoint];
        let mut object = serde_json::Map::new();
        for (name, value) in fields {
            let value = serde_json::from_str(&value).unwrap_or(Value::String(value));
            object.insert(name, value);
        }
        for body in [body, Value::Object(object).to_string().into_bytes()] {
            *host.request.borrow_mut() = FakeRequest::new(&[
                (":method", "POST"),
                (":path", path),
                ("authorization", &format!("Bearer {ADMIN_TOKEN}")),
            ])
            .with_property("xds.listener_metadata.filter_metadata.sluice.listener", "ops");
            proptest::prop_assert_eq!(filter.route(&host), Route::Admin);
            let Verdict::Denied = filter.answer_admin(&host, &body) else {
                panic!("answered");
            };
            let reply = host.reply.borrow().clone().unwrap();
            let answer: Value = serde_json::from_str(&reply.body).unwrap();
            match reply.status {
                200 => {}
                400 => proptest::prop_assert!(answer["detail"].as_str().is_some_and(|d| d.contains(':')), "{answer}"),
                other => proptest::prop_assert!(false, "{other}: {answer}"),
            }
        }
    }
}

#[test]
fn the_admin_path_says_a_key_runs_at_its_override() {
    let host = admin_host();
    let filter = configure(&with_admin(pulling(json!([per_user(2)]))), &host);
    pull(
        &filter,
        &host,
        Answer::Listing(listing(&[("per-user", "alice", 1, 5, None)])),
    );
    let ops = (Some("ops"), Some(READ_TOKEN));
    let show = |who: &str| {
        let body = json!({"policy": "per-user", "key": [who]});
        admin_call(&filter, &host, ops, ("POST", SHOW), body)
            .unwrap()
            .1
    };
    let alice = show("alice");
    assert_eq!(
        (alice["source"].clone(), alice["capacity"].clone()),
        (json!("override"), json!(5))
    );
    let bob = show("bob");
    assert_eq!(
        (bob["source"].clone(), bob["capacity"].clone()),
        (json!("policy"), json!(2))
    );
}

// --- The admin path's top keys: every worker's board merged, keys by their hash only.

const TOP: &str = "/sluice/admin/v1/top";

#[test]
fn the_admin_path_merges_every_workers_top_keys_and_shows_only_key_hashes() {
    let per_key =
        json!({"name": "per-key", "key": ["header:x-api-key"], "requests": 1, "per": "1m"});
    let config = with_admin(json!({"policies": [per_key]}));
    let one = admin_host();
    let two = FakeHost::new(Arc::clone(&one.store), T0)
        .with_env("ADMIN_T", &format!("alice {ADMIN_TOKEN}"))
        .with_env("READ_T", READ_TOKEN);
    let (a, b) = (configure(&config, &one), configure(&config, &two));
    let heavy = [("sk-heavy-1", 60), ("sk-heavy-2", 40), ("sk-heavy-3", 20)];
    for (i, (filter, host)) in [(&a, &one), (&b, &two)].into_iter().enumerate() {
        for light in 0..300 {
            let key = format!("sk-light-{i}-{light}");
            statuses(filter, host, 2, &[("x-api-key", &key)]);
        }
        for (key, times) in heavy {
            statuses(filter, host, times / 2, &[("x-api-key", key)]);
        }
        filter.publish_top(host);
    }
    let read = (Some("ops"), Some(READ_TOKEN));
    let asked = json!({"policy": "per-key", "limit": 3});
    let (code, top) = admin_call(&a, &one, read, ("POST", TOP), asked.clone()).unwrap();
    assert_eq!(code, 200, "{top}");
    assert_eq!(top["workers"], 2);
    assert_eq!(top["namespace"], "local");
    assert_eq!(top["totals"]["refused"], 600 + 120 - 3);
    let hash = |key: &str| {
        let hash = crate::core::key::hash_values(&[key.into()], &HashSecret::PUBLIC);
        format!("{hash:016x}")
    };
    let keys: Vec<&str> = (top["keys"].as_array().unwrap().iter())
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    let expected: Vec<String> = heavy.iter().map(|(k, _)| hash(k)).collect();
    assert_eq!(keys, expected, "{top}");
    for (key, (_, times)) in top["keys"].as_array().unwrap().iter().zip(heavy) {
        let (count, error) = (
            key["count"].as_u64().unwrap(),
            key["error"].as_u64().unwrap(),
        );
        let refused = times as u64 - 1;
        assert!(count >= refused && count - error <= refused, "{key}");
    }
    assert!(!top.to_string().contains("sk-"), "{top}");
    let consumed = json!({"policy": "per-key", "by": "consumed", "window": "1h"});
    let (_, consumed) = admin_call(&a, &one, read, ("POST", TOP), consumed).unwrap();
    assert_eq!(consumed["totals"]["consumed"], 600 + 3, "{consumed}");
    let unknown = json!({"policy": "nope"});
    let (code, error) = admin_call(&a, &one, read, ("POST", TOP), unknown).unwrap();
    assert_eq!(code, 400);
    assert!(error["detail"].as_str().unwrap().starts_with("policy: "));
    // On a listener not named, the path is an ordinary request; without a token, 401.
    assert!(admin_call(
        &a,
        &one,
        (None, Some(READ_TOKEN)),
        ("POST", TOP),
        asked.clone()
    )
    .is_none());
    let (code, _) = admin_call(&a, &one, (Some("ops"), None), ("POST", TOP), asked).unwrap();
    assert_eq!(code, 401);
}

#[test]
fn top_keys_show_the_parts_top_show_names_and_never_an_api_key() {
    let policy = json!({"name": "pair", "key": ["header:x-user-id", "header:x-api-key"],
                        "requests": 1, "per": "1m"});
    let mut config = with_admin(json!({"policies": [policy]}));
    config["admin"]["top_show"] = json!(["header:x-user-id"]);
    let host = admin_host();
    let filter = configure(&config, &host);
    statuses(
        &filter,
        &host,
        3,
        &[("x-user-id", "alice"), ("x-api-key", "sk-secret")],
    );
    filter.publish_top(&host);
    let asked = json!({"policy": "pair"});
    let read = (Some("ops"), Some(READ_TOKEN));
    let (code, top) = admin_call(&filter, &host, read, ("POST", TOP), asked).unwrap();
    assert_eq!(code, 200, "{top}");
    assert_eq!(top["keys"][0]["count"], 2);
    assert_eq!(
        top["keys"][0]["shown"], "header:x-user-id=alice header:x-api-key=#",
        "{top}"
    );
    assert!(!top.to_string().contains("sk-secret"), "{top}");
    for secret in ["header:x-api-key", "header:authorization", "header:cookie"] {
        let mut config = config.clone();
        config["admin"]["top_show"] = json!(["header:x-user-id", secret]);
        let error = Filter::configure(config.to_string().as_bytes(), "t", &host, &host, &host);
        let error = error.unwrap_err().to_string();
        assert!(error.starts_with("admin.top_show[1]: "), "{error}");
    }
}
