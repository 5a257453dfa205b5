//! POST /v1/settle and global concurrency through the real binary, on a real redis-server
//! running the Lua scripts and, where it costs little, on `--memory` too: what a response's
//! usage charges past the limit and what the wait after it is, refunds while the window that
//! counted them lasts, a charge or refund sent again with its id applied once, slots released,
//! renewed and lost, N+1 concurrent requests for N slots, and the same token and strict
//! validation as /v1/check.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::clock::window_with_left;
use common::{bucket, window, Refusal};
use serde_json::{json, Value};
use sluice_testkit::http::{get, post_json, send_raw, Response};
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::Service;
use sluice_testkit::TempDir;

/// Runs a test body against a service on a real Redis and one on `--memory`.
fn on_each_store(body: impl Fn(&Service)) {
    let redis = RedisServer::start();
    body(&Service::start(&redis.url()));
    body(&Service::start_memory());
}

fn post_settle(addr: SocketAddr, settlements: &[Value]) -> Response {
    let body = json!({ "settlements": settlements }).to_string();
    post_json(addr, "/v1/settle", &body)
}

/// POST /v1/settle, which must succeed: how many settlements changed something.
fn settle(service: &Service, settlements: &[Value]) -> u64 {
    let response = post_settle(service.addr, settlements);
    assert_eq!(response.status, 200, "{response:?}");
    response.json()["settled"].as_u64().unwrap()
}

fn check_one(service: &Service, check: &Value) -> Value {
    service.check(std::slice::from_ref(check)).remove(0)
}

/// A settlement of `check`'s state (its key and numbers) with `op`'s fields.
fn settlement(check: &Value, op: Value) -> Value {
    let mut settlement = json!({
        "key": check["key"], "algorithm": check.get("algorithm").unwrap_or(&json!("token_bucket")),
        "requests": check["requests"], "per_ms": check["per_ms"], "burst": check["burst"],
    });
    for (field, value) in op.as_object().unwrap() {
        settlement[field] = value.clone();
    }
    settlement
}

/// A concurrency check as the filter sends it: N slots of `lease_ms`, one named `slot`.
fn slot(key: &str, n: u64, lease_ms: u64, slot: &str) -> Value {
    json!({"key": key, "algorithm": "concurrency", "requests": n, "per_ms": lease_ms,
        "burst": n, "cost": 1, "take": 1, "slot": slot})
}

fn slot_name(n: u64) -> String {
    format!("{n:016x}")
}

fn allowed(result: &Value) -> bool {
    result["allowed"].as_bool().unwrap()
}

fn now_us() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    u64::try_from(since.as_micros()).unwrap()
}

const MINUTE_MS: u64 = 60_000;

#[test]
fn a_charge_past_the_limit_owes_at_most_its_debt_and_the_next_request_waits_it_out() {
    on_each_store(|service| {
        // Ten tokens of a minute each, all taken by the reservation.
        let budget = bucket("llm/00000000000000c1", 10, 10 * MINUTE_MS, 10, 1, 10);
        let started = Instant::now();
        assert_eq!(check_one(service, &budget)["granted"], 10);
        let charge = |tokens: u64| {
            settlement(
                &budget,
                json!({"op": "charge", "tokens": tokens, "max_debt": 10}),
            )
        };
        assert_eq!(settle(service, &[charge(5)]), 1);
        let refused = check_one(service, &budget);
        let elapsed_ms = started.elapsed().as_millis() as u64;
        assert!(!allowed(&refused));
        // Five tokens owed and one needed: six minutes, less the time since the bucket emptied.
        let retry = refused["retry_after_ms"].as_u64().unwrap();
        assert!(
            (6 * MINUTE_MS - elapsed_ms - 1..=6 * MINUTE_MS).contains(&retry),
            "retry_after_ms {retry}"
        );
        // Past the debt nothing more is owed: at most ten tokens, whatever the usage.
        assert_eq!(settle(service, &[charge(1000)]), 1);
        let retry = check_one(service, &budget)["retry_after_ms"]
            .as_u64()
            .unwrap();
        let elapsed_ms = started.elapsed().as_millis() as u64;
        assert!(
            (11 * MINUTE_MS - elapsed_ms - 1..=11 * MINUTE_MS).contains(&retry),
            "retry_after_ms {retry}"
        );
        assert_eq!(settle(service, &[charge(1)]), 0, "the debt is full");
    });
}

