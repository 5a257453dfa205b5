//! The JSON Schema of the plugin configuration (`schema/sluice-config.schema.json`) accepts every
//! shipped configuration (`schema/examples/*.json` and the plugin JSON inside `envoy/*.yaml` and
//! the manifests under `deploy/`) and rejects the classic mistakes. Needs no Envoy and no wasm
//! build.
#![cfg(not(target_arch = "wasm32"))]
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use jsonschema::Validator;
use serde_json::{json, Value};
// The extraction sluice-replay reads an Envoy, Istio or Envoy Gateway file's configuration with.
use sluice_replay::config_file::configs_in_yaml;
use sluice_replay::routes_off::WASM_FILTER_TYPE;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn schema() -> Value {
    let text = fs::read_to_string(repo().join("schema/sluice-config.schema.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn validator() -> Validator {
    jsonschema::draft202012::new(&schema()).unwrap()
}

/// Every schema violation of `config`, one per line, with the JSON pointer to the offending value.
fn violations(validator: &Validator, config: &Value) -> Vec<String> {
    validator
        .iter_errors(config)
        .map(|e| format!("{}: {}", e.instance_path(), e))
        .collect()
}

fn files_with_extension(dir: &Path, extensions: &[&str]) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.extension()
                .and_then(|ext| ext.to_str())
                .is_some_and(|ext| extensions.contains(&ext))
        })
        .collect();
    files.sort();
    files
}

fn example_files() -> Vec<PathBuf> {
    files_with_extension(&repo().join("schema/examples"), &["json"])
}

fn read_json(path: &Path) -> Value {
    let text = fs::read_to_string(path).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()))
}

/// The YAML files under `dir` and its subdirectories.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = files_with_extension(dir, &["yaml", "yml"]);
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(yaml_files(&path));
        }
    }
    files
}

/// (file, configurations) for every YAML file under envoy/ and deploy/ that mentions a wasm
/// filter.
fn envoy_plugin_configs() -> Vec<(PathBuf, Vec<Value>)> {
    let mut out = Vec::new();
    let files = [repo().join("envoy"), repo().join("deploy")].map(|dir| yaml_files(&dir));
    for path in files.into_iter().flatten() {
        let text = fs::read_to_string(&path).unwrap();
        let kinds = [
            WASM_FILTER_TYPE,
            "kind: WasmPlugin",
            "kind: EnvoyExtensionPolicy",
        ];
        if !kinds.iter().any(|kind| text.contains(kind)) {
            continue;
        }
        let configs = configs_in_yaml(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            !configs.is_empty(),
            "{}: mentions a wasm filter but no plugin configuration was found in it",
            path.display()
        );
        out.push((path, configs));
    }
    out
}

#[test]
fn schema_is_a_valid_draft_2020_12_schema() {
    if let Err(e) = jsonschema::draft202012::meta::validate(&schema()) {
        panic!(
            "schema/sluice-config.schema.json: {e} at {}",
            e.instance_path()
        );
    }
}

/// The filter's parser, in a VM whose environment has every variable a configuration names (as
/// the operator's deployment gives it).
fn filter_accepts(config: &Value) -> Result<(), sluice::config::ConfigError> {
    let env = |_: &str| Some("a-secret-from-the-deployment-32-bytes-or-more".to_string());
    sluice::config::parse_with_env(config.to_string().as_bytes(), &env).map(|_| ())
}

/// Valid for the schema and accepted by the filter's own parser, the real gate.
#[test]
fn every_shipped_configuration_is_valid() {
    let validator = validator();
    let mut checked = 0;
    let mut failures = Vec::new();

    for path in example_files() {
        let config = read_json(&path);
        if let Err(e) = filter_accepts(&config) {
            failures.push(format!("{}: the filter refuses it: {e}", path.display()));
        }
        let errors = violations(&validator, &config);
        if !errors.is_empty() {
            failures.push(format!("{}:\n  {}", path.display(), errors.join("\n  ")));
        }
        checked += 1;
    }
    for (path, configs) in envoy_plugin_configs() {
        for (i, config) in configs.iter().enumerate() {
            if let Err(e) = filter_accepts(config) {
                failures.push(format!(
                    "{} (#{i}): the filter refuses it: {e}",
                    path.display()
                ));
            }
            let errors = violations(&validator, config);
            if !errors.is_empty() {
                failures.push(format!(
                    "{} (plugin configuration #{i}):\n  {}",
                    path.display(),
                    errors.join("\n  ")
                ));
            }
            checked += 1;
        }
    }

    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked > 0, "no configuration was validated");
}

