//! The OCI images `make image` builds (`scripts/oci-image`), read back as a registry client
//! reads them: `oci-layout` and `index.json`, then every blob by its descriptor, its size and
//! sha256 checked, then the layers unpacked. The filter's images are built from the real
//! `sluice.wasm`; the service's from a small system binary (the layout is what is checked here;
//! `make image` packages the static musl build), which also shows that a binary needing a
//! dynamic loader is refused.
#![cfg(not(target_arch = "wasm32"))]
// A test binary: panicking is how it reports failure, helpers included.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use sha2::{Digest, Sha256};
use sluice_testkit::envoy::wasm_path;
use sluice_testkit::TempDir;

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const WASM_CONFIG: &str = "application/vnd.module.wasm.config.v1+json";
const WASM_LAYER: &str = "application/vnd.module.wasm.content.layer.v1+wasm";
const TAG: &str = "9.9.9-test";
/// Any small executable that needs a dynamic loader, as every Debian's coreutils build does.
const DYNAMIC_ELF: &str = "/bin/true";

fn oci_image(args: &[&str]) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/oci-image");
    Command::new(&script)
        .args(args)
        .env("SOURCE_DATE_EPOCH", "1700000000")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()))
}

/// Builds image `kind` from `input` into `<dir>/<name>` (and `<name>.tar`); returns the layout.
fn build(dir: &Path, kind: &str, input: &Path, extra: &[&str]) -> Layout {
    let out = dir.join(kind);
    let mut args = vec![
        kind,
        input.to_str().unwrap(),
        out.to_str().unwrap(),
        "--tag",
        TAG,
    ];
    args.extend_from_slice(extra);
    let result = oci_image(&args);
    assert!(
        result.status.success(),
        "oci-image {kind} failed:\n{}",
        String::from_utf8_lossy(&result.stderr)
    );
    Layout(out)
}

fn sha256_digest(data: &[u8]) -> String {
    let hex: String = Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

fn json(data: &[u8]) -> Value {
    serde_json::from_slice(data).unwrap_or_else(|e| panic!("not JSON ({e}): {data:?}"))
}

/// An OCI image layout on disk.
struct Layout(PathBuf);

impl Layout {
    /// The blob a descriptor names, after checking its size and digest.
    fn blob(&self, descriptor: &Value) -> Vec<u8> {
        let digest = descriptor["digest"]
            .as_str()
            .expect("descriptor without digest");
        let hex = digest.strip_prefix("sha256:").expect("not a sha256 digest");
        let data = std::fs::read(self.0.join("blobs/sha256").join(hex)).unwrap();
        assert_eq!(
            sha256_digest(&data),
            digest,
            "blob content does not match its digest"
        );
        assert_eq!(
            descriptor["size"].as_u64(),
            Some(data.len() as u64),
            "{digest}: size"
        );
        data
    }

    /// The only manifest of the index, with its descriptor; checks the layout's framing.
    fn manifest(&self) -> (Value, Value) {
        let layout = json(&std::fs::read(self.0.join("oci-layout")).unwrap());
        assert_eq!(layout["imageLayoutVersion"], "1.0.0");
        let index = json(&std::fs::read(self.0.join("index.json")).unwrap());
        assert_eq!(index["schemaVersion"], 2);
        assert_eq!(
            index["mediaType"],
            "application/vnd.oci.image.index.v1+json"
        );
        let manifests = index["manifests"].as_array().unwrap();
        assert_eq!(manifests.len(), 1, "one image per layout");
        let descriptor = manifests[0].clone();
        assert_eq!(descriptor["mediaType"], OCI_MANIFEST);
        assert_eq!(
            descriptor["annotations"]["org.opencontainers.image.ref.name"],
            TAG
        );
        let manifest = json(&self.blob(&descriptor));
        assert_eq!(manifest["schemaVersion"], 2);
        assert_eq!(manifest["mediaType"], OCI_MANIFEST);
        (manifest, descriptor)
    }

    /// Every file under the layout, by its path relative to it.
    fn files(&self) -> BTreeMap<String, Vec<u8>> {
        let mut files = BTreeMap::new();
        for sub in ["oci-layout", "index.json"] {
            files.insert(sub.to_string(), std::fs::read(self.0.join(sub)).unwrap());
        }
        for entry in std::fs::read_dir(self.0.join("blobs/sha256")).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap();
            files.insert(
                format!("blobs/sha256/{name}"),
                std::fs::read(&path).unwrap(),
            );
        }
        files
    }

    fn tarball(&self) -> Vec<u8> {
        std::fs::read(self.0.with_extension("tar")).unwrap()
    }
}

