//! Bearer tokens for `POST /v1/check` and the RLS (`--token-file`). The file is read at start,
//! then again every `RELOAD_INTERVAL` and on SIGHUP, and a change takes effect at once: a
//! Kubernetes Secret mounted as a file is rotated in place. A file that became empty or
//! unreadable keeps the tokens read before. Tokens are compared in constant time and never
//! logged. `Guard` is what each server asks.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use subtle::{Choice, ConstantTimeEq};
use tokio::sync::{watch, Notify};
use tracing::{info, warn};

use crate::logging::Throttle;

/// At most one warning per this long about refused tokens, per server.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// What one server requires of its callers: a token of the file, or nothing without one; a
/// refusal is logged at most once per `WARN_EVERY`, with how many were not.
pub struct Guard {
    tokens: Option<Arc<TokenFile>>,
    warnings: Throttle,
    /// The log line of a refusal.
    message: &'static str,
}

impl Guard {
    pub fn new(tokens: Option<Arc<TokenFile>>, message: &'static str) -> Guard {
        Guard {
            tokens,
            warnings: Throttle::new(WARN_EVERY),
            message,
        }
    }

    /// Whether `authorization` (the header, or gRPC metadata) lets the caller in.
    pub fn admits(&self, authorization: Option<&[u8]>) -> bool {
        let Some(tokens) = &self.tokens else {
            return true;
        };
        let accepted = tokens.accept(authorization);
        if let (false, Some(others)) = (accepted, self.warnings.pass()) {
            let reason = if authorization.is_some() {
                "a wrong token"
            } else {
                "no token"
            };
            warn!(reason, others, "{}", self.message);
        }
        accepted
    }
}

/// How often the token file is re-read.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(10);

/// The accepted tokens: one per non-empty line, so that during a rotation the old and the new
/// token can both be accepted until every caller has the new one.
#[derive(PartialEq, Eq)]
pub struct Tokens(Vec<Vec<u8>>);

/// Only how many: a token must not reach a log through `{:?}`.
impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} hidden)", self.0.len())
    }
}

impl Tokens {
    /// Each line trimmed of surrounding whitespace (a trailing newline, CRLF); empty lines are
    /// skipped. A token must be printable ASCII without spaces, as an HTTP header carries it.
    /// Errors name the line, never its content.
    pub fn parse(text: &[u8]) -> Result<Tokens, String> {
        let mut tokens = Vec::new();
        for (number, line) in text.split(|&b| b == b'\n').enumerate() {
            let token = line.trim_ascii();
            if token.is_empty() {
                continue;
            }
            if !token.iter().all(|b| b.is_ascii_graphic()) {
                let line = number + 1;
                return Err(format!(
                    "line {line}: a token must be printable ASCII without spaces"
                ));
            }
            tokens.push(token.to_vec());
        }
        if tokens.is_empty() {
            return Err("holds no token".to_string());
        }
        Ok(Tokens(tokens))
    }

    /// Whether `authorization` is `Bearer <one of the tokens>` (the scheme in any case). Every
    /// token is compared, each in time independent of where it differs; only a token's length
    /// can show through the timing.
    pub fn accept(&self, authorization: Option<&[u8]>) -> bool {
        let Some(presented) = authorization.and_then(bearer) else {
            return false;
        };
        let matched = (self.0.iter()).fold(Choice::from(0), |matched, token| {
            matched | token.as_slice().ct_eq(presented)
        });
        matched.into()
    }
}

/// The credentials of `Bearer <credentials>`.
fn bearer(authorization: &[u8]) -> Option<&[u8]> {
    let (scheme, credentials) = authorization.split_at_checked(6)?;
    let credentials = credentials.strip_prefix(b" ")?.trim_ascii_start();
    (scheme.eq_ignore_ascii_case(b"bearer") && !credentials.is_empty()).then_some(credentials)
}

/// The token file and the tokens last read from it.
pub struct TokenFile {
    path: PathBuf,
    tokens: watch::Sender<Tokens>,
    /// What the last read gave (the bytes, or the error): a reload acts and logs only when it
    /// changes.
    last_read: Mutex<Result<Vec<u8>, String>>,
}

