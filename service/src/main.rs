//! `sluice-service`: connect to Redis, then serve HTTP, the RLS or both until SIGTERM or Ctrl-C.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use futures_util::FutureExt;
use sluice_service::cli::Args;
use sluice_service::http::{serve, App};
use sluice_service::metrics::Metrics;
use sluice_service::redis_store::RedisStore;
use sluice_service::rls::Rls;
use tokio::net::TcpListener;

fn main() -> ExitCode {
    let args = Args::parse();
    // Reloads of the RLS configuration are logged; the readiness lines stay plain stderr lines.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .try_init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(failure) => return fail(&format!("cannot start the async runtime: {failure}")),
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => fail(&message),
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("sluice-service: {message}");
    ExitCode::FAILURE
}

async fn run(args: Args) -> Result<(), String> {
    let target = args.redis.target();
    let store = RedisStore::connect(&target)
        .await
        .map_err(|failure| format!("cannot reach Redis at {target}: {failure}"))?;
    let store = Arc::new(store);
    let mut metrics = Metrics::default();
    let rls = Rls::prepare(&args.rls, Arc::clone(&store), metrics.registry_mut()).await?;
    let listener = match args.http_listen() {
        Some(listen) => Some(
            TcpListener::bind(listen)
                .await
                .map_err(|failure| format!("cannot listen on {listen}: {failure}"))?,
        ),
        None => None,
    };
    let shutdown = shutdown_signal()?.shared();
    if let Some(listener) = &listener {
        let address = listener
            .local_addr()
            .map_err(|failure| failure.to_string())?;
        eprintln!("sluice-service listening on {address}, redis {target}");
    }
    if let Some(rls) = &rls {
        eprintln!("sluice-service {}, redis {target}", rls.describe());
    }
    let http = async {
        if let Some(listener) = listener {
            let app = Arc::new(App::with_metrics(store, metrics));
            serve(listener, app, shutdown.clone()).await;
        }
    };
    let rls = async {
        match rls {
            Some(rls) => rls.serve(shutdown.clone()).await,
            None => Ok(()),
        }
    };
    let ((), served) = tokio::join!(http, rls);
    eprintln!("sluice-service: stopped");
    served
}

/// SIGTERM (how orchestrators stop us) or Ctrl-C (SIGINT). The handlers are installed when this
/// is called, before the readiness line: a signal sent as soon as the service is ready must stop
/// it cleanly, not kill it with the default action (as it did when they were installed on the
/// first poll, inside `serve`).
#[cfg(unix)]
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>, String> {
    use tokio::signal::unix::{signal, SignalKind};
    let install =
        |kind| signal(kind).map_err(|failure| format!("cannot handle signals: {failure}"));
    let mut terminate = install(SignalKind::terminate())?;
    let mut interrupt = install(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => {},
            _ = interrupt.recv() => {},
        }
    })
}

#[cfg(not(unix))]
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>, String> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}
