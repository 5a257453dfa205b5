//! What recording a decision in the top keys (`sluice_service::top`) costs on a check's path,
//! and what a full recorder weighs: `cargo run --release -p sluice-service --example top_cost`.
//! Prints ns per record (the best of 7 runs) for a flood of distinct keys, one hot key, and the allowed path, then
//! the RSS growth of filling every policy's every slot with distinct keys.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::hint::black_box;
use std::time::Instant;

use sluice_service::stores::{Algorithm, Namespace};
use sluice_service::top::{Record, TopRecorder, What, MAX_POLICIES};

const N: u64 = 2_000_000;

fn record(policy: &str, key: u64, refused: bool) -> Record<'_> {
    Record {
        namespace: Namespace::Http,
        policy: (policy, ""),
        key,
        what: if refused {
            What::Refused
        } else {
            What::Allowed
        },
        consumed: u64::from(!refused),
        // As a check records it: the limit its state is under.
        limit: Some(Algorithm::TokenBucket {
            interval_us: 1_000,
            burst: 5,
        }),
    }
}

/// The fastest of 7 runs of `N` records (the machine is shared: the others measure the
/// neighbours), each in a fresh recorder.
fn time(name: &str, key: impl Fn(u64) -> (u64, bool)) {
    let best = (0..7)
        .map(|_| {
            let recorder = TopRecorder::default();
            let started = Instant::now();
            for i in 0..N {
                let (k, refused) = key(i);
                recorder.record_at(i / 100_000, &record("per-user", k, refused), || None);
            }
            started.elapsed().as_nanos() as f64 / N as f64
        })
        .fold(f64::MAX, f64::min);
    println!("{name}: {best:.1} ns per record");
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn main() {
    let mix = |i: u64| i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    time("refusals of distinct keys", |i| (mix(i), true));
    time("refusals of one hot key", |_| (7, true));
    time("allowed, distinct keys", |i| (mix(i), false));
    time("allowed, 1,000 keys", |i| (mix(i % 1_000), false));

    let before = rss_kib();
    let full = TopRecorder::default();
    let names: Vec<String> = (0..MAX_POLICIES).map(|i| format!("policy-{i}")).collect();
    // Every slot of both rings: 65 minutes of 10 s steps, 400 distinct keys per step.
    for step in 0..390u64 {
        for name in &names {
            for k in 0..400u64 {
                let key = mix(step * 1_000 + k);
                full.record_at(step * 10, &record(name, key, k % 2 == 0), || None);
            }
        }
    }
    black_box(&full);
    let grown = rss_kib().saturating_sub(before);
    println!("{MAX_POLICIES} policies, every slot full: RSS grew {grown} KiB");
}
