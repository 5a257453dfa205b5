//! Pulling sluice-service's overrides into shared data (`state::overrides`), from one worker per
//! Envoy: the worker that holds the poller's lease (`<prefix>~~`: its holder, until when, and
//! when it last asked) asks every `every` with the version it holds (`If-None-Match`), and
//! writes what the service answers. Any worker takes the lease over once it lapses (`LEASE`), so
//! a worker that stops (or cannot call) holds up the pulls for that long at most. When the
//! service cannot answer, the overrides pulled last stay in force, and their age grows.

use crate::core::duration::NANOS_PER_SEC;
use crate::state::overrides::{self, Index};
use crate::state::store::{Store, ABSENT};
use crate::wire::overrides::Listing;

/// How long a lease lasts without renewal: three polls at the default 2 s.
pub const LEASE: u64 = 6 * NANOS_PER_SEC;
/// The longest a pull may take.
pub const CALL_TIMEOUT: u64 = NANOS_PER_SEC;

/// The lease's name.
pub fn lease_name(prefix: &str) -> String {
    format!("{prefix}~~")
}

/// A pull to send: `GET` the listing, with the version held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pull {
    pub if_none_match: Option<String>,
}

/// What the service answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// 200 with a listing's body.
    Listing(Vec<u8>),
    /// 304: the version held is current.
    Unchanged,
    /// No answer (timeout, reset, refused), or another status.
    Failed(Option<u32>),
    /// 200 with a body of this many bytes, past what the bound allows (`body_limit`): not read.
    TooLarge(usize),
}

/// The largest listing read for `max` overrides: a few hundred bytes each, as the service
/// writes them, and a margin.
pub fn body_limit(max: usize) -> usize {
    max.saturating_mul(512).saturating_add(64 * 1024)
}

/// Why a pull left the overrides as they were.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The service did not answer, or not with 200 or 304.
    Unanswered(Option<u32>),
    /// The body is no listing.
    Unreadable,
    /// The body is longer than `body_limit`.
    TooLarge(usize),
    /// More overrides of this configuration's policies than `overrides.max`: none of the new
    /// set applies; the last one stays.
    TooMany { count: usize, max: usize },
    /// The shared data refused a write.
    NotWritten,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Unanswered(None) => write!(f, "sluice-service did not answer"),
            Failure::Unanswered(Some(status)) => {
                write!(f, "sluice-service answered status {status}")
            }
            Failure::Unreadable => write!(f, "the answer is no listing of overrides"),
            Failure::TooLarge(bytes) => write!(
                f,
                "the listing's {bytes} bytes are more than overrides.max allows: not read"
            ),
            Failure::TooMany { count, max } => write!(
                f,
                "{count} overrides of this configuration's local policies, over overrides.max \
                 ({max}): the overrides pulled before stay in force"
            ),
            Failure::NotWritten => write!(f, "shared data refused the overrides"),
        }
    }
}

/// What a configuration pulls for: its local policies, the bound and the period.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    pub prefix: &'a str,
    pub local: &'a [&'a str],
    pub max: usize,
    /// Nanoseconds between pulls.
    pub every: u64,
}

/// One worker's side of the pulls.
#[derive(Debug, Default)]
pub struct Poller {
    /// This worker's name in the lease: random, so that no two workers share one.
    me: u64,
    /// When the pull under way was sent.
    sent: Option<u64>,
}

impl Poller {
    pub fn new(me: u64) -> Poller {
        Poller { me, sent: None }
    }

    /// At each tick: takes or renews the lease when it is free or this worker's, and returns
    /// the pull to send when one is due. Nothing while a pull is under way.
    pub fn tick(&mut self, store: &impl Store, scope: &Scope, now: u64) -> Option<Pull> {
        if self
            .sent
            .is_some_and(|sent| now < sent.saturating_add(2 * CALL_TIMEOUT))
        {
            return None;
        }
        self.sent = None;
        let name = lease_name(scope.prefix);
        let (held, cas) = match store.get(&name) {
            Some((bytes, cas)) => (decode(&bytes), cas),
            None => (None, ABSENT),
        };
        let (owner, until, last) = held.unwrap_or((0, 0, 0));
        if owner != self.me && until > now {
            return None;
        }
        let due = now >= last.saturating_add(scope.every) || last > now;
        let last = if due { now } else { last };
        store
            .set(
                &name,
                &encode(self.me, now.saturating_add(LEASE), last),
                cas,
            )
            .ok()?;
        if !due {
            return None;
        }
        self.sent = Some(now);
        let plan = overrides::plan_hash(scope.local);
        let held = overrides::read_index(store, scope.prefix).map(|(index, _)| index);
        Some(Pull {
            if_none_match: held.filter(|i| i.plan == plan).map(|i| i.version),
        })
    }

