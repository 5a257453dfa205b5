//! `/admin/v1/keys/...`: one global key's state, named as a check names it (its key and the
//! limit's numbers, which together are where the state lives: `store::state_key`).
//! - `show` (read): what is left and when it is whole again (the bucket full, the window over);
//!   it charges nothing (a check of cost 0).
//! - `reset` (write): forgets the state: a full bucket, an empty window, every slot free; and
//!   the key's refusals in this replica's top keys (`/admin/v1/top`), which no longer rank it.
//! - `credit` (write): gives `tokens` back (forgiving debt first), applied once per `id` within
//!   `store::SETTLED_TTL_MS`, as a settlement's refund is.

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde::{Deserialize, Serialize};
use sluice::core::algorithm::Kind;

use super::auth::Caller;
use super::{bad_request, store_unavailable, validate_reason, Admin, Route};
use crate::decision::check::{validate_limit, validate_slot, within, BadRequest, Shape};
use crate::stores::{
    state_key, unix_us, Algorithm, Check, Namespace, SettleOp, Settled, Settlement, Slots, Store,
    StoreError,
};
use crate::top;
use crate::web::{json, Reply};

pub const ROUTES: [Route; 3] = [
    Route {
        method: Method::POST,
        path: "/admin/v1/keys/show",
        action: "keys.show",
        writes: false,
    },
    Route {
        method: Method::POST,
        path: "/admin/v1/keys/reset",
        action: "keys.reset",
        writes: true,
    },
    Route {
        method: Method::POST,
        path: "/admin/v1/keys/credit",
        action: "keys.credit",
        writes: true,
    },
];

/// The body of every keys call: the key and limit as a check gives them, and what a write
/// needs.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyRequest {
    /// `http` (the keys of `/v1/check`, the default) or `rls`.
    #[serde(default)]
    namespace: Option<String>,
    key: String,
    #[serde(default)]
    algorithm: Kind,
    requests: u64,
    per_ms: u64,
    burst: u64,
    #[serde(default)]
    max_delay_ms: Option<u64>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    tokens: Option<u64>,
    #[serde(default)]
    id: Option<String>,
}

/// A key's state now.
#[derive(Debug, Serialize)]
pub struct KeyState {
    pub key: String,
    pub namespace: &'static str,
    pub algorithm: &'static str,
    /// Where the state lives in the store.
    pub state_key: String,
    /// The most one request can get: the bucket, the window's limit, the slots.
    pub capacity: u64,
    /// Where the limit comes from: `request` (the numbers given, the policy's) or `override`.
    pub source: &'static str,
    /// Whole tokens (slots) left now.
    pub remaining: u64,
    /// Until the bucket is full again, or the window ends.
    pub reset_ms: u64,
    /// Tokens owed past the limit (a token bucket, a fixed or sliding window): what a credit
    /// forgives before it gives any back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub debt: Option<u64>,
    /// Concurrency: the slots held now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slots_in_use: Option<u64>,
}

/// A limit as this API takes it (`KeyRequest`'s numbers): `/admin/v1/top` lists the limits a
/// policy's checks used in these terms, so that a key it ranks can be shown, reset or credited.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Limit {
    pub algorithm: &'static str,
    pub requests: u64,
    pub per_ms: u64,
    pub burst: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_delay_ms: Option<u64>,
}

/// `algorithm`'s numbers, chosen so that this API makes the same algorithm of them (where its
/// state lives); `None` for a calendar window (which this API cannot name) and for a bucket
/// whose interval no numbers within the bounds make exactly.
pub fn limit_of(algorithm: &Algorithm) -> Option<Limit> {
    let name = algorithm.name();
    let limit = |requests, per_ms, burst, max_delay_ms| Limit {
        algorithm: name,
        requests,
        per_ms,
        burst,
        max_delay_ms,
    };
    // `interval_us(requests, per_ms)`'s inverse: a whole number of ms per request, or per 1,000.
    let per = |interval_us: u64| match interval_us % 1000 {
        0 => (1, interval_us / 1000),
        _ => (1000, interval_us),
    };
    let made = match *algorithm {
        Algorithm::TokenBucket { interval_us, burst } => {
            let (requests, per_ms) = per(interval_us);
            limit(requests, per_ms, burst, None)
        }
        Algorithm::LeakyBucket {
            interval_us,
            max_delay_us,
        } => {
            let (requests, per_ms) = per(interval_us);
            let burst = max_delay_us / interval_us.max(1) + 1;
            limit(requests, per_ms, burst, Some(max_delay_us / 1000))
        }
        Algorithm::FixedWindow {
            limit: n,
            window_us,
        }
        | Algorithm::SlidingWindow {
            limit: n,
            window_us,
        }
        | Algorithm::SlidingLog {
            limit: n,
            window_us,
        } => limit(n, window_us / 1000, n, None),
        Algorithm::Concurrency { limit: n, lease_us } => limit(n, lease_us / 1000, n, None),
        Algorithm::CalendarWindow { .. } => return None,
    };
    let shape = Shape {
        calendar: None,
        name: algorithm.kind(),
        requests: made.requests,
        per_ms: made.per_ms,
        burst: made.burst,
        max_delay_ms: made.max_delay_ms,
    };
    let again = shape.algorithm(&|name: &str| name.to_string());
    (again.ok() == Some(*algorithm)).then_some(made)
}

