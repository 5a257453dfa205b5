//! `GET /admin/v1/top` (read): the heaviest keys of one policy (`crate::top`), or without
//! `policy` every policy recorded with its counts. The query is strict: every parameter is
//! bounded, an unknown or repeated one is refused, and errors name the parameter.

use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use serde::Serialize;

use super::keys::{limit_of, Limit};
use super::{bad_request, Admin, Route};
use crate::decision::check::BadRequest;
use crate::stores::{Namespace, Store};
use crate::top::{self, By, Totals, Window, MAX_LIMIT, MAX_POLICIES};
use crate::web::{error, json, Reply};
use sluice::core::top_keys::{HOUR_SLOT_S, MINUTE_SLOT_S};

pub const ROUTES: [Route; 1] = [Route {
    method: Method::GET,
    path: "/admin/v1/top",
    action: "top.show",
    writes: false,
}];

/// Keys listed when `limit` is not given.
pub const DEFAULT_LIMIT: usize = 10;
/// The longest `policy`: an RLS domain and a policy name.
const MAX_POLICY_BYTES: usize = 300;

/// A query, parsed.
#[derive(Debug, PartialEq, Eq)]
pub struct Query {
    pub namespace: Namespace,
    pub policy: Option<String>,
    pub by: By,
    pub window: Window,
    pub limit: usize,
}

/// Parses `namespace`, `policy`, `by`, `window`, `limit` (percent-encoded as a URL's query).
pub fn parse_query(query: Option<&str>) -> Result<Query, BadRequest> {
    let mut seen: Vec<&str> = Vec::new();
    let mut parsed = Query {
        namespace: Namespace::Http,
        policy: None,
        by: By::Refused,
        window: Window::Minute,
        limit: DEFAULT_LIMIT,
    };
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (name, raw) = pair.split_once('=').unwrap_or((pair, ""));
        let value = decode(raw)
            .ok_or_else(|| BadRequest::new(&name_of(name), "must be percent-encoded UTF-8"))?;
        let field = match name {
            "namespace" | "policy" | "by" | "window" | "limit" => name,
            other => {
                return Err(BadRequest::new(
                    &name_of(other),
                    "unknown parameter (namespace, policy, by, window, limit)",
                ))
            }
        };
        if seen.contains(&field) {
            return Err(BadRequest::new(field, "given more than once"));
        }
        seen.push(field);
        let got = || format!("got {:?}", value.chars().take(32).collect::<String>());
        match field {
            "namespace" => {
                parsed.namespace = match value.as_str() {
                    "http" => Namespace::Http,
                    "rls" => Namespace::Rls,
                    _ => {
                        return Err(BadRequest::new(
                            field,
                            format!("must be http or rls, {}", got()),
                        ))
                    }
                }
            }
            "by" => {
                parsed.by = match value.as_str() {
                    "refused" => By::Refused,
                    "consumed" => By::Consumed,
                    _ => {
                        let reason = format!("must be refused or consumed, {}", got());
                        return Err(BadRequest::new(field, reason));
                    }
                }
            }
            "window" => {
                parsed.window = match value.as_str() {
                    "1m" => Window::Minute,
                    "1h" => Window::Hour,
                    _ => {
                        return Err(BadRequest::new(
                            field,
                            format!("must be 1m or 1h, {}", got()),
                        ))
                    }
                }
            }
            "limit" => {
                parsed.limit = (value.parse::<usize>().ok())
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| {
                        BadRequest::new(field, format!("must be 1 to {MAX_LIMIT}, {}", got()))
                    })?;
            }
            _ => {
                if value.is_empty() || value.len() > MAX_POLICY_BYTES {
                    let reason =
                        format!("must be 1 to {MAX_POLICY_BYTES} bytes, got {}", value.len());
                    return Err(BadRequest::new(field, reason));
                }
                if value.chars().any(char::is_control) {
                    return Err(BadRequest::new(field, "must hold no control characters"));
                }
                parsed.policy = Some(value);
            }
        }
    }
    Ok(parsed)
}

/// A parameter's name as an error names it: cut, and without control characters.
fn name_of(name: &str) -> String {
    name.chars().filter(|c| !c.is_control()).take(32).collect()
}

/// `%XX` and `+` decoded; `None` for a bad escape or bytes that are not UTF-8.
fn decode(text: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        match b {
            b'%' => {
                let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
                bytes.push(u8::from_str_radix(hex, 16).ok()?);
                rest = tail.get(2..)?;
            }
            b'+' => {
                bytes.push(b' ');
                rest = tail;
            }
            _ => {
                bytes.push(b);
                rest = tail;
            }
        }
    }
    String::from_utf8(bytes).ok()
}

#[derive(Serialize)]
struct Key {
    key: String,
    count: u64,
    error: u64,
    /// RLS keys: the entries, with the values `--rls-top-show` names.
    #[serde(skip_serializing_if = "Option::is_none")]
    shown: Option<String>,
}

#[derive(Serialize)]
struct Ranked {
    namespace: &'static str,
    policy: String,
    by: &'static str,
    window: &'static str,
    totals: Totals,
    error_bound: u64,
    keys: Vec<Key>,
}

