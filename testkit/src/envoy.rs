//! A real Envoy with the sluice wasm filter, on free loopback ports.
//!
//! ```ignore
//! let envoy = Envoy::start(r#"{"policies":[...]}"#);
//! let r = envoy.get("/api/x", &[("x-user-id", b"alice")]);
//! assert_eq!(r.status, 200);
//! ```
//!
//! Each `Envoy` gets its own temp dir (bootstrap.yaml, envoy.log); dropping it stops the
//! process, also when a test panics. A failing test prints the tail of Envoy's log and keeps
//! the temp dir.
//!
//! The filter is `target/wasm32-wasip1/release/sluice.wasm` (`make build`), or `$SLUICE_WASM`
//! when set. The Envoy binary is `$ENVOY`, else whatever `scripts/find-envoy` prints.

use crate::http::{http_request, Connection, Response};
use crate::{free_port, repo_root, rss_kib, send_signal, target_dir, TempDir, SIGTERM};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

/// Envoy puts the counters a wasm module defines under this prefix: the filter's
/// `sluice.cas_retries` is `wasmcustom.sluice.cas_retries` in /stats.
pub const WASM_STAT_PREFIX: &str = "wasmcustom.";

const READY_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
const COUNTER_TIMEOUT: Duration = Duration::from_secs(5);
/// Starting again with new ports when another process took ours in between.
const START_ATTEMPTS: u32 = 3;
/// Where `lds_from_file` keeps the listener, under the Envoy's temp dir: the watched directory.
const LDS_DIR: &str = "lds";
const LDS_FILE: &str = "listener.yaml";
const LDS_UPDATE_TIMEOUT: Duration = Duration::from_secs(10);
/// The file access log, under the Envoy's temp dir.
const ACCESS_LOG: &str = "access.log";
/// Where `ecds_from_file` keeps the filter's configuration: the watched directory and its file.
const ECDS_DIR: &str = "ecds";
const ECDS_FILE: &str = "sluice.yaml";
/// The filter's name in the listener and in its ECDS resource (Istio names it after the plugin).
pub const ECDS_FILTER: &str = "sluice";

/// How to start Envoy. `Envoy::start(json)` is `EnvoyOptions::new(json).start()`.
#[derive(Clone, Debug)]
pub struct EnvoyOptions {
    /// The plugin configuration JSON; `None` leaves the wasm filter out.
    pub plugin_json: Option<String>,
    /// HCM `use_remote_address` (default true: the client is the TCP peer).
    pub use_remote_address: bool,
    /// HCM `xff_num_trusted_hops` (default 0). With 1 and `use_remote_address`,
    /// a request's `x-forwarded-for: 10.0.0.7` makes its client IP 10.0.0.7.
    pub xff_num_trusted_hops: u32,
    /// Worker threads, each with its own wasm VM (default 2).
    pub concurrency: u32,
    /// The node id (`--service-node`; default none).
    pub node_id: Option<String>,
    /// Endpoints of the cluster `sluice_service` (global policies call it); `None` leaves the
    /// cluster out, an empty list makes a cluster with no endpoints.
    pub service: Option<Vec<SocketAddr>>,
    /// `(header, namespace, key)` rules: a header_to_metadata filter before sluice copies each
    /// header into dynamic metadata (and removes it), as a trusted authentication filter would.
    pub header_to_metadata: Vec<(String, String, String)>,
    /// Extra HCM fields, `(name, YAML flow value)`: `("max_request_headers_kb", "96")`.
    pub hcm_options: Vec<(String, String)>,
    /// The listener from a file-based LDS resource (a watched directory) instead of the static
    /// bootstrap, so that `Envoy::update_plugin` can change it while Envoy runs.
    pub lds_from_file: bool,
    /// A whole bootstrap instead of the generated one (`EnvoyOptions::bootstrap`).
    pub bootstrap: Option<String>,
    /// Routes before `api` and `default`: `(name, path prefix, fields)`, each field a route
    /// field in YAML flow style (`metadata: {...}`, `typed_per_filter_config: {...}`).
    pub routes: Vec<(String, String, Vec<String>)>,
    /// The sluice filter from a file-based extension config discovery (ECDS) resource, as Istio
    /// delivers wasm filters, instead of inline: `Envoy::update_plugin` changes it while Envoy
    /// runs, `Envoy::update_extension` replaces it with any HTTP filter config.
    pub ecds_from_file: bool,
    /// The ECDS `default_config`, a typed config in YAML flow style: what the filter runs until
    /// a configuration is accepted. Without one the filter has no configuration until then.
    pub ecds_default: Option<String>,
    /// The wasm plugin's `failure_policy` (`FAIL_OPEN`, ...; Istio's `failStrategy` sets it).
    pub wasm_failure_policy: Option<String>,
    /// The wasm plugin's `allow_on_headers_stop_iteration`: on (the documented setup), Envoy
    /// holds a request's headers while sluice reads its body.
    pub hold_headers: bool,
    /// The listener's `metadata` (YAML flow), e.g. the admin path's listener name.
    pub listener_metadata: Option<String>,
    /// Environment variables set for the Envoy process and handed to the wasm VM
    /// (`vm_config.environment_variables.host_env_keys`), as an operator passes secrets.
    pub vm_env: Vec<(String, String)>,
    /// The bootstrap's `stats_config`, in YAML flow style (JSON will do).
    pub stats_config: Option<String>,
    /// The `log_format` (YAML flow style) of a file access log, `Envoy::access_log` reads it.
    pub access_log_format: Option<String>,
    /// A gRPC server (plaintext HTTP/2) that gRPC requests are routed to, by the route `grpc`.
    pub grpc_upstream: Option<SocketAddr>,
    /// The endpoint of the cluster `rls` (HTTP/2), for global policies that ask an RLS.
    pub rls: Option<SocketAddr>,
    /// An HTTP/1.1 server (cluster `upstream`) that the routes answering 200 "ok" go to instead.
    pub upstream: Option<SocketAddr>,
    /// The `timeout` of the routes to `upstream` (Envoy's default: 15 s, to the response's end).
    pub route_timeout: Option<Duration>,
    /// The `idle_timeout` of the routes to `upstream` (Envoy's default: the HCM's
    /// `stream_idle_timeout`, 5 min).
    pub route_idle_timeout: Option<Duration>,
}

