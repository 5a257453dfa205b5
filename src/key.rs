//! Rate-limit keys: which request attributes identify a client, and the hash that stands for
//! them everywhere (shared data and logs never see a raw user id or API key).

use crate::request::{Attr, Attributes, RequestSource};
use siphasher::sip::SipHasher13;
use std::hash::Hasher;

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
            } else {
                return Err(format!(
                    "unknown key part {text:?} (use header:NAME, metadata:NAMESPACE:KEY, ip, path, method, authority, route or global)"
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

/// An HTTP token (RFC 9110), which is what a header name is.
pub fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

impl KeyPart {
    /// The first present alternative: its position and value.
    pub fn resolve<S: RequestSource + ?Sized>(
        &self,
        request: &mut Attributes<S>,
    ) -> Option<(usize, Vec<u8>)> {
        self.alternatives
            .iter()
            .enumerate()
            .find_map(|(position, source)| match source {
                Source::Global => Some((position, Vec::new())),
                Source::Attr(index) => request.get(*index).map(|v| (position, v.to_vec())),
            })
    }
}

/// The key's hash, or `None` when a part has no value. Which alternative supplied a value is
/// hashed too, so user "1.2.3.4" and the address 1.2.3.4 never share a bucket. Never 0: that
/// marks an empty slot.
pub fn hash_key<S: RequestSource + ?Sized>(
    parts: &[KeyPart],
    request: &mut Attributes<S>,
) -> Option<u64> {
    let mut hasher = KeyHasher::new();
    for part in parts {
        let (position, value) = part.resolve(request)?;
        hasher.part(position, &value);
    }
    Some(hasher.finish())
}

/// The hash of a key given as one value per part, each from the part's first alternative: how
/// an operator names a key in the configuration (a bypass entry).
pub fn hash_values(values: &[String]) -> u64 {
    let mut hasher = KeyHasher::new();
    for value in values {
        hasher.part(0, value.as_bytes());
    }
    hasher.finish()
}

/// Where a key (its hash) falls among all keys, in millionths: a rollout enforces for the keys
/// under its share. The hash is the one every Envoy computes alike (it names global keys and
/// bypass entries), so a key stays in or out of a rollout across restarts and Envoys; a larger
/// share keeps every key a smaller one had. Mixed again so that it owes nothing to the slot a
/// key takes.
pub fn rollout_position(key: u64) -> u32 {
    let mixed = key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
    ((mixed * 1_000_000) >> 32) as u32
}

struct KeyHasher(SipHasher13);

impl KeyHasher {
    fn new() -> Self {
        KeyHasher(SipHasher13::new_with_keys(
            0x736c_7569_6365_6b31,
            0x6b65_7968_6173_6831,
        ))
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
        hash_key(&parts, &mut Attributes::new(request, &attrs))
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
        (0..n).map(|i| rollout_position(hash_values(&[format!("user-{i}")])))
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
        let keys = (0..100_000).map(|i| hash_values(&[format!("user-{i}")]));
        for key in keys.chain([0, 1, u64::MAX, MISSING_KEY]) {
            assert!(!share(0).covers(key) && share(100).covers(key), "{key:x}");
            assert!(!share(10).covers(key) || share(20).covers(key), "{key:x}");
        }
        // Pinned: a key's place must not move between versions, or a rollout's canary would.
        let alice = rollout_position(hash_values(&["alice".into()]));
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
