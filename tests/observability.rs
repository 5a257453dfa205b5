//! deploy/observability/ (alerts, their unit tests, the Grafana dashboard) is sound and asks
//! only for what sluice really exports:
//!
//! - `promtool check rules` and `promtool test rules` pass; every alert has an evaluation that
//!   expects it and one that expects nothing, a `for:` where it needs one, a severity, a summary,
//!   a description and a runbook link to a heading of docs/operations.md.
//! - prometheus-rule.yaml holds exactly alerts.yaml, and the kustomization renders it and the
//!   dashboard's ConfigMap (`kubectl kustomize`, from scripts/find-k8s-tools).
//! - The dashboard parses, takes its data source from a variable, and every query is valid
//!   PromQL (promtool checks them as recording rules, Grafana's variables filled in).
//! - Every metric name, label name and `=`-matched label value that a rule, a panel or a
//!   variable uses appears in what the real processes print after real traffic: an Envoy
//!   running the filter (local, shadow and global policies, labels from the stats_tags of
//!   envoy/global.yaml) with Envoy's own ratelimit filter in front of the RLS, and in front of
//!   the test kit's LLM upstream a metered, a concurrency and a global metered policy (usage
//!   refunded, owed, missing, invalid, a stream cut, a slot refused, settlements applied and
//!   one failing on Redis); a second Envoy that refused a configuration; and sluice-service with
//!   `--rls` after a Redis outage and a bad RLS configuration. Names are read from the PromQL
//!   by a small lexer, not a parser of PromQL's grammar: identifiers that are not functions,
//!   keywords or inside `{}`, `[]` and grouping lists are metric names. The labels a scrape adds (`job`, `instance`, and the
//!   `namespace` of Istio's scrape configurations) need not appear. Values matched by regex
//!   (`=~`) are not checked, nor whether a query returns what its panel says.
//!
//! `promtool` is Debian's `prometheus` package (`scripts/ensure-deps promtool`, which make test
//! runs).
#![cfg(not(target_arch = "wasm32"))]
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use sluice_testkit::envoy::{grpc_cluster, wasm_path, Envoy, EnvoyOptions};
use sluice_testkit::http::get;
use sluice_testkit::llm::{self, Api, LlmUpstream};
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::Service;
use sluice_testkit::{wait_for, TempDir};

