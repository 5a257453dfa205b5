//! Every hit charged, as envoyproxy/ratelimit charges them: the `hits_addend` expectations of
//! envoyproxy/ratelimit's own tests (`test/redis/fixed_cache_impl_test.go`, the per-descriptor
//! `hits_addend` of `src/utils/utilities.go`) through the real service and Redis; sluice's
//! `charge_refused: false`; the debt of sluice's own algorithms; envoyproxy/ratelimit's
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`; and Envoy's `WEEK` override. Units of a second or a
//! minute are raised to an hour or a day, with the same numbers, so that no window ends during a
//! test.
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;
#[path = "rls/client.rs"]
mod rls;

use std::time::Duration;

use common::clock::redis_time_us;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{rate_limit, Code};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use rls::{ask, connect, request, Client, Rls};
use sluice_testkit::redis::RedisServer;

fn start(redis: &RedisServer, yaml: &str, extra: &[&str]) -> Rls {
    Rls::start(&["--redis", &redis.url()], yaml, extra)
}

/// Each descriptor's code and `limit_remaining`.
fn statuses(answer: &RateLimitResponse) -> Vec<(Code, u32)> {
    (answer.statuses.iter())
        .map(|s| (Code::try_from(s.code).unwrap(), s.limit_remaining))
        .collect()
}

/// One descriptor `(key, value)` with the request's `hits_addend`.
fn hits(key: &str, value: &str, hits_addend: u32) -> RateLimitRequest {
    request("d", &[&[(key, value)]], hits_addend)
}

/// Descriptors with their own `hits_addend`.
fn own_hits(descriptors: &[(&[(&str, &str)], u64)]) -> RateLimitRequest {
    let entries: Vec<&[(&str, &str)]> = descriptors.iter().map(|(e, _)| *e).collect();
    let mut call = request("d", &entries, 0);
    for (descriptor, (_, hits)) in call.descriptors.iter_mut().zip(descriptors) {
        descriptor.hits_addend = Some(UInt64Value { value: *hits });
    }
    call
}

/// The statuses of each call in turn.
async fn each(client: &mut Client, calls: &[RateLimitRequest]) -> Vec<Vec<(Code, u32)>> {
    let mut answers = Vec::new();
    for call in calls {
        answers.push(statuses(&ask(client, call.clone()).await));
    }
    answers
}

const OK: Code = Code::Ok;
const OVER: Code = Code::OverLimit;

const ANOTHER: &str = "domain: d
descriptors:
  - key: key2
    rate_limit: {unit: hour, requests_per_unit: 20}
  - key: strict
    rate_limit: {unit: hour, requests_per_unit: 20, charge_refused: false}
";

#[tokio::test(flavor = "multi_thread")]
async fn hits_of_3_13_3_3_on_20_leave_17_4_1_then_over_with_none_left() {
    let redis = RedisServer::start();
    let rls = start(&redis, ANOTHER, &[]);
    let mut client = connect(&rls).await;
    let calls = [3, 13, 3, 3, 1].map(|n| hits("key2", "x", n));
    let answers = each(&mut client, &calls).await;
    let expected = [(OK, 17), (OK, 4), (OK, 1), (OVER, 0), (OVER, 0)];
    assert_eq!(answers, expected.map(|s| vec![s]));
}

#[tokio::test(flavor = "multi_thread")]
async fn with_charge_refused_false_a_refused_request_takes_nothing() {
    let redis = RedisServer::start();
    let rls = start(&redis, ANOTHER, &[]);
    let mut client = connect(&rls).await;
    let calls = [3, 13, 3, 3, 1, 21].map(|n| hits("strict", "x", n));
    let answers = each(&mut client, &calls).await;
    // The 4th leaves the count at 19; the 5th fits; more than the limit only reads.
    let expected = [(OK, 17), (OK, 4), (OK, 1), (OVER, 1), (OK, 0), (OVER, 0)];
    assert_eq!(answers, expected.map(|s| vec![s]));
}

const BASIC: &str = "domain: d
descriptors:
  - key: one_per_minute
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: strict_one
    rate_limit: {unit: hour, requests_per_unit: 1, charge_refused: false}
";

#[tokio::test(flavor = "multi_thread")]
async fn a_check_of_zero_hits_is_refused_while_the_count_is_over() {
    let redis = RedisServer::start();
    let rls = start(&redis, BASIC, &[]);
    let mut client = connect(&rls).await;
    let calls = [0, 1, 0, 1, 0].map(|n| own_hits(&[(&[("one_per_minute", "x")], n)]));
    let codes: Vec<Code> = (each(&mut client, &calls).await.iter())
        .map(|answer| answer[0].0)
        .collect();
    assert_eq!(codes, [OK, OK, OK, OVER, OVER]);
    let strict = [0, 1, 0, 1, 0].map(|n| own_hits(&[(&[("strict_one", "x")], n)]));
    let codes: Vec<Code> = (each(&mut client, &strict).await.iter())
        .map(|answer| answer[0].0)
        .collect();
    assert_eq!(codes, [OK, OK, OK, OVER, OK], "charge_refused: false");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shadow_mode_limit_is_charged_past_its_limit_and_never_refuses() {
    let redis = RedisServer::start();
    let yaml = "domain: d\ndescriptors:\n  - key: shadow\n    shadow_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 10}\n";
    let rls = start(&redis, yaml, &[]);
    let mut client = connect(&rls).await;
    let calls = [7, 5, 0, 1].map(|n| own_hits(&[(&[("shadow", "x")], n)]));
    let answers = each(&mut client, &calls).await;
    let expected = [(OK, 3), (OK, 0), (OK, 0), (OK, 0)];
    assert_eq!(answers, expected.map(|s| vec![s]));
}

/// envoyproxy/ratelimit's `TestNearLimit` cases of `hits_addend` above 1: the count before,
/// the hits, the limit, and its answer.
#[tokio::test(flavor = "multi_thread")]
async fn hits_addend_above_one_is_decided_as_envoyproxy_ratelimit_decides_it() {
    let redis = RedisServer::start();
    let yaml = "domain: d
descriptors:
  - key: key5
    rate_limit: {unit: hour, requests_per_unit: 20}
  - key: key6
    rate_limit: {unit: hour, requests_per_unit: 8}
  - key: key10
    rate_limit: {unit: hour, requests_per_unit: 10}
";
    let rls = start(&redis, yaml, &[]);
    let mut client = connect(&rls).await;
    let cases = [
        ("key5", "all under the limit", 2, 3, (OK, 15)),
        ("key6", "some near the limit", 5, 2, (OK, 1)),
        ("key5", "all near the limit", 16, 3, (OK, 1)),
        ("key5", "some over the limit", 19, 3, (OVER, 0)),
        ("key5", "some in all three places", 15, 7, (OVER, 0)),
        ("key10", "all over the limit", 27, 3, (OVER, 0)),
    ];
    for (case, (key, name, before, hits_addend, expected)) in cases.into_iter().enumerate() {
        let value = case.to_string();
        if before > 0 {
            ask(&mut client, hits(key, &value, before)).await;
        }
        let answer = ask(&mut client, hits(key, &value, hits_addend)).await;
        assert_eq!(statuses(&answer), [expected], "{name}");
    }
}

/// envoyproxy/ratelimit's `TestRedis` cases of per-descriptor `hits_addend`: 0 on a descriptor
/// without a limit, 1 on one at its limit; 0 on a limit already over, 1 on another over.
#[tokio::test(flavor = "multi_thread")]
async fn per_descriptor_hits_addend_checks_each_descriptor_at_its_own_hits() {
    let redis = RedisServer::start();
    let yaml = "domain: d
descriptors:
  - key: key2
    descriptors:
      - key: subkey2
        rate_limit: {unit: hour, requests_per_unit: 10}
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 10}
    descriptors:
      - key: subkey3
        rate_limit: {unit: day, requests_per_unit: 10}
";
    let rls = start(&redis, yaml, &[]);
    let mut client = connect(&rls).await;
    let sub2: &[(&str, &str)] = &[("key2", "value2"), ("subkey2", "subvalue2")];
    ask(&mut client, own_hits(&[(sub2, 10)])).await;
    let answer = ask(
        &mut client,
        own_hits(&[(&[("key2", "value2")], 0), (sub2, 1)]),
    )
    .await;
    assert_eq!(statuses(&answer), [(OK, 0), (OVER, 0)]);
    assert!(answer.statuses[0].current_limit.is_none(), "no limit there");
    let key3: &[(&str, &str)] = &[("key3", "value3")];
    let sub3: &[(&str, &str)] = &[("key3", "value3"), ("subkey3", "subvalue3")];
    ask(&mut client, own_hits(&[(key3, 11), (sub3, 12)])).await;
    let answer = ask(&mut client, own_hits(&[(key3, 0), (sub3, 1)])).await;
    assert_eq!(statuses(&answer), [(OVER, 0), (OVER, 0)]);
}

/// envoyproxy/ratelimit's `TestOverLimitWithStopCacheKeyIncrementWhenOverlimitConfig`: two
/// limits of 15 and 14 an hour at 10 each, then hits of 1, 2 and 2 each.
async fn stop_cache_key_increment_case(client: &mut Client) -> Vec<Vec<(Code, u32)>> {
    let both = |n| own_hits(&[(&[("key4", "value4")], n), (&[("key5", "value5")], n)]);
    each(client, &[both(10), both(1), both(2), both(2), both(0)]).await
}

const STOP_CACHE: &str = "domain: d
descriptors:
  - key: key4
    rate_limit: {unit: hour, requests_per_unit: 15}
  - key: key5
    rate_limit: {unit: hour, requests_per_unit: 14}
";

#[tokio::test(flavor = "multi_thread")]
async fn stop_cache_key_increment_when_overlimit_charges_only_the_limit_that_goes_over() {
    let redis = RedisServer::start();
    let rls = start(
        &redis,
        STOP_CACHE,
        &["--stop-cache-key-increment-when-overlimit"],
    );
    let mut client = connect(&rls).await;
    let answers = stop_cache_key_increment_case(&mut client).await;
    assert_eq!(
        answers[1..4],
        [
            vec![(OK, 4), (OK, 3)],
            vec![(OK, 2), (OK, 1)],
            vec![(OK, 2), (OVER, 0)],
        ]
    );
    assert_eq!(
        answers[4],
        [(OK, 2), (OVER, 0)],
        "key4 was not charged: 13 of 15"
    );
    // Without the flag, both are charged: key4 at 15 of 15.
    let plain = Rls::start(
        &["--redis", &redis.url()],
        &STOP_CACHE.replace("domain: d", "domain: e"),
        &[],
    );
    let mut client = connect(&plain).await;
    let both = |n| {
        let mut call = own_hits(&[(&[("key4", "value4")], n), (&[("key5", "value5")], n)]);
        call.domain = "e".into();
        call
    };
    let answers = each(&mut client, &[both(10), both(1), both(2), both(2), both(0)]).await;
    assert_eq!(answers[4], [(OK, 0), (OVER, 0)], "key4 charged: 15 of 15");
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_cache_key_increment_when_overlimit_is_read_from_envoyproxy_ratelimits_variable() {
    let redis = RedisServer::start();
    let dir = sluice_testkit::TempDir::new("rls-stop-cache");
    std::fs::write(dir.path().join("limits.yaml"), STOP_CACHE).unwrap();
    let config = dir.path().to_string_lossy().into_owned();
    let url = redis.url();
    let args = [
        "--redis",
        &url,
        "--rls",
        "127.0.0.1:0",
        "--rls-config",
        &config,
    ];
    let env = [("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")];
    let service = sluice_testkit::service::Launcher::default().start_rls(&args, &env);
    let address = format!("http://{}", service.rls.unwrap());
    let mut client = rls::Client::connect(address).await.unwrap();
    let answers = stop_cache_key_increment_case(&mut client).await;
    assert_eq!(answers[4], [(OK, 2), (OVER, 0)]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_bucket_owes_its_refused_hits_and_pays_them_back_at_its_rate() {
    let redis = RedisServer::start();
    // 10 every 2 s, a bucket of 10: 25 at once are refused and 20 charged, 10 past empty.
    let yaml = "domain: d\ndescriptors:\n  - key: bucket\n    rate_limit: {algorithm: token_bucket, requests_per_unit: 10, per: 2s}\n";
    let rls = start(&redis, yaml, &[]);
    let mut client = connect(&rls).await;
    let started = std::time::Instant::now();
    let answer = ask(&mut client, hits("bucket", "x", 25)).await;
    assert_eq!(statuses(&answer), [(OVER, 0)]);
    let asking = || own_hits(&[(&[("bucket", "x")], 0)]);
    assert_eq!(statuses(&ask(&mut client, asking()).await), [(OVER, 0)]);
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    if started.elapsed() < Duration::from_millis(1_900) {
        let owing = ask(&mut client, asking()).await;
        assert_eq!(statuses(&owing), [(OVER, 0)], "half the debt paid back");
    }
    tokio::time::sleep(Duration::from_millis(2_500).saturating_sub(started.elapsed())).await;
    let paid = ask(&mut client, hits("bucket", "x", 1)).await;
    assert_eq!(statuses(&paid)[0].0, OK, "the debt paid back at 5 a second");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sliding_windows_debt_fades_with_the_window() {
    let redis = RedisServer::start();
    let yaml = "domain: d\ndescriptors:\n  - key: sliding\n    rate_limit: {algorithm: sliding_window, requests_per_unit: 10, per: 1s}\n  - key: strict\n    rate_limit: {algorithm: sliding_window, requests_per_unit: 10, per: 1s, charge_refused: false}\n";
    let rls = start(&redis, yaml, &[]);
    let mut client = connect(&rls).await;
    let mut redis_client = redis.client();
    // Start early in a window, so that both calls fall in it.
    let now = redis_time_us(&mut redis_client);
    let into = now % 1_000_000;
    if into > 300_000 {
        tokio::time::sleep(Duration::from_micros(1_000_000 - into + 20_000)).await;
    }
    let both = |hits_addend| request("d", &[&[("sliding", "x")], &[("strict", "x")]], hits_addend);
    let answer = ask(&mut client, both(15)).await;
    assert_eq!(
        statuses(&answer),
        [(OVER, 0), (OVER, 10)],
        "strict: only read"
    );
    // 100 ms into the next window the 15 charged still count 13.5: over, even asking; the strict
    // limit charged nothing. 700 ms in, they count 4.5: room again.
    let now = redis_time_us(&mut redis_client);
    let next = (now / 1_000_000 + 1) * 1_000_000;
    tokio::time::sleep(Duration::from_micros(next + 100_000 - now)).await;
    let answer = ask(&mut client, both(0)).await;
    let codes: Vec<Code> = statuses(&answer).iter().map(|s| s.0).collect();
    assert_eq!(codes, [OVER, OK], "13.5 of 10, and 0");
    let now = redis_time_us(&mut redis_client);
    tokio::time::sleep(Duration::from_micros((next + 700_000).saturating_sub(now))).await;
    let answer = ask(&mut client, hits("sliding", "x", 1)).await;
    assert_eq!(statuses(&answer)[0].0, OK, "faded to 4.5");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_limit_override_of_a_week_is_a_fixed_window_of_seven_days_that_charges_every_hit() {
    let redis = RedisServer::start();
    let rls = start(&redis, ANOTHER, &[]);
    let mut client = connect(&rls).await;
    let weekly = |hits_addend| {
        let mut call = hits("tenant", "acme", hits_addend);
        call.descriptors[0].limit = Some(RateLimitOverride {
            requests_per_unit: 2,
            unit: rate_limit::Unit::Week.into(),
        });
        call
    };
    let answers = each(&mut client, &[weekly(1), weekly(2), weekly(0)]).await;
    assert_eq!(answers, [vec![(OK, 1)], vec![(OVER, 0)], vec![(OVER, 0)]]);
    let answer = ask(&mut client, weekly(0)).await;
    let limit = answer.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(limit.unit, i32::from(rate_limit::Unit::Week));
    let until = answer.statuses[0].duration_until_reset.unwrap();
    assert!((1..=7 * 86_400).contains(&until.seconds), "{until:?}");
}
