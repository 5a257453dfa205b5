//! What the route Envoy selected says about sluice, read only with the top-level
//! `route_metadata`: the `sluice` entry of the route's `metadata.filter_metadata`, either
//! `{"policies": [NAME, ...]}` (only those policies apply on the route) or `{"disabled": true}`
//! (none does).
//!
//! Envoy 1.40 hands proxy-wasm a map as a count, then each entry's key and value lengths, then
//! each key and value followed by a NUL byte (every number a little-endian u32); a list of strings
//! comes the same way, the strings as keys with empty values, and a bool as one byte. An entry
//! sluice cannot use whole (another shape, another field, a name no policy has) is ignored:
//! every policy applies, the safe side of an operator's typo, and the caller logs why.

use smallvec::SmallVec;

/// Which policies may apply on the selected route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteScope {
    All,
    /// None: sluice is off on this route.
    Disabled,
    /// These policies only, by index.
    Only(SmallVec<[usize; 4]>),
}

impl RouteScope {
    pub fn includes(&self, policy: usize) -> bool {
        match self {
            RouteScope::All => true,
            RouteScope::Disabled => false,
            RouteScope::Only(policies) => policies.contains(&policy),
        }
    }
}

/// The scope the route's `sluice` metadata (`None`: it has none) gives, with `index_of` naming
/// the policies; an entry it cannot use gives `All` and the reason.
pub fn scope(
    metadata: Option<&[u8]>,
    index_of: impl Fn(&[u8]) -> Option<usize>,
) -> (RouteScope, Option<&'static str>) {
    let Some(metadata) = metadata else {
        return (RouteScope::All, None);
    };
    match read(metadata, index_of) {
        Ok(scope) => (scope, None),
        Err(why) => (RouteScope::All, Some(why)),
    }
}

fn read(
    metadata: &[u8],
    index_of: impl Fn(&[u8]) -> Option<usize>,
) -> Result<RouteScope, &'static str> {
    let entries = pairs(metadata).ok_or("not a map")?;
    let mut disabled = false;
    let mut only = None;
    for (key, value) in entries {
        match key {
            b"disabled" => {
                disabled = match value {
                    [0] => false,
                    [1] => true,
                    _ => return Err("disabled is not true or false"),
                }
            }
            b"policies" => {
                let names = pairs(value).ok_or("policies is not a list of policy names")?;
                let policies = names.iter().map(|(name, _)| index_of(name));
                let policies: Option<SmallVec<[usize; 4]>> = policies.collect();
                only = Some(policies.ok_or("policies names a policy that does not exist")?);
            }
            _ => return Err("only policies and disabled are known"),
        }
    }
    Ok(match (disabled, only) {
        (true, _) => RouteScope::Disabled,
        (false, Some(policies)) => RouteScope::Only(policies),
        (false, None) => RouteScope::All,
    })
}

/// A map as Envoy 1.40 hands it to proxy-wasm: the count, each entry's key and value lengths,
/// then each key and value followed by a NUL (numbers as little-endian u32). For the tests, and
/// for `sluice-replay`, which builds what Envoy would have handed over from an access log.
pub fn envoy_map(entries: &[(&[u8], &[u8])]) -> Vec<u8> {
    let word = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes();
    let mut out = word(entries.len()).to_vec();
    for (key, value) in entries {
        out.extend(word(key.len()));
        out.extend(word(value.len()));
    }
    for (key, value) in entries {
        out.extend(*key);
        out.push(0);
        out.extend(*value);
        out.push(0);
    }
    out
}

/// A list of strings as Envoy hands it over: a map with the strings as keys.
pub fn envoy_list(names: &[impl AsRef<[u8]>]) -> Vec<u8> {
    let entries: Vec<(&[u8], &[u8])> = names.iter().map(|n| (n.as_ref(), &b""[..])).collect();
    envoy_map(&entries)
}

/// A map's entries as Envoy serializes them: (key, value) bytes.
type Entries<'a> = SmallVec<[(&'a [u8], &'a [u8]); 4]>;