/// Labels Prometheus adds to every series it scrapes, and the one Istio's scrape
/// configurations (its Prometheus addon, its PodMonitor for the Operator) add.
const SCRAPE_LABELS: [&str; 3] = ["job", "instance", "namespace"];
const SEVERITIES: [&str; 3] = ["critical", "warning", "info"];
/// How long a counter may take to reach Envoy's stats (the filter flushes once a second).
const STATS_WITHIN: Duration = Duration::from_secs(10);

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn pack(file: &str) -> PathBuf {
    repo().join("deploy/observability").join(file)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn yaml(path: &Path) -> Value {
    serde_yaml::from_str(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs `promtool ARGS` and returns its output; panics with it when promtool fails.
fn promtool(args: &[&str], dir: &Path) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("running promtool ({e}): `scripts/ensure-deps promtool` installs it")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

/// Every rule of a rules file (`groups[].rules[]`).
fn rules(file: &Value) -> Vec<&Value> {
    let groups = file["groups"].as_array().expect("groups");
    groups
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules"))
        .collect()
}

fn alert_names() -> Vec<String> {
    rules(&yaml(&pack("alerts.yaml")))
        .iter()
        .map(|r| r["alert"].as_str().expect("only alerts").to_string())
        .collect()
}

#[test]
fn the_alert_rules_pass_promtool_check_rules() {
    let out = promtool(&["check", "rules", "alerts.yaml"], &pack(""));
    let count = alert_names().len();
    assert!(
        out.contains(&format!("SUCCESS: {count} rules found")),
        "{out}"
    );
}

#[test]
fn every_alert_fires_and_stays_quiet_in_promtool_test_rules() {
    let out = promtool(&["test", "rules", "alerts.test.yaml"], &pack(""));
    assert!(out.contains("SUCCESS"), "{out}");

    let tests = yaml(&pack("alerts.test.yaml"));
    let (mut fires, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    for case in tests["tests"].as_array().unwrap() {
        for eval in case["alert_rule_test"].as_array().unwrap() {
            let name = eval["alertname"].as_str().unwrap().to_string();
            let expected = eval["exp_alerts"].as_array().map_or(0, Vec::len);
            if expected == 0 {
                &mut quiet
            } else {
                &mut fires
            }
            .insert(name);
        }
    }
    for alert in alert_names() {
        assert!(fires.contains(&alert), "no test makes {alert} fire");
        assert!(quiet.contains(&alert), "no test expects {alert} silent");
    }
}

/// GitHub's anchor of a heading: lower case, spaces to dashes, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn every_alert_says_how_bad_what_happened_and_where_its_runbook_is() {
    let doc = read(&repo().join("docs/operations.md"));
    let anchors: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect();
    // The alerts that fire on a new series take no `for:`: the series is the event.
    let instant = ["SluiceConfigRefused", "SluiceRlsConfigLoadFailed"];
    for rule in rules(&yaml(&pack("alerts.yaml"))) {
        let name = rule["alert"].as_str().unwrap();
        let severity = rule["labels"]["severity"].as_str().unwrap_or_default();
        assert!(
            SEVERITIES.contains(&severity),
            "{name}: severity {severity:?}"
        );
        assert_eq!(
            rule["for"].is_string(),
            !instant.contains(&name),
            "{name}: for"
        );
        for field in ["summary", "description"] {
            let text = rule["annotations"][field].as_str().unwrap_or_default();
            assert!(text.len() > 20, "{name}: {field} {text:?}");
        }
        let runbook = rule["annotations"]["runbook_url"].as_str().unwrap();
        let (doc_path, target) = runbook.split_once('#').unwrap();
        assert_eq!(doc_path, "docs/operations.md", "{name}");
        assert_eq!(target, anchor(name), "{name}: the runbook's anchor");
        assert!(
            anchors.contains(target),
            "{name}: no heading #{target} in {doc_path}"
        );
    }
}

/// The directory with kubectl (installed in .venv on first use).
fn kubectl() -> PathBuf {
    let out = Command::new(repo().join("scripts/find-k8s-tools"))
        .output()
        .expect("running scripts/find-k8s-tools");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()).join("kubectl")
}

#[test]
fn the_kustomization_renders_the_rules_file_as_a_prometheus_rule_and_the_dashboard() {
    let out = Command::new(kubectl())
        .arg("kustomize")
        .arg(pack(""))
        .output()
        .expect("running kubectl kustomize");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let find = |kind: &str| docs.iter().find(|d| d["kind"] == kind).expect(kind);

    let rule = find("PrometheusRule");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert!(
        rule["spec"] == yaml(&pack("alerts.yaml")),
        "prometheus-rule.yaml is not alerts.yaml: run scripts/prometheus-rule"
    );
    let dashboard = find("ConfigMap");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let json: Value = serde_json::from_str(dashboard["data"]["sluice.json"].as_str().unwrap())
        .expect("the ConfigMap's dashboard is JSON");
    assert_eq!(json, dashboard_json());
}

fn dashboard_json() -> Value {
    serde_json::from_str(&read(&pack("dashboard.json"))).expect("dashboard.json parses")
}

/// Every panel, those inside collapsed rows too.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let top = dashboard["panels"].as_array().unwrap();
    top.iter()
        .flat_map(|p| std::iter::once(p).chain(p["panels"].as_array().into_iter().flatten()))
        .collect()
}

/// `(panel title, PromQL)` of every query, Grafana's variables as they are.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    panels(dashboard)
        .into_iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap_or_default().to_string();
            let targets = p["targets"].as_array().cloned().unwrap_or_default();
            targets.into_iter().map(move |t| {
                let expr = t["expr"].as_str().expect("a target with expr").to_string();
                (title.clone(), expr)
            })
        })
        .collect()
}

/// The template variables' queries: `label_values(<selector>, <label>)`.
fn variable_queries(dashboard: &Value) -> Vec<(String, String)> {
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    variables
        .iter()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            let query = v["query"]["query"].as_str().unwrap();
            let inner = query
                .strip_prefix("label_values(")
                .and_then(|q| q.strip_suffix(')'))
                .unwrap_or_else(|| panic!("{query}: not label_values(...)"));
            let (selector, label) = inner.rsplit_once(',').unwrap();
            (selector.trim().to_string(), label.trim().to_string())
        })
        .collect()
}

