//! The seam between HTTP and storage: what one check asks of a key, what the store decided,
//! and the trait a store implements (Redis in production, anything in tests).

use std::future::Future;
use std::hash::Hasher;

use siphasher::sip128::{Hasher128, SipHasher13};
use sluice::algorithm::Kind;

/// One validated check (see `check::parse`), in the units the store computes in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// The caller's key, `[A-Za-z0-9_.:/-]{1,200}`; the store derives its own key from it.
    pub key: String,
    pub algorithm: Algorithm,
    /// Tokens (requests) the request needs: at least 1 on `/v1/check`; 0 from the RLS protocol
    /// (`hits_addend` 0) asks whether the key is over its limit without charging it.
    pub cost: u64,
    /// Tokens to take when at least `cost` are available (a lease); `cost..=` the capacity.
    /// Always `cost` for the leaky bucket.
    pub take: u64,
}

/// A caller key for a limit named by arbitrary bytes (an RLS descriptor's values, which may hold
/// any character): `<namespace>/<32 hex digits>`, the 128-bit SipHash-1-3 of the parts. Each
/// part is hashed with its length, so two different lists of parts never share a key by
/// concatenation, and the hash keeps the raw values (user ids, addresses) out of Redis.
pub fn hashed_key(namespace: &str, parts: &[&[u8]]) -> String {
    let mut hasher = SipHasher13::new();
    for part in parts {
        hasher.write_u64(part.len() as u64);
        hasher.write(part);
    }
    format!("{namespace}/{:032x}", hasher.finish128().as_u128())
}

/// An algorithm with its numbers; durations in microseconds. Windows are aligned to the Unix
/// epoch: window index = floor(now / window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// GCRA: one token per `interval_us` (at least 1), `burst` tokens of capacity.
    TokenBucket { interval_us: u64, burst: u64 },
    /// At most `limit` tokens per window.
    FixedWindow { limit: u64, window_us: u64 },
    /// The two-counter estimate of the last `window_us` at most `limit`.
    SlidingWindow { limit: u64, window_us: u64 },
    /// At most `limit` tokens in any span of `window_us` (a log of admission times).
    SlidingLog { limit: u64, window_us: u64 },
    /// Requests leave one per `interval_us`; one that would wait more than `max_delay_us` for
    /// its turn is denied, the others are admitted with their wait as a delay.
    LeakyBucket { interval_us: u64, max_delay_us: u64 },
}

impl Algorithm {
    pub fn kind(&self) -> Kind {
        match self {
            Algorithm::TokenBucket { .. } => Kind::TokenBucket,
            Algorithm::FixedWindow { .. } => Kind::FixedWindow,
            Algorithm::SlidingWindow { .. } => Kind::SlidingWindow,
            Algorithm::SlidingLog { .. } => Kind::SlidingLog,
            Algorithm::LeakyBucket { .. } => Kind::LeakyBucket,
        }
    }

    /// The name on the wire.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }
}

/// What the store decided for one check. Durations are microseconds from the store's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// Tokens taken (0 when denied).
    pub granted: u64,
    /// Whole tokens left after this decision.
    pub remaining: u64,
    /// Until the key's state is back to its idle best (bucket full, window over).
    pub reset_us: u64,
    /// Until `cost` tokens are available (0 when allowed).
    pub retry_after_us: u64,
    /// Leaky bucket only: how long the admitted request must be held (0 when denied).
    pub delay_us: Option<u64>,
}

/// Storage failed or did not answer in time; the detail goes into the 503 body and the logs,
/// the kind into the metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError {
    pub kind: FailureKind,
    pub detail: String,
}

/// Why storage failed, in as few kinds as an operator acts on differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// No answer in time (a paused or overloaded Redis, a network that drops packets).
    Timeout,
    /// No connection: refused, reset, dropped, or not made yet.
    Connection,
    /// Redis answered with an error (OOM, BUSY, READONLY, CLUSTERDOWN, a script error).
    Server,
    /// Anything else, such as an unexpected reply.
    Other,
}

impl FailureKind {
    /// The name in metrics.
    pub fn name(self) -> &'static str {
        match self {
            FailureKind::Timeout => "timeout",
            FailureKind::Connection => "connection",
            FailureKind::Server => "server",
            FailureKind::Other => "other",
        }
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}

/// Where limits live. Every call is bounded in time: it returns an error rather than hang.
pub trait Store: Send + Sync + 'static {
    /// Decides every check, in order, each atomically on its own (no atomicity across checks).
    fn check(
        &self,
        checks: &[Check],
    ) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send;

    /// Whether the store answers at all; the readiness probe (`health`).
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// One store shared by the HTTP API and the RLS.
impl<S: Store> Store for std::sync::Arc<S> {
    fn check(
        &self,
        checks: &[Check],
    ) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send {
        S::check(self, checks)
    }

    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        S::ping(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashed_keys_are_valid_caller_keys_that_tell_every_list_of_parts_apart() {
        let key = hashed_key("rls", &[b"domain", b"remote_address", b"10.0.0.1"]);
        assert_eq!(key.len(), "rls/".len() + 32);
        assert!(key.starts_with("rls/"));
        assert!(key.bytes().skip(4).all(|b| b.is_ascii_hexdigit()));
        // Stable across runs and processes: the counters of one limit must be found again.
        assert_eq!(
            key,
            hashed_key("rls", &[b"domain", b"remote_address", b"10.0.0.1"])
        );
        let others = [
            hashed_key("rls", &[b"domain", b"remote_address10.0.0.1"]),
            hashed_key("rls", &[b"domainremote_address", b"10.0.0.1"]),
            hashed_key("rls", &[b"domain", b"remote_address", b"10.0.0.2"]),
            hashed_key("rls", &[b"domain", b"remote_address", b"\xff{}"]),
            hashed_key("other", &[b"domain", b"remote_address", b"10.0.0.1"]),
        ];
        for other in others {
            assert_ne!(key, other);
        }
    }
}
