//! Graceful shutdown on SIGTERM: /readyz fails at once, checks go on being decided for
//! `--shutdown-delay`, then the service stops accepting, lets the checks in flight finish within
//! `--shutdown-timeout`, and exits 0.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{bucket, checks_body, post_check};
use sluice_testkit::http::get;
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::Service;
use sluice_testkit::{SIGINT, SIGTERM};

fn one_check() -> String {
    checks_body(&[bucket("stop/1", 1, 60_000, 5, 1, 1)])
}

/// A check whose headers and first half of the body are sent; the rest is `finish`'s.
struct InFlight {
    stream: TcpStream,
    rest: Vec<u8>,
}

impl InFlight {
    fn start(addr: SocketAddr) -> InFlight {
        let body = one_check();
        let raw = format!(
            "POST /v1/check HTTP/1.1\r\nhost: sluice\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n\r\n{body}",
            body.len()
        );
        let (sent, rest) = raw.as_bytes().split_at(raw.len() - body.len() / 2);
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.write_all(sent).unwrap();
        InFlight {
            stream,
            rest: rest.to_vec(),
        }
    }

    /// Sends the rest of the body; the whole response.
    fn finish(mut self) -> String {
        self.stream.write_all(&self.rest).unwrap();
        let mut response = String::new();
        let _ = self.stream.read_to_string(&mut response);
        response
    }
}

fn start(redis: &RedisServer, args: &[&str]) -> Service {
    Service::start_with(&[&["--redis", &redis.url()], args].concat(), &[])
}

#[test]
fn sigterm_lets_a_check_in_flight_finish_stops_accepting_and_exits_0() {
    let redis = RedisServer::start();
    let mut service = start(&redis, &[]);
    let in_flight = InFlight::start(service.addr);
    std::thread::sleep(Duration::from_millis(100));
    service.signal(SIGTERM);
    assert!(service
        .event("shutting down", Duration::from_secs(2))
        .is_some());
    let refused = sluice_testkit::wait_for(Duration::from_secs(2), || {
        TcpStream::connect(service.addr).is_err().then_some(())
    });
    assert!(refused.is_some(), "still accepting connections");

    let response = in_flight.finish();
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(response.contains(r#""allowed":true"#), "{response}");
    let status = service
        .wait_exit(Duration::from_secs(5))
        .expect("still running");
    assert!(status.success(), "{status:?}");
    assert!(service.event("stopped", Duration::from_secs(1)).is_some());
}

#[test]
fn during_the_shutdown_delay_readyz_fails_and_checks_are_still_decided() {
    let redis = RedisServer::start();
    let mut service = start(&redis, &["--shutdown-delay", "2"]);
    let signalled = Instant::now();
    service.signal(SIGTERM);
    let failing = sluice_testkit::wait_for(Duration::from_secs(1), || {
        let ready = get(service.addr, "/readyz");
        (ready.status == 503).then(|| ready.json())
    });
    assert_eq!(failing.unwrap()["error"], "shutting_down");
    assert_eq!(post_check(service.addr, &one_check()).status, 200);
    assert_eq!(get(service.addr, "/healthz").status, 200);
    let status = service
        .wait_exit(Duration::from_secs(5))
        .expect("still running");
    assert!(status.success(), "{status:?}");
    let stopped_after = signalled.elapsed();
    assert!(
        (Duration::from_secs(2)..Duration::from_secs(4)).contains(&stopped_after),
        "exited {stopped_after:?} after SIGTERM"
    );
}

#[test]
fn a_check_still_in_flight_after_the_shutdown_timeout_does_not_hold_the_exit() {
    let redis = RedisServer::start();
    let mut service = start(&redis, &["--shutdown-timeout", "1"]);
    let stuck = InFlight::start(service.addr);
    std::thread::sleep(Duration::from_millis(100));
    let signalled = Instant::now();
    service.signal(SIGTERM);
    let status = service
        .wait_exit(Duration::from_secs(5))
        .expect("still running");
    let stopped_after = signalled.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(
        (Duration::from_secs(1)..Duration::from_secs(3)).contains(&stopped_after),
        "exited {stopped_after:?} after SIGTERM"
    );
    let warning = service.event(
        "stopped with requests still in flight",
        Duration::from_secs(1),
    );
    assert_eq!(warning.unwrap()["level"], "WARN");
    drop(stuck);
}

#[test]
fn sigint_stops_an_idle_service_at_once_with_exit_0() {
    let redis = RedisServer::start();
    let mut service = start(&redis, &[]);
    // An idle keep-alive connection does not hold the shutdown.
    let idle = TcpStream::connect(service.addr).unwrap();
    let signalled = Instant::now();
    service.signal(SIGINT);
    let status = service
        .wait_exit(Duration::from_secs(5))
        .expect("still running");
    assert!(status.success(), "{status:?}");
    assert!(
        signalled.elapsed() < Duration::from_secs(1),
        "took {:?}",
        signalled.elapsed()
    );
    drop(idle);
}
