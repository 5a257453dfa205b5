//! Envoy's Rate Limit Service protocol as the filter speaks it, for global policies decided by
//! any RLS v3 server (`"global": {"protocol": "rls"}`): `ShouldRateLimit` over gRPC, one
//! descriptor per policy that asks, in the protobuf of `envoy.service.ratelimit.v3`, written and
//! read here by hand (a few fields; no protobuf runtime in the VM).
//!
//! A policy's descriptor is `("generic_key", <policy name>)` followed by one entry per key part,
//! named as Envoy's own rate-limit actions name them, so that a configuration written for
//! Envoy's `rate_limits` serves: `header:NAME` is `(NAME, value)` (a `request_headers` action
//! with `descriptor_key` NAME), `ip` is `remote_address`, `path`, `method`, `authority` and
//! `route` are themselves, `metadata:NS:KEY.PATH` is `KEY.PATH`, and `global` adds no entry. Its
//! `hits_addend` is the policy's `cost` (and the request's too when every descriptor costs the
//! same, for servers that read only that one).

use crate::core::algorithm::Decision;
use crate::core::duration::NANOS_PER_SEC;
use crate::core::key::{KeyPart, Source};
use crate::core::request::{Attr, Attributes, RequestSource};
use crate::wire::protocol::{Answer, Check};

pub const SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";
pub const METHOD: &str = "ShouldRateLimit";
/// An over-limit answer without a `duration_until_reset` is retried after this long.
const DEFAULT_RETRY: u64 = NANOS_PER_SEC;

/// The name a descriptor entry gives the attribute a key part read; `None` for none.
pub fn entry_key(attr: &Attr) -> Option<String> {
    Some(match attr {
        Attr::Header(name) => name.clone(),
        Attr::Ip => "remote_address".into(),
        Attr::Path => "path".into(),
        Attr::Method => "method".into(),
        Attr::Authority => "authority".into(),
        Attr::Route => "route".into(),
        Attr::Metadata { path, .. } => path.join("."),
        Attr::Body(crate::core::request::BodyField::String(name)) => name.clone(),
        Attr::RouteMetadata | Attr::Body(_) => return None,
    })
}

/// A policy's descriptor: `generic_key` its name, then its key's `entries`.
pub fn descriptor(policy: &str, entries: &[(String, String)]) -> Vec<(String, String)> {
    let name = ("generic_key".to_string(), policy.to_string());
    std::iter::once(name)
        .chain(entries.iter().cloned())
        .collect()
}

/// A key's parts as descriptor entries, as the request holds them (a part it lacks, for
/// `missing_key: shared`, adds no entry). A value that is not UTF-8 is sent with its invalid
/// bytes replaced.
pub fn key_entries<R: RequestSource + ?Sized>(
    parts: &[KeyPart],
    request: &mut Attributes<R>,
) -> Vec<(String, String)> {
    let mut entries = Vec::with_capacity(parts.len());
    for part in parts {
        let Some((position, value)) = part.resolve(request) else {
            continue;
        };
        let value = String::from_utf8_lossy(value).into_owned();
        let attr = match part.alternatives.get(position) {
            Some(Source::Attr(index)) => request.attr(*index),
            _ => None,
        };
        if let Some(key) = attr.and_then(entry_key) {
            entries.push((key, value));
        }
    }
    entries
}

/// The `RateLimitRequest` asking about `checks` in `domain`.
pub fn encode(domain: &str, checks: &[Check]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 * checks.len() + domain.len());
    bytes_field(&mut out, 1, domain.as_bytes());
    for check in checks {
        let mut descriptor = Vec::with_capacity(64);
        for (key, value) in &check.entries {
            let mut entry = Vec::with_capacity(key.len() + value.len() + 4);
            bytes_field(&mut entry, 1, key.as_bytes());
            bytes_field(&mut entry, 2, value.as_bytes());
            bytes_field(&mut descriptor, 1, &entry);
        }
        let mut hits = Vec::with_capacity(10);
        varint_field(&mut hits, 1, check.cost);
        bytes_field(&mut descriptor, 3, &hits);
        bytes_field(&mut out, 2, &descriptor);
    }
    let costs = checks.iter().map(|c| c.cost);
    if let Some(cost) = costs
        .clone()
        .next()
        .filter(|&c| costs.clone().all(|d| d == c))
    {
        varint_field(&mut out, 3, cost.min(u64::from(u32::MAX)));
    }
    out
}

