//! `--check`: the replayed answer to each request against Envoy's own. A line with
//! `response_code_details` (`%RESPONSE_CODE_DETAILS%`) says whether sluice refused the request
//! (`sluice_rate_limited`, `sluice_unavailable`) whatever the status and the protocol (a gRPC
//! refusal is a 200 with a `grpc-status`). A line with only `response_code` is compared by status:
//! a replayed refusal agrees when Envoy answered with its status (the policy's `denial` status, or
//! 503 for a policy that fails closed), a request replayed as passed when Envoy answered with none
//! of the statuses this configuration refuses with, so an upstream that answers one of those
//! shows up as a disagreement. A log from a one-worker Envoy running the same local
//! configuration agrees on every request.

use crate::engine::Decided;
use crate::log::Record;
use sluice::config::{OnFailure, Plan, Scope};
use sluice::output::reply::Refusal;

/// Disagreements listed in the report; the rest are only counted.
pub const LISTED: usize = 20;

#[derive(Debug, Default)]
pub struct Check {
    /// Requests whose line has a response code or its details.
    pub compared: u64,
    pub agreed: u64,
    /// The first `LISTED` disagreements.
    pub disagreements: Vec<Disagreement>,
    /// Every status the configuration refuses with.
    refusal_statuses: Vec<u32>,
}

/// A request whose replayed answer differs from Envoy's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disagreement {
    pub line: u64,
    /// The replayed refusal's status, `None` when the request passed.
    pub replayed: Option<u32>,
    pub response_code: Option<u32>,
    pub details: Option<String>,
}

/// A replayed refusal: its status and its response code details.
type Refused = Option<(u32, &'static str)>;

impl Check {
    pub fn new(plan: &Plan) -> Check {
        let fails_closed = plan
            .policies
            .iter()
            .any(|p| p.scope == Scope::Global(OnFailure::Closed));
        let mut refusal_statuses: Vec<u32> =
            plan.policies.iter().map(|p| p.denial.status).collect();
        refusal_statuses.extend(fails_closed.then_some(503));
        Check {
            refusal_statuses,
            ..Check::default()
        }
    }

    pub fn add(&mut self, plan: &Plan, record: &Record, decided: &Decided) {
        let details = record.response_code_details();
        if details.is_none() && record.response_code.is_none() {
            return;
        }
        self.compared += 1;
        let refused = refusal(plan, decided);
        let agreed = match (details, record.response_code) {
            (Some(details), _) => {
                let sluices = [
                    Refusal::RateLimited.details(),
                    Refusal::Unavailable.details(),
                ];
                let envoy = sluices.into_iter().find(|d| d.as_bytes() == details);
                refused.map(|(_, d)| d) == envoy
            }
            (None, Some(code)) => match refused {
                Some((status, _)) => code == status,
                None => !self.refusal_statuses.contains(&code),
            },
            (None, None) => true,
        };
        if agreed {
            self.agreed += 1;
        } else if self.disagreements.len() < LISTED {
            self.disagreements.push(Disagreement {
                line: record.line,
                replayed: refused.map(|(status, _)| status),
                response_code: record.response_code,
                details: details.map(|d| String::from_utf8_lossy(d).into_owned()),
            });
        }
    }

    pub fn all_agree(&self) -> bool {
        self.agreed == self.compared
    }
}

/// How the filter would have refused the request, if it would have: the same choice of denial
/// and of answer as the filter's.
fn refusal(plan: &Plan, decided: &Decided) -> Refused {
    let denial = decided.outcome.refused_by()?;
    let refusal = Refusal::of(&denial);
    let policy = plan.policies.get(denial.policy)?;
    Some((refusal.status(&policy.denial), refusal.details()))
}
