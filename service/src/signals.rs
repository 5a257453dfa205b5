//! The signals the service acts on: SIGTERM (how orchestrators stop it) and SIGINT (Ctrl-C)
//! begin a graceful shutdown; SIGHUP re-reads the token file.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::Notify;

pub struct Signals {
    /// Completes at the first SIGTERM or SIGINT.
    pub stop: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    /// Notified at each SIGHUP.
    pub hangup: Arc<Notify>,
}

/// Installs the handlers now, before the service says it listens: a signal sent as soon as it
/// does must be handled, not kill it with the default action (SIGHUP's included).
#[cfg(unix)]
pub fn install() -> Result<Signals, String> {
    use tokio::signal::unix::{signal, SignalKind};
    let install =
        |kind| signal(kind).map_err(|failure| format!("cannot handle signals: {failure}"));
    let mut terminate = install(SignalKind::terminate())?;
    let mut interrupt = install(SignalKind::interrupt())?;
    let mut hangups = install(SignalKind::hangup())?;
    let hangup = Arc::new(Notify::new());
    let notify = Arc::clone(&hangup);
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            notify.notify_one();
        }
    });
    let stop = Box::pin(async move {
        tokio::select! {
            _ = terminate.recv() => {},
            _ = interrupt.recv() => {},
        }
    });
    Ok(Signals { stop, hangup })
}

#[cfg(not(unix))]
pub fn install() -> Result<Signals, String> {
    let stop = Box::pin(async {
        let _ = tokio::signal::ctrl_c().await;
    });
    let hangup = Arc::new(Notify::new());
    Ok(Signals { stop, hangup })
}
