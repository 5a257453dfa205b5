//! `--check`: the replayed answer to each request against Envoy's own, from the log's
//! `response_code`. sluice denies with 429; anything else Envoy answered was not a sluice denial.
//! A log from a one-worker Envoy running the same local configuration agrees on every request; an
//! upstream that itself answers 429 shows up as a disagreement.

use crate::engine::Decided;
use crate::log::Record;

/// The status of a sluice denial.
pub const DENIED: u32 = 429;
/// Disagreements listed in the report; the rest are only counted.
pub const LISTED: usize = 20;

#[derive(Debug, Default)]
pub struct Check {
    /// Requests whose line has a response code.
    pub compared: u64,
    pub agreed: u64,
    /// The first `LISTED` disagreements.
    pub disagreements: Vec<Disagreement>,
}

/// A request whose replayed answer differs from Envoy's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disagreement {
    pub line: u64,
    pub replayed_denied: bool,
    pub response_code: u32,
}

impl Check {
    pub fn add(&mut self, record: &Record, decided: &Decided) {
        let Some(code) = record.response_code else {
            return;
        };
        self.compared += 1;
        let replayed_denied = decided.outcome.is_denied();
        if replayed_denied == (code == DENIED) {
            self.agreed += 1;
        } else if self.disagreements.len() < LISTED {
            self.disagreements.push(Disagreement {
                line: record.line,
                replayed_denied,
                response_code: code,
            });
        }
    }

    pub fn all_agree(&self) -> bool {
        self.agreed == self.compared
    }
}