/// Entries of Envoy's serialized map (or list, as keys); `None` unless the bytes are exactly one.
fn pairs(bytes: &[u8]) -> Option<Entries<'_>> {
    let (count, rest) = u32_at(bytes)?;
    let (sizes, mut data) = rest.split_at_checked(usize::try_from(count).ok()?.checked_mul(8)?)?;
    let mut entries = SmallVec::new();
    for size in sizes.chunks_exact(8) {
        let (key_len, value_len) = (u32_at(size)?, u32_at(size.get(4..)?)?);
        let (key, rest) = field(data, key_len.0)?;
        let (value, rest) = field(rest, value_len.0)?;
        entries.push((key, value));
        data = rest;
    }
    data.is_empty().then_some(entries)
}

/// `len` bytes and the NUL after them; the rest.
fn field(bytes: &[u8], len: u32) -> Option<(&[u8], &[u8])> {
    let (value, rest) = bytes.split_at_checked(usize::try_from(len).ok()?)?;
    Some((value, rest.strip_prefix(&[0])?))
}

fn u32_at(bytes: &[u8]) -> Option<(u32, &[u8])> {
    let (word, rest) = bytes.split_first_chunk::<4>()?;
    Some((u32::from_le_bytes(*word), rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use super::{envoy_list as list, envoy_map as map};

    const POLICIES: [&str; 3] = ["per-user", "per-ip", "baseline"];

    fn scope_of(metadata: &[u8]) -> (RouteScope, Option<&'static str>) {
        scope(Some(metadata), |name| {
            POLICIES.iter().position(|p| p.as_bytes() == name)
        })
    }

    /// What Envoy 1.40 gave for `{policies: ["per-user", "x"], disabled: true}`.
    const FROM_ENVOY: &str = "0200000008000000210000000800000001000000706f6c69636965730002000000\
        080000000000000001000000000000007065722d7573657200007800000064697361626c6564000100";

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn reads_what_envoy_serializes() {
        let bytes = hex(FROM_ENVOY);
        assert_eq!(
            pairs(&bytes).unwrap().to_vec(),
            [
                (&b"policies"[..], &list(&["per-user", "x"])[..]),
                (&b"disabled"[..], &[1][..]),
            ]
        );
        assert_eq!(map(&pairs(&bytes).unwrap()), bytes);
    }

    #[test]
    fn no_metadata_lets_every_policy_apply() {
        assert_eq!(scope(None, |_| Some(0)), (RouteScope::All, None));
        assert!(RouteScope::All.includes(2));
    }

    #[test]
    fn a_route_lists_its_policies_or_turns_sluice_off() {
        let only = scope_of(&map(&[(b"policies", &list(&["baseline", "per-user"]))]));
        assert_eq!(only, (RouteScope::Only([2, 0].into_iter().collect()), None));
        assert!(only.0.includes(0) && !only.0.includes(1));
        let none = scope_of(&map(&[(b"policies", &list(&[] as &[&str]))]));
        assert_eq!(none.0, RouteScope::Only(SmallVec::new()));
        assert_eq!(
            scope_of(&map(&[(b"disabled", &[1])])).0,
            RouteScope::Disabled
        );
        assert_eq!(scope_of(&map(&[(b"disabled", &[0])])).0, RouteScope::All);
        let both = map(&[(b"policies", &list(&["per-ip"])), (b"disabled", &[1])]);
        assert_eq!(scope_of(&both).0, RouteScope::Disabled);
    }

    #[test]
    fn an_entry_sluice_cannot_use_is_ignored_whole_and_says_why() {
        for (metadata, why) in [
            (
                hex(FROM_ENVOY),
                "policies names a policy that does not exist",
            ),
            (
                map(&[(b"disabled", b"true")]),
                "disabled is not true or false",
            ),
            (
                map(&[(b"policies", b"per-user")]),
                "policies is not a list of policy names",
            ),
            (
                map(&[(b"polices", &list(&["per-ip"]))]),
                "only policies and disabled are known",
            ),
            (b"per-user".to_vec(), "not a map"),
        ] {
            assert_eq!(scope_of(&metadata), (RouteScope::All, Some(why)));
        }
    }

    proptest::proptest! {
        /// Any bytes: an answer, never a panic or a huge allocation.
        #[test]
        fn any_bytes_give_an_answer(bytes in proptest::collection::vec(proptest::arbitrary::any::<u8>(), 0..64)) {
            let _ = scope_of(&bytes);
        }
    }
}