impl EnvoyOptions {
    pub fn new(plugin_json: &str) -> Self {
        EnvoyOptions {
            plugin_json: Some(plugin_json.to_string()),
            use_remote_address: true,
            xff_num_trusted_hops: 0,
            concurrency: 2,
            node_id: None,
            service: None,
            header_to_metadata: Vec::new(),
            hcm_options: Vec::new(),
            lds_from_file: false,
            bootstrap: None,
            routes: Vec::new(),
            ecds_from_file: false,
            ecds_default: None,
            wasm_failure_policy: None,
            hold_headers: true,
            vm_env: Vec::new(),
            stats_config: None,
            access_log_format: None,
            grpc_upstream: None,
            rls: None,
            upstream: None,
            route_timeout: None,
            route_idle_timeout: None,
            listener_metadata: None,
        }
    }

    /// Envoy from a whole bootstrap YAML, for configurations the generated one does not cover
    /// (Envoy's native filters). The harness replaces `{port}` (the listener `Envoy::port`
    /// names), `{admin_port}` and `{backend_port}` (a third free port, e.g. for a listener that
    /// serves as the upstream) with free ports of its choosing.
    pub fn bootstrap(template: &str) -> Self {
        EnvoyOptions {
            bootstrap: Some(template.to_string()),
            ..EnvoyOptions::without_filter()
        }
    }

    /// Envoy with only the router: for checking the harness itself.
    pub fn without_filter() -> Self {
        EnvoyOptions {
            plugin_json: None,
            ..EnvoyOptions::new("")
        }
    }

    /// Gives the listener this `metadata` (YAML flow): `{ filter_metadata: { sluice: { listener:
    /// ops } } }` names it for the filter's admin path.
    pub fn listener_metadata(mut self, yaml: &str) -> Self {
        self.listener_metadata = Some(yaml.into());
        self
    }

    /// Sets `name` in Envoy's environment and lets the wasm VM read it. Each call adds one.
    pub fn vm_env(mut self, name: &str, value: &str) -> Self {
        self.vm_env.push((name.into(), value.into()));
        self
    }

    pub fn use_remote_address(mut self, on: bool) -> Self {
        self.use_remote_address = on;
        self
    }

    pub fn xff_num_trusted_hops(mut self, hops: u32) -> Self {
        self.xff_num_trusted_hops = hops;
        self
    }

    pub fn concurrency(mut self, workers: u32) -> Self {
        self.concurrency = workers;
        self
    }

    pub fn node_id(mut self, id: &str) -> Self {
        self.node_id = Some(id.to_string());
        self
    }

    /// Puts `header`'s value into dynamic metadata `namespace`/`key` before sluice runs (and
    /// removes the header). Each call adds one rule.
    pub fn header_to_metadata(mut self, header: &str, namespace: &str, key: &str) -> Self {
        self.header_to_metadata
            .push((header.into(), namespace.into(), key.into()));
        self
    }

    /// Sets an HCM field, the value in YAML flow style:
    /// `.hcm_option("common_http_protocol_options", "{ max_headers_count: 500 }")`.
    pub fn hcm_option(mut self, name: &str, value: &str) -> Self {
        self.hcm_options.push((name.into(), value.into()));
        self
    }

    /// Adds a route named `name` for paths under `prefix`, answering 200 "ok" like the others,
    /// with extra route fields in YAML flow style:
    /// `.route("checkout", "/checkout/", &["metadata: { filter_metadata: { sluice: { disabled: true } } }"])`.
    /// Routes are matched in the order added, before `api` and `default`.
    pub fn route(mut self, name: &str, prefix: &str, fields: &[&str]) -> Self {
        let fields = fields.iter().map(|f| f.to_string()).collect();
        self.routes.push((name.into(), prefix.into(), fields));
        self
    }

    /// Serves the listener from a file-based dynamic resource (LDS): see `Envoy::update_plugin`.
    pub fn lds_from_file(mut self) -> Self {
        self.lds_from_file = true;
        self
    }

    /// Serves the sluice filter's configuration from a file-based ECDS resource: see
    /// `Envoy::update_plugin` and `Envoy::update_extension`.
    pub fn ecds_from_file(mut self) -> Self {
        self.ecds_from_file = true;
        self
    }

