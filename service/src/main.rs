//! `sluice-service`: serve at once (HTTP, the RLS, the RLQS, any of them), reach Redis in the background, stop
//! gracefully on SIGTERM or Ctrl-C.

use std::fmt::Display;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use futures_util::FutureExt;
use sluice_service::admin::auth::{AdminTokens, Role, TokenSource};
use sluice_service::admin::{overrides, Admin, Audit};
use sluice_service::auth::{self, Guard, TokenFile};
use sluice_service::cli::{Args, Backend};
use sluice_service::connections::Gate;
use sluice_service::decision::slot_watch::SlotWatch;
use sluice_service::grpc::{self, Rls};
use sluice_service::health::{self, Readiness};
use sluice_service::http::{serve, App};
use sluice_service::metrics::Metrics;
use sluice_service::stores::memory::MemoryStore;
use sluice_service::stores::redis::RedisStore;
use sluice_service::stores::Store;
use sluice_service::top::{self, TopRecorder};
use sluice_service::web;
use sluice_service::{logging, signals};
use tokio::net::TcpListener;
use tracing::{error, info, warn};

fn main() -> ExitCode {
    keep_freed_heap();
    let args = Args::parse();
    if let Err(message) = logging::init(&args.log) {
        eprintln!("sluice-service: {message}");
        return ExitCode::FAILURE;
    }
    let runtime = runtime().map_err(|failure| format!("cannot start the async runtime: {failure}"));
    match runtime.and_then(|runtime| runtime.block_on(run(args))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            error!(error = message, "sluice-service cannot start");
            ExitCode::FAILURE
        }
    }
}

/// How much freed memory glibc's malloc keeps at the top of its heap before it gives it back to
/// the system, and the size from which an allocation gets a mapping of its own.
const RETAINED_HEAP_BYTES: std::ffi::c_int = 16 << 20;
const OWN_MAPPING_BYTES: std::ffi::c_int = 4 << 20;

