//! Every algorithm through a real Envoy: the fixed window's boundary burst and how the sliding
//! algorithms cap it, and the leaky bucket holding requests for their turn (its timing precision
//! is measured here).

// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use serde_json::json;
use sluice_testkit::envoy::Envoy;
use sluice_testkit::http::Connection;
use std::io::Write;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const ALICE: &[(&str, &[u8])] = &[("x-user-id", b"alice")];

fn one_policy(algorithm: &str, extra: serde_json::Value) -> String {
    let mut policy = json!({"name": "per-user", "algorithm": algorithm, "key": ["header:x-user-id"],
        "requests": 5, "per": "1s"});
    for (k, v) in extra.as_object().unwrap() {
        policy[k] = v.clone();
    }
    json!({ "policies": [policy] }).to_string()
}

/// Sleeps until `offset` into the next whole second of the Unix clock (the windows' boundaries).
fn sleep_until_second_plus(offset: Duration) {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let into_second = Duration::from_nanos(u64::from(since_epoch.subsec_nanos()));
    let wait = (Duration::from_secs(1) - into_second) + offset;
    std::thread::sleep(wait.min(Duration::from_secs(2)));
}

/// Five requests late in one second, five just after the boundary: how many of each got through.
/// Retried (at most 3 times) when the machine was too slow to straddle the boundary cleanly.
fn straddle_a_boundary(envoy: &Envoy, user: &str) -> (usize, usize) {
    for attempt in 0..3 {
        let id = format!("{user}-{attempt}");
        let headers: &[(&str, &[u8])] = &[("x-user-id", id.as_bytes())];
        sleep_until_second_plus(Duration::from_millis(850));
        let second = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_secs();
        let started = SystemTime::now();
        let late = (0..5)
            .filter(|_| envoy.get("/x", headers).status == 200)
            .count();
        let boundary_crossed_early = second(SystemTime::now()) != second(started);
        sleep_until_second_plus(Duration::from_millis(20));
        let early = (0..5)
            .filter(|_| envoy.get("/x", headers).status == 200)
            .count();
        if !boundary_crossed_early {
            return (late, early);
        }
    }
    panic!("could not send five requests within 150 ms three times");
}

#[test]
fn a_fixed_window_lets_twice_the_limit_through_across_a_boundary() {
    let envoy = Envoy::start(&one_policy("fixed_window", json!({})));
    assert_eq!(straddle_a_boundary(&envoy, "fixed"), (5, 5));
}

#[test]
fn a_sliding_window_caps_the_boundary_burst() {
    let envoy = Envoy::start(&one_policy("sliding_window", json!({})));
    let (late, early) = straddle_a_boundary(&envoy, "sliding");
    assert_eq!(late, 5);
    assert_eq!(
        early, 0,
        "just after the boundary the previous window still weighs ~5"
    );
}

#[test]
fn a_sliding_log_holds_the_limit_over_any_second() {
    let envoy = Envoy::start(&one_policy("sliding_log", json!({})));
    assert_eq!(straddle_a_boundary(&envoy, "log"), (5, 0));
    let r = envoy.get("/x", &[("x-user-id", b"log-0")]);
    assert_eq!(r.status, 429);
    assert_eq!(r.header("x-ratelimit-limit"), Some("5"));
}

#[test]
fn a_window_429_says_when_the_window_ends() {
    let envoy = Envoy::start(&one_policy("fixed_window", json!({"per": "10s"})));
    let statuses: Vec<u16> = (0..6).map(|_| envoy.get("/x", ALICE).status).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    let r = envoy.get("/x", ALICE);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let window_end = (now / 10 + 1) * 10;
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!(
        retry >= 1 && retry <= window_end - now + 1,
        "retry-after {retry}, window ends in {}",
        window_end - now
    );
    assert_eq!(
        r.header("x-ratelimit-reset"),
        Some(window_end.to_string().as_str())
    );
}

/// Ten requests per second, held at most 300 ms: of six sent at once, four pass 0, 100, 200 and
/// 300 ms later and two are refused at once. Prints how far the releases were from their turn.
#[test]
fn a_leaky_bucket_releases_held_requests_at_the_rate() {
    let config = one_policy(
        "leaky_bucket",
        json!({"requests": 10, "max_delay": "300ms"}),
    );
    let envoy = Envoy::start(&config);
    let connections: Vec<Connection> = (0..6).map(|_| envoy.connect()).collect();
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(6));
    let start = Instant::now();
    let clients: Vec<_> = connections
        .into_iter()
        .map(|connection| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                let r = connection.request("GET", "/x", ALICE).unwrap();
                (r.status, start.elapsed())
            })
        })
        .collect();
    let mut results: Vec<(u16, Duration)> =
        clients.into_iter().map(|c| c.join().unwrap()).collect();
    results.sort_by_key(|(status, done)| (*status, *done));
    let statuses: Vec<u16> = results.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 429, 429], "{results:?}");
    // Each release against the first one's, so that a client thread that got to send late on a
    // busy machine does not look released early.
    let first = results[0].1;
    let errors: Vec<i128> = results
        .iter()
        .take(4)
        .enumerate()
        .map(|(turn, (_, done))| (*done - first).as_millis() as i128 - 100 * turn as i128)
        .collect();
    eprintln!(
        "leaky bucket: release minus turn, ms: {errors:?} (tick 5 ms); first after {first:?}"
    );
    assert!(errors.iter().all(|e| (-5..=60).contains(e)), "{errors:?}");
    assert!(
        results[4].1 < first + Duration::from_millis(50),
        "a refusal is not held: {results:?}"
    );
}

#[test]
fn a_held_request_whose_client_left_does_not_disturb_the_others() {
    let config = one_policy("leaky_bucket", json!({"requests": 5, "max_delay": "1s"}));
    let envoy = Envoy::start(&config);
    assert_eq!(envoy.get("/x", ALICE).status, 200);
    // This one is held for 200 ms; its client goes away after 20.
    let mut impatient = std::net::TcpStream::connect(envoy.addr()).unwrap();
    impatient
        .write_all(b"GET /x HTTP/1.1\r\nhost: x\r\nx-user-id: alice\r\n\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    drop(impatient);
    std::thread::sleep(Duration::from_millis(400));
    let r = envoy.get("/x", &[("x-user-id", b"bob")]);
    assert_eq!(r.status, 200);
    assert!(!envoy.log().contains("panicked"), "{}", envoy.log());
}
