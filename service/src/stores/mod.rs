//! The seam between HTTP and storage: what one check asks of a key, what the store decided,
//! what a request settles after its admission, and the trait a store implements (Redis in
//! production, anything in tests).

pub mod memory;
pub mod memory_slots;
pub mod quota;
pub mod redis;
pub mod settled_ids;

use std::fmt::Write;
use std::future::Future;
use std::hash::Hasher;

use siphasher::sip128::{Hasher128, SipHasher13};
use sluice::core::algorithm::{self as filter, Kind};
use sluice::core::calendar::Calendar;
use sluice::core::key::HashSecret;

use self::quota::{Demand, QuotaReport};

/// The most tokens a key may owe past its limit (`SettleOp::Charge`'s `max_debt`): as many as
/// the largest burst.
pub const MAX_DEBT: u64 = 1_000_000_000;
/// Largest bucket (burst × interval). The Lua scripts compute in doubles, exact only below
/// 2^53; with this bound, `now + capacity` stays below 2^53 µs until past the year 2100. It is
/// the filter's own bound (2^62 ns), so every bucket the filter accepts is accepted here.
pub const MAX_CAPACITY_US: u64 = (1 << 62) / 1000;

/// One validated check (see `check::parse`), in the units the store computes in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Whose key it is: a key of one protocol never names a counter of the other.
    pub namespace: Namespace,
    /// The caller's key, `[A-Za-z0-9_.:/-]{1,200}`; the store derives its own key from it
    /// (`state_key`).
    pub key: String,
    pub algorithm: Algorithm,
    /// Tokens (requests) the request needs: at least 1 on `/v1/check`; 0 from the RLS protocol
    /// (`hits_addend` 0) asks whether the key is over its limit without charging it.
    pub cost: u64,
    /// Tokens to take when at least `cost` are available (a lease); `cost..=` the capacity, or
    /// below `cost` (0: reserve nothing, a response's usage is settled later). Always `cost` for
    /// the leaky bucket; for concurrency, the slots to take (0: only ask), or to give back.
    pub take: u64,
    /// The most tokens the key may owe past its limit: a check whose `cost` does not fit is
    /// charged anyway, up to that bound, and answered refused with `granted` = the tokens
    /// charged (`sluice::core::algorithm::Algorithm::owe`). 0: a refused check takes nothing. The
    /// leaky bucket never owes. The RLS gives a limit's capacity (envoyproxy/ratelimit charges
    /// every hit); `/v1/check` gives 0.
    pub debt: u64,
    /// Concurrency only (other algorithms ignore it): whose slots `take` names.
    pub slots: Slots,
    /// The limit whose state this check decides when it is not `algorithm`: a check under an
    /// override (`admin::overrides`) decides its key's state under the key's own limit, so that
    /// the usage so far carries over when the override comes and goes. `None`: `algorithm`'s.
    pub state_of: Option<Algorithm>,
}

/// Which slots a concurrency check takes (`cost` of them must be free, `take` are taken) or
/// gives back.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Slots {
    /// Slots the store names itself, each unique: the RLS's hits.
    #[default]
    Anonymous,
    /// The one slot of this name (`/v1/check`: unique per request, by which the filter releases
    /// and renews it). A check that names a slot already live takes it again, counted once.
    Named(String),
    /// Gives back `take` slots, those that expire soonest: the RLS's negative hits (Envoy's
    /// `is_negative_hits` when a stream is done). Always admitted.
    GiveBack,
}

/// The system clock in microseconds since the epoch (0 before 1970): what the service's own
/// computations around a check read (calendar boundaries, a shown debt); decisions use Redis's
/// `TIME`.
pub fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Who named a key: `POST /v1/check` callers or the RLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Namespace {
    Http,
    Rls,
}

/// Where a check's state lives, in every store: `sluice:{<key>}:<identity>` for HTTP keys,
/// `sluice:rls:{<key>}:<identity>` for the RLS's. The hash tag is the caller key, so a check's
/// state lives in one Cluster slot; the namespaces never meet (an HTTP key cannot hold `{`);
/// and the algorithm's `identity` makes a counter the state of the algorithm and numbers that
/// wrote it alone: a check with other numbers on the same caller key has a state of its own.
pub fn state_key(check: &Check) -> String {
    let mut key = String::new();
    write_state_key(&mut key, check);
    key
}

