//! Issue 20's attacks on `sluice-service`, one test per finding, each written as the attack it
//! stops, against the real service and a real Redis; and issue 36's on the RLQS's port (streams
//! that never report, huge counts, 100,000 bucket ids, readers that never read). Connection
//! floods run the service under `ulimit -n 1024` (the test process raises its own limit to hold
//! the attacker's sockets).
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;
#[path = "rlqs/client.rs"]
mod rlqs;
#[path = "rls/client.rs"]
mod rls;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::clock::{redis_time_us, window_around};
use common::{bucket, checks_body, post_check, window, Refusal};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use futures_util::StreamExt;
use rls::{ask, connect, descriptor, overall, overall_codes, request, Client, Rls};
use sluice_testkit::http::{get, post_json};
use sluice_testkit::redis::RedisServer;
use sluice_testkit::resp::Reply;
use sluice_testkit::service::{run_to_exit, Launcher, Service};
use sluice_testkit::{free_port, raise_fd_limit, wait_for};

/// The process limit the connection floods run the service under, and the attacker's sockets.
const FD_LIMIT: u64 = 1024;
const ATTACKERS: usize = 1100;
/// The issue's bar: a legitimate client retrying on a new connection is answered within this.
const ANSWERED_WITHIN: Duration = Duration::from_secs(10);

/// The RLS (`--rls-config` holding `yaml`) over `redis`, with `extra` arguments, started by
/// `launcher`.
fn rls_on(launcher: Launcher, redis: &RedisServer, yaml: &str, extra: &[&str]) -> Rls {
    let url = redis.url();
    Rls::launch(launcher, &["--redis", &url], yaml, extra)
}

/// With HTTP as well, for /metrics and /readyz.
const WITH_HTTP: &[&str] = &["--listen", "127.0.0.1:0"];

fn keys(redis: &RedisServer, pattern: &str) -> Vec<String> {
    match redis.client().cmd(&["KEYS", pattern]) {
        Reply::Array(keys) => keys.iter().map(Reply::text).collect(),
        other => panic!("KEYS: {other:?}"),
    }
}

/// `n` connections to `addr`, each sent `first` (possibly nothing); held by the caller.
fn open_connections(addr: SocketAddr, n: usize, first: &[u8]) -> Vec<TcpStream> {
    raise_fd_limit(4 * FD_LIMIT);
    (0..n)
        .map(|i| {
            let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
                .unwrap_or_else(|e| panic!("attacker connection {i}: {e}"));
            if !first.is_empty() {
                // The service may have shed it already: that is what it should do.
                let _ = stream.write_all(first);
            }
            stream
        })
        .collect()
}

/// How many of `streams` the service has closed: reading what it sent (an HTTP/2 server's
/// SETTINGS) comes to the end of the stream, or an error, at once.
fn closed_by_service(streams: &[TcpStream]) -> usize {
    let closed = |mut stream: &TcpStream| {
        stream.set_nonblocking(true).unwrap();
        let mut buffer = [0u8; 4096];
        let closed = loop {
            match stream.read(&mut buffer) {
                Ok(0) => break true,
                Ok(_) => continue,
                Err(e) => break e.kind() != std::io::ErrorKind::WouldBlock,
            }
        };
        stream.set_nonblocking(false).unwrap();
        closed
    };
    streams.iter().filter(|stream| closed(stream)).count()
}

const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty SETTINGS frame: what a client sends right after the preface.
const EMPTY_SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];

/// A new client and one call, all within `ANSWERED_WITHIN`; how long it took.
async fn legitimate_rls_call(address: SocketAddr, call: RateLimitRequest) -> Duration {
    let started = Instant::now();
    let answered = tokio::time::timeout(ANSWERED_WITHIN, async {
        let mut client = Client::connect(format!("http://{address}")).await.unwrap();
        client.should_rate_limit(call).await.unwrap().into_inner()
    })
    .await;
    let answer = answered.unwrap_or_else(|_| panic!("not answered within {ANSWERED_WITHIN:?}"));
    assert_eq!(overall(&answer), Code::Ok);
    started.elapsed()
}

const PER_USER: &str = "domain: api
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 3}
";

// ---- 1. One RLS call locks a descriptor for 146 years ----------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn a_leaky_bucket_rls_call_of_2_pow_64_hits_is_refused_and_the_key_stays_usable() {
    let redis = RedisServer::start();
    let yaml = "domain: api
descriptors:
  - key: shaped
    rate_limit: {algorithm: leaky_bucket, requests_per_unit: 10, unit: second, max_delay: 500ms}
  - key: generic_key
    value: global
    rate_limit: {algorithm: leaky_bucket, requests_per_unit: 10, unit: second, max_delay: 500ms}
";
    let rls = rls_on(Launcher::default(), &redis, yaml, &[]);
    let mut client = connect(&rls).await;

    let mut flood = request("api", &[&[("shaped", "victim")]], 0);
    flood.descriptors[0].hits_addend = Some(UInt64Value { value: u64::MAX });
    let mut everyone = request("api", &[&[("generic_key", "global")]], u32::MAX);
    let mut thousand = request("api", &[&[("shaped", "other")]], 1000);
    for attack in [&mut flood, &mut everyone, &mut thousand] {
        let before = keys(&redis, "*");
        let answer = ask(&mut client, attack.clone()).await;
        assert_eq!(overall(&answer), Code::OverLimit, "{attack:?}");
        // The store only read: nothing scheduled, nothing written.
        assert_eq!(keys(&redis, "*"), before, "{attack:?}");
        attack.hits_addend = 0;
        attack.descriptors[0].hits_addend = None;
        let started = Instant::now();
        let next = ask(&mut client, attack.clone()).await;
        assert_eq!(overall(&next), Code::Ok, "the descriptor is usable at once");
        assert!(started.elapsed() < Duration::from_millis(450), "not held");
    }
    for key in keys(&redis, "*") {
        let pttl = redis.client().cmd(&["PTTL", &key]).int();
        assert!((0..=1_200).contains(&pttl), "{key}: PTTL {pttl} ms");
    }
}

