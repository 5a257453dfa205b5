//! The operator console (`/admin/console`, issue 35) in a real headless browser, Debian's
//! `chromium` (`--dump-dom` after a virtual 5 s): with the read-only token in the page's
//! fragment, the policy's allowed and refused counts, the key of a flood on top of its refusals
//! and an override are on the page; without a token, or with a wrong one, no data is.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::bucket;
use sluice_testkit::browser::Browser;
use sluice_testkit::http::send_with;
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::{AdminTokens, Service};
use sluice_testkit::TempDir;

const HEAVY: &str = "api/00000000000000aa";

fn start(dir: &TempDir) -> Service {
    let tokens = AdminTokens::write(dir);
    let args: Vec<&str> = ["--memory"].into_iter().chain(tokens.args()).collect();
    Service::start_with(&args, &[])
}

/// 50 keys one check each of a bucket of 5, and `HEAVY` 30: 25 refused.
fn flood(service: &Service) {
    for i in 0..50u64 {
        let light = format!("api/{:016x}", 0x1000 + i);
        service.check(&[bucket(&light, 1, 60_000, 5, 1, 1)]);
    }
    for _ in 0..30 {
        service.check(&[bucket(HEAVY, 1, 60_000, 5, 1, 1)]);
    }
}

/// The page's DOM once its scripts have had 5 s of (virtual) time.
fn dom(service: &Service, dir: &TempDir, fragment: &str) -> String {
    let profile = dir.path().join(format!("chromium-{}", fragment.len()));
    let url = format!("http://{}/admin/console{fragment}", service.addr);
    let started = Instant::now();
    let output = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--virtual-time-budget=5000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(&url)
        .output()
        .expect("chromium (scripts/ensure-deps chromium)");
    assert!(output.status.success(), "{output:?}");
    assert!(started.elapsed() < Duration::from_secs(60));
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn the_console_shows_a_floods_top_key_and_nothing_without_a_token() {
    let dir = TempDir::new("console");
    let service = start(&dir);
    flood(&service);

    let set = serde_json::json!({"key": "api/00000000000000bb", "requests": 100, "per_ms": 60_000,
        "burst": 100, "owner": "accounts", "reason": "premium plan", "expires_in_ms": 3_600_000});
    let headers: &[(&str, &[u8])] = &[
        ("authorization", b"Bearer adm1n-token"),
        ("content-type", b"application/json"),
    ];
    let body = set.to_string();
    let set = send_with(
        service.addr,
        "POST",
        "/admin/v1/overrides",
        headers,
        body.as_bytes(),
    );
    assert_eq!(set.status, 200, "{set:?}");

    let page = dom(&service, &dir, "#token=rEad-token");
    let top = page
        .split(r#"<table class="top" data-policy="api">"#)
        .nth(1);
    let top = top.unwrap_or_else(|| panic!("no top keys table: {page}"));
    let first = top.split("<tr>").nth(2).unwrap();
    assert!(
        first.starts_with(r#"<td class="n">1</td><td class="key">00000000000000aa</td>"#),
        "{first}"
    );
    assert!(page.contains(r#"<td class="key">api</td>"#), "{page}");
    assert!(page.contains("% refused"), "{page}");
    assert!(page.contains("Store: answering"), "{page}");
    // The hour's refusals as text, a mark per 5 min: all of them in the slot under way.
    let chart = page.split(r#"<td class="bar chart" title=""#).nth(1);
    let chart = chart.unwrap_or_else(|| panic!("no chart: {page}"));
    assert!(
        chart.starts_with("0 0 0 0 0 0 0 0 0 0 0 0 25 refused\">............█</td>"),
        "{chart}"
    );
    assert!(
        !page.contains("rEad-token"),
        "the token stays out of the page"
    );

    for fragment in ["", "#token=wrong"] {
        let page = dom(&service, &dir, fragment);
        assert!(!page.contains("00000000000000aa"), "{fragment}: {page}");
        assert!(!page.contains("premium plan"), "{fragment}: {page}");
        let said = if fragment.is_empty() {
            "Give a token to see the data."
        } else {
            "Cannot read the admin API: 401 unauthorized"
        };
        assert!(page.contains(said), "{fragment}: {page}");
    }
}

#[test]
fn the_page_holds_no_data_and_allows_nothing_from_elsewhere() {
    let dir = TempDir::new("console-page");
    let service = start(&dir);
    let page = send_with(service.addr, "GET", "/admin/console", &[], b"");
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let policy = page.header("content-security-policy").unwrap();
    assert!(policy.starts_with("default-src 'none'"), "{policy}");
    assert!(policy.contains("connect-src 'self'"), "{policy}");
    assert_eq!(page.header("x-frame-options"), Some("DENY"));
    for path in ["/admin/v1/top", "/admin/console/", "/admin/consolex"] {
        let response = send_with(service.addr, "GET", path, &[], b"");
        assert_eq!(response.status, 401, "{path}: {response:?}");
    }
    let post = send_with(service.addr, "POST", "/admin/console", &[], b"");
    assert_eq!(post.status, 401, "{post:?}");
    let without_admin = Service::start_memory();
    let none = send_with(without_admin.addr, "GET", "/admin/console", &[], b"");
    assert_eq!(none.status, 404, "{none:?}");
}

#[test]
fn the_console_says_when_the_store_stops_answering() {
    let mut redis = RedisServer::start();
    let dir = TempDir::new("console-redis");
    let tokens = AdminTokens::write(&dir);
    let url = redis.url();
    let args: Vec<&str> = ["--redis", &url].into_iter().chain(tokens.args()).collect();
    let service = Service::start_with(&args, &[]);
    assert!(dom(&service, &dir, "#token=rEad-token").contains("Store: answering"));
    redis.stop();
    // Readiness follows Redis within 750 ms (a PING every 250 ms, each bounded to 500 ms).
    std::thread::sleep(Duration::from_millis(1500));
    let page = dom(&service, &dir, "#token=rEad-token");
    assert!(page.contains("Store: not answering ("), "{page}");
}

fn admin_post(service: &Service, path: &str, body: &serde_json::Value) {
    let headers: &[(&str, &[u8])] = &[
        ("authorization", b"Bearer adm1n-token"),
        ("content-type", b"application/json"),
    ];
    let response = send_with(
        service.addr,
        "POST",
        path,
        headers,
        body.to_string().as_bytes(),
    );
    assert_eq!(response.status, 200, "{response:?}");
}

/// The key cells of the page's ranking of `api`'s refusals.
const RANKED: &str = r#"[...document.querySelectorAll('table.top[data-policy="api"] td.key')].map((td) => td.textContent)"#;

#[test]
fn an_operator_sees_the_flood_and_debt_then_resets_and_overrides_from_the_page() {
    let dir = TempDir::new("console-actions");
    let service = start(&dir);
    flood(&service);
    // A key charged 20 past its check: 15 over its 5, 10 of them owed (max_debt).
    let owing = "api/00000000000000cc";
    service.check(&[bucket(owing, 1, 60_000, 5, 1, 1)]);
    let charge = serde_json::json!({"settlements": [{"key": owing, "algorithm": "token_bucket", "requests": 1, "per_ms": 60_000,
        "burst": 5, "op": "charge", "tokens": 20, "max_debt": 10}]});
    admin_post(&service, "/v1/settle", &charge);
    // A filter's worker says who it is on a call, as it does every 10 s.
    let said: &[(&str, &[u8])] = &[
        ("content-type", b"application/json"),
        ("x-sluice-envoy", b"edge-a"),
        ("x-sluice-worker", b"00000000000000a1"),
        ("x-sluice-dropped", b"7"),
    ];
    let body = serde_json::json!({"checks": [bucket(owing, 1, 60_000, 5, 1, 1)]}).to_string();
    let call = send_with(service.addr, "POST", "/v1/check", said, body.as_bytes());
    assert_eq!(call.status, 200, "{call:?}");

    let url = format!("http://{}/admin/console#token=adm1n-token", service.addr);
    let mut page = Browser::open(&url, &dir.path().join("chromium-actions"));
    // Within 5 s of the page's opening (the browser's own start is no part of the page's time).
    page.wait_for(
        &format!("{RANKED}[0] === '00000000000000aa'"),
        Duration::from_secs(5),
    );
    page.wait_for(
        r#"[...document.querySelectorAll('#debts td')].map((td) => td.textContent).join(' ').startsWith('api 00000000000000cc 10 0 ')"#,
        Duration::from_secs(10),
    );

    page.wait_for(
        r#"[...document.querySelectorAll('#fleet td')].map((td) => td.textContent).join(' ').match(/^edge-a \d+ 1 7$/) !== null"#,
        Duration::from_secs(10),
    );
    assert_eq!(
        page.eval("document.getElementById('fleet-summary').textContent"),
        "Envoys that called this replica in the last minute: 1; settlements their workers \
         dropped (undelivered to the service): 7."
    );

    // A change the API refuses says why on the page, and changes nothing: one from a read-only
    // token, and one without a reason.
    let reset =
        "document.querySelector('table.top[data-policy=\"api\"] tr:nth-child(2) button').click()";
    let done =
        |said: &str| format!("document.getElementById('done').textContent.startsWith({said:?})");
    let read_url = format!("http://{}/admin/console#token=rEad-token", service.addr);
    let mut reader = Browser::open(&read_url, &dir.path().join("chromium-read"));
    reader.wait_for(
        &format!("{RANKED}[0] === '00000000000000aa'"),
        Duration::from_secs(10),
    );
    reader.eval("document.getElementById('reason').value = 'just looking'");
    reader.eval(reset);
    let forbidden = "Reset api/00000000000000aa failed: 403 forbidden";
    reader.wait_for(&done(forbidden), Duration::from_secs(10));
    drop(reader);
    page.eval(reset);
    let unreasoned = "Reset api/00000000000000aa failed: 400 bad_request: reason: required";
    page.wait_for(&done(unreasoned), Duration::from_secs(10));
    assert_eq!(page.eval(&format!("{RANKED}[0]")), "00000000000000aa");

    // Reset from the page: the key is whole again, and no longer ranked among the refused.
    page.eval("document.getElementById('reason').value = 'customer escalation 4711'");
    page.eval(reset);
    page.wait_for(
        "document.getElementById('done').textContent === 'Reset api/00000000000000aa: done'",
        Duration::from_secs(10),
    );
    page.wait_for(
        &format!("!{RANKED}.includes('00000000000000aa')"),
        Duration::from_secs(10),
    );
    let after = service.check(&[bucket(HEAVY, 1, 60_000, 5, 1, 1)]);
    assert_eq!(
        (&after[0]["allowed"], &after[0]["remaining"]),
        (&serde_json::json!(true), &serde_json::json!(4)),
        "{after:?}"
    );

    // An override set from the page's form, then deleted from its row.
    page.eval(
        "for (const [id, value] of [['override-key', 'api/00000000000000dd'], \
         ['override-requests', '100'], ['override-burst', '100'], ['override-owner', 'accounts']]) \
         document.getElementById(id).value = value; \
         document.querySelector('#override button').click()",
    );
    let listed =
        "[...document.querySelectorAll('#overrides td.key')].map((td) => td.textContent).join()";
    page.wait_for(
        &format!("{listed} === 'api/00000000000000dd'"),
        Duration::from_secs(10),
    );
    page.eval("document.querySelector('#overrides tbody button').click()");
    page.wait_for(&format!("{listed} === ''"), Duration::from_secs(10));
    assert_eq!(
        page.eval("document.getElementById('done').textContent"),
        "Delete the override of api/00000000000000dd: done"
    );
}