/// `state_key` written over `out`: a store that looks states up by it can keep one buffer
/// rather than allocate a key per check.
pub fn write_state_key(out: &mut String, check: &Check) {
    let algorithm = check.state_of.as_ref().unwrap_or(&check.algorithm);
    write_key(out, check.namespace, &check.key, algorithm);
}

/// `state_key` of the state a settlement settles: the one its check wrote.
pub fn settled_key(settlement: &Settlement) -> String {
    let mut key = String::new();
    let (namespace, algorithm) = (settlement.namespace, &settlement.algorithm);
    write_key(&mut key, namespace, &settlement.key, algorithm);
    key
}

/// Where a settlement's `id` is remembered once it has been applied (`SETTLED_TTL_MS`), if it
/// has one: `sluice:{<key>}:settled/<id>`, the hash tag of the state it settles, so that one
/// script on one Cluster slot reads and writes both. No state key ends so: `settled` is no
/// algorithm's name.
pub fn settled_id_key(settlement: &Settlement) -> Option<String> {
    let id = settlement.id.as_ref()?;
    Some(format!(
        "{}{{{}}}:settled/{id}",
        prefix(settlement.namespace),
        settlement.key
    ))
}

/// A named slot's tombstone: `sluice:{<key>}:released/<slot>`, in the Cluster slot of the
/// slots' state (the same hash tag). Set when a slot is released that no check had taken (the
/// filter gave up on the check and released its slot before the check came), for a lease: a
/// check naming it meanwhile takes nothing. No state key ends so: `released` is no algorithm's
/// name.
pub fn released_key(namespace: Namespace, key: &str, slot: &str) -> String {
    format!("{}{{{key}}}:released/{slot}", prefix(namespace))
}

/// How long a settlement's `id` is remembered after it was applied: longer than it can come
/// again. The filter sends a settlement whose answer was lost again for up to
/// `sluice::remote::outbox::GIVE_UP` (30 s) after it made it, each call given up after
/// `sluice::remote::outbox::CALL_TIMEOUT` (5 s): its last copy reaches the service within 35 s of the
/// first, the service's own retry within a second. Twice the give-up leaves room for a late
/// timer and a slow network; longer only costs memory, one small key per settlement.
pub const SETTLED_TTL_MS: u64 = 2 * sluice::remote::outbox::GIVE_UP / 1_000_000;

fn write_key(out: &mut String, namespace: Namespace, key: &str, algorithm: &Algorithm) {
    out.clear();
    out.push_str(prefix(namespace));
    out.push('{');
    out.push_str(key);
    out.push_str("}:");
    algorithm.write_identity(out);
}

fn prefix(namespace: Namespace) -> &'static str {
    match namespace {
        Namespace::Http => "sluice:",
        Namespace::Rls => "sluice:rls:",
    }
}

/// A caller key for a limit named by arbitrary bytes (an RLS descriptor's values, which may hold
/// any character): 32 hex digits, the 128-bit SipHash-1-3 of the parts under `secret`. Each part
/// is hashed with its length, so two different lists of parts never share a key by
/// concatenation, and the hash keeps the raw values (user ids, addresses) out of Redis; under an
/// operator's secret nobody else can compute which key is whose.
pub fn hashed_key(secret: &HashSecret, parts: &[&[u8]]) -> String {
    hashed_key_of(secret, parts.iter().copied())
}

/// `hashed_key` of the parts one at a time, as they come.
pub fn hashed_key_of<'p>(secret: &HashSecret, parts: impl Iterator<Item = &'p [u8]>) -> String {
    let mut hasher = SipHasher13::new_with_key(&secret.to_bytes());
    for part in parts {
        hasher.write_u64(part.len() as u64);
        hasher.write(part);
    }
    let hash = hasher.finish128().as_u128();
    // `{:032x}`, without the formatting machinery.
    (0..32)
        .rev()
        .map(|digit| char::from_digit(((hash >> (digit * 4)) & 0xf) as u32, 16).unwrap_or('0'))
        .collect()
}

