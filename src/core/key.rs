//! Rate-limit keys: which request attributes identify a client, and the hash that stands for
//! them everywhere (shared data and logs never see a raw user id or API key).
//!
//! The hash is SipHash-1-3 keyed with a secret (`HashSecret`), so that a client cannot compute
//! which slots its keys land in (and aim a flood of keys at another client's), nor anyone holding
//! a log line reverse a hashed IP address by trying all 2^32. `hash_parts` is the one definition:
//! tools that recompute hashes offline (from the operator's secret, or `HashSecret::PUBLIC`)
//! call it, or `hash_values`, with the same secret.

use crate::core::request::{Attr, Attributes, RequestSource};
use siphasher::sip::SipHasher13;
use siphasher::sip128::{Hasher128, SipHasher13 as SipHasher13x128};
use std::hash::Hasher;

/// The key of the key hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashSecret {
    k0: u64,
    k1: u64,
}

impl HashSecret {
    /// Written in this source, so anyone can hash under it: what Envoys agree on when the
    /// operator gives no secret.
    pub const PUBLIC: HashSecret = HashSecret {
        k0: 0x736c_7569_6365_6b31,
        k1: 0x6b65_7968_6173_6831,
    };

    /// The fewest bytes an operator's secret may have: 128 bits as hex.
    pub const MIN_TEXT_BYTES: usize = 32;

    /// The secret an operator gives as text (at least `MIN_TEXT_BYTES`, e.g. `openssl rand -hex
    /// 32`): its 128-bit SipHash under the public key, so any length and alphabet will do.
    pub fn from_text(text: &[u8]) -> HashSecret {
        let mut hasher = SipHasher13x128::new_with_keys(Self::PUBLIC.k0, Self::PUBLIC.k1);
        hasher.write(b"sluice hash secret\0");
        hasher.write(text);
        let hash = hasher.finish128();
        HashSecret {
            k0: hash.h1,
            k1: hash.h2,
        }
    }

    /// As stored in shared data: 16 bytes, little-endian.
    pub fn from_bytes(bytes: [u8; 16]) -> HashSecret {
        let word = |range: std::ops::Range<usize>| {
            let mut word = [0; 8];
            word.copy_from_slice(bytes.get(range).unwrap_or(&[0; 8]));
            u64::from_le_bytes(word)
        };
        HashSecret {
            k0: word(0..8),
            k1: word(8..16),
        }
    }

    pub fn to_bytes(self) -> [u8; 16] {
        let mut bytes = [0; 16];
        for (chunk, word) in bytes.chunks_exact_mut(8).zip([self.k0, self.k1]) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        bytes
    }
}

/// The secrets of one filter: `slots` keys this Envoy's shared-data slots, `shared` what must
/// agree across Envoys (global keys sent to the service, bypass entries, log lines). One
/// operator's secret serves both; without one, `slots` is a random secret of this Envoy and
/// `shared` the public key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keying {
    pub slots: HashSecret,
    pub shared: HashSecret,
}

impl Keying {
    /// The same hash serves both.
    pub fn is_one(&self) -> bool {
        self.slots == self.shared
    }
}

/// One source of a key part's value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// An attribute, by its index in the plan's attribute list.
    Attr(usize),
    /// The same value for every request: one shared bucket.
    Global,
}

/// A key part: the first alternative that is present wins (`header:x-user-id|ip`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyPart {
    pub alternatives: Vec<Source>,
}

/// The hash of every key whose parts are missing, for policies with `missing_key: shared`.
pub const MISSING_KEY: u64 = 0x6d69_7373_696e_6721;

/// Parses `header:NAME | ip | path | method | authority | route | global`, joined by `|`.
/// `intern` returns the plan-wide index of an attribute.
pub fn parse_part(text: &str, intern: &mut impl FnMut(Attr) -> usize) -> Result<KeyPart, String> {
    let alternatives = text
        .split('|')
        .map(|alt| parse_source(alt, intern))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(KeyPart { alternatives })
}