#[test]
fn a_check_that_takes_nothing_admits_if_the_cost_fits_and_reserves_nothing() {
    on_each_store(|service| {
        let peek = bucket("llm/00000000000000c2", 10, 10 * MINUTE_MS, 10, 1, 0);
        for _ in 0..3 {
            let result = check_one(service, &peek);
            assert_eq!((allowed(&result), &result["granted"]), (true, &json!(0)));
            assert_eq!(result["remaining"], 10);
        }
        let charge = json!({"op": "charge", "tokens": 10, "max_debt": 0});
        assert_eq!(settle(service, &[settlement(&peek, charge)]), 1);
        assert!(!allowed(&check_one(service, &peek)));
    });
}

#[test]
fn a_refund_gives_a_bucket_back_what_was_not_used_and_a_full_bucket_stays_full() {
    on_each_store(|service| {
        let reserved = bucket("llm/00000000000000c3", 10, 10 * MINUTE_MS, 10, 1, 10);
        check_one(service, &reserved);
        let refund = json!({"op": "refund", "tokens": 4, "age_ms": 10});
        assert_eq!(settle(service, &[settlement(&reserved, refund.clone())]), 1);
        assert_eq!(check_one(service, &reserved)["granted"], 4);
        let full = bucket("llm/00000000000000c4", 10, 10 * MINUTE_MS, 10, 1, 1);
        assert_eq!(settle(service, &[settlement(&full, refund)]), 0);
        assert_eq!(
            check_one(service, &full)["remaining"],
            9,
            "still ten, less one"
        );
    });
}

#[test]
fn a_refund_counts_within_the_window_that_took_the_tokens_and_not_after_it_ends() {
    on_each_store(|service| {
        let length = window_with_left(now_us(), 2_000..4_000, 1_200..1_800);
        let reserved = window("fixed_window", "llm/00000000000000c5", 10, length, 1, 10);
        let started = Instant::now();
        assert_eq!(check_one(service, &reserved)["granted"], 10);
        let refund = |age_ms: u64| {
            let op = json!({"op": "refund", "tokens": 4, "age_ms": age_ms});
            settlement(&reserved, op)
        };
        assert_eq!(settle(service, &[refund(1)]), 1);
        assert_eq!(check_one(service, &reserved)["granted"], 4);
        // The next window: what the last one counted is gone, and cannot be given back.
        std::thread::sleep(Duration::from_millis(1_900) - started.elapsed());
        check_one(
            service,
            &window("fixed_window", "llm/00000000000000c5", 10, length, 1, 1),
        );
        let age_ms = started.elapsed().as_millis() as u64;
        assert_eq!(settle(service, &[refund(age_ms)]), 0);
        assert_eq!(check_one(service, &reserved)["granted"], 9);
    });
}

#[test]
fn a_sliding_window_refunds_the_previous_window_while_it_still_counts() {
    on_each_store(|service| {
        let length = window_with_left(now_us(), 2_000..4_000, 1_200..1_800);
        let key = "llm/00000000000000c6";
        let reserved = window("sliding_window", key, 10, length, 1, 10);
        let started = Instant::now();
        assert_eq!(check_one(service, &reserved)["granted"], 10);
        std::thread::sleep(Duration::from_millis(1_900) - started.elapsed());
        let age_ms = started.elapsed().as_millis() as u64;
        let refund = json!({"op": "refund", "tokens": 10, "age_ms": age_ms});
        assert_eq!(settle(service, &[settlement(&reserved, refund)]), 1);
        let after = check_one(service, &window("sliding_window", key, 10, length, 1, 10));
        assert_eq!(
            after["granted"], 10,
            "nothing of the last window counts now"
        );
    });
}

/// A peek (take 0) at 10 tokens of `algorithm` on `key`: a budget whose usage is settled.
fn budget_of(algorithm: &str, key: &str) -> Value {
    match algorithm {
        "token_bucket" => bucket(key, 10, 10 * MINUTE_MS, 10, 1, 0),
        // An hour: a window that ends within the test is one chance in tens of thousands.
        _ => window(algorithm, key, 10, 60 * MINUTE_MS, 1, 0),
    }
}

fn remaining(service: &Service, check: &Value) -> Value {
    check_one(service, check)["remaining"].clone()
}

const METERING: [&str; 3] = ["token_bucket", "fixed_window", "sliding_window"];

