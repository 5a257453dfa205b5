//! docs/replay.md's command transcripts, run as a user types them at the repo root: each
//! ```` ```console ```` block must print what the page shows (`sluice_testkit::docs` says how
//! they are compared), `cargo run --release -p sluice-replay --` being this build's
//! `sluice-replay` (the same code; `make test` does not build the release profile).
#![cfg(not(target_arch = "wasm32"))]
// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use sluice_testkit::docs::transcripts;
use sluice_testkit::make::sh;

const PAGE: &str = include_str!("../../docs/replay.md");
const CARGO_RUN: &str = "cargo run --release -p sluice-replay --";

#[test]
fn every_transcript_of_docs_replay_md_prints_what_the_page_shows() {
    let found = transcripts(PAGE);
    assert!(found.len() >= 3, "docs/replay.md: {found:?}");
    for transcript in found {
        assert_eq!(transcript.serving, None, "the replay needs no server");
        let ran = transcript.run("docs/replay.md", |command| {
            assert!(command.contains(CARGO_RUN), "{command}");
            sh(&command.replace(CARGO_RUN, env!("CARGO_BIN_EXE_sluice-replay")))
        });
        ran.unwrap_or_else(|disagreement| panic!("{disagreement}"));
    }
}
