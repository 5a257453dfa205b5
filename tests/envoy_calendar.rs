//! Calendar windows through a real Envoy (two workers): a daily window in Europe/Berlin whose
//! start time the test sets a few seconds ahead of its own clock, so that the boundary comes
//! within the test. The reset headers and `retry-after` point at that boundary, and the window
//! starts over there; locally, and globally through two Envoys, sluice-service and Redis. The month and summer-time cases run natively with an injected clock
//! (`src/calendar/tests.rs`, `src/algorithm/fixed_window.rs`).

// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use serde_json::json;
use sluice_testkit::envoy::Envoy;
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::Service;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const ZONE: &str = "Europe/Berlin";

fn unix_now() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
}

/// A daily window of `requests` in Berlin starting at the local time of `boundary` (Unix
/// seconds), in the header style `headers`.
fn daily_from(boundary: u64, requests: u64, headers: &str) -> String {
    daily_policy(boundary, requests, headers, json!({}))
}

/// `daily_from` with more fields at the top level and in the policy (`global` and `scope`).
fn daily_policy(boundary: u64, requests: u64, headers: &str, global: serde_json::Value) -> String {
    let tz = jiff::tz::TimeZone::get(ZONE).unwrap();
    let local = tz.to_datetime(jiff::Timestamp::from_second(boundary as i64).unwrap());
    let time = format!(
        "{:02}:{:02}:{:02}",
        local.hour(),
        local.minute(),
        local.second()
    );
    let mut config = json!({"headers": headers, "policies": [{
        "name": "daily", "key": ["header:x-user-id"], "algorithm": "fixed_window",
        "requests": requests, "per": "1d",
        "calendar": {"timezone": ZONE, "starts": {"time": time}}
    }]});
    if !global.is_null() && global != json!({}) {
        config["global"] = global;
        config["policies"][0]["scope"] = json!("global");
    }
    config.to_string()
}

/// The same local time the next day in Berlin, by the tz database (a day and an hour, or less
/// one, across a summer-time change).
fn next_day(boundary: u64) -> u64 {
    let tz = jiff::tz::TimeZone::get(ZONE).unwrap();
    let local = tz.to_datetime(jiff::Timestamp::from_second(boundary as i64).unwrap());
    let tomorrow = local.date().tomorrow().unwrap().to_datetime(local.time());
    let instant = tz.to_ambiguous_timestamp(tomorrow).compatible().unwrap();
    instant.as_second() as u64
}

/// Sleeps until `instant` (Unix seconds) has passed by `after`.
fn sleep_past(instant: u64, after: Duration) {
    let target = Duration::from_secs(instant) + after;
    if let Some(wait) = target.checked_sub(unix_now()) {
        std::thread::sleep(wait);
    }
}

#[test]
fn a_daily_window_resets_at_its_local_start_time_and_the_headers_say_when() {
    // The boundary: 10 s on, time enough for Envoy to start.
    let boundary = unix_now().as_secs() + 10;
    let envoy = Envoy::start(&daily_from(boundary, 3, "legacy"));
    let alice: &[(&str, &[u8])] = &[("x-user-id", b"alice")];
    let statuses: Vec<u16> = (0..4).map(|_| envoy.get("/x", alice).status).collect();
    assert_eq!(
        statuses,
        [200, 200, 200, 429],
        "both workers count one window"
    );
    let refused = envoy.get("/x", alice);
    let now = unix_now().as_secs_f64();
    assert!(now < boundary as f64, "Envoy took too long to start");
    assert_eq!(
        refused.header("x-ratelimit-reset"),
        Some(boundary.to_string().as_str()),
        "the reset is the local start time, not a day from the epoch"
    );
    let retry: f64 = refused.header("retry-after").unwrap().parse().unwrap();
    let until = boundary as f64 - now;
    assert!(
        retry >= until && retry <= until + 1.0,
        "retry-after {retry}, boundary in {until:.2} s"
    );
    sleep_past(boundary, Duration::from_millis(50));
    let statuses: Vec<u16> = (0..4).map(|_| envoy.get("/x", alice).status).collect();
    assert_eq!(statuses, [200, 200, 200, 429], "a new day's window");
    let next = envoy.get("/x", alice);
    assert_eq!(
        next.header("x-ratelimit-reset"),
        Some(next_day(boundary).to_string().as_str()),
        "the next boundary is the same local time a day on"
    );
}

#[test]
fn the_draft_ratelimit_header_counts_down_to_the_boundary() {
    let boundary = unix_now().as_secs() + 10;
    let envoy = Envoy::start(&daily_from(boundary, 2, "draft"));
    let bob: &[(&str, &[u8])] = &[("x-user-id", b"bob")];
    assert_eq!(envoy.get("/x", bob).status, 200);
    let answer = envoy.get("/x", bob);
    let until = boundary as f64 - unix_now().as_secs_f64();
    assert!(until > 0.0, "Envoy took too long to start");
    let field = answer.header("ratelimit").unwrap();
    let t: f64 = field
        .split(';')
        .find_map(|p| p.strip_prefix("t="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        t >= until && t <= until + 1.0,
        "{field}, boundary in {until:.2} s"
    );
    assert_eq!(envoy.get("/x", bob).status, 429);
    sleep_past(boundary, Duration::from_millis(50));
    assert_eq!(envoy.get("/x", bob).status, 200);
}

#[test]
fn a_global_daily_window_resets_at_its_local_start_across_two_envoys() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    // Two Envoys to start: 15 s.
    let boundary = unix_now().as_secs() + 15;
    let global = json!({"cluster": "sluice_service", "authority": "sluice-service",
        "timeout": "500ms"});
    let config = daily_policy(boundary, 4, "legacy", global);
    let envoys: Vec<Envoy> = (0..2)
        .map(|_| Envoy::options(&config).service(&[service.addr]).start())
        .collect();
    let carol: &[(&str, &[u8])] = &[("x-user-id", b"carol")];
    let statuses: Vec<u16> = (0..6)
        .map(|i| envoys[i % 2].get("/x", carol).status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 200, 429, 429], "one budget");
    let refused = envoys[0].get("/x", carol);
    assert!(
        unix_now().as_secs() < boundary,
        "the Envoys took too long to start"
    );
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.header("x-ratelimit-reset"),
        Some(boundary.to_string().as_str()),
        "the service's reset is the local start time"
    );
    sleep_past(boundary, Duration::from_millis(300));
    let statuses: Vec<u16> = (0..6)
        .map(|i| envoys[i % 2].get("/x", carol).status)
        .collect();
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 429, 429],
        "a new day's window"
    );
}