#[test]
fn the_dashboard_takes_its_data_source_and_policies_from_variables() {
    let dashboard = dashboard_json();
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let source = variables.iter().find(|v| v["type"] == "datasource");
    assert_eq!(
        source.map(|v| &v["query"]),
        Some(&Value::from("prometheus"))
    );
    let policy = variables
        .iter()
        .find(|v| v["name"] == "policy")
        .expect("$policy");
    assert!(policy["query"]["query"]
        .as_str()
        .unwrap()
        .ends_with(", sluice_policy)"));

    let mut ids = BTreeSet::new();
    for panel in panels(&dashboard) {
        let title = panel["title"].as_str().unwrap();
        assert!(
            ids.insert(panel["id"].as_u64().unwrap()),
            "{title}: id taken"
        );
        let grid = &panel["gridPos"];
        let right = grid["x"].as_u64().unwrap() + grid["w"].as_u64().unwrap();
        assert!(right <= 24, "{title}: past the grid's 24 columns");
        if panel["type"] == "row" {
            continue;
        }
        assert!(panel["description"].is_string(), "{title}: no description");
        let mut sources = vec![&panel["datasource"]];
        sources.extend(
            panel["targets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| &t["datasource"]),
        );
        for source in sources {
            assert_eq!(source["uid"], "${datasource}", "{title}");
        }
    }
}

/// A query as Prometheus would get it: `$__rate_interval` a duration, the other variables
/// (always inside a regex matcher here) matching anything.
fn fill_variables(expr: &str, dashboard: &Value) -> String {
    let mut expr = expr.replace("$__rate_interval", "5m");
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        let name = variable["name"].as_str().unwrap();
        expr = expr.replace(&format!("${name}"), ".*");
    }
    assert!(
        !expr.contains('$'),
        "a variable the dashboard does not define: {expr}"
    );
    expr
}

#[test]
fn every_dashboard_query_is_valid_promql() {
    let dashboard = dashboard_json();
    let records: Vec<Value> = dashboard_queries(&dashboard)
        .iter()
        .enumerate()
        .map(|(i, (_, expr))| {
            serde_json::json!({"record": format!("dashboard:query_{i}"), "expr": fill_variables(expr, &dashboard)})
        })
        .collect();
    let file = serde_json::json!({"groups": [{"name": "dashboard", "rules": records}]});
    let temp = TempDir::new("dashboard-promql");
    std::fs::write(temp.path().join("queries.yaml"), file.to_string()).unwrap();
    let out = promtool(&["check", "rules", "queries.yaml"], temp.path());
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", records.len())),
        "{out}"
    );
}

/// What one PromQL expression names.
#[derive(Debug, Default, PartialEq)]
struct Refs {
    metrics: BTreeSet<String>,
    labels: BTreeSet<String>,
    /// `label="value"` matchers.
    matched: BTreeSet<(String, String)>,
    /// Metrics inside rate(), irate() or increase(): counters (or histogram buckets).
    rated: BTreeSet<String>,
}

#[derive(Debug, PartialEq)]
enum Token {
    Ident(String),
    Str(String),
    Punct(String),
    /// Numbers, durations and Grafana variables: nothing to check.
    Other,
}

fn tokens(expr: &str) -> Vec<Token> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    while let Some(&c) = chars.get(i) {
        let start = i;
        i += 1;
        match c {
            _ if c.is_whitespace() => {}
            '"' | '\'' | '`' => {
                let mut value = String::new();
                while let Some(&d) = chars.get(i) {
                    i += 1;
                    match d {
                        '\\' => {
                            value.extend(chars.get(i));
                            i += 1;
                        }
                        _ if d == c => break,
                        _ => value.push(d),
                    }
                }
                out.push(Token::Str(value));
            }
            '$' if chars.get(i) == Some(&'{') => {
                while chars.get(i).is_some_and(|&d| d != '}') {
                    i += 1;
                }
                i += 1;
                out.push(Token::Other);
            }
            '$' | '0'..='9' | '.' => {
                while chars.get(i).is_some_and(|&d| ident(d) || d == '.') {
                    i += 1;
                }
                out.push(Token::Other);
            }
            _ if ident(c) => {
                while chars.get(i).is_some_and(|&d| ident(d)) {
                    i += 1;
                }
                out.push(Token::Ident(chars[start..i].iter().collect()));
            }
            _ => {
                let pair: String = chars[start..(i + 1).min(chars.len())].iter().collect();
                if ["=~", "!~", "!=", "==", ">=", "<="].contains(&pair.as_str()) {
                    i += 1;
                    out.push(Token::Punct(pair));
                } else {
                    out.push(Token::Punct(c.to_string()));
                }
            }
        }
    }
    out
}

