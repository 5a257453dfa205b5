//! The configuration in force, and keeping it current. Every second (and on SIGHUP) the files are
//! looked at: a file whose length and modification time are unchanged is not read again, and
//! one read but unchanged is not parsed again. A change that loads replaces the whole
//! configuration at once; one that does not is logged with file, line and reason while the
//! previous configuration keeps serving. So is a change that would drop domains because their
//! files disappeared (a directory left without YAML, above all), unless
//! `--rls-allow-empty-config`. Reading and parsing run on a blocking thread, never where calls
//! are answered: they only ever meet the swap of one `Arc`. The same errors again are logged
//! once a minute, with how many times they came meanwhile.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use super::config::{read_files, stamps, Config, ConfigError, Files, Stamp};
use crate::decision::check::Bounds;
use crate::logging::Throttle;

/// How often the files are looked at.
pub const POLL: Duration = Duration::from_secs(1);
/// Refusals with the same errors as the last one are logged at most this often.
pub const REPEAT_EVERY: Duration = Duration::from_secs(60);

/// The configuration in force, shared by the service and the watcher.
#[derive(Clone, Default)]
pub struct SharedConfig(Arc<RwLock<Arc<Config>>>);

impl SharedConfig {
    pub fn new(config: Config) -> SharedConfig {
        SharedConfig(Arc::new(RwLock::new(Arc::new(config))))
    }

    /// The configuration as it is now; a reload does not change what a caller holds.
    pub fn current(&self) -> Arc<Config> {
        Arc::clone(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }

    fn replace(&self, config: Config) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(config);
    }
}

/// How reloads are checked: the bounds of every limit, and whether domains may go with their
/// files.
#[derive(Debug, Clone, Copy)]
pub struct Reload {
    pub bounds: Bounds,
    pub allow_empty: bool,
}

/// Where the loads of the limits files are counted (`rls::metrics`): each load's result, and the
/// domains in force after a good one.
pub trait CountsLoads: Send + Sync {
    fn record_config_load(&self, domains: Option<usize>);
}

/// The files as last seen, and where to apply what changes in them.
pub struct Watcher {
    path: PathBuf,
    reload: Reload,
    stamps: Vec<Stamp>,
    /// Each file read last, with a hash of its contents.
    digest: Vec<(PathBuf, u64)>,
    shared: SharedConfig,
    metrics: Arc<dyn CountsLoads>,
    /// The errors of the last refusal, and how often they may be logged again.
    refused: Option<(String, Throttle)>,
}

impl Watcher {
    /// Loads `path` for the first time; the caller refuses to start on errors. A configuration
    /// without a domain starts, with a warning.
    pub fn start(
        path: &Path,
        reload: Reload,
        metrics: Arc<dyn CountsLoads>,
    ) -> Result<(Watcher, SharedConfig), Vec<ConfigError>> {
        let stamps = stamps(path).map_err(|error| vec![error])?;
        let files = read_files(path).map_err(|error| vec![error])?;
        let config = Config::from_files(&files, &reload.bounds)?;
        let domains = config.domain_count();
        metrics.record_config_load(Some(domains));
        if domains == 0 {
            tracing::warn!(
                config = %path.display(),
                "rls configuration has no domain: every call is answered OK"
            );
        }
        let shared = SharedConfig::new(config);
        let watcher = Watcher {
            path: path.to_path_buf(),
            reload,
            stamps,
            digest: digest(&files),
            shared: shared.clone(),
            metrics,
            refused: None,
        };
        Ok((watcher, shared))
    }

    /// Reloads on every change of the files and on every SIGHUP, for ever, each time on a
    /// blocking thread.
    pub async fn run(mut self, mut hangups: Hangups) {
        loop {
            let forced = tokio::select! {
                () = tokio::time::sleep(POLL) => false,
                () = hangups.next() => true,
            };
            let reloaded = tokio::task::spawn_blocking(move || {
                self.reload(forced);
                self
            });
            match reloaded.await {
                Ok(watcher) => self = watcher,
                // Only if the runtime is shutting down.
                Err(_) => return,
            }
        }
    }

    /// Looks at the files again and applies them if they changed (or if `forced`).
    fn reload(&mut self, forced: bool) {
        let files = stamps(&self.path).and_then(|stamps| {
            let changed = stamps != self.stamps;
            self.stamps = stamps;
            if changed || forced {
                read_files(&self.path).map(Some)
            } else {
                Ok(None)
            }
        });
        let files = match files {
            Ok(Some(files)) => files,
            Ok(None) => return,
            Err(error) => {
                // Read again next time: the stamps of a path that cannot be read mean nothing.
                self.stamps.clear();
                return self.refuse(&[error]);
            }
        };
        let digest = digest(&files);
        if digest == self.digest && !forced {
            return;
        }
        // A refused version is not tried again until the files change once more (or SIGHUP).
        let before = std::mem::replace(&mut self.digest, digest);
        match Config::from_files(&files, &self.reload.bounds) {
            Ok(config) => match self.dropped_with_files(&config, &before) {
                Some(error) => self.refuse(&[error]),
                None => self.apply(config),
            },
            Err(errors) => self.refuse(&errors),
        }
    }

    fn apply(&mut self, config: Config) {
        let domains = config.domain_count();
        self.shared.replace(config);
        self.metrics.record_config_load(Some(domains));
        self.refused = None;
        let config = self.path.display();
        tracing::info!(config = %config, domains, "rls configuration loaded");
    }

