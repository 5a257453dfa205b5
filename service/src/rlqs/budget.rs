//! A bucket's global budget, from the RLS's limits files: the report's `domain` names the
//! file's domain, and the bucket id's entries walk its descriptor tree (each level takes the
//! entry that has a node there, most specific first: `key_value`, a wildcard, the bare `key`),
//! so one limits file serves both protocols. The budget is the node's first limited rule, with
//! its metrics label (the descriptor's path in the limits, never a request's value).

use std::collections::HashMap;
use std::time::Duration;

use crate::rules::config::{Config, Node, Rule};

/// Requests per period, and the metrics label of the limit that gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget<'c> {
    pub requests: u64,
    pub period: Duration,
    pub label: &'c str,
}

/// The budget of `bucket` in `domain`, if the limits give it one.
pub fn budget<'c>(
    config: &'c Config,
    domain: &str,
    bucket: &HashMap<String, String>,
) -> Option<Budget<'c>> {
    let mut level = config.domain(domain)?;
    let mut left: Vec<(&String, &String)> = bucket.iter().collect();
    left.sort();
    while !left.is_empty() {
        let (at, node) = left
            .iter()
            .enumerate()
            .find_map(|(i, (key, value))| step(level, key, value).map(|node| (i, node)))?;
        left.remove(at);
        level = node;
    }
    level.limits.iter().find_map(|limit| match &limit.rule {
        Rule::Limited(rate) => Some(Budget {
            requests: u64::from(rate.requests),
            period: Duration::from_millis(rate.window_ms),
            label: &limit.label,
        }),
        Rule::Unlimited => None,
    })
}

/// The child of `level` that `key` = `value` takes, most specific first.
fn step<'c>(level: &'c Node, key: &str, value: &str) -> Option<&'c Node> {
    let key_value = format!("{key}_{value}");
    if let Some(node) = level.children.get(&key_value) {
        return Some(node);
    }
    let wildcard = level.wildcards.iter().find(|w| w.matches(&key_value));
    if let Some(node) = wildcard.and_then(|w| level.children.get(&w.key_value)) {
        return Some(node);
    }
    level.children.get(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::check::Bounds;
    use std::path::PathBuf;

    const LIMITS: &str = "\
domain: api
descriptors:
  - key: tenant
    value: acme
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 600}
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 5}
";

    fn config() -> Config {
        let files = vec![(PathBuf::from("api.yaml"), LIMITS.to_owned())];
        Config::from_files(&files, &Bounds::default()).unwrap()
    }

    fn bucket(entries: &[(&str, &str)]) -> HashMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_bucket_id_walks_the_descriptor_tree_in_its_order_whatever_the_map_order() {
        let per_minute = Budget {
            requests: 600,
            period: Duration::from_secs(60),
            label: "tenant_acme.path",
        };
        let config = config();
        let found = budget(
            &config,
            "api",
            &bucket(&[("path", "/a"), ("tenant", "acme")]),
        );
        assert_eq!(found, Some(per_minute));
        let other = budget(&config, "api", &bucket(&[("tenant", "globex")]));
        assert_eq!(other.map(|b| (b.requests, b.label)), Some((5, "tenant")));
    }

    #[test]
    fn an_unknown_domain_or_bucket_has_no_budget() {
        assert_eq!(
            budget(&config(), "web", &bucket(&[("tenant", "acme")])),
            None
        );
        assert_eq!(budget(&config(), "api", &bucket(&[("user", "x")])), None);
    }
}