/// An algorithm with its numbers; durations in microseconds. Windows are aligned to the Unix
/// epoch: window index = floor(now / window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// GCRA: one token per `interval_us` (at least 1), `burst` tokens of capacity.
    TokenBucket { interval_us: u64, burst: u64 },
    /// At most `limit` tokens per window.
    FixedWindow { limit: u64, window_us: u64 },
    /// At most `limit` tokens per period of `calendar`: a fixed window whose boundaries the
    /// service computes around its clock and Redis picks among by its own.
    CalendarWindow { limit: u64, calendar: Calendar },
    /// The two-counter estimate of the last `window_us` at most `limit`.
    SlidingWindow { limit: u64, window_us: u64 },
    /// At most `limit` tokens in any span of `window_us` (a log of admission times).
    SlidingLog { limit: u64, window_us: u64 },
    /// Requests leave one per `interval_us`; one that would wait more than `max_delay_us` for
    /// its turn is denied, the others are admitted with their wait as a delay.
    LeakyBucket { interval_us: u64, max_delay_us: u64 },
    /// At most `limit` slots live at once, each a lease of `lease_us` from when it was taken or
    /// last renewed.
    Concurrency { limit: u64, lease_us: u64 },
}

impl Algorithm {
    pub fn kind(&self) -> Kind {
        match self {
            Algorithm::TokenBucket { .. } => Kind::TokenBucket,
            Algorithm::FixedWindow { .. } | Algorithm::CalendarWindow { .. } => Kind::FixedWindow,
            Algorithm::SlidingWindow { .. } => Kind::SlidingWindow,
            Algorithm::SlidingLog { .. } => Kind::SlidingLog,
            Algorithm::LeakyBucket { .. } => Kind::LeakyBucket,
            Algorithm::Concurrency { .. } => Kind::Concurrency,
        }
    }

    /// The name on the wire.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// The filter's algorithm of these numbers, in microseconds (the algorithms do not mind the
    /// unit), through its validating constructors (`check::parse` has bounded them already):
    /// the memory store's decisions, and the words of a state read back (`Store::words`).
    /// Concurrency has none: its slots are no words.
    pub fn exact(&self) -> Option<filter::Algorithm> {
        let made = match *self {
            Algorithm::TokenBucket { interval_us, burst } => {
                filter::Rate::new(1, interval_us, burst).map(filter::Algorithm::TokenBucket)
            }
            Algorithm::FixedWindow { limit, window_us } => {
                filter::Window::new(limit, window_us).map(filter::Algorithm::FixedWindow)
            }
            Algorithm::CalendarWindow { limit, calendar } => {
                filter::Window::calendar(limit, calendar.in_micros())
                    .map(filter::Algorithm::FixedWindow)
            }
            Algorithm::SlidingWindow { limit, window_us } => {
                filter::Window::new(limit, window_us).map(filter::Algorithm::SlidingWindow)
            }
            Algorithm::SlidingLog { limit, window_us } => {
                filter::Window::new(limit, window_us).map(filter::Algorithm::SlidingLog)
            }
            Algorithm::LeakyBucket {
                interval_us,
                max_delay_us,
            } => {
                filter::Drain::new(1, interval_us, max_delay_us).map(filter::Algorithm::LeakyBucket)
            }
            Algorithm::Concurrency { .. } => return None,
        };
        made.ok()
    }

    /// The algorithm and every number of it, `<name>/<n>/<n>`: part of the state's key. Slots
    /// are the algorithm alone (`concurrency`): a change of the limit or of the lease keeps the
    /// slots in use.
    pub fn identity(&self) -> String {
        let mut identity = String::new();
        self.write_identity(&mut identity);
        identity
    }

    /// `identity` added to `out`.
    fn write_identity(&self, out: &mut String) {
        out.push_str(self.name());
        if let Algorithm::Concurrency { .. } = self {
            return;
        }
        // A calendar by its fingerprint, the same in every replica: `c<fingerprint>/<limit>`.
        if let Algorithm::CalendarWindow { limit, calendar } = self {
            let _ = write!(out, "/c{:016x}/{limit}", calendar.fingerprint());
            return;
        }
        let (a, b) = self.numbers();
        // Writing to a String cannot fail.
        let _ = write!(out, "/{a}/{b}");
    }

