//! The configuration in force, and keeping it current: the files are read again every second and
//! on SIGHUP; a change that loads replaces the whole configuration at once, one that does not is
//! logged with file, line and reason while the previous configuration keeps serving.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use super::config::{read_files, Config, ConfigError, Files};
use super::metrics::RlsMetrics;

/// How often the files are read to see whether they changed.
pub const POLL: Duration = Duration::from_secs(1);

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

/// The files as last read, and where to apply what changes in them.
pub struct Watcher {
    path: PathBuf,
    files: Files,
    shared: SharedConfig,
    metrics: Arc<RlsMetrics>,
}

impl Watcher {
    /// Loads `path` for the first time; the caller refuses to start on errors.
    pub fn start(
        path: &Path,
        metrics: Arc<RlsMetrics>,
    ) -> Result<(Watcher, SharedConfig), Vec<ConfigError>> {
        let files = read_files(path).map_err(|error| vec![error])?;
        let config = Config::from_files(&files)?;
        metrics.record_config_load(Some(config.domain_count()));
        let shared = SharedConfig::new(config);
        let watcher = Watcher {
            path: path.to_path_buf(),
            files,
            shared: shared.clone(),
            metrics,
        };
        Ok((watcher, shared))
    }

    /// Reloads on every change of the files and on every SIGHUP, for ever.
    pub async fn run(mut self, mut hangups: Hangups) {
        loop {
            let forced = tokio::select! {
                () = tokio::time::sleep(POLL) => false,
                () = hangups.next() => true,
            };
            self.reload(forced);
        }
    }

    /// Reads the files again and applies them if they changed (or if `forced`).
    fn reload(&mut self, forced: bool) {
        let files = match read_files(&self.path) {
            Ok(files) => files,
            Err(error) => return self.refuse(&[error]),
        };
        if files == self.files && !forced {
            return;
        }
        match Config::from_files(&files) {
            Ok(config) => {
                let domains = config.domain_count();
                self.shared.replace(config);
                self.metrics.record_config_load(Some(domains));
                let config = self.path.display();
                tracing::info!(config = %config, domains, "rls configuration loaded");
            }
            Err(errors) => self.refuse(&errors),
        }
        // A refused version is not tried again until the files change once more (or SIGHUP).
        self.files = files;
    }

    fn refuse(&self, errors: &[ConfigError]) {
        self.metrics.record_config_load(None);
        for error in errors {
            let error = error.to_string();
            tracing::error!(
                error,
                "rls configuration refused, the previous one keeps serving"
            );
        }
    }
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
