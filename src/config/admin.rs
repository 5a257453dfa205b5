//! The filter's own admin path (`admin`): off unless configured, served only on the listener the
//! operator names, to callers with a token from the VM's environment. What it serves is
//! `filter::admin`'s; this is its configuration, validated once, and the tokens' check.
//!
//! Envoy 1.40 shows a filter no listener name (`xds.listener_name` is not one of its attributes:
//! tried, it reads as absent), so the listener is named in its own metadata:
//! `metadata.filter_metadata.sluice.listener`, which Envoy shows as
//! `xds.listener_metadata`. A listener without it, or with another name, never serves the path.

use super::{error, ConfigError, Env};
use crate::core::key::{parse_part, Source};
use crate::core::request::Attr;

/// `admin.path` when the configuration does not say.
pub const DEFAULT_ADMIN_PATH: &str = "/sluice/admin/v1";
/// The most bytes of `admin.path`.
pub const MAX_ADMIN_PATH: usize = 200;
/// The property holding the name the listener gives itself for sluice.
pub const LISTENER_PROPERTY: [&str; 5] = [
    "xds",
    "listener_metadata",
    "filter_metadata",
    "sluice",
    "listener",
];
/// The longest token name: it goes into every audit line.
pub const MAX_TOKEN_NAME: usize = 64;
/// The most tokens one variable holds.
pub const MAX_TOKENS: usize = 64;

/// The admin path, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminPath {
    /// The prefix of its endpoints (`<path>/keys/show`...), without a trailing `/`.
    pub path: String,
    /// The name the serving listener's metadata must give (`LISTENER_PROPERTY`).
    pub listener: String,
    pub tokens: Vec<AdminToken>,
    /// The key parts whose values `<path>/top` shows (`top_show`), each one source; every
    /// other part shows as `name=#`.
    pub top_show: Vec<Attr>,
}

/// A token, which must never reach a log: its `Debug` shows only that it is there.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// One token: who holds it (the audit log's `who`) and whether it may write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminToken {
    pub name: String,
    pub token: Token,
    pub writes: bool,
}

/// Who called, once their token is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller<'a> {
    pub name: &'a str,
    pub writes: bool,
}

impl AdminPath {
    /// Whether `path` (a request's whole `:path`) is under the admin path: only then is the
    /// listener looked at.
    pub fn covers(&self, path: &[u8]) -> bool {
        let Some(rest) = path.strip_prefix(self.path.as_bytes()) else {
            return false;
        };
        matches!(rest.first(), None | Some(b'/' | b'?'))
    }

    /// The caller an `authorization` header names: `Bearer <token>` with a token of either
    /// variable. Every token is compared, each in time that does not depend on where it
    /// differs, so that the time taken says nothing of any token.
    pub fn caller(&self, authorization: Option<&[u8]>) -> Option<Caller<'_>> {
        let offered = authorization?.strip_prefix(b"Bearer ")?;
        let mut found = None;
        for token in &self.tokens {
            if same(offered, token.token.expose().as_bytes()) && found.is_none() {
                found = Some(Caller {
                    name: &token.name,
                    writes: token.writes,
                });
            }
        }
        found
    }
}

/// `offered == secret`, in time that depends on the secret's length only.
fn same(offered: &[u8], secret: &[u8]) -> bool {
    let mut differ = u8::from(offered.len() != secret.len());
    for (i, byte) in secret.iter().enumerate() {
        let given = offered.get(i).copied().unwrap_or(0);
        differ |= std::hint::black_box(given ^ byte);
    }
    std::hint::black_box(differ) == 0
}

/// What `admin` says as written.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    pub(super) path: Option<String>,
    pub(super) listener: String,
    pub(super) token_env: String,
    pub(super) read_token_env: Option<String>,
    #[serde(default)]
    pub(super) top_show: Vec<String>,
}

pub(super) fn admin(raw: &RawAdmin, env: Env) -> Result<AdminPath, ConfigError> {
    let path = admin_path(raw.path.as_deref().unwrap_or(DEFAULT_ADMIN_PATH))?;
    if !is_name(&raw.listener) {
        return Err(error(
            "admin.listener",
            format!(
                "must be 1 to {MAX_TOKEN_NAME} of A-Z a-z 0-9 _ . - (the value of the listener's metadata.filter_metadata.sluice.listener), got {:?}",
                raw.listener.chars().take(80).collect::<String>()
            ),
        ));
    }
    let mut tokens = tokens_of("admin.token_env", &raw.token_env, "admin", true, env)?;
    if let Some(name) = &raw.read_token_env {
        tokens.extend(tokens_of("admin.read_token_env", name, "read", false, env)?);
    }
    Ok(AdminPath {
        path,
        listener: raw.listener.clone(),
        tokens,
        top_show: top_show(&raw.top_show)?,
    })
}