    fn numbers(&self) -> (u64, u64) {
        match *self {
            Algorithm::TokenBucket { interval_us, burst } => (interval_us, burst),
            Algorithm::FixedWindow { limit, window_us }
            | Algorithm::SlidingWindow { limit, window_us }
            | Algorithm::SlidingLog { limit, window_us } => (window_us, limit),
            Algorithm::LeakyBucket {
                interval_us,
                max_delay_us,
            } => (interval_us, max_delay_us),
            Algorithm::Concurrency { limit, lease_us } => (lease_us, limit),
            Algorithm::CalendarWindow { limit, calendar } => (calendar.fingerprint(), limit),
        }
    }

    /// The most one check can get: the bucket, the window's limit, the queue (one request now
    /// and one per interval within `max_delay`).
    pub fn capacity(&self) -> u64 {
        match *self {
            Algorithm::TokenBucket { burst, .. } => burst,
            Algorithm::FixedWindow { limit, .. }
            | Algorithm::CalendarWindow { limit, .. }
            | Algorithm::SlidingWindow { limit, .. }
            | Algorithm::SlidingLog { limit, .. } => limit,
            Algorithm::LeakyBucket {
                interval_us,
                max_delay_us,
            } => max_delay_us / interval_us.max(1) + 1,
            Algorithm::Concurrency { limit, .. } => limit,
        }
    }

    /// The longest a key's state can matter after a check within `capacity`: the time to fill
    /// the bucket, the window (two for the sliding window, whose previous window still counts),
    /// the queue's longest wait and the capacity's own drain. The scripts' TTLs are this plus
    /// at most a second; `--max-key-ttl` bounds it.
    pub fn lifetime_us(&self) -> u64 {
        self.lifetime_owing_us(0)
    }

    /// `lifetime_us` of a key that may owe `debt` tokens: a bucket that owes refills them at its
    /// rate, `(burst + debt) × interval`; a window's debt ends with the window, a leaky bucket
    /// never owes.
    pub fn lifetime_owing_us(&self, debt: u64) -> u64 {
        match *self {
            Algorithm::TokenBucket { interval_us, burst } => {
                interval_us.saturating_mul(burst.saturating_add(debt))
            }
            Algorithm::FixedWindow { window_us, .. } | Algorithm::SlidingLog { window_us, .. } => {
                window_us
            }
            Algorithm::SlidingWindow { window_us, .. } => window_us.saturating_mul(2),
            Algorithm::CalendarWindow { calendar, .. } => calendar.unit.longest_nanos() / 1000,
            Algorithm::LeakyBucket {
                interval_us,
                max_delay_us,
            } => max_delay_us.saturating_add(interval_us.saturating_mul(self.capacity())),
            Algorithm::Concurrency { lease_us, .. } => lease_us,
        }
    }

    /// The most a check may cost when the key may owe `debt`: more can never be charged, and a
    /// cost within it keeps the scripts' numbers exact in Lua doubles (a `hits_addend` of
    /// 2^64 - 1 is one bounded call).
    pub fn chargeable(&self, debt: u64) -> u64 {
        match self {
            Algorithm::LeakyBucket { .. } | Algorithm::Concurrency { .. } => self.capacity(),
            _ => self.capacity().saturating_add(debt),
        }
    }

    /// The most tokens a state can hold that a refund could give back: a bucket's TAT is never
    /// ahead of now by more than `MAX_CAPACITY_US` (`check::Bounds`), a window counts at
    /// most its limit and the debt a check may carry. A refund of more gives back the same, and
    /// one within it keeps the scripts' numbers exact.
    pub fn refundable(&self) -> u64 {
        match *self {
            Algorithm::TokenBucket { interval_us, .. } => MAX_CAPACITY_US / interval_us.max(1),
            _ => self.capacity().saturating_add(MAX_DEBT),
        }
    }

    /// Whether a response's usage can be settled against it (`SettleOp::Charge`, `Refund`): the
    /// filter's `sluice::core::algorithm::Algorithm::meters`.
    pub fn meters(&self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket { .. }
                | Algorithm::FixedWindow { .. }
                | Algorithm::CalendarWindow { .. }
                | Algorithm::SlidingWindow { .. }
        )
    }
}

