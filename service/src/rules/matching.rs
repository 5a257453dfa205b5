//! Which configured descriptor a request's descriptor matches, as envoyproxy/ratelimit decides:
//! entry by entry down the tree, each level most specific first (`key_value`, then a wildcard
//! value, then the value-less `key`), and a limit applies only if it sits at the request
//! descriptor's last entry.

use std::borrow::Cow;

use super::config::{Limit, Node};

/// One entry of a request's descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'r> {
    pub key: &'r str,
    pub value: &'r str,
}

/// A request descriptor that reached a node with limits. Its counters' key parts and metrics
/// labels are read from it when needed: most labels are the configuration's own, and making
/// them from the request each call would cost for nothing.
#[derive(Debug)]
pub struct Match<'c, 'r> {
    pub node: &'c Node,
    /// How each entry found its node, from the domain down.
    steps: Vec<Step<'c, 'r>>,
}

/// One entry and the node it took.
#[derive(Debug, Clone, Copy)]
struct Step<'c, 'r> {
    entry: Entry<'r>,
    node: &'c Node,
    found: Found,
}

/// How an entry found its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    Exact,
    Wildcard,
    KeyOnly,
}

impl<'c: 'r, 'r> Step<'c, 'r> {
    /// A `share_threshold` wildcard: all its values share the counters and the labels.
    fn shared(&self) -> bool {
        self.found == Found::Wildcard && self.node.share_threshold
    }

    /// The value as the counters know it: the request's, or the shared wildcard's pattern.
    fn counted_value(&self) -> &'r str {
        let pattern = (self.node.label.strip_prefix(self.entry.key))
            .and_then(|v| v.strip_prefix('_'))
            .filter(|_| self.shared());
        pattern.unwrap_or(self.entry.value)
    }

    /// Whether the detailed label (`detailed_metric`) takes the request's `key_value` here
    /// rather than the node's label (which an exact value or a shared wildcard is).
    fn detailed_from_request(&self) -> bool {
        self.found != Found::Exact && !self.shared()
    }

    /// Whether the label takes the request's `key_value` here: where `value_to_metric` asks
    /// (an exact value is the node's label anyway; a shared wildcard keeps its pattern).
    fn valued_from_request(&self) -> bool {
        self.node.value_to_metric && self.detailed_from_request()
    }
}

impl<'c: 'r, 'r> Match<'c, 'r> {
    /// Key and value of each entry as the counters know them: the request's value, or the
    /// pattern of a `share_threshold` wildcard (all its values share the counters).
    pub fn counted(&self) -> impl Iterator<Item = &'r str> + '_ {
        (self.steps.iter()).flat_map(|step| [step.entry.key, step.counted_value()])
    }

    /// The metrics label with every value the request sent (`detailed_metric`).
    pub fn detailed_label(&self) -> Cow<'c, str> {
        self.label_with(Step::detailed_from_request)
    }

    /// The metrics label with the request's values only where `value_to_metric` asks: the
    /// node's path when it asks nowhere.
    pub fn value_label(&self) -> Cow<'c, str> {
        self.label_with(Step::valued_from_request)
    }

    /// `limit`'s metrics label (one of the node's limits): its own (the node's path, and `#n`
    /// after a node's first limit) with the request's values where `detailed_metric` or
    /// `value_to_metric` asks.
    pub fn label_of(&self, limit: &'c Limit) -> Cow<'c, str> {
        let base = if limit.detailed_metric {
            self.detailed_label()
        } else {
            self.value_label()
        };
        match base {
            // The node's path: the limit's label is that and its suffix.
            Cow::Borrowed(_) => Cow::Borrowed(&limit.label),
            Cow::Owned(mut label) => {
                label.push_str(limit.label.strip_prefix(&self.node.path).unwrap_or(""));
                Cow::Owned(label)
            }
        }
    }

    /// The node labels joined by `.` (the node's path), with the request's `key_value` at the
    /// steps `from_request` picks.
    fn label_with(&self, from_request: fn(&Step<'c, 'r>) -> bool) -> Cow<'c, str> {
        if !self.steps.iter().any(from_request) {
            return Cow::Borrowed(&self.node.path);
        }
        let mut label = String::new();
        for (i, step) in self.steps.iter().enumerate() {
            if i > 0 {
                label.push('.');
            }
            if from_request(step) {
                push_key_value(&mut label, &step.entry);
            } else {
                label.push_str(&step.node.label);
            }
        }
        Cow::Owned(label)
    }
}

/// `<key>_<value>`, as the configuration names its nodes.
fn push_key_value(text: &mut String, entry: &Entry) {
    text.push_str(entry.key);
    text.push('_');
    text.push_str(entry.value);
}

/// The node whose limits apply to `entries`, if any.
pub fn find<'c: 'r, 'r>(
    root: &'c Node,
    entries: impl ExactSizeIterator<Item = Entry<'r>>,
) -> Option<Match<'c, 'r>> {
    let last = entries.len().checked_sub(1)?;
    let mut level = root;
    let mut steps = Vec::with_capacity(last + 1);
    let mut key_value = String::new();
    for (i, entry) in entries.enumerate() {
        key_value.clear();
        push_key_value(&mut key_value, &entry);
        let (node, found) = step(level, &entry, &key_value)?;
        steps.push(Step { entry, node, found });
        if i == last && !node.limits.is_empty() {
            return Some(Match { node, steps });
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
    use crate::rules::config::Config;
    use std::path::PathBuf;

    fn config(yaml: &str) -> Config {
        let files = [(PathBuf::from("test.yaml"), yaml.to_string())];
        Config::from_files(&files, &crate::decision::check::Bounds::default()).unwrap()
    }

    /// The path of the node `entries` reach in domain `d`, if any.
    fn path(config: &Config, entries: &[(&str, &str)]) -> Option<String> {
        let entries: Vec<Entry> = (entries.iter())
            .map(|&(key, value)| Entry { key, value })
            .collect();
        find(config.domain("d").unwrap(), entries.into_iter()).map(|m| m.node.path.clone())
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
            [Entry {
                key: "files",
                value: "files/a.pdf",
            }]
            .into_iter(),
        )
        .unwrap();
        assert_eq!(shared.counted().collect::<Vec<_>>(), ["files", "files/*"]);
        assert_eq!(shared.detailed_label(), "files_files/*");
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
        let valued = find(root, entries.into_iter()).unwrap();
        let counted: Vec<&str> = valued.counted().collect();
        assert_eq!(counted, ["user", "alice", "action", "read"]);
        assert_eq!(valued.value_label(), "user_alice.action");
        assert_eq!(valued.detailed_label(), "user_alice.action_read");
        assert_eq!(valued.node.path, "user.action");
    }
}