// ---- 2. Metrics labels carry request bytes without bound --------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn three_hundred_calls_with_huge_descriptor_values_leave_metrics_and_memory_small() {
    let redis = RedisServer::start();
    let yaml = "domain: api
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 1000}
";
    let rls = rls_on(Launcher::default(), &redis, yaml, WITH_HTTP);
    let mut client = connect(&rls).await;
    let before = rls.service.rss_kib();
    for n in 0..300 {
        let value = format!("{n:05}{}", "x".repeat(60_000));
        let mut call = request("api", &[&[("user", &value)]], 0);
        if n % 2 == 1 {
            // A limit override from the request: no per-value series for it either.
            call.descriptors[0].limit = Some(RateLimitOverride {
                requests_per_unit: 10,
                unit: 3,
            });
        }
        assert_eq!(overall(&ask(&mut client, call).await), Code::Ok);
    }
    let metrics = get(rls.service.addr, "/metrics");
    assert_eq!(metrics.status, 200);
    let grown_kib = rls.service.rss_kib().saturating_sub(before);
    assert!(
        metrics.body.len() < 256 * 1024,
        "/metrics is {} bytes",
        metrics.body.len()
    );
    assert!(grown_kib < 32 * 1024, "RSS grew by {grown_kib} KiB");
    let megabyte = request("api", &[&[("user", &"y".repeat(1 << 20))]], 0);
    let refused = client.should_rate_limit(megabyte).await;
    assert!(refused.is_err(), "a 1 MiB call is over --max-request-bytes");
}

// ---- 3. HTTP/2 on the RLS port: unfinished streams, idle connections ---------------------------

#[tokio::test(flavor = "multi_thread")]
async fn eleven_hundred_idle_http2_connections_do_not_stop_a_legitimate_rls_call() {
    let redis = RedisServer::start();
    let launcher = Launcher::fd_limit(FD_LIMIT);
    let rls = rls_on(launcher, &redis, PER_USER, &[]);
    let address = rls.service.rls.unwrap();
    let preface = [HTTP2_PREFACE, EMPTY_SETTINGS].concat();
    let attackers = open_connections(address, ATTACKERS, &preface);
    let took = legitimate_rls_call(address, request("api", &[&[("user", "a")]], 0)).await;
    println!("legitimate call answered in {took:?} under {ATTACKERS} idle connections");
    // Room was made by closing some of the attacker's, not only by refusing newcomers.
    let closed = closed_by_service(&attackers);
    assert!(
        closed > ATTACKERS - 1000,
        "only {closed} attacker connections closed"
    );
    assert!(
        rls.service.open_fds() < FD_LIMIT as usize,
        "{} fds",
        rls.service.open_fds()
    );
}

