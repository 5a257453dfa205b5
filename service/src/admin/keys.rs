//! `/admin/v1/keys/...`: one global key's state, named as a check names it (its key and the
//! limit's numbers, which together are where the state lives: `store::state_key`).
//! - `show` (read): what is left and when it is whole again (the bucket full, the window over);
//!   it charges nothing (a check of cost 0).
//! - `reset` (write): forgets the state: a full bucket, an empty window, every slot free.
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

fn namespace_name(namespace: Namespace) -> &'static str {
    match namespace {
        Namespace::Http => "http",
        Namespace::Rls => "rls",
    }
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
        namespace: namespace_name(check.namespace),
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