    /// The pull could not be sent: the lease goes, so that another worker tries.
    pub fn not_sent(&mut self, store: &impl Store, scope: &Scope) {
        self.sent = None;
        let name = lease_name(scope.prefix);
        if let Some((bytes, cas)) = store.get(&name) {
            if let Some((owner, _, last)) = decode(&bytes).filter(|(o, ..)| *o == self.me) {
                let _ = store.set(&name, &encode(owner, 0, last), cas);
            }
        }
    }

    /// Writes what the service answered into shared data: the index written, or why the
    /// overrides stay as they were.
    pub fn answered(
        &mut self,
        store: &impl Store,
        scope: &Scope,
        answer: Answer,
        now: u64,
    ) -> Result<Index, Failure> {
        self.sent = None;
        let now_ms = now / 1_000_000;
        let plan = overrides::plan_hash(scope.local);
        let held = overrides::read_index(store, scope.prefix).map(|(index, _)| index);
        match answer {
            Answer::Failed(status) => Err(Failure::Unanswered(status)),
            Answer::TooLarge(bytes) => Err(Failure::TooLarge(bytes)),
            Answer::Unchanged => {
                let held = held
                    .filter(|i| i.plan == plan)
                    .ok_or(Failure::Unanswered(Some(304)))?;
                overrides::touch(store, scope.prefix, held, now_ms).ok_or(Failure::NotWritten)
            }
            Answer::Listing(body) => {
                let listing: Listing =
                    serde_json::from_slice(&body).map_err(|_| Failure::Unreadable)?;
                let selected =
                    overrides::select(&listing.overrides, scope.local, scope.max, now_ms).map_err(
                        |count| Failure::TooMany {
                            count,
                            max: scope.max,
                        },
                    )?;
                let version = (listing.version.as_str(), plan);
                overrides::write(
                    store,
                    scope.prefix,
                    version,
                    selected,
                    held.as_ref(),
                    now_ms,
                )
                .ok_or(Failure::NotWritten)
            }
        }
    }
}

fn encode(owner: u64, until: u64, last: u64) -> Vec<u8> {
    [owner, until, last]
        .iter()
        .flat_map(|word| word.to_le_bytes())
        .collect()
}

