//! The connections of both servers (HTTP/1.1 and the RLS's HTTP/2), so that no client can keep
//! another out: at most `--max-connections` open in all, each closed when it does not send a
//! request in time, and the one that did least for longest closed when a newcomer needs its
//! place.
//!
//! - **Deadlines.** A connection must bring its first request within `--header-timeout` of
//!   being accepted, and an HTTP/1.1 request must arrive whole within `--header-timeout` of its
//!   first byte (a slow client's trickle included); a connection with no request in flight is
//!   closed `--idle-timeout` after its last answer. A request being answered (a Redis call, a
//!   leaky bucket's hold) is never cut short by them.
//! - **Shedding.** When a connection arrives with every place taken, the idle connection whose
//!   last answer (or acceptance) is oldest is closed for it: one that never completed a request
//!   goes first, a pool connection that answers all the time goes last, and a new client is the
//!   newest of all. Only when every connection has a request in flight is the newcomer refused.
//!   Running out of file descriptors anyway (the cap set above the process limit) sheds one too.
//! - **Accept errors** are logged at most once a second, with how many were not.
//!
//! A connection is closed through its socket (`Tracked`): its next read ends, whatever protocol
//! serves it. The rules are pure functions of a connection's times (`Times`), tested alone.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::task::AtomicWaker;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tracing::warn;

use crate::logging::Throttle;

/// Descriptors kept back from `--max-connections`'s default for everything else: the
/// listeners, Redis, the configuration and token files, the runtime's own.
pub const RESERVED_FDS: u64 = 64;
/// `--max-connections` at most, whatever the descriptor limit: memory, not descriptors, is then
/// what runs out first.
pub const MAX_DEFAULT_CONNECTIONS: u64 = 16_384;
/// How often the deadlines are enforced.
const REAP_EVERY: Duration = Duration::from_millis(250);
/// After running out of descriptors, how long accepting pauses while a shed connection closes.
const EXHAUSTED_PAUSE: Duration = Duration::from_millis(50);
const LOG_EVERY: Duration = Duration::from_secs(1);

/// The connection limits, from the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
}

/// `--max-connections`'s default: the process's descriptor limit less `RESERVED_FDS`, at most
/// `MAX_DEFAULT_CONNECTIONS` (and at least 16).
pub fn default_max_connections() -> usize {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(MAX_DEFAULT_CONNECTIONS + RESERVED_FDS);
    let connections = limit
        .saturating_sub(RESERVED_FDS)
        .clamp(16, MAX_DEFAULT_CONNECTIONS);
    usize::try_from(connections).unwrap_or(16)
}

/// Which server a connection came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Server {
    /// HTTP/1.1: a request's bytes arrive only while it is being sent, so a request's own
    /// deadline applies.
    Http,
    /// HTTP/2: control frames come and go between requests.
    Rls,
    /// HTTP/2 as the RLS's, on the RLQS's own port.
    Rlqs,
}

impl Server {
    pub fn name(self) -> &'static str {
        match self {
            Server::Http => "http",
            Server::Rls => "rls",
            Server::Rlqs => "rlqs",
        }
    }
}

/// Why a connection was closed by the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// No (whole) request within `--header-timeout`.
    HeaderTimeout,
    /// Nothing for `--idle-timeout` since the last answer.
    IdleTimeout,
    /// Closed to make room for a newcomer.
    Shed,
    /// A newcomer refused: every connection had a request in flight.
    Refused,
}

impl Reason {
    fn name(self) -> &'static str {
        match self {
            Reason::HeaderTimeout => "header_timeout",
            Reason::IdleTimeout => "idle_timeout",
            Reason::Shed => "shed",
            Reason::Refused => "refused",
        }
    }
}

/// What the rules look at, in ms since the gate started (0: never).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Times {
    pub accepted: u64,
    /// When the last request was answered.
    pub last_answer: u64,
    /// When the bytes of a request not yet being answered began to arrive (HTTP/1.1 only).
    pub receiving_since: u64,
    pub in_flight: u32,
}

