//! deploy/ is valid and fits together, checked offline:
//!
//! - The kustomization (with and without its token and rls components) renders with `kubectl
//!   kustomize`, and every resource it yields, and every manifest applied on its own
//!   (deploy/istio/, deploy/envoy-gateway/), is valid: Kubernetes' own kinds with
//!   `kubernetes-validate --strict` for the oldest and newest Kubernetes this targets, Istio's and
//!   Envoy Gateway's kinds with the hand-written schemas in tests/crd-schemas.yaml (what they
//!   cover is said there).
//! - The pieces agree: probes, selectors, ports, flags, volumes, the image's user, and the Envoy
//!   cluster names and authorities the global WasmPlugin and the gateway's rate limit
//!   EnvoyFilter call against the Service deploy/ defines.
//! - The rls component's ConfigMap loads in the real sluice-service, started with the
//!   Deployment's own flags, and the EnvoyFilter's filter and route actions, run in a real Envoy
//!   against it, limit a user as the ConfigMap says.
//!
//! The plugin configurations inside are checked by tests/schema.rs, with every other shipped
//! configuration. `scripts/find-k8s-tools` provides kubectl and kubernetes-validate (PyPI, in
//! .venv).
#![cfg(not(target_arch = "wasm32"))]
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde::Deserialize;
use serde_json::{json, Value};
use sluice_testkit::envoy::EnvoyOptions;
use sluice_testkit::redis::RedisServer;
use sluice_testkit::service::Service;
use sluice_testkit::TempDir;

/// The oldest and the newest Kubernetes the manifests are checked against.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.31.0", "1.37.0"];
/// The user scripts/oci-image gives the service image.
const IMAGE_USER: u64 = 65532;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The directory with kubectl and kubernetes-validate (installed on first use).
fn tools() -> &'static Path {
    static TOOLS: OnceLock<PathBuf> = OnceLock::new();
    TOOLS.get_or_init(|| {
        let out = Command::new(repo().join("scripts/find-k8s-tools"))
            .output()
            .expect("running scripts/find-k8s-tools");
        assert!(
            out.status.success(),
            "scripts/find-k8s-tools: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

fn yaml_docs(text: &str, what: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{what}: not YAML: {e}")))
        .filter(|doc| !doc.is_null())
        .collect()
}

/// `kubectl kustomize` of a directory.
fn kustomize(dir: &Path) -> Vec<Value> {
    let out = Command::new(tools().join("kubectl"))
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("running kubectl kustomize");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {stderr}",
        dir.display()
    );
    yaml_docs(&String::from_utf8(out.stdout).unwrap(), "kubectl kustomize")
}

/// deploy/ with these components enabled as its kustomization says to: a copy of deploy/'s own
/// files and the components' directories, with their commented `components:` lines uncommented.
fn kustomize_with(components: &[&str]) -> Vec<Value> {
    let temp = TempDir::new("deploy-components");
    let deploy = repo().join("deploy");
    copy_files(&deploy, temp.path());
    let path = temp.path().join("kustomization.yaml");
    let mut kustomization = std::fs::read_to_string(&path).unwrap();
    for line in std::iter::once("components:".to_string())
        .chain(components.iter().map(|name| format!("  - {name}")))
    {
        let commented = format!("\n# {line}\n");
        assert!(
            kustomization.contains(&commented),
            "deploy/kustomization.yaml has no {commented:?} to uncomment"
        );
        kustomization = kustomization.replacen(&commented, &format!("\n{line}\n"), 1);
    }
    std::fs::write(&path, kustomization).unwrap();
    for name in components {
        let dir = temp.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        copy_files(&deploy.join(name), &dir);
    }
    kustomize(temp.path())
}

/// The files (not the directories) of `from`, into `to`.
fn copy_files(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
        }
    }
}

