//! The admin API's bearer tokens: `--admin-token-file` (reads and writes) and
//! `--read-token-file` (reads only). A line is `NAME TOKEN` or only `TOKEN` (then named after
//! its file: `admin`, `read`); the name is who the audit log says wrote. Files are re-read every
//! `auth::RELOAD_INTERVAL` and on SIGHUP; a file that became unreadable or malformed keeps what was read before.
//! Tokens are compared in constant time, every one of them, and never logged.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use subtle::{Choice, ConditionallySelectable, ConstantTimeEq};
use tracing::{info, warn};

use crate::auth::RELOAD_INTERVAL;

/// The longest token name: it goes into every audit line.
pub const MAX_NAME_BYTES: usize = 64;

/// What a caller may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Read,
    Admin,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Admin => "admin",
        }
    }
}

/// A caller let in: their token's name and what they may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub name: String,
    pub role: Role,
}

/// One file's tokens, each with its name.
#[derive(PartialEq, Eq)]
pub struct NamedTokens(Vec<(String, Vec<u8>)>);

/// Names only: a token must not reach a log through `{:?}`.
impl std::fmt::Debug for NamedTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|(name, _)| name.as_str()).collect();
        write!(f, "NamedTokens({names:?}, tokens hidden)")
    }
}

impl NamedTokens {
    /// `NAME TOKEN` or `TOKEN` per non-empty line, `default_name` for the latter. Names are
    /// `[A-Za-z0-9_.@-]{1,64}`, tokens printable ASCII. Errors name the line, never a token.
    pub fn parse(text: &[u8], default_name: &str) -> Result<NamedTokens, String> {
        let mut tokens = Vec::new();
        for (number, line) in text.split(|&b| b == b'\n').enumerate() {
            let line_no = number + 1;
            let words: Vec<&[u8]> = (line.split(|b| b.is_ascii_whitespace()))
                .filter(|w| !w.is_empty())
                .collect();
            let (name, token) = match words.as_slice() {
                [] => continue,
                [token] => (default_name.as_bytes(), *token),
                [name, token] => (*name, *token),
                _ => {
                    return Err(format!(
                        "line {line_no}: must be `NAME TOKEN` or `TOKEN`, got {} words",
                        words.len()
                    ))
                }
            };
            if !token.iter().all(u8::is_ascii_graphic) {
                return Err(format!("line {line_no}: a token must be printable ASCII"));
            }
            let name = std::str::from_utf8(name)
                .ok()
                .filter(|n| valid_name(n))
                .ok_or_else(|| {
                    format!("line {line_no}: a name must be 1 to {MAX_NAME_BYTES} of A-Z a-z 0-9 _ . @ -")
                })?;
            tokens.push((name.to_string(), token.to_vec()));
        }
        if tokens.is_empty() {
            return Err("holds no token".to_string());
        }
        Ok(NamedTokens(tokens))
    }

    /// The name of the token `presented` is, comparing every token in constant time.
    pub fn name_of(&self, presented: &[u8]) -> Option<&str> {
        let mut found = Choice::from(0);
        let mut index = 0u32;
        for (i, (_, token)) in self.0.iter().enumerate() {
            let matched = token.as_slice().ct_eq(presented);
            let i = u32::try_from(i).unwrap_or(u32::MAX);
            index = u32::conditional_select(&index, &i, matched & !found);
            found |= matched;
        }
        let found: bool = found.into();
        found
            .then(|| self.0.get(index as usize).map(|(name, _)| name.as_str()))
            .flatten()
    }
}

fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME_BYTES).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '@' | '-'))
}

/// A token file kept current.
pub struct TokenSource {
    path: PathBuf,
    flag: &'static str,
    role: Role,
    tokens: RwLock<Arc<NamedTokens>>,
    last_read: RwLock<Result<Vec<u8>, String>>,
}

impl TokenSource {
    /// Reads `path`; an unreadable, empty or malformed file is an error naming `flag` and path.
    pub fn load(path: &Path, flag: &'static str, role: Role) -> Result<TokenSource, String> {
        let read = std::fs::read(path).map_err(|e| format!("cannot be read: {e}"));
        let named = |error: String| format!("{flag} {}: {error}", path.display());
        let bytes = read.clone().map_err(named)?;
        let tokens = NamedTokens::parse(&bytes, role.name()).map_err(named)?;
        Ok(TokenSource {
            path: path.to_path_buf(),
            flag,
            role,
            tokens: RwLock::new(Arc::new(tokens)),
            last_read: RwLock::new(read),
        })
    }

