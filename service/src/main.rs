//! `sluice-service`: connect to Redis, then serve until SIGTERM or Ctrl-C.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use sluice_service::cli::Args;
use sluice_service::http::{serve, App};
use sluice_service::redis_store::RedisStore;
use tokio::net::TcpListener;

fn main() -> ExitCode {
    let args = Args::parse();
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
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|failure| format!("cannot listen on {}: {failure}", args.listen))?;
    let address = listener
        .local_addr()
        .map_err(|failure| failure.to_string())?;
    let shutdown = shutdown_signal()?;
    eprintln!("sluice-service listening on {address}, redis {target}");
    serve(listener, Arc::new(App::new(store)), shutdown).await;
    eprintln!("sluice-service: stopped");
    Ok(())
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