/// One entry of a tar archive.
#[derive(Debug)]
struct Entry {
    path: String,
    mode: u32,
    uid: u64,
    /// `None` for a directory.
    data: Option<Vec<u8>>,
}

fn untar(archive: &[u8]) -> Vec<Entry> {
    let mut entries = Vec::new();
    for entry in tar::Archive::new(archive).entries().unwrap() {
        let mut entry = entry.unwrap();
        let header = entry.header().clone();
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        let data = if header.entry_type().is_dir() {
            None
        } else {
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            Some(data)
        };
        let (mode, uid) = (header.mode().unwrap(), header.uid().unwrap());
        entries.push(Entry {
            path,
            mode,
            uid,
            data,
        });
    }
    entries
}

fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .read_to_end(&mut out)
        .expect("layer is not gzip");
    out
}

/// The image's config and the uncompressed tar of its single gzip layer, checked against the
/// config's diff id.
fn single_layer_image(layout: &Layout) -> (Value, Value, Vec<u8>) {
    let (manifest, _) = layout.manifest();
    assert_eq!(manifest["config"]["mediaType"], OCI_CONFIG);
    let config = json(&layout.blob(&manifest["config"]));
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "one layer");
    assert_eq!(layers[0]["mediaType"], OCI_LAYER_GZIP);
    let tar = gunzip(&layout.blob(&layers[0]));
    assert_eq!(config["rootfs"]["type"], "layers");
    assert_eq!(
        config["rootfs"]["diff_ids"],
        serde_json::json!([sha256_digest(&tar)]),
        "the config's diff id is not the digest of the uncompressed layer"
    );
    (manifest, config, tar)
}

#[test]
fn the_filter_image_has_one_gzip_layer_holding_plugin_wasm_byte_for_byte() {
    let scratch = TempDir::new("images-wasm");
    let wasm = wasm_path();
    let layout = build(scratch.path(), "wasm", &wasm, &[]);
    let (manifest, config, tar) = single_layer_image(&layout);

    assert_eq!(
        manifest["annotations"]["module.wasm.image/variant"],
        "compat"
    );
    assert_eq!(
        (config["architecture"].as_str(), config["os"].as_str()),
        (Some("wasm"), Some("wasip1"))
    );
    let entries = untar(&tar);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].path, "plugin.wasm");
    assert!(
        entries[0].data.as_deref() == Some(std::fs::read(&wasm).unwrap().as_slice()),
        "plugin.wasm differs from {}",
        wasm.display()
    );
}

#[test]
fn the_wasm_artifact_has_its_runtime_config_and_the_raw_module_as_two_layers() {
    let scratch = TempDir::new("images-artifact");
    let wasm = wasm_path();
    let layout = build(scratch.path(), "wasm-artifact", &wasm, &[]);
    let (manifest, _) = layout.manifest();

    assert_eq!(manifest["config"]["mediaType"], WASM_CONFIG);
    let runtime = json(&layout.blob(&manifest["config"]));
    assert_eq!(runtime["type"], "envoy_proxy");
    assert_eq!(runtime["config"]["root_ids"], serde_json::json!(["sluice"]));
    // Istio's fetcher takes this form only with exactly two layers, one of them the module.
    let layers = manifest["layers"].as_array().unwrap();
    let types: Vec<_> = layers
        .iter()
        .map(|l| l["mediaType"].as_str().unwrap())
        .collect();
    assert_eq!(types, [WASM_CONFIG, WASM_LAYER]);
    assert_eq!(json(&layout.blob(&layers[0])), runtime);
    assert!(
        layout.blob(&layers[1]) == std::fs::read(&wasm).unwrap(),
        "the module differs"
    );
}

