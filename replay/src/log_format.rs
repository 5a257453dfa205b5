//! The Envoy access log that writes what `log` reads (`--print-log-format`): a file access log
//! whose `json_format` has the fixed fields and, for the configuration at hand, every request
//! header and dynamic-metadata namespace its key parts, tiers and matches read, and the route's
//! `sluice` metadata when it reads that (`route_metadata`). For policies that hold something of
//! a request until it ends (a concurrency limit's slot, a token budget's reservation), the
//! request's `%DURATION%`; for token budgets, what the filter read: the request body's fields
//! (filter state `wasm.sluice.body.<FIELD>`, `wasm.sluice.max_output_tokens`), the usage the
//! response's body reported (`wasm.sluice.usage`) or the header and trailer that carry it.

use serde_yaml::{Mapping, Value};
use sluice::config::{Plan, UsageSource};
use sluice::core::request::{Attr, BodyField};

/// Where the printed access log writes: any path will do.
pub const DEFAULT_PATH: &str = "/var/log/envoy/sluice-access.json";
const FILE_LOGGER_TYPE: &str =
    "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog";

/// The `json_format` for `plan`.
pub fn json_format(plan: &Plan) -> Mapping {
    let mut format = Mapping::new();
    let fields = [
        // Microseconds: the filter decides a request a few microseconds after it starts.
        ("start_time", "%START_TIME(%Y-%m-%dT%H:%M:%S.%6fZ)%"),
        ("method", "%REQ(:METHOD)%"),
        // The path as the filter saw it, before a route rewrote it.
        ("path", "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%"),
        ("authority", "%REQ(:AUTHORITY)%"),
        ("remote_address", "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%"),
        ("route_name", "%ROUTE_NAME%"),
        ("response_code", "%RESPONSE_CODE%"),
        // What tells a refusal of sluice's from an upstream's answer of the same status.
        ("response_code_details", "%RESPONSE_CODE_DETAILS%"),
    ];
    for (name, operator) in fields {
        format.insert(name.into(), operator.into());
    }
    let mut headers = Mapping::new();
    let mut metadata = Mapping::new();
    for attr in &plan.attrs {
        match attr {
            Attr::Header(name) => {
                let operator = format!("%REQ({})%", name.to_ascii_uppercase());
                headers.insert(name.as_str().into(), operator.into());
            }
            Attr::Metadata { namespace, .. } => {
                let operator = format!("%DYNAMIC_METADATA({namespace})%");
                metadata.insert(namespace.as_str().into(), operator.into());
            }
            _ => {}
        }
    }
    format.insert("headers".into(), Value::Mapping(headers));
    format.insert("metadata".into(), Value::Mapping(metadata));
    if plan.route_metadata.is_some() {
        let sluice = mapping([("sluice", "%METADATA(ROUTE:sluice)%".into())]);
        format.insert("route_metadata".into(), sluice);
    }
    request_body(plan, &mut format);
    until_the_end(plan, &mut format);
    format
}

/// What the filter read of the request body (`body:FIELD` key parts, a reservation from
/// `max_tokens`), from the filter state it publishes it in.
fn request_body(plan: &Plan, format: &mut Mapping) {
    let mut body = Mapping::new();
    for attr in &plan.attrs {
        let Attr::Body(field) = attr else {
            continue;
        };
        let operator = filter_state(&field.state_name());
        match field {
            BodyField::String(name) => body.insert(name.as_str().into(), operator.into()),
            BodyField::MaxOutputTokens => {
                format.insert("max_output_tokens".into(), operator.into())
            }
        };
    }
    if !body.is_empty() {
        format.insert("body".into(), Value::Mapping(body));
    }
}

/// When each request ended, for the policies that hold something of it until then, and what
/// its response used, for token budgets: the body's usage as the filter read it, or the header
/// and trailer a policy reads it from.
fn until_the_end(plan: &Plan, format: &mut Mapping) {
    let held = |p: &&sluice::config::Policy| p.holds_slots() || p.metered.is_some();
    if plan.policies.iter().any(|p| held(&p)) {
        format.insert("duration".into(), "%DURATION%".into());
    }
    let (mut headers, mut trailers) = (Mapping::new(), Mapping::new());
    for metered in plan.policies.iter().filter_map(|p| p.metered.as_ref()) {
        match &metered.source {
            UsageSource::Body(_) => {
                format.insert("usage".into(), filter_state("sluice.usage").into());
            }
            UsageSource::Priced { .. } => {
                format.insert("usage".into(), filter_state("sluice.usage").into());
                let model = filter_state("sluice.model");
                format.insert("served_model".into(), model.into());
            }
            UsageSource::Header(name) => {
                let upper = name.to_ascii_uppercase();
                headers.insert(name.as_str().into(), format!("%RESP({upper})%").into());
                trailers.insert(name.as_str().into(), format!("%TRAILER({upper})%").into());
            }
        }
    }
    if !headers.is_empty() {
        format.insert("response_headers".into(), Value::Mapping(headers));
        format.insert("response_trailers".into(), Value::Mapping(trailers));
    }
}

/// The operator that prints the filter state the filter set as `name` (Envoy adds `wasm.`).
fn filter_state(name: &str) -> String {
    format!("%FILTER_STATE(wasm.{name}:PLAIN)%")
}