#[test]
fn a_batch_of_charges_sent_again_is_charged_once_and_distinct_ids_each_apply() {
    on_each_store(|service| {
        for (n, algorithm) in METERING.into_iter().enumerate() {
            let budget = budget_of(algorithm, &format!("llm/00000000000000e{n}"));
            let charge = |tokens: u64, id: &str| {
                let op = json!({"op": "charge", "tokens": tokens, "max_debt": 0, "id": id});
                settlement(&budget, op)
            };
            let batch = [charge(3, "00000000000000a1"), charge(2, "00000000000000a2")];
            assert_eq!(
                settle(service, &batch),
                2,
                "{algorithm}: two ids, both applied"
            );
            assert_eq!(remaining(service, &budget), 5, "{algorithm}");
            // Its answer lost, the filter sends the batch again: nothing more is charged.
            assert_eq!(settle(service, &batch), 0, "{algorithm}: charged already");
            assert_eq!(remaining(service, &budget), 5, "{algorithm}");
            let copy_and_new = [charge(2, "00000000000000a2"), charge(1, "00000000000000a3")];
            assert_eq!(settle(service, &copy_and_new), 1, "{algorithm}");
            assert_eq!(remaining(service, &budget), 4, "{algorithm}");
        }
        let metrics = get(service.addr, "/metrics").text();
        let duplicates = r#"sluice_service_settlements_total{op="charge",result="duplicate"} 9"#;
        assert!(metrics.contains(duplicates), "{metrics}");
    });
}

#[test]
fn a_refund_sent_again_gives_back_once() {
    on_each_store(|service| {
        for (n, algorithm) in METERING.into_iter().enumerate() {
            let key = format!("llm/00000000000000f{n}");
            let budget = budget_of(algorithm, &key);
            let reserve = json!({"op": "charge", "tokens": 8, "max_debt": 0});
            assert_eq!(settle(service, &[settlement(&budget, reserve)]), 1);
            let refund = settlement(
                &budget,
                json!({"op": "refund", "tokens": 3, "age_ms": 10, "id": "00000000000000b1"}),
            );
            assert_eq!(settle(service, std::slice::from_ref(&refund)), 1);
            assert_eq!(remaining(service, &budget), 5, "{algorithm}");
            assert_eq!(settle(service, &[refund.clone(), refund]), 0, "{algorithm}");
            assert_eq!(
                remaining(service, &budget),
                5,
                "{algorithm}: given back once"
            );
        }
        let metrics = get(service.addr, "/metrics").text();
        let duplicates = r#"sluice_service_settlements_total{op="refund",result="duplicate"} 6"#;
        assert!(metrics.contains(duplicates), "{metrics}");
    });
}

#[test]
fn a_settlement_without_an_id_from_an_older_filter_is_applied_each_time() {
    on_each_store(|service| {
        let budget = budget_of("token_bucket", "llm/00000000000000e9");
        let charge = settlement(&budget, json!({"op": "charge", "tokens": 3, "max_debt": 0}));
        assert_eq!(settle(service, std::slice::from_ref(&charge)), 1);
        assert_eq!(settle(service, &[charge]), 1);
        assert_eq!(remaining(service, &budget), 4);
    });
}

#[test]
fn a_released_slot_is_free_again_and_a_refusal_says_no_time_to_retry() {
    on_each_store(|service| {
        let key = "streams/00000000000000d1";
        let [a, b, c] = [1, 2, 3].map(slot_name);
        assert!(allowed(&check_one(service, &slot(key, 2, 10_000, &a))));
        let second = check_one(service, &slot(key, 2, 10_000, &b));
        assert_eq!((allowed(&second), &second["remaining"]), (true, &json!(0)));
        let refused = check_one(service, &slot(key, 2, 10_000, &c));
        assert!(!allowed(&refused));
        assert_eq!(
            refused["retry_after_ms"], 0,
            "nobody knows when a slot frees"
        );
        let release = settlement(
            &slot(key, 2, 10_000, &a),
            json!({"op": "release", "slot": a}),
        );
        assert_eq!(settle(service, std::slice::from_ref(&release)), 1);
        assert!(allowed(&check_one(service, &slot(key, 2, 10_000, &c))));
        assert_eq!(settle(service, &[release]), 0, "given back once");
        let metrics = get(service.addr, "/metrics").text();
        let applied = r#"sluice_service_settlements_total{op="release",result="applied"} 1"#;
        let unchanged = r#"sluice_service_settlements_total{op="release",result="unchanged"} 1"#;
        assert!(metrics.contains(applied), "{metrics}");
        assert!(metrics.contains(unchanged), "{metrics}");
    });
}