const GROUPING: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
const KEYWORDS: [&str; 5] = ["and", "or", "unless", "bool", "offset"];

/// Reads what `expr` refers to (see the module comment for what this lexer does not see).
fn refs(expr: &str) -> Refs {
    let tokens = tokens(expr);
    let mut refs = Refs::default();
    let punct = |i: usize, p: &str| matches!(tokens.get(i), Some(Token::Punct(q)) if q == p);
    let grouped =
        |i: usize| matches!(tokens.get(i), Some(Token::Ident(g)) if g == "by" || g == "without");
    let (mut in_braces, mut in_brackets, mut in_grouping) = (false, false, false);
    let mut rating = false;
    for (i, token) in tokens.iter().enumerate() {
        match token {
            Token::Punct(p) => match p.as_str() {
                "{" => in_braces = true,
                "}" => in_braces = false,
                "[" => in_brackets = true,
                "]" => in_brackets = false,
                ")" => in_grouping = false,
                _ => {}
            },
            Token::Ident(name) if in_braces => {
                refs.labels.insert(name.clone());
                if let (true, Some(Token::Str(value))) = (punct(i + 1, "="), tokens.get(i + 2)) {
                    refs.matched.insert((name.clone(), value.clone()));
                }
            }
            Token::Ident(name) if in_grouping => {
                refs.labels.insert(name.clone());
            }
            Token::Ident(name) if GROUPING.contains(&name.as_str()) => {
                in_grouping = punct(i + 1, "(");
            }
            // A function, or an aggregation followed by its grouping.
            Token::Ident(name) if punct(i + 1, "(") || grouped(i + 1) => {
                rating = ["rate", "irate", "increase"].contains(&name.as_str());
            }
            Token::Ident(name) if !in_brackets && !KEYWORDS.contains(&name.as_str()) => {
                refs.metrics.insert(name.clone());
                if std::mem::take(&mut rating) {
                    refs.rated.insert(name.clone());
                }
            }
            _ => {}
        }
    }
    refs
}

#[test]
fn the_promql_reader_finds_metrics_labels_and_matched_values() {
    let found = refs(
        r#"sum by (namespace, le) (rate(a_bucket{x="1", y=~"$v"}[$__rate_interval]))
           / ignoring (kind) group_left sum(increase(b_total[5m] offset 15m)) > bool 0.5
           and on () absent(c) or histogram_quantile(0.99, d) unless e"#,
    );
    let set = |names: &[&str]| names.iter().map(|s| s.to_string()).collect();
    assert_eq!(found.metrics, set(&["a_bucket", "b_total", "c", "d", "e"]));
    assert_eq!(found.labels, set(&["namespace", "le", "x", "y", "kind"]));
    assert_eq!(found.rated, set(&["a_bucket", "b_total"]));
    let matched: BTreeSet<_> = [("x".to_string(), "1".to_string())].into();
    assert_eq!(found.matched, matched);
}

/// One sample of an exposition: its name, its family's type, its labels.
#[derive(Debug)]
struct Sample {
    name: String,
    kind: String,
    labels: BTreeMap<String, String>,
}

/// Reads Prometheus' text format and OpenMetrics (whose counter families drop `_total`).
fn samples(text: &str) -> Vec<Sample> {
    let mut types = BTreeMap::new();
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (family, kind) = rest.split_once(' ').unwrap();
            types.insert(family.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let end = line.find(['{', ' ']).unwrap();
        let name = &line[..end];
        let family = [
            "", "_total", "_bucket", "_count", "_sum", "_created", "_info",
        ]
        .iter()
        .find_map(|suffix| types.get(name.strip_suffix(suffix)?));
        let mut labels = BTreeMap::new();
        if line[end..].starts_with('{') {
            let body = &line[end + 1..line.rfind('}').unwrap()];
            for token in tokens(body).chunks(4) {
                if let [Token::Ident(k), _, Token::Str(v), ..] = token {
                    labels.insert(k.clone(), v.clone());
                }
            }
        }
        let kind = family.cloned().unwrap_or_else(|| "untyped".into());
        out.push(Sample {
            name: name.to_string(),
            kind,
            labels,
        });
    }
    out
}