/// `streams` streams on one HTTP/2 connection, each a call whose gRPC message says `declared`
/// bytes and sends up to `sent` of them, keeping to flow control, never finished; for `within`.
/// The peer's SETTINGS_MAX_CONCURRENT_STREAMS.
async fn half_sent_streams(
    address: SocketAddr,
    streams: usize,
    declared: u32,
    sent: usize,
    within: Duration,
) -> usize {
    let deadline = tokio::time::Instant::now() + within;
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let driving = tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    // The server's SETTINGS come after the handshake: usize::MAX until then (or if it sets none).
    let settled = tokio::time::Instant::now() + Duration::from_secs(1);
    while client.current_max_send_streams() == usize::MAX && tokio::time::Instant::now() < settled {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let max_streams = client.current_max_send_streams();
    let mut senders = Vec::new();
    for _ in 0..streams {
        let Ok(Ok(ready)) = tokio::time::timeout_at(deadline, client.clone().ready()).await else {
            break;
        };
        client = ready;
        let call = http::Request::post(format!(
            "http://{address}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
        let Ok((_response, mut send)) = client.send_request(call, false) else {
            break;
        };
        let mut prefix = vec![0u8];
        prefix.extend_from_slice(&declared.to_be_bytes());
        let _ = send.send_data(Bytes::from(prefix), false);
        senders.push(tokio::spawn(async move {
            let mut left = sent;
            while left > 0 {
                send.reserve_capacity(left.min(64 * 1024));
                let capacity = std::future::poll_fn(|cx| send.poll_capacity(cx));
                match tokio::time::timeout_at(deadline, capacity).await {
                    Ok(Some(Ok(n))) if n > 0 => {
                        let n = n.min(left);
                        if send.send_data(Bytes::from(vec![b'x'; n]), false).is_err() {
                            break;
                        }
                        left -= n;
                    }
                    _ => break,
                }
            }
            tokio::time::sleep_until(deadline).await;
            drop(send);
        }));
    }
    for sender in senders {
        let _ = sender.await;
    }
    driving.abort();
    max_streams
}

#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_half_sent_http2_streams_do_not_grow_the_services_memory() {
    let redis = RedisServer::start();
    let rls = rls_on(Launcher::default(), &redis, PER_USER, &[]);
    let address = rls.service.rls.unwrap();
    let before = rls.service.rss_kib();
    // Each stream says 4 MB are coming and sends 1 MB of them, as fast as flow control lets it.
    let attack = half_sent_streams(address, 200, 4_000_000, 1 << 20, Duration::from_secs(4));
    let (max_streams, peak_kib) = tokio::join!(attack, async {
        let mut peak = 0;
        for _ in 0..16 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            peak = peak.max(rls.service.rss_kib());
        }
        peak
    });
    let grown_kib = peak_kib.saturating_sub(before);
    println!("RSS {before} KiB before, {peak_kib} KiB at the peak of 200 half-sent streams");
    assert!(grown_kib < 32 * 1024, "RSS grew by {grown_kib} KiB");
    assert_eq!(max_streams, 100, "SETTINGS_MAX_CONCURRENT_STREAMS");
    let took = legitimate_rls_call(address, request("api", &[&[("user", "a")]], 0)).await;
    assert!(took < Duration::from_secs(1), "{took:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_bare_and_half_sent_http2_connections_are_closed_by_their_deadlines() {
    let redis = RedisServer::start();
    let timeouts = ["--header-timeout", "1", "--idle-timeout", "2"];
    let rls = rls_on(Launcher::default(), &redis, PER_USER, &timeouts);
    let address = rls.service.rls.unwrap();
    let bare = open_connections(address, 1, b"");
    let partial = open_connections(address, 1, &HTTP2_PREFACE[..10]);
    let preface = open_connections(address, 1, &[HTTP2_PREFACE, EMPTY_SETTINGS].concat());
    // And a connection that makes a call, then goes idle.
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let (mut client, connection) = h2::client::handshake(tcp).await.unwrap();
    let connection = tokio::spawn(connection);
    let call = request("api", &[&[("user", "a")]], 0);
    assert_eq!(
        grpc_call(&mut client, address, &call).await,
        "0",
        "grpc-status"
    );
    let answered = Instant::now();
    let without_request: Vec<TcpStream> = [bare, partial, preface].into_iter().flatten().collect();
    let closed = wait_for(Duration::from_secs(3), || {
        (closed_by_service(&without_request) == without_request.len()).then_some(())
    });
    assert!(
        closed.is_some(),
        "connections without a request open after 3 s"
    );
    let ended = tokio::time::timeout(Duration::from_secs(5), connection).await;
    assert!(
        ended.is_ok(),
        "an idle connection open 5 s after its last answer"
    );
    let idle_for = answered.elapsed();
    assert!(
        idle_for >= Duration::from_millis(1_500),
        "closed after {idle_for:?}"
    );
}

/// One unary call of `call` over an HTTP/2 connection of our own; its `grpc-status`.
async fn grpc_call(
    client: &mut h2::client::SendRequest<Bytes>,
    address: SocketAddr,
    call: &RateLimitRequest,
) -> String {
    let message = prost::Message::encode_to_vec(call);
    let mut body = vec![0u8];
    body.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    body.extend_from_slice(&message);
    let head = http::Request::post(format!(
        "http://{address}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap();
    let (response, mut send) = client.send_request(head, false).unwrap();
    send.send_data(Bytes::from(body), true).unwrap();
    let mut body = response.await.unwrap().into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body.trailers().await.unwrap().unwrap_or_default();
    let status = trailers
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_string());
    status.unwrap_or_default()
}

// ---- 4. HTTP slowloris ---------------------------------------------------------------------

/// A check on a new connection, from another thread, answered within `ANSWERED_WITHIN`; how long
/// it took.
fn legitimate_check(addr: SocketAddr, key: &str) -> Duration {
    let body = checks_body(&[bucket(key, 1, 60_000, 5, 1, 1)]);
    let (answered, answer) = mpsc::channel();
    let started = Instant::now();
    std::thread::spawn(move || {
        let _ = answered.send(post_json(addr, "/v1/check", &body).status);
    });
    let status = answer.recv_timeout(ANSWERED_WITHIN);
    assert_eq!(status, Ok(200), "not answered within {ANSWERED_WITHIN:?}");
    started.elapsed()
}

/// Sends one more byte of a request head on every connection each `every`, as slowloris does,
/// until the returned sender is dropped or sent to; then hands the connections back.
fn trickle(
    mut streams: Vec<TcpStream>,
    every: Duration,
) -> (mpsc::Sender<()>, std::thread::JoinHandle<Vec<TcpStream>>) {
    let (stop, stopped) = mpsc::channel::<()>();
    let trickling = std::thread::spawn(move || {
        while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
            for stream in &mut streams {
                let _ = stream.write_all(b"x");
            }
        }
        streams
    });
    (stop, trickling)
}

const SLOW_HEAD: &[u8] = b"POST /v1/check HTTP/1.1\r\nhost: sluice\r\nx-slow: ";

#[test]
fn eleven_hundred_slowloris_connections_do_not_stop_a_legitimate_check() {
    let redis = RedisServer::start();
    let url = redis.url();
    let launcher = Launcher::fd_limit(FD_LIMIT);
    let service = launcher.start_with(&["--redis", &url], &[]);
    let attackers = open_connections(service.addr, ATTACKERS, SLOW_HEAD);
    let (stop, trickling) = trickle(attackers, Duration::from_millis(500));
    let took = legitimate_check(service.addr, "legit/alice");
    println!("legitimate check answered in {took:?} under {ATTACKERS} slow connections");
    drop(stop);
    let attackers = trickling.join().unwrap();
    let closed = closed_by_service(&attackers);
    assert!(
        closed > ATTACKERS - 1000,
        "only {closed} attacker connections closed"
    );
    drop(attackers);

    // Configured past the descriptor limit, the service runs out of them: it still makes room,
    // and says so at most once a second, with a count.
    let past = ["--redis", &url, "--max-connections", "4000"];
    let service = launcher.start_with(&past, &[]);
    let started = Instant::now();
    let attackers = open_connections(service.addr, ATTACKERS, SLOW_HEAD);
    legitimate_check(service.addr, "legit/bob");
    let failures: Vec<serde_json::Value> = (service.lines(Duration::from_millis(500)).iter())
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|event| event["message"] == "accept failed")
        .collect();
    let seconds = started.elapsed().as_secs();
    assert!(!failures.is_empty(), "no accept failed at all");
    assert!(
        failures.len() as u64 <= seconds + 1,
        "{} lines in {seconds} s",
        failures.len()
    );
    assert!(
        failures.iter().all(|f| f["others"].is_u64()),
        "{failures:?}"
    );
    drop(attackers);
}

// ---- 5. Any caller can fill Redis with keys that live for a century ----------------------------

#[test]
fn a_service_reachable_beyond_loopback_refuses_to_start_without_a_token() {
    for exposed in [
        &["--memory", "--listen", "0.0.0.0:0"][..],
        &[
            "--memory",
            "--rls",
            "0.0.0.0:0",
            "--rls-config",
            "/nonexistent",
        ],
    ] {
        let (status, _, stderr) = run_to_exit(exposed, &[], Duration::from_secs(10));
        assert_eq!(status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("without --token-file") && stderr.contains("--allow-unauthenticated"),
            "{stderr}"
        );
    }
}

#[test]
fn a_key_flood_forgets_idle_counters_instead_of_failing_every_call() {
    let policy = ["--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lfu"];
    let redis = RedisServer::start_with(free_port, &policy);
    let service = Service::start(&redis.url());
    let addr = service.addr;
    let century = bucket("flood/century", 1, 31_536_000_000, 146, 1, 1);
    post_check(addr, &checks_body(&[century])).assert_bad_request(
        "checks[0].burst: its key would live 53290d, more than --max-key-ttl 62d",
    );
    let logs: Vec<serde_json::Value> = (0..16)
        .map(|i| {
            window(
                "sliding_log",
                &format!("flood/log{i}"),
                1000,
                60_000,
                1000,
                1000,
            )
        })
        .collect();
    post_check(addr, &checks_body(&logs))
        .assert_bad_request("checks: sliding_log checks may take 1000 entries in all");

    let per_ms = window_around(
        redis_time_us(&mut redis.client()),
        600_000..900_000,
        120_000,
    );
    let legit = window("fixed_window", "legit/alice", 1000, per_ms, 1, 1);
    let month_ms = 30 * 86_400_000;
    let mut legit_calls = 0;
    for request in 0..1000 {
        let flood: Vec<serde_json::Value> = (0..16)
            .map(|i| {
                window(
                    "fixed_window",
                    &format!("flood/{request}-{i}"),
                    1,
                    month_ms,
                    1,
                    1,
                )
            })
            .collect();
        let answer = post_check(addr, &checks_body(&flood));
        assert_eq!(answer.status, 200, "flood request {request}: {answer:?}");
        if request % 50 == 0 {
            legit_calls += 1;
            let result = service.check(std::slice::from_ref(&legit)).remove(0);
            assert_eq!(result["allowed"], true, "{result}");
            assert_eq!(result["remaining"], 1000 - legit_calls, "exactly counted");
        }
    }
    let mut client = redis.client();
    let info = client.cmd(&["INFO", "memory"]).text();
    let used: u64 = (info.lines())
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let keys = client.cmd(&["DBSIZE"]).int();
    println!("16,000 flood keys: Redis holds {keys} keys in {used} bytes");
    assert!(keys < 16_000, "nothing evicted: {keys} keys");
    assert!(used <= 2 * 1024 * 1024 + 256 * 1024, "used_memory {used}");
}

// ---- 6. An HTTP check reaching an RLS counter; a change of algorithm resetting one -------------

#[tokio::test(flavor = "multi_thread")]
async fn an_http_check_can_neither_reach_an_rls_counter_nor_reset_another_algorithms_state() {
    let redis = RedisServer::start();
    let rls = rls_on(Launcher::default(), &redis, PER_USER, WITH_HTTP);
    let addr = rls.service.addr;
    let mut client = connect(&rls).await;
    let alice = request("api", &[&[("user", "alice")]], 0);
    assert_eq!(
        overall_codes(&mut client, &alice, 4).await,
        rls::oks_then_over(3, 1)
    );
    // Whoever knows the counter's Redis key (or computed its hash) aims HTTP checks at it.
    let counter = keys(&redis, "*").pop().unwrap();
    let inner = counter
        .split_once('{')
        .unwrap()
        .1
        .split_once('}')
        .unwrap()
        .0;
    for key in [
        inner.to_string(),
        format!("rls/{inner}"),
        inner.replace("rls/", ""),
    ] {
        let reset = bucket(&key, 1_000_000_000, 60_000, 1_000_000_000, 1, 1);
        let lockout = window("fixed_window", &key, 1_000_000_000, 86_400_000, 1, 1);
        for check in [reset, lockout] {
            assert_eq!(post_check(addr, &checks_body(&[check])).status, 200);
        }
    }
    let answer = ask(&mut client, alice).await;
    assert_eq!(
        overall(&answer),
        Code::OverLimit,
        "alice's counter was reset"
    );

    // Between HTTP callers: another algorithm, or other numbers, on a key have their own state.
    let per_ms = window_around(
        redis_time_us(&mut redis.client()),
        3_600_000..3_700_000,
        60_000,
    );
    let hourly = window("fixed_window", "per-user/abc", 2, per_ms, 1, 1);
    let allowed = |check: &serde_json::Value| {
        rls.service.check(std::slice::from_ref(check))[0]["allowed"].clone()
    };
    assert_eq!(
        [allowed(&hourly), allowed(&hourly), allowed(&hourly)],
        [true, true, false]
    );
    assert_eq!(allowed(&bucket("per-user/abc", 1, 60_000, 5, 1, 1)), true);
    assert_eq!(allowed(&hourly), false, "the token bucket reset the window");
    let billion = 1_000_000_000;
    let lockout = window(
        "fixed_window",
        "per-user/victim",
        billion,
        per_ms,
        billion,
        billion,
    );
    assert_eq!(allowed(&lockout), true);
    let victim = window("fixed_window", "per-user/victim", 10, per_ms, 1, 1);
    assert_eq!(
        allowed(&victim),
        true,
        "the victim's first call was refused"
    );
}

// ---- 7. One large RLS request stalls Redis and flips readiness ---------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn one_rls_call_of_150000_descriptors_is_refused_without_touching_redis() {
    let redis = RedisServer::start();
    let rls = rls_on(Launcher::default(), &redis, PER_USER, WITH_HTTP);
    let mut client = connect(&rls).await;
    let values: Vec<String> = (0..150_000).map(|n| format!("u{n}")).collect();
    let huge = RateLimitRequest {
        domain: "api".into(),
        descriptors: values.iter().map(|v| descriptor(&[("user", v)])).collect(),
        hits_addend: 0,
    };
    let mut other = client.clone();
    let (refused, legit_took) = tokio::join!(client.should_rate_limit(huge), async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let started = Instant::now();
        ask(&mut other, request("api", &[&[("user", "legit")]], 0)).await;
        started.elapsed()
    });
    assert!(refused.is_err(), "150,000 descriptors answered");
    // Generous: the test's own encoding of 150,000 descriptors shares its runtime with this call
    // on a busy machine; the Redis stall this guards against lasted over a second.
    assert!(legit_took < Duration::from_secs(2), "{legit_took:?}");
    assert_eq!(get(rls.service.addr, "/readyz").status, 200);
    assert_eq!(
        keys(&redis, "*").len(),
        1,
        "only the legitimate call's counter"
    );
    let over_cap = RateLimitRequest {
        descriptors: values[..65]
            .iter()
            .map(|v| descriptor(&[("user", v)]))
            .collect(),
        ..request("api", &[], 0)
    };
    let status = client.should_rate_limit(over_cap).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unknown);
    assert_eq!(
        status.message(),
        "rate limit descriptor list must hold at most 64 descriptors, got 65"
    );
    assert_eq!(keys(&redis, "*").len(), 1);
}

