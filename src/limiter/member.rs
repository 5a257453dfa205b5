//! A member of a work: one applicable policy, the tier it runs at for the key, and what the
//! service said of it. The deciders (`local`, `global`) judge members; a `Work` groups them.

use super::Basis;
use crate::config::Tier;
use crate::core::algorithm::Decision;
use crate::wire::protocol::Answer;

/// One applicable policy of a work.
#[derive(Debug)]
pub(super) struct Member {
    pub policy: usize,
    pub tier: Tier,
    /// The limit enforced locally while the service cannot answer (global fail-open policies).
    pub emergency: Tier,
    pub service: Service,
    /// Whether the policy enforces for this key (else it runs in shadow for it).
    pub enforced: bool,
    /// A global concurrency policy's slot, named when the service is first asked for it.
    pub slot: Option<u64>,
    /// Tokens the request takes: the policy's cost, or what a metered policy reserves for it.
    pub cost: u64,
}

/// A member's verdict: `None` while only the service can give it.
pub(super) type Verdict = Option<(Decision, Basis)>;

/// What a global member knows from the service for this request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Service {
    /// Not asked yet.
    Ask,
    Answered(Answer),
    /// The call failed, or the service is known to be failing.
    Failed,
}
