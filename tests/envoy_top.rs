//! The heaviest keys (issue 35) through real Envoys (two), the real sluice-service and a real
//! Redis: among 200 API keys of one request each, the one flooding both Envoys is on top of its
//! global policy's refusals and consumption in the service's merged view within 5 s, shown as
//! the key hash the access log writes, and its API key is never shown (not by the API, not in
//! the service's log; `sluice top` prints what the API answers, cli/tests/cli.rs).
//!
//! `local`: the filter's own top keys of local policies (`POST <admin path>/top`) in one Envoy
//! with two workers: a flood of 20,000 distinct keys, each refused once, with three heavy keys
//! among them; the heavy keys are the top three by refusals within 5 s of the flood, their
//! counts within the answer's stated error, a user shown as `admin.top_show` lets it be, and an
//! API key only as its hash. On the public listener the path is an ordinary request, forwarded.

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
    read(service, &format!("/admin/v1/top?{query}"))
}

fn read(service: &Service, path: &str) -> Value {
    let bearer = format!("Bearer {READ_TOKEN}");
    let headers: &[(&str, &[u8])] = &[("authorization", bearer.as_bytes())];
    let response = send_with(service.addr, "GET", path, headers, b"");
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
        .map(|i| {
            Envoy::options(&config())
                .node_id(&format!("edge-{i}"))
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

    // Both Envoys said who they are on their calls: each worker that called, nothing dropped.
    let fleet = read(&service, "/admin/v1/envoys");
    assert_eq!(fleet["called_last_minute"], 2, "{fleet}");
    assert_eq!(fleet["settlements_dropped"], 0, "{fleet}");
    for (i, envoy) in fleet["envoys"].as_array().unwrap().iter().enumerate() {
        assert_eq!(envoy["envoy"], format!("edge-{i}"), "{fleet}");
        assert!(envoy["last_call_s"].as_u64().unwrap() <= 10, "{fleet}");
        assert_eq!(envoy["workers"], 2, "{fleet}");
    }

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

mod local {
    //! The filter's top keys of local policies: see the module's comment.

    use serde_json::{json, Value};
    use sluice::core::key::{hash_values, HashSecret};
    use sluice_testkit::envoy::{admin_bootstrap, Envoy, EnvoyOptions};
    use sluice_testkit::http::{send_with, Connection, Response};
    use std::net::SocketAddr;
    use std::time::{Duration, Instant};

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";
    const READ: &str = "fedcba9876543210fedcba9876543210";
    const TOP: &str = "/sluice/admin/v1/top";
    /// Distinct light keys per policy: each sends two requests, the second refused.
    const LIGHT: usize = 10_000;
    /// The heavy keys (API key, user) and their requests: all but the first refused.
    type Heavy = (&'static str, &'static str, usize);
    const HEAVY: [Heavy; 3] = [
        ("sk-heavy-one", "hu-one", 1_500),
        ("sk-heavy-two", "hu-two", 1_000),
        ("sk-heavy-three", "hu-three", 600),
    ];
    /// Requests in all.
    const REQUESTS: usize = 2 * LIGHT + 1_500 + 1_000 + 600;
    /// Connections sending at once, and the requests each sends on one connection.
    const SENDERS: usize = 4;
    const PER_CONNECTION: usize = 250;

    fn start() -> Envoy {
        let config = json!({"admin": {"listener": "ops", "token_env": "SLUICE_ADMIN_TOKEN",
                                      "read_token_env": "SLUICE_READ_TOKEN", "top_show": ["header:x-user"]},
            "policies": [
                {"name": "per-key", "key": ["header:x-api-key"], "requests": 1, "per": "1h",
                 "max_keys": 50_000},
                {"name": "per-user", "key": ["header:x-user"], "requests": 1, "per": "1h",
                 "max_keys": 50_000}]});
        let bootstrap = admin_bootstrap(
            &config.to_string(),
            &["SLUICE_ADMIN_TOKEN", "SLUICE_READ_TOKEN"],
        );
        EnvoyOptions::bootstrap(&bootstrap)
            .vm_env("SLUICE_ADMIN_TOKEN", &format!("alice {TOKEN}"))
            .vm_env("SLUICE_READ_TOKEN", READ)
            .concurrency(2)
            .start()
    }

    /// Every request of the flood, as (API key, user): each light key twice, the heavy keys spread
    /// among them, dealt round-robin to `SENDERS` connections.
    fn flood() -> Vec<Vec<(String, String)>> {
        let mut senders = vec![Vec::new(); SENDERS];
        // A light key's two requests go one after the other on one sender: the first is
        // admitted, the second refused, whichever worker takes each.
        for i in 0..LIGHT {
            for _ in 0..2 {
                senders[i % SENDERS].push((format!("sk-light-{i}"), format!("user-{i}")));
            }
        }
        // Every heavy request but the first (sent before the flood), spread over the senders.
        for (key, user, times) in HEAVY {
            for n in 1..times {
                let sender = &mut senders[n % SENDERS];
                let at = n * sender.len() / times;
                sender.insert(at, (key.into(), user.into()));
            }
        }
        senders
    }

    fn send_flood(addr: SocketAddr) -> usize {
        let threads: Vec<_> = (flood().into_iter())
            .map(|requests| {
                std::thread::spawn(move || {
                    let mut connection = Connection::open(addr).unwrap();
                    let mut refused = 0;
                    for (n, (key, user)) in requests.iter().enumerate() {
                        // A new connection every `PER_CONNECTION` requests: the kernel spreads
                        // them over both workers.
                        if n > 0 && n % PER_CONNECTION == 0 {
                            connection = Connection::open(addr).unwrap();
                        }
                        let headers: &[(&str, &[u8])] =
                            &[("x-api-key", key.as_bytes()), ("x-user", user.as_bytes())];
                        let response = match connection.send("GET", "/api", headers) {
                            Ok(response) => response,
                            Err(_) => {
                                connection = Connection::open(addr).unwrap();
                                connection.send("GET", "/api", headers).unwrap()
                            }
                        };
                        refused += usize::from(response.status == 429);
                    }
                    refused
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).sum()
    }

    fn call(addr: SocketAddr, token: &str, body: &Value) -> Response {
        let bearer = format!("Bearer {token}");
        let headers: &[(&str, &[u8])] = &[
            ("authorization", bearer.as_bytes()),
            ("content-type", b"application/json"),
        ];
        send_with(addr, "POST", TOP, headers, body.to_string().as_bytes())
    }

    fn hash(value: &str) -> String {
        format!("{:016x}", hash_values(&[value.into()], &HashSecret::PUBLIC))
    }

    /// The top three of `policy` by refusals once they are the heavy keys of `column` (at most
    /// 5 s), with the time it took.
    fn heavy_on_top(ops: SocketAddr, policy: &str, column: fn(&Heavy) -> &'static str) -> Value {
        let expected: Vec<String> = HEAVY.iter().map(|h| hash(column(h))).collect();
        let started = Instant::now();
        loop {
            let answer = call(ops, READ, &json!({"policy": policy, "limit": 3}));
            assert_eq!(answer.status, 200, "{}", answer.text());
            let answer = answer.json();
            let keys: Vec<String> = (answer["keys"].as_array().unwrap().iter())
                .map(|k| k["key"].as_str().unwrap_or_default().to_string())
                .collect();
            // Each worker publishes once a second: done when every decision is in.
            let totals = &answer["totals"];
            let decided =
                totals["allowed"].as_u64().unwrap_or(0) + totals["refused"].as_u64().unwrap_or(0);
            if keys == expected && decided == REQUESTS as u64 {
                return answer;
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "the heavy keys are not the top three of {policy}, every decision counted, within 5 s: {answer}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    #[test]
    fn three_heavy_keys_top_a_flood_of_20_000_distinct_keys_by_refusals_within_5_s() {
        let envoy = start();
        let ops = envoy.listener_addr("ops");
        for (key, user, _) in HEAVY {
            let headers: &[(&str, &[u8])] =
                &[("x-api-key", key.as_bytes()), ("x-user", user.as_bytes())];
            assert_eq!(envoy.get("/api", headers).status, 200);
        }
        let started = Instant::now();
        let refused = send_flood(envoy.addr());
        let flood_s = started.elapsed().as_secs_f64();
        let heavy_refused: usize = HEAVY.iter().map(|h| h.2 - 1).sum();
        assert_eq!(refused, LIGHT + heavy_refused);
        eprintln!(
            "flood: {} requests in {flood_s:.1} s",
            2 * LIGHT + HEAVY.iter().map(|h| h.2).sum::<usize>()
        );

        let waited = Instant::now();
        for (policy, column) in [
            ("per-key", (|h: &Heavy| h.0) as fn(&Heavy) -> &'static str),
            ("per-user", |h: &Heavy| h.1),
        ] {
            let answer = heavy_on_top(ops, policy, column);
            assert_eq!(answer["workers"], 2, "{answer}");
            // Every light key's second request, and every heavy key's but its first.
            let refused = answer["totals"]["refused"].as_u64().unwrap();
            assert_eq!(refused, (LIGHT + heavy_refused) as u64, "{answer}");
            let bound = answer["error_bound"].as_u64().unwrap();
            // The stated bound: at most 2 W / 64 for W the refusals.
            assert!(bound <= 2 * refused / 64, "{answer}");
            for (key, heavy) in answer["keys"].as_array().unwrap().iter().zip(HEAVY) {
                let (count, error) = (
                    key["count"].as_u64().unwrap(),
                    key["error"].as_u64().unwrap(),
                );
                let truth = heavy.2 as u64 - 1;
                assert!(
                    count >= truth && count - error <= truth,
                    "{key} of {answer}"
                );
                assert!(error <= bound, "{key} of {answer}");
            }
            for (key, heavy) in answer["keys"].as_array().unwrap().iter().zip(HEAVY) {
                let shown = match policy {
                    "per-key" => "header:x-api-key=#".to_string(),
                    _ => format!("header:x-user={}", heavy.1),
                };
                assert_eq!(key["shown"], json!(shown), "{answer}");
            }
            assert!(
                !answer.to_string().contains("sk-"),
                "an API key in clear: {answer}"
            );
        }
        eprintln!(
            "top three seen {:.1} s after the flood",
            waited.elapsed().as_secs_f64()
        );

        // The consumption view: every key's first request.
        let consumed = call(
            ops,
            READ,
            &json!({"policy": "per-key", "by": "consumed", "window": "1h"}),
        );
        let consumed = consumed.json();
        let totals = &consumed["totals"];
        assert_eq!(totals["consumed"], totals["allowed"], "{consumed}");
        assert_eq!(totals["allowed"], LIGHT + HEAVY.len(), "{consumed}");
        assert!(!consumed.to_string().contains("sk-"), "{consumed}");

        // The minute's log record (written by one worker, at its first board and then once a
        // minute) names keys by their hash only: no API key, no user, shown or not.
        let log = envoy.log();
        assert!(
            !log.contains("sk-heavy") && !log.contains("hu-one"),
            "{log}"
        );
        if let Some(line) = log
            .lines()
            .find(|l| l.contains("top refused keys: policy=per-key"))
        {
            assert!(line.contains("window=1m allowed="), "{line}");
            eprintln!("logged: {line}");
        }

        // Without a token, 401; on the public listener, an ordinary request (forwarded).
        assert_eq!(call(ops, "nope", &json!({"policy": "per-key"})).status, 401);
        let public = call(envoy.addr(), TOKEN, &json!({"policy": "per-key"}));
        assert_eq!((public.status, public.text()), (200, "upstream".into()));
    }
}
