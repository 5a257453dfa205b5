//! The filter's admin path on the wire (`config::admin`): the bodies of `keys/show`,
//! `keys/reset` and `keys/credit` for a local policy's key, and of `top` for a local policy's
//! heaviest keys, read strictly and bounded (an error names the field, as sluice-service's
//! admin API does), and the answers, in the shapes of the service's (`key`, `algorithm`,
//! `capacity`, `remaining`, `reset_ms`, `outcome`; `top`'s as `GET /admin/v1/top`'s).

use crate::core::top_keys::{By, Totals, Window};
use serde::{Deserialize, Serialize};

/// The largest body read: a key of a few parts and a reason.
pub const MAX_BODY_BYTES: usize = 8 * 1024;
/// The longest `reason`, as the service's.
pub const MAX_REASON_BYTES: usize = 500;
/// The most key parts, and the longest of each.
pub const MAX_KEY_PARTS: usize = 16;
pub const MAX_KEY_PART_BYTES: usize = 1024;

/// The endpoints, after the admin path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Show,
    Reset,
    Credit,
    /// A local policy's heaviest keys in this Envoy (`top`).
    Top,
}

impl Action {
    /// The endpoint `rest` names (what follows the admin path in `:path`).
    pub fn of(rest: &[u8]) -> Option<Action> {
        match rest {
            b"/keys/show" => Some(Action::Show),
            b"/keys/reset" => Some(Action::Reset),
            b"/keys/credit" => Some(Action::Credit),
            b"/top" => Some(Action::Top),
            _ => None,
        }
    }

    /// As the audit log and the service name it.
    pub fn name(self) -> &'static str {
        match self {
            Action::Show => "keys.show",
            Action::Reset => "keys.reset",
            Action::Credit => "keys.credit",
            Action::Top => "top.show",
        }
    }

    pub fn writes(self) -> bool {
        matches!(self, Action::Reset | Action::Credit)
    }
}

/// A refused body: `detail` names the field first (`tokens: must be ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRequest {
    pub detail: String,
}

impl BadRequest {
    pub fn new(field: &str, reason: impl std::fmt::Display) -> Self {
        BadRequest {
            detail: format!("{field}: {reason}"),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKeyRequest {
    policy: String,
    #[serde(default)]
    key: Option<Vec<String>>,
    #[serde(default)]
    key_hash: Option<String>,
    #[serde(default)]
    tier: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    tokens: Option<u64>,
    #[serde(default)]
    id: Option<String>,
}

/// How a key is named: by its parts' values (each its part's first alternative, as a bypass
/// entry's `key`), or by its hash as the logs show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyName {
    Values(Vec<String>),
    Hash(u64),
}

/// A keys call, read and bounded; the policy and tier are still names (`limiter::admin` finds
/// them in the plan).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRequest {
    pub policy: String,
    pub key: KeyName,
    /// The tier the key runs at, by the value that selects it; the policy's own limit if none.
    pub tier: Option<String>,
    /// Why (a write's); empty for a read.
    pub reason: String,
    /// A credit's tokens; 0 otherwise.
    pub tokens: u64,
    /// Names a write so that it is applied once (`state::applied`).
    pub id: Option<u64>,
}

/// An admin call's JSON body, at most `MAX_BODY_BYTES`, every error naming the field.
fn read_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, BadRequest> {
    if body.len() > MAX_BODY_BYTES {
        return Err(BadRequest::new(
            "body",
            format!("must be at most {MAX_BODY_BYTES} bytes"),
        ));
    }
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let raw = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { "body".into() } else { path };
        BadRequest::new(&field, e.inner())
    })?;
    deserializer.end().map_err(|e| BadRequest::new("body", e))?;
    Ok(raw)
}

fn check_policy(policy: &str) -> Result<(), BadRequest> {
    if policy.is_empty() || policy.len() > 64 {
        return Err(BadRequest::new("policy", "must be 1 to 64 bytes"));
    }
    Ok(())
}

