//! `/admin/v1/overrides`: one key's own limit, "default plus override", the override winning.
//! An override names a check's key (`<policy>/<key hash>`, and its namespace) and gives the
//! limit's numbers that replace a check's own when the check is of the same algorithm. They are
//! kept in the store (`Store::put_override`: Redis for persistence), at most `--max-overrides` (`MAX_OVERRIDES`); a
//! new one past the bound is refused (409), replacing one is not. Each replica keeps a copy
//! (`OverrideTable`), refreshed from the store at once after its own writes, and otherwise
//! whenever the store's version of them (`Store::overrides_version`, asked every
//! `REFRESH_EVERY`) changed or one of them expired: checks see an override within that delay on
//! every replica, and 100,000 unchanged overrides cost a replica one small read a second. An
//! expired one stops applying at once and is deleted from the store at the next refresh.
//! - `GET /admin/v1/overrides` (read): every live override.
//! - `POST /admin/v1/overrides` (write): sets one.
//! - `POST /admin/v1/overrides/delete` (write): deletes one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, StatusCode};
use serde::{Deserialize, Serialize};
use sluice::core::algorithm::Kind;
use sluice::wire::overrides as listing;
use tracing::warn;

use super::auth::Caller;
use super::{bad_request, store_unavailable, validate_reason, Admin, Route};
use crate::decision::check::{validate_limit, within, BadRequest, Bounds, Shape};
use crate::stores::{Algorithm, Check, Namespace, Store};
use crate::web::{error, json, Reply};

/// The most overrides kept by default (`--max-overrides`).
pub const MAX_OVERRIDES: u64 = 10_000;
/// How often each replica asks whether the overrides changed.
pub const REFRESH_EVERY: Duration = Duration::from_secs(1);
/// The longest an override may be set for.
const MAX_EXPIRES_MS: u64 = 366 * 24 * 3600 * 1000;
/// The longest `owner`.
const MAX_OWNER_BYTES: usize = 200;

pub const ROUTES: [Route; 3] = [
    Route {
        method: Method::GET,
        path: "/admin/v1/overrides",
        action: "overrides.list",
        writes: false,
    },
    Route {
        method: Method::POST,
        path: "/admin/v1/overrides",
        action: "overrides.set",
        writes: true,
    },
    Route {
        method: Method::POST,
        path: "/admin/v1/overrides/delete",
        action: "overrides.delete",
        writes: true,
    },
];

/// One override as kept in the store and listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Override {
    pub namespace: String,
    pub key: String,
    pub algorithm: Kind,
    pub requests: u64,
    pub per_ms: u64,
    pub burst: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay_ms: Option<u64>,
    pub owner: String,
    pub reason: String,
    /// Who set it (the token's name).
    pub set_by: String,
    pub set_at_ms: u64,
    /// Unix milliseconds; none: until deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
}

impl Override {
    fn name(&self) -> String {
        format!("{}:{}", self.namespace, self.key)
    }

    fn live(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_none_or(|until| until > now_ms)
    }
}

/// What a replica applies: each override's algorithm, by namespace and key; and what it lists
/// to the filters (`GET /v1/overrides`).
#[derive(Default)]
pub struct OverrideTable {
    by_key: RwLock<Arc<HashMap<(Namespace, String), Applied>>>,
    listing: RwLock<Option<Arc<Listed>>>,
    read_at: Mutex<Option<ReadAt>>,
}

/// What the table was last read at: the store's version of the overrides, and when the first
/// of those read expires.
#[derive(Debug, Clone, Copy)]
struct ReadAt {
    version: u64,
    first_expiry_ms: Option<u64>,
}

/// The filters' listing as served: its version (the `ETag`) and its JSON body, made once per
/// change of the overrides.
#[derive(Debug, PartialEq, Eq)]
pub struct Listed {
    pub version: String,
    pub body: Bytes,
}

impl Listed {
    fn of(overrides: Vec<listing::Listed>) -> Listed {
        let version = listing::version_of(&overrides);
        let body = serde_json::to_vec(&listing::Listing {
            version: version.clone(),
            overrides,
        })
        .unwrap_or_default();
        Listed {
            version,
            body: body.into(),
        }
    }
}

/// A live override as a check meets it: its algorithm, and the numbers it was given (for the
/// RLS's `current_limit` and headers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overridden {
    pub algorithm: Algorithm,
    pub requests: u64,
    pub per_ms: u64,
}

