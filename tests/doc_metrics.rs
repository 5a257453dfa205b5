//! Every metric name the docs give is one the code exports: each `sluice_…` name in README.md,
//! docs/, envoy/ and deploy/observability/ (alerts, their tests, the rule, the dashboard) must be
//! a series of the filter or of the service, or the start of some (`sluice_service_rls_*`). And
//! the other way round: every series the code exports is named in README.md or docs/*.md.
//!
//! The exported names come from the code, not from a list here: the filter's counters as
//! `Counters::define` names them for each shipped configuration and for a concurrency and a
//! metered policy and a spend budget, whose series no other kind has (and the one counted on a refused
//! configuration), under the names Envoy's `/stats/prometheus` gives them with the bootstraps'
//! `stats_tags` and without them; the service's series as its registry holds them once its
//! `Metrics` and the RLS have registered (read from the registry, as its encoder skips a family
//! without samples yet). Other `sluice_` names are what the code calls them: the
//! counters' labels, the response code details, the workspace's crates and Python packages, the
//! Envoy clusters of envoy/*.yaml; and a name the docs say something `became` is a former one.
#![cfg(not(target_arch = "wasm32"))]
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::PathBuf;

use sluice::output::metrics::{count_config_error, Counters, Metrics, LABELS};
use sluice::output::reply::Refusal;
use sluice_testkit::docs::files;
use sluice_testkit::{repo_root, workspace_crates};

/// The OpenMetrics text's names of a family `F`'s samples: `F_total` for a counter, `F_info`,
/// `F_bucket`, ... (which a family is, its registry's listing does not say).
const SAMPLE_SUFFIXES: [&str; 7] = [
    "", "_total", "_info", "_bucket", "_sum", "_count", "_created",
];

#[test]
fn every_metric_name_in_the_docs_is_one_the_code_exports() {
    let (filter, service) = (filter_series(), service_families());
    let exported = |name: &str| {
        let of_service = |f: &String| SAMPLE_SUFFIXES.iter().any(|s| format!("{f}{s}") == name);
        filter.contains(name) || service.iter().any(of_service)
    };
    let begins = |start: &str| filter.iter().chain(&service).any(|e| e.starts_with(start));
    let other = other_names();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for path in documents() {
        let text = std::fs::read_to_string(&path).unwrap();
        for (line, name, after) in sluice_names(&text) {
            if other.contains(name) || former(after) {
                continue;
            }
            checked += 1;
            let known = if wildcard(name, after) {
                begins(name.trim_end_matches('_'))
            } else {
                exported(name)
            };
            if !known {
                let at = path.strip_prefix(repo_root()).unwrap_or(&path);
                wrong.push(format!("{}:{line}: {name}", at.display()));
            }
        }
    }
    let listed = |names: &BTreeSet<String>| names.iter().cloned().collect::<Vec<_>>().join("\n  ");
    assert!(
        wrong.is_empty(),
        "metric names in the docs that the code does not export:\n  {}\nthe filter's series:\n  \
         {}\nthe service's families (each with {SAMPLE_SUFFIXES:?}):\n  {}",
        wrong.join("\n  "),
        listed(&filter),
        listed(&service)
    );
    assert!(
        checked > 100,
        "only {checked} metric names found in the docs"
    );
}

/// The other way round: every series the code exports is named in README.md or docs/*.md, where
/// an operator looks for what it counts: the filter's as `/stats/prometheus` names them with the
/// bootstraps' `stats_tags`, the service's families with any of their samples' suffixes.
#[test]
fn every_metric_the_code_exports_is_named_in_the_docs() {
    let pages: Vec<String> = std::iter::once(repo_root().join("README.md"))
        .chain(files("docs", &["md"]))
        .map(|path| std::fs::read_to_string(path).unwrap())
        .collect();
    let named: BTreeSet<&str> = (pages.iter())
        .flat_map(|text| sluice_names(text))
        .map(|(_, name, _)| name)
        .collect();
    let mut missing: Vec<String> = filter_tagged_series()
        .into_iter()
        .filter(|series| !named.contains(series.as_str()))
        .collect();
    for family in service_families() {
        let with = |suffix: &&str| named.contains(format!("{family}{suffix}").as_str());
        if !SAMPLE_SUFFIXES.iter().any(with) {
            missing.push(family);
        }
    }
    assert!(
        missing.is_empty(),
        "series the code exports that no page of the docs names:\n  {}",
        missing.join("\n  ")
    );
}

/// README.md, docs/*.md, envoy/ (its Markdown and YAML, the RLS limits included) and
/// deploy/observability/.
fn documents() -> Vec<PathBuf> {
    let dirs = [
        ("docs", &["md"][..]),
        ("envoy", &["md", "yaml"]),
        ("envoy/rls-config", &["yaml"]),
        ("deploy/observability", &["yaml", "json"]),
    ];
    let found = dirs
        .iter()
        .flat_map(|(dir, extensions)| files(dir, extensions));
    std::iter::once(repo_root().join("README.md"))
        .chain(found)
        .collect()
}