    /// The ECDS `default_config` (YAML flow style, with its `"@type"`).
    pub fn ecds_default(mut self, typed_config: &str) -> Self {
        self.ecds_default = Some(typed_config.into());
        self
    }

    /// The wasm plugin's `failure_policy`: `FAIL_CLOSED` (Envoy's default), `FAIL_OPEN`, ...
    pub fn wasm_failure_policy(mut self, policy: &str) -> Self {
        self.wasm_failure_policy = Some(policy.into());
        self
    }

    /// Sets the bootstrap's `stats_config` (YAML flow style, e.g. JSON): its `stats_tags` make
    /// the labels of `/stats/prometheus`.
    pub fn stats_config(mut self, yaml: &str) -> Self {
        self.stats_config = Some(yaml.into());
        self
    }

    /// Logs each request to a file with this `log_format` (YAML flow style, e.g.
    /// `{ text_format_source: { inline_string: "%RESPONSE_CODE%\n" } }`): see `Envoy::access_log`.
    pub fn access_log(mut self, log_format: &str) -> Self {
        self.access_log_format = Some(log_format.into());
        self
    }

    /// Routes gRPC requests (route `grpc`, before the others) to this server, over HTTP/2.
    pub fn grpc_upstream(mut self, server: SocketAddr) -> Self {
        self.grpc_upstream = Some(server);
        self
    }

    /// Sends what the routes `api`, `default` and the test's own (`route`) would answer with
    /// 200 "ok" to this HTTP/1.1 server instead: the cluster `upstream`, with HTTP/1.1 trailers
    /// enabled (the listener forwards them to the client only with
    /// `.hcm_option("http_protocol_options", "{ enable_trailers: true }")`).
    pub fn upstream(mut self, server: SocketAddr) -> Self {
        self.upstream = Some(server);
        self
    }

    /// The `timeout` of the routes to `upstream`: the time from the request's end to the
    /// response's, streamed or not; zero turns it off. Envoy's default is 15 s.
    pub fn route_timeout(mut self, timeout: Duration) -> Self {
        self.route_timeout = Some(timeout);
        self
    }

    /// The `idle_timeout` of the routes to `upstream`: the longest wait for a byte of a stream,
    /// either way; zero turns it off. Envoy's default is the HCM's `stream_idle_timeout`, 5 min.
    pub fn route_idle_timeout(mut self, timeout: Duration) -> Self {
        self.route_idle_timeout = Some(timeout);
        self
    }

    /// Adds the cluster `rls`: plaintext HTTP/2 to a Rate Limit Service.
    pub fn rls(mut self, server: SocketAddr) -> Self {
        self.rls = Some(server);
        self
    }

    /// Adds the cluster `sluice_service` with these endpoints (none: a cluster that has none).
    pub fn service(mut self, endpoints: &[SocketAddr]) -> Self {
        self.service = Some(endpoints.to_vec());
        self
    }

    /// Starts Envoy and waits until it is ready; panics with Envoy's log if it is not.
    pub fn start(self) -> Envoy {
        match self.try_start() {
            Ok(envoy) => envoy,
            Err(log) => panic!("Envoy did not start; its log:\n{log}"),
        }
    }

    /// Starts Envoy and waits until it is ready. `Err` carries Envoy's log when
    /// it exits or is not ready within 30 s: the way to test rejected configs.
    pub fn try_start(self) -> Result<Envoy, String> {
        let mut attempt = 1;
        loop {
            match Envoy::launch(&self) {
                Err(log) if attempt < START_ATTEMPTS && log.contains("Address already in use") => {
                    attempt += 1;
                }
                other => return other,
            }
        }
    }
}

/// A running Envoy. Dropping it stops the process.
pub struct Envoy {
    child: Child,
    dir: TempDir,
    opts: EnvoyOptions,
    /// The HTTP listener, on 127.0.0.1.
    pub port: u16,
    /// The admin interface, on 127.0.0.1.
    pub admin_port: u16,
}

impl Envoy {
    /// Envoy with the sluice filter configured by `plugin_json` and the defaults
    /// of `EnvoyOptions`. Panics with Envoy's log if it does not become ready.
    pub fn start(plugin_json: &str) -> Envoy {
        EnvoyOptions::new(plugin_json).start()
    }

    /// Like `start`, but returns Envoy's log instead of panicking: for
    /// configurations that must be refused.
    pub fn try_start(plugin_json: &str) -> Result<Envoy, String> {
        EnvoyOptions::new(plugin_json).try_start()
    }

    /// Starting point for non-default options: `Envoy::options(json).concurrency(1).start()`.
    pub fn options(plugin_json: &str) -> EnvoyOptions {
        EnvoyOptions::new(plugin_json)
    }

