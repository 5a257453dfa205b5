//! The filter's own admin path (`admin`): `POST <path>/keys/show|reset|credit` for a key of a
//! local policy, whose state lives in this Envoy's shared data, and `POST <path>/top` for a
//! local policy's heaviest keys in this Envoy (sluice-service answers for global ones). Served only when the request came on the listener the configuration names
//! (`config::admin::LISTENER_PROPERTY`), looked up only for a `:path` under the admin path: any
//! other request pays nothing for it, and on any other listener the path is an ordinary request.
//!
//! Answered in the service's order: 401 without a token of `token_env` or `read_token_env`
//! (on every path under it, so that nobody maps it without one), 404, 405 (POST only), 403 (a
//! write with a read token), 400 (the body: `wire::admin`), 503 (shared data failed). Each
//! write is applied once per `id` (`state::applied`), and audited: the log line `admin write`
//! and the counter `sluice.admin_writes`.

use super::{Filter, Host, Verdict};
use crate::config::admin::{Caller, LISTENER_PROPERTY};
use crate::config::{GrpcStatus, Scope};
use crate::core::duration::NANOS_PER_SEC;
use crate::core::request::Attributes;
use crate::core::top_keys::{policy_id, rank};
use crate::output::reply::{self, LocalReply};
use crate::state::applied;
use crate::wire::admin::{
    self, error_body, Action, BadRequest, KeyRequest, TopAnswer, TopKey, Written,
};

/// What the filter does with a request, by its `:path` (read once, and only when the status
/// path or the admin path is configured).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Decided as any request; with its `:path` when it was read here, which the policies'
    /// `Attr::Path` takes instead of reading it again.
    Ordinary(Option<Vec<u8>>),
    Status,
    Admin,
}

impl Filter {
    /// Where the request goes: the status path, the admin path (on its listener), or on.
    pub fn route(&self, host: &impl Host) -> Route {
        let (status, admin) = (&self.plan.status_path, &self.plan.admin);
        if status.is_none() && admin.is_none() {
            return Route::Ordinary(None);
        }
        let Some(path) = host.header(":path") else {
            return Route::Ordinary(None);
        };
        if status
            .as_ref()
            .is_some_and(|s| s.as_bytes() == path.as_slice())
        {
            return Route::Status;
        }
        match admin {
            Some(admin) if admin.covers(&path) => {
                let listener = host.property(&LISTENER_PROPERTY);
                if listener.as_deref() == Some(admin.listener.as_bytes()) {
                    Route::Admin
                } else {
                    Route::Ordinary(Some(path))
                }
            }
            _ => Route::Ordinary(Some(path)),
        }
    }