/// Reads a keys call's body for `action`.
pub fn parse(action: Action, body: &[u8]) -> Result<KeyRequest, BadRequest> {
    let raw: RawKeyRequest = read_body(body)?;
    check_policy(&raw.policy)?;
    let key = match (raw.key, raw.key_hash) {
        (Some(_), Some(_)) => {
            return Err(BadRequest::new(
                "key_hash",
                "give key or key_hash, not both",
            ))
        }
        (None, None) => {
            return Err(BadRequest::new(
                "key",
                "required: the key's value, one string per key part (or key_hash)",
            ))
        }
        (Some(values), None) => {
            if values.is_empty() || values.len() > MAX_KEY_PARTS {
                return Err(BadRequest::new(
                    "key",
                    format!("must hold 1 to {MAX_KEY_PARTS} parts"),
                ));
            }
            if let Some(i) = values.iter().position(|v| v.len() > MAX_KEY_PART_BYTES) {
                return Err(BadRequest::new(
                    &format!("key[{i}]"),
                    format!("must be at most {MAX_KEY_PART_BYTES} bytes"),
                ));
            }
            KeyName::Values(values)
        }
        (None, Some(hash)) => KeyName::Hash(hex16("key_hash", &hash)?),
    };
    if let Some(tier) = &raw.tier {
        if tier.len() > MAX_KEY_PART_BYTES {
            return Err(BadRequest::new(
                "tier",
                format!("must be at most {MAX_KEY_PART_BYTES} bytes"),
            ));
        }
    }
    let unwanted = |field: &str, given: bool| {
        if given {
            Err(BadRequest::new(
                field,
                format!("not taken by {}", action.name()),
            ))
        } else {
            Ok(())
        }
    };
    unwanted("reason", !action.writes() && raw.reason.is_some())?;
    unwanted("id", !action.writes() && raw.id.is_some())?;
    unwanted("tokens", action != Action::Credit && raw.tokens.is_some())?;
    let reason = match action.writes() {
        true => reason(raw.reason.as_deref())?,
        false => String::new(),
    };
    let tokens = match (action, raw.tokens) {
        (Action::Credit, None) => {
            return Err(BadRequest::new(
                "tokens",
                "required: how many tokens to give back",
            ))
        }
        (Action::Credit, Some(0)) => return Err(BadRequest::new("tokens", "must be at least 1")),
        (_, tokens) => tokens.unwrap_or(0),
    };
    let id =
        match (action, raw.id) {
            (Action::Credit, None) => return Err(BadRequest::new(
                "id",
                "required: 16 lowercase hex digits naming this credit, so that it is applied once",
            )),
            (_, Some(id)) => Some(hex16("id", &id)?.max(1)),
            (_, None) => None,
        };
    Ok(KeyRequest {
        policy: raw.policy,
        key,
        tier: raw.tier,
        reason,
        tokens,
        id,
    })
}

/// 16 lowercase hex digits.
fn hex16(field: &str, text: &str) -> Result<u64, BadRequest> {
    let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
    if text.len() == 16 && text.chars().all(hex) {
        if let Ok(n) = u64::from_str_radix(text, 16) {
            return Ok(n);
        }
    }
    let shown: String = text.chars().take(32).collect();
    Err(BadRequest::new(
        field,
        format!("must be 16 lowercase hex digits, got {shown:?}"),
    ))
}

/// A write's `reason`: required, 1 to `MAX_REASON_BYTES` once trimmed, no control characters.
fn reason(reason: Option<&str>) -> Result<String, BadRequest> {
    let Some(reason) = reason.map(str::trim) else {
        return Err(BadRequest::new(
            "reason",
            "required for a write: why it is made, for the audit log",
        ));
    };
    if reason.is_empty() || reason.len() > MAX_REASON_BYTES {
        return Err(BadRequest::new(
            "reason",
            format!(
                "must be 1 to {MAX_REASON_BYTES} bytes, got {}",
                reason.len()
            ),
        ));
    }
    if reason.chars().any(char::is_control) {
        return Err(BadRequest::new("reason", "must hold no control characters"));
    }
    Ok(reason.to_string())
}

