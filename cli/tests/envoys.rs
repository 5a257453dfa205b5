//! `sluice keys ... --envoy`: a local policy's key shown, reset and credited in each Envoy given,
//! through the filter's admin path (a real Envoy with two workers), tables by default and JSON
//! with `--json`; an Envoy that cannot be reached is an error of its own row. `sluice top
//! --envoy`: a local policy's heaviest keys in each Envoy, by key hash, never the API key.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::process::{Command, Output};

use serde_json::{json, Value};
use sluice_testkit::envoy::Envoy;

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

fn sluice(envoys: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .env("SLUICE_ENVOYS", envoys)
        .env("SLUICE_ADMIN_TOKEN", TOKEN)
        .env_remove("SLUICE_ADMIN_TOKEN_FILE")
        .output()
        .unwrap()
}

fn start() -> Envoy {
    let config = json!({"admin": {"listener": "ops", "token_env": "SLUICE_ADMIN_TOKEN"},
        "policies": [{"name": "api", "key": ["header:x-api-key"], "requests": 1, "per": "1h", "burst": 3}]});
    Envoy::options(&config.to_string())
        .vm_env("SLUICE_ADMIN_TOKEN", &format!("ops-bot {TOKEN}"))
        .listener_metadata("{ filter_metadata: { sluice: { listener: ops } } }")
        .concurrency(2)
        .start()
}

fn spend(envoy: &Envoy, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| envoy.get("/api/x", &[("x-api-key", b"acme")]).status)
        .collect()
}

#[test]
fn an_operator_sees_and_resets_a_local_key_in_every_envoy_given() {
    let (one, two) = (start(), start());
    assert_eq!(spend(&one, 4), [200, 200, 200, 429]);
    assert_eq!(spend(&two, 1), [200]);
    let envoys = format!("{},{}", one.addr(), two.addr());
    let key = ["--policy", "api", "--key", "acme"];

    let shown = sluice(&envoys, &[&["keys", "show", "--json"][..], &key].concat());
    assert!(shown.status.success(), "{shown:?}");
    let json: Value = serde_json::from_slice(&shown.stdout).unwrap();
    let left: Vec<&Value> = (json["envoys"].as_array().unwrap().iter())
        .map(|e| &e["answer"]["remaining"])
        .collect();
    assert_eq!(left, [&json!(0), &json!(2)], "{json}");
    assert_eq!(
        json["service"],
        Value::Null,
        "a local key: the service is not asked"
    );

    let table = sluice(&envoys, &[&["keys", "show"][..], &key].concat());
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.starts_with("ASKED"), "{text}");
    assert_eq!(text.lines().count(), 3, "{text}");

    let reset = sluice(
        &envoys,
        &[&["keys", "reset", "--reason", "INC-9"][..], &key].concat(),
    );
    assert!(reset.status.success(), "{reset:?}");
    assert_eq!(
        String::from_utf8_lossy(&reset.stdout)
            .matches("done")
            .count(),
        2
    );
    assert_eq!(spend(&one, 4), [200, 200, 200, 429]);
    // The same reset sent again (its printed --id) is applied once: nothing comes back.
    let stdout = String::from_utf8_lossy(&reset.stdout);
    let id = stdout.split_whitespace().nth(1).unwrap();
    let again = sluice(
        &envoys,
        &[
            &["keys", "reset", "--reason", "INC-9", "--id", id][..],
            &key,
        ]
        .concat(),
    );
    assert!(again.status.success(), "{again:?}");
    let again = String::from_utf8_lossy(&again.stdout);
    assert_eq!(again.matches("duplicate").count(), 2, "{again}");
    assert_eq!(spend(&one, 1), [429]);

    let unreachable = format!("{},127.0.0.1:9", one.addr());
    let partly = sluice(&unreachable, &[&["keys", "show"][..], &key].concat());
    assert!(!partly.status.success());
    assert!(
        String::from_utf8_lossy(&partly.stdout).contains("error:"),
        "{partly:?}"
    );
}

#[test]
fn an_operator_sees_a_local_policys_heaviest_keys_in_every_envoy_as_hashes_only() {
    let (one, two) = (start(), start());
    for i in 0..50 {
        let key = format!("sk-light-{i}");
        one.get("/api/x", &[("x-api-key", key.as_bytes())]);
    }
    assert_eq!(spend(&one, 10).iter().filter(|&&s| s == 429).count(), 7);
    assert_eq!(spend(&two, 5).iter().filter(|&&s| s == 429).count(), 2);
    let envoys = format!("{},{}", one.addr(), two.addr());
    let hash = format!(
        "{:016x}",
        sluice::core::key::hash_values(&["acme".into()], &sluice::core::key::HashSecret::PUBLIC)
    );
    let args = ["top", "--policy", "api", "--limit", "3", "--json"];
    let started = std::time::Instant::now();
    let json = loop {
        let out = sluice(&envoys, &args);
        assert!(out.status.success(), "{out:?}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("acme"),
            "{out:?}"
        );
        let json: Value = serde_json::from_slice(&out.stdout).unwrap();
        let counts: Vec<&Value> = (json["envoys"].as_array().unwrap().iter())
            .map(|e| &e["answer"]["keys"][0]["count"])
            .collect();
        if counts == [&json!(7), &json!(2)] {
            break json;
        }
        assert!(started.elapsed().as_secs() < 5, "{json}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    for envoy in json["envoys"].as_array().unwrap() {
        assert_eq!(envoy["answer"]["keys"][0]["key"], json!(hash), "{json}");
    }
    // Merged over both Envoys: acme's 9 refusals, the only ones, over the workers each merged
    // (a worker that recorded nothing publishes nothing: 1 or 2 per Envoy).
    let merged = &json["merged"];
    assert_eq!(merged["keys"][0]["key"], json!(hash), "{json}");
    assert_eq!(merged["keys"][0]["count"], 9, "{json}");
    assert_eq!(merged["totals"]["refused"], 9, "{json}");
    let workers: u64 = (json["envoys"].as_array().unwrap().iter())
        .map(|e| e["answer"]["workers"].as_u64().unwrap())
        .sum();
    assert_eq!(
        (&merged["envoys"], &merged["workers"]),
        (&json!(2), &json!(workers)),
        "{json}"
    );
    let table = sluice(&envoys, &args[..5]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert_eq!(text.matches("envoy ").count(), 2, "{text}");
    assert!(text.contains("all 2 Envoys answering"), "{text}");
    assert!(text.contains(&hash) && !text.contains("acme"), "{text}");
    let no_policy = sluice(&envoys, &["top"]);
    assert!(!no_policy.status.success(), "{no_policy:?}");
}
