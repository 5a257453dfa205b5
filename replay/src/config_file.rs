//! The configuration to replay, from a file: a sluice JSON configuration, or an Envoy, Istio or
//! Envoy Gateway YAML file holding one (the wasm filter's `configuration` StringValue, a
//! `WasmPlugin`'s `pluginConfig`, an `EnvoyExtensionPolicy`'s wasm `config`), with the routes of
//! an Envoy file that switch the filter off (`routes_off`). `tests/schema.rs` finds the shipped
//! configurations the same way.

use crate::routes_off::{routes_off, WASM_FILTER_TYPE};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;

const STRING_VALUE_TYPE: &str = "type.googleapis.com/google.protobuf.StringValue";

/// A configuration to replay, and where its Envoy configuration does not run the filter.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// The sluice configuration, as JSON text for `sluice::config::parse`.
    pub json: String,
    /// The names of the routes that switch the filter off (`routes_off`); none for JSON.
    pub routes_off: BTreeSet<Vec<u8>>,
}

/// The configuration in the file at `path`.
pub fn load(path: &Path) -> Result<Loaded, String> {
    let at = |e: String| format!("{}: {e}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| at(e.to_string()))?;
    let json = configuration(&text).map_err(at)?;
    let routes_off = if json == text {
        BTreeSet::new()
    } else {
        routes_off(&text).map_err(at)?
    };
    Ok(Loaded { json, routes_off })
}

/// The one sluice configuration in `text`: the text itself when it is JSON, else the one inside
/// the YAML.
pub fn configuration(text: &str) -> Result<String, String> {
    if serde_json::from_str::<Value>(text).is_ok() {
        return Ok(text.to_string());
    }
    match configs_in_yaml(text)?.as_slice() {
        [one] => Ok(one.to_string()),
        [] => Err(
            "neither JSON nor YAML with a sluice configuration in it (looked for the wasm \
                   filter's configuration, an Istio WasmPlugin's pluginConfig and an Envoy Gateway \
                   EnvoyExtensionPolicy's wasm config)"
                .into(),
        ),
        many => Err(format!(
            "holds {} sluice configurations: save the one to replay as a JSON file",
            many.len()
        )),
    }
}

/// Every sluice configuration in a YAML text of one or more documents.
pub fn configs_in_yaml(text: &str) -> Result<Vec<Value>, String> {
    let mut found = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let doc = serde_yaml::Value::deserialize(doc).map_err(|e| format!("not YAML: {e}"))?;
        plugin_configs(&doc, &mut found)?;
    }
    Ok(found)
}

/// The sluice configurations in one YAML document: the `configuration` StringValue of every Envoy
/// wasm HTTP filter, the `pluginConfig` of an Istio `WasmPlugin`, and the `config` of each wasm
/// extension of an Envoy Gateway `EnvoyExtensionPolicy`.
pub fn plugin_configs(doc: &serde_yaml::Value, found: &mut Vec<Value>) -> Result<(), String> {
    match doc {
        serde_yaml::Value::Mapping(map) => {
            if map.get("@type").and_then(|t| t.as_str()) == Some(WASM_FILTER_TYPE) {
                found.push(wasm_filter_config(doc)?);
            }
            if map.get("kind").and_then(|k| k.as_str()) == Some("WasmPlugin") {
                let config = doc
                    .get("spec")
                    .and_then(|spec| spec.get("pluginConfig"))
                    .ok_or("a WasmPlugin without spec.pluginConfig")?;
                found.push(serde_json::to_value(config).map_err(|e| e.to_string())?);
            }
            if map.get("kind").and_then(|k| k.as_str()) == Some("EnvoyExtensionPolicy") {
                let extensions = doc.get("spec").and_then(|spec| spec.get("wasm"));
                let extensions = extensions.and_then(|w| w.as_sequence());
                for extension in extensions.ok_or("an EnvoyExtensionPolicy without spec.wasm")? {
                    let config = extension
                        .get("config")
                        .ok_or("a wasm extension without config")?;
                    found.push(serde_json::to_value(config).map_err(|e| e.to_string())?);
                }
            }
            for (_, value) in map {
                plugin_configs(value, found)?;
            }
        }
        serde_yaml::Value::Sequence(items) => {
            for item in items {
                plugin_configs(item, found)?;
            }
        }
        serde_yaml::Value::Tagged(tagged) => plugin_configs(&tagged.value, found)?,
        _ => {}
    }
    Ok(())
}

/// The JSON in a wasm filter's `config.configuration`, a `google.protobuf.StringValue`.
fn wasm_filter_config(filter: &serde_yaml::Value) -> Result<Value, String> {
    let configuration = filter
        .get("config")
        .and_then(|c| c.get("configuration"))
        .ok_or("a wasm filter without config.configuration")?;
    if configuration.get("@type").and_then(|t| t.as_str()) != Some(STRING_VALUE_TYPE) {
        return Err("a wasm filter's configuration must be a google.protobuf.StringValue".into());
    }
    let text = configuration
        .get("value")
        .and_then(|v| v.as_str())
        .ok_or("a wasm filter's configuration.value must be a string")?;
    serde_json::from_str(text)
        .map_err(|e| format!("a wasm filter's configuration is not JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_taken_as_it_is_and_yaml_gives_its_one_configuration() {
        let json = r#"{"policies": [{"name": "a", "key": ["ip"], "requests": 1, "per": "1s"}]}"#;
        assert_eq!(configuration(json).unwrap(), json);
        let istio = "kind: WasmPlugin\nspec:\n  pluginConfig:\n    policies: []\n";
        assert_eq!(configuration(istio).unwrap(), r#"{"policies":[]}"#);
    }

    #[test]
    fn a_file_with_none_or_several_configurations_is_refused_with_a_reason() {
        let none = configuration("static_resources: {}\n").unwrap_err();
        assert!(
            none.contains("neither JSON nor YAML with a sluice configuration"),
            "{none}"
        );
        let two = "kind: WasmPlugin\nspec: {pluginConfig: {}}\n---\nkind: WasmPlugin\nspec: {pluginConfig: {}}\n";
        assert!(configuration(two).unwrap_err().contains("holds 2"));
        let bad = "\"@type\": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm\nconfig: {configuration: {value: x}}\n";
        assert!(configuration(bad).unwrap_err().contains("StringValue"));
    }

    #[test]
    fn the_shipped_envoy_demo_holds_one_configuration() {
        let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../envoy/demo.yaml");
        let loaded = load(&demo).unwrap();
        assert!(sluice::config::parse(loaded.json.as_bytes()).is_ok());
    }
}