/// A local key's state in this Envoy, as `keys/show` answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyState {
    /// `<policy>/<key hash>`, as the service and the access log name a key.
    pub key: String,
    pub policy: String,
    /// The key's hash as the logs show it (16 hex digits).
    pub key_hash: String,
    pub scope: &'static str,
    pub algorithm: &'static str,
    /// The limit: the most one request can get (the bucket, the window's limit, the slots).
    pub capacity: u64,
    pub requests: u64,
    pub per_ms: u64,
    /// Where the limit comes from: `policy`, `tier` or `override`.
    pub source: &'static str,
    /// The tier's value, when a tier's limit applies.
    pub tier: Option<String>,
    /// Whole tokens (slots) left now, with this worker's loans.
    pub remaining: u64,
    /// Until the bucket is full again, or the window ends.
    pub reset_ms: u64,
    /// Tokens owed past the limit (0 for an algorithm that cannot owe).
    pub debt: u64,
    /// A concurrency policy's slots in use; `None` for the others.
    pub slots_in_use: Option<u64>,
    /// Whether this Envoy holds a state for the key at all (a key it has not seen has its
    /// whole limit).
    pub held: bool,
}

/// The answer of a write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Written {
    pub key: String,
    /// `done`; `unchanged` (nothing to reset or give back); `duplicate` (its `id` was
    /// applied already).
    pub outcome: &'static str,
    /// A credit's tokens given back (at most what was asked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credited: Option<u64>,
}

/// Keys `top` lists when `limit` is not given, and the most it lists (as the service's).
pub const DEFAULT_TOP_LIMIT: usize = 10;
pub const MAX_TOP_LIMIT: usize = crate::core::top_keys::KEPT_LIVE;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTopRequest {
    policy: String,
    #[serde(default)]
    by: Option<String>,
    #[serde(default)]
    window: Option<String>,
    #[serde(default)]
    limit: Option<u64>,
}

/// A `top` call: a local policy's `limit` heaviest keys `by` refusals or consumption over
/// `window`; the policy still a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopRequest {
    pub policy: String,
    pub by: By,
    pub window: Window,
    pub limit: usize,
}

/// Reads a `top` call's body: `{"policy": P, "by": "refused"|"consumed", "window":
/// "1m"|"1h", "limit": 1..=64}`, `by`, `window` and `limit` optional as in the service's query.
pub fn parse_top(body: &[u8]) -> Result<TopRequest, BadRequest> {
    let raw: RawTopRequest = read_body(body)?;
    check_policy(&raw.policy)?;
    let got = |text: &str| format!("got {:?}", text.chars().take(32).collect::<String>());
    let by = match raw.by.as_deref() {
        None => By::Refused,
        Some(text) => By::of(text).ok_or_else(|| {
            BadRequest::new("by", format!("must be refused or consumed, {}", got(text)))
        })?,
    };
    let window = match raw.window.as_deref() {
        None => Window::Minute,
        Some(text) => Window::of(text)
            .ok_or_else(|| BadRequest::new("window", format!("must be 1m or 1h, {}", got(text))))?,
    };
    let limit = match raw.limit {
        None => DEFAULT_TOP_LIMIT,
        Some(n) => usize::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_TOP_LIMIT).contains(n))
            .ok_or_else(|| {
                BadRequest::new("limit", format!("must be 1 to {MAX_TOP_LIMIT}, got {n}"))
            })?,
    };
    Ok(TopRequest {
        policy: raw.policy,
        by,
        window,
        limit,
    })
}