    fn launch(opts: &EnvoyOptions) -> Result<Envoy, String> {
        let dir = TempDir::new("envoy");
        let port = free_port();
        let admin_port = free_port();
        let bootstrap = dir.path().join("bootstrap.yaml");
        let log_path = dir.path().join("envoy.log");
        let yaml = match &opts.bootstrap {
            Some(template) => template
                .replace("{port}", &port.to_string())
                .replace("{admin_port}", &admin_port.to_string())
                .replace("{backend_port}", &free_port().to_string()),
            None => bootstrap_yaml(opts, dir.path(), port, admin_port),
        };
        std::fs::write(&bootstrap, yaml)
            .unwrap_or_else(|e| panic!("writing {}: {e}", bootstrap.display()));
        if opts.lds_from_file {
            std::fs::create_dir_all(dir.path().join(LDS_DIR)).expect("creating the LDS directory");
            write_lds(dir.path(), &lds_yaml(opts, dir.path(), port));
        }
        if opts.ecds_from_file {
            std::fs::create_dir_all(dir.path().join(ECDS_DIR))
                .expect("creating the ECDS directory");
            let typed_config = wasm_typed_config(opts).expect("ecds_from_file needs a plugin");
            write_watched(dir.path(), ECDS_DIR, ECDS_FILE, &ecds_yaml(&typed_config));
        }
        let log_file = std::fs::File::create(&log_path)
            .unwrap_or_else(|e| panic!("creating {}: {e}", log_path.display()));
        let log_file2 = log_file.try_clone().expect("dup log file handle");

        let child = Command::new(envoy_binary())
            .arg("-c")
            .arg(&bootstrap)
            .args(["--concurrency", &opts.concurrency.to_string()])
            .args(opts.node_id.iter().flat_map(|id| ["--service-node", id]))
            // No shared memory or sockets of hot restart: nothing is left over
            // when a test process dies, and Envoys never collide on a base id.
            .args(["--disable-hot-restart", "--use-dynamic-base-id"])
            // Access log lines reach their file within 100 ms, not Envoy's default 10 s.
            .args(["--file-flush-interval-msec", "100"])
            .args(["-l", "info"])
            .envs(opts.vm_env.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_file2)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", envoy_binary().display()));

        let mut envoy = Envoy {
            child,
            dir,
            opts: opts.clone(),
            port,
            admin_port,
        };
        envoy.wait_ready()?;
        Ok(envoy)
    }