impl Times {
    /// Why the connection is to be closed at `now`, if it is.
    pub fn expired(&self, now: u64, limits: &Limits) -> Option<Reason> {
        if self.in_flight > 0 {
            return None;
        }
        let past = |since: u64, limit: Duration| since > 0 && now.saturating_sub(since) > ms(limit);
        let header = limits.header_timeout;
        if (self.last_answer == 0 && past(self.accepted, header))
            || past(self.receiving_since, header)
        {
            return Some(Reason::HeaderTimeout);
        }
        past(self.last_active(), limits.idle_timeout).then_some(Reason::IdleTimeout)
    }

    /// Since when the connection has done nothing useful: the order in which idle connections
    /// are shed.
    fn last_active(&self) -> u64 {
        self.accepted.max(self.last_answer)
    }
}

/// The connection to shed among `open` (id, times): the idle one least recently active.
pub fn to_shed(open: impl Iterator<Item = (u64, Times)>) -> Option<u64> {
    open.filter(|(_, times)| times.in_flight == 0)
        .min_by_key(|(_, times)| times.last_active())
        .map(|(id, _)| id)
}

fn ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// One open connection, shared by its socket, the gate and its server.
struct Conn {
    server: Server,
    accepted: u64,
    last_answer: AtomicU64,
    receiving_since: AtomicU64,
    in_flight: AtomicU32,
    /// Set when the service closes it; its next read ends.
    closing: AtomicBool,
    reader: AtomicWaker,
}

impl Conn {
    fn times(&self) -> Times {
        Times {
            accepted: self.accepted,
            last_answer: self.last_answer.load(Relaxed),
            receiving_since: self.receiving_since.load(Relaxed),
            in_flight: self.in_flight.load(Relaxed),
        }
    }