/// Slots are sorted-set members, as sliding-log entries are: a call that asks for 64 users'
/// 10,000 slots each (640,000 members) is refused before Redis, and so is one of 1,001.
#[tokio::test(flavor = "multi_thread")]
async fn one_rls_call_adds_at_most_a_thousand_slots_whatever_its_hits() {
    let redis = RedisServer::start();
    let yaml = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {algorithm: concurrency, requests_per_unit: 10000}\n";
    let rls = rls_on(Launcher::default(), &redis, yaml, &[]);
    let mut client = connect(&rls).await;
    let users: Vec<String> = (0..64).map(|n| format!("u{n}")).collect();
    let flood = RateLimitRequest {
        descriptors: users.iter().map(|u| descriptor(&[("user", u)])).collect(),
        ..request("api", &[], 10_000)
    };
    let status = client.should_rate_limit(flood).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unknown);
    assert_eq!(
        status.message(),
        "the sliding_log and concurrency limits of one call may take 1000 hits in all, got 640000"
    );
    let one_over = request("api", &[&[("user", "u0")]], 1_001);
    assert!(client.should_rate_limit(one_over).await.is_err());
    assert!(keys(&redis, "*").is_empty(), "nothing reached Redis");
    let thousand = request("api", &[&[("user", "u0")]], 1_000);
    assert_eq!(overall(&ask(&mut client, thousand).await), Code::Ok);
    let members = redis.client().cmd(&["ZCARD", &keys(&redis, "*")[0]]).int();
    assert_eq!(members, 1_000);
}

