//! Keyed hashing through real Envoys (`--concurrency 2`): the operator's secret reaches the wasm
//! VM from Envoy's environment (`hash_secret_env`, `vm_config.environment_variables`); keys an
//! attacker crafted offline to land on a victim's slots land there no more once a secret is set;
//! and Envoys given the same secret name a key the same to sluice-service, while an Envoy
//! without one names it by the public key as before.

// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use serde_json::{json, Value};
use sluice::core::key::{hash_values, HashSecret};
use sluice::state::table::{TableSpec, PAGE_SLOTS};
use sluice_testkit::envoy::{Envoy, EnvoyOptions};
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::Service;

const VARIABLE: &str = "SLUICE_HASH_SECRET";
const SECRET: &str = "f1e2d3c4b5a69788f1e2d3c4b5a69788-test-only";
/// 1,024 pages of 32 keys: a key lands in a victim's page by chance once in 1,024.
const MAX_KEYS: u32 = 32_768;

/// One token an hour, per `x-user-id`: a key that made its request is drained.
fn config(extra: Value) -> String {
    let mut config = json!({"policies": [{"name": "per-user", "key": ["header:x-user-id"],
        "requests": 1, "per": "1h", "burst": 1, "max_keys": MAX_KEYS}]});
    for (k, v) in extra.as_object().unwrap() {
        config[k] = v.clone();
    }
    config.to_string()
}

fn with_secret(config: &str) -> EnvoyOptions {
    Envoy::options(config).vm_env(VARIABLE, SECRET)
}

fn get(envoy: &Envoy, user: &str) -> u16 {
    envoy
        .get("/api/x", &[("x-user-id", user.as_bytes())])
        .status
}

/// The page of `user` under `secret`.
fn page_of(user: &str, secret: &HashSecret) -> u32 {
    let spec = TableSpec::new(Vec::new(), MAX_KEYS, 1, false, (0, 0));
    spec.page_of(hash_values(&[user.to_string()], secret))
}

/// `n` user ids an attacker who hashes under `secret` finds, offline, to land in the victim's
/// page.
fn crafted_against(secret: &HashSecret, victim: &str, n: usize) -> Vec<String> {
    let target = page_of(victim, secret);
    (0..)
        .map(|i| format!("crafted-{i}"))
        .filter(|user| page_of(user, secret) == target)
        .take(n)
        .collect()
}

#[test]
fn a_secret_variable_that_is_missing_or_short_is_refused_naming_the_field() {
    let config = config(json!({"hash_secret_env": VARIABLE}));
    let missing = Envoy::try_start(&config).err().unwrap();
    assert!(
        missing.contains(
            r#"invalid configuration: hash_secret_env: environment variable "SLUICE_HASH_SECRET" is not set"#
        ),
        "{missing}"
    );
    let short = Envoy::options(&config)
        .vm_env(VARIABLE, "too-short")
        .try_start();
    let log = short.err().unwrap();
    assert!(log.contains("SLUICE_HASH_SECRET holds 9 bytes"), "{log}");
    assert!(!log.contains("too-short"), "the secret is never logged");
}

#[test]
fn keys_crafted_against_the_built_in_constant_no_longer_reach_a_victim_once_a_secret_is_set() {
    let secret = HashSecret::from_text(SECRET.as_bytes());
    let aimed = crafted_against(&HashSecret::PUBLIC, "alice", PAGE_SLOTS);
    let alice = page_of("alice", &secret);
    let landed = aimed.iter().filter(|user| page_of(user, &secret) == alice);
    assert!(landed.count() < PAGE_SLOTS / 2, "the secret scatters them");
    let envoy = with_secret(&config(json!({"hash_secret_env": VARIABLE}))).start();
    assert_eq!([get(&envoy, "alice"), get(&envoy, "alice")], [200, 429]);
    for user in &aimed {
        assert_eq!([get(&envoy, user), get(&envoy, user)], [200, 429]);
    }
    assert_eq!(get(&envoy, "alice"), 429, "alice stays drained");
    // The same attack aimed at the secret itself (by someone who knew it) frees her: a page
    // full of drained keys leaves no record but the oldest, hers, to forget.
    for user in &crafted_against(&secret, "alice", PAGE_SLOTS) {
        assert_eq!([get(&envoy, user), get(&envoy, user)], [200, 429]);
    }
    assert_eq!(
        get(&envoy, "alice"),
        200,
        "forgotten: why the secret must stay one"
    );
}

#[test]
fn envoys_given_the_same_secret_agree_on_global_keys_and_one_without_uses_the_public_key() {
    let redis = RedisServer::start();
    let service = Service::start(&redis.url());
    let global = |secret: Option<&str>| {
        let mut fields = json!({"global": {"cluster": "sluice_service",
            "authority": "sluice-service", "timeout": "100ms"}});
        if secret.is_some() {
            fields["hash_secret_env"] = json!(VARIABLE);
        }
        let mut config: Value = serde_json::from_str(&config(fields)).unwrap();
        config["policies"][0]["scope"] = json!("global");
        config["policies"][0]["burst"] = json!(3);
        let options = Envoy::options(&config.to_string()).service(&[service.addr]);
        match secret {
            Some(secret) => options.vm_env(VARIABLE, secret).start(),
            None => options.start(),
        }
    };
    let (first, second) = (global(Some(SECRET)), global(Some(SECRET)));
    let shared: Vec<u16> = (0..6)
        .map(|i| get(if i % 2 == 0 { &first } else { &second }, "alice"))
        .collect();
    assert_eq!(
        shared,
        [200, 200, 200, 429, 429, 429],
        "one budget across both"
    );
    let public = global(None);
    assert_eq!(
        get(&public, "alice"),
        200,
        "another name for alice: her own budget"
    );

    let keys = format!("{:?}", redis.client().cmd(&["KEYS", "*"]));
    let named = |secret: &HashSecret| {
        let hash = hash_values(&["alice".to_string()], secret);
        format!("per-user/{hash:016x}")
    };
    let secret = HashSecret::from_text(SECRET.as_bytes());
    assert!(keys.contains(&named(&secret)), "{keys}");
    assert!(keys.contains(&named(&HashSecret::PUBLIC)), "{keys}");
}