/// Each `sluice_…` word of `text`: its line number, the word, and the text after it.
fn sluice_names(text: &str) -> Vec<(usize, &str, &str)> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut names = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let mut from = 0;
        while let Some(at) = line[from..].find("sluice_").map(|i| i + from) {
            let end = line[at..].find(|c| !word(c)).map_or(line.len(), |i| i + at);
            let starts_a_word = !line[..at].ends_with(word);
            if starts_a_word {
                names.push((index + 1, &line[at..end], &line[end..]));
            }
            from = end;
        }
    }
    names
}

/// `sluice_service_rls_*`, `sluice_service_rls_…`, `sluice_service_rls_`: the start of names.
fn wildcard(name: &str, after: &str) -> bool {
    name.ends_with('_') || after.starts_with('*') || after.starts_with('…')
}

/// A name the docs say was renamed: "`old` became", "`old` and `older` became".
fn former(after: &str) -> bool {
    let mut rest = after.strip_prefix('`').unwrap_or(after);
    while let Some(next) = rest.strip_prefix(" and `") {
        rest = next.split_once('`').map_or("", |(_, r)| r);
    }
    rest.starts_with(" became")
}

/// A `Metrics` host that only notes the names defined.
#[derive(Default)]
struct Recorder(RefCell<Vec<String>>);

impl Metrics for Recorder {
    fn define_counter(&self, name: &str) -> Option<u32> {
        self.0.borrow_mut().push(name.to_string());
        Some(0)
    }

    fn increment(&self, _: u32, _: u64) {}

    fn define_gauge(&self, name: &str) -> Option<u32> {
        self.define_counter(name)
    }

    fn adjust(&self, _: u32, _: i64) {}

    fn set(&self, _: u32, _: u64) {}
}

/// The filter's counters for the shipped configurations, as Envoy's `/stats/prometheus` names
/// them: with each label taken out by the bootstraps' `stats_tags` (`sluice_requests_total`),
/// and whole without them (`sluice_sluice_policy___per_user___…`).
fn filter_series() -> BTreeSet<String> {
    let host = Recorder::default();
    for plan in shipped_plans()
        .into_iter()
        .chain([plan_with_slots_and_tokens()])
    {
        Counters::define(&host, &plan);
    }
    count_config_error(&host);
    let names = host.0.into_inner();
    let tagged = names
        .iter()
        .map(|name| prometheus_name(&without_labels(name)));
    let untagged = names.iter().map(|name| prometheus_name(name));
    tagged.chain(untagged).collect()
}

/// The plans of the sluice configurations in envoy/*.yaml, every variable they name set.
fn shipped_plans() -> Vec<sluice::config::Plan> {
    let secret = "s".repeat(64);
    let mut plans = Vec::new();
    for path in files("envoy", &["yaml"]) {
        let text = std::fs::read_to_string(&path).unwrap();
        for config in sluice_replay::config_file::configs_in_yaml(&text).unwrap() {
            let json = config.to_string();
            let plan = sluice::config::parse_with_env(json.as_bytes(), &|_| Some(secret.clone()));
            plans.push(plan.unwrap_or_else(|e| panic!("{}: {e}", path.display())));
        }
    }
    assert!(plans.len() >= 2, "{plans:?}");
    plans
}

/// The filter's series as `/stats/prometheus` names them with the bootstraps' `stats_tags`
/// (`sluice_requests_total`), for the shipped configurations and a concurrency and a metered
/// policy.
fn filter_tagged_series() -> BTreeSet<String> {
    let host = Recorder::default();
    for plan in shipped_plans()
        .into_iter()
        .chain([plan_with_slots_and_tokens()])
    {
        Counters::define(&host, &plan);
    }
    count_config_error(&host);
    let names = host.0.into_inner();
    names
        .iter()
        .map(|name| prometheus_name(&without_labels(name)))
        .collect()
}

/// A concurrency policy and a metered one, with the overrides pulled: the series of their
/// slots, tokens and overrides are the code's whether or not a shipped configuration has them.
fn plan_with_slots_and_tokens() -> sluice::config::Plan {
    let config = serde_json::json!({"global": {"cluster": "sluice", "overrides": {}},
        "admin": {"listener": "ops", "token_env": "ADMIN"}, "policies": [
        {"name": "slots", "key": ["ip"], "algorithm": "concurrency", "requests": 1},
        {"name": "tokens", "key": ["ip"], "requests": 1000, "per": "1m",
         "cost": {"from_response": {"usage": "total_tokens"}}},
        {"name": "spend", "key": ["ip"], "requests": 1000, "per": "1m",
         "cost": {"price": {"m": {"input": 1, "output": 1}}}},
    ]});
    let token = |_: &str| Some("0123456789abcdef0123456789abcdef".to_string());
    sluice::config::parse_with_env(config.to_string().as_bytes(), &token).unwrap()
}