/// The answer of a write.
#[derive(Debug, Serialize)]
pub struct Written {
    pub key: String,
    pub state_key: String,
    /// `done`, or `unchanged` (nothing to reset; a credit whose id was applied already, or
    /// that found nothing to give back).
    pub outcome: &'static str,
}

pub async fn serve<S: Store>(
    admin: &Admin<S>,
    route: &'static Route,
    caller: &Caller,
    request: Request<Incoming>,
) -> Reply {
    let raw: KeyRequest = match admin.body(request).await {
        Ok(raw) => raw,
        Err(reply) => return reply,
    };
    let parsed = match parse(raw, admin, route) {
        Ok(parsed) => parsed,
        Err(bad) => return bad_request(&bad),
    };
    let target = state_key(&parsed.check);
    match route.action {
        "keys.show" => show(admin, parsed, target).await,
        "keys.reset" => reset(admin, caller, route, parsed, target).await,
        _ => credit(admin, caller, route, parsed, target).await,
    }
}

struct Parsed {
    check: Check,
    reason: String,
    tokens: u64,
    id: Option<String>,
}

fn parse<S>(raw: KeyRequest, admin: &Admin<S>, route: &Route) -> Result<Parsed, BadRequest> {
    let namespace = match raw.namespace.as_deref() {
        None | Some("http") => Namespace::Http,
        Some("rls") => Namespace::Rls,
        Some(other) => {
            let other: String = other.chars().take(32).collect();
            return Err(BadRequest::new(
                "namespace",
                format!("must be http or rls, got {other:?}"),
            ));
        }
    };
    let shape = Shape {
        calendar: None,
        name: raw.algorithm,
        requests: raw.requests,
        per_ms: raw.per_ms,
        burst: raw.burst,
        max_delay_ms: raw.max_delay_ms,
    };
    let field = |name: &str| name.to_string();
    let algorithm = validate_limit(&raw.key, &shape, &field, &admin.limits.bounds)?;
    let check = Check {
        namespace,
        key: raw.key,
        algorithm,
        cost: 0,
        take: 0,
        debt: 0,
        slots: Slots::Anonymous,
        state_of: None,
    };
    let unwanted = |name: &str, value: bool| {
        if value {
            Err(BadRequest::new(
                name,
                format!("not taken by {}", route.path),
            ))
        } else {
            Ok(())
        }
    };
    let credits = route.action == "keys.credit";
    unwanted("reason", !route.writes && raw.reason.is_some())?;
    unwanted("tokens", !credits && raw.tokens.is_some())?;
    unwanted("id", !credits && raw.id.is_some())?;
    let reason = if route.writes {
        validate_reason(raw.reason.as_deref(), "reason")?
    } else {
        String::new()
    };
    let (mut tokens, mut id) = (0, None);
    if credits {
        if !algorithm.meters() {
            let reason = format!(
                "credit is only for token_bucket, fixed_window and sliding_window, not {}",
                algorithm.name()
            );
            return Err(BadRequest::new("algorithm", reason));
        }
        let Some(given) = raw.tokens else {
            return Err(BadRequest::new(
                "tokens",
                "required: how many tokens to give back",
            ));
        };
        tokens = within(
            "tokens",
            given,
            1,
            algorithm.refundable().max(1),
            " (what the state can give back)",
        )?;
        let Some(given) = raw.id else {
            return Err(BadRequest::new(
                "id",
                "required: 16 lowercase hex digits naming this credit, so that it is applied once",
            ));
        };
        id = Some(validate_slot(given, "id")?);
    }
    Ok(Parsed {
        check,
        reason,
        tokens,
        id,
    })
}

async fn show<S: Store>(admin: &Admin<S>, parsed: Parsed, target: String) -> Reply {
    let mut check = parsed.check;
    let overridden = admin.overrides.apply(std::slice::from_mut(&mut check)) > 0;
    let decided = admin.store.check(std::slice::from_ref(&check)).await;
    let decision = match decided.map(|mut d| d.pop()) {
        Ok(Some(decision)) => decision,
        Ok(None) => return store_unavailable("the store gave no decision"),
        Err(failure) => return store_unavailable(&failure.detail),
    };
    let debt = match past_limit(&*admin.store, &check, &target).await {
        Ok(debt) => debt,
        Err(failure) => return store_unavailable(&failure.detail),
    };
    let slots_in_use = matches!(check.algorithm, Algorithm::Concurrency { .. }).then(|| {
        check
            .algorithm
            .capacity()
            .saturating_sub(decision.remaining)
    });
    let state = KeyState {
        namespace: top::namespace_name(check.namespace),
        algorithm: check.algorithm.name(),
        state_key: target,
        capacity: check.algorithm.capacity(),
        source: if overridden { "override" } else { "request" },
        remaining: decision.remaining,
        reset_ms: ceil_ms(decision.reset_us),
        key: check.key,
        debt,
        slots_in_use,
    };
    json(StatusCode::OK, &state)
}