/// glibc's malloc gives the top of its heap back once 128 KiB of it are free, and takes it
/// again on the next burst of calls: on one core, at 32 RLS calls in flight, a `brk` every 24
/// calls and a page fault every 6 (3,583 and 13,442 for 84,928 calls), each new page zeroed by
/// the kernel. Keeping up to `RETAINED_HEAP_BYTES` ends that churn; the heap stays at what the
/// peak needs. (Setting it stops glibc from raising its mapping threshold as large blocks are
/// freed, so that threshold is set too, where glibc would have raised it.)
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_heap() {
    use std::ffi::c_int;
    extern "C" {
        fn mallopt(param: c_int, value: c_int) -> c_int;
    }
    // glibc's <malloc.h>.
    const M_TRIM_THRESHOLD: c_int = -1;
    const M_MMAP_THRESHOLD: c_int = -3;
    // SAFETY: mallopt only sets malloc's parameters (and returns 0 for a value it refuses,
    // leaving its default); it is called before any other thread exists.
    unsafe {
        mallopt(M_TRIM_THRESHOLD, RETAINED_HEAP_BYTES);
        mallopt(M_MMAP_THRESHOLD, OWN_MAPPING_BYTES);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_heap() {}

/// The async runtime: on one core (a `taskset`, a container's CPU quota) the current-thread
/// scheduler, else the multi-thread one with a worker per core (or `TOKIO_WORKER_THREADS`).
///
/// One core gains nothing from a multi-thread runtime, and costs a write per call: its worker
/// runs a task woken by the running one next (tokio's LIFO slot), so each call that completes
/// has its connection's task send that one answer at once. The current-thread scheduler runs
/// woken tasks in turn, so the calls that were ready together go out in one write.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let one_core = std::env::var_os("TOKIO_WORKER_THREADS").is_none()
        && std::thread::available_parallelism().is_ok_and(|cores| cores.get() == 1);
    let mut builder = if one_core {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    builder.enable_all().build()
}

/// The store the command line chose.
async fn run(args: Args) -> Result<(), String> {
    match args.store.backend() {
        Backend::Redis(target) => {
            let store =
                RedisStore::new(&target).map_err(|failure| format!("{target}: {failure}"))?;
            serve_with(Arc::new(store), &target, args).await
        }
        Backend::Memory => serve_with(Arc::new(MemoryStore::default()), &"memory", args).await,
    }
}

/// Everything that can be wrong with the command line or the token file fails here, before the
/// service listens; Redis being down does not.
async fn serve_with<S: Store>(
    store: Arc<S>,
    target: &dyn Display,
    args: Args,
) -> Result<(), String> {
    args.check_authentication()?;
    let tokens = args
        .token_file
        .as_deref()
        .map(TokenFile::load)
        .transpose()?;
    let tokens = tokens.map(Arc::new);
    let admin_tokens = admin_tokens(&args)?;
    let mut metrics = Metrics::new(&args.metric_policies);
    let audit = admin_tokens
        .as_ref()
        .map(|_| Audit::new(metrics.registry_mut()));
    let gate = Arc::new(Gate::new(args.connections.limits(), metrics.registry_mut()));
    let bounds = args.max_key_ttl;
    let max_request_bytes = args.connections.max_request_bytes;
    // The heaviest keys are recorded only where the admin API can read them.
    let top = admin_tokens
        .as_ref()
        .map(|_| Arc::new(TopRecorder::default()));
    if let Some(recorder) = &top {
        let every = std::time::Duration::from_secs(args.top_log_every);
        tokio::spawn(top::log_every(Arc::clone(recorder), every));
    }
    // Applied by the checks and the RLS alike, kept by the admin API.
    let override_table = admin_tokens
        .as_ref()
        .map(|_| Arc::new(overrides::OverrideTable::default()));
    let rls_settings = grpc::Settings {
        bounds,
        guard: Guard::new(
            tokens.clone(),
            "refused an rls call without a valid bearer token",
        ),
        rlqs_guard: Guard::new(
            tokens.clone(),
            "refused an rlqs stream without a valid bearer token",
        ),
        max_request_bytes,
        top: top.clone(),
        overrides: override_table.clone(),
    };
    let rls = Rls::prepare(
        &args.rls,
        Arc::clone(&store),
        metrics.registry_mut(),
        rls_settings,
    );
    let rls = rls.await?;
    let listener = http_listener(&args).await?;
    let signals = signals::install()?;

    let metrics = Arc::new(metrics);
    tokio::spawn(Arc::clone(&gate).enforce_deadlines());
    let readiness = Arc::new(Readiness::new());
    let probe = health::probe_redis(
        Arc::clone(&store),
        Arc::clone(&readiness),
        Arc::clone(&metrics),
    );
    tokio::spawn(probe);
    let watch = Arc::new(SlotWatch::default());
    tokio::spawn(Arc::clone(&watch).run(Arc::clone(&store), Arc::clone(&metrics)));
    if let Some(tokens) = &tokens {
        tokio::spawn(auth::keep_current(Arc::clone(tokens), signals.hangup));
    }
    if let Some(admin_tokens) = &admin_tokens {
        tokio::spawn(Arc::clone(admin_tokens).keep_current()?);
    }
    if let Some(listener) = &listener {
        let address = listener
            .local_addr()
            .map_err(|failure| failure.to_string())?;
        info!(address = %address, store = %target, token = tokens.is_some(), "listening");
    }
    if let Some(rls) = &rls {
        rls.announce(target);
    }
    let rlqs_metrics = rls.as_ref().and_then(Rls::rlqs_metrics);

    let (delay, drain) = (args.shutdown_delay, args.shutdown_timeout);
    let stopping = async {
        signals.stop.await;
        readiness.start_shutdown();
        info!(
            delay_s = delay.as_secs(),
            drain_s = drain.as_secs(),
            "shutting down"
        );
        tokio::time::sleep(delay).await;
    }
    .shared();
    let http = async {
        let Some(listener) = listener else {
            return true;
        };
        let guard = Guard::new(
            tokens.clone(),
            "refused a check without a valid bearer token (401)",
        );
        let limits = web::Limits {
            bounds,
            max_body_bytes: max_request_bytes,
        };
        let admin = (admin_tokens.zip(audit))
            .map(|(tokens, audit)| Admin::new(Arc::clone(&store), tokens, audit, limits))
            .map(|admin| admin.with_max_overrides(args.max_overrides))
            .map(|admin| match &override_table {
                Some(table) => admin.with_overrides(Arc::clone(table)),
                None => admin,
            })
            .map(|admin| match &top {
                Some(recorder) => admin.with_top(Arc::clone(recorder)),
                None => admin,
            })
            .map(|admin| admin.with_rlqs(rlqs_metrics.clone()));
        if let Some(admin) = &admin {
            let table = Arc::clone(&admin.overrides);
            tokio::spawn(overrides::keep_current(Arc::clone(&store), table, bounds));
        }
        let app = App::new(store, metrics, Arc::clone(&readiness), guard, limits, watch);
        let app = match admin {
            Some(admin) => app.with_admin(admin),
            None => app,
        };
        let gate = Arc::clone(&gate);
        serve(listener, Arc::new(app), gate, stopping.clone(), drain).await
    };
    let rls = async {
        match rls {
            Some(rls) => {
                let readiness = Arc::clone(&readiness);
                (rls.serve(Arc::clone(&gate), readiness, stopping.clone(), drain)).await
            }
            None => Ok(true),
        }
    };
    let (http_drained, rls_drained) = tokio::join!(http, rls);
    if http_drained && rls_drained? {
        info!("stopped");
    } else {
        warn!(
            drain_s = drain.as_secs(),
            "stopped with requests still in flight"
        );
    }
    Ok(())
}

/// The admin API's tokens, if it is served (`--admin-token-file`).
fn admin_tokens(args: &Args) -> Result<Option<Arc<AdminTokens>>, String> {
    let Some(path) = &args.admin_token_file else {
        return Ok(None);
    };
    let admin = TokenSource::load(path, "--admin-token-file", Role::Admin)?;
    let read = (args.read_token_file.as_deref())
        .map(|path| TokenSource::load(path, "--read-token-file", Role::Read))
        .transpose()?;
    Ok(Some(Arc::new(AdminTokens {
        admin: Arc::new(admin),
        read: read.map(Arc::new),
    })))
}

/// The HTTP listener, unless only the RLS is served.
async fn http_listener(args: &Args) -> Result<Option<TcpListener>, String> {
    let Some(listen) = args.http_listen() else {
        return Ok(None);
    };
    let listener = TcpListener::bind(listen).await;
    let listener = listener.map_err(|failure| format!("cannot listen on {listen}: {failure}"))?;
    Ok(Some(listener))
}