#[derive(Debug, Clone)]
struct Applied {
    overridden: Overridden,
    expires_at_ms: Option<u64>,
}

/// The overrides as they are at one moment, for the checks of one call.
pub struct Current {
    table: Arc<HashMap<(Namespace, String), Applied>>,
    now_ms: u64,
}

impl Current {
    /// The live override of `key` in `namespace`, if there is one.
    pub fn find(&self, namespace: Namespace, key: &str) -> Option<&Overridden> {
        if self.table.is_empty() {
            return None;
        }
        let applied = self.table.get(&(namespace, key.to_owned()))?;
        let live = applied.expires_at_ms.is_none_or(|t| t > self.now_ms);
        live.then_some(&applied.overridden)
    }
}

impl OverrideTable {
    /// Replaces each check's limit by its key's live override of the same algorithm, the check
    /// still deciding the state of its own limit (`Check::state_of`): the usage so far carries
    /// over. Without any override, one read lock and nothing else. How many it replaced.
    pub fn apply(&self, checks: &mut [Check]) -> usize {
        let current = self.current();
        let mut applied_to = 0;
        for check in checks {
            let Some(found) = current.find(check.namespace, &check.key) else {
                continue;
            };
            if found.algorithm.kind() != check.algorithm.kind() {
                continue;
            }
            check.state_of.get_or_insert(check.algorithm);
            check.algorithm = found.algorithm;
            let capacity = found.algorithm.capacity();
            check.cost = check.cost.min(capacity);
            check.take = check.take.min(capacity);
            applied_to += 1;
        }
        applied_to
    }

    /// The overrides now: one read lock (and no clock read while there are none).
    pub fn current(&self) -> Current {
        let table = Arc::clone(&self.by_key.read().unwrap_or_else(PoisonError::into_inner));
        let now_ms = if table.is_empty() { 0 } else { now_ms() };
        Current { table, now_ms }
    }

    fn replace(&self, overrides: &[Override], bounds: &Bounds) {
        let mut table = HashMap::new();
        let mut listed = Vec::new();
        for o in overrides {
            if let Ok((namespace, algorithm)) = validate(o, bounds) {
                let overridden = Overridden {
                    algorithm,
                    requests: o.requests,
                    per_ms: o.per_ms,
                };
                let applied = Applied {
                    overridden,
                    expires_at_ms: o.expires_at_ms,
                };
                table.insert((namespace, o.key.clone()), applied);
                if namespace == Namespace::Http {
                    listed.push(listing::Listed {
                        key: o.key.clone(),
                        algorithm: o.algorithm,
                        requests: o.requests,
                        per_ms: o.per_ms,
                        burst: o.burst,
                        max_delay_ms: o.max_delay_ms,
                        expires_at_ms: o.expires_at_ms,
                    });
                }
            }
        }
        listed.sort_by(|a, b| a.key.cmp(&b.key));
        *self.by_key.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(table);
        // The same overrides read again: the listing (and its version) stays. A new one is made
        // before the lock is taken: 100,000 overrides take seconds to list in a debug build,
        // and the filters' pulls read the listing meanwhile (they timed out behind the lock).
        let version = listing::version_of(&listed);
        let held = self.listing.read().unwrap_or_else(PoisonError::into_inner);
        if held.as_ref().is_some_and(|l| l.version == version) {
            return;
        }
        drop(held);
        let fresh = Arc::new(Listed::of(listed));
        *self.listing.write().unwrap_or_else(PoisonError::into_inner) = Some(fresh);
    }

    /// Whether the table holds what the store's overrides at `version` are at `now_ms`.
    fn is_current(&self, version: Option<u64>, now_ms: u64) -> bool {
        let read_at = *self.read_at.lock().unwrap_or_else(PoisonError::into_inner);
        read_at.is_some_and(|read| {
            version == Some(read.version) && read.first_expiry_ms.is_none_or(|t| t > now_ms)
        })
    }

    /// The filters' listing of the `http` overrides now (none before the first refresh).
    pub fn listing(&self) -> Arc<Listed> {
        let listing = self.listing.read().unwrap_or_else(PoisonError::into_inner);
        match &*listing {
            Some(listed) => Arc::clone(listed),
            None => Arc::new(Listed::of(Vec::new())),
        }
    }
}