/// Every YAML file under deploy/ applied on its own (not part of the kustomization).
fn standalone_manifests() -> Vec<(PathBuf, Vec<Value>)> {
    ["deploy/istio", "deploy/envoy-gateway"]
        .iter()
        .flat_map(|dir| std::fs::read_dir(repo().join(dir)).unwrap())
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .map(|path| {
            let docs = yaml_docs(
                &std::fs::read_to_string(&path).unwrap(),
                &path.display().to_string(),
            );
            (path, docs)
        })
        .collect()
}

/// Kubernetes' own API groups: the core group ("v1"), dotless ones and *.k8s.io.
fn is_builtin(doc: &Value) -> bool {
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    match api_version.split_once('/') {
        None => true,
        Some((group, _)) => !group.contains('.') || group.ends_with(".k8s.io"),
    }
}

fn describe(doc: &Value) -> String {
    format!(
        "{} {}",
        doc["kind"].as_str().unwrap_or("?"),
        doc["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// Kubernetes' own kinds through `kubernetes-validate --strict`, for each version.
fn kubernetes_validate(docs: &[&Value], what: &str) {
    let temp = TempDir::new("deploy-validate");
    let file = temp.path().join("resources.yaml");
    // As JSON documents: YAML 1.1 readers take an unquoted `no` for false.
    let text: Vec<String> = docs.iter().map(|d| d.to_string()).collect();
    std::fs::write(&file, text.join("\n---\n")).unwrap();
    for version in KUBERNETES_VERSIONS {
        let out = Command::new(tools().join("kubernetes-validate"))
            .args(["--strict", "--no-warn", "-k", version])
            .arg(&file)
            .output()
            .expect("running kubernetes-validate");
        let report = String::from_utf8_lossy(&out.stdout);
        let passed = report.matches(" passed for resource ").count();
        assert!(
            out.status.success() && passed == docs.len(),
            "{what} against Kubernetes {version}: {passed} of {} passed\n{report}{}",
            docs.len(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Istio's and Envoy Gateway's kinds against tests/crd-schemas.yaml; errors, one per line.
fn crd_violations(doc: &Value) -> Vec<String> {
    static SCHEMAS: OnceLock<Value> = OnceLock::new();
    let schemas = SCHEMAS.get_or_init(|| {
        let text = std::fs::read_to_string(repo().join("tests/crd-schemas.yaml")).unwrap();
        yaml_docs(&text, "tests/crd-schemas.yaml").remove(0)
    });
    let kind = doc["kind"].as_str().unwrap_or_default();
    if schemas["$defs"].get(kind).is_none() {
        return vec![format!("{}: no schema for kind {kind:?}", describe(doc))];
    }
    let mut schema = schemas.clone();
    schema["$ref"] = json!(format!("#/$defs/{kind}"));
    let validator = jsonschema::draft202012::new(&schema).unwrap();
    validator
        .iter_errors(doc)
        .map(|e| format!("{} at {}: {e}", describe(doc), e.instance_path()))
        .collect()
}

/// Every document valid for its kind; Kubernetes' own kinds in one kubernetes-validate run.
fn assert_valid(docs: &[Value], what: &str) {
    let (builtin, custom): (Vec<&Value>, Vec<&Value>) = docs.iter().partition(|d| is_builtin(d));
    let errors: Vec<String> = custom.iter().flat_map(|d| crd_violations(d)).collect();
    assert!(errors.is_empty(), "{what}:\n{}", errors.join("\n"));
    if !builtin.is_empty() {
        kubernetes_validate(&builtin, what);
    }
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// `selector` (a label map) picks the pods labelled `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let selector = selector.as_object().expect("a selector");
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The manifest deploy/istio/`file`, applied on its own.
fn standalone(file: &str) -> Vec<Value> {
    standalone_manifests()
        .into_iter()
        .find(|(path, _)| path.ends_with(file))
        .unwrap_or_else(|| panic!("no deploy/istio/{file}"))
        .1
}

fn args(container: &Value) -> Vec<&str> {
    container["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect()
}

/// The value of `--name=VALUE` in `args`.
fn flag<'a>(args: &[&'a str], name: &str) -> &'a str {
    args.iter()
        .find_map(|a| a.strip_prefix(name)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {name}=... in {args:?}"))
}

/// The item of the list `items` whose `key` is `value`.
fn item<'a>(items: &'a Value, key: &str, value: &Value) -> &'a Value {
    items
        .as_array()
        .unwrap()
        .iter()
        .find(|item| &item[key] == value)
        .unwrap_or_else(|| panic!("no {key} {value} in {items}"))
}

/// The RLS followed from the Deployment's flags to the Service and the ConfigMap, each step
/// asserted: `--rls` listens on a named container port that a gRPC port of the Service targets,
/// and `--rls-config` is the read-only mount of a volume holding the ConfigMap. Returns the
/// Service's port and the ConfigMap.
fn rls_wiring(docs: &[Value]) -> (u64, &Value) {
    let pod = &find(docs, "Deployment", "sluice-service")["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args = args(container);
    let (_, listen_port) = flag(&args, "--rls").rsplit_once(':').unwrap();
    let listen_port: u64 = listen_port.parse().unwrap();
    let container_port = item(&container["ports"], "containerPort", &json!(listen_port));
    let service = find(docs, "Service", "sluice-service");
    let service_port = item(
        &service["spec"]["ports"],
        "targetPort",
        &container_port["name"],
    );
    // Istio speaks HTTP/2, which gRPC needs, to a port it knows as grpc.
    assert_eq!(service_port["appProtocol"], "grpc");
    // Ready when the RLS's gRPC health service says so, on the port it listens on; alive as the
    // base says (a process that answers).
    let ready = &container["readinessProbe"]["grpc"];
    assert_eq!(ready["port"], json!(listen_port));
    assert_eq!(
        ready["service"],
        "envoy.service.ratelimit.v3.RateLimitService"
    );
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");

    let config = flag(&args, "--rls-config");
    let mount = item(&container["volumeMounts"], "mountPath", &json!(config));
    assert_eq!(mount["readOnly"], true);
    let volume = item(&pod["volumes"], "name", &mount["name"]);
    let config_map = find(
        docs,
        "ConfigMap",
        volume["configMap"]["name"].as_str().unwrap(),
    );
    (service_port["port"].as_u64().unwrap(), config_map)
}

/// The ConfigMap's files, each parsed: (name, YAML).
fn config_files(config_map: &Value) -> Vec<(&String, Value)> {
    let data = config_map["data"]
        .as_object()
        .expect("a ConfigMap with data");
    data.iter()
        .map(|(name, text)| {
            let docs = yaml_docs(text.as_str().unwrap(), name);
            assert_eq!(docs.len(), 1, "{name}: one document");
            (name, docs.into_iter().next().unwrap())
        })
        .collect()
}

/// The limits of `domain`: the ConfigMap's file for it.
fn limits_of(config_map: &Value, domain: &Value) -> Value {
    config_files(config_map)
        .into_iter()
        .map(|(_, limits)| limits)
        .find(|limits| &limits["domain"] == domain)
        .unwrap_or_else(|| panic!("no file of domain {domain}"))
}

#[test]
fn the_kustomization_renders_and_every_resource_in_it_is_valid() {
    let docs = kustomize(&repo().join("deploy"));
    assert_valid(&docs, "kubectl kustomize deploy/");
    for doc in &docs {
        let namespace = doc["metadata"]["namespace"].as_str();
        if doc["kind"] != "Namespace" {
            assert_eq!(namespace, Some("sluice"), "{}", describe(doc));
        }
    }
}

#[test]
fn the_token_component_mounts_the_secret_and_passes_the_token_file() {
    let docs = kustomize_with(&["token"]);
    assert_valid(&docs, "deploy/ with components: [token]");
    let pod = &find(&docs, "Deployment", "sluice-service")["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let path = flag(&args(container), "--token-file");
    let mount = &container["volumeMounts"][0];
    assert_eq!(mount["name"], "token");
    assert!(
        path.starts_with(mount["mountPath"].as_str().unwrap()),
        "{path} is not in the mount"
    );
    let volume = &pod["volumes"][0];
    assert_eq!(volume["secret"]["secretName"], "sluice-service-token");
    assert_eq!(
        pod["securityContext"]["fsGroup"], IMAGE_USER,
        "the user could not read it"
    );
}

#[test]
fn every_manifest_applied_on_its_own_is_valid() {
    let manifests = standalone_manifests();
    let kinds: Vec<String> = manifests
        .iter()
        .flat_map(|(_, docs)| docs.iter().map(describe))
        .collect();
    for (path, docs) in &manifests {
        assert_valid(docs, &path.display().to_string());
    }
    for expected in [
        "WasmPlugin sluice-local",
        "WasmPlugin sluice-global",
        "EnvoyExtensionPolicy sluice",
        "EnvoyFilter sluice-ratelimit",
    ] {
        assert!(
            kinds.iter().any(|k| k == expected),
            "no {expected} in {kinds:?}"
        );
    }
}

#[test]
fn the_service_deployment_its_service_and_its_budget_fit_together() {
    let docs = kustomize(&repo().join("deploy"));
    let deployment = find(&docs, "Deployment", "sluice-service");
    let pod = &deployment["spec"]["template"];
    let labels = &pod["metadata"]["labels"];
    let container = &pod["spec"]["containers"][0];

    assert_eq!(deployment["spec"]["replicas"], 2);
    assert!(selects(
        &deployment["spec"]["selector"]["matchLabels"],
        labels
    ));
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert!(container["resources"]["requests"]["cpu"].is_string());
    assert!(container["resources"]["requests"]["memory"].is_string());
    let image = container["image"].as_str().unwrap();
    assert!(
        image.ends_with("/sluice-service:0.1.0"),
        "the images transformer missed it: {image}"
    );
    let security = &pod["spec"]["securityContext"];
    assert_eq!(
        (
            security["runAsNonRoot"].as_bool(),
            security["runAsUser"].as_u64()
        ),
        (Some(true), Some(IMAGE_USER))
    );

    let port_names: Vec<&Value> = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["name"])
        .collect();
    for probe in ["livenessProbe", "readinessProbe"] {
        assert!(
            port_names.contains(&&container[probe]["httpGet"]["port"]),
            "{probe} port"
        );
    }
    // SIGTERM, then --shutdown-delay of serving, then up to the service's 5 s shutdown timeout.
    let delay: u64 = args(container)
        .windows(2)
        .find(|pair| pair[0] == "--shutdown-delay")
        .map(|pair| pair[1].parse().unwrap())
        .expect("no --shutdown-delay");
    let grace = pod["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap();
    assert!(grace > delay + 5, "killed before it drained: {grace} s");

    let service = find(&docs, "Service", "sluice-service");
    assert!(
        selects(&service["spec"]["selector"], labels),
        "the Service selects no replica"
    );
    assert!(
        port_names.contains(&&service["spec"]["ports"][0]["targetPort"]),
        "targetPort"
    );
    let budget = find(&docs, "PodDisruptionBudget", "sluice-service");
    assert!(
        selects(&budget["spec"]["selector"]["matchLabels"], labels),
        "the budget covers no replica"
    );
    assert_eq!(budget["spec"]["minAvailable"], 1);
}

#[test]
fn the_service_runs_without_a_token_only_behind_strict_mutual_tls_and_an_authorization_policy() {
    let docs = kustomize(&repo().join("deploy"));
    let pod = &find(&docs, "Deployment", "sluice-service")["spec"]["template"];
    let args = args(&pod["spec"]["containers"][0]);
    assert!(args.contains(&"--allow-unauthenticated"), "{args:?}");
    let mtls = find(&docs, "PeerAuthentication", "default");
    assert_eq!(mtls["spec"]["mtls"]["mode"], "STRICT");
    let policy = find(&docs, "AuthorizationPolicy", "sluice-service");
    assert_eq!(policy["spec"]["action"], "ALLOW");
    assert!(selects(
        &policy["spec"]["selector"]["matchLabels"],
        &pod["metadata"]["labels"]
    ));
    let rules = policy["spec"]["rules"].as_array().unwrap();
    assert!(
        rules
            .iter()
            .all(|rule| rule["from"][0]["source"]["principals"].is_array()),
        "a rule that lets in callers without a mesh identity: {rules:?}"
    );
}

#[test]
fn the_global_plugin_calls_the_service_deploy_defines_by_its_istio_cluster_name() {
    let docs = kustomize(&repo().join("deploy"));
    let service = find(&docs, "Service", "sluice-service");
    let host = format!(
        "sluice-service.{}.svc.cluster.local",
        service["metadata"]["namespace"].as_str().unwrap()
    );
    let port = service["spec"]["ports"][0]["port"].as_u64().unwrap();

    let global_docs = standalone("wasmplugin-global.yaml");
    let global = &global_docs[0]["spec"]["pluginConfig"]["global"];
    assert_eq!(global["cluster"], format!("outbound|{port}||{host}"));
    assert_eq!(global["authority"], host.as_str());
    assert_eq!(
        find(&docs, "DestinationRule", "sluice-service")["spec"]["host"],
        host.as_str()
    );

    // The AuthorizationPolicy lets the check and its settlements through (the filter's settle
    // path: the check's last segment as `settle`), and nothing else.
    let policy = &find(&docs, "AuthorizationPolicy", "sluice-service")["spec"];
    assert_eq!(policy["action"], "ALLOW");
    let operation = &policy["rules"][0]["to"][0]["operation"];
    assert_eq!(operation["methods"], json!(["POST"]));
    let check = global
        .get("path")
        .and_then(Value::as_str)
        .unwrap_or("/v1/check");
    let settle = format!("{}/settle", check.rsplit_once('/').unwrap().0);
    assert_eq!(operation["paths"], json!([check, settle]));
    assert_eq!(operation["ports"], json!([port.to_string()]));
    let namespace = global_docs[0]["metadata"]["namespace"].as_str().unwrap();
    assert!(
        admits_namespace(&policy["rules"][0], namespace),
        "no identity of namespace {namespace}, where the global WasmPlugin runs, may call the service"
    );
}

/// The rule admits a service account of `namespace`.
fn admits_namespace(rule: &Value, namespace: &str) -> bool {
    let principals = rule["from"][0]["source"]["principals"].as_array().unwrap();
    let prefix = format!("cluster.local/ns/{namespace}/sa/");
    principals
        .iter()
        .any(|p| p.as_str().unwrap().starts_with(&prefix))
}

#[test]
fn the_rls_component_renders_and_its_flags_port_volume_and_config_map_fit_together() {
    let docs = kustomize_with(&["rls"]);
    assert_valid(&docs, "deploy/ with components: [rls]");
    let (_, config_map) = rls_wiring(&docs);
    assert_eq!(config_map["metadata"]["namespace"], "sluice");
    let files = config_files(config_map);
    assert!(!files.is_empty(), "an empty ConfigMap");
    for (name, config) in files {
        // The service reads only these, one domain each.
        assert!(name.ends_with(".yaml") || name.ends_with(".yml"), "{name}");
        assert!(config["domain"].is_string(), "{name}: no domain");
    }
}

#[test]
fn the_rls_and_token_components_add_up_in_either_order() {
    for order in [["rls", "token"], ["token", "rls"]] {
        let docs = kustomize_with(&order);
        rls_wiring(&docs);
        let pod = &find(&docs, "Deployment", "sluice-service")["spec"]["template"]["spec"];
        flag(&args(&pod["containers"][0]), "--token-file");
        let mut volumes: Vec<&str> = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        volumes.sort_unstable();
        assert_eq!(volumes, ["rls-config", "token"], "{order:?}");
        assert_eq!(
            pod["containers"][0]["volumeMounts"]
                .as_array()
                .unwrap()
                .len(),
            2,
            "{order:?}"
        );
    }
}

const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

#[test]
fn only_with_the_rls_component_may_the_gateway_call_should_rate_limit_on_the_rls_port() {
    let policy_rules = |docs: &[Value]| {
        let policy = find(docs, "AuthorizationPolicy", "sluice-service");
        policy["spec"]["rules"].as_array().unwrap().clone()
    };
    let without = policy_rules(&kustomize(&repo().join("deploy")));
    let docs = kustomize_with(&["rls"]);
    let with = policy_rules(&docs);
    assert_eq!(
        with[..without.len()],
        without,
        "the rules for /v1/check changed"
    );
    let [rule] = &with[without.len()..] else {
        panic!("not one rule added: {with:?}")
    };
    let (port, _) = rls_wiring(&docs);
    let operation = &rule["to"][0]["operation"];
    assert_eq!(operation["paths"], json!([SHOULD_RATE_LIMIT]));
    assert_eq!(
        operation["methods"],
        json!(["POST"]),
        "gRPC calls are POSTs"
    );
    assert_eq!(operation["ports"], json!([port.to_string()]));
    let gateway = &standalone("ratelimit-envoyfilter.yaml")[0];
    let namespace = gateway["metadata"]["namespace"].as_str().unwrap();
    assert!(
        admits_namespace(rule, namespace),
        "no identity of namespace {namespace}, where the EnvoyFilter runs, may call the RLS"
    );
}

/// The EnvoyFilter's patch value for `apply_to` (HTTP_FILTER, HTTP_ROUTE).
fn gateway_patch(apply_to: &str) -> Value {
    let filter = &standalone("ratelimit-envoyfilter.yaml")[0];
    item(
        &filter["spec"]["configPatches"],
        "applyTo",
        &json!(apply_to),
    )["patch"]["value"]
        .clone()
}

#[test]
fn the_gateway_filter_asks_the_rls_port_by_its_istio_cluster_name_for_the_config_maps_domain() {
    let docs = kustomize_with(&["rls"]);
    let (port, config_map) = rls_wiring(&docs);
    let service = find(&docs, "Service", "sluice-service");
    let host = format!(
        "sluice-service.{}.svc.cluster.local",
        service["metadata"]["namespace"].as_str().unwrap()
    );
    let config = &gateway_patch("HTTP_FILTER")["typed_config"];
    let grpc = &config["rate_limit_service"]["grpc_service"]["envoy_grpc"];
    assert_eq!(grpc["cluster_name"], format!("outbound|{port}||{host}"));
    assert_eq!(grpc["authority"], host.as_str());
    assert_eq!(config["rate_limit_service"]["transport_api_version"], "V3");

    // Every descriptor the routes send has its entry in the domain's file.
    let limits = limits_of(config_map, &config["domain"]);
    let keys: Vec<&Value> = limits["descriptors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| &d["key"])
        .collect();
    for rate_limit in gateway_patch("HTTP_ROUTE")["route"]["rate_limits"]
        .as_array()
        .unwrap()
    {
        let [action] = rate_limit["actions"].as_array().unwrap().as_slice() else {
            panic!("one action per descriptor: {rate_limit}")
        };
        let key = match action.get("request_headers") {
            Some(header) => header["descriptor_key"].clone(),
            None => json!(action.as_object().unwrap().keys().next().unwrap()),
        };
        assert!(keys.contains(&&key), "no limit for {key} in {keys:?}");
    }
}

/// The gateway as far as the EnvoyFilter reaches into it: a listener with the EnvoyFilter's
/// filter before the router, one route with the EnvoyFilter's route patch merged in, and the
/// RLS's cluster under Istio's name, HTTP/2 as appProtocol grpc makes it. The route's upstream
/// is this Envoy's own admin endpoint, where GET /ready answers 200. `{filter}`, `{route}` and
/// `{rls_cluster}` are JSON, `{rls_port}` the service's.
const GATEWAY_BOOTSTRAP: &str = r#"
admin:
  address: { socket_address: { address: 127.0.0.1, port_value: {admin_port} } }
static_resources:
  listeners:
  - name: gateway
    address: { socket_address: { address: 127.0.0.1, port_value: {port} } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: gateway
          use_remote_address: true
          route_config:
            virtual_hosts:
            - name: gateway
              domains: ["*"]
              routes:
              - match: { prefix: / }
                route: {route}
          http_filters:
          - {filter}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: admin
    load_assignment:
      cluster_name: admin
      endpoints:
      - lb_endpoints:
        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: {admin_port} } } }
  - name: {rls_cluster}
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: { http2_protocol_options: {} }
    load_assignment:
      cluster_name: {rls_cluster}
      endpoints:
      - lb_endpoints:
        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: {rls_port} } } }
"#;

/// An argument of the Deployment's for a run on this machine: listening addresses on loopback
/// with a free port, the test's Redis, the test's directory for the mounted one.
fn on_this_machine(arg: &str, redis: &str, mount: &str, dir: &Path) -> String {
    let (name, value) = match arg.split_once('=') {
        Some((name, value)) => (Some(name), value),
        None => (None, arg),
    };
    let value = if value.starts_with("redis://") {
        redis.to_string()
    } else if value.starts_with("0.0.0.0:") {
        "127.0.0.1:0".to_string()
    } else {
        value.replace(mount, &dir.to_string_lossy())
    };
    match name {
        Some(name) => format!("{name}={value}"),
        None => value,
    }
}

/// The rendered Deployment's sluice-service, on this machine with a real Redis: the ConfigMap's
/// files in a directory of their own, every flag as the Deployment gives it.
fn start_rls_as_deployed(
    docs: &[Value],
    config_map: &Value,
    redis: &RedisServer,
    dir: &TempDir,
) -> Service {
    for (name, text) in config_map["data"].as_object().unwrap() {
        std::fs::write(dir.path().join(name), text.as_str().unwrap()).unwrap();
    }
    let container =
        &find(docs, "Deployment", "sluice-service")["spec"]["template"]["spec"]["containers"][0];
    let args = args(container);
    let mount = flag(&args, "--rls-config");
    let local: Vec<String> = args
        .iter()
        .map(|arg| on_this_machine(arg, &redis.url(), mount, dir.path()))
        .collect();
    let local: Vec<&str> = local.iter().map(String::as_str).collect();
    Service::start_rls(&local, &[])
}

#[test]
fn through_the_gateway_filter_a_user_gets_the_config_maps_burst_then_429() {
    let docs = kustomize_with(&["rls"]);
    let (_, config_map) = rls_wiring(&docs);
    let redis = RedisServer::start();
    let dir = TempDir::new("deploy-rls-config");
    let service = start_rls_as_deployed(&docs, config_map, &redis, &dir);
    let filter = gateway_patch("HTTP_FILTER");
    let mut route = gateway_patch("HTTP_ROUTE")["route"].clone();
    route["cluster"] = json!("admin");
    let cluster =
        &filter["typed_config"]["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"];
    let bootstrap = GATEWAY_BOOTSTRAP
        .replace("{filter}", &filter.to_string())
        .replace("{route}", &route.to_string())
        .replace("{rls_cluster}", &cluster.to_string())
        .replace("{rls_port}", &service.rls.unwrap().port().to_string());
    let envoy = EnvoyOptions::bootstrap(&bootstrap).start();

    let limits = limits_of(config_map, &filter["typed_config"]["domain"]);
    let user_limit = &item(&limits["descriptors"], "key", &json!("user_id"))["rate_limit"];
    // A token bucket refilled at 10 a minute: the burst's requests are done long before the
    // next token.
    let burst = usize::try_from(user_limit["burst"].as_u64().unwrap()).unwrap();
    assert!(
        burst <= 100,
        "the test spends the whole burst: keep it small"
    );
    let get = |user: Option<&str>| {
        let headers: Vec<(&str, &[u8])> = user
            .map(|u| vec![("x-user-id", u.as_bytes())])
            .unwrap_or_default();
        envoy.get("/ready", &headers).status
    };
    let alice: Vec<u16> = (0..=burst).map(|_| get(Some("alice"))).collect();
    let mut expected = vec![200; burst];
    expected.push(429);
    assert_eq!(alice, expected);
    assert_eq!(
        get(Some("bob")),
        200,
        "another user has a bucket of its own"
    );
    assert_eq!(get(None), 200, "no user: only the address is limited");

    // Each request counted once against the address's limit, each with a user against the user's.
    let metrics = sluice_testkit::http::get(service.addr, "/metrics").text();
    for (descriptor, hits) in [("remote_address", burst + 3), ("user_id", burst + 2)] {
        let line = format!(
            r#"sluice_service_rls_total_hits_total{{domain="edge",descriptor="{descriptor}"}} {hits}"#
        );
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line} in\n{metrics}"
        );
    }
}

/// The hand-written schemas are not vacuous: the classic mistakes in each kind are refused.
#[test]
fn the_crd_schemas_refuse_misspelt_fields_and_values() {
    let manifests = standalone_manifests();
    let docs: Vec<&Value> = manifests.iter().flat_map(|(_, docs)| docs).collect();
    let plugin = docs.iter().find(|d| d["kind"] == "WasmPlugin").unwrap();
    let policy = docs
        .iter()
        .find(|d| d["kind"] == "EnvoyExtensionPolicy")
        .unwrap();
    let envoy_filter = docs.iter().find(|d| d["kind"] == "EnvoyFilter").unwrap();
    type Edit = fn(&mut Value);
    let cases: [(&Value, &str, Edit); 8] = [
        (plugin, "Envoy's spelling of FAIL_CLOSE", |d| {
            d["spec"]["failStrategy"] = json!("FAIL_CLOSED")
        }),
        (plugin, "pluginConfig in lower case", |d| {
            let config = d["spec"]
                .as_object_mut()
                .unwrap()
                .remove("pluginConfig")
                .unwrap();
            d["spec"]["pluginconfig"] = config;
        }),
        (plugin, "a mode that does not exist", |d| {
            d["spec"]["match"][0]["mode"] = json!("INBOUND")
        }),
        (plugin, "no url", |d| {
            d["spec"].as_object_mut().unwrap().remove("url");
        }),
        (policy, "a code type that does not exist", |d| {
            d["spec"]["wasm"][0]["code"]["type"] = json!("OCI");
        }),
        (
            envoy_filter,
            "the other kinds' matchLabels as its selector",
            |d| {
                d["spec"]["workloadSelector"] = json!({"matchLabels": {"istio": "ingressgateway"}});
            },
        ),
        (envoy_filter, "an applyTo that does not exist", |d| {
            d["spec"]["configPatches"][0]["applyTo"] = json!("HTTP_FILTERS");
        }),
        (
            envoy_filter,
            "a listener and a route configuration in one match",
            |d| {
                d["spec"]["configPatches"][0]["match"]["routeConfiguration"] = json!({});
            },
        ),
    ];
    for (doc, what, edit) in cases {
        let mut broken = doc.clone();
        edit(&mut broken);
        assert!(!crd_violations(&broken).is_empty(), "{what} was accepted");
    }
    assert!(crd_violations(plugin).is_empty());
    assert!(crd_violations(envoy_filter).is_empty());
}