    /// A request's attributes, with the `:path` its routing read, if it did.
    pub fn attributes<'h, H: Host>(
        &'h self,
        host: &'h H,
        path: Option<Vec<u8>>,
    ) -> Attributes<'h, H> {
        let mut request = Attributes::new(host, &self.plan.attrs);
        if let (Some(path), Some(index)) = (path, self.path_attr) {
            request.seed_path(index, path);
        }
        request
    }

    /// Whether the call carries a token of the admin path: only then does the glue wait for its
    /// body; without one it is answered (401) at once, its body unread.
    pub fn admin_authorized(&self, host: &impl Host) -> bool {
        let authorization = host.header("authorization");
        (self.plan.admin.as_ref()).is_some_and(|a| a.caller(authorization.as_deref()).is_some())
    }

    /// Answers a call to the admin path with its whole `body`; sends the reply itself.
    pub fn answer_admin(&self, host: &impl Host, body: &[u8]) -> Verdict {
        let (status, text) = self.admin_reply(host, body);
        let mut reply = LocalReply::new(status, reply::ADMIN, GrpcStatus::Unimplemented, text);
        reply.add_header("content-type", "application/json");
        reply.add_header("cache-control", "no-store");
        if status == 401 {
            reply.add_header("www-authenticate", "Bearer");
        }
        host.send_response(&reply);
        Verdict::Denied
    }

    fn admin_reply(&self, host: &impl Host, body: &[u8]) -> (u32, String) {
        let Some(admin) = &self.plan.admin else {
            return (404, error_body("not_found", "no admin path"));
        };
        let authorization = host.header("authorization");
        let Some(caller) = admin.caller(authorization.as_deref()) else {
            self.counters.admin_unauthorized.add(1);
            return (
                401,
                error_body(
                    "unauthorized",
                    "a bearer token of admin.token_env or admin.read_token_env",
                ),
            );
        };
        let path = host.header(":path").unwrap_or_default();
        let rest = path.get(admin.path.len()..).unwrap_or_default();
        let Some(action) = Action::of(rest) else {
            let shown = String::from_utf8_lossy(&path)
                .chars()
                .take(200)
                .collect::<String>();
            return (404, error_body("not_found", &shown));
        };
        if host.header(":method").as_deref() != Some(b"POST") {
            return (405, error_body("method_not_allowed", "POST"));
        }
        if action.writes() && !caller.writes {
            self.counters.admin_unauthorized.add(1);
            return (
                403,
                error_body("forbidden", "a read-only token may not write"),
            );
        }
        if action == Action::Top {
            return self.answer_top(host, body);
        }
        let asked = match admin::parse(action, body) {
            Ok(asked) => asked,
            Err(bad) => return bad_request(&bad),
        };
        let now = self.now(host);
        let target = self.limiter(host, |l| l.admin_target(&asked, now));
        let target = match target {
            Ok(target) => target,
            Err(bad) => return bad_request(&bad),
        };
        if action == Action::Show {
            let shown = self.limiter(host, |l| l.admin_show(&target, now));
            return (200, serde_json::to_string(&shown).unwrap_or_default());
        }
        let algorithm = target.tier.algorithm;
        if action == Action::Credit {
            if !algorithm.meters() {
                let why = format!(
                    "credit is only for token_bucket, fixed_window and sliding_window, not {}",
                    algorithm.name()
                );
                return bad_request(&BadRequest::new("policy", why));
            }
            if asked.tokens > algorithm.capacity() {
                let why = format!(
                    "must be 1 to {} (the limit's capacity)",
                    algorithm.capacity()
                );
                return bad_request(&BadRequest::new("tokens", why));
            }
        }
        let key = {
            let mut key = self.policy_name(target.policy).to_string();
            key.push('/');
            crate::core::text::push_hex16(&mut key, target.key);
            key
        };
        let written = self.admin_write(host, action, &asked, &target, now);
        let (outcome, credited) = match written {
            Ok(done) => done,
            Err(()) => ("failed", None),
        };
        self.audit(caller, action, &key, &asked, outcome);
        match written {
            Ok(_) => {
                let answer = Written {
                    key,
                    outcome,
                    credited,
                };
                (200, serde_json::to_string(&answer).unwrap_or_default())
            }
            Err(()) => (
                503,
                error_body(
                    "shared_data_unavailable",
                    "the key's state could not be written; nothing was",
                ),
            ),
        }
    }

    /// `top`: a local policy's heaviest keys, merged over the boards every worker of this
    /// Envoy published (`state::top`), each key by its hash only.
    fn answer_top(&self, host: &impl Host, body: &[u8]) -> (u32, String) {
        let asked = match admin::parse_top(body) {
            Ok(asked) => asked,
            Err(bad) => return bad_request(&bad),
        };
        let policy = self.plan.policy_index(asked.policy.as_bytes());
        let policy = policy.and_then(|i| self.plan.policies.get(i));
        let Some(policy) = policy.filter(|p| p.scope == Scope::Local) else {
            let why = "not a local policy of this configuration (sluice-service answers for \
                       global ones: GET /admin/v1/top)";
            return bad_request(&BadRequest::new("policy", why));
        };
        let now_s = self.now(host) / NANOS_PER_SEC;
        let boards = crate::state::top::read(host, &self.prefix, now_s);
        let ranking = rank(
            &boards,
            policy_id(&policy.name),
            asked.window,
            asked.by,
            asked.limit,
        );
        let keys = (ranking.keys.iter())
            .map(|counted| {
                let mut key = String::with_capacity(16);
                crate::core::text::push_hex16(&mut key, counted.key);
                TopKey {
                    key,
                    count: counted.count,
                    error: counted.error,
                    shown: counted.value.as_deref().map(str::to_string),
                }
            })
            .collect();
        let answer = TopAnswer {
            namespace: "local",
            policy: policy.name.clone(),
            by: asked.by.name(),
            window: asked.window.name(),
            totals: ranking.totals,
            error_bound: ranking.error_bound,
            keys,
            workers: boards.len(),
        };
        (200, serde_json::to_string(&answer).unwrap_or_default())
    }

    /// Applies a write once per `id`: `done`, `unchanged` or `duplicate`, and a credit's tokens.
    fn admin_write(
        &self,
        host: &impl Host,
        action: Action,
        asked: &KeyRequest,
        target: &crate::limiter::admin::Target,
        now: u64,
    ) -> Result<(&'static str, Option<u64>), ()> {
        if let Some(id) = asked.id {
            match applied::claim(host, &self.prefix, id, now / 1_000_000) {
                Ok(true) => {}
                Ok(false) => return Ok(("duplicate", None)),
                Err(_) => return Err(()),
            }
        }
        let result = self.limiter(host, |l| match action {
            Action::Credit => l.admin_credit(target, asked.tokens, now).map(Some),
            _ => l.admin_reset(target, now).map(|done| done.then_some(0)),
        });
        match (action, result) {
            (Action::Credit, Ok(Some(given))) if given > 0 => Ok(("done", Some(given))),
            (Action::Credit, Ok(_)) => Ok(("unchanged", Some(0))),
            (_, Ok(Some(_))) => Ok(("done", None)),
            (_, Ok(None)) => Ok(("unchanged", None)),
            (_, Err(_)) => {
                if let Some(id) = asked.id {
                    applied::release(host, &self.prefix, id);
                }
                Err(())
            }
        }
    }

    /// The audit trail of a write: one log line, and the counter.
    fn audit(&self, caller: Caller, action: Action, key: &str, asked: &KeyRequest, outcome: &str) {
        self.counters.admin_writes.add(1);
        let tokens = match action {
            Action::Credit => format!(" (tokens {})", asked.tokens),
            _ => String::new(),
        };
        log::info!(
            "admin write: who={} action={} key={} reason={:?}{tokens} outcome={}",
            caller.name,
            action.name(),
            key,
            asked.reason,
            outcome
        );
    }
}

fn bad_request(bad: &BadRequest) -> (u32, String) {
    (400, error_body("bad_request", &bad.detail))
}