/// A counter's name with its `<label>=.=<value>;.;` pairs taken out, as `stats_tags` does.
fn without_labels(name: &str) -> String {
    let mut name = name.to_string();
    for label in LABELS {
        let start = format!("{label}=.=");
        if let Some(at) = name.find(&start) {
            let end = name[at..].find(";.;").map_or(name.len(), |i| at + i + 3);
            name.replace_range(at..end, "");
        }
    }
    name
}

/// What Envoy's Prometheus output makes of a custom stat's name: every character but letters,
/// digits and `_` becomes `_`.
fn prometheus_name(name: &str) -> String {
    let keep = |c: char| if c.is_ascii_alphanumeric() { c } else { '_' };
    name.chars().map(keep).collect()
}

/// The service's families: every one its registry holds once `Metrics` (as `default()` makes
/// it), the connection gate and the RLS have registered, read from the registry's `Debug` (the
/// only listing prometheus-client gives): each `prefix: Some(Prefix("…"))` is followed by the
/// `Descriptor`s registered under it.
fn service_families() -> BTreeSet<String> {
    let mut metrics = sluice_service::metrics::Metrics::default();
    sluice_service::rls::metrics::RlsMetrics::register(metrics.registry_mut());
    sluice_service::rlqs::metrics::RlqsMetrics::register(metrics.registry_mut());
    let limits = sluice_service::connections::Limits {
        max_connections: 1,
        header_timeout: std::time::Duration::from_secs(1),
        idle_timeout: std::time::Duration::from_secs(1),
    };
    sluice_service::connections::Gate::new(limits, metrics.registry_mut());
    sluice_service::admin::Audit::new(metrics.registry_mut());
    let listing = format!("{:?}", metrics.registry_mut());
    let mut families = Vec::new();
    let mut prefix = String::new();
    let mut rest = listing.as_str();
    const PREFIX: &str = "prefix: Some(Prefix(\"";
    const NAME: &str = "Descriptor { name: \"";
    loop {
        let (at_prefix, at_name) = (rest.find(PREFIX), rest.find(NAME));
        let name_first = match (at_prefix, at_name) {
            (None, None) => break,
            (Some(p), Some(n)) => n < p,
            (None, Some(_)) => true,
            (Some(_), None) => false,
        };
        if name_first {
            rest = &rest[at_name.unwrap() + NAME.len()..];
            let (name, after) = rest.split_once('"').unwrap();
            let unit = after
                .split_once("unit: ")
                .map(|(_, u)| u)
                .filter(|u| u.starts_with("Some("))
                .and_then(|u| u["Some(".len()..].split(')').next())
                .map(|u| format!("_{}", u.trim_matches('"').to_ascii_lowercase()));
            families.push(format!("{prefix}_{name}{}", unit.unwrap_or_default()));
            rest = after;
        } else {
            rest = &rest[at_prefix.unwrap() + PREFIX.len()..];
            let (text, after) = rest.split_once('"').unwrap();
            (prefix, rest) = (text.to_string(), after);
        }
    }
    assert!(
        families.iter().any(|f| f == "sluice_service_checks")
            && families
                .iter()
                .any(|f| f == "sluice_service_rls_total_hits"),
        "the registry's listing changed shape: {listing}"
    );
    families.into_iter().collect()
}

/// Names the code and the shipped configurations give to things other than series.
fn other_names() -> BTreeSet<String> {
    let mut names: BTreeSet<String> = LABELS.iter().map(|l| l.to_string()).collect();
    names.extend([Refusal::RateLimited, Refusal::Unavailable].map(|r| r.details().to_string()));
    names.insert(sluice::output::reply::MODEL_NOT_PRICED.to_string());
    names.insert(sluice::output::reply::STATUS.to_string());
    names.insert(sluice::output::reply::ADMIN.to_string());
    names.extend(crate_names());
    names.extend(python_packages());
    names.extend(envoy_clusters());
    names
}

/// The workspace's crates, as Rust names them (`sluice_service`).
fn crate_names() -> Vec<String> {
    workspace_crates()
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

/// bench/'s Python packages (`sluice_bench`).
fn python_packages() -> Vec<String> {
    let dirs = std::fs::read_dir(repo_root().join("bench")).unwrap();
    let dirs = dirs.map(|entry| entry.unwrap().path());
    dirs.filter(|dir| dir.join("__init__.py").exists())
        .map(|dir| dir.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

/// The clusters of envoy/*.yaml (`sluice_service`, `sluice_rls`), which the docs' configuration
/// examples name.
fn envoy_clusters() -> Vec<String> {
    let mut names = Vec::new();
    for path in files("envoy", &["yaml"]) {
        let text = std::fs::read_to_string(&path).unwrap();
        let bootstrap: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        let clusters = bootstrap["static_resources"]["clusters"].as_sequence();
        for cluster in clusters.into_iter().flatten() {
            names.extend(cluster["name"].as_str().map(str::to_string));
        }
    }
    names
}