// ---- 8. An --rls-config directory left with no YAML file --------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn an_rls_config_directory_left_without_yaml_keeps_its_limits() {
    let redis = RedisServer::start();
    let rls = rls_on(Launcher::default(), &redis, PER_USER, &[]);
    let mut client = connect(&rls).await;
    let alice = request("api", &[&[("user", "alice")]], 0);
    assert_eq!(
        overall_codes(&mut client, &alice, 3).await,
        rls::oks_then_over(3, 0)
    );
    let dir = rls.dir.path();
    std::fs::rename(dir.join("limits.yaml"), dir.join("limits.yaml.bak")).unwrap();
    let refused = "rls configuration refused, the previous one keeps serving";
    let logged = rls.service.event(refused, Duration::from_secs(5));
    let logged = logged.expect("the reload to no domain was not refused");
    assert_eq!(logged["level"], "ERROR");
    let error = logged["error"].as_str().unwrap();
    assert!(
        error.starts_with(&format!(
            "{}:0: refused: domain(s) api would go",
            dir.display()
        )) && error.contains("limits.yaml"),
        "{error}"
    );
    assert_eq!(overall(&ask(&mut client, alice).await), Code::OverLimit);
    let bob = request("api", &[&[("user", "bob")]], 0);
    assert_eq!(
        overall_codes(&mut client, &bob, 4).await,
        rls::oks_then_over(3, 1)
    );
}

// ---- 9. The RLQS: streams that never report, huge counts, 100,000 buckets, a slow reader ------

const RLQS_LIMITS: &str = "domain: api
descriptors:
  - key: name
    rate_limit: {unit: minute, requests_per_unit: 600}
";

