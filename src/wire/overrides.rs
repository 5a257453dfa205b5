//! The overrides sluice-service hands the filters (`GET /v1/overrides`): every live override of
//! the `http` namespace, compact (no owner, reason or author), with a `version` that is also the
//! answer's `ETag`, so that a filter asking again with `If-None-Match` gets a bodiless 304 while
//! nothing changed. The service serializes this type and the filter reads it.

use crate::core::algorithm::Kind;
use serde::{Deserialize, Serialize};

/// The path of the listing on sluice-service's HTTP listener.
pub const PATH: &str = "/v1/overrides";

/// The answer's body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    /// The `ETag` of this listing (`etag`): the same overrides give the same one, on every
    /// replica.
    pub version: String,
    pub overrides: Vec<Listed>,
}

/// One override, as the filter applies it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listed {
    /// `<policy>/<key hash>`, as a check names its key.
    pub key: String,
    pub algorithm: Kind,
    pub requests: u64,
    pub per_ms: u64,
    pub burst: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay_ms: Option<u64>,
    /// Unix milliseconds; none: until deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
}

impl Listed {
    /// The policy's name and the key's hash, when the key has the form a filter's key has
    /// (`<policy>/<16 lowercase hex digits>`).
    pub fn policy_and_hash(&self) -> Option<(&str, u64)> {
        let (policy, hash) = self.key.rsplit_once('/')?;
        let lower_hex = |c: u8| c.is_ascii_digit() || (b'a'..=b'f').contains(&c);
        if policy.is_empty() || hash.len() != 16 || !hash.bytes().all(lower_hex) {
            return None;
        }
        Some((policy, u64::from_str_radix(hash, 16).ok()?))
    }
}

/// The version (and `ETag`) of a listing's overrides: FNV-1a of their JSON, quoted as an
/// `ETag` is.
pub fn version_of(overrides: &[Listed]) -> String {
    let json = serde_json::to_vec(overrides).unwrap_or_default();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in json {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("\"{hash:016x}\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(key: &str) -> Listed {
        Listed {
            key: key.into(),
            algorithm: Kind::TokenBucket,
            requests: 1,
            per_ms: 1000,
            burst: 1,
            max_delay_ms: None,
            expires_at_ms: None,
        }
    }

    #[test]
    fn only_a_filters_key_names_a_policy_and_a_hash() {
        let named = listed("api/5c0f4b1de6a2b3c4");
        assert_eq!(
            named.policy_and_hash(),
            Some(("api", 0x5c0f_4b1d_e6a2_b3c4))
        );
        let with_slash = listed("a/b/00000000000000ff");
        assert_eq!(with_slash.policy_and_hash(), Some(("a/b", 255)));
        for other in [
            "api",
            "api/5C0F4B1DE6A2B3C4",
            "/5c0f4b1de6a2b3c4",
            "api/5c0f",
        ] {
            assert_eq!(listed(other).policy_and_hash(), None, "{other}");
        }
    }

    #[test]
    fn the_same_overrides_have_the_same_version_and_others_another() {
        let one = [listed("api/5c0f4b1de6a2b3c4")];
        assert_eq!(version_of(&one), version_of(&one.clone()));
        assert_ne!(version_of(&one), version_of(&[]));
        assert!(version_of(&one).starts_with('"'));
    }
}