    /// The error of a `config` that drops domains of the one in force while files read
    /// `before` are gone, unless `--rls-allow-empty-config`.
    fn dropped_with_files(
        &self,
        config: &Config,
        before: &[(PathBuf, u64)],
    ) -> Option<ConfigError> {
        let current = self.shared.current();
        let mut dropped: Vec<&str> = (current.domain_names())
            .filter(|name| config.domain(name).is_none())
            .collect();
        let gone: Vec<String> = (before.iter())
            .filter(|(file, _)| !self.digest.iter().any(|(now, _)| now == file))
            .map(|(file, _)| file.display().to_string())
            .collect();
        if self.reload.allow_empty || dropped.is_empty() || gone.is_empty() {
            return None;
        }
        dropped.sort_unstable();
        let reason = format!(
            "refused: domain(s) {} would go with {} no longer there (--rls-allow-empty-config \
             allows it); {} of {} domains left",
            dropped.join(", "),
            gone.join(", "),
            config.domain_count(),
            current.domain_count(),
        );
        Some(ConfigError {
            file: self.path.clone(),
            line: 0,
            reason,
        })
    }

    /// Logs `errors` (the same ones as last time at most once per `REPEAT_EVERY`, with how many
    /// times they came since); the configuration in force stays.
    fn refuse(&mut self, errors: &[ConfigError]) {
        self.metrics.record_config_load(None);
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let text = text.join("\n");
        let repeated = match &self.refused {
            Some((last, throttle)) if *last == text => throttle.pass(),
            _ => {
                let throttle = Throttle::new(REPEAT_EVERY);
                let first = throttle.pass();
                self.refused = Some((text, throttle));
                first
            }
        };
        let Some(repeated) = repeated else {
            return;
        };
        for error in errors {
            let error = error.to_string();
            tracing::error!(
                error,
                repeated,
                "rls configuration refused, the previous one keeps serving"
            );
        }
    }
}

/// Each file with a hash of its contents: what tells a change once files were read.
fn digest(files: &Files) -> Vec<(PathBuf, u64)> {
    (files.iter())
        .map(|(file, text)| {
            let mut hasher = DefaultHasher::new();
            text.hash(&mut hasher);
            (file.clone(), hasher.finish())
        })
        .collect()
}

/// SIGHUPs, which reload the configuration.
#[cfg(unix)]
pub struct Hangups(tokio::signal::unix::Signal);

#[cfg(unix)]
impl Hangups {
    /// Installs the handler at once: from then on a SIGHUP reloads instead of ending the process
    /// (its default action), so call this before saying the service is ready.
    pub fn install() -> std::io::Result<Hangups> {
        use tokio::signal::unix::{signal, SignalKind};
        signal(SignalKind::hangup()).map(Hangups)
    }

    async fn next(&mut self) {
        if self.0.recv().await.is_none() {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(not(unix))]
pub struct Hangups;

#[cfg(not(unix))]
impl Hangups {
    pub fn install() -> std::io::Result<Hangups> {
        Ok(Hangups)
    }

    async fn next(&mut self) {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rls::metrics::RlsMetrics;
    use prometheus_client::registry::Registry;

    const LIMIT: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 3}\n";

    struct Dir(PathBuf);

    impl Dir {
        fn new(label: &str) -> Dir {
            let dir =
                std::env::temp_dir().join(format!("sluice-watch-{label}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Dir(dir)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn watcher(dir: &Path, allow_empty: bool) -> (Watcher, SharedConfig) {
        let metrics = Arc::new(RlsMetrics::register(&mut Registry::default()));
        let reload = Reload {
            bounds: Bounds::default(),
            allow_empty,
        };
        Watcher::start(dir, reload, metrics).unwrap()
    }

    #[test]
    fn a_directory_left_without_yaml_keeps_its_domains_unless_allowed() {
        let dir = Dir::new("empty");
        std::fs::write(dir.0.join("limits.yaml"), LIMIT).unwrap();
        for allow_empty in [false, true] {
            let (mut watcher, shared) = watcher(&dir.0, allow_empty);
            std::fs::rename(dir.0.join("limits.yaml"), dir.0.join("limits.yaml.bak")).unwrap();
            watcher.reload(false);
            let expected = if allow_empty { 0 } else { 1 };
            assert_eq!(shared.current().domain_count(), expected, "{allow_empty}");
            std::fs::rename(dir.0.join("limits.yaml.bak"), dir.0.join("limits.yaml")).unwrap();
        }
    }

    #[test]
    fn a_domain_renamed_in_place_is_an_edit_not_a_loss() {
        let dir = Dir::new("renamed");
        std::fs::write(dir.0.join("limits.yaml"), LIMIT).unwrap();
        let (mut watcher, shared) = watcher(&dir.0, false);
        std::fs::write(dir.0.join("limits.yaml"), LIMIT.replace("api", "web")).unwrap();
        watcher.reload(true);
        let current = shared.current();
        assert!(current.domain("web").is_some() && current.domain("api").is_none());
    }

    #[test]
    fn unchanged_files_are_not_read_again_and_repeated_errors_are_held_back() {
        let dir = Dir::new("unchanged");
        let file = dir.0.join("limits.yaml");
        std::fs::write(&file, LIMIT).unwrap();
        let (mut watcher, _) = watcher(&dir.0, false);
        let digest = watcher.digest.clone();
        watcher.digest.clear();
        watcher.reload(false);
        assert!(
            watcher.digest.is_empty(),
            "the stamps are the same: not read"
        );
        watcher.reload(true);
        assert_eq!(watcher.digest, digest, "SIGHUP reads");
        std::fs::write(&file, "domain: [api\n").unwrap();
        watcher.reload(true);
        let first = watcher.refused.as_ref().map(|(text, _)| text.clone());
        let first = first.expect("refused");
        watcher.reload(true);
        let (again, throttle) = watcher.refused.as_ref().unwrap();
        assert_eq!(*again, first);
        assert_eq!(throttle.pass(), None, "held back for a minute");
    }
}