/// The answers to `checks` in a `RateLimitResponse`: one status per descriptor, in order, or the
/// overall code for all when the server sent no statuses. `None` when it is not one.
pub fn decode(body: &[u8], checks: &[Check]) -> Option<Vec<Answer>> {
    let mut overall = 0;
    let mut statuses = Vec::with_capacity(checks.len());
    for field in Fields(body) {
        match field? {
            (1, Value::Varint(code)) => overall = code,
            (2, Value::Bytes(status)) => statuses.push(Status::decode(status)?),
            _ => {}
        }
    }
    if statuses.is_empty() {
        statuses = checks.iter().map(|_| Status::of_code(overall)).collect();
    }
    if statuses.len() != checks.len() {
        return None;
    }
    Some(
        checks
            .iter()
            .zip(statuses)
            .map(|(c, s)| s.answer(c))
            .collect(),
    )
}

/// One descriptor's status, as far as the filter reads it.
#[derive(Debug, Default)]
struct Status {
    code: u64,
    /// `limit_remaining`, when the server named the limit it applied (`current_limit`).
    remaining: Option<u64>,
    until_reset: Option<u64>,
}

/// `RateLimitResponse.Code.OVER_LIMIT`.
const OVER_LIMIT: u64 = 2;

impl Status {
    fn of_code(code: u64) -> Status {
        Status {
            code,
            ..Status::default()
        }
    }

    fn decode(bytes: &[u8]) -> Option<Status> {
        let (mut status, mut limited, mut remaining) = (Status::default(), false, 0);
        for field in Fields(bytes) {
            match field? {
                (1, Value::Varint(code)) => status.code = code,
                (2, Value::Bytes(_)) => limited = true,
                (3, Value::Varint(left)) => remaining = left,
                (4, Value::Bytes(duration)) => status.until_reset = Some(nanos(duration)?),
                _ => {}
            }
        }
        status.remaining = limited.then_some(remaining);
        Some(status)
    }

    /// The answer for `check`: a server that named no limit left the whole of the policy's.
    fn answer(self, check: &Check) -> Answer {
        let reset_after = self.until_reset.unwrap_or(0);
        let decision = Decision {
            allowed: self.code != OVER_LIMIT,
            remaining: self.remaining.unwrap_or(check.burst),
            reset_after,
            ..Decision::default()
        };
        Answer {
            allowed: decision.allowed,
            granted: if decision.allowed { check.cost } else { 0 },
            remaining: decision.remaining,
            reset_after,
            retry_after: match (decision.allowed, reset_after) {
                (true, _) => 0,
                (false, 0) => DEFAULT_RETRY,
                (false, wait) => wait,
            },
            delay: 0,
        }
    }
}

/// A `google.protobuf.Duration` in nanoseconds (negative ones as 0).
fn nanos(bytes: &[u8]) -> Option<u64> {
    let (mut seconds, mut nanos) = (0u64, 0u64);
    for field in Fields(bytes) {
        match field? {
            (1, Value::Varint(s)) => seconds = if (s as i64) < 0 { 0 } else { s },
            (2, Value::Varint(n)) => nanos = if (n as i32) < 0 { 0 } else { n & 0xffff_ffff },
            _ => {}
        }
    }
    Some(
        seconds
            .saturating_mul(NANOS_PER_SEC)
            .saturating_add(nanos.min(NANOS_PER_SEC - 1)),
    )
}

/// A field's value by its wire type: varints and fixed-width numbers, or bytes.
enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

/// The fields of a protobuf message, in order; `Some(None)` ends it at the first malformed one.
struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = Option<(u64, Value<'a>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let field = self.read();
        if field.is_none() {
            self.0 = &[];
        }
        Some(field)
    }
}

impl<'a> Fields<'a> {
    fn read(&mut self) -> Option<(u64, Value<'a>)> {
        let tag = self.varint()?;
        let value = match tag & 7 {
            0 => Value::Varint(self.varint()?),
            1 => self.skip(8)?,
            2 => {
                let len = usize::try_from(self.varint()?).ok()?;
                let (bytes, rest) = self.0.split_at_checked(len)?;
                self.0 = rest;
                Value::Bytes(bytes)
            }
            5 => self.skip(4)?,
            _ => return None,
        };
        Some((tag >> 3, value))
    }

    fn skip(&mut self, n: usize) -> Option<Value<'a>> {
        self.0 = self.0.get(n..)?;
        Some(Value::Fixed)
    }

    fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self.0.split_first()?;
            self.0 = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Some(value);
            }
        }
        None
    }
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn varint_field(out: &mut Vec<u8>, field: u64, value: u64) {
    varint(out, field << 3);
    varint(out, value);
}