    fn close(&self) {
        self.closing.store(true, Relaxed);
        self.reader.wake();
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabels {
    server: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClosedLabels {
    server: &'static str,
    reason: &'static str,
}

/// Every open connection of the process, and the rules they live by.
pub struct Gate {
    limits: Limits,
    epoch: Instant,
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
    accept_warnings: Throttle,
    refusal_warnings: Throttle,
    connections: Family<ServerLabels, Gauge>,
    closed: Family<ClosedLabels, Counter>,
    accept_errors: Counter,
}

impl Gate {
    /// A gate whose series go into `registry`.
    pub fn new(limits: Limits, registry: &mut Registry) -> Gate {
        let gate = Gate {
            limits,
            epoch: Instant::now(),
            next_id: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
            accept_warnings: Throttle::new(LOG_EVERY),
            refusal_warnings: Throttle::new(LOG_EVERY),
            connections: Family::default(),
            closed: Family::default(),
            accept_errors: Counter::default(),
        };
        registry.register(
            "connections",
            "Connections open, by server (http, rls, rlqs)",
            gate.connections.clone(),
        );
        registry.register(
            "connections_closed",
            "Connections the service closed or refused, by server and reason (header_timeout, \
             idle_timeout, shed, refused)",
            gate.closed.clone(),
        );
        registry.register(
            "accept_errors",
            "Connections that could not be accepted (out of file descriptors)",
            gate.accept_errors.clone(),
        );
        gate
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The next connection of `listener` that the gate lets in. Never fails: accept errors are
    /// logged (throttled) and accepting goes on.
    pub async fn accept(self: &Arc<Self>, listener: &TcpListener, server: Server) -> Tracked {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    if let Some(tracked) = self.admit(stream, server) {
                        return tracked;
                    }
                }
                Err(failure) => self.accept_failed(&failure).await,
            }
        }
    }

    /// Tracks `stream`, shedding an idle connection if the gate is full; `None` if every one
    /// is busy (the stream is closed at once).
    fn admit(self: &Arc<Self>, stream: TcpStream, server: Server) -> Option<Tracked> {
        // Small answers are sent at once.
        let _ = stream.set_nodelay(true);
        let mut open = self.lock();
        let live = open.values().filter(|c| !c.closing.load(Relaxed)).count();
        if live >= self.limits.max_connections && !self.shed_one(&open) {
            drop(open);
            self.count_closed(server, Reason::Refused);
            if let Some(others) = self.refusal_warnings.pass() {
                let max = self.limits.max_connections;
                warn!(
                    max,
                    others,
                    "refused a connection: every one of --max-connections has a request in flight"
                );
            }
            return None;
        }
        let id = self.next_id.fetch_add(1, Relaxed);
        let conn = Arc::new(Conn {
            server,
            accepted: self.now_ms(),
            last_answer: AtomicU64::new(0),
            receiving_since: AtomicU64::new(0),
            in_flight: AtomicU32::new(0),
            closing: AtomicBool::new(false),
            reader: AtomicWaker::new(),
        });
        open.insert(id, Arc::clone(&conn));
        drop(open);
        self.gauge(server).inc();
        Some(Tracked {
            stream,
            conn,
            id,
            gate: Arc::clone(self),
        })
    }

    /// Closes the idle connection least recently active, if there is one.
    fn shed_one(&self, open: &HashMap<u64, Arc<Conn>>) -> bool {
        let candidates = (open.iter())
            .filter(|(_, c)| !c.closing.load(Relaxed))
            .map(|(&id, c)| (id, c.times()));
        let Some(conn) = to_shed(candidates).and_then(|id| open.get(&id)) else {
            return false;
        };
        conn.close();
        self.count_closed(conn.server, Reason::Shed);
        true
    }

    async fn accept_failed(&self, failure: &io::Error) {
        self.accept_errors.inc();
        let exhausted = matches!(
            rustix::io::Errno::from_io_error(failure),
            Some(rustix::io::Errno::MFILE | rustix::io::Errno::NFILE)
        );
        if let Some(others) = self.accept_warnings.pass() {
            warn!(error = %failure, others, "accept failed");
        }
        if exhausted {
            self.shed_one(&self.lock());
            tokio::time::sleep(EXHAUSTED_PAUSE).await;
        }
    }

    /// Closes the connections whose deadline passed, every `REAP_EVERY`, for ever.
    pub async fn enforce_deadlines(self: Arc<Self>) {
        loop {
            tokio::time::sleep(REAP_EVERY).await;
            let now = self.now_ms();
            let open = self.lock();
            for conn in open.values().filter(|c| !c.closing.load(Relaxed)) {
                if let Some(reason) = conn.times().expired(now, &self.limits) {
                    conn.close();
                    self.count_closed(conn.server, reason);
                }
            }
        }
    }

    fn forget(&self, id: u64, server: Server) {
        self.lock().remove(&id);
        self.gauge(server).dec();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn gauge(&self, server: Server) -> impl std::ops::Deref<Target = Gauge> + '_ {
        let labels = ServerLabels {
            server: server.name(),
        };
        self.connections.get_or_create(&labels)
    }

    fn count_closed(&self, server: Server, reason: Reason) {
        let labels = ClosedLabels {
            server: server.name(),
            reason: reason.name(),
        };
        self.closed.get_or_create(&labels).inc();
    }

    /// Never 0, which `Times` reads as never.
    fn now_ms(&self) -> u64 {
        ms(self.epoch.elapsed()).saturating_add(1)
    }
}

/// An accepted socket, tracked by the gate until it is dropped; reading it ends once the gate
/// closes it. `activity` is how its server says when a request is being answered.
pub struct Tracked {
    stream: TcpStream,
    conn: Arc<Conn>,
    id: u64,
    gate: Arc<Gate>,
}

impl Tracked {
    pub fn activity(&self) -> Activity {
        Activity {
            conn: Arc::clone(&self.conn),
            gate: Arc::clone(&self.gate),
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.gate.forget(self.id, self.conn.server);
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.conn.reader.register(cx.waker());
        if this.conn.closing.load(Relaxed) {
            // The end of the stream: the server closes the connection as the client's own.
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        let conn = &this.conn;
        if buf.filled().len() > before
            && conn.server == Server::Http
            && conn.in_flight.load(Relaxed) == 0
        {
            let now = this.gate.now_ms();
            let _ = (conn.receiving_since).compare_exchange(0, now, Relaxed, Relaxed);
        }
        read
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.conn.closing.load(Relaxed) {
            return Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()));
        }
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// tonic hands this to every request of the connection (its request extensions).
impl tonic::transport::server::Connected for Tracked {
    type ConnectInfo = Activity;

    fn connect_info(&self) -> Activity {
        self.activity()
    }
}

/// A handle on a connection's activity, for its server.
#[derive(Clone)]
pub struct Activity {
    conn: Arc<Conn>,
    gate: Arc<Gate>,
}

impl Activity {
    /// Marks a request as being answered until the guard drops: no deadline closes the
    /// connection meanwhile, nor does shedding.
    /// The guard owns its handle, so a stream (a health `Watch`) can keep it.
    pub fn answering(&self) -> Answering {
        self.conn.in_flight.fetch_add(1, Relaxed);
        self.conn.receiving_since.store(0, Relaxed);
        Answering(self.clone())
    }
}

/// A request being answered (`Activity::answering`).
pub struct Answering(Activity);

impl Drop for Answering {
    fn drop(&mut self) {
        let Activity { conn, gate } = &self.0;
        conn.last_answer.store(gate.now_ms(), Relaxed);
        conn.in_flight.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_connections: 4,
        header_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(120),
    };

    fn times(accepted: u64, last_answer: u64, receiving_since: u64, in_flight: u32) -> Times {
        Times {
            accepted,
            last_answer,
            receiving_since,
            in_flight,
        }
    }

    #[test]
    fn a_connection_without_a_request_goes_at_the_header_deadline() {
        let fresh = times(1_000, 0, 0, 0);
        assert_eq!(fresh.expired(11_000, &LIMITS), None);
        assert_eq!(fresh.expired(11_001, &LIMITS), Some(Reason::HeaderTimeout));
        let trickling = times(1_000, 5_000, 6_000, 0);
        assert_eq!(trickling.expired(16_000, &LIMITS), None);
        assert_eq!(
            trickling.expired(16_001, &LIMITS),
            Some(Reason::HeaderTimeout)
        );
    }

    #[test]
    fn an_answered_connection_goes_when_idle_and_a_busy_one_never() {
        let pooled = times(1_000, 5_000, 0, 0);
        assert_eq!(pooled.expired(125_000, &LIMITS), None);
        assert_eq!(pooled.expired(125_001, &LIMITS), Some(Reason::IdleTimeout));
        let holding = times(1_000, 0, 2_000, 1);
        assert_eq!(holding.expired(1_000_000, &LIMITS), None);
    }

    #[test]
    fn the_idle_connection_that_did_least_for_longest_is_shed_first() {
        let open = [
            (1, times(10, 900, 0, 0)),
            (2, times(20, 0, 30, 0)),
            (3, times(5, 0, 0, 1)),
            (4, times(800, 0, 0, 0)),
        ];
        assert_eq!(to_shed(open.into_iter()), Some(2));
        let busy = [(1, times(10, 0, 0, 1)), (2, times(20, 30, 0, 2))];
        assert_eq!(to_shed(busy.into_iter()), None);
    }

    #[test]
    fn the_default_cap_leaves_descriptors_for_the_rest() {
        let cap = default_max_connections() as u64;
        assert!((16..=MAX_DEFAULT_CONNECTIONS).contains(&cap), "{cap}");
    }
}