/// One key of a `top` answer: its hash as the logs show it, its count and
/// how much of the count may be other keys' (the true count is in `count - error ..= count`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopKey {
    pub key: String,
    pub count: u64,
    pub error: u64,
    /// Its parts as `admin.top_show` lets them show (`header:x-user=alice header:x-api-key=#`);
    /// absent when it names none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shown: Option<String>,
}

/// The answer of `top`, in the shape of the service's `GET /admin/v1/top` (with `namespace`
/// `local`), and the workers whose parts it merged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopAnswer {
    pub namespace: &'static str,
    pub policy: String,
    pub by: &'static str,
    pub window: &'static str,
    pub totals: Totals,
    /// The bound of every key's `error`.
    pub error_bound: u64,
    pub keys: Vec<TopKey>,
    /// Workers of this Envoy whose parts were merged: those that recorded anything of a local
    /// policy in the last hour (and published in the last `state::top::LAPSE_S` seconds).
    pub workers: usize,
}

/// The body of an error: `{"error": ..., "detail": ...}`, as the service's.
pub fn error_body(error: &str, detail: &str) -> String {
    #[derive(Serialize)]
    struct ErrorBody<'a> {
        error: &'a str,
        detail: &'a str,
    }
    serde_json::to_string(&ErrorBody { error, detail }).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(action: Action, body: &str) -> String {
        parse(action, body.as_bytes()).unwrap_err().detail
    }

    #[test]
    fn a_top_call_defaults_to_refusals_over_the_minute_and_names_a_bad_field() {
        let asked = parse_top(br#"{"policy": "api"}"#).unwrap();
        let expected = TopRequest {
            policy: "api".into(),
            by: By::Refused,
            window: Window::Minute,
            limit: DEFAULT_TOP_LIMIT,
        };
        assert_eq!(asked, expected);
        let asked =
            parse_top(br#"{"policy": "api", "by": "consumed", "window": "1h", "limit": 64}"#);
        let asked = asked.unwrap();
        assert_eq!(
            (asked.by, asked.window, asked.limit),
            (By::Consumed, Window::Hour, 64)
        );
        let detail = |body: &str| parse_top(body.as_bytes()).unwrap_err().detail;
        assert!(detail(r#"{"policy": "api", "by": "denied"}"#).starts_with("by: must be"));
        assert!(detail(r#"{"policy": "api", "window": "5m"}"#).starts_with("window: must be"));
        assert!(detail(r#"{"policy": "api", "limit": 65}"#).starts_with("limit: must be 1 to 64"));
        assert!(detail(r#"{"policy": "api", "limit": 0}"#).starts_with("limit: "));
        assert!(detail(r#"{"policy": ""}"#).starts_with("policy: "));
        assert!(detail(r#"{"policy": "api", "key": "x"}"#).contains("unknown field `key`"));
        assert!(detail(r#"{}"#).contains("policy"));
    }

    #[test]
    fn a_show_names_a_key_by_its_values_or_its_hash() {
        let by_value = parse(Action::Show, br#"{"policy": "api", "key": ["acme"]}"#).unwrap();
        assert_eq!(by_value.key, KeyName::Values(vec!["acme".into()]));
        let by_hash = parse(
            Action::Show,
            br#"{"policy": "api", "key_hash": "5c0f4b1de6a2b3c4"}"#,
        )
        .unwrap();
        assert_eq!(by_hash.key, KeyName::Hash(0x5c0f_4b1d_e6a2_b3c4));
        assert_eq!((by_hash.reason.as_str(), by_hash.id), ("", None));
    }

    #[test]
    fn every_refusal_names_its_field() {
        let cases = [
            (Action::Show, r#"{"policy": "api"}"#, "key:"),
            (
                Action::Show,
                r#"{"policy": "api", "key": ["a"], "key_hash": "0000000000000001"}"#,
                "key_hash:",
            ),
            (
                Action::Show,
                r#"{"policy": "api", "key_hash": "5C0F4B1DE6A2B3C4"}"#,
                "key_hash:",
            ),
            (Action::Show, r#"{"policy": "api", "key": []}"#, "key:"),
            (Action::Show, r#"{"policy": "", "key": ["a"]}"#, "policy:"),
            (
                Action::Show,
                r#"{"policy": "api", "key": ["a"], "reason": "x"}"#,
                "reason:",
            ),
            (
                Action::Show,
                r#"{"policy": "api", "key": ["a"], "extra": 1}"#,
                "extra:",
            ),
            (Action::Show, r#"{"policy": "api", "key": [1]}"#, "key[0]:"),
            (
                Action::Reset,
                r#"{"policy": "api", "key": ["a"]}"#,
                "reason:",
            ),
            (
                Action::Reset,
                r#"{"policy": "api", "key": ["a"], "reason": " "}"#,
                "reason:",
            ),
            (
                Action::Reset,
                r#"{"policy": "api", "key": ["a"], "reason": "a\u0007"}"#,
                "reason:",
            ),
            (
                Action::Reset,
                r#"{"policy": "api", "key": ["a"], "reason": "r", "tokens": 1}"#,
                "tokens:",
            ),
            (
                Action::Credit,
                r#"{"policy": "api", "key": ["a"], "reason": "r", "id": "0000000000000001"}"#,
                "tokens:",
            ),
            (
                Action::Credit,
                r#"{"policy": "api", "key": ["a"], "reason": "r", "tokens": 0, "id": "0000000000000001"}"#,
                "tokens:",
            ),
            (
                Action::Credit,
                r#"{"policy": "api", "key": ["a"], "reason": "r", "tokens": 2}"#,
                "id:",
            ),
            (
                Action::Credit,
                r#"{"policy": "api", "key": ["a"], "reason": "r", "tokens": -2, "id": "0000000000000001"}"#,
                "tokens:",
            ),
            (
                Action::Credit,
                r#"{"policy": "api", "key": ["a"], "reason": "r", "tokens": 2, "id": "xyz"}"#,
                "id:",
            ),
            (
                Action::Show,
                r#"{"policy": "api", "key": ["a"]} {}"#,
                "body:",
            ),
            (Action::Show, "", "body:"),
        ];
        for (action, body, field) in cases {
            let detail = refused(action, body);
            assert!(detail.starts_with(field), "{body}: {detail}");
        }
        let long = format!(
            r#"{{"policy": "api", "key": ["a"], "reason": "{}"}}"#,
            "r".repeat(501)
        );
        assert!(refused(Action::Reset, &long).starts_with("reason:"));
        let huge = format!(r#"{{"policy": "api", "key": ["{}"]}}"#, "a".repeat(9000));
        assert!(refused(Action::Show, &huge).starts_with("body:"));
    }

    #[test]
    fn a_write_keeps_its_reason_and_id() {
        let credit = parse(
            Action::Credit,
            br#"{"policy": "api", "key": ["acme"], "tokens": 5, "id": "4f1e9a0c2b3d5e6f", "reason": " goodwill "}"#,
        )
        .unwrap();
        assert_eq!(credit.tokens, 5);
        assert_eq!(credit.id, Some(0x4f1e_9a0c_2b3d_5e6f));
        assert_eq!(credit.reason, "goodwill");
        let reset = parse(
            Action::Reset,
            br#"{"policy": "api", "key": ["acme"], "reason": "INC-42"}"#,
        )
        .unwrap();
        assert_eq!(reset.id, None, "a reset's id is optional");
    }

    #[test]
    fn only_the_three_endpoints_are_actions() {
        assert_eq!(Action::of(b"/keys/show"), Some(Action::Show));
        assert_eq!(Action::of(b"/keys/credit"), Some(Action::Credit));
        for other in [
            &b""[..],
            b"/",
            b"/keys",
            b"/keys/show/",
            b"/keys/show?x=1",
            b"/KEYS/SHOW",
        ] {
            assert_eq!(Action::of(other), None);
        }
    }
}