    /// Polls the admin `/ready` until it says LIVE. On failure the process is
    /// stopped and its log returned.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("{}\n[harness] Envoy exited: {status}", self.log()));
            }
            if let Ok(r) = http_request(self.admin_addr(), "GET", "/ready", &[]) {
                if r.status == 200 && r.text().trim() == "LIVE" {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                self.stop();
                return Err(format!(
                    "{}\n[harness] Envoy was not LIVE within {READY_TIMEOUT:?}",
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    pub fn admin_addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.admin_port))
    }

    /// A connection to the listener for one request sent later (`Connection::request`).
    pub fn connect(&self) -> Connection {
        Connection::open(self.addr()).unwrap_or_else(|e| panic!("{e}"))
    }

    /// GET `path` on the listener with extra request headers (raw byte values).
    pub fn get(&self, path: &str, headers: &[(&str, &[u8])]) -> Response {
        self.request("GET", path, headers)
    }

    /// Any method. A `host` header in `headers` replaces the default one.
    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &[u8])]) -> Response {
        http_request(self.addr(), method, path, headers).unwrap_or_else(|e| {
            panic!(
                "{method} {path}: {e}\nEnvoy log tail:\n{}",
                self.log_tail(40)
            )
        })
    }

    /// Envoy's resident memory (VmRSS), in KiB.
    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.child.id())
    }

    /// The address of the listener `name`, from Envoy's admin `/listeners`.
    pub fn listener_addr(&self, name: &str) -> SocketAddr {
        let listing = self.admin_get("/listeners").text();
        let prefix = format!("{name}::");
        let line = (listing.lines())
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("no listener {name}: {listing}"));
        (line.trim().parse()).unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    /// GET on the admin interface.
    pub fn admin_get(&self, path: &str) -> Response {
        http_request(self.admin_addr(), "GET", path, &[])
            .unwrap_or_else(|e| panic!("admin GET {path}: {e}"))
    }

    /// Counters and gauges from `/stats?filter=REGEX`, by full name.
    pub fn admin_stats(&self, filter: &str) -> HashMap<String, u64> {
        let r = self.admin_get(&format!("/stats?filter={}", percent_encode(filter)));
        assert_eq!(r.status, 200, "/stats: {}", r.text());
        r.text()
            .lines()
            .filter_map(|line| {
                let (name, value) = line.split_once(": ")?;
                Some((name.to_string(), value.trim().parse().ok()?))
            })
            .collect()
    }

    /// A counter the filter defines, by the name the filter gives it (`sluice.cas_retries`,
    /// `sluice::output::metrics::requests_counter(..)`); `None` if Envoy does not have it.
    pub fn wasm_counter(&self, name: &str) -> Option<u64> {
        let full = format!("{WASM_STAT_PREFIX}{name}");
        let regex = format!("^{}$", full.replace('.', "\\."));
        self.admin_stats(&regex).get(&full).copied()
    }

    /// Polls `wasm_counter(name)` until it equals `expected` (at most 5 s) and
    /// returns the last value seen (0 while absent). The filter may batch its
    /// counters and flush them on a timer, so they can lag the responses.
    pub fn wait_for_wasm_counter(&self, name: &str, expected: u64) -> u64 {
        let deadline = Instant::now() + COUNTER_TIMEOUT;
        loop {
            let value = self.wasm_counter(name).unwrap_or(0);
            if value == expected || Instant::now() > deadline {
                return value;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Replaces the plugin configuration while Envoy runs, in the file-based xDS resource that
    /// carries it (`EnvoyOptions::ecds_from_file`, else `lds_from_file`), as Envoy wants such
    /// files changed: a new file renamed over the old one. Returns once Envoy has taken the
    /// update (its `update_success` went up), or `Err` with Envoy's log tail when it rejected it
    /// (`update_rejected`) or did neither within 10 s.
    pub fn update_plugin(&mut self, plugin_json: &str) -> Result<(), String> {
        self.opts.plugin_json = Some(plugin_json.to_string());
        if self.opts.ecds_from_file {
            let typed_config = wasm_typed_config(&self.opts).unwrap_or_default();
            return self.update_extension(&typed_config);
        }
        assert!(
            self.opts.lds_from_file,
            "update_plugin needs lds_from_file() or ecds_from_file()"
        );
        let yaml = lds_yaml(&self.opts, self.dir.path(), self.port);
        self.apply_update("listener_manager.lds", || {
            write_lds(self.dir.path(), &yaml);
        })
    }

    /// Replaces the ECDS resource of the sluice filter with any HTTP filter's typed config (YAML
    /// flow style), as Istio's agent does when it cannot fetch a module; see `update_plugin`.
    pub fn update_extension(&mut self, typed_config: &str) -> Result<(), String> {
        assert!(
            self.opts.ecds_from_file,
            "update_extension needs ecds_from_file()"
        );
        let yaml = ecds_yaml(typed_config);
        let stats = format!("extension_config_discovery.http_filter.{ECDS_FILTER}");
        self.apply_update(&stats, || {
            write_watched(self.dir.path(), ECDS_DIR, ECDS_FILE, &yaml);
        })
    }

    /// Counters `<prefix>.update_success` and `.update_rejected` around `write`.
    fn apply_update(&self, prefix: &str, write: impl FnOnce()) -> Result<(), String> {
        let counter = |name: &str| {
            let full = format!("{prefix}.{name}");
            let stats = self.admin_stats(&format!("^{}$", full.replace('.', "\\.")));
            stats.get(&full).copied().unwrap_or(0)
        };
        let (success, rejected) = (counter("update_success"), counter("update_rejected"));
        write();
        let deadline = Instant::now() + LDS_UPDATE_TIMEOUT;
        loop {
            if counter("update_success") > success {
                return Ok(());
            }
            if counter("update_rejected") > rejected {
                return Err(format!("{prefix}: update rejected:\n{}", self.log_tail(20)));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{prefix}: update not taken within {LDS_UPDATE_TIMEOUT:?}:\n{}",
                    self.log_tail(20)
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `/stats/prometheus`, as a scraper reads it.
    pub fn prometheus(&self) -> String {
        let r = self.admin_get("/stats/prometheus");
        assert_eq!(r.status, 200, "/stats/prometheus: {}", r.text());
        r.text()
    }

    /// The lines of the file access log (`EnvoyOptions::access_log`) once it has `n` (Envoy
    /// writes them from a buffer, flushed every 100 ms here), or all it has after 5 s.
    pub fn access_log(&self, n: usize) -> Vec<String> {
        assert!(
            self.opts.access_log_format.is_some(),
            "access_log needs EnvoyOptions::access_log"
        );
        let deadline = Instant::now() + COUNTER_TIMEOUT;
        loop {
            let path = self.dir.path().join(ACCESS_LOG);
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let lines: Vec<String> = text.lines().map(String::from).collect();
            if lines.len() >= n || Instant::now() > deadline {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Everything Envoy has logged so far.
    pub fn log(&self) -> String {
        let bytes = std::fs::read(self.dir.path().join("envoy.log")).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The temp dir with bootstrap.yaml and envoy.log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// SIGTERM, then SIGKILL after a grace period; always reaps the child.
    fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        send_sigterm(self.child.id());
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Envoy {
    /// Kills the process with SIGKILL, as a crash would: nothing of it is shut down, no request
    /// it holds ends, nothing it owes anyone is sent.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!(
                "--- Envoy log tail ({}/envoy.log) ---\n{}\n---",
                self.dir.path().display(),
                self.log_tail(60)
            );
        }
    }
}

/// std only offers SIGKILL (`Child::kill`); SIGTERM lets Envoy shut down cleanly.
fn send_sigterm(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        send_signal(pid, SIGTERM);
    }
}

fn percent_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `$ENVOY`, else the path `scripts/find-envoy` prints (resolved once per test binary).
pub fn envoy_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            if let Some(path) = std::env::var_os("ENVOY").filter(|p| !p.is_empty()) {
                return PathBuf::from(path);
            }
            let script = repo_root().join("scripts/find-envoy");
            let out = Command::new(&script)
                .stdin(Stdio::null())
                .stderr(Stdio::inherit())
                .output()
                .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
            assert!(
                out.status.success(),
                "{} failed: {}",
                script.display(),
                out.status
            );
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        })
        .clone()
}

/// A bootstrap (`EnvoyOptions::bootstrap`) of two listeners running the filter with
/// `plugin_json`: `public` on `{port}`, and `ops` on `{backend_port}`, whose metadata names it
/// `ops` for the filter's admin path (`admin.listener`). Each answers 200 `upstream` for what
/// the filter lets through; `env_keys` are the environment variables the VM reads.
pub fn admin_bootstrap(plugin_json: &str, env_keys: &[&str]) -> String {
    let filter = format!(
        r#"{{ "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm, config: {{ name: sluice, root_id: sluice, allow_on_headers_stop_iteration: true, vm_config: {{ vm_id: sluice, runtime: envoy.wasm.runtime.v8, environment_variables: {{ host_env_keys: [{keys}] }}, code: {{ local: {{ filename: {wasm:?} }} }} }}, configuration: {{ "@type": type.googleapis.com/google.protobuf.StringValue, value: {json:?} }} }} }}"#,
        keys = env_keys.join(", "),
        wasm = wasm_path().to_string_lossy(),
        json = plugin_json,
    );
    let listener = |name: &str, port: &str, metadata: &str| {
        format!(
            r#"  - name: {name}{metadata}
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: {name}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes: [{{ match: {{ prefix: / }}, direct_response: {{ status: 200, body: {{ inline_string: upstream }} }} }}]
          http_filters:
          - name: envoy.filters.http.wasm
            typed_config: {filter}
          - name: envoy.filters.http.router
            typed_config: {{ "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }}
"#
        )
    };
    format!(
        "admin:\n  address:\n    socket_address: {{ address: 127.0.0.1, port_value: {{admin_port}} }}\nstatic_resources:\n  listeners:\n{}{}",
        listener("public", "{port}", ""),
        listener(
            "ops",
            "{backend_port}",
            "\n    metadata: { filter_metadata: { sluice: { listener: ops } } }",
        ),
    )
}

/// Absolute path of the release wasm (`$SLUICE_WASM` overrides it); panics if
/// it has not been built.
pub fn wasm_path() -> PathBuf {
    if let Some(path) = std::env::var_os("SLUICE_WASM").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let wasm = target_dir().join("wasm32-wasip1/release/sluice.wasm");
    assert!(
        wasm.is_file(),
        "{} is missing: run `make build` first",
        wasm.display()
    );
    warn_if_stale(&wasm);
    wasm
}

/// `cargo test` alone does not rebuild the wasm; say so when src/ is newer.
fn warn_if_stale(wasm: &Path) {
    static WARNED: OnceLock<()> = OnceLock::new();
    WARNED.get_or_init(|| {
        let built = std::fs::metadata(wasm).and_then(|m| m.modified()).ok();
        let newest_src = newest_mtime(&repo_root().join("src"));
        if let (Some(built), Some(src)) = (built, newest_src) {
            if src > built {
                eprintln!(
                    "warning: src/ is newer than {}: run `make build` (or `make test`)",
                    wasm.display()
                );
            }
        }
    });
}

fn newest_mtime(dir: &Path) -> Option<SystemTime> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|entry| {
            let meta = entry.metadata().ok()?;
            if meta.is_dir() {
                newest_mtime(&entry.path())
            } else {
                meta.modified().ok()
            }
        })
        .max()
}

/// A YAML double-quoted scalar holding `s` exactly.
fn yaml_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The bootstrap: the same shape as envoy/demo.yaml, with the given ports, an absolute wasm
/// path, and routes `api` (/api/) and `default` (/) that both answer 200 "ok" (or go to the
/// cluster `upstream`: `EnvoyOptions::upstream`), after the test's own (`EnvoyOptions::route`).
/// The listener is static, or with `lds_from_file` read from `<dir>/lds/listener.yaml`
/// (`lds_yaml`).
fn bootstrap_yaml(opts: &EnvoyOptions, dir: &Path, port: u16, admin_port: u16) -> String {
    // xDS subscriptions, file-based ones included, need a node id and cluster.
    let admin = format!(
        "node: {{ id: sluice-test, cluster: sluice-test }}\nadmin:\n  address:\n    socket_address: {{ address: 127.0.0.1, port_value: {admin_port} }}\n"
    );
    let admin = match &opts.stats_config {
        Some(stats) => format!("{admin}stats_config: {stats}\n"),
        None => admin,
    };
    let mut clusters = opts
        .service
        .as_deref()
        .map(service_cluster)
        .unwrap_or_default();
    for (name, server) in [("grpc_upstream", opts.grpc_upstream), ("rls", opts.rls)] {
        let Some(server) = server else { continue };
        if clusters.is_empty() {
            clusters.push_str("  clusters:\n");
        }
        clusters.push_str(&grpc_cluster(name, server));
    }
    if let Some(server) = opts.upstream {
        if clusters.is_empty() {
            clusters.push_str("  clusters:\n");
        }
        clusters.push_str(&upstream_cluster(server));
    }
    if !opts.lds_from_file {
        return format!(
            "{admin}static_resources:\n  listeners:\n{}{clusters}",
            listener_yaml(opts, dir, port, "  - ")
        );
    }
    let lds = dir.join(LDS_DIR);
    let static_clusters = if clusters.is_empty() {
        String::new()
    } else {
        format!("static_resources:\n{clusters}")
    };
    format!(
        r#"{admin}dynamic_resources:
  lds_config:
    resource_api_version: V3
    path_config_source:
      path: {path}
      watched_directory: {{ path: {watched} }}
{static_clusters}"#,
        path = yaml_quote(&lds.join(LDS_FILE).to_string_lossy()),
        watched = yaml_quote(&lds.to_string_lossy()),
    )
}

/// The LDS resource file: a discovery response with the one listener.
fn lds_yaml(opts: &EnvoyOptions, dir: &Path, port: u16) -> String {
    let item = "  - \"@type\": type.googleapis.com/envoy.config.listener.v3.Listener\n    ";
    format!("resources:\n{}", listener_yaml(opts, dir, port, item))
}

fn write_lds(dir: &Path, yaml: &str) {
    write_watched(dir, LDS_DIR, LDS_FILE, yaml);
}

/// The ECDS resource file: a discovery response with the sluice filter's one typed config.
fn ecds_yaml(typed_config: &str) -> String {
    format!(
        "resources:\n- \"@type\": type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig\n  name: {ECDS_FILTER}\n  typed_config: {typed_config}\n"
    )
}

/// Writes `<dir>/<sub>/<file>` as Envoy wants a watched file changed: a new file moved over it.
fn write_watched(dir: &Path, sub: &str, file: &str, yaml: &str) {
    let staged = dir.join(format!("{file}.next"));
    std::fs::write(&staged, yaml).unwrap_or_else(|e| panic!("writing {}: {e}", staged.display()));
    let path = dir.join(sub).join(file);
    std::fs::rename(&staged, &path)
        .unwrap_or_else(|e| panic!("renaming to {}: {e}", path.display()));
}

/// The wasm filter's typed config in YAML flow style, `None` without a plugin configuration.
fn wasm_typed_config(opts: &EnvoyOptions) -> Option<String> {
    let failure_policy = opts
        .wasm_failure_policy
        .as_deref()
        .map(|policy| format!(" failure_policy: {policy},"))
        .unwrap_or_default();
    let hold = if opts.hold_headers {
        " allow_on_headers_stop_iteration: true,"
    } else {
        ""
    };
    let names: Vec<&str> = opts.vm_env.iter().map(|(name, _)| name.as_str()).collect();
    let environment = if names.is_empty() {
        String::new()
    } else {
        format!(
            " environment_variables: {{ host_env_keys: [{}] }},",
            names.join(", ")
        )
    };
    opts.plugin_json.as_deref().map(|json| {
        format!(
            r#"{{ "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm, config: {{ name: sluice, root_id: sluice,{failure_policy}{hold} vm_config: {{ vm_id: sluice, runtime: envoy.wasm.runtime.v8,{environment} code: {{ local: {{ filename: {wasm} }} }} }}, configuration: {{ "@type": type.googleapis.com/google.protobuf.StringValue, value: {json} }} }} }}"#,
            wasm = yaml_quote(&wasm_path().to_string_lossy()),
            json = yaml_quote(json),
        )
    })
}

/// The sluice filter in the HCM's list: its typed config inline, or discovered through ECDS from
/// `<dir>/ecds/sluice.yaml`. Empty without a plugin configuration.
fn sluice_filter_yaml(opts: &EnvoyOptions, dir: &Path) -> String {
    let Some(typed_config) = wasm_typed_config(opts) else {
        return String::new();
    };
    if !opts.ecds_from_file {
        return format!(
            "\n          - name: envoy.filters.http.wasm\n            typed_config: {typed_config}"
        );
    }
    let ecds = dir.join(ECDS_DIR);
    let default_config = opts
        .ecds_default
        .as_deref()
        .map(|config| format!("\n              default_config: {config}"))
        .unwrap_or_default();
    format!(
        r#"
          - name: {ECDS_FILTER}
            config_discovery:
              config_source:
                resource_api_version: V3
                path_config_source:
                  path: {path}
                  watched_directory: {{ path: {watched} }}{default_config}
              type_urls:
              - type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              - type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"#,
        path = yaml_quote(&ecds.join(ECDS_FILE).to_string_lossy()),
        watched = yaml_quote(&ecds.to_string_lossy()),
    )
}

/// The listener `test` as an item of a YAML list at indentation 2; `item` starts it (`"  - "`,
/// or the LDS resource's type line and what follows it).
fn listener_yaml(opts: &EnvoyOptions, dir: &Path, port: u16, item: &str) -> String {
    let metadata_filter = header_to_metadata_filter(opts);
    let hcm_options: String = opts
        .hcm_options
        .iter()
        .map(|(name, value)| format!("\n          {name}: {value}"))
        .chain(access_log_yaml(opts, dir))
        .collect();
    let routes = extra_routes(opts);
    let action = route_action(opts);
    let wasm_filter = sluice_filter_yaml(opts, dir);
    let metadata = (opts.listener_metadata.as_deref())
        .map(|m| format!("\n    metadata: {m}"))
        .unwrap_or_default();
    format!(
        r#"{item}name: test{metadata}
    address:
      socket_address: {{ address: 127.0.0.1, port_value: {port} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: test
          use_remote_address: {use_remote_address}
          xff_num_trusted_hops: {xff_num_trusted_hops}{hcm_options}
          route_config:
            name: test
            virtual_hosts:
            - name: test
              domains: ["*"]
              routes:{routes}
              - name: api
                match: {{ prefix: /api/ }}
                {action}
              - name: default
                match: {{ prefix: / }}
                {action}
          http_filters:{metadata_filter}{wasm_filter}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#,
        use_remote_address = opts.use_remote_address,
        xff_num_trusted_hops = opts.xff_num_trusted_hops,
    )
}

/// The header_to_metadata filter of `EnvoyOptions::header_to_metadata`, if it has rules.
fn header_to_metadata_filter(opts: &EnvoyOptions) -> String {
    let metadata_rules: String = opts
        .header_to_metadata
        .iter()
        .map(|(header, namespace, key)| {
            format!(
                r#"
              - header: {header}
                on_header_present: {{ metadata_namespace: {namespace}, key: {key}, type: STRING }}
                remove: true"#
            )
        })
        .collect();
    if metadata_rules.is_empty() {
        String::new()
    } else {
        format!(
            r#"
          - name: envoy.filters.http.header_to_metadata
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config
              request_rules:{metadata_rules}"#
        )
    }
}

/// The HCM's `access_log`, a file in `dir`, when `EnvoyOptions::access_log` asked for one.
fn access_log_yaml(opts: &EnvoyOptions, dir: &Path) -> Option<String> {
    let log_format = opts.access_log_format.as_deref()?;
    Some(format!(
        r#"
          access_log:
          - name: envoy.access_loggers.file
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
              path: {path}
              log_format: {log_format}"#,
        path = yaml_quote(&dir.join(ACCESS_LOG).to_string_lossy()),
    ))
}

/// A cluster of plaintext HTTP/2 to one gRPC server, as an item of a bootstrap's cluster list
/// (the RLS's `sluice_rls` of a test's own bootstrap, say).
pub fn grpc_cluster(name: &str, server: SocketAddr) -> String {
    grpc_cluster_of(name, &[server])
}

/// `grpc_cluster` of several servers (replicas), each call or stream to one of them.
pub fn grpc_cluster_of(name: &str, servers: &[SocketAddr]) -> String {
    let endpoints: String = (servers.iter())
        .map(|server| {
            let (ip, port) = (server.ip(), server.port());
            format!("        - endpoint: {{ address: {{ socket_address: {{ address: {ip}, port_value: {port} }} }} }}\n")
        })
        .collect();
    format!(
        r#"  - name: {name}
    type: STATIC
    connect_timeout: 0.25s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http2_protocol_options: {{}} }}
    load_assignment:
      cluster_name: {name}
      endpoints:
      - lb_endpoints:
{endpoints}"#
    )
}

/// The gRPC route (`EnvoyOptions::grpc_upstream`) and the test's own routes
/// (`EnvoyOptions::route`), as items of the virtual host's route list.
fn extra_routes(opts: &EnvoyOptions) -> String {
    let grpc = opts.grpc_upstream.map(|_| {
        "\n              - name: grpc\n                match: { prefix: /, grpc: {} }\n                route: { cluster: grpc_upstream }".to_string()
    });
    let action = route_action(opts);
    let own = opts.routes.iter().map(|(name, prefix, fields)| {
        let fields: String = fields
            .iter()
            .map(|f| format!("\n                {f}"))
            .collect();
        format!(
            r#"
              - name: {name}
                match: {{ prefix: {prefix} }}
                {action}{fields}"#
        )
    });
    grpc.into_iter().chain(own).collect()
}

/// What the routes `api`, `default` and the test's own do: answer 200 "ok", or with
/// `EnvoyOptions::upstream` go to the cluster `upstream`, with the route timeouts asked for.
fn route_action(opts: &EnvoyOptions) -> String {
    let timeouts = [
        ("timeout", opts.route_timeout),
        ("idle_timeout", opts.route_idle_timeout),
    ];
    let timeouts: String = timeouts
        .iter()
        .filter_map(|(field, timeout)| Some(format!(", {field}: {}s", (*timeout)?.as_secs_f64())))
        .collect();
    if opts.upstream.is_none() {
        assert!(
            timeouts.is_empty(),
            "route_timeout and route_idle_timeout are for the routes to an upstream()"
        );
        return "direct_response: { status: 200, body: { inline_string: ok } }".into();
    }
    format!("route: {{ cluster: upstream{timeouts} }}")
}

/// The cluster `upstream`: HTTP/1.1 to one server, its trailers passed on.
fn upstream_cluster(server: SocketAddr) -> String {
    let (ip, port) = (server.ip(), server.port());
    format!(
        r#"  - name: upstream
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http_protocol_options: {{ enable_trailers: true }} }}
    load_assignment:
      cluster_name: upstream
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: {ip}, port_value: {port} }} }} }}
"#
    )
}

/// The cluster `sluice_service`, plain HTTP/1.1 to the given endpoints.
fn service_cluster(endpoints: &[SocketAddr]) -> String {
    let endpoints: String = endpoints
        .iter()
        .map(|a| {
            let (ip, port) = (a.ip(), a.port());
            format!("\n        - endpoint: {{ address: {{ socket_address: {{ address: {ip}, port_value: {port} }} }} }}")
        })
        .collect();
    let lb_endpoints = if endpoints.is_empty() {
        " []".to_string()
    } else {
        format!("\n      - lb_endpoints:{endpoints}")
    };
    format!(
        r#"  clusters:
  - name: sluice_service
    type: STATIC
    connect_timeout: 0.25s
    # Under the service's 300 s keep-alive, so Envoy never reuses a connection the service closes.
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        common_http_protocol_options: {{ idle_timeout: 60s }}
        explicit_http_config: {{ http_protocol_options: {{}} }}
    load_assignment:
      cluster_name: sluice_service
      endpoints:{lb_endpoints}
"#
    )
}