fn parse_source(text: &str, intern: &mut impl FnMut(Attr) -> usize) -> Result<Source, String> {
    let attr = match text {
        "global" => return Ok(Source::Global),
        "ip" => Attr::Ip,
        "path" => Attr::Path,
        "method" => Attr::Method,
        "authority" => Attr::Authority,
        "route" => Attr::Route,
        _ => {
            if let Some(name) = text.strip_prefix("header:") {
                if !is_header_name(name) {
                    return Err(format!("{name:?} is not a valid header name"));
                }
                Attr::Header(name.to_ascii_lowercase())
            } else if let Some(reference) = text.strip_prefix("metadata:") {
                parse_metadata(reference)?
            } else if let Some(name) = text.strip_prefix("body:") {
                body_field(name)?
            } else {
                return Err(format!(
                    "unknown key part {text:?} (use header:NAME, metadata:NAMESPACE:KEY, body:FIELD, ip, path, method, authority, route or global)"
                ));
            }
        }
    };
    Ok(Source::Attr(intern(attr)))
}

/// `NAMESPACE:KEY[.KEY...]`: the namespace is the filter that wrote the value (it may contain
/// dots, e.g. `envoy.filters.http.jwt_authn`), the key a path into that filter's metadata.
fn parse_metadata(reference: &str) -> Result<Attr, String> {
    let bad = || {
        format!(
            "{reference:?} is not NAMESPACE:KEY (e.g. envoy.filters.http.jwt_authn:payload.sub)"
        )
    };
    let (namespace, key) = reference.split_once(':').ok_or_else(bad)?;
    let path: Vec<String> = key.split('.').map(str::to_string).collect();
    if namespace.is_empty() || path.iter().any(String::is_empty) {
        return Err(bad());
    }
    Ok(Attr::Metadata {
        namespace: namespace.to_string(),
        path,
    })
}

/// `body:FIELD`: a top-level string field of the JSON request body, named as written.
fn body_field(name: &str) -> Result<Attr, String> {
    let plain = |b: u8| b.is_ascii_alphanumeric() || b"_-.".contains(&b);
    if name.is_empty() || name.len() > 64 || !name.bytes().all(plain) {
        return Err(format!(
            "body:{name:?}: a top-level field of the JSON request body, 1-64 characters of A-Z, a-z, 0-9, '_', '-', '.'"
        ));
    }
    Ok(Attr::Body(crate::core::request::BodyField::String(
        name.to_string(),
    )))
}

/// An HTTP token (RFC 9110), which is what a header name is.
pub fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

impl KeyPart {
    /// The first present alternative: its position and value, as the request holds it.
    pub fn resolve<'r, S: RequestSource + ?Sized>(
        &self,
        request: &'r mut Attributes<S>,
    ) -> Option<(usize, &'r [u8])> {
        // Found, then lent: the borrow checker will not let a search return a value that
        // borrows `request` while it goes on to read the next alternative.
        let position = self.alternatives.iter().position(|source| match source {
            Source::Global => true,
            Source::Attr(index) => request.has(*index),
        })?;
        match self.alternatives.get(position)? {
            Source::Global => Some((position, &[])),
            Source::Attr(index) => request.read_already(*index).map(|value| (position, value)),
        }
    }
}

/// The hash of a key given as its parts' values, each with the position of the alternative that
/// supplied it (0 for a part's first). Which alternative it was is hashed too, so user "1.2.3.4"
/// and the address 1.2.3.4 never share a bucket. Never 0: that marks an empty slot.
pub fn hash_parts<V: AsRef<[u8]>>(
    parts: impl IntoIterator<Item = (usize, V)>,
    secret: &HashSecret,
) -> u64 {
    let mut hasher = KeyHasher::new(secret);
    for (position, value) in parts {
        hasher.part(position, value.as_ref());
    }
    hasher.finish()
}

/// The key's hash, or `None` when a part has no value.
pub fn hash_key<S: RequestSource + ?Sized>(
    parts: &[KeyPart],
    request: &mut Attributes<S>,
    secret: &HashSecret,
) -> Option<u64> {
    let mut hasher = KeyHasher::new(secret);
    for part in parts {
        let (position, value) = part.resolve(request)?;
        hasher.part(position, value);
    }
    Some(hasher.finish())
}

/// `hash_parts`, one part at a time.
struct KeyHasher(SipHasher13);

impl KeyHasher {
    fn new(secret: &HashSecret) -> Self {
        KeyHasher(SipHasher13::new_with_keys(secret.k0, secret.k1))
    }