/// Every property the schema defines is used by at least one example, so the examples document
/// every field.
#[test]
fn examples_use_every_field_of_the_schema() {
    fn schema_properties(schema: &Value, out: &mut BTreeSet<String>) {
        match schema {
            Value::Object(map) => {
                if let Some(Value::Object(properties)) = map.get("properties") {
                    for (name, sub) in properties {
                        // `"match": false` forbids a field, it does not define one.
                        if sub != &Value::Bool(false) {
                            out.insert(name.clone());
                        }
                    }
                }
                map.values().for_each(|v| schema_properties(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| schema_properties(v, out)),
            _ => {}
        }
    }
    fn used_fields(config: &Value, out: &mut BTreeSet<String>) {
        match config {
            Value::Object(map) => {
                for (name, value) in map {
                    out.insert(name.clone());
                    used_fields(value, out);
                }
            }
            Value::Array(items) => items.iter().for_each(|v| used_fields(v, out)),
            _ => {}
        }
    }

    let mut defined = BTreeSet::new();
    schema_properties(&schema(), &mut defined);
    let mut used = BTreeSet::new();
    for path in example_files() {
        used_fields(&read_json(&path), &mut used);
    }
    let unused: Vec<_> = defined.difference(&used).collect();
    assert!(unused.is_empty(), "fields no example uses: {unused:?}");
}

/// A valid configuration that each negative case breaks in exactly one place.
fn base() -> Value {
    json!({
        "version": "test",
        "headers": "legacy",
        "policies": [{
            "name": "per-user",
            "match": {"path_prefix": "/api/", "methods": ["GET"],
                      "headers": [{"name": "x-env", "equals": "prod"}]},
            "key": ["header:x-user-id"],
            "requests": 100,
            "per": "1m",
            "burst": 20,
            "tiers": {"by": "header:x-plan", "values": {"premium": {"requests": 1000, "per": "1m"}}}
        }]
    })
}

#[test]
fn the_base_of_the_negative_cases_is_valid() {
    let errors = violations(&validator(), &base());
    assert!(errors.is_empty(), "{errors:#?}");
}

#[test]
fn classic_mistakes_are_rejected_where_they_are() {
    type Edit = fn(&mut Value);
    let cases: &[(&str, &str, Edit)] = &[
        ("unknown top-level field", "", |c| {
            c["polices"] = json!([]);
        }),
        ("status path with a query", "/status_path", |c| {
            c["status_path"] = json!("/api/ratelimit/status?key=bob");
        }),
        ("status path not a path", "/status_path", |c| {
            c["status_path"] = json!("ratelimit/status");
        }),
        (
            "an API key shown among the top keys",
            "/admin/top_show/0",
            |c| {
                c["admin"] = json!({"listener": "ops", "token_env": "T",
                                "top_show": ["header:X-Api-Key"]});
            },
        ),
        ("unknown policy field", "/policies/0", |c| {
            c["policies"][0]["limit"] = json!(5);
        }),
        ("unknown match field", "/policies/0/match", |c| {
            c["policies"][0]["match"]["path_regex"] = json!("^/a");
        }),
        (
            "unknown tier field",
            "/policies/0/tiers/values/premium",
            |c| {
                c["policies"][0]["tiers"]["values"]["premium"]["cost"] = json!(2);
            },
        ),
        ("duration without unit", "/policies/0/per", |c| {
            c["policies"][0]["per"] = json!("60");
        }),
        ("duration with unknown unit", "/policies/0/per", |c| {
            c["policies"][0]["per"] = json!("1w");
        }),
        ("fractional duration", "/policies/0/per", |c| {
            c["policies"][0]["per"] = json!("1.5s");
        }),
        ("zero duration", "/policies/0/per", |c| {
            c["policies"][0]["per"] = json!("0s");
        }),
        ("duration as a number", "/policies/0/per", |c| {
            c["policies"][0]["per"] = json!(60);
        }),
        (
            "bad tier duration",
            "/policies/0/tiers/values/premium/per",
            |c| {
                c["policies"][0]["tiers"]["values"]["premium"]["per"] = json!("1 m");
            },
        ),
        ("burst as string", "/policies/0/burst", |c| {
            c["policies"][0]["burst"] = json!("20");
        }),
        ("zero burst", "/policies/0/burst", |c| {
            c["policies"][0]["burst"] = json!(0);
        }),
        ("zero requests", "/policies/0/requests", |c| {
            c["policies"][0]["requests"] = json!(0);
        }),
        ("fractional cost", "/policies/0/cost", |c| {
            c["policies"][0]["cost"] = json!(1.5);
        }),
        ("max_keys too large", "/policies/0/max_keys", |c| {
            c["policies"][0]["max_keys"] = json!(10_000_001);
        }),
        ("missing requests", "/policies/0", |c| {
            c["policies"][0].as_object_mut().unwrap().remove("requests");
        }),
        ("empty key", "/policies/0/key", |c| {
            c["policies"][0]["key"] = json!([]);
        }),
        ("unknown key part", "/policies/0/key/0", |c| {
            c["policies"][0]["key"] = json!(["cookie:session"]);
        }),
        ("header part without a name", "/policies/0/key/0", |c| {
            c["policies"][0]["key"] = json!(["header:"]);
        }),
        ("empty link in a fallback chain", "/policies/0/key/0", |c| {
            c["policies"][0]["key"] = json!(["header:x-user-id||ip"]);
        }),
        ("name with a space", "/policies/0/name", |c| {
            c["policies"][0]["name"] = json!("per user");
        }),
        ("name too long", "/policies/0/name", |c| {
            c["policies"][0]["name"] = json!("n".repeat(65));
        }),
        ("unknown headers mode", "/headers", |c| {
            c["headers"] = json!("ietf");
        }),
        ("unknown mode", "/policies/0/mode", |c| {
            c["policies"][0]["mode"] = json!("dry-run");
        }),
        ("unknown missing_key", "/policies/0/missing_key", |c| {
            c["policies"][0]["missing_key"] = json!("deny");
        }),
        (
            "path_prefix and path_exact together",
            "/policies/0/match",
            |c| {
                c["policies"][0]["match"]["path_exact"] = json!("/api/x");
            },
        ),
        (
            "path without leading slash",
            "/policies/0/match/path_prefix",
            |c| {
                c["policies"][0]["match"]["path_prefix"] = json!("api/");
            },
        ),
        ("lower-case method", "/policies/0/match/methods/0", |c| {
            c["policies"][0]["match"]["methods"] = json!(["get"]);
        }),
        (
            "present and equals together",
            "/policies/0/match/headers/0",
            |c| {
                c["policies"][0]["match"]["headers"][0]["present"] = json!(true);
            },
        ),
        (
            "neither present nor equals",
            "/policies/0/match/headers/0",
            |c| {
                c["policies"][0]["match"]["headers"][0] = json!({"name": "x-env"});
            },
        ),
        (
            "present as a string",
            "/policies/0/match/headers/0/present",
            |c| {
                c["policies"][0]["match"]["headers"][0] =
                    json!({"name": "x-env", "present": "yes"});
            },
        ),
        (
            "tier without per",
            "/policies/0/tiers/values/premium",
            |c| {
                c["policies"][0]["tiers"]["values"]["premium"] = json!({"requests": 5});
            },
        ),
        ("no policies and no default", "/policies", |c| {
            c["policies"] = json!([]);
        }),
        ("missing policies", "", |c| {
            c.as_object_mut().unwrap().remove("policies");
        }),
        (
            "a denial status that is not an error",
            "/policies/0/denial/status",
            |c| {
                c["policies"][0]["denial"] = json!({"status": 200});
            },
        ),
        ("an unknown gRPC status", "/denial/grpc_status", |c| {
            c["denial"] = json!({"grpc_status": "rate_limited"});
        }),
        (
            "a content type that would split a header",
            "/denial/content_type",
            |c| {
                c["denial"] = json!({"content_type": "text/plain\r\nx: y"});
            },
        ),
        ("default with a match", "/default/match", |c| {
            c["default"] = json!({"name": "d", "match": {"path_prefix": "/"},
                                  "key": ["ip"], "requests": 1, "per": "1s"});
        }),
        (
            "rollout over 100 percent",
            "/policies/0/rollout/enforce_percent",
            |c| {
                c["policies"][0]["rollout"] = json!({"enforce_percent": 120});
            },
        ),
        ("rollout on a shadow policy", "/policies/0", |c| {
            c["policies"][0]["rollout"] = json!({"enforce_percent": 5});
            c["policies"][0]["mode"] = json!("shadow");
        }),
    ];

    let validator = validator();
    let mut wrong = Vec::new();
    for (what, expected_path, edit) in cases {
        let mut config = base();
        edit(&mut config);
        let errors = violations(&validator, &config);
        let at = format!("{expected_path}: ");
        if !errors.iter().any(|e| e.starts_with(&at)) {
            wrong.push(format!(
                "{what}: expected an error at {expected_path:?}, got {errors:#?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn key_parts_and_fallback_chains() {
    let validator = validator();
    let with_key = |part: &str| {
        let mut config = base();
        config["policies"][0]["key"] = json!([part]);
        config
    };
    for part in [
        "ip",
        "path",
        "method",
        "authority",
        "route",
        "global",
        "header:x-user-id",
        "header:X-Api-Key",
        "header:x-user-id|header:x-api-key|ip",
        "route|global",
        "body:model",
        "body:user|header:x-user-id",
    ] {
        assert!(validator.is_valid(&with_key(part)), "{part:?} rejected");
    }
    for part in [
        "",
        "IP",
        "header",
        "header:",
        "header:x user",
        "ip|",
        "|ip",
        "ip,path",
        "ip | path",
        "query:page",
        "body:",
        "body:messages[0]",
    ] {
        assert!(!validator.is_valid(&with_key(part)), "{part:?} accepted");
    }
}

/// A concurrency policy and a token budget, valid; each negative case below breaks one of them
/// in one place.
fn streams_and_budget() -> Value {
    json!({"policies": [
        {"name": "streams", "key": ["header:x-api-key"], "algorithm": "concurrency",
         "requests": 4, "lease": "10m", "retry_after": "2s",
         "tiers": {"by": "header:x-plan", "values": {"pro": {"requests": 16}}}},
        {"name": "llm", "key": ["header:x-api-key", "body:model"], "requests": 10000, "per": "1m",
         "cost": {"from_response": {"usage": "total_tokens"},
                  "reserve": {"request": "max_tokens", "default": 500}}}
    ]})
}

#[test]
fn concurrency_and_token_budget_mistakes_are_rejected_where_they_are() {
    let base = streams_and_budget();
    assert!(filter_accepts(&base).is_ok());
    assert_eq!(violations(&validator(), &base), Vec::<String>::new());
    type Edit = fn(&mut Value);
    let cases: &[(&str, &str, Edit)] = &[
        ("a window on slots", "/policies/0/per", |c| {
            c["policies"][0]["per"] = json!("1s");
        }),
        ("a burst of slots", "/policies/0/burst", |c| {
            c["policies"][0]["burst"] = json!(8);
        }),
        ("a cost of slots", "/policies/0/cost", |c| {
            c["policies"][0]["cost"] = json!(2);
        }),
        ("a slot lease in tokens", "/policies/0/lease", |c| {
            c["policies"][0]["lease"] = json!(3);
        }),
        (
            "a window on a tier of slots",
            "/policies/0/tiers/values/pro/per",
            |c| {
                c["policies"][0]["tiers"]["values"]["pro"]["per"] = json!("1m");
            },
        ),
        (
            "more slots than a key can hold",
            "/policies/0/requests",
            |c| {
                c["policies"][0]["requests"] = json!(1_000_001);
            },
        ),
        ("retry_after on a rate", "/policies/1/retry_after", |c| {
            c["policies"][1]["retry_after"] = json!("2s");
        }),
        ("a token lease on a budget", "/policies/1/lease", |c| {
            c["policies"][1]["lease"] = json!(10);
        }),
        ("a budget that cannot owe", "/policies/1/algorithm", |c| {
            c["policies"][1]["algorithm"] = json!("sliding_log");
        }),
        ("an unknown count", "/policies/1/cost", |c| {
            c["policies"][1]["cost"]["from_response"]["usage"] = json!("tokens");
        }),
        ("usage and header", "/policies/1/cost", |c| {
            c["policies"][1]["cost"]["from_response"]["header"] = json!("x-usage");
        }),
        ("every weight 0", "/policies/1/cost", |c| {
            c["policies"][1]["cost"]["from_response"]["usage"] =
                json!({"input_tokens": 0, "output_tokens": 0});
        }),
        (
            "a reservation from another field",
            "/policies/1/cost",
            |c| {
                c["policies"][1]["cost"]["reserve"]["request"] = json!("model");
            },
        ),
        ("on_unknown forgiven", "/policies/1/cost", |c| {
            c["policies"][1]["cost"]["on_unknown"] = json!("forgive");
        }),
        ("a price and a count", "/policies/1/cost", |c| {
            c["policies"][1]["cost"]["price"] = json!({"m": {"input": 1, "output": 1}});
        }),
        ("a price without output", "/policies/1/cost", |c| {
            c["policies"][1]["cost"] = json!({"price": {"m": {"input": 1}}});
        }),
        ("a price below 0", "/policies/1/cost", |c| {
            c["policies"][1]["cost"] = json!({"price": {"m": {"input": -1, "output": 1}}});
        }),
        ("an unknown_model mode", "/policies/1/cost", |c| {
            c["policies"][1]["cost"] = json!({"price": {"m": {"input": 1, "output": 1}},
                "unknown_model": "charge"});
        }),
    ];
    let validator = validator();
    let mut wrong = Vec::new();
    for (what, expected_path, edit) in cases {
        let mut config = streams_and_budget();
        edit(&mut config);
        assert!(filter_accepts(&config).is_err(), "the filter takes {what}");
        let errors = violations(&validator, &config);
        if !errors
            .iter()
            .any(|e| e.starts_with(&format!("{expected_path}: ")))
        {
            wrong.push(format!(
                "{what}: expected an error at {expected_path:?}, got {errors:#?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A monthly quota on a calendar: the base of the calendar mistakes.
fn calendar_quota() -> Value {
    json!({
        "policies": [{
            "name": "monthly",
            "key": ["header:x-tenant"],
            "algorithm": "fixed_window",
            "requests": 1000,
            "per": "1mo",
            "calendar": {"timezone": "Europe/Berlin", "starts": {"day": 31, "time": "06:30"}},
            "tiers": {"by": "header:x-plan", "values": {"trial": {"requests": 10, "per": "1d"}}}
        }]
    })
}

#[test]
fn calendar_mistakes_are_rejected_where_they_are() {
    let base = calendar_quota();
    assert!(filter_accepts(&base).is_ok());
    assert_eq!(violations(&validator(), &base), Vec::<String>::new());
    type Edit = fn(&mut Value);
    let cases: &[(&str, &str, Edit)] = &[
        (
            "a calendar on a token bucket",
            "/policies/0/algorithm",
            |c| {
                c["policies"][0]["algorithm"] = json!("token_bucket");
            },
        ),
        ("a calendar with a duration", "/policies/0/per", |c| {
            c["policies"][0]["per"] = json!("30d");
        }),
        (
            "a calendar tier with a duration",
            "/policies/0/tiers/values/trial/per",
            |c| {
                c["policies"][0]["tiers"]["values"]["trial"]["per"] = json!("1h");
            },
        ),
        ("a month without a calendar", "/policies/0/per", |c| {
            c["policies"][0].as_object_mut().unwrap().remove("calendar");
        }),
        ("no time zone", "/policies/0/calendar", |c| {
            c["policies"][0]["calendar"]
                .as_object_mut()
                .unwrap()
                .remove("timezone");
        }),
        ("a day past 31", "/policies/0/calendar/starts/day", |c| {
            c["policies"][0]["calendar"]["starts"]["day"] = json!(32);
        }),
        ("an hour past 23", "/policies/0/calendar/starts/time", |c| {
            c["policies"][0]["calendar"]["starts"]["time"] = json!("24:00");
        }),
        (
            "a weekday abbreviated",
            "/policies/0/calendar/starts/weekday",
            |c| {
                c["policies"][0]["calendar"]["starts"]["weekday"] = json!("mon");
            },
        ),
        (
            "an unknown start field",
            "/policies/0/calendar/starts",
            |c| {
                c["policies"][0]["calendar"]["starts"]["hour"] = json!(6);
            },
        ),
    ];
    let validator = validator();
    let mut wrong = Vec::new();
    for (what, expected_path, edit) in cases {
        let mut config = calendar_quota();
        edit(&mut config);
        assert!(filter_accepts(&config).is_err(), "the filter takes {what}");
        let errors = violations(&validator, &config);
        if !errors
            .iter()
            .any(|e| e.starts_with(&format!("{expected_path}: ")))
        {
            wrong.push(format!(
                "{what}: expected an error at {expected_path:?}, got {errors:#?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn durations() {
    let validator = validator();
    let with_per = |per: &str| {
        let mut config = base();
        config["policies"][0]["per"] = json!(per);
        config
    };
    for per in ["1ms", "500ms", "1s", "10m", "1h", "1d", "010s"] {
        assert!(validator.is_valid(&with_per(per)), "{per:?} rejected");
    }
    for per in [
        "", "s", "0ms", "00s", "-1s", "1S", "1sec", "1m30s", " 1s", "1s ",
    ] {
        assert!(!validator.is_valid(&with_per(per)), "{per:?} accepted");
    }
}

#[test]
fn an_empty_policy_list_is_fine_with_a_default() {
    let config = json!({
        "policies": [],
        "default": {"name": "everyone", "key": ["global"], "requests": 1000, "per": "1s"}
    });
    let errors = violations(&validator(), &config);
    assert!(errors.is_empty(), "{errors:#?}");
}

#[test]
fn the_yaml_extraction_finds_envoy_and_istio_configurations() {
    let envoy = r#"
static_resources:
  listeners:
  - filter_chains:
    - filters:
      - typed_config:
          http_filters:
          - name: envoy.filters.http.wasm
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: |
                    {"policies": [{"name": "a", "key": ["ip"], "requests": 1, "per": "1s"}]}
          - name: envoy.filters.http.wasm
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: '{"headers": "draft", "policies": [{"name": "b", "key": ["global"], "requests": 2, "per": "1m"}]}'
"#;
    let istio = r#"
apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {name: sluice}
spec:
  pluginConfig:
    policies:
    - name: c
      key: ["header:x-user-id|ip"]
      requests: 3
      per: 1h
"#;
    let found: Vec<Value> = [envoy, istio]
        .iter()
        .flat_map(|text| configs_in_yaml(text).unwrap())
        .collect();
    let names: Vec<_> = found
        .iter()
        .map(|c| c["policies"][0]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["a", "b", "c"]);
    let validator = validator();
    for config in &found {
        let errors = violations(&validator, config);
        assert!(errors.is_empty(), "{errors:#?}");
    }
}