/// Reads the overrides from the store when they changed (or one expired), asking every
/// `REFRESH_EVERY`, deleting expired ones.
pub async fn keep_current<S: Store>(store: Arc<S>, table: Arc<OverrideTable>, bounds: Bounds) {
    loop {
        let version = store.overrides_version().await.ok();
        if !table.is_current(version, now_ms()) {
            refresh(&*store, &table, &bounds).await;
        }
        tokio::time::sleep(REFRESH_EVERY).await;
    }
}

/// The live overrides, the table replaced by them; `None` if the store failed.
async fn refresh<S: Store>(
    store: &S,
    table: &OverrideTable,
    bounds: &Bounds,
) -> Option<Vec<Override>> {
    // Read before the overrides: a write between the two reads them again at the next ask.
    let version = store.overrides_version().await.ok();
    let kept = match store.overrides().await {
        Ok(kept) => kept,
        Err(failure) => {
            warn!(
                error = failure.detail,
                "overrides not read: keeping those read before"
            );
            return None;
        }
    };
    let now = now_ms();
    let mut live = Vec::with_capacity(kept.len());
    let mut deleted = false;
    for (name, value) in kept {
        match serde_json::from_str::<Override>(&value) {
            Ok(o) if o.live(now) => live.push(o),
            // Expired, or not one this version reads: the bound counts only live ones.
            _ => deleted |= store.delete_override(&name).await.is_ok(),
        }
    }
    table.replace(&live, bounds);
    // A deletion here changed the version: the next ask reads once more.
    let read_at = version.filter(|_| !deleted).map(|version| ReadAt {
        version,
        first_expiry_ms: live.iter().filter_map(|o| o.expires_at_ms).min(),
    });
    *table.read_at.lock().unwrap_or_else(PoisonError::into_inner) = read_at;
    live.sort_by(|a, b| (&a.namespace, &a.key).cmp(&(&b.namespace, &b.key)));
    Some(live)
}

/// The body of a set or a delete.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OverrideRequest {
    #[serde(default)]
    namespace: Option<String>,
    key: String,
    #[serde(default)]
    algorithm: Option<Kind>,
    #[serde(default)]
    requests: Option<u64>,
    #[serde(default)]
    per_ms: Option<u64>,
    #[serde(default)]
    burst: Option<u64>,
    #[serde(default)]
    max_delay_ms: Option<u64>,
    #[serde(default)]
    owner: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    /// How long from now it applies, in milliseconds; absent: until deleted.
    #[serde(default)]
    expires_in_ms: Option<u64>,
}

#[derive(Serialize)]
struct Listing {
    overrides: Vec<Override>,
    max: u64,
}

#[derive(Serialize)]
struct Written<'a> {
    namespace: &'a str,
    key: &'a str,
    outcome: &'static str,
}

pub async fn serve<S: Store>(
    admin: &Admin<S>,
    route: &'static Route,
    caller: &Caller,
    request: Request<Incoming>,
) -> Reply {
    if route.action == "overrides.list" {
        return match refresh(&*admin.store, &admin.overrides, &admin.limits.bounds).await {
            Some(overrides) => json(
                StatusCode::OK,
                &Listing {
                    overrides,
                    max: admin.max_overrides,
                },
            ),
            None => store_unavailable("the overrides could not be read"),
        };
    }
    let raw: OverrideRequest = match admin.body(request).await {
        Ok(raw) => raw,
        Err(reply) => return reply,
    };
    let result = if route.action == "overrides.set" {
        set(admin, caller, route, raw).await
    } else {
        delete(admin, caller, route, raw).await
    };
    result.unwrap_or_else(|bad| bad_request(&bad))
}

fn namespace(given: Option<&str>) -> Result<&'static str, BadRequest> {
    match given {
        None | Some("http") => Ok("http"),
        Some("rls") => Ok("rls"),
        Some(other) => {
            let other: String = other.chars().take(32).collect();
            Err(BadRequest::new(
                "namespace",
                format!("must be http or rls, got {other:?}"),
            ))
        }
    }
}

fn required(value: Option<u64>, field: &str) -> Result<u64, BadRequest> {
    value.ok_or_else(|| BadRequest::new(field, "required"))
}