/// What `expr` (from `source`) asks that the samples lack, one line each.
fn missing(source: &str, expr: &str, samples: &[Sample]) -> Vec<String> {
    let refs = refs(expr);
    let of: Vec<&Sample> = samples
        .iter()
        .filter(|s| refs.metrics.contains(&s.name))
        .collect();
    let mut errors = Vec::new();
    for metric in &refs.metrics {
        if !of.iter().any(|s| &s.name == metric) {
            errors.push(format!("{source}: no metric {metric}"));
        }
    }
    for metric in &refs.rated {
        let kinds: BTreeSet<&str> = of
            .iter()
            .filter(|s| &s.name == metric)
            .map(|s| s.kind.as_str())
            .collect();
        if kinds.iter().any(|k| !["counter", "histogram"].contains(k)) {
            errors.push(format!("{source}: rate of {metric}, a {kinds:?}"));
        }
    }
    for label in &refs.labels {
        if !SCRAPE_LABELS.contains(&label.as_str())
            && !of.iter().any(|s| s.labels.contains_key(label))
        {
            errors.push(format!("{source}: no label {label} on {:?}", refs.metrics));
        }
    }
    for (label, value) in &refs.matched {
        if !of.iter().any(|s| s.labels.get(label) == Some(value)) {
            errors.push(format!(
                "{source}: no {label}=\"{value}\" on {:?}",
                refs.metrics
            ));
        }
    }
    errors
}

#[test]
fn the_check_reports_unknown_metrics_labels_and_values_and_the_rate_of_a_gauge() {
    let exposition = "# TYPE sluice_requests_total counter\n\
        sluice_requests_total{sluice_policy=\"per-user\",sluice_outcome=\"denied\"} 3\n\
        # TYPE sluice_service_redis_up gauge\nsluice_service_redis_up 1\n";
    let samples = samples(exposition);
    let fine = r#"sum by (namespace, sluice_policy) (rate(sluice_requests_total{sluice_outcome="denied"}[5m]))"#;
    assert_eq!(missing("ok", fine, &samples), Vec::<String>::new());
    for (expr, error) in [
        (
            "rate(sluice_request_total[5m])",
            "no metric sluice_request_total",
        ),
        ("sum by (policy) (sluice_requests_total)", "no label policy"),
        (
            r#"sluice_requests_total{sluice_outcome="deny"}"#,
            "no sluice_outcome=\"deny\"",
        ),
        (
            "rate(sluice_service_redis_up[5m])",
            "rate of sluice_service_redis_up",
        ),
    ] {
        let errors = missing("case", expr, &samples).join("\n");
        assert!(errors.contains(error), "{expr}: {errors:?}");
    }
}

/// One Envoy with sluice (`{plugin}`: a local, a shadow and a global policy on /api/; token
/// budgets and a concurrency limit on /v1/, the LLM upstream at `{llm_port}`) and Envoy's own
/// ratelimit filter (on /rls/, the descriptors of envoy/rls-config/demo.yaml), calling the
/// service (`{service_port}`) and the RLS (`{rls_cluster}`); the backend is a second listener. The
/// harness fills in `{port}`, `{admin_port}` and `{backend_port}`.
const BOOTSTRAP: &str = r#"
admin:
  address: { socket_address: { address: 127.0.0.1, port_value: {admin_port} } }