#[test]
fn a_change_of_the_limit_or_the_lease_keeps_the_slots_in_use() {
    on_each_store(|service| {
        let key = "streams/00000000000000d2";
        assert!(allowed(&check_one(
            service,
            &slot(key, 1, 10_000, &slot_name(1))
        )));
        let wider = check_one(service, &slot(key, 2, 60_000, &slot_name(2)));
        assert_eq!((allowed(&wider), &wider["remaining"]), (true, &json!(0)));
    });
}

#[test]
fn a_slot_whose_release_is_lost_frees_itself_after_its_lease() {
    on_each_store(|service| {
        let key = "streams/00000000000000d3";
        let taken = Instant::now();
        assert!(allowed(&check_one(
            service,
            &slot(key, 1, 4_000, &slot_name(1))
        )));
        let freed = (0..40).find_map(|_| {
            std::thread::sleep(Duration::from_millis(200));
            let result = check_one(service, &slot(key, 1, 4_000, &slot_name(2)));
            allowed(&result).then(|| taken.elapsed())
        });
        let freed = freed.expect("free within 8 s");
        assert!(
            freed >= Duration::from_millis(4_000),
            "free after {freed:?}, before its lease ended"
        );
    });
}

#[test]
fn a_renewed_slot_outlives_its_lease_until_it_is_released() {
    on_each_store(|service| {
        let key = "streams/00000000000000d4";
        let (mine, other) = (slot_name(1), slot_name(2));
        assert!(allowed(&check_one(service, &slot(key, 1, 4_000, &mine))));
        let renew = settlement(
            &slot(key, 1, 4_000, &mine),
            json!({"op": "renew", "slot": mine}),
        );
        for _ in 0..6 {
            std::thread::sleep(Duration::from_secs(1));
            assert_eq!(settle(service, std::slice::from_ref(&renew)), 1);
            assert!(!allowed(&check_one(service, &slot(key, 1, 4_000, &other))));
        }
        // Renewal then release in one batch: applied in order.
        let release = settlement(
            &slot(key, 1, 4_000, &mine),
            json!({"op": "release", "slot": mine}),
        );
        assert_eq!(settle(service, &[renew, release]), 2);
        assert!(allowed(&check_one(service, &slot(key, 1, 4_000, &other))));
    });
}

#[test]
fn a_renewal_of_an_expired_or_released_slot_never_takes_it_again() {
    on_each_store(|service| {
        let key = "streams/00000000000000d5";
        let (lost, other) = (slot_name(1), slot_name(2));
        assert!(allowed(&check_one(service, &slot(key, 1, 4_000, &lost))));
        std::thread::sleep(Duration::from_millis(4_100));
        let renew = settlement(
            &slot(key, 1, 4_000, &lost),
            json!({"op": "renew", "slot": lost}),
        );
        assert_eq!(settle(service, std::slice::from_ref(&renew)), 0, "expired");
        assert!(allowed(&check_one(service, &slot(key, 1, 4_000, &other))));
        let release = settlement(
            &slot(key, 1, 4_000, &other),
            json!({"op": "release", "slot": other}),
        );
        assert_eq!(settle(service, &[release]), 1);
        assert_eq!(settle(service, &[renew]), 0, "not taken again");
        assert!(allowed(&check_one(service, &slot(key, 1, 4_000, &other))));
    });
}

/// Issue 31: settle calls run side by side, so a renewal may come after its release, and a
/// check the filter gave up on (a reset, a timeout) may come after the release the filter sent
/// for it. Neither takes the slot.
#[test]
fn a_late_renewal_or_a_check_after_its_release_takes_no_slot() {
    on_each_store(|service| {
        let key = "streams/00000000000000da";
        let (mine, late, other) = (slot_name(1), slot_name(2), slot_name(3));
        let op = |name: &str, op: &str| {
            settlement(&slot(key, 1, 4_000, name), json!({"op": op, "slot": name}))
        };
        assert!(allowed(&check_one(service, &slot(key, 1, 4_000, &mine))));
        assert_eq!(
            settle(service, &[op(&mine, "release"), op(&mine, "renew")]),
            1
        );
        assert_eq!(settle(service, &[op(&late, "release")]), 0, "never taken");
        let refused = check_one(service, &slot(key, 1, 4_000, &late));
        assert!(!allowed(&refused), "the late check: {refused}");
        assert_eq!(refused["remaining"], 1, "the slot is free");
        assert!(allowed(&check_one(service, &slot(key, 1, 4_000, &other))));
    });
}