fn bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, (field << 3) | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// The `envoy.config.core.v3.GrpcService` that names an Envoy cluster: what Envoy's
/// `proxy_grpc_call` takes to reach it, with the `:authority` to send.
pub fn grpc_service(cluster: &str, authority: &str) -> Vec<u8> {
    let mut envoy_grpc = Vec::with_capacity(cluster.len() + authority.len() + 4);
    bytes_field(&mut envoy_grpc, 1, cluster.as_bytes());
    bytes_field(&mut envoy_grpc, 2, authority.as_bytes());
    let mut service = Vec::with_capacity(envoy_grpc.len() + 2);
    bytes_field(&mut service, 1, &envoy_grpc);
    service
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::algorithm::Kind;
    use proptest::prelude::*;

    fn check(cost: u64, entries: &[(&str, &str)]) -> Check {
        Check {
            calendar: None,
            key: "p/0".into(),
            algorithm: Kind::TokenBucket,
            requests: 10,
            per_ms: 1000,
            burst: 10,
            cost,
            take: None,
            max_delay_ms: None,
            slot: None,
            entries: entries
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn status(code: u64, remaining: Option<u64>, reset_ms: Option<u64>) -> Vec<u8> {
        let mut out = Vec::new();
        varint_field(&mut out, 1, code);
        if let Some(remaining) = remaining {
            let mut limit = Vec::new();
            varint_field(&mut limit, 1, 10);
            varint_field(&mut limit, 2, 1);
            bytes_field(&mut out, 2, &limit);
            varint_field(&mut out, 3, remaining);
        }
        if let Some(ms) = reset_ms {
            let mut duration = Vec::new();
            varint_field(&mut duration, 1, ms / 1000);
            varint_field(&mut duration, 2, (ms % 1000) * 1_000_000);
            bytes_field(&mut out, 4, &duration);
        }
        out
    }

    fn response(overall: u64, statuses: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        varint_field(&mut out, 1, overall);
        for s in statuses {
            bytes_field(&mut out, 2, s);
        }
        out
    }

    #[test]
    fn a_request_carries_the_domain_each_descriptor_and_its_hits() {
        let checks = [check(
            3,
            &[("generic_key", "per-user"), ("x-user-id", "alice")],
        )];
        let body = encode("sluice", &checks);
        let fields: Vec<(u64, Vec<u8>)> = Fields(&body)
            .map(|f| match f.unwrap() {
                (n, Value::Bytes(b)) => (n, b.to_vec()),
                (n, Value::Varint(v)) => (n, v.to_le_bytes().to_vec()),
                (n, Value::Fixed) => (n, vec![]),
            })
            .collect();
        assert_eq!(fields[0], (1, b"sluice".to_vec()));
        assert_eq!(
            fields[2],
            (3, 3u64.to_le_bytes().to_vec()),
            "the request's hits too"
        );
        let entries: Vec<Vec<u8>> = Fields(&fields[1].1)
            .filter_map(|f| match f.unwrap() {
                (1, Value::Bytes(entry)) => Some(entry.to_vec()),
                _ => None,
            })
            .collect();
        assert_eq!(entries.len(), 2);
        assert!(entries[1].windows(5).any(|w| w == b"alice"));
    }

    #[test]
    fn descriptors_of_different_costs_leave_the_requests_hits_unset() {
        let body = encode("d", &[check(1, &[]), check(2, &[])]);
        assert!(Fields(&body).all(|f| f.unwrap().0 != 3));
    }

    #[test]
    fn statuses_become_answers_in_order() {
        let checks = [check(1, &[]), check(1, &[])];
        let body = response(
            2,
            &[
                status(1, Some(7), Some(1500)),
                status(2, Some(0), Some(2000)),
            ],
        );
        let answers = decode(&body, &checks).unwrap();
        assert_eq!(
            (
                answers[0].allowed,
                answers[0].remaining,
                answers[0].reset_after
            ),
            (true, 7, 1_500_000_000)
        );
        assert_eq!(
            (answers[1].allowed, answers[1].retry_after),
            (false, 2 * NANOS_PER_SEC)
        );
    }

    #[test]
    fn a_server_without_statuses_answers_all_with_its_overall_code_and_limits_nothing_it_names_not()
    {
        let answers = decode(&response(1, &[]), &[check(1, &[])]).unwrap();
        assert_eq!((answers[0].allowed, answers[0].remaining), (true, 10));
        let over = decode(&response(2, &[]), &[check(1, &[])]).unwrap();
        assert_eq!(
            (over[0].allowed, over[0].retry_after),
            (false, NANOS_PER_SEC)
        );
        assert_eq!(decode(&response(1, &[status(1, None, None)]), &[]), None);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_the_decoder(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&bytes, &[check(1, &[]), check(2, &[])]);
        }
    }
}