stats_config: {stats_config}
static_resources:
  listeners:
  - name: front
    address: { socket_address: { address: 127.0.0.1, port_value: {port} } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: front
          route_config:
            virtual_hosts:
            - name: front
              domains: ["*"]
              routes:
              - match: { prefix: /rls/ }
                route:
                  cluster: backend
                  rate_limits:
                  - actions:
                    - generic_key: { descriptor_value: api }
                    - request_headers: { header_name: x-user-id, descriptor_key: user }
                  - actions: [{ request_headers: { header_name: x-plan, descriptor_key: plan } }]
              - match: { prefix: /v1/ }
                route: { cluster: llm }
              - match: { prefix: / }
                route: { cluster: backend }
          http_filters:
          - name: envoy.filters.http.wasm
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: sluice
                root_id: sluice
                vm_config: { vm_id: sluice, runtime: envoy.wasm.runtime.v8, code: { local: { filename: {wasm} } } }
                configuration: { "@type": type.googleapis.com/google.protobuf.StringValue, value: {plugin} }
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: sluice-demo
              timeout: 0.5s
              rate_limit_service:
                transport_api_version: V3
                grpc_service: { envoy_grpc: { cluster_name: sluice_rls } }
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  - name: backend
    address: { socket_address: { address: 127.0.0.1, port_value: {backend_port} } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: backend
          route_config:
            virtual_hosts:
            - name: backend
              domains: ["*"]
              routes: [{ match: { prefix: / }, direct_response: { status: 200 } }]
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: sluice_service
    type: STATIC
    connect_timeout: 0.25s
    load_assignment:
      cluster_name: sluice_service
      endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: {service_port} } } } }] }]
{rls_cluster}
  - name: llm
    type: STATIC
    connect_timeout: 0.25s
    load_assignment:
      cluster_name: llm
      endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: {llm_port} } } } }] }]
  - name: backend
    type: STATIC
    connect_timeout: 0.25s
    load_assignment:
      cluster_name: backend
      endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: {backend_port} } } } }] }]
"#;

/// A value in YAML flow style: JSON is.
fn flow(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).unwrap()
}

/// `BOOTSTRAP` for this service and LLM upstream, with the stats_tags of envoy/global.yaml.
fn bootstrap(service: &Service, upstream: &LlmUpstream) -> String {
    let global = yaml(&repo().join("envoy/global.yaml"));
    // Unknown usages charged their reservation: the counters below count one of each reason.
    let tokens = |reserve: u64| {
        serde_json::json!({"from_response": {"usage": "total_tokens"},
        "reserve": reserve, "on_unknown": "reserve"})
    };
    let plugin = serde_json::json!({
        "global": {"cluster": "sluice_service", "authority": "sluice-service", "timeout": "500ms"},
        "policies": [
            {"name": "per-user", "match": {"path_prefix": "/api/"}, "key": ["header:x-user-id"],
             "requests": 60, "per": "1m", "burst": 3},
            {"name": "trial", "mode": "shadow", "match": {"path_prefix": "/api/"},
             "key": ["header:x-user-id"], "requests": 1, "per": "1m", "burst": 1},
            {"name": "global-user", "scope": "global", "match": {"path_prefix": "/api/"},
             "key": ["header:x-user-id"], "requests": 100, "per": "1m", "burst": 100},
            {"name": "llm", "match": {"path_prefix": "/v1/chat/"}, "key": ["header:x-api-key"],
             "requests": 1000, "per": "1m", "cost": tokens(100)},
            {"name": "llm-streams", "algorithm": "concurrency", "match": {"path_prefix": "/v1/chat/"},
             "key": ["header:x-api-key"], "requests": 1},
            {"name": "llm-global", "scope": "global", "match": {"path_prefix": "/v1/responses"},
             "key": ["header:x-api-key"], "requests": 100000, "per": "1d", "cost": tokens(100)}]
    });
    BOOTSTRAP
        .replace("{stats_config}", &flow(&global["stats_config"]))
        .replace("{plugin}", &flow(&plugin.to_string()))
        .replace("{wasm}", &flow(&wasm_path()))
        .replace("{service_port}", &service.addr.port().to_string())
        .replace(
            "{rls_cluster}",
            &grpc_cluster("sluice_rls", service.rls.unwrap()),
        )
        .replace("{llm_port}", &upstream.addr().port().to_string())
}

/// Sends `n` GETs of `path` to `envoy` with these headers; the statuses.
fn send(envoy: &Envoy, path: &str, n: usize, headers: &[(&str, &[u8])]) -> Vec<u16> {
    (0..n).map(|_| envoy.get(path, headers).status).collect()
}

/// Polls `scrape` until its text holds every one of `wanted`; the last text.
fn scrape_until(what: &str, wanted: &[&str], scrape: impl Fn() -> String) -> String {
    let text = wait_for(STATS_WITHIN, || {
        let text = scrape();
        wanted.iter().all(|w| text.contains(w)).then_some(text)
    });
    text.unwrap_or_else(|| {
        let text = scrape();
        let absent: Vec<_> = wanted.iter().filter(|w| !text.contains(*w)).collect();
        panic!("{what} still lacks {absent:?} after {STATS_WITHIN:?}:\n{text}")
    })
}

