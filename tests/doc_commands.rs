//! The command transcripts of the docs, run as a user types them: each ```` ```console ```` block
//! of docs/*.md, after the `make` target its page starts before it (`make run-rls`, served on
//! free ports, the commands' ports replaced) or else at the repo root, must print what the page
//! shows (`sluice_testkit::docs` says how they are compared). docs/replay.md's are run by
//! replay/tests/docs.rs, with the replay's own build. `make test` has built the wasm and the
//! service before the tests run, so the targets' build steps are no-ops here.
#![cfg(not(target_arch = "wasm32"))]
// A test binary: panicking is how it reports failure, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use sluice_testkit::docs::{files, transcripts};
use sluice_testkit::make::{sh, Serving};
use sluice_testkit::repo_root;

#[test]
fn every_transcript_of_the_docs_prints_what_the_page_shows() {
    let pages = files("docs", &["md"]).into_iter();
    let mut run = Vec::new();
    for path in pages.filter(|p| !p.ends_with("replay.md")) {
        let page = path
            .strip_prefix(repo_root())
            .unwrap()
            .display()
            .to_string();
        let markdown = std::fs::read_to_string(&path).unwrap();
        if every_transcript_prints_what_it_shows(&page, &markdown) > 0 {
            run.push(page);
        }
    }
    assert!(run.contains(&"docs/rls.md".to_string()), "{run:?}");
}

/// A transcript that disagrees is run once more, on a fresh start of its target: on a machine
/// too busy, Envoy's first calls to the RLS can outlast the filter's 100 ms `timeout` and pass
/// by its `failure_mode_deny: false`, which a user typing the commands never sees.
const ATTEMPTS: usize = 2;

/// Runs the transcripts of `markdown`, the page `page`: how many there were.
fn every_transcript_prints_what_it_shows(page: &str, markdown: &str) -> usize {
    let found = transcripts(markdown);
    for transcript in &found {
        let attempt = || match transcript.serving.as_deref().map(Serving::start) {
            Some(serving) => transcript.run(page, |command| serving.sh(command)),
            None => transcript.run(page, sh),
        };
        let mut outcome = attempt();
        for _ in 1..ATTEMPTS {
            let Err(disagreement) = &outcome else { break };
            eprintln!("{disagreement}\n(trying once more, on a fresh start)");
            outcome = attempt();
        }
        if let Err(disagreement) = outcome {
            panic!("{disagreement}");
        }
    }
    found.len()
}