/// The override's namespace and algorithm, if its numbers make a limit within the bounds.
fn validate(o: &Override, bounds: &Bounds) -> Result<(Namespace, Algorithm), BadRequest> {
    let namespace = match namespace(Some(&o.namespace))? {
        "rls" => Namespace::Rls,
        _ => Namespace::Http,
    };
    let shape = Shape {
        calendar: None,
        name: o.algorithm,
        requests: o.requests,
        per_ms: o.per_ms,
        burst: o.burst,
        max_delay_ms: o.max_delay_ms,
    };
    let field = |name: &str| name.to_string();
    Ok((namespace, validate_limit(&o.key, &shape, &field, bounds)?))
}

async fn set<S: Store>(
    admin: &Admin<S>,
    caller: &Caller,
    route: &'static Route,
    raw: OverrideRequest,
) -> Result<Reply, BadRequest> {
    let reason = validate_reason(raw.reason.as_deref(), "reason")?;
    let owner = validate_reason(raw.owner.as_deref(), "owner").map_err(|_| {
        BadRequest::new(
            "owner",
            format!("required: 1 to {MAX_OWNER_BYTES} bytes, no control characters"),
        )
    })?;
    if owner.len() > MAX_OWNER_BYTES {
        return Err(BadRequest::new(
            "owner",
            format!("must be 1 to {MAX_OWNER_BYTES} bytes"),
        ));
    }
    let now = now_ms();
    let expires_at_ms = (raw.expires_in_ms)
        .map(|ms| {
            within(
                "expires_in_ms",
                ms,
                1000,
                MAX_EXPIRES_MS,
                " (a second to 366 days)",
            )
        })
        .transpose()?
        .map(|ms| now.saturating_add(ms));
    let o = Override {
        namespace: namespace(raw.namespace.as_deref())?.to_string(),
        key: raw.key,
        algorithm: raw.algorithm.unwrap_or_default(),
        requests: required(raw.requests, "requests")?,
        per_ms: required(raw.per_ms, "per_ms")?,
        burst: required(raw.burst, "burst")?,
        max_delay_ms: raw.max_delay_ms,
        owner,
        reason,
        set_by: caller.name.clone(),
        set_at_ms: now,
        expires_at_ms,
    };
    validate(&o, &admin.limits.bounds)?;
    let (name, value) = (o.name(), serde_json::to_string(&o).unwrap_or_default());
    let stored = admin
        .store
        .put_override(&name, &value, admin.max_overrides)
        .await;
    let outcome = match &stored {
        Ok(true) => "done",
        Ok(false) => "refused",
        Err(_) => "failed",
    };
    let why = format!(
        "{} (owner {}, {} per {} ms, burst {})",
        o.reason, o.owner, o.requests, o.per_ms, o.burst
    );
    admin
        .audit
        .record(caller, route.action, &name, &why, outcome);
    Ok(match stored {
        Ok(true) => {
            refresh(&*admin.store, &admin.overrides, &admin.limits.bounds).await;
            json(
                StatusCode::OK,
                &Written {
                    namespace: &o.namespace,
                    key: &o.key,
                    outcome,
                },
            )
        }
        Ok(false) => error(
            StatusCode::CONFLICT,
            "too_many_overrides",
            &format!(
                "{} overrides are kept already (--max-overrides): delete one first",
                admin.max_overrides
            ),
        ),
        Err(failure) => store_unavailable(&failure.detail),
    })
}

async fn delete<S: Store>(
    admin: &Admin<S>,
    caller: &Caller,
    route: &'static Route,
    raw: OverrideRequest,
) -> Result<Reply, BadRequest> {
    for (field, given) in [
        ("algorithm", raw.algorithm.is_some()),
        ("requests", raw.requests.is_some()),
        ("per_ms", raw.per_ms.is_some()),
        ("burst", raw.burst.is_some()),
        ("max_delay_ms", raw.max_delay_ms.is_some()),
        ("owner", raw.owner.is_some()),
        ("expires_in_ms", raw.expires_in_ms.is_some()),
    ] {
        if given {
            return Err(BadRequest::new(field, "not taken by a delete"));
        }
    }
    let reason = validate_reason(raw.reason.as_deref(), "reason")?;
    let namespace = namespace(raw.namespace.as_deref())?;
    let shape = Shape {
        calendar: None,
        name: Kind::TokenBucket,
        requests: 1,
        per_ms: 1000,
        burst: 1,
        max_delay_ms: None,
    };
    let field = |name: &str| name.to_string();
    validate_limit(&raw.key, &shape, &field, &admin.limits.bounds)?;
    let name = format!("{namespace}:{}", raw.key);
    let deleted = admin.store.delete_override(&name).await;
    let outcome = match &deleted {
        Ok(true) => "done",
        Ok(false) => "unchanged",
        Err(_) => "failed",
    };
    admin
        .audit
        .record(caller, route.action, &name, &reason, outcome);
    Ok(match deleted {
        Ok(_) => {
            refresh(&*admin.store, &admin.overrides, &admin.limits.bounds).await;
            json(
                StatusCode::OK,
                &Written {
                    namespace,
                    key: &raw.key,
                    outcome,
                },
            )
        }
        Err(failure) => store_unavailable(&failure.detail),
    })
}