/// The connection manager's `access_log` list with one file logger writing to `path`.
pub fn access_log(plan: &Plan, path: &str) -> Value {
    let log_format = mapping([("json_format", Value::Mapping(json_format(plan)))]);
    let config = mapping([
        ("@type", FILE_LOGGER_TYPE.into()),
        ("path", path.into()),
        ("log_format", log_format),
    ]);
    let logger = mapping([
        ("name", "envoy.access_loggers.file".into()),
        ("typed_config", config),
    ]);
    Value::Sequence(vec![logger])
}

fn mapping<const N: usize>(entries: [(&str, Value); N]) -> Value {
    Value::Mapping(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
}

/// What `--print-log-format` prints: the `access_log` field of the HTTP connection manager.
pub fn print(plan: &Plan) -> String {
    let mut field = Mapping::new();
    field.insert("access_log".into(), access_log(plan, DEFAULT_PATH));
    let yaml = serde_yaml::to_string(&field).unwrap_or_default();
    format!(
        "# The HTTP connection manager's access log for sluice-replay (any path will do):\n{yaml}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_asks_for_every_header_and_namespace_the_configuration_reads() {
        let config = r#"{"policies": [{"name": "p", "key": ["header:X-User-Id|metadata:envoy.filters.http.jwt_authn:payload.sub"],
            "match": {"headers": [{"name": "x-env", "present": true}]}, "requests": 1, "per": "1s",
            "tiers": {"by": "header:x-plan", "values": {"gold": {"requests": 5, "per": "1s"}}}}]}"#;
        let plan = sluice::config::parse(config.as_bytes()).unwrap();
        let format = json_format(&plan);
        let headers: Vec<_> = format["headers"].as_mapping().unwrap().iter().collect();
        assert_eq!(headers.len(), 3);
        assert_eq!(format["headers"]["x-user-id"], "%REQ(X-USER-ID)%");
        assert_eq!(format["headers"]["x-env"], "%REQ(X-ENV)%");
        assert_eq!(
            format["metadata"]["envoy.filters.http.jwt_authn"],
            "%DYNAMIC_METADATA(envoy.filters.http.jwt_authn)%"
        );
        let printed = print(&plan);
        let parsed: Value = serde_yaml::from_str(&printed).unwrap();
        let logged = &parsed["access_log"][0]["typed_config"];
        assert_eq!(
            logged["log_format"]["json_format"],
            Value::Mapping(format.clone())
        );
        assert_eq!(logged["path"], DEFAULT_PATH);
        for later in ["duration", "usage", "body", "response_headers"] {
            assert!(
                format.get(later).is_none(),
                "{later}: nothing held until the end"
            );
        }
    }

    #[test]
    fn a_token_budget_asks_for_the_duration_the_body_fields_and_usage_the_filter_read() {
        let config = r#"{"policies": [{"name": "llm", "key": ["header:x-team", "body:model"],
            "requests": 100000, "per": "1d", "cost": {"from_response": {"usage": "total_tokens"},
            "reserve": {"request": "max_tokens", "default": 100}}},
            {"name": "by-header", "key": ["header:x-team"], "requests": 1000, "per": "1m",
            "cost": {"from_response": {"header": "X-Usage-Total-Tokens"}}}]}"#;
        let plan = sluice::config::parse(config.as_bytes()).unwrap();
        let format = json_format(&plan);
        assert_eq!(format["duration"], "%DURATION%");
        assert_eq!(format["usage"], "%FILTER_STATE(wasm.sluice.usage:PLAIN)%");
        assert_eq!(
            format["body"]["model"],
            "%FILTER_STATE(wasm.sluice.body.model:PLAIN)%"
        );
        assert_eq!(
            format["max_output_tokens"],
            "%FILTER_STATE(wasm.sluice.max_output_tokens:PLAIN)%"
        );
        assert_eq!(
            format["response_headers"]["x-usage-total-tokens"],
            "%RESP(X-USAGE-TOTAL-TOKENS)%"
        );
        assert_eq!(
            format["response_trailers"]["x-usage-total-tokens"],
            "%TRAILER(X-USAGE-TOTAL-TOKENS)%"
        );
    }

    #[test]
    fn a_spend_budget_asks_for_the_model_the_response_named_too() {
        let config = r#"{"policies": [{"name": "spend", "key": ["header:x-team"],
            "requests": 100000, "per": "1d", "cost": {"price": {"m": {"input": 1, "output": 1}}}}]}"#;
        let plan = sluice::config::parse(config.as_bytes()).unwrap();
        let format = json_format(&plan);
        assert_eq!(format["usage"], "%FILTER_STATE(wasm.sluice.usage:PLAIN)%");
        assert_eq!(
            format["served_model"],
            "%FILTER_STATE(wasm.sluice.model:PLAIN)%"
        );
        assert_eq!(
            format["body"]["model"],
            "%FILTER_STATE(wasm.sluice.body.model:PLAIN)%"
        );
    }

    #[test]
    fn a_concurrency_limit_asks_for_the_duration_only() {
        let config = r#"{"policies": [{"name": "streams", "key": ["header:x-team"],
            "algorithm": "concurrency", "requests": 4}]}"#;
        let plan = sluice::config::parse(config.as_bytes()).unwrap();
        let format = json_format(&plan);
        assert_eq!(format["duration"], "%DURATION%");
        assert!(format.get("usage").is_none());
    }
}