/// What the key owes past its limit now, read from its state in the store, for the algorithms
/// that can owe (`meters`); `None` for the others.
async fn past_limit<S: Store>(
    store: &S,
    check: &Check,
    state_key: &str,
) -> Result<Option<u64>, StoreError> {
    let Some(exact) = check.algorithm.exact().filter(|a| a.meters()) else {
        return Ok(None);
    };
    let words = store.words(state_key).await?;
    Ok(Some(
        words.map_or(0, |words| exact.past_limit(&words, unix_us())),
    ))
}

async fn reset<S: Store>(
    admin: &Admin<S>,
    caller: &Caller,
    route: &'static Route,
    parsed: Parsed,
    target: String,
) -> Reply {
    let result = admin.store.reset(&target).await;
    if result.is_ok() {
        forget_refusals(admin, &parsed.check);
    }
    let outcome = match &result {
        Ok(true) => "done",
        Ok(false) => "unchanged",
        Err(_) => "failed",
    };
    admin
        .audit
        .record(caller, route.action, &target, &parsed.reason, outcome);
    match result {
        Ok(_) => json(
            StatusCode::OK,
            &Written {
                key: parsed.check.key,
                state_key: target,
                outcome,
            },
        ),
        Err(failure) => store_unavailable(&failure.detail),
    }
}

/// A key reset no longer ranks among this replica's refused keys: from the page that reset
/// it, its refusals are gone, and those it gets after are counted afresh.
fn forget_refusals<S>(admin: &Admin<S>, check: &Check) {
    let Some(recorder) = admin.top.as_deref() else {
        return;
    };
    let (policy, key) = match check.namespace {
        Namespace::Http => match top::http_key(&check.key) {
            Some((policy, key)) => (Some(policy), key),
            None => return,
        },
        Namespace::Rls => match top::rls_key(&check.key) {
            Some(key) => (None, key),
            None => return,
        },
    };
    recorder.forget_refusals(check.namespace, policy, key);
}

async fn credit<S: Store>(
    admin: &Admin<S>,
    caller: &Caller,
    route: &'static Route,
    parsed: Parsed,
    target: String,
) -> Reply {
    let check = parsed.check;
    let settlement = Settlement {
        namespace: check.namespace,
        key: check.key.clone(),
        algorithm: check.algorithm,
        op: SettleOp::Refund {
            tokens: parsed.tokens,
            age_us: 0,
        },
        id: parsed.id,
    };
    let result = admin.store.settle(std::slice::from_ref(&settlement)).await;
    let outcome = match &result {
        Ok(done) if done.first().is_some_and(|d| d.changed()) => "done",
        Ok(_) => "unchanged",
        Err(_) => "failed",
    };
    let why = format!("{} (tokens {})", parsed.reason, parsed.tokens);
    admin
        .audit
        .record(caller, route.action, &target, &why, outcome);
    match result {
        Ok(done) => {
            let duplicate = done.first() == Some(&Settled::Duplicate);
            let outcome = if duplicate { "duplicate" } else { outcome };
            json(
                StatusCode::OK,
                &Written {
                    key: check.key,
                    state_key: target,
                    outcome,
                },
            )
        }
        Err(failure) => store_unavailable(&failure.detail),
    }
}

fn ceil_ms(us: u64) -> u64 {
    us.div_ceil(1000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn shape(name: Kind, requests: u64, per_ms: u64, burst: u64) -> Shape {
        Shape {
            calendar: None,
            name,
            requests,
            per_ms,
            burst,
            max_delay_ms: (name == Kind::LeakyBucket).then_some(per_ms.saturating_mul(3)),
        }
    }

    proptest! {
        /// Whatever numbers a check gave, the limit listed for them names the same state.
        #[test]
        fn a_listed_limit_makes_the_algorithm_it_was_listed_for(
            kind in 0..6usize,
            requests in 1..5_000u64,
            per_ms in prop_oneof![1..100_000u64, 31_000_000_000..31_536_000_000u64],
            burst in 1..1_000u64,
        ) {
            let name = [Kind::TokenBucket, Kind::FixedWindow, Kind::SlidingWindow,
                Kind::SlidingLog, Kind::LeakyBucket, Kind::Concurrency][kind];
            let burst = if matches!(name, Kind::TokenBucket | Kind::LeakyBucket) { burst } else { requests };
            let field = |name: &str| name.to_string();
            let Ok(algorithm) = shape(name, requests, per_ms, burst).algorithm(&field) else {
                return Ok(());
            };
            let Some(limit) = limit_of(&algorithm) else {
                // Only a bucket slower than a request per MAX_PER_MS µs has no exact numbers.
                prop_assert!(per_ms / requests > 31_536_000, "{algorithm:?}");
                return Ok(());
            };
            let given = Shape {
                calendar: None,
                name,
                requests: limit.requests,
                per_ms: limit.per_ms,
                burst: limit.burst,
                max_delay_ms: limit.max_delay_ms,
            };
            prop_assert_eq!(limit.algorithm, name.name());
            prop_assert_eq!(given.algorithm(&field).ok(), Some(algorithm));
        }
    }
}
