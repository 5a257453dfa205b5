//! A request decided from its body: when a policy keys on a field of the JSON request body
//! (`body:model`) or reserves what it asks for (`max_tokens`), the glue takes a `snapshot` of
//! what the policies read of the headers (the host stops showing them once they go on), holds
//! the body until its start has come, and decides from both. A policy may also ask a stream for
//! its usage, rewriting the body (`ask_stream_usage`). A request whose response body a policy
//! meters has its `accept-encoding` narrowed to the codings sluice decodes
//! (`meters_body`).

use super::{Filter, Host, Verdict};
use crate::config::GrpcStatus;
use crate::config::Policy;
use crate::core::request::{Attributes, Snapshot};
use crate::core::usage::price::PricedAs;
use crate::core::usage::request as request_body;
use crate::limiter::tab::{Entry, Tab};
use crate::output::access_log;
use crate::output::reply::{self, LocalReply};

impl Filter {
    /// Whether a request with a body is decided once its body has come (`Plan::reads_body`):
    /// the glue then holds its headers and hands over the body's start (`on_request_body`).
    pub fn reads_body(&self) -> bool {
        self.plan.reads_body
    }

    /// What the policies read of the request's headers and properties, read now: the glue
    /// takes it before the headers go on, for `on_request_body`.
    pub fn snapshot(&self, host: &impl Host) -> Snapshot {
        Attributes::new(host, &self.plan.attrs).snapshot()
    }

    /// `snapshot` of a request routed already, with the `:path` its routing read.
    pub fn snapshot_routed<H: Host>(&self, host: &H, path: Option<Vec<u8>>) -> Snapshot {
        self.attributes(host, path).snapshot()
    }

    /// Whether some policy may rewrite a request's body (`ask_stream_usage`).
    pub fn rewrites_body(&self) -> bool {
        self.plan.policies.iter().any(Policy::asks_stream_usage)
    }

    /// Whether some policy meters response bodies: a request whose headers go on before its
    /// decision (to wait for its body) has its `accept-encoding` narrowed then
    /// (`usage::decode::narrow_accept_encoding`), as such a policy may admit it. One that no
    /// such policy admits gets its answer in a coding sluice decodes all the same.
    pub fn meters_bodies(&self) -> bool {
        self.plan.policies.iter().any(Policy::meters_bodies)
    }

    /// Whether a policy that admitted the request (its `tab`) meters its response body: its
    /// `accept-encoding` is narrowed to what sluice decodes, so that the usage can be read.
    pub fn meters_body(&self, tab: Option<&Tab>) -> bool {
        let meters = |entry: &Entry| {
            let policy = self.plan.policies.get(entry.policy);
            policy.is_some_and(Policy::meters_bodies)
        };
        tab.is_some_and(|tab| tab.entries.iter().any(meters))
    }

    /// Decides a request from its `snapshot` and its whole body (at most `BODY_BYTES`), read as
    /// a JSON reader that skips a byte-order mark reads it. A body that is not one JSON document
    /// is refused (400) when a policy that reads it applies.
    /// What the policies read of the body is published for the access log first
    /// (`access_log::body_states`), refused or not.
    pub fn on_request_body(&self, host: &impl Host, snapshot: Snapshot, body: &[u8]) -> Verdict {
        let attrs = &self.plan.attrs;
        let body = request_body::without_bom(body);
        let mut request = Attributes::of_snapshot(host, attrs, snapshot, body);
        if !body.is_empty() && !request_body::readable(body) && self.body_needed(&mut request) {
            self.refuse_body(host, 400, reply::UNREADABLE_BODY, "unreadable_request_body");
            return Verdict::Denied;
        }
        for (name, value) in access_log::body_states(&mut request) {
            host.publish(&name, &value);
        }
        if let Some((policy, model)) = self.refused_model(&mut request) {
            self.refuse_model(host, policy, &model);
            return Verdict::Denied;
        }
        self.decide(host, request)
    }

    /// The first enforcing spend budget that applies to the request (by its matcher, whatever
    /// its key; the `default` policy when no other matches) and refuses the model it names
    /// (`unknown_model: "refuse"`), and that model. A shadow policy refuses nothing, nor does a
    /// canary (`rollout`), which enforces for some keys only: their unpriced models are charged
    /// as the dearest.
    fn refused_model<H: Host>(&self, request: &mut Attributes<'_, H>) -> Option<(usize, String)> {
        let plan = &self.plan;
        for (index, policy) in plan.policies.iter().enumerate() {
            let metered = policy.metered.as_ref();
            let Some((pricing, model)) = metered.and_then(|m| m.source.pricing()) else {
                continue;
            };
            if policy.shadow || policy.rollout.is_some() || !policy.matcher.matches(request) {
                continue;
            }
            let others = plan.policies.iter().filter(|p| !p.fallback);
            if policy.fallback && others.into_iter().any(|p| p.matcher.matches(request)) {
                continue;
            }
            let asked = request.get(model);
            if pricing.refuses(asked) {
                let asked = String::from_utf8_lossy(asked.unwrap_or_default());
                return Some((index, asked.into_owned()));
            }
        }
        None
    }

    /// Refuses a request naming a model that `policy` prices not (400, `MODEL_NOT_PRICED`), in
    /// the shape of the policy's `api`, and counts it.
    fn refuse_model(&self, host: &impl Host, policy: usize, model: &str) {
        let Some(p) = self.plan.policies.get(policy) else {
            return;
        };
        self.counters.unknown_model(policy, PricedAs::Refused);
        host.send_response(&reply::unpriced_model(p.denial.api, &p.name, model));
    }

    /// Whether a policy that reads the body applies to the request, by its matcher (whatever
    /// its key): a body it cannot read must not let the request pass unlimited.
    fn body_needed<H: Host>(&self, request: &mut Attributes<'_, H>) -> bool {
        let plan = &self.plan;
        let mut reading = plan.policies.iter().filter(|p| plan.policy_reads_body(p));
        reading.any(|policy| policy.matcher.matches(request))
    }

    /// Refuses a request for its body (`status`, `details`), with a JSON `error`.
    pub fn refuse_body(&self, host: &impl Host, status: u32, details: &'static str, error: &str) {
        let body = format!(r#"{{"error":"{error}"}}"#);
        let mut reply = LocalReply::new(status, details, GrpcStatus::InvalidArgument, body);
        reply.add_header("content-type", "application/json");
        host.send_response(&reply);
    }

    /// The body to send upstream instead of `body` (the whole of it), when a policy that admitted
    /// the request asks a stream for its usage (`ask_stream_usage`) and the request does not.
    /// The glue asks only for requests to an API that defines how
    /// (`usage::request::asks_stream_usage_on`).
    pub fn stream_usage_body(&self, tab: Option<&Tab>, body: &[u8]) -> Option<Vec<u8>> {
        let asks = |entry: &Entry| {
            let policy = self.plan.policies.get(entry.policy);
            policy.is_some_and(Policy::asks_stream_usage)
        };
        if !tab?.entries.iter().any(asks) {
            return None;
        }
        request_body::ask_stream_usage(request_body::without_bom(body))
    }
}