/// A chat completion through `envoy` for API key `key`, with these test headers: its status.
fn chat(envoy: &Envoy, key: &str, stream: bool, test: &[(&str, &str)]) -> u16 {
    let headers = [&[("x-api-key", key)][..], test].concat();
    llm::call(envoy.addr(), Api::ChatCompletions, stream, &headers).status
}

/// A response (OpenAI's Responses API, the global `llm-global`) using `usage`, its first byte
/// `delay_ms` late: its status.
fn response(envoy: &Envoy, key: &str, usage: &str, delay_ms: u64) -> u16 {
    let delay = delay_ms.to_string();
    let headers = [
        ("x-api-key", key),
        ("x-test-usage", usage),
        ("x-test-first-byte-ms", delay.as_str()),
    ];
    llm::call(envoy.addr(), Api::Responses, false, &headers).status
}

/// Waits until `upstream` has received `n` requests: the last one was admitted.
fn wait_for_calls(upstream: &LlmUpstream, n: usize) {
    let arrived = wait_for(STATS_WITHIN, || (upstream.calls().len() >= n).then_some(()));
    assert!(arrived.is_some(), "the upstream did not get request {n}");
}

/// The token budget `llm` and the concurrency limit `llm-streams` (one request a key) on chat
/// completions, each case a key of its own: usage under the reservation (refunded), over the
/// limit (owed), none, nonsense, a stream cut short (unknown, its slot reset), and a key's second
/// request while its first holds the slot (refused). Then `llm-global`'s usage settled with the
/// service: a charge and a refund.
fn llm_traffic(envoy: &Envoy, upstream: &LlmUpstream, service: &Service) {
    // 100 reserved each: 70 refunded; 1,000 owed (one burst past the limit); unknown twice.
    let usages = [
        ("under", "total=30"),
        ("over", "total=3000"),
        ("none", "none"),
        ("bad", "bad"),
    ];
    for (key, usage) in usages {
        let status = chat(envoy, key, false, &[("x-test-usage", usage)]);
        assert_eq!(status, 200, "{key}");
    }
    std::thread::scope(|s| {
        let first = s.spawn(|| chat(envoy, "busy", false, &[("x-test-first-byte-ms", "3000")]));
        wait_for_calls(upstream, 5);
        assert_eq!(chat(envoy, "busy", false, &[]), 429, "its slot is taken");
        assert_eq!(first.join().unwrap(), 200);
    });
    let cut = [("x-test-events", "10"), ("x-test-cut-after", "3")];
    chat(envoy, "cut", true, &cut);

    assert_eq!(response(envoy, "global", "total=300", 0), 200);
    assert_eq!(response(envoy, "global", "total=30", 0), 200);
    scrape_until(
        "the service's /metrics",
        &[
            r#"sluice_service_settlements_total{op="charge",result="applied"} 1"#,
            r#"sluice_service_settlements_total{op="refund",result="applied"} 1"#,
        ],
        || get(service.addr, "/metrics").text(),
    );
}

/// A second Envoy, its filter's configuration delivered by ECDS as Istio does: a good one, then
/// one it refuses. Its /stats/prometheus.
fn envoy_that_refused_a_configuration() -> String {
    let good = r#"{"policies": [{"name": "p", "key": ["ip"], "requests": 1, "per": "1s"}]}"#;
    let mut envoy = Envoy::options(good).ecds_from_file().concurrency(1).start();
    let refused = envoy.update_plugin(
        r#"{"policies": [{"name": "p", "key": ["ip"], "requests": 1, "per": "1s", "burst": 0}]}"#,
    );
    assert!(refused.is_err(), "burst 0 was accepted");
    scrape_until("the refusing Envoy", &["sluice_config_errors{} 1"], || {
        envoy.prometheus()
    })
}

/// Redis stopped under traffic to both the filter and the RLS, then a bad RLS file.
fn break_redis_and_the_rls_config(
    redis: &mut RedisServer,
    service: &Service,
    envoy: &Envoy,
    rls_dir: &Path,
) {
    redis.stop();
    let metrics = || get(service.addr, "/metrics").text();
    scrape_until(
        "the service's /metrics",
        &["sluice_service_redis_up 0"],
        metrics,
    );
    send(envoy, "/api/x", 2, &[("x-user-id", b"carol")]);
    send(envoy, "/rls/x", 1, &[("x-user-id", b"dave")]);
    std::fs::write(rls_dir.join("bad.yaml"), "domain: [not, a, domain]\n").unwrap();
}