/// Issue 31: a charge whose debt would outlive --max-key-ttl was refused with its whole batch
/// (400), which the filter sent again until it gave up, releases and all.
#[test]
fn a_settlement_the_service_refuses_is_dropped_and_counted_and_the_rest_applied() {
    on_each_store(|service| {
        let key = "streams/00000000000000db";
        let mine = slot_name(1);
        assert!(allowed(&check_one(service, &slot(key, 1, 4_000, &mine))));
        let forever = settlement(
            &bucket("llm/00000000000000db", 1, 86_400_000, 30, 1, 0),
            json!({"op": "charge", "tokens": 1, "max_debt": 40, "id": slot_name(9)}),
        );
        let release = settlement(
            &slot(key, 1, 4_000, &mine),
            json!({"op": "release", "slot": mine}),
        );
        let response = post_settle(service.addr, &[forever.clone(), release]);
        assert_eq!(response.status, 200, "{response:?}");
        assert_eq!(response.json(), json!({"settled": 1, "rejected": 1}));
        assert!(allowed(&check_one(
            service,
            &slot(key, 1, 4_000, &slot_name(2))
        )));
        post_settle(service.addr, &[forever])
            .assert_bad_request("settlements[0].max_debt: its key would live 70d");
        let metrics = get(service.addr, "/metrics").text();
        let rejected = r#"sluice_service_settlements_total{op="charge",result="rejected"} 2"#;
        assert!(metrics.contains(rejected), "{metrics}");
    });
}

