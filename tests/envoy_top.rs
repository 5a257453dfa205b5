//! The heaviest keys (issue 35) through real Envoys (two), the real sluice-service and a real
//! Redis: among 200 API keys of one request each, the one flooding both Envoys is on top of its
//! global policy's refusals and consumption in the service's merged view within 5 s, shown as
//! the key hash the access log writes, and its API key is never shown (not by the API, not in
//! the service's log; `sluice top` prints what the API answers, cli/tests/cli.rs).

// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_testkit::envoy::Envoy;
use sluice_testkit::http::send_with;
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::{AdminTokens, Service, READ_TOKEN};
use sluice_testkit::TempDir;

const HEAVY: &[u8] = b"sk-live-heavy-0123456789";

fn config() -> String {
    json!({
        "global": {"cluster": "sluice_service", "authority": "sluice-service", "timeout": "500ms"},
        "policies": [{"name": "per-key", "scope": "global", "key": ["header:x-api-key"],
                      "requests": 1, "per": "1h", "burst": 3}],
    })
    .to_string()
}

fn top(service: &Service, query: &str) -> Value {
    let bearer = format!("Bearer {READ_TOKEN}");
    let headers: &[(&str, &[u8])] = &[("authorization", bearer.as_bytes())];
    let path = format!("/admin/v1/top?{query}");
    let response = send_with(service.addr, "GET", &path, headers, b"");
    assert_eq!(response.status, 200, "{response:?}");
    response.json()
}

#[test]
fn the_key_flooding_two_envoys_is_on_top_of_the_services_view_as_its_hash_only() {
    let redis = RedisServer::start();
    let dir = TempDir::new("envoy-top");
    let tokens = AdminTokens::write(&dir);
    let url = redis.url();
    let store = ["--redis", &url, "--top-log-every", "1"];
    let args: Vec<&str> = store.into_iter().chain(tokens.args()).collect();
    let service = Service::start_with(&args, &[]);
    let log = r#"{"text_format": "%FILTER_STATE(wasm.sluice:PLAIN)%\n"}"#;
    let envoys: Vec<Envoy> = (0..2)
        .map(|_| {
            Envoy::options(&config())
                .service(&[service.addr])
                .access_log(log)
                .start()
        })
        .collect();

    for i in 0..200 {
        let key = format!("sk-live-light-{i}");
        let status = envoys[i % 2]
            .get("/api/x", &[("x-api-key", key.as_bytes())])
            .status;
        assert_eq!(status, 200);
    }
    let started = Instant::now();
    let statuses: Vec<u16> = (0..40)
        .map(|i| envoys[i % 2].get("/api/x", &[("x-api-key", HEAVY)]).status)
        .collect();
    let refused = statuses.iter().filter(|&&s| s == 429).count() as u64;
    assert_eq!(refused, 37, "{statuses:?}");

    // The access log's key of a refusal is the key the service shows (100 light and 20 heavy
    // requests went to the first Envoy, one line each).
    let line = envoys[0]
        .access_log(120)
        .into_iter()
        .find(|l| l.contains("outcome=denied"));
    let line = line.expect("a denial in the access log");
    let hash = line.split("key=").nth(1).unwrap()[..16].to_string();

    // The service counts the refusals it decides: once told a key is over, each Envoy worker
    // refuses it by itself until the time given, without a call (docs/global.md). So the heavy
    // key is refused by the service once or twice per Envoy, and no other key at all.
    let ranked = loop {
        let ranked = top(&service, "policy=per-key&by=refused&window=1m&limit=5");
        if ranked["keys"][0]["key"] == hash.as_str() || started.elapsed() > Duration::from_secs(5) {
            break ranked;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(started.elapsed() <= Duration::from_secs(5), "{ranked}");
    assert_eq!(ranked["keys"][0]["key"], hash.as_str(), "{ranked}");
    let by_service = ranked["keys"][0]["count"].as_u64().unwrap();
    assert!((2..=4).contains(&by_service), "{ranked}");
    assert_eq!(ranked["keys"].as_array().unwrap().len(), 1, "{ranked}");
    assert_eq!(ranked["keys"][0]["error"], 0, "{ranked}");
    assert_eq!(ranked["totals"]["refused"], by_service, "{ranked}");
    assert_eq!(ranked["totals"]["allowed"], 203, "{ranked}");
    // By consumption, it took its burst of 3; the 200 light keys one each, in a sketch of 64.
    let consumed = top(&service, "policy=per-key&by=consumed&window=1h&limit=64");
    assert_eq!(consumed["keys"][0]["key"], hash.as_str(), "{consumed}");
    let (count, error) = (&consumed["keys"][0]["count"], &consumed["keys"][0]["error"]);
    let (count, error) = (count.as_u64().unwrap(), error.as_u64().unwrap());
    assert!(count >= 3 && count - error <= 3, "{consumed}");
    assert!(error <= 203 / 64, "{consumed}");

    let logged = service
        .event("top refused keys", Duration::from_secs(5))
        .expect("the minute's record");
    assert_eq!(logged["top"], format!("{hash}={by_service}"), "{logged}");
    let rest = service.lines(Duration::from_millis(300)).join("\n");
    for shown in [
        ranked.to_string(),
        consumed.to_string(),
        logged.to_string(),
        rest,
    ] {
        assert!(!shown.contains("sk-live"), "an API key shown: {shown}");
    }
}