/// The real outputs: the traffic `BOOTSTRAP` describes, then `break_redis_and_the_rls_config`
/// while a response of `llm-global` is under way (its settlement fails on Redis); Envoy's, the
/// refusing Envoy's and the service's scrapes.
fn real_scrapes() -> Vec<String> {
    let mut redis = RedisServer::start();
    let rls_dir = TempDir::new("observability-rls");
    let demo = repo().join("envoy/rls-config/demo.yaml");
    std::fs::copy(demo, rls_dir.path().join("demo.yaml")).unwrap();
    let (url, config) = (redis.url(), rls_dir.path().to_str().unwrap());
    let listen = ["--listen", "127.0.0.1:0", "--rls", "127.0.0.1:0"];
    let service = Service::start_rls(
        &[&listen[..], &["--redis", &url, "--rls-config", config]].concat(),
        &[],
    );
    let upstream = LlmUpstream::start();
    let mut options = EnvoyOptions::bootstrap(&bootstrap(&service, &upstream));
    options.concurrency = 1;
    let envoy = options.start();

    let alice: &[(&str, &[u8])] = &[("x-user-id", b"alice")];
    assert_eq!(send(&envoy, "/api/x", 5, alice), [200, 200, 200, 429, 429]);
    let bob: &[(&str, &[u8])] = &[("x-user-id", b"bob"), ("x-plan", b"basic")];
    let statuses = send(&envoy, "/rls/x", 7, bob);
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
    llm_traffic(&envoy, &upstream, &service);
    std::thread::scope(|s| {
        let late = s.spawn(|| response(&envoy, "late", "total=300", 4000));
        wait_for_calls(&upstream, 9);
        break_redis_and_the_rls_config(&mut redis, &service, &envoy, rls_dir.path());
        assert_eq!(late.join().unwrap(), 200);
    });

    let service_text = scrape_until(
        "the service's /metrics",
        &[
            "sluice_service_redis_errors_total{kind=\"connection\"}",
            "sluice_service_rls_errors_total{kind=\"redis\"}",
            "sluice_service_rls_config_loads_total{result=\"error\"}",
            "sluice_service_settlements_total{op=\"charge\",result=\"error\"}",
        ],
        || get(service.addr, "/metrics").text(),
    );
    let envoy_text = scrape_until(
        "Envoy's /stats/prometheus",
        &[
            r#"sluice_degraded_total{sluice_policy="global-user"} 2"#,
            r#"sluice_tokens_owed_total{sluice_policy="llm"} 1000"#,
            r#"sluice_usage_unknown_total{sluice_policy="llm",sluice_reason="missing"} 1"#,
            r#"sluice_usage_unknown_total{sluice_policy="llm",sluice_reason="invalid"} 1"#,
            r#"sluice_usage_unknown_total{sluice_policy="llm",sluice_reason="reset"} 1"#,
            r#"sluice_slots_released_total{sluice_policy="llm-streams",sluice_reason="reset"} 1"#,
            r#"sluice_requests_total{sluice_policy="llm-streams",sluice_outcome="denied"} 1"#,
        ],
        || envoy.prometheus(),
    );
    vec![
        envoy_text,
        envoy_that_refused_a_configuration(),
        service_text,
    ]
}

#[test]
fn every_metric_label_and_value_the_pack_queries_is_exported_by_envoy_and_the_service() {
    let samples: Vec<Sample> = real_scrapes().iter().flat_map(|t| samples(t)).collect();
    let mut errors = Vec::new();
    for rule in rules(&yaml(&pack("alerts.yaml"))) {
        let name = format!("alert {}", rule["alert"].as_str().unwrap());
        errors.extend(missing(&name, rule["expr"].as_str().unwrap(), &samples));
    }
    let dashboard = dashboard_json();
    for (title, expr) in dashboard_queries(&dashboard) {
        errors.extend(missing(&format!("panel {title:?}"), &expr, &samples));
    }
    for (selector, label) in variable_queries(&dashboard) {
        let query = format!("sum by ({label}) ({selector})");
        errors.extend(missing(&format!("variable {label}"), &query, &samples));
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}
