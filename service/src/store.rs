//! The seam between HTTP and storage: what one check asks of a bucket, what the store decided,
//! and the trait a store implements (Redis in production, anything in tests).

use std::future::Future;

/// One validated token-bucket check (see `check::parse`), in the units the store computes in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// The caller's key, `[A-Za-z0-9_.:/-]{1,200}`; the store derives its own key from it.
    pub key: String,
    /// Microseconds per token (at least 1).
    pub interval_us: u64,
    /// Capacity in tokens.
    pub burst: u64,
    /// Tokens the request needs.
    pub cost: u64,
    /// Tokens to take when at least `cost` are available (a lease); `cost..=burst`.
    pub take: u64,
}

/// What the store decided for one bucket. Durations are microseconds from the store's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// Tokens taken (0 when denied).
    pub granted: u64,
    /// Whole tokens left after this decision.
    pub remaining: u64,
    /// Until the bucket is full again.
    pub reset_us: u64,
    /// Until `cost` tokens are available (0 when allowed).
    pub retry_after_us: u64,
}

/// Storage failed or did not answer in time; the detail goes into the 503 body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError(pub String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where buckets live. Every call is bounded in time: it returns an error rather than hang.
pub trait Store: Send + Sync + 'static {
    /// Decides every bucket, in order, each atomically on its own (no atomicity across buckets).
    fn check(
        &self,
        buckets: &[Bucket],
    ) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send;

    /// Whether the store answers at all.
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}
