//! The status path (`status_path`): the filter answers a request for it itself, with the
//! client's own quota under every enforcing policy that applies to the request (its matching,
//! key, tier and route, as any request of it gets), read from shared data without charging or
//! writing anything, asking the service or forwarding anything upstream.
//!
//! Only the request's whole `:path`, byte for byte, is the status path: with a query, a trailing
//! slash or another case it is an ordinary request, decided and forwarded as any other. There is
//! no parameter: a client can only ever see the keys its own request has. GET and HEAD are
//! answered; any other method gets a 405 that reads nothing.

use super::{Filter, Host, Verdict};
use crate::config::GrpcStatus;
use crate::core::algorithm::{Algorithm, Window};
use crate::core::request::Attributes;
use crate::limiter::{Basis, Standing};
use crate::output::reply::{self, LocalReply};
use crate::output::status::{self, Line, Source};

impl Filter {
    /// Answers a request for the status path (`asks_status`): a JSON 200 to GET and HEAD, a 405
    /// to the rest. Sends the reply itself.
    pub fn answer_status(&self, host: &impl Host) -> Verdict {
        let method = host.header(":method");
        let reply = match method.as_deref() {
            Some(b"GET" | b"HEAD") => {
                let now = self.now(host);
                let mut request = Attributes::new(host, &self.plan.attrs);
                let standings = self.limiter(host, |l| l.status(&mut request, now));
                let lines = standings.iter().filter_map(|s| self.status_line(s));
                let body = status::body(lines);
                let mut reply =
                    LocalReply::new(200, reply::STATUS, GrpcStatus::Unimplemented, body);
                reply.add_header("content-type", "application/json");
                reply.add_header("cache-control", "no-store");
                reply
            }
            _ => {
                let body = r#"{"error":"method_not_allowed","allow":["GET","HEAD"]}"#.into();
                let mut reply =
                    LocalReply::new(405, reply::STATUS, GrpcStatus::Unimplemented, body);
                reply.add_header("content-type", "application/json");
                reply.add_header("allow", "GET, HEAD");
                reply
            }
        };
        host.send_response(&reply);
        Verdict::Denied
    }

    fn status_line(&self, standing: &Standing) -> Option<Line<'_>> {
        let applied = &standing.applied;
        let quota = self.quota(applied)?;
        let source = match (standing.known, applied.basis) {
            (false, _) => Source::Unknown,
            (true, Basis::Bucket | Basis::Loan) => Source::Local,
            (true, _) => Source::LocalEstimate,
        };
        let calendar = match applied.tier.algorithm {
            Algorithm::FixedWindow(Window {
                calendar: Some(calendar),
                ..
            }) => calendar
                .describe()
                .map(|(zone, _)| (calendar.unit.name(), zone)),
            _ => None,
        };
        Some(Line {
            quota,
            source,
            calendar,
        })
    }
}