#[test]
fn the_service_image_holds_only_the_binary_and_runs_it_as_a_non_root_user() {
    let scratch = TempDir::new("images-service");
    let binary = Path::new(DYNAMIC_ELF);
    let layout = build(scratch.path(), "service", binary, &["--allow-dynamic"]);
    let (_, config, tar) = single_layer_image(&layout);

    assert_eq!(
        (config["architecture"].as_str(), config["os"].as_str()),
        (Some("amd64"), Some("linux"))
    );
    let run = &config["config"];
    assert_eq!(run["User"], "65532:65532");
    assert_eq!(
        run["Entrypoint"],
        serde_json::json!(["/usr/local/bin/sluice-service"])
    );
    assert_eq!(
        run["Env"],
        serde_json::json!(["SLUICE_LISTEN=0.0.0.0:8080"])
    );
    assert!(run["ExposedPorts"]["8080/tcp"].is_object(), "{run}");

    let entries = untar(&tar);
    let paths: Vec<_> = entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "usr/",
            "usr/local/",
            "usr/local/bin/",
            "usr/local/bin/sluice-service"
        ]
    );
    let file = &entries[3];
    assert_eq!(
        (file.mode, file.uid),
        (0o755, 0),
        "owned by root, executable by the user"
    );
    assert!(
        file.data.as_deref() == Some(std::fs::read(binary).unwrap().as_slice()),
        "binary differs"
    );
}

#[test]
fn a_binary_that_needs_a_dynamic_loader_is_refused_for_the_service_image() {
    let scratch = TempDir::new("images-dynamic");
    let binary = Path::new(DYNAMIC_ELF);
    let out = scratch.path().join("service");
    let result = oci_image(&["service", binary.to_str().unwrap(), out.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(!result.status.success(), "a dynamic binary was packaged");
    assert!(stderr.contains("x86_64-unknown-linux-musl"), "{stderr}");
    assert!(!out.exists(), "a layout was left behind");
}

#[test]
fn each_tarball_is_its_layout_and_also_a_docker_archive_where_docker_can_read_one() {
    let scratch = TempDir::new("images-tarballs");
    let wasm = wasm_path();
    for (kind, docker) in [("wasm", true), ("wasm-artifact", false)] {
        let layout = build(scratch.path(), kind, &wasm, &[]);
        let mut files: BTreeMap<String, Vec<u8>> = untar(&layout.tarball())
            .into_iter()
            .filter_map(|e| Some((e.path, e.data?)))
            .collect();
        let manifest = files.remove("manifest.json");
        assert_eq!(
            files,
            layout.files(),
            "{kind}: the tarball is not its layout"
        );
        assert_eq!(manifest.is_some(), docker, "{kind}: Docker's manifest.json");
        if let Some(manifest) = manifest {
            let image = &json(&manifest)[0];
            assert_eq!(
                image["RepoTags"],
                serde_json::json!([format!("sluice-wasm:{TAG}")])
            );
            let mut named = vec![image["Config"].as_str().unwrap()];
            named.extend(
                image["Layers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|l| l.as_str().unwrap()),
            );
            for path in named {
                assert!(
                    files.contains_key(path),
                    "manifest.json names {path}, not in the tarball"
                );
            }
        }
    }
}

#[test]
fn the_same_inputs_give_the_same_image_digests() {
    let scratch = TempDir::new("images-reproducible");
    let wasm = wasm_path();
    let first = build(&scratch.path().join("a"), "wasm", &wasm, &[]);
    let second = build(&scratch.path().join("b"), "wasm", &wasm, &[]);
    assert_eq!(first.manifest().1, second.manifest().1);
    assert!(first.tarball() == second.tarball(), "the tarballs differ");
}
