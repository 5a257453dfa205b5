//! Calendar windows through POST /v1/check: the real binary over a real redis-server and over
//! its memory store. A daily window in Asia/Kolkata (+05:30, no summer time) whose start time
//! the test puts three seconds ahead: the window counts until that local time and starts over
//! there, and `reset_ms` points at it. Redis picks the period by its own TIME among the
//! boundaries the service computed around its clock.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::window;
use serde_json::{json, Value};
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::Service;

const KOLKATA_OFFSET_S: u64 = 5 * 3600 + 1800;

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// A fixed window of `limit` per day in Kolkata starting at the local time of `boundary` (Unix
/// seconds), as the filter sends it.
fn daily(key: &str, limit: u64, boundary: u64) -> Value {
    let mut check = window("fixed_window", key, limit, 86_400_000, 1, 1);
    check["calendar"] = json!({"timezone": "Asia/Kolkata", "per": "1d", "month": 1, "day": 1,
        "weekday": 0, "second": (boundary + KOLKATA_OFFSET_S) % 86_400});
    check
}

fn allowed(results: &[Value]) -> usize {
    results.iter().filter(|r| r["allowed"] == true).count()
}

fn resets_at_the_local_start(service: &Service) {
    let boundary = now_us() / 1_000_000 + 3;
    let checks = vec![daily("cal/alice", 3, boundary); 4];
    let results = service.check(&checks);
    let left_ms = (boundary * 1_000_000 - now_us()) / 1000;
    assert_eq!(allowed(&results), 3, "{results:?}");
    let refused = &results[3];
    let reset = refused["reset_ms"].as_u64().unwrap();
    assert!(
        reset.abs_diff(left_ms) <= 100,
        "reset in {reset} ms, the boundary in {left_ms} ms"
    );
    assert_eq!(refused["retry_after_ms"], refused["reset_ms"]);
    let wait = (boundary * 1_000_000 + 150_000).saturating_sub(now_us());
    std::thread::sleep(Duration::from_micros(wait));
    let results = service.check(&checks);
    assert_eq!(allowed(&results), 3, "a new day: {results:?}");
    let next = results[3]["reset_ms"].as_u64().unwrap();
    assert!(
        (86_399_000..=86_400_000).contains(&next),
        "the next boundary is a day on: {next} ms"
    );
}

#[test]
fn a_daily_calendar_window_resets_at_its_local_start_in_redis() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    resets_at_the_local_start(&service);
}

#[test]
fn a_daily_calendar_window_resets_at_its_local_start_in_memory() {
    let service = Service::start_memory();
    resets_at_the_local_start(&service);
}

#[test]
fn a_calendar_that_names_no_zone_is_refused_at_its_field() {
    let service = Service::start_memory();
    let mut check = daily("cal/bad", 3, 0);
    check["calendar"]["timezone"] = json!("Europe/Atlantis");
    let body = json!({ "checks": [check] }).to_string();
    let response = sluice_testkit::http::post_json(service.addr, "/v1/check", &body);
    assert_eq!(response.status, 400, "{response:?}");
    assert!(
        response.json().to_string().contains("checks[0].calendar"),
        "{response:?}"
    );
    // Hostile names: nothing is read from the file system (the database is bundled), and
    // every one is refused at the field.
    let long = "A/".repeat(5_000);
    for zone in [
        "../../../../etc/passwd",
        "/etc/localtime",
        "",
        long.as_str(),
        "Europe/Berlin\u{0}",
    ] {
        let mut check = daily("cal/bad", 3, 0);
        check["calendar"]["timezone"] = json!(zone);
        let body = json!({ "checks": [check] }).to_string();
        let response = sluice_testkit::http::post_json(service.addr, "/v1/check", &body);
        assert_eq!(response.status, 400, "{zone:?}: {response:?}");
    }
    for (field, value) in [
        ("second", json!(86_400)),
        ("day", json!(0)),
        ("month", json!(13)),
        ("weekday", json!(7)),
        ("per", json!("2mo")),
        ("day", json!(-1)),
        ("second", json!(1e9)),
    ] {
        let mut check = daily("cal/bad", 3, 0);
        check["calendar"]["per"] = json!("1y");
        check["calendar"][field] = value.clone();
        let body = json!({ "checks": [check] }).to_string();
        let response = sluice_testkit::http::post_json(service.addr, "/v1/check", &body);
        assert_eq!(response.status, 400, "{field} {value}: {response:?}");
        assert!(
            response.json().to_string().contains("checks[0].calendar"),
            "{response:?}"
        );
    }
    let mut token_bucket = daily("cal/bad", 3, 0);
    token_bucket["algorithm"] = json!("token_bucket");
    let body = json!({ "checks": [token_bucket] }).to_string();
    let response = sluice_testkit::http::post_json(service.addr, "/v1/check", &body);
    assert_eq!(response.status, 400, "{response:?}");
}

fn settle(service: &Service, settlement: Value) -> u64 {
    let body = json!({ "settlements": [settlement] }).to_string();
    let response = sluice_testkit::http::post_json(service.addr, "/v1/settle", &body);
    assert_eq!(response.status, 200, "{response:?}");
    response.json()["settled"].as_u64().unwrap()
}

/// A settlement of `check`'s state with `op`, as the filter names it: the calendar too.
fn settlement(check: &Value, op: Value) -> Value {
    let mut settlement = json!({"key": check["key"], "algorithm": "fixed_window",
        "requests": check["requests"], "per_ms": check["per_ms"], "burst": check["burst"],
        "calendar": check["calendar"]});
    for (field, value) in op.as_object().unwrap() {
        settlement[field] = value.clone();
    }
    settlement
}

/// A token budget on a calendar period: a refund counts within the period that took the
/// tokens, a charge owes into it, and both are gone when the period ends.
fn settles_within_the_period(service: &Service) {
    let boundary = now_us() / 1_000_000 + 3;
    let mut reserved = daily("cal/budget", 10, boundary);
    reserved["take"] = json!(10);
    let taken_at = now_us();
    assert_eq!(
        service.check(std::slice::from_ref(&reserved))[0]["granted"],
        10
    );
    let refund = |age_ms: u64| {
        let op = json!({"op": "refund", "tokens": 4, "age_ms": age_ms});
        settlement(&reserved, op)
    };
    assert_eq!(settle(service, refund(1)), 1);
    let charge = json!({"op": "charge", "tokens": 6, "max_debt": 100});
    assert_eq!(settle(service, settlement(&reserved, charge)), 1);
    let one = daily("cal/budget", 10, boundary);
    let owing = service.check(std::slice::from_ref(&one)).remove(0);
    assert_eq!(
        (owing["allowed"].clone(), owing["remaining"].clone()),
        (json!(false), json!(0))
    );
    let wait = (boundary * 1_000_000 + 150_000).saturating_sub(now_us());
    std::thread::sleep(Duration::from_micros(wait));
    // The next period: the debt is gone, and what the last one took cannot be given back.
    assert_eq!(service.check(std::slice::from_ref(&one))[0]["remaining"], 9);
    let age_ms = (now_us() - taken_at) / 1000;
    assert_eq!(settle(service, refund(age_ms)), 0);
}

#[test]
fn a_token_budget_on_a_calendar_period_settles_within_it_in_redis() {
    let redis = RedisServer::start();
    settles_within_the_period(&Service::start(&redis.url()));
}

#[test]
fn a_token_budget_on_a_calendar_period_settles_within_it_in_memory() {
    settles_within_the_period(&Service::start_memory());
}