fn decode(bytes: &[u8]) -> Option<(u64, u64, u64)> {
    let word = |i: usize| {
        let chunk: [u8; 8] = bytes.get(i * 8..i * 8 + 8)?.try_into().ok()?;
        Some(u64::from_le_bytes(chunk))
    };
    Some((word(0)?, word(1)?, word(2)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::algorithm::Kind;
    use crate::state::store::MemoryStore;
    use crate::wire::overrides::{version_of, Listed};

    const SEC: u64 = NANOS_PER_SEC;
    const T0: u64 = 1_800_000_000 * SEC;
    const LOCAL: &[&str] = &["api"];

    fn scope() -> Scope<'static> {
        Scope {
            prefix: "sAAAAA",
            local: LOCAL,
            max: 100,
            every: 2 * SEC,
        }
    }

    fn listing(requests: u64) -> Vec<u8> {
        let overrides = vec![Listed {
            key: "api/000000000000002a".into(),
            algorithm: Kind::TokenBucket,
            requests,
            per_ms: 1000,
            burst: requests,
            max_delay_ms: None,
            expires_at_ms: None,
        }];
        let version = version_of(&overrides);
        serde_json::to_vec(&Listing { version, overrides }).unwrap()
    }

    #[test]
    fn one_worker_of_an_envoy_pulls_every_period_and_another_takes_over_when_it_stops() {
        let store = MemoryStore::default();
        let (mut one, mut two) = (Poller::new(1), Poller::new(2));
        assert!(
            one.tick(&store, &scope(), T0).is_some(),
            "the first to come"
        );
        assert!(two.tick(&store, &scope(), T0).is_none(), "held by one");
        one.answered(&store, &scope(), Answer::Listing(listing(5)), T0)
            .unwrap();
        assert!(one.tick(&store, &scope(), T0 + SEC).is_none(), "not due");
        assert!(two.tick(&store, &scope(), T0 + SEC).is_none());
        let pull = one.tick(&store, &scope(), T0 + 2 * SEC).unwrap();
        assert_eq!(pull.if_none_match, Some(version_of_listing(5)));
        one.answered(&store, &scope(), Answer::Unchanged, T0 + 2 * SEC)
            .unwrap();
        // One stops: two waits out the lease, then pulls at once.
        assert!(two
            .tick(&store, &scope(), T0 + 2 * SEC + LEASE - 1)
            .is_none());
        assert!(two.tick(&store, &scope(), T0 + 2 * SEC + LEASE).is_some());
        assert!(one.tick(&store, &scope(), T0 + 2 * SEC + LEASE).is_none());
    }

    fn version_of_listing(requests: u64) -> String {
        let listing: Listing = serde_json::from_slice(&listing(requests)).unwrap();
        listing.version
    }

    #[test]
    fn a_worker_that_cannot_send_lets_another_pull_at_once() {
        let store = MemoryStore::default();
        let (mut one, mut two) = (Poller::new(1), Poller::new(2));
        assert!(one.tick(&store, &scope(), T0).is_some());
        one.not_sent(&store, &scope());
        assert!(two.tick(&store, &scope(), T0 + 1).is_none(), "pulled at T0");
        assert!(two.tick(&store, &scope(), T0 + 2 * SEC).is_some());
    }

    #[test]
    fn a_pull_that_gets_no_answer_keeps_the_overrides_and_their_age() {
        let store = MemoryStore::default();
        let mut one = Poller::new(1);
        one.tick(&store, &scope(), T0).unwrap();
        one.answered(&store, &scope(), Answer::Listing(listing(5)), T0)
            .unwrap();
        one.tick(&store, &scope(), T0 + 2 * SEC).unwrap();
        let failed = one.answered(&store, &scope(), Answer::Failed(None), T0 + 2 * SEC);
        assert_eq!(failed, Err(Failure::Unanswered(None)));
        let garbage = one.answered(&store, &scope(), Answer::Listing(b"{".to_vec()), T0);
        assert_eq!(garbage, Err(Failure::Unreadable));
        let (index, _) = overrides::read_index(&store, "sAAAAA").unwrap();
        assert_eq!((index.count, index.pulled_ms), (1, T0 / 1_000_000));
    }

    #[test]
    fn a_pull_past_the_bound_keeps_the_last_set() {
        let store = MemoryStore::default();
        let mut one = Poller::new(1);
        one.answered(&store, &scope(), Answer::Listing(listing(5)), T0)
            .unwrap();
        let tight = Scope { max: 0, ..scope() };
        let refused = one.answered(&store, &tight, Answer::Listing(listing(6)), T0 + SEC);
        assert_eq!(refused, Err(Failure::TooMany { count: 1, max: 0 }));
        let (index, _) = overrides::read_index(&store, "sAAAAA").unwrap();
        assert_eq!(index.version, version_of_listing(5));
    }

    #[test]
    fn another_configuration_asks_afresh_and_a_304_for_it_is_a_failure() {
        let store = MemoryStore::default();
        let mut one = Poller::new(1);
        one.answered(&store, &scope(), Answer::Listing(listing(5)), T0)
            .unwrap();
        let other = Scope {
            local: &["api", "chat"],
            ..scope()
        };
        let pull = one.tick(&store, &other, T0 + 2 * SEC).unwrap();
        assert_eq!(pull.if_none_match, None);
        let unchanged = one.answered(&store, &other, Answer::Unchanged, T0 + 2 * SEC);
        assert_eq!(unchanged, Err(Failure::Unanswered(Some(304))));
    }
}