    fn current(&self) -> Arc<NamedTokens> {
        Arc::clone(&self.tokens.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Reads the file again and takes its tokens if it changed and is valid.
    pub fn reload(&self) {
        let read = std::fs::read(&self.path).map_err(|e| format!("cannot be read: {e}"));
        let mut last = self
            .last_read
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if *last == read {
            return;
        }
        let parsed = (read.as_ref().map_err(Clone::clone))
            .and_then(|bytes| NamedTokens::parse(bytes, self.role.name()));
        let (flag, path) = (self.flag, self.path.display());
        match parsed {
            Ok(tokens) => {
                let count = tokens.0.len();
                *self.tokens.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(tokens);
                info!(flag, path = %path, tokens = count, "admin token file reloaded");
            }
            Err(error) => warn!(
                flag, path = %path, error,
                "admin token file not reloaded: keeping the tokens read before"
            ),
        }
        *last = read;
    }
}

/// Both files: who a request's `Authorization` names.
pub struct AdminTokens {
    pub admin: Arc<TokenSource>,
    pub read: Option<Arc<TokenSource>>,
}

impl AdminTokens {
    /// The caller `authorization` (`Bearer <token>`) names; an admin token wins over a read
    /// token that happens to be the same.
    pub fn caller(&self, authorization: Option<&[u8]>) -> Option<Caller> {
        let presented = authorization.and_then(bearer)?;
        let admin = self.admin.current();
        let read = self.read.as_ref().map(|r| r.current());
        let as_admin = admin.name_of(presented).map(str::to_string);
        let as_read = read
            .as_ref()
            .and_then(|r| r.name_of(presented).map(str::to_string));
        match (as_admin, as_read) {
            (Some(name), _) => Some(Caller {
                name,
                role: Role::Admin,
            }),
            (None, Some(name)) => Some(Caller {
                name,
                role: Role::Read,
            }),
            (None, None) => None,
        }
    }

    /// Re-reads both files every `RELOAD_INTERVAL` and on SIGHUP. The signal's stream is made
    /// here, at once, so that a SIGHUP sent once the service listens is not missed.
    pub fn keep_current(self: Arc<Self>) -> Result<impl std::future::Future<Output = ()>, String> {
        let mut hangups = hangups()?;
        Ok(async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(RELOAD_INTERVAL) => {},
                    () = hangups.next() => {},
                }
                self.admin.reload();
                if let Some(read) = &self.read {
                    read.reload();
                }
            }
        })
    }
}

/// SIGHUPs, each wakes `next` once.
struct Hangups(#[cfg(unix)] tokio::signal::unix::Signal);

impl Hangups {
    async fn next(&mut self) {
        #[cfg(unix)]
        if self.0.recv().await.is_some() {
            return;
        }
        std::future::pending::<()>().await;
    }
}

#[cfg(unix)]
fn hangups() -> Result<Hangups, String> {
    use tokio::signal::unix::{signal, SignalKind};
    let stream = signal(SignalKind::hangup());
    stream
        .map(Hangups)
        .map_err(|failure| format!("cannot handle SIGHUP: {failure}"))
}

#[cfg(not(unix))]
fn hangups() -> Result<Hangups, String> {
    Ok(Hangups())
}

/// The credentials of `Bearer <credentials>`, the scheme in any case.
fn bearer(authorization: &[u8]) -> Option<&[u8]> {
    let (scheme, credentials) = authorization.split_at_checked(6)?;
    let credentials = credentials.strip_prefix(b" ")?.trim_ascii_start();
    (scheme.eq_ignore_ascii_case(b"bearer") && !credentials.is_empty()).then_some(credentials)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_a_named_token_or_a_token_named_after_its_file() {
        let tokens = NamedTokens::parse(b"alice s3cret\n\nplain\r\n", "admin").unwrap();
        assert_eq!(tokens.name_of(b"s3cret"), Some("alice"));
        assert_eq!(tokens.name_of(b"plain"), Some("admin"));
        assert_eq!(tokens.name_of(b"s3cre"), None);
        assert_eq!(tokens.name_of(b""), None);
        assert_eq!(
            format!("{tokens:?}"),
            r#"NamedTokens(["alice", "admin"], tokens hidden)"#
        );
    }

    #[test]
    fn malformed_lines_are_refused_naming_the_line_not_the_token() {
        let error = NamedTokens::parse(b"ok\na b c\n", "read").unwrap_err();
        assert_eq!(
            error,
            "line 2: must be `NAME TOKEN` or `TOKEN`, got 3 words"
        );
        let error = NamedTokens::parse("bad\u{e9}name s3cret".as_bytes(), "read").unwrap_err();
        assert!(error.starts_with("line 1: a name"), "{error}");
        assert!(!error.contains("s3cret"));
        assert_eq!(
            NamedTokens::parse(b" \n", "read").unwrap_err(),
            "holds no token"
        );
    }
}
