//! The Node that runs the wasm32 tests (scripts/wasi-runner.mjs, under `make test`): before
//! anything builds, `scripts/ensure-deps node` takes one of 18.17 or newer, Debian 12's 18.20.4
//! included, and stops an older one with what to do rather than letting the runner fail later.
//! The Nodes here are stand-ins on PATH that only answer `--version`, as a node of that version
//! would: one that is present is never replaced, so nothing gets installed.
#![cfg(not(target_arch = "wasm32"))]
// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};

use sluice_testkit::{repo_root, TempDir};

#[test]
fn debians_node_18_20_4_is_taken() {
    let out = ensure_node_with("v18.20.4");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out), "");
}

#[test]
fn node_18_17_0_the_first_with_wasi_without_a_flag_is_taken() {
    assert!(ensure_node_with("v18.17.0").status.success());
    assert!(ensure_node_with("v24.1.0").status.success());
}

#[test]
fn node_18_16_1_stops_make_with_the_version_it_needs() {
    let out = ensure_node_with("v18.16.1");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("is version 18.16.1, older than the 18.17 that make needs"),
        "{said}"
    );
    assert!(
        said.contains("Install nodejs 18.17 or newer and put it first on PATH, then make again."),
        "{said}"
    );
}

/// `scripts/ensure-deps node` with a node on PATH that says `version`.
fn ensure_node_with(version: &str) -> Output {
    let bin = TempDir::new("node-version");
    let node = bin.path().join("node");
    std::fs::write(&node, format!("#!/bin/sh\necho {version}\n")).unwrap();
    std::fs::set_permissions(&node, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap()
    );
    Command::new(repo_root().join("scripts/ensure-deps"))
        .arg("node")
        .env("PATH", path)
        .output()
        .expect("scripts/ensure-deps runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
