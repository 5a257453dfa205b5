//! The filter's own admin path (`admin`) in a real Envoy with two workers and two listeners that
//! run the same filter configuration: only the listener whose metadata names it
//! (`filter_metadata.sluice.listener`) answers the admin path; on the other the path is an
//! ordinary request, limited and forwarded. A reset and a credit taken by one worker are seen by
//! the other (the state is in shared data), each applied once however often it is sent.

// Helpers report an unexpected response by panicking, as assertions do.
#![allow(clippy::panic, clippy::indexing_slicing)]

use serde_json::{json, Value};
use sluice_testkit::envoy::{admin_bootstrap, Envoy, EnvoyOptions};
use sluice_testkit::http::{send_with, Response};
use std::net::SocketAddr;

const TOKEN: &str = "0123456789abcdef0123456789abcdef";
const READ: &str = "fedcba9876543210fedcba9876543210";

fn config() -> String {
    json!({"admin": {"listener": "ops", "token_env": "SLUICE_ADMIN_TOKEN",
                     "read_token_env": "SLUICE_READ_TOKEN"},
           "policies": [{"name": "per-user", "key": ["header:x-user-id"],
                         "requests": 1, "per": "1h", "burst": 5}]})
    .to_string()
}

fn bootstrap() -> String {
    admin_bootstrap(&config(), &["SLUICE_ADMIN_TOKEN", "SLUICE_READ_TOKEN"])
}

fn call(addr: SocketAddr, token: &str, path: &str, body: &Value) -> Response {
    let bearer = format!("Bearer {token}");
    let headers: &[(&str, &[u8])] = &[
        ("authorization", bearer.as_bytes()),
        ("content-type", b"application/json"),
        ("x-user-id", b"mallory"),
    ];
    send_with(addr, "POST", path, headers, body.to_string().as_bytes())
}

fn alice(envoy: &Envoy, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| envoy.get("/api/x", &[("x-user-id", b"alice")]).status)
        .collect()
}

#[test]
fn only_the_named_listener_serves_the_admin_path_and_a_reset_reaches_every_worker_once() {
    let envoy = EnvoyOptions::bootstrap(&bootstrap())
        .vm_env("SLUICE_ADMIN_TOKEN", &format!("alice {TOKEN}"))
        .vm_env("SLUICE_READ_TOKEN", READ)
        .concurrency(2)
        .start();
    let ops = envoy.listener_addr("ops");
    let show = json!({"policy": "per-user", "key": ["alice"]});
    assert_eq!(alice(&envoy, 6), [200, 200, 200, 200, 200, 429]);

    // The public listener: the admin path is an ordinary request (mallory's, forwarded).
    let public = call(envoy.addr(), TOKEN, "/sluice/admin/v1/keys/show", &show);
    assert_eq!((public.status, public.text()), (200, "upstream".into()));

    let shown = call(ops, READ, "/sluice/admin/v1/keys/show", &show);
    assert_eq!(shown.status, 200, "{}", shown.text());
    let state = shown.json();
    assert_eq!(
        (state["remaining"].clone(), state["capacity"].clone()),
        (json!(0), json!(5))
    );
    assert_eq!(state["source"], "policy");
    let reset =
        json!({"policy": "per-user", "key": ["alice"], "reason": "test", "id": "00000000000000a1"});
    assert_eq!(
        call(ops, READ, "/sluice/admin/v1/keys/reset", &reset).status,
        403
    );
    assert_eq!(
        call(ops, "nope", "/sluice/admin/v1/keys/show", &show).status,
        401
    );

    let done = call(ops, TOKEN, "/sluice/admin/v1/keys/reset", &reset);
    assert_eq!(
        (done.status, done.json()["outcome"].clone()),
        (200, json!("done")),
        "{}",
        done.text()
    );
    // Fresh connections land on either worker: each sees the whole bucket back.
    assert_eq!(alice(&envoy, 6), [200, 200, 200, 200, 200, 429]);
    let again = call(ops, TOKEN, "/sluice/admin/v1/keys/reset", &reset);
    assert_eq!(again.json()["outcome"], "duplicate", "{}", again.text());
    assert_eq!(alice(&envoy, 1), [429], "applied once");

    let credit = json!({"policy": "per-user", "key": ["alice"], "reason": "test", "tokens": 2, "id": "00000000000000b2"});
    for outcome in ["done", "duplicate"] {
        let r = call(ops, TOKEN, "/sluice/admin/v1/keys/credit", &credit);
        assert_eq!(r.json()["outcome"], outcome, "{}", r.text());
    }
    assert_eq!(alice(&envoy, 3), [200, 200, 429]);
    assert_eq!(envoy.wait_for_wasm_counter("sluice.admin_writes", 4), 4);
    assert!(
        envoy
            .log()
            .contains("admin write: who=alice action=keys.reset"),
        "audited"
    );
}