impl TokenFile {
    /// Reads the file; an empty, unreadable or malformed file is an error naming the path.
    pub fn load(path: &Path) -> Result<TokenFile, String> {
        let read = read(path);
        let bytes = read.clone().map_err(|error| named(path, &error))?;
        let tokens = Tokens::parse(&bytes).map_err(|error| named(path, &error))?;
        Ok(TokenFile {
            path: path.to_path_buf(),
            tokens: watch::Sender::new(tokens),
            last_read: Mutex::new(read),
        })
    }

    pub fn accept(&self, authorization: Option<&[u8]>) -> bool {
        self.tokens.borrow().accept(authorization)
    }

    /// Reads the file again and takes its tokens if it changed and is valid.
    fn reload(&self, asked: bool) {
        let read = read(&self.path);
        let mut last_read = self
            .last_read
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if *last_read == read {
            if asked {
                info!(path = %self.path.display(), "token file unchanged");
            }
            return;
        }
        let parsed = read
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|b| Tokens::parse(b));
        match parsed {
            Ok(tokens) => {
                let count = tokens.0.len();
                self.tokens.send_replace(tokens);
                info!(path = %self.path.display(), tokens = count, "token file reloaded");
            }
            Err(error) => warn!(
                path = %self.path.display(), error,
                "token file not reloaded: keeping the tokens read before"
            ),
        }
        *last_read = read;
    }
}

/// Keeps `file` current: re-reads it every `RELOAD_INTERVAL` and whenever `hangup` is notified.
pub async fn keep_current(file: Arc<TokenFile>, hangup: Arc<Notify>) {
    loop {
        let asked = tokio::select! {
            () = tokio::time::sleep(RELOAD_INTERVAL) => false,
            () = hangup.notified() => true,
        };
        file.reload(asked);
    }
}

/// The whole file. A blocking read, but of a few bytes, every few seconds, from a local file.
fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|error| format!("cannot be read: {error}"))
}

fn named(path: &Path, error: &str) -> String {
    format!("--token-file {}: {error}", path.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(text: &str) -> Tokens {
        Tokens::parse(text.as_bytes()).unwrap()
    }

    #[test]
    fn a_token_file_holds_one_token_per_line_trimmed() {
        assert_eq!(tokens("s3cret\n"), Tokens(vec![b"s3cret".to_vec()]));
        assert_eq!(
            tokens("old\r\n\n  new  \n"),
            Tokens(vec![b"old".to_vec(), b"new".to_vec()])
        );
    }

    #[test]
    fn an_empty_or_malformed_token_file_is_refused_without_showing_its_content() {
        for empty in ["", "\n", " \r\n\t\n"] {
            assert_eq!(
                Tokens::parse(empty.as_bytes()),
                Err("holds no token".into())
            );
        }
        let error = Tokens::parse(b"good\nsecret value\n").unwrap_err();
        assert_eq!(
            error,
            "line 2: a token must be printable ASCII without spaces"
        );
        assert!(Tokens::parse("caf\u{e9}".as_bytes()).is_err());
    }

    #[test]
    fn tokens_do_not_show_in_debug_output() {
        assert_eq!(format!("{:?}", tokens("s3cret\nother")), "Tokens(2 hidden)");
    }

    #[test]
    fn only_bearer_with_a_listed_token_is_accepted() {
        let tokens = tokens("old\nnew\n");
        for accepted in ["Bearer old", "Bearer new", "bearer new", "BEARER  new"] {
            assert!(tokens.accept(Some(accepted.as_bytes())), "{accepted}");
        }
        let refused = [
            "Bearer ne",
            "Bearer newer",
            "Bearer",
            "Bearer ",
            "Basic new",
            "new",
            "Bearernew",
            "",
        ];
        for refused in refused {
            assert!(!tokens.accept(Some(refused.as_bytes())), "{refused}");
        }
        assert!(!tokens.accept(None));
    }
}