/// `sluice-service --rlqs` over `redis`, with HTTP for /metrics, and `extra` arguments.
fn rlqs_on(redis: &RedisServer, extra: &[&str]) -> rlqs::Rlqs {
    let url = redis.url();
    let store = ["--redis", url.as_str()];
    let extra = [WITH_HTTP, extra].concat();
    rlqs::Rlqs::start(&store, RLQS_LIMITS, &["--rlqs", "127.0.0.1:0"], &extra)
}

/// The sample `series` of the RLQS's `/metrics`, 0 if absent.
fn rlqs_metric(service: &rlqs::Rlqs, series: &str) -> u64 {
    rlqs::metric(service.service.addr, series).unwrap_or(0)
}

const NAME: &str = r#"{domain="api",descriptor="name"}"#;

/// One message reporting `allowed` requests of each bucket `{name: <n>}` for `n` in `names`.
fn many_reports(
    names: impl Iterator<Item = usize>,
    allowed: u64,
) -> envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports {
    let mut message = rlqs::reports("api", rlqs::bucket("x"), 0, 0);
    let template = message.bucket_quota_usages.pop().unwrap();
    for n in names {
        let mut usage = template.clone();
        usage.bucket_id = Some(rlqs::bucket(&n.to_string()));
        usage.num_requests_allowed = allowed;
        message.bucket_quota_usages.push(usage);
    }
    message
}