/// What a request owes one key after its admission (`POST /v1/settle`), validated
/// (`settle::parse`): the key's state is the one its check wrote (`settled_key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    pub namespace: Namespace,
    pub key: String,
    pub algorithm: Algorithm,
    pub op: SettleOp,
    /// A charge's or refund's name (16 hex digits), from a filter that sends one: the store
    /// applies it at most once within `SETTLED_TTL_MS` (`settled_id_key`), so that one sent
    /// again after its answer was lost changes nothing. `None`: applied each time it comes.
    pub id: Option<String>,
}

/// What one settlement did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Applied: what it changed, tokens charged or given back, slots released or renewed (0:
    /// nothing was left to settle).
    Applied(u64),
    /// Its `id` had been applied already: skipped, nothing changed.
    Duplicate,
}

impl Settled {
    /// Whether it changed something.
    pub fn changed(self) -> bool {
        matches!(self, Settled::Applied(n) if n > 0)
    }
}

/// What to do to the state, durations in microseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettleOp {
    /// Takes `tokens` whatever is left, the key owing at most `max_debt` past its limit: a
    /// check of cost = take = `tokens` with that debt. Metering algorithms only.
    Charge { tokens: u64, max_debt: u64 },
    /// Gives back `tokens` taken `age_us` ago, as far as the state still counts them.
    Refund { tokens: u64, age_us: u64 },
    /// Frees the slot.
    Release { slot: String },
    /// The slot's lease starts again; one that expired is taken again if a slot is free.
    Renew { slot: String },
}

impl SettleOp {
    /// The name on the wire and in the metrics.
    pub fn name(&self) -> &'static str {
        match self {
            SettleOp::Charge { .. } => "charge",
            SettleOp::Refund { .. } => "refund",
            SettleOp::Release { .. } => "release",
            SettleOp::Renew { .. } => "renew",
        }
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

/// A key whose named slots are looked at for renewals (`slot_watch`): its state key, and how
/// far ahead of now a live slot's lease may end before it counts as unrenewed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    pub key: String,
    pub stale_within_us: u64,
}

