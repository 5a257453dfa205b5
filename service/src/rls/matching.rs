//! Which configured descriptor a request's descriptor matches, as envoyproxy/ratelimit decides:
//! entry by entry down the tree, each level most specific first (`key_value`, then a wildcard
//! value, then the value-less `key`), and a limit applies only if it sits at the request
//! descriptor's last entry.

use super::config::Node;

/// One entry of a request's descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'r> {
    pub key: &'r str,
    pub value: &'r str,
}

/// A request descriptor that reached a node with limits.
#[derive(Debug)]
pub struct Match<'c> {
    pub node: &'c Node,
    /// Key and value of each entry as the counters know them: the request's value, or the
    /// pattern of a `share_threshold` wildcard (all its values share the counters).
    pub counted: Vec<String>,
    /// The metrics label with every value the request sent (`detailed_metric`).
    pub detailed_label: String,
    /// The metrics label with the request's values only where `value_to_metric` asks: equal to
    /// the node's path when it asks nowhere.
    pub value_label: String,
}

/// How an entry found its node.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Found {
    Exact,
    Wildcard,
    KeyOnly,
}

/// The node whose limits apply to `entries`, if any.
pub fn find<'c>(root: &'c Node, entries: &[Entry]) -> Option<Match<'c>> {
    let mut level = root;
    let mut counted = Vec::with_capacity(entries.len() * 2);
    let mut detailed = Vec::with_capacity(entries.len());
    let mut valued = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let key_value = format!("{}_{}", entry.key, entry.value);
        let (node, found) = step(level, entry, &key_value)?;
        let shared = found == Found::Wildcard && node.share_threshold;
        let counted_value = if shared {
            node.label
                .strip_prefix(entry.key)
                .and_then(|v| v.strip_prefix('_'))
        } else {
            None
        };
        counted.push(entry.key.to_string());
        counted.push(counted_value.unwrap_or(entry.value).to_string());
        let request_label = if shared { &node.label } else { &key_value };
        detailed.push(request_label.clone());
        valued.push(match found {
            Found::Exact => key_value.clone(),
            _ if node.value_to_metric && !shared => key_value.clone(),
            Found::Wildcard => node.label.clone(),
            Found::KeyOnly => entry.key.to_string(),
        });
        if i + 1 == entries.len() && !node.limits.is_empty() {
            return Some(Match {
                node,
                counted,
                detailed_label: detailed.join("."),
                value_label: valued.join("."),
            });
        }
        if node.children.is_empty() {
            return None;
        }
        level = node;
    }
    None
}

/// The child of `level` that `entry` takes, most specific first.
fn step<'c>(level: &'c Node, entry: &Entry, key_value: &str) -> Option<(&'c Node, Found)> {
    if let Some(node) = level.children.get(key_value) {
        return Some((node, Found::Exact));
    }
    let wildcard = level.wildcards.iter().find(|w| w.matches(key_value));
    if let Some(node) = wildcard.and_then(|w| level.children.get(&w.key_value)) {
        return Some((node, Found::Wildcard));
    }
    level
        .children
        .get(entry.key)
        .map(|node| (node, Found::KeyOnly))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rls::config::Config;
    use std::path::PathBuf;

    fn config(yaml: &str) -> Config {
        let files = [(PathBuf::from("test.yaml"), yaml.to_string())];
        Config::from_files(&files, &crate::check::Bounds::default()).unwrap()
    }

    /// The path of the node `entries` reach in domain `d`, if any.
    fn path(config: &Config, entries: &[(&str, &str)]) -> Option<String> {
        let entries: Vec<Entry> = (entries.iter())
            .map(|&(key, value)| Entry { key, value })
            .collect();
        find(config.domain("d").unwrap(), &entries).map(|m| m.node.path.clone())
    }

    const LIMIT: &str = "rate_limit: {unit: second, requests_per_unit: 1}";

    #[test]
    fn a_key_and_value_is_tried_before_the_key_alone() {
        let config = config(&format!(
            "domain: d\ndescriptors:\n  - key: remote_address\n    {LIMIT}\n  - key: remote_address\n    value: 50.0.0.5\n    {LIMIT}\n"
        ));
        let any = path(&config, &[("remote_address", "10.0.0.1")]);
        assert_eq!(any.as_deref(), Some("remote_address"));
        let listed = path(&config, &[("remote_address", "50.0.0.5")]);
        assert_eq!(listed.as_deref(), Some("remote_address_50.0.0.5"));
    }

    #[test]
    fn a_limit_applies_only_at_the_request_descriptors_depth() {
        let shallow = config(&format!(
            "domain: d\ndescriptors:\n  - key: key\n    value: value\n    {LIMIT}\n"
        ));
        assert_eq!(path(&shallow, &[("key", "value"), ("subkey", "x")]), None);
        assert!(path(&shallow, &[("key", "value")]).is_some());
        let nested = config(&format!(
            "domain: d\ndescriptors:\n  - key: key\n    value: value\n    descriptors:\n      - key: subkey\n        {LIMIT}\n"
        ));
        let deep = path(&nested, &[("key", "value"), ("subkey", "x")]);
        assert_eq!(deep.as_deref(), Some("key_value.subkey"));
        assert_eq!(path(&nested, &[("key", "value")]), None);
    }

    #[test]
    fn wildcards_match_anywhere_in_the_value_and_after_exact_values() {
        let config = config(&format!(
            "domain: d\ndescriptors:\n  - key: path\n    value: /api/*/action\n    {LIMIT}\n  - key: path\n    value: /api/v9/action\n    {LIMIT}\n  - key: user\n    value: a*b*c\n    {LIMIT}\n"
        ));
        let wild = Some("path_/api/*/action".to_string());
        assert_eq!(path(&config, &[("path", "/api/123/action")]), wild);
        assert_eq!(path(&config, &[("path", "/api//action")]), wild);
        assert_eq!(path(&config, &[("path", "/api/123/other")]), None);
        let exact = path(&config, &[("path", "/api/v9/action")]);
        assert_eq!(exact.as_deref(), Some("path_/api/v9/action"));
        for (value, matches) in [
            ("abc", true),
            ("aXbYc", true),
            ("acb", false),
            ("ab", false),
        ] {
            assert_eq!(
                path(&config, &[("user", value)]).is_some(),
                matches,
                "{value}"
            );
        }
    }

    #[test]
    fn counters_and_labels_carry_the_values_each_option_asks_for() {
        let config = config(&format!(
            "domain: d\ndescriptors:\n  - key: files\n    value: files/*\n    share_threshold: true\n    {LIMIT}\n  - key: user\n    value_to_metric: true\n    descriptors:\n      - key: action\n        {LIMIT}\n"
        ));
        let root = config.domain("d").unwrap();
        let shared = find(
            root,
            &[Entry {
                key: "files",
                value: "files/a.pdf",
            }],
        )
        .unwrap();
        assert_eq!(shared.counted, ["files", "files/*"]);
        assert_eq!(shared.detailed_label, "files_files/*");
        let entries = [
            Entry {
                key: "user",
                value: "alice",
            },
            Entry {
                key: "action",
                value: "read",
            },
        ];
        let valued = find(root, &entries).unwrap();
        assert_eq!(valued.counted, ["user", "alice", "action", "read"]);
        assert_eq!(valued.value_label, "user_alice.action");
        assert_eq!(valued.detailed_label, "user_alice.action_read");
        assert_eq!(valued.node.path, "user.action");
    }
}