#[tokio::test(flavor = "multi_thread")]
async fn rlqs_streams_that_never_report_hold_no_budget_and_go_with_their_connection() {
    let redis = RedisServer::start();
    let limits = ["--idle-timeout", "2", "--max-connections", "20"];
    let service = rlqs_on(&redis, &limits);
    let address = service.address();
    let before = service.service.rss_kib();
    // One connection opens as many streams as HTTP/2 lets it (--rls-max-streams, 100) and never
    // reports on them; a 101st waits for a place that does not come.
    let client = rlqs::connect(address).await;
    let mut silent = Vec::new();
    for _ in 0..100 {
        let mut shared = client.clone();
        let opened = tokio::time::timeout(Duration::from_secs(5), rlqs::open_on(&mut shared, None));
        silent.push(opened.await.unwrap().unwrap());
    }
    let mut shared = client.clone();
    let more = tokio::time::timeout(Duration::from_secs(1), rlqs::open_on(&mut shared, None));
    assert!(
        more.await.is_err(),
        "a 101st stream opened on one connection"
    );
    assert_eq!(rlqs_metric(&service, "sluice_service_rlqs_streams"), 100);
    let grown_kib = service.service.rss_kib().saturating_sub(before);
    println!("100 silent RLQS streams: RSS {before} KiB before, +{grown_kib} KiB");
    assert!(grown_kib < 16 * 1024, "RSS grew by {grown_kib} KiB");
    // They hold no budget: an Envoy that reports gets all of it.
    let mut envoy = rlqs::open(address, None).await.unwrap();
    let answer = envoy
        .report(rlqs::reports("api", rlqs::bucket("b"), 50, 0))
        .await;
    assert_eq!(rlqs::per_minute(&answer), Some(600), "{answer:?}");
    // More connections of silent streams than --max-connections: the silent ones are shed for
    // newcomers (they never had an answer), never more open than the bound.
    let mut flood = Vec::new();
    for _ in 0..30 {
        let opened = tokio::time::timeout(Duration::from_secs(2), rlqs::open(address, None)).await;
        if let Ok(Ok(stream)) = opened {
            flood.push(stream);
        }
    }
    let open = rlqs_metric(&service, r#"sluice_service_connections{server="rlqs"}"#);
    assert!(open <= 20, "{open} RLQS connections open");
    // Nothing reports: the idle deadline (--idle-timeout) closes every connection, and its
    // streams end with it.
    let mut waited = 0;
    while rlqs_metric(&service, "sluice_service_rlqs_streams") > 0 {
        waited += 1;
        assert!(
            waited < 50,
            "RLQS streams still open 5 s after their last report"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let idle = r#"sluice_service_connections_closed_total{server="rlqs",reason="idle_timeout"}"#;
    let shed = r#"sluice_service_connections_closed_total{server="rlqs",reason="shed"}"#;
    println!(
        "RLQS connections closed: {} idle, {} shed; {} of 30 flood streams opened",
        rlqs_metric(&service, idle),
        rlqs_metric(&service, shed),
        flood.len()
    );
    assert!(rlqs_metric(&service, idle) >= 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_rlqs_report_of_u64_max_requests_assigns_at_most_the_budget_and_wraps_nothing() {
    let redis = RedisServer::start();
    let service = rlqs_on(&redis, &[]);
    let (address, huge) = (service.address(), u64::MAX);
    let mut hostile = rlqs::open(address, None).await.unwrap();
    let answer = hostile
        .report(rlqs::reports("api", rlqs::bucket("b"), huge, huge))
        .await;
    assert_eq!(rlqs::per_minute(&answer), Some(600), "{answer:?}");
    // An Envoy beside it still gets a share, and the hostile one's shrinks to leave it.
    let mut envoy = rlqs::open(address, None).await.unwrap();
    let light = envoy
        .report(rlqs::reports("api", rlqs::bucket("b"), 10, 0))
        .await;
    let light = rlqs::per_minute(&light).unwrap();
    assert!(light > 0);
    let answer = hostile
        .report(rlqs::reports("api", rlqs::bucket("b"), huge, huge))
        .await;
    let heavy = rlqs::per_minute(&answer).unwrap();
    assert!(heavy + light <= 600, "{heavy} + {light}");
    // The ledger's demand is capped, the counters add at most 2^40 a report and do not wrap.
    let max_requests = 1u64 << 40;
    let allowed =
        r#"sluice_service_rlqs_requests_total{domain="api",descriptor="name",outcome="allowed"}"#;
    let denied = allowed.replace("allowed", "denied");
    assert_eq!(rlqs_metric(&service, allowed), 2 * max_requests + 10);
    assert_eq!(rlqs_metric(&service, &denied), 2 * max_requests);
    let bucket_keys = keys(&redis, "sluice:rlqs:{*");
    assert_eq!(bucket_keys.len(), 1, "{bucket_keys:?}");
    let Reply::Array(fields) = redis.client().cmd(&["HGETALL", &bucket_keys[0]]) else {
        panic!("HGETALL")
    };
    for value in fields.iter().skip(1).step_by(2) {
        let value = value.text();
        let parts: Vec<u64> = value.split(':').map(|p| p.parse().unwrap()).collect();
        assert!(parts[0] <= 1 << 50, "demand {value}");
        assert!(parts[2] <= 600, "held {value}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hundred_thousand_rlqs_bucket_ids_on_one_stream_keep_a_thousand() {
    let redis = RedisServer::start();
    let service = rlqs_on(&redis, &[]);
    let address = service.address();
    let before = service.service.rss_kib();
    let started = Instant::now();
    let mut hostile = rlqs::open(address, None).await.unwrap();
    // 50 messages of 2,000 buckets each (each message under --max-request-bytes' 64 KiB).
    for first in (0..100_000).step_by(2_000) {
        hostile.send(many_reports(first..first + 2_000, 1)).await;
    }
    // Then a bucket it keeps: answered once every message before it has been.
    hostile.send(many_reports(0..1, 1)).await;
    let first = next_answer(&mut hostile).await;
    // A report the store did not take in time (Redis on a loaded machine) gets no action.
    let errors = rlqs_metric(&service, "sluice_service_rlqs_store_errors_total");
    let errors = usize::try_from(errors).unwrap();
    assert_eq!(first.bucket_action.len() + errors, rlqs_max_buckets());
    let last = next_answer(&mut hostile).await;
    assert_eq!(last.bucket_action.len(), 1, "{last:?}");
    let took = started.elapsed();
    let grown_kib = service.service.rss_kib().saturating_sub(before);
    let bucket_keys = keys(&redis, "sluice:rlqs:{*").len();
    let metrics = get(service.service.addr, "/metrics");
    println!(
        "100,000 bucket ids in {took:?}: RSS {before} KiB before, +{grown_kib} KiB; \
         {bucket_keys} Redis keys; /metrics {} bytes",
        metrics.body.len()
    );
    assert!((first.bucket_action.len()..=rlqs_max_buckets()).contains(&bucket_keys));
    let reports = format!("sluice_service_rlqs_reports_total{NAME}");
    assert_eq!(rlqs_metric(&service, &reports), 1_001);
    assert!(grown_kib < 32 * 1024, "RSS grew by {grown_kib} KiB");
    assert!(
        metrics.body.len() < 64 * 1024,
        "{} bytes",
        metrics.body.len()
    );
    // Another Envoy is answered as ever.
    let mut envoy = rlqs::open(address, None).await.unwrap();
    let answer = envoy
        .report(rlqs::reports("api", rlqs::bucket("fresh"), 10, 0))
        .await;
    assert!(
        rlqs::per_minute(&answer).is_some_and(|share| share > 0),
        "{answer:?}"
    );
}

/// The next answer on `stream`, within 60 s.
async fn next_answer(
    stream: &mut rlqs::Stream,
) -> envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaResponse {
    let next = tokio::time::timeout(Duration::from_secs(60), stream.answers.next());
    next.await.unwrap().unwrap().unwrap()
}

/// `MAX_BUCKETS_PER_STREAM` of `service/src/rlqs/service.rs`.
fn rlqs_max_buckets() -> usize {
    sluice_service::rlqs::service::MAX_BUCKETS_PER_STREAM
}

#[tokio::test(flavor = "multi_thread")]
async fn an_rlqs_client_that_never_reads_its_answers_is_held_back_by_flow_control() {
    // In the service's memory: what is measured here is what the service buffers.
    let ports = ["--rlqs", "127.0.0.1:0"];
    let service = rlqs::Rlqs::start(&["--memory"], RLQS_LIMITS, &ports, WITH_HTTP);
    let address = service.address();
    let before = service.service.rss_kib();
    // tonic's client with h2's windows of 64 KiB (its own are 2 MiB a stream).
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
        .unwrap();
    let mut reader = rlqs::open_on(&mut rlqs::Client::new(channel), None)
        .await
        .unwrap();
    // Each message reports the same 500 buckets: each answer is about 25 KB, and none is read.
    let mut sent = 0;
    while sent < 2_000 {
        let sending =
            tokio::time::timeout(Duration::from_secs(2), reader.send(many_reports(0..500, 1)));
        if sending.await.is_err() {
            break;
        }
        sent += 1;
    }
    assert!(
        sent < 2_000,
        "every message was taken without an answer read"
    );
    // The bucket reports the service read, entered or deferred.
    let entered = format!("sluice_service_rlqs_reports_total{NAME}");
    let read = || {
        rlqs_metric(&service, &entered)
            + rlqs_metric(&service, "sluice_service_rlqs_reports_deferred_total")
    };
    let messages_read = read() / 500;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(read() / 500, messages_read, "still reading");
    let grown_kib = service.service.rss_kib().saturating_sub(before);
    println!(
        "a reader that never reads: {sent} messages sent before the send stalled, \
         {messages_read} read by the service; RSS {before} KiB before, +{grown_kib} KiB"
    );
    // A message whose every report is deferred (over the stream's allowance) has no answer, so
    // the next is read at once: more are read than answered, but once answers wait, none.
    assert!(messages_read <= sent, "{messages_read} messages read");
    assert!(grown_kib < 16 * 1024, "RSS grew by {grown_kib} KiB");
    // Reading again lets it go on.
    let next = tokio::time::timeout(Duration::from_secs(10), reader.answers.next()).await;
    assert!(!next.unwrap().unwrap().unwrap().bucket_action.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_rlqs_stream_reporting_faster_than_any_envoy_makes_a_bounded_number_of_store_calls() {
    let redis = RedisServer::start();
    let service = rlqs_on(&redis, &[]);
    let hostile = rlqs::open(service.address(), None).await.unwrap();
    let started = Instant::now();
    // 20 messages of the same 1,000 buckets at once: an Envoy reports them once in 5 s.
    for _ in 0..20 {
        hostile.send(many_reports(0..1_000, 1)).await;
    }
    let entered = format!("sluice_service_rlqs_reports_total{NAME}");
    let deferred = "sluice_service_rlqs_reports_deferred_total";
    let mut waited = 0;
    while rlqs_metric(&service, &entered) + rlqs_metric(&service, deferred) < 20_000 {
        waited += 1;
        assert!(waited < 300, "20,000 bucket reports not read in 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = started.elapsed();
    let (entered, deferred) = (
        rlqs_metric(&service, &entered),
        rlqs_metric(&service, deferred),
    );
    let info = redis.client().cmd(&["INFO", "commandstats"]).text();
    let scripts: u64 = (info.lines())
        .filter(|l| l.starts_with("cmdstat_eval"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    println!(
        "20 messages of 1,000 buckets in {took:?}: {entered} entered, {deferred} deferred; \
         {scripts} scripts run in Redis"
    );
    // 2,000 at once, then 1,000 a second; two scripts each (report, hold).
    let allowed = 2_000 + 1_000 * (took.as_millis() as u64 + 999) / 1_000;
    assert!(entered <= allowed, "{entered} entered in {took:?}");
    assert!(deferred >= 20_000 - allowed);
    assert!(scripts <= 2 * entered + 10, "{scripts} scripts");
}

/// Sends `message` (a gRPC frame) on `send` as flow control lets it, until `deadline`; whether
/// it all went.
async fn send_frame(
    send: &mut h2::SendStream<Bytes>,
    message: &Bytes,
    deadline: tokio::time::Instant,
) -> bool {
    let mut left = message.clone();
    while !left.is_empty() {
        send.reserve_capacity(left.len());
        let capacity = std::future::poll_fn(|cx| send.poll_capacity(cx));
        match tokio::time::timeout_at(deadline, capacity).await {
            Ok(Some(Ok(n))) if n > 0 => {
                let chunk = left.split_to(n.min(left.len()));
                if send.send_data(chunk, false).is_err() {
                    return false;
                }
            }
            _ => return false,
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread")]
async fn fifty_rlqs_streams_that_never_read_their_answers_are_not_read_on_and_then_closed() {
    let ports = ["--rlqs", "127.0.0.1:0"];
    let extra = [WITH_HTTP, &["--idle-timeout", "4"]].concat();
    let service = rlqs::Rlqs::start(&["--memory"], RLQS_LIMITS, &ports, &extra);
    let address = service.address();
    let before = service.service.rss_kib();
    // Each message reports 1,000 buckets (its answer is about 50 KB); the client's windows
    // are h2's 64 KiB, and it never reads an answer nor gives the window back.
    let mut message = vec![0u8];
    let body = prost::Message::encode_to_vec(&many_reports(0..1_000, 1));
    message.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
    message.extend_from_slice(&body);
    let message = Bytes::from(message);
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let driving = tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    let mut streams = Vec::new();
    for _ in 0..50 {
        client = client.ready().await.unwrap();
        let call = http::Request::post(format!(
            "http://{address}/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
        let (response, mut send) = client.send_request(call, false).unwrap();
        let message = message.clone();
        streams.push(tokio::spawn(async move {
            let mut sent = 0;
            while send_frame(&mut send, &message, deadline).await {
                sent += 1;
            }
            (sent, response, send)
        }));
    }
    let mut sent = Vec::new();
    let mut held = Vec::new();
    for stream in streams {
        let (n, response, send) = stream.await.unwrap();
        sent.push(n);
        held.push((response, send));
    }
    let reports = format!("sluice_service_rlqs_reports_total{NAME}");
    let answered = rlqs_metric(&service, &reports) / 1_000;
    let grown_kib = service.service.rss_kib().saturating_sub(before);
    let most = sent.iter().max().unwrap();
    println!(
        "50 streams that never read: {} messages sent ({most} at most on one), {answered} \
         answered; RSS {before} KiB before, +{grown_kib} KiB",
        sent.iter().sum::<usize>()
    );
    // Hyper takes a stream's next answer only once the last one has gone into the client's
    // windows (64 KiB for the stream, as much for the connection): then the stream is not read
    // on, and its next report waits in the service's window (64 KiB a stream, 1 MiB a
    // connection), unread. So at most an answer or two a stream.
    assert!(answered <= 2 * 50, "{answered} answered");
    assert!(grown_kib < 64 * 1024, "RSS grew by {grown_kib} KiB");
    // Nothing is answered any more: the idle deadline closes the connection, and its streams.
    let closed = r#"sluice_service_connections_closed_total{server="rlqs",reason="idle_timeout"}"#;
    let mut waited = 0;
    while rlqs_metric(&service, closed) == 0
        || rlqs_metric(&service, "sluice_service_rlqs_streams") > 0
    {
        waited += 1;
        assert!(
            waited < 100,
            "the connection or its streams open 10 s after its last answer"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(held);
    driving.abort();
}