fn now_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stores::{state_key, Slots};

    fn check(key: &str, burst: u64) -> Check {
        Check {
            namespace: Namespace::Http,
            key: key.into(),
            algorithm: Algorithm::TokenBucket {
                interval_us: 1_000_000,
                burst,
            },
            cost: 1,
            take: burst,
            debt: 0,
            slots: Slots::Anonymous,
            state_of: None,
        }
    }

    fn premium(key: &str, algorithm: Kind, expires_at_ms: Option<u64>) -> Override {
        Override {
            namespace: "http".into(),
            key: key.into(),
            algorithm,
            requests: 3,
            per_ms: 3000,
            burst: 3,
            max_delay_ms: None,
            owner: "o".into(),
            reason: "r".into(),
            set_by: "alice".into(),
            set_at_ms: 0,
            expires_at_ms,
        }
    }

    #[test]
    fn an_override_replaces_the_limit_of_its_key_and_algorithm_and_keeps_the_state() {
        let table = OverrideTable::default();
        let mut checks = [check("api/a", 10), check("api/b", 10)];
        assert_eq!(table.apply(&mut checks), 0, "no override, nothing done");
        let expired = Some(1);
        table.replace(
            &[
                premium("api/a", Kind::TokenBucket, None),
                premium("api/b", Kind::TokenBucket, expired),
                premium("api/c", Kind::FixedWindow, None),
            ],
            &Bounds::default(),
        );
        let mut checks = [check("api/a", 10), check("api/b", 10), check("api/c", 10)];
        let own_state = state_key(&checks[0]);
        assert_eq!(table.apply(&mut checks), 1);
        let [a, b, c] = &checks;
        assert_eq!(a.algorithm.capacity(), 3, "the override's burst");
        assert_eq!(a.take, 3, "take cut to the override's capacity");
        assert_eq!(state_key(a), own_state, "the state of its own limit");
        assert_eq!(b.algorithm.capacity(), 10, "expired: the policy's");
        assert_eq!(
            c.algorithm.capacity(),
            10,
            "another algorithm: the policy's"
        );
    }

    #[tokio::test]
    async fn a_replica_reads_the_overrides_again_only_when_they_changed_or_one_expired() {
        let store = crate::stores::memory::MemoryStore::default();
        let table = OverrideTable::default();
        let bounds = Bounds::default();
        let version = || async { store.overrides_version().await.ok() };
        assert!(!table.is_current(version().await, 0), "never read");
        let lasting = premium("api/a", Kind::TokenBucket, None);
        let value = serde_json::to_string(&lasting).unwrap();
        store
            .put_override(&lasting.name(), &value, 10)
            .await
            .unwrap();
        refresh(&store, &table, &bounds).await.unwrap();
        assert!(table.is_current(version().await, now_ms()));

        // Another replica's write changes the version.
        let expiring = premium("api/b", Kind::TokenBucket, Some(now_ms() + 60_000));
        let value = serde_json::to_string(&expiring).unwrap();
        store
            .put_override(&expiring.name(), &value, 10)
            .await
            .unwrap();
        assert!(!table.is_current(version().await, now_ms()));
        refresh(&store, &table, &bounds).await.unwrap();
        assert!(table.is_current(version().await, now_ms()));
        assert!(
            !table.is_current(version().await, now_ms() + 60_000),
            "its first override expired: read again, and delete it"
        );
        store.delete_override(&lasting.name()).await.unwrap();
        assert!(!table.is_current(version().await, now_ms()));
    }
}
