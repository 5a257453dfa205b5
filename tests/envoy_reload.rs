//! The plugin configuration changes while Envoy serves, delivered two ways, each scenario run
//! through both: a file-based LDS resource (the whole listener), and a file-based ECDS resource
//! (the filter alone, as Istio delivers wasm filters). Each change is a new file renamed over the
//! old one, as Envoy wants file-based xDS changed. Envoy builds a new filter chain (LDS) or a new
//! filter config (ECDS) with the new plugin configuration (same vm_id, same code: the same VMs,
//! a new root context).
//!
//! - No request fails across the switches: client threads keep sending throughout, and none
//!   meets a connection error or a 5xx; a refused configuration leaves the old one serving.
//! - Bucket state follows the slot layout: shared data is per vm_id, page names depend only on
//!   the plugin name and the key, and records carry their layout's tag (the policies' names and
//!   columns). A changed burst keeps the layout, so a key keeps what it spent; a renamed policy is
//!   a new layout with fresh buckets.

// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use sluice_testkit::envoy::Envoy;
use sluice_testkit::reload::{config, failures, statuses, wait_for_config, Traffic};
use std::time::Duration;

/// Where the plugin configuration comes from.
#[derive(Clone, Copy, Debug)]
enum Delivery {
    Lds,
    Ecds,
}

fn start(plugin_json: &str, delivery: Delivery) -> Envoy {
    let options = Envoy::options(plugin_json);
    match delivery {
        Delivery::Lds => options.lds_from_file(),
        Delivery::Ecds => options.ecds_from_file(),
    }
    .start()
}

#[test]
fn the_plugin_configuration_changes_under_traffic_and_no_request_fails_through_lds() {
    changes_under_traffic(Delivery::Lds);
}

#[test]
fn the_plugin_configuration_changes_under_traffic_and_no_request_fails_through_ecds() {
    changes_under_traffic(Delivery::Ecds);
}

#[test]
fn a_changed_burst_keeps_what_a_key_spent_and_a_renamed_policy_starts_fresh_through_lds() {
    bucket_state_across_changes(Delivery::Lds);
}

#[test]
fn a_changed_burst_keeps_what_a_key_spent_and_a_renamed_policy_starts_fresh_through_ecds() {
    bucket_state_across_changes(Delivery::Ecds);
}

fn changes_under_traffic(delivery: Delivery) {
    let mut envoy = start(&config("v0", "per-user", 5), delivery);
    let traffic = Traffic::start(envoy.addr());
    let mut switches = 0;
    for (round, burst) in [6, 7, 8, 9, 10, 11].into_iter().enumerate() {
        std::thread::sleep(Duration::from_millis(150));
        let version = format!("v{}", round + 1);
        envoy
            .update_plugin(&config(&version, "per-user", burst))
            .unwrap();
        wait_for_config(&envoy, "per-user", burst);
        switches += 1;
    }
    // A configuration the filter refuses: Envoy rejects the update and the last one serves on.
    let refused = envoy.update_plugin(&config("bad", "per-user", 0));
    assert!(refused.is_err(), "burst 0 was accepted");
    wait_for_config(&envoy, "per-user", 11);
    std::thread::sleep(Duration::from_millis(150));
    let outcomes = traffic.finish();

    let failed = failures(&outcomes);
    eprintln!(
        "{} requests across {switches} switches and a refused update, {} failed",
        outcomes.len(),
        failed.len()
    );
    assert!(
        outcomes.len() >= 100,
        "too little traffic: {}",
        outcomes.len()
    );
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(10)]
    );
    assert!(
        envoy
            .log()
            .contains("invalid configuration: policies[0].burst"),
        "no configuration error in the log"
    );
}

fn bucket_state_across_changes(delivery: Delivery) {
    let mut envoy = start(&config("v1", "per-user", 5), delivery);
    let traffic = Traffic::start(envoy.addr());
    assert_eq!(statuses(&envoy, "alice", 3), [200, 200, 200]);

    // Same name, same key: the same slots. The bucket is a GCRA timestamp, so alice keeps her
    // 3 spent requests under the new burst: 8 - 3 = 5 left, not 8.
    envoy.update_plugin(&config("v2", "per-user", 8)).unwrap();
    wait_for_config(&envoy, "per-user", 8);
    assert_eq!(
        statuses(&envoy, "alice", 6),
        [200, 200, 200, 200, 200, 429],
        "the state did not carry over"
    );

    // A renamed policy is a new slot layout: alice starts again with a full bucket of 8.
    envoy
        .update_plugin(&config("v3", "per-user-v3", 8))
        .unwrap();
    wait_for_config(&envoy, "per-user-v3", 8);
    let mut expected = vec![200; 8];
    expected.push(429);
    assert_eq!(
        statuses(&envoy, "alice", 9),
        expected,
        "a renamed policy kept state"
    );

    // Back to the old name: the old slots are still in shared data (Envoy never frees them), so
    // alice finds her old bucket again, with 0 left of 8.
    envoy.update_plugin(&config("v4", "per-user", 8)).unwrap();
    wait_for_config(&envoy, "per-user", 8);
    assert_eq!(
        statuses(&envoy, "alice", 1),
        [429],
        "the old slots were gone"
    );

    let outcomes = traffic.finish();
    let failed = failures(&outcomes);
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(10)]
    );
}