#[test]
fn n_plus_one_concurrent_requests_for_n_slots_of_one_key_get_exactly_n() {
    on_each_store(|service| {
        const N: u64 = 8;
        let addr = service.addr;
        let answers: Vec<bool> = std::thread::scope(|scope| {
            let asking: Vec<_> = (0..=N)
                .map(|i| {
                    scope.spawn(move || {
                        let check = slot("streams/00000000000000d6", N, 10_000, &slot_name(i));
                        let body = json!({ "checks": [check] }).to_string();
                        let response = post_json(addr, "/v1/check", &body);
                        assert_eq!(response.status, 200, "{response:?}");
                        response.json()["results"][0]["allowed"].as_bool().unwrap()
                    })
                })
                .collect();
            asking.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert_eq!(
            answers.iter().filter(|&&a| a).count() as u64,
            N,
            "{answers:?}"
        );
    });
}

#[test]
fn a_bad_settlement_is_refused_naming_its_field() {
    let service = Service::start_memory();
    let one = |op: Value| {
        let check = slot("streams/00000000000000d7", 2, 10_000, &slot_name(1));
        settlement(&check, op)
    };
    let release = one(json!({"op": "release", "slot": slot_name(1)}));
    let cases = [
        (vec![release.clone(); 257], "settlements: must hold 1 to 256 settlements, got 257"),
        (
            vec![one(json!({"op": "refund", "tokens": 1, "age_ms": 0}))],
            "settlements[0].op: refund is only for token_bucket, fixed_window and sliding_window, not concurrency",
        ),
        (
            vec![one(json!({"op": "renew", "slot": "7"})), one(json!({"op": "renew", "slot": "8"}))],
            "settlements[0].slot: must be 16 lowercase hex digits",
        ),
        (
            vec![settlement(
                &bucket("llm/00000000000000d7", 10, 60_000, 10, 1, 0),
                json!({"op": "charge", "tokens": 1, "max_debt": 0, "id": "e1"}),
            )],
            "settlements[0].id: must be 16 lowercase hex digits, got \"e1\"",
        ),
        (
            vec![settlement(
                &slot("streams/00000000000000d7", 2, 3_000, &slot_name(1)),
                json!({"op": "release", "slot": slot_name(1)}),
            )],
            "settlements[0].per_ms: 3000 is not in 4000..=",
        ),
    ];
    for (settlements, expected) in cases {
        post_settle(service.addr, &settlements).assert_bad_request(expected);
    }
    let full: Vec<Value> = std::iter::repeat_n(release, 256).collect();
    assert_eq!(settle(&service, &full), 0, "256 is a full batch");
    let body =
        json!({ "checks": [slot("streams/00000000000000d7", 10_001, 10_000, &slot_name(1))] });
    post_json(service.addr, "/v1/check", &body.to_string())
        .assert_bad_request("checks[0].requests: 10001 is not in 1..=10000");
}

#[test]
fn settling_needs_the_bearer_token_and_a_redis_that_answers() {
    let mut redis = RedisServer::start();
    let dir = TempDir::new("settle-token");
    let file = dir.path().join("token");
    std::fs::write(&file, "s3cret\n").unwrap();
    let args = [
        "--redis",
        &redis.url(),
        "--token-file",
        file.to_str().unwrap(),
    ];
    let service = Service::start_with(&args, &[]);
    let release = settlement(
        &slot("streams/00000000000000d8", 2, 10_000, &slot_name(1)),
        json!({"op": "release", "slot": slot_name(1)}),
    );
    let body = json!({ "settlements": [release] }).to_string();
    let raw = |authorization: &str| {
        format!(
            "POST /v1/settle HTTP/1.1\r\nhost: sluice\r\nconnection: close\r\n{authorization}\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let refused = send_raw(service.addr, raw("").as_bytes());
    assert_eq!(refused.status, 401, "{refused:?}");
    assert_eq!(refused.header("www-authenticate"), Some("Bearer"));
    let with_token = raw("authorization: Bearer s3cret\r\n");
    let answered = send_raw(service.addr, with_token.as_bytes());
    assert_eq!(
        (answered.status, answered.json()),
        (200, json!({"settled": 0}))
    );
    redis.stop();
    let unavailable = send_raw(service.addr, with_token.as_bytes());
    assert_eq!(unavailable.status, 503, "{unavailable:?}");
    assert_eq!(unavailable.json()["error"], "redis_unavailable");
}

/// Issue 31, "a leak would show": a slot its request stopped renewing (a check the filter gave
/// up on and whose release was lost, say) is counted in sluice_service_slots_unrenewed and
/// logged once, while a renewed one never is.
#[test]
fn a_slot_nobody_renews_is_counted_and_logged_once_while_it_lasts() {
    on_each_store(|service| {
        let key = "streams/00000000000000dc";
        let (renewed, lost) = (slot_name(1), slot_name(2));
        let taken = Instant::now();
        assert!(allowed(&check_one(
            service,
            &slot(key, 2, 10_000, &renewed)
        )));
        assert!(allowed(&check_one(service, &slot(key, 2, 10_000, &lost))));
        let renew = settlement(
            &slot(key, 2, 10_000, &renewed),
            json!({"op": "renew", "slot": renewed}),
        );
        let gauge = || {
            let metrics = get(service.addr, "/metrics").text();
            let line = metrics
                .lines()
                .find(|l| l.starts_with("sluice_service_slots_unrenewed "));
            line.and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        };
        let mut seen = Vec::new();
        let (mut logged, mut events) = (None, 0);
        while taken.elapsed() < Duration::from_secs(13) {
            settle(service, std::slice::from_ref(&renew));
            if let Some(event) = service.event("slots not renewed", Duration::from_millis(500)) {
                events += 1;
                logged.get_or_insert((taken.elapsed(), event));
            }
            seen.push((taken.elapsed().as_millis(), gauge().unwrap()));
        }
        let (when, event) = logged.expect("the lost slot was logged");
        // Unrenewed 7.5 s after it was taken (half its 10 s lease, and a quarter), until it
        // expires at 10 s; swept every 2 s.
        assert!(
            (Duration::from_millis(7_400)..Duration::from_millis(10_100)).contains(&when),
            "logged after {when:?}"
        );
        assert_eq!(
            (event["slots"].as_u64(), event["lease_ms"].as_u64()),
            (Some(1), Some(10_000))
        );
        assert!(event["key"].as_str().unwrap().contains(key), "{event}");
        assert_eq!(events, 1, "logged once while it lasts");
        assert!(seen.iter().any(|&(_, n)| n == 1), "{seen:?}");
        assert!(
            seen.iter().all(|&(_, n)| n <= 1),
            "the renewed slot never counts: {seen:?}"
        );
        assert_eq!(seen.last().unwrap().1, 0, "expired: {seen:?}");
    });
}