/// The tokens of one variable: one per non-empty line (or `;`-separated entry, for
/// environments that hold no newline), each `NAME TOKEN` or only `TOKEN` (then named
/// `default_name`). Errors name the field and the entry, never a token.
fn tokens_of(
    field: &str,
    variable: &str,
    default_name: &str,
    writes: bool,
    env: Env,
) -> Result<Vec<AdminToken>, ConfigError> {
    let first_ok = |b: &u8| b.is_ascii_alphabetic() || *b == b'_';
    let valid = variable.as_bytes().first().is_some_and(first_ok)
        && variable
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid {
        return Err(error(
            field,
            "must name an environment variable (letters, digits and '_', not starting with a digit)",
        ));
    }
    let text = env(variable).unwrap_or_default();
    let mut tokens = Vec::new();
    for (number, entry) in text.split(['\n', ';']).enumerate() {
        let entry_no = number + 1;
        let words: Vec<&str> = entry.split_ascii_whitespace().collect();
        let (name, token) = match words.as_slice() {
            [] => continue,
            [token] => (default_name, *token),
            [name, token] => (*name, *token),
            _ => {
                return Err(error(
                    field,
                    format!(
                    "{variable}: entry {entry_no} must be `NAME TOKEN` or `TOKEN`, got {} words",
                    words.len()
                ),
                ))
            }
        };
        if !is_name(name) {
            return Err(error(
                field,
                format!(
                    "{variable}: entry {entry_no}: a name is 1 to {MAX_TOKEN_NAME} of A-Z a-z 0-9 _ . @ -"
                ),
            ));
        }
        if token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(error(
                field,
                format!(
                    "{variable}: entry {entry_no}: a token is at least 16 printable ASCII characters (e.g. `openssl rand -hex 16`), got {} bytes",
                    token.len()
                ),
            ));
        }
        tokens.push(AdminToken {
            name: name.to_string(),
            token: Token(token.to_string()),
            writes,
        });
    }
    if tokens.is_empty() {
        return Err(error(
            field,
            format!(
                "environment variable {variable:?} is not set or empty in the wasm VM (list it in \
                 vm_config.environment_variables, or a WasmPlugin's vmConfig.env)"
            ),
        ));
    }
    if tokens.len() > MAX_TOKENS {
        return Err(error(
            field,
            format!("{variable}: at most {MAX_TOKENS} tokens"),
        ));
    }
    Ok(tokens)
}

/// The most entries of `admin.top_show`.
pub const MAX_TOP_SHOW: usize = 16;

/// `admin.top_show`: key parts as a policy's `key` writes them, one source each (`header:NAME`,
/// `metadata:NAMESPACE:KEY`, `ip`, ...), whose values `<path>/top` may show. A part that carries
/// a credential never is: `authorization`, `proxy-authorization`, `cookie`, and any header whose
/// name holds `key`, `token`, `secret`, `auth`, `pass` or `session`; those show as their key
/// hash only.
fn top_show(entries: &[String]) -> Result<Vec<Attr>, ConfigError> {
    if entries.len() > MAX_TOP_SHOW {
        return Err(error(
            "admin.top_show",
            format!("at most {MAX_TOP_SHOW} key parts"),
        ));
    }
    let mut shown = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let field = format!("admin.top_show[{i}]");
        let mut attrs = Vec::new();
        let part = parse_part(entry, &mut |attr| {
            attrs.push(attr);
            attrs.len() - 1
        })
        .map_err(|e| error(&field, e))?;
        let [Source::Attr(_)] = part.alternatives.as_slice() else {
            return Err(error(
                &field,
                "must be one key part source (`header:x-user-id`, not `header:a|ip` or `global`)",
            ));
        };
        let Some(attr) = attrs.pop() else {
            return Err(error(&field, "must name a request attribute"));
        };
        if let Attr::Header(name) = &attr {
            const SECRET: [&str; 7] = [
                "key", "token", "secret", "auth", "pass", "session", "cookie",
            ];
            if SECRET.iter().any(|s| name.contains(s)) {
                return Err(error(
                    &field,
                    format!(
                        "{name:?} may carry a credential (an API key, a token, an Authorization): it shows only as the key's hash"
                    ),
                ));
            }
        }
        shown.push(attr);
    }
    Ok(shown)
}

fn is_name(name: &str) -> bool {
    (1..=MAX_TOKEN_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.@-".contains(&b))
}

/// `admin.path`: a path alone, without a trailing `/`, its endpoints under it.
fn admin_path(path: &str) -> Result<String, ConfigError> {
    const FIELD: &str = "admin.path";
    if !path.starts_with('/') || path.len() < 2 || path.ends_with('/') {
        return Err(error(
            FIELD,
            "must start with '/' and not end with one (its endpoints are <path>/keys/show...)",
        ));
    }
    if path.len() > MAX_ADMIN_PATH {
        return Err(error(
            FIELD,
            format!("must be at most {MAX_ADMIN_PATH} bytes"),
        ));
    }
    if let Some(c) = path
        .chars()
        .find(|c| !c.is_ascii_graphic() || matches!(c, '?' | '#' | '%'))
    {
        return Err(error(
            FIELD,
            format!("must be a path alone, printable ASCII without '?', '#' or '%': found {c:?}"),
        ));
    }
    Ok(path.to_string())
}