#[derive(Serialize)]
struct PolicyRow {
    namespace: &'static str,
    policy: String,
    #[serde(rename = "1m")]
    minute: Totals,
    #[serde(rename = "1h")]
    hour: Totals,
    history: History,
    /// The limits its checks used in the last hour, the latest first, as `/admin/v1/keys/...`
    /// take them: where a key it ranks keeps its state.
    limits: Vec<Limit>,
}

/// A policy's counts over time: each window slot by slot, oldest first, the last one the slot
/// under way.
#[derive(Serialize)]
struct History {
    #[serde(rename = "1m")]
    minute: Slots,
    #[serde(rename = "1h")]
    hour: Slots,
}

#[derive(Serialize)]
struct Slots {
    /// Each slot's length in seconds.
    slot_s: u64,
    slots: Vec<Totals>,
}

#[derive(Serialize)]
struct Policies {
    policies: Vec<PolicyRow>,
    max_policies: usize,
    /// Records of policies past `max_policies`, not kept.
    untracked: u64,
}

pub async fn serve<S: Store>(admin: &Admin<S>, request: Request<Incoming>) -> Reply {
    let query = match parse_query(request.uri().query()) {
        Ok(query) => query,
        Err(bad) => return bad_request(&bad),
    };
    let Some(recorder) = &admin.top else {
        return error(
            StatusCode::NOT_FOUND,
            "not_found",
            "top keys are not recorded",
        );
    };
    let now_s = recorder.now_s();
    let Some(policy) = query.policy else {
        let policies = (recorder.summaries(now_s).into_iter())
            .map(|s| PolicyRow {
                namespace: top::namespace_name(s.namespace),
                policy: s.policy,
                minute: s.minute,
                hour: s.hour,
                limits: s.limits.iter().filter_map(limit_of).collect(),
                history: History {
                    minute: Slots {
                        slot_s: MINUTE_SLOT_S,
                        slots: s.minute_slots,
                    },
                    hour: Slots {
                        slot_s: HOUR_SLOT_S,
                        slots: s.hour_slots,
                    },
                },
            })
            .collect();
        let untracked = recorder.untracked();
        let body = Policies {
            policies,
            max_policies: MAX_POLICIES,
            untracked,
        };
        return json(StatusCode::OK, &body);
    };
    let ranking = recorder.ranking(
        now_s,
        query.namespace,
        &policy,
        query.by,
        query.window,
        query.limit,
    );
    let Some(ranking) = ranking else {
        let shown: String = policy.chars().take(64).collect();
        let namespace = top::namespace_name(query.namespace);
        let detail = format!(
            "policy: {shown:?} has recorded nothing in namespace {namespace} (GET /admin/v1/top lists those that have)"
        );
        return error(StatusCode::NOT_FOUND, "unknown_policy", &detail);
    };
    let keys = (ranking.keys.iter())
        .map(|counted| Key {
            key: top::key_text(query.namespace, counted),
            count: counted.count,
            error: counted.error,
            shown: counted.value.as_ref().map(|s| s.parts.to_string()),
        })
        .collect();
    let body = Ranked {
        namespace: top::namespace_name(query.namespace),
        policy,
        by: query.by.name(),
        window: query.window.name(),
        totals: ranking.totals,
        error_bound: ranking.error_bound,
        keys,
    };
    json(StatusCode::OK, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detail(query: &str) -> String {
        parse_query(Some(query)).unwrap_err().detail
    }

    #[test]
    fn defaults_are_refusals_over_the_minute_ten_keys_of_http() {
        let query = parse_query(None).unwrap();
        assert_eq!(
            query,
            Query {
                namespace: Namespace::Http,
                policy: None,
                by: By::Refused,
                window: Window::Minute,
                limit: DEFAULT_LIMIT
            }
        );
        let query = parse_query(Some(
            "policy=edge%2Fper_ip&namespace=rls&by=consumed&window=1h&limit=64",
        ))
        .unwrap();
        assert_eq!(query.policy.as_deref(), Some("edge/per_ip"));
        assert_eq!(
            (query.by, query.window, query.limit),
            (By::Consumed, Window::Hour, 64)
        );
    }

    #[test]
    fn errors_name_the_parameter() {
        assert!(detail("by=denied").starts_with("by: must be refused or consumed"));
        assert!(detail("window=5m").starts_with("window: must be 1m or 1h"));
        assert!(detail("limit=65").starts_with("limit: must be 1 to 64"));
        assert!(detail("limit=99999999999999999999999").starts_with("limit: "));
        assert!(detail("limit=0").starts_with("limit: "));
        assert!(detail("namespace=grpc").starts_with("namespace: "));
        assert!(detail("policy=").starts_with("policy: must be 1 to 300 bytes"));
        assert!(detail(&format!("policy={}", "a".repeat(301))).starts_with("policy: "));
        assert!(detail("policy=a%0Ab").starts_with("policy: must hold no control"));
        assert!(detail("policy=%ZZ").starts_with("policy: must be percent-encoded"));
        assert!(detail("policy=%FF").starts_with("policy: must be percent-encoded"));
        assert!(detail("policy=a&policy=b").starts_with("policy: given more than once"));
        assert!(detail("key=1").starts_with("key: unknown parameter"));
    }
}
