//! The routes of an Envoy configuration on which the sluice filter does not run: Envoy skips an
//! HTTP filter on a route whose `typed_per_filter_config` entry for the filter's name (its name in
//! `http_filters`) says `disabled: true`, the route's own entry first, then its virtual host's,
//! then its route configuration's, then the filter's own `disabled`. The replay leaves those
//! routes' requests undecided, as the filter never saw them; it tells them by `route_name`, so
//! such a route must have a name. Only inline `route_config`s are read (not RDS).

use serde::Deserialize;
use serde_yaml::Value;
use std::collections::BTreeSet;

/// The `@type` of Envoy's wasm HTTP filter.
pub const WASM_FILTER_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";

const HCM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";

/// The names of the routes, in every document of the YAML `text`, that switch the wasm filter
/// off. A route that does so without a name is refused: its lines could not be told.
pub fn routes_off(text: &str) -> Result<BTreeSet<Vec<u8>>, String> {
    let mut off = BTreeSet::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let doc = Value::deserialize(doc).map_err(|e| format!("not YAML: {e}"))?;
        visit(&doc, &mut off)?;
    }
    Ok(off)
}

/// Every HTTP connection manager in `value`.
fn visit(value: &Value, off: &mut BTreeSet<Vec<u8>>) -> Result<(), String> {
    match value {
        Value::Mapping(map) => {
            if map.get("@type").and_then(Value::as_str) == Some(HCM_TYPE) {
                connection_manager(value, off)?;
            }
            map.values().try_for_each(|v| visit(v, off))
        }
        Value::Sequence(items) => items.iter().try_for_each(|v| visit(v, off)),
        Value::Tagged(tagged) => visit(&tagged.value, off),
        _ => Ok(()),
    }
}

/// The routes of one connection manager's inline route configuration that switch its wasm filter
/// off.
fn connection_manager(hcm: &Value, off: &mut BTreeSet<Vec<u8>>) -> Result<(), String> {
    let filters = hcm.get("http_filters").and_then(Value::as_sequence);
    let wasm = filters.into_iter().flatten().find(|f| {
        f.get("typed_config")
            .and_then(|c| c.get("@type"))
            .and_then(Value::as_str)
            == Some(WASM_FILTER_TYPE)
    });
    let (Some(filter), Some(config)) = (wasm, hcm.get("route_config")) else {
        return Ok(());
    };
    let name = filter
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let by_default = filter.get("disabled").and_then(Value::as_bool) == Some(true);
    let config_off = switched_off(config, name);
    let hosts = config.get("virtual_hosts").and_then(Value::as_sequence);
    for host in hosts.into_iter().flatten() {
        let host_off = switched_off(host, name).or(config_off);
        let routes = host.get("routes").and_then(Value::as_sequence);
        for (index, route) in routes.into_iter().flatten().enumerate() {
            if !switched_off(route, name).or(host_off).unwrap_or(by_default) {
                continue;
            }
            let Some(route_name) = route.get("name").and_then(Value::as_str) else {
                let host = host.get("name").and_then(Value::as_str).unwrap_or_default();
                return Err(format!(
                    "virtual host {host:?}, routes[{index}]: switches the filter {name:?} off but \
                     has no name, so the replay cannot tell its requests in the log (give the \
                     route a name, which %ROUTE_NAME% logs)"
                ));
            };
            off.insert(route_name.as_bytes().to_vec());
        }
    }
    Ok(())
}

/// What `holder`'s (a route's, a virtual host's, a route configuration's) entry for the filter
/// `name` says: off (`disabled: true`), on (any other entry), or nothing.
fn switched_off(holder: &Value, name: &str) -> Option<bool> {
    let entry = holder.get("typed_per_filter_config")?.get(name)?;
    Some(entry.get("disabled").and_then(Value::as_bool) == Some(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Envoy listener's connection manager with the wasm filter (`filter` fields added) and
    /// these routes (YAML flow mappings) in one virtual host (`host` fields added).
    fn envoy(filter: &str, host: &str, routes: &[&str]) -> String {
        let routes: String = routes
            .iter()
            .map(|r| format!("\n              - {r}"))
            .collect();
        format!(
            r#"static_resources:
  listeners:
  - filter_chains:
    - filters:
      - typed_config:
          "@type": {HCM_TYPE}
          http_filters:
          - name: envoy.filters.http.wasm
            typed_config: {{ "@type": {WASM_FILTER_TYPE} }}{filter}
          - name: envoy.filters.http.router
          route_config:
            virtual_hosts:
            - name: local{host}
              routes:{routes}
"#
        )
    }

    const OFF: &str = r#"typed_per_filter_config: { envoy.filters.http.wasm: { "@type": type.googleapis.com/envoy.config.route.v3.FilterConfig, disabled: true } }"#;
    const ON: &str = r#"typed_per_filter_config: { envoy.filters.http.wasm: { "@type": type.googleapis.com/envoy.config.route.v3.FilterConfig } }"#;

    fn names(text: &str) -> Vec<String> {
        let off = routes_off(text).unwrap();
        off.into_iter()
            .map(|n| String::from_utf8(n).unwrap())
            .collect()
    }

    #[test]
    fn a_route_that_switches_the_filter_off_is_named_and_the_others_are_not() {
        let static_route = format!("{{ name: static, match: {{ prefix: /static/ }}, {OFF} }}");
        let yaml = envoy(
            "",
            "",
            &[&static_route, "{ name: api, match: { prefix: / } }"],
        );
        assert_eq!(names(&yaml), ["static"]);
    }

    #[test]
    fn a_virtual_host_switches_it_off_for_its_routes_unless_a_route_switches_it_back_on() {
        let host = format!("\n              {OFF}");
        let back_on = format!("{{ name: api, match: {{ prefix: /api/ }}, {ON} }}");
        let yaml = envoy(
            "",
            &host,
            &[&back_on, "{ name: rest, match: { prefix: / } }"],
        );
        assert_eq!(names(&yaml), ["rest"]);
    }

    #[test]
    fn a_filter_disabled_by_default_is_off_on_every_route_that_does_not_switch_it_on() {
        let on = format!("{{ name: api, match: {{ prefix: /api/ }}, {ON} }}");
        let yaml = envoy(
            "\n            disabled: true",
            "",
            &[&on, "{ name: rest, match: { prefix: / } }"],
        );
        assert_eq!(names(&yaml), ["rest"]);
    }

    #[test]
    fn a_route_without_a_name_that_switches_the_filter_off_is_refused_naming_it() {
        let unnamed = format!("{{ match: {{ prefix: /static/ }}, {OFF} }}");
        let yaml = envoy(
            "",
            "",
            &["{ name: api, match: { prefix: /api/ } }", &unnamed],
        );
        let error = routes_off(&yaml).unwrap_err();
        assert!(
            error.starts_with("virtual host \"local\", routes[1]: switches the filter \"envoy.filters.http.wasm\" off but has no name"),
            "{error}"
        );
    }

    #[test]
    fn the_shipped_demo_runs_the_filter_on_every_route() {
        let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../envoy/demo.yaml");
        assert!(names(&std::fs::read_to_string(demo).unwrap()).is_empty());
    }
}