/// Where limits live. Every call is bounded in time: it returns an error rather than hang.
pub trait Store: Send + Sync + 'static {
    /// Decides every check, in order, each atomically on its own (no atomicity across checks).
    fn check(
        &self,
        checks: &[Check],
    ) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send;

    /// Applies every settlement, in order, each atomically on its own, and one with an `id` at
    /// most once. Returns for each what it did.
    fn settle(
        &self,
        settlements: &[Settlement],
    ) -> impl Future<Output = Result<Vec<Settled>, StoreError>> + Send;

    /// Whether the store answers at all; the readiness probe (`health`).
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// For each key, its live named slots whose lease ends within its `stale_within_us`: slots
    /// nobody renewed in time (`slot_watch`).
    fn unrenewed(
        &self,
        keys: &[Watched],
    ) -> impl Future<Output = Result<Vec<u64>, StoreError>> + Send;

    /// The words of the state at `state_key`, as the filter's algorithm (`Algorithm::exact`)
    /// keeps them; `None` without a state. Only for a token bucket and the fixed (calendar too)
    /// and sliding windows, whose state Redis keeps as one string (the admin API's show, to
    /// find a debt).
    fn words(
        &self,
        state_key: &str,
    ) -> impl Future<Output = Result<Option<Vec<u64>>, StoreError>> + Send;

    /// Forgets the state at `state_key` (`state_key`): a full bucket, an empty window, every
    /// slot free (the admin API's reset). Whether there was any.
    fn reset(&self, state_key: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Keeps the override `value` under `name` (the admin API's, `admin::overrides`), replacing
    /// one of that name; false, storing nothing, when `max` others are kept already.
    fn put_override(
        &self,
        name: &str,
        value: &str,
        max: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Forgets the override `name`; whether there was one.
    fn delete_override(&self, name: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Every override kept, `(name, value)`.
    fn overrides(&self) -> impl Future<Output = Result<Vec<(String, String)>, StoreError>> + Send;

    /// A number every set and delete of an override changes, so that a replica reads them all
    /// only when they changed.
    fn overrides_version(&self) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Enters one Envoy's report of an RLQS bucket and reads the bucket's live demands, in one
    /// atomic step (`quota`): every live Envoy's, this one's included unless the bucket holds
    /// `quota::MAX_ENVOYS` others.
    fn report_quota(
        &self,
        report: &QuotaReport,
    ) -> impl Future<Output = Result<Vec<Demand>, StoreError>> + Send;

    /// Enters the share `envoy` was just sent for the RLQS bucket `key` (`quota`), or with
    /// `None` forgets the Envoy (its stream ended); whether its entry was there.
    fn hold_quota(
        &self,
        key: &str,
        envoy: &str,
        held: Option<u64>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Enters the RLQS replica `replica`'s heartbeat now, and returns the replicas found dead
    /// (`quota::REPLICA_BEAT_LUA`).
    fn beat_replica(
        &self,
        replica: &str,
    ) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;
}

/// One store shared by the HTTP API and the RLS.
impl<S: Store> Store for std::sync::Arc<S> {
    fn check(
        &self,
        checks: &[Check],
    ) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send {
        S::check(self, checks)
    }

    fn settle(
        &self,
        settlements: &[Settlement],
    ) -> impl Future<Output = Result<Vec<Settled>, StoreError>> + Send {
        S::settle(self, settlements)
    }

    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        S::ping(self)
    }

    fn unrenewed(
        &self,
        keys: &[Watched],
    ) -> impl Future<Output = Result<Vec<u64>, StoreError>> + Send {
        S::unrenewed(self, keys)
    }

    fn reset(&self, state_key: &str) -> impl Future<Output = Result<bool, StoreError>> + Send {
        S::reset(self, state_key)
    }

    fn words(
        &self,
        state_key: &str,
    ) -> impl Future<Output = Result<Option<Vec<u64>>, StoreError>> + Send {
        S::words(self, state_key)
    }

    fn put_override(
        &self,
        name: &str,
        value: &str,
        max: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        S::put_override(self, name, value, max)
    }

    fn delete_override(&self, name: &str) -> impl Future<Output = Result<bool, StoreError>> + Send {
        S::delete_override(self, name)
    }

    fn overrides(&self) -> impl Future<Output = Result<Vec<(String, String)>, StoreError>> + Send {
        S::overrides(self)
    }

    fn overrides_version(&self) -> impl Future<Output = Result<u64, StoreError>> + Send {
        S::overrides_version(self)
    }

    fn report_quota(
        &self,
        report: &QuotaReport,
    ) -> impl Future<Output = Result<Vec<Demand>, StoreError>> + Send {
        S::report_quota(self, report)
    }

    fn hold_quota(
        &self,
        key: &str,
        envoy: &str,
        held: Option<u64>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        S::hold_quota(self, key, envoy, held)
    }

    fn beat_replica(
        &self,
        replica: &str,
    ) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send {
        S::beat_replica(self, replica)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PUBLIC: &HashSecret = &HashSecret::PUBLIC;

    #[test]
    fn hashed_keys_are_valid_caller_keys_that_tell_every_list_of_parts_apart() {
        let key = hashed_key(PUBLIC, &[b"domain", b"remote_address", b"10.0.0.1"]);
        assert_eq!(key.len(), 32);
        assert!(key.bytes().all(|b| b.is_ascii_hexdigit()));
        // Stable across runs and processes: the counters of one limit must be found again.
        assert_eq!(
            key,
            hashed_key(PUBLIC, &[b"domain", b"remote_address", b"10.0.0.1"])
        );
        let secret = HashSecret::from_text(b"an operator's secret of at least 32 bytes");
        let others = [
            hashed_key(PUBLIC, &[b"domain", b"remote_address10.0.0.1"]),
            hashed_key(PUBLIC, &[b"domainremote_address", b"10.0.0.1"]),
            hashed_key(PUBLIC, &[b"domain", b"remote_address", b"10.0.0.2"]),
            hashed_key(PUBLIC, &[b"domain", b"remote_address", b"\xff{}"]),
            hashed_key(&secret, &[b"domain", b"remote_address", b"10.0.0.1"]),
        ];
        for other in others {
            assert_ne!(key, other);
        }
    }

    fn check(namespace: Namespace, key: &str, algorithm: Algorithm) -> Check {
        Check {
            namespace,
            key: key.into(),
            algorithm,
            cost: 1,
            take: 1,
            debt: 0,
            slots: Slots::Anonymous,
            state_of: None,
        }
    }

    #[test]
    fn a_state_key_belongs_to_one_namespace_one_algorithm_and_its_numbers() {
        let bucket = Algorithm::TokenBucket {
            interval_us: 600_000,
            burst: 20,
        };
        let http = state_key(&check(Namespace::Http, "per-user/7af1", bucket));
        assert_eq!(http, "sluice:{per-user/7af1}:token_bucket/600000/20");
        let rls = state_key(&check(Namespace::Rls, "per-user/7af1", bucket));
        assert_eq!(rls, "sluice:rls:{per-user/7af1}:token_bucket/600000/20");
        let window = Algorithm::FixedWindow {
            limit: 20,
            window_us: 600_000,
        };
        let others = [
            Algorithm::TokenBucket {
                interval_us: 600_000,
                burst: 21,
            },
            window,
            Algorithm::SlidingWindow {
                limit: 20,
                window_us: 600_000,
            },
        ];
        for other in others {
            assert_ne!(
                state_key(&check(Namespace::Http, "per-user/7af1", other)),
                http
            );
        }
    }

    #[test]
    fn a_settlements_id_is_remembered_in_the_slot_of_the_state_it_settles() {
        let settlement = |id: Option<&str>| Settlement {
            namespace: Namespace::Http,
            key: "llm/00ff".into(),
            algorithm: Algorithm::TokenBucket {
                interval_us: 60_000,
                burst: 1000,
            },
            op: SettleOp::Refund {
                tokens: 1,
                age_us: 0,
            },
            id: id.map(String::from),
        };
        let with_id = settlement(Some("00000000000000a1"));
        assert_eq!(
            settled_id_key(&with_id).unwrap(),
            "sluice:{llm/00ff}:settled/00000000000000a1"
        );
        assert!(settled_key(&with_id).starts_with("sluice:{llm/00ff}:"));
        assert_eq!(settled_id_key(&settlement(None)), None);
        assert_eq!(SETTLED_TTL_MS, 60_000);
    }

    #[test]
    fn slots_keep_their_state_key_when_the_limit_or_the_lease_changes() {
        let slots = |limit, lease_us| {
            let algorithm = Algorithm::Concurrency { limit, lease_us };
            state_key(&check(Namespace::Http, "streams/00ff", algorithm))
        };
        assert_eq!(slots(4, 10_000_000), "sluice:{streams/00ff}:concurrency");
        assert_eq!(slots(4, 10_000_000), slots(8, 60_000_000));
    }

    #[test]
    fn a_leaky_buckets_capacity_and_lifetime_come_from_its_queue() {
        let leaky = Algorithm::LeakyBucket {
            interval_us: 100_000,
            max_delay_us: 500_000,
        };
        assert_eq!(leaky.capacity(), 6);
        assert_eq!(leaky.lifetime_us(), 1_100_000);
        let sliding = Algorithm::SlidingWindow {
            limit: 5,
            window_us: 1_000,
        };
        assert_eq!((sliding.capacity(), sliding.lifetime_us()), (5, 2_000));
    }

    #[test]
    fn a_bucket_that_may_owe_lives_until_its_debt_is_refilled_too() {
        let bucket = Algorithm::TokenBucket {
            interval_us: 1_000,
            burst: 20,
        };
        assert_eq!(bucket.lifetime_owing_us(20), 40_000);
        assert_eq!(bucket.chargeable(20), 40);
        let window = Algorithm::FixedWindow {
            limit: 20,
            window_us: 60_000,
        };
        assert_eq!(window.lifetime_owing_us(20), window.lifetime_us());
        let leaky = Algorithm::LeakyBucket {
            interval_us: 100_000,
            max_delay_us: 500_000,
        };
        assert_eq!(leaky.chargeable(6), 6, "never owes");
    }
}