    fn part(&mut self, position: usize, value: &[u8]) {
        self.0.write_u8(position as u8);
        self.0.write_u64(value.len() as u64);
        self.0.write(value);
    }

    fn finish(self) -> u64 {
        self.0.finish().max(1)
    }
}

/// The hash of a key given as one value per part, each from the part's first alternative: how
/// an operator names a key in the configuration (a bypass entry).
pub fn hash_values(values: &[String], secret: &HashSecret) -> u64 {
    hash_parts(values.iter().map(|value| (0, value.as_bytes())), secret)
}

/// Where a key (its hash) falls among all keys, in millionths: a rollout enforces for the keys
/// under its share. The hash is the shared one every Envoy computes alike (`Keying::shared`), so
/// a key stays in or out of a rollout across restarts and Envoys; a larger share keeps every key
/// a smaller one had. Mixed again so that it owes nothing to the slot a key takes.
pub fn rollout_position(key: u64) -> u32 {
    let mixed = key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
    ((mixed * 1_000_000) >> 32) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeRequest;
    use proptest::prelude::*;

    fn parse(parts: &[&str]) -> (Vec<KeyPart>, Vec<Attr>) {
        let mut attrs: Vec<Attr> = Vec::new();
        let mut intern = |attr: Attr| match attrs.iter().position(|a| *a == attr) {
            Some(i) => i,
            None => {
                attrs.push(attr);
                attrs.len() - 1
            }
        };
        let parts = parts
            .iter()
            .map(|p| parse_part(p, &mut intern).unwrap())
            .collect();
        (parts, attrs)
    }

    fn hash(parts: &[&str], request: &FakeRequest) -> Option<u64> {
        let (parts, attrs) = parse(parts);
        hash_key(
            &parts,
            &mut Attributes::new(request, &attrs),
            &HashSecret::PUBLIC,
        )
    }

    #[test]
    fn the_public_hash_is_the_one_every_earlier_release_computed() {
        // Log lines and bypass entries written before secrets existed keep matching.
        let alice = FakeRequest::new(&[("x-user-id", "alice")]);
        assert_eq!(
            hash(&["header:x-user-id"], &alice),
            Some(0x7af1_2e58_ae35_0d9a)
        );
        assert_eq!(
            hash_values(&["alice".into()], &HashSecret::PUBLIC),
            0x7af1_2e58_ae35_0d9a
        );
    }

    #[test]
    fn a_secret_changes_every_hash_and_the_same_secret_gives_the_same() {
        let secret = HashSecret::from_text(b"an operator's secret of at least 32 bytes");
        let again = HashSecret::from_text(b"an operator's secret of at least 32 bytes");
        let other = HashSecret::from_text(b"an operator's secret of at least 32 bytez");
        let alice = |s: &HashSecret| hash_values(&["alice".into()], s);
        assert_eq!(alice(&secret), alice(&again));
        assert_ne!(alice(&secret), alice(&HashSecret::PUBLIC));
        assert_ne!(alice(&secret), alice(&other));
        assert_eq!(HashSecret::from_bytes(secret.to_bytes()), secret);
    }

    #[test]
    fn parses_every_kind_of_part() {
        let (parts, attrs) = parse(&[
            "header:X-User-Id|ip",
            "path",
            "method",
            "authority",
            "route",
            "global",
        ]);
        assert_eq!(parts.len(), 6);
        assert_eq!(
            attrs,
            [
                Attr::Header("x-user-id".into()),
                Attr::Ip,
                Attr::Path,
                Attr::Method,
                Attr::Authority,
                Attr::Route
            ]
        );
        assert_eq!(parts[5].alternatives, [Source::Global]);
    }

    #[test]
    fn metadata_parts_name_a_namespace_and_a_path() {
        let (parts, attrs) = parse(&["metadata:envoy.filters.http.jwt_authn:payload.sub"]);
        assert_eq!(parts.len(), 1);
        let expected = Attr::Metadata {
            namespace: "envoy.filters.http.jwt_authn".into(),
            path: vec!["payload".into(), "sub".into()],
        };
        assert_eq!(attrs, [expected]);
        let request = FakeRequest::default().with_property(
            "metadata.filter_metadata.envoy.filters.http.jwt_authn.payload.sub",
            "u1",
        );
        assert!(hash(
            &["metadata:envoy.filters.http.jwt_authn:payload.sub"],
            &request
        )
        .is_some());
        let mut intern = |_| 0;
        for bad in [
            "metadata:",
            "metadata:ns",
            "metadata::k",
            "metadata:ns:",
            "metadata:ns:a..b",
        ] {
            assert!(parse_part(bad, &mut intern).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rejects_unknown_parts_and_bad_header_names() {
        let mut intern = |_| 0;
        for bad in [
            "cookie",
            "header:",
            "header:a b",
            "ip|",
            "ip | path",
            "",
            "header:x\u{e9}",
        ] {
            assert!(parse_part(bad, &mut intern).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn different_users_get_different_keys_and_the_same_user_the_same() {
        let alice = FakeRequest::new(&[("x-user-id", "alice")]);
        let bob = FakeRequest::new(&[("x-user-id", "bob")]);
        let alice_again = FakeRequest::new(&[("x-user-id", "alice")]);
        let h = |r| hash(&["header:x-user-id"], r);
        assert_eq!(h(&alice), h(&alice_again));
        assert_ne!(h(&alice), h(&bob));
    }

    #[test]
    fn a_missing_part_gives_no_key() {
        assert_eq!(
            hash(&["header:x-user-id", "global"], &FakeRequest::default()),
            None
        );
    }

    #[test]
    fn fallback_takes_the_first_present_and_keeps_sources_apart() {
        let chain = ["header:x-user-id|header:x-api-key"];
        let by_user = FakeRequest::new(&[("x-user-id", "k1"), ("x-api-key", "zzz")]);
        let by_key = FakeRequest::new(&[("x-api-key", "k1")]);
        assert_eq!(
            hash(&chain, &by_user),
            hash(&["header:x-user-id|ip"], &by_user)
        );
        assert_ne!(hash(&chain, &by_user), hash(&chain, &by_key));
    }

    #[test]
    fn parts_are_length_delimited() {
        let a = FakeRequest::new(&[("a", "xy"), ("b", "z")]);
        let b = FakeRequest::new(&[("a", "x"), ("b", "yz")]);
        assert_ne!(
            hash(&["header:a", "header:b"], &a),
            hash(&["header:a", "header:b"], &b)
        );
    }

    /// The rollout positions of `n` distinct keys.
    fn positions(n: u64) -> impl Iterator<Item = u32> {
        (0..n).map(|i| rollout_position(hash_values(&[format!("user-{i}")], &HashSecret::PUBLIC)))
    }

    #[test]
    fn a_rollout_share_takes_close_to_that_share_of_the_keys() {
        for per_million in [10_000, 100_000, 500_000] {
            let within = positions(100_000).filter(|&p| p < per_million).count() as f64;
            let share = within / 100_000.0;
            let expected = f64::from(per_million) / 1e6;
            assert!((share - expected).abs() < 0.005, "{share} for {expected}");
        }
    }

    #[test]
    fn none_and_all_are_exact_a_wider_rollout_keeps_every_key_a_narrower_one_had_and_places_hold() {
        use crate::config::Rollout;
        let share = |percent: u32| Rollout {
            enforce_per_million: percent * 10_000,
        };
        let keys = (0..100_000).map(|i| hash_values(&[format!("user-{i}")], &HashSecret::PUBLIC));
        for key in keys.chain([0, 1, u64::MAX, MISSING_KEY]) {
            assert!(!share(0).covers(key) && share(100).covers(key), "{key:x}");
            assert!(!share(10).covers(key) || share(20).covers(key), "{key:x}");
        }
        // Pinned: a key's place must not move between versions, or a rollout's canary would.
        let alice = rollout_position(hash_values(&["alice".into()], &HashSecret::PUBLIC));
        assert_eq!(
            alice, 234_940,
            "alice is in a 24% rollout, not in a 23% one"
        );
    }

    proptest! {
        #[test]
        fn any_bytes_hash_without_panic_and_never_to_zero(value in prop::collection::vec(any::<u8>(), 1..300)) {
            let mut request = FakeRequest::default();
            request.headers.insert("k".into(), value);
            prop_assert!(hash(&["header:k"], &request).is_some_and(|h| h != 0));
        }

        #[test]
        fn parsing_never_panics(text in ".{0,40}") {
            let _ = parse_part(&text, &mut |_| 0);
        }
    }
}
