//! The proxy-wasm glue: the only module that talks to Envoy. It implements `Host` and
//! `Metrics` over hostcalls and maps the filter's verdicts to Envoy's actions.

use crate::config::GrpcStatus;
use crate::config::{GlobalService, Protocol, Secret};
use crate::core::request::{RequestSource, Snapshot, BODY_BYTES};
use crate::core::usage::request::asks_stream_usage_on;
use crate::filter::{Admitted, Filter, OverridesCall, Reported, Route, Verdict};
use crate::host::{Environment, Host};
use crate::limiter::tab::Ending;
use crate::limiter::Pending;
use crate::output::access_log;
use crate::output::metrics::{count_config_error, Metrics};
use crate::output::reply::{self, LocalReply};
use crate::remote::announce::{self, Announcer};
use crate::remote::outbox::{self, Batch, Delivery, Outbox};
use crate::remote::overrides::Answer;
use crate::response::Response;
use crate::state::hold::HoldQueue;
use crate::state::store::{Store, StoreError};
use crate::wire::admin;
use crate::wire::protocol::{self, Settlement};
use crate::wire::rls;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType, Status};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

/// Counters reach Envoy's stats at most this late.
const COUNTER_FLUSH_PERIOD: Duration = Duration::from_secs(1);
/// Refused settlements are logged at most this often.
const MINUTE: u64 = 60 * 1_000_000_000;
/// How often held requests are looked at: the timing precision of a leaky bucket.
const HOLD_TICK: Duration = Duration::from_millis(5);
/// How often the outbox is sent while a policy settles with sluice-service: a global slot is
/// free again about this long after its request ends, whatever the rate of requests.
const SETTLE_TICK: Duration = Duration::from_millis(20);

thread_local! {
    /// The admitted requests of this VM (one worker) that owe their policies something when they
    /// end, by context: held here rather than by a root context, so that a request admitted
    /// under a configuration since replaced is still renewed and settled under its own.
    static LIVE: RefCell<HashMap<u32, (Rc<Filter>, Response)>> = RefCell::default();
    /// What this VM's requests owe global policies, sent from the timers of its root contexts.
    static OUTBOX: RefCell<Outbox> = RefCell::default();
    /// Who this VM is, said to the service now and then (`announce`); made at the first
    /// configuration, which reads the node id.
    static ANNOUNCER: RefCell<Option<Announcer>> = const { RefCell::new(None) };
}

/// `f` of this VM's announcer, once it is made.
fn with_announcer<T>(f: impl FnOnce(&mut Announcer) -> T) -> Option<T> {
    ANNOUNCER.with(|a| Some(f(a.try_borrow_mut().ok()?.as_mut()?)))
}

/// The headers that say who calls, when this call is to carry them (`Announcer::take`).
fn announcement() -> Option<announce::Headers> {
    with_announcer(Announcer::take).flatten()
}

/// Adds `announced`'s headers to a call's.
fn with_announcement<'a>(
    headers: &mut Vec<(&'a str, &'a str)>,
    announced: &'a Option<announce::Headers>,
) {
    headers.extend(announced.iter().flatten().map(|(n, v)| (*n, v.as_str())));
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| Box::new(Root::default()));
}}

// ABI calls the SDK wraps without their arguments we need (the response code details, the
// gRPC status) or with a panic on a status it does not expect (a header map the host no longer
// shows, once a request's headers have gone on); a panic would kill the VM.
#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_get_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_pairs(
        map_type: u32,
        return_map_data: *mut *mut u8,
        return_map_size: *mut usize,
    ) -> u32;
    fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    fn proxy_send_local_response(
        status_code: u32,
        details_data: *const u8,
        details_size: usize,
        body_data: *const u8,
        body_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_set_property(
        path_data: *const u8,
        path_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(map_type: u32, key_data: *const u8, key_size: usize) -> u32;
}

/// What a host call that hands back bytes returned: the bytes on `Ok`, `None` on any other
/// status (absent, or not shown here).
///
/// SAFETY: `call` must be such a host call, writing through the two pointers it is given a
/// buffer the host allocated with this module's allocator (as the ABI says), or nothing.
unsafe fn returned_bytes(call: impl FnOnce(*mut *mut u8, *mut usize) -> u32) -> Option<Vec<u8>> {
    let mut data: *mut u8 = std::ptr::null_mut();
    let mut size: usize = 0;
    if call(&mut data, &mut size) != 0 {
        return None;
    }
    if data.is_null() {
        return Some(Vec::new());
    }
    // SAFETY: the host allocated `size` bytes at `data` for us, as the ABI says.
    Some(unsafe { Vec::from_raw_parts(data, size, size) })
}

/// A header of `map`, or `None` when it is absent or the host no longer shows the map.
fn map_value(map: MapType, name: &str) -> Option<Vec<u8>> {
    // SAFETY: `proxy_get_header_map_value` returns a buffer as `returned_bytes` needs; the name
    // is a live buffer of the size passed.
    unsafe {
        returned_bytes(|data, size| {
            proxy_get_header_map_value(map as u32, name.as_ptr(), name.len(), data, size)
        })
    }
}

/// Narrows the request's `accept-encoding` to the codings sluice decodes, so that the usage of
/// the answer can be read (`usage::decode::narrow_accept_encoding`): one read, and a write only
/// when something goes (the header replaced, or removed when nothing is left). Only while the
/// request's headers have not gone on; a write the host refuses changes nothing.
fn narrow_accept_encoding() {
    const NAME: &str = "accept-encoding";
    let map = MapType::HttpRequestHeaders as u32;
    let Some(value) = map_value(MapType::HttpRequestHeaders, NAME) else {
        return;
    };
    let narrowed = crate::core::usage::decode::narrow_accept_encoding(&value);
    // SAFETY: every pointer is to a live buffer of the size passed with it; the host copies them.
    let status = unsafe {
        match narrowed {
            Some(kept) if kept == value => return,
            Some(kept) => proxy_replace_header_map_value(
                map,
                NAME.as_ptr(),
                NAME.len(),
                kept.as_ptr(),
                kept.len(),
            ),
            None => proxy_remove_header_map_value(map, NAME.as_ptr(), NAME.len()),
        }
    };
    if status != 0 {
        log::debug!("could not narrow accept-encoding: status {status}");
    }
}

/// The `:status` of a callout's answer with `headers` headers: `None` without headers (the call
/// failed: timeout, reset, no healthy endpoint) or without a number there.
fn call_status<T: std::str::FromStr>(headers: usize) -> Option<T> {
    if headers == 0 {
        return None;
    }
    let status = map_value(MapType::HttpCallResponseHeaders, ":status")?;
    std::str::from_utf8(&status).ok()?.parse().ok()
}

/// Envoy, as the filter sees it. Failed hostcalls read as absent values or failed writes.
struct Envoy;

impl RequestSource for Envoy {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        map_value(MapType::HttpRequestHeaders, name)
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        // The path's parts joined by NULs, as the ABI serializes it.
        let serialized = path.join("\0");
        // SAFETY: as in `map_value`.
        unsafe {
            returned_bytes(|data, size| {
                proxy_get_property(serialized.as_ptr(), serialized.len(), data, size)
            })
        }
        .filter(|value| !value.is_empty())
    }
}

impl Store for Envoy {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        match hostcalls::get_shared_data(key) {
            Ok((value, Some(cas))) => Some((value.unwrap_or_default(), cas)),
            _ => None,
        }
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        match hostcalls::set_shared_data(key, Some(value), Some(cas)) {
            Ok(()) => Ok(()),
            Err(Status::CasMismatch) => Err(StoreError::CasMismatch),
            Err(_) => Err(StoreError::Failed),
        }
    }
}

impl Host for Envoy {
    fn now(&self) -> u64 {
        hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    fn send_response(&self, reply: &LocalReply) {
        let headers = reply.encoded_headers();
        // SAFETY: every pointer is to a live buffer of the size passed with it; the host copies
        // them before returning.
        let status = unsafe {
            proxy_send_local_response(
                reply.status,
                reply.details.as_ptr(),
                reply.details.len(),
                reply.body.as_ptr(),
                reply.body.len(),
                headers.as_ptr(),
                headers.len(),
                reply.grpc_status.code(),
            )
        };
        if status != 0 {
            log::error!("could not send the local reply: status {status}");
        }
    }

    fn record(&self, record: &str) {
        self.publish(access_log::PROPERTY, record);
    }

    fn response_headers(&self) -> Vec<(String, Vec<u8>)> {
        let map = MapType::HttpResponseHeaders as u32;
        // SAFETY: `proxy_get_header_map_pairs` returns a buffer as `returned_bytes` needs.
        let pairs =
            unsafe { returned_bytes(|data, size| proxy_get_header_map_pairs(map, data, size)) };
        pairs.map_or_else(Vec::new, |bytes| crate::host::header_pairs(&bytes))
    }

    fn response_trailer(&self, name: &str) -> Option<Vec<u8>> {
        map_value(MapType::HttpResponseTrailers, name)
    }

    fn publish(&self, name: &str, value: &str) {
        // SAFETY: both pointers are to live buffers of the sizes passed; the host copies them.
        let status =
            unsafe { proxy_set_property(name.as_ptr(), name.len(), value.as_ptr(), value.len()) };
        if status != 0 {
            log::debug!("could not set filter state {name}: status {status}");
        }
    }

    fn report(&self, service: &GlobalService, settlement: Settlement) {
        let now = self.now();
        OUTBOX.with(|outbox| {
            if let Ok(mut outbox) = outbox.try_borrow_mut() {
                outbox.push(service, settlement, now);
            }
        });
    }

    fn dispatch(&self, service: &GlobalService, body: &[u8]) -> bool {
        let timeout = Duration::from_millis(service.timeout_ms);
        let authorization = service.authorization.as_ref().map(Secret::expose);
        match &service.protocol {
            Protocol::Sluice { path } => {
                let mut headers = vec![
                    (":method", "POST"),
                    (":path", path.as_str()),
                    (":authority", service.authority.as_str()),
                    ("content-type", "application/json"),
                ];
                headers.extend(authorization.map(|value| ("authorization", value)));
                let announced = announcement();
                with_announcement(&mut headers, &announced);
                let cluster = &service.cluster;
                hostcalls::dispatch_http_call(cluster, headers, Some(body), vec![], timeout).is_ok()
            }
            Protocol::Rls { grpc_service, .. } => {
                // The cluster as a serialized GrpcService, which the SDK passes as a string.
                let Ok(upstream) = std::str::from_utf8(grpc_service) else {
                    return false;
                };
                let metadata: Vec<(&str, &[u8])> = authorization
                    .map(|value| ("authorization", value.as_bytes()))
                    .into_iter()
                    .collect();
                let (service_name, method) = (rls::SERVICE, rls::METHOD);
                hostcalls::dispatch_grpc_call(
                    upstream,
                    service_name,
                    method,
                    metadata,
                    Some(body),
                    timeout,
                )
                .is_ok()
            }
        }
    }
}

impl Envoy {
    /// POSTs a batch of settlements to its service: the host's token for the call.
    fn settle(batch: &Batch) -> Option<u32> {
        let service = batch.service;
        let path = service.protocol.settle_path()?;
        let body = protocol::encode_settlements(&batch.settlements);
        let mut headers = vec![
            (":method", "POST"),
            (":path", path.as_str()),
            (":authority", service.authority.as_str()),
            ("content-type", "application/json"),
        ];
        let authorization = service.authorization.as_ref().map(Secret::expose);
        headers.extend(authorization.map(|value| ("authorization", value)));
        let announced = announcement();
        with_announcement(&mut headers, &announced);
        let timeout = Duration::from_nanos(crate::remote::outbox::CALL_TIMEOUT);
        hostcalls::dispatch_http_call(&service.cluster, headers, Some(&body), vec![], timeout).ok()
    }
}

impl Envoy {
    /// GETs the overrides' listing from the service (`Filter::overrides_tick`).
    fn pull_overrides(call: &OverridesCall) -> Option<u32> {
        let service = call.service;
        let mut headers = vec![
            (":method", "GET"),
            (":path", call.path),
            (":authority", service.authority.as_str()),
        ];
        if let Some(version) = &call.if_none_match {
            headers.push(("if-none-match", version.as_str()));
        }
        let authorization = service.authorization.as_ref().map(Secret::expose);
        headers.extend(authorization.map(|value| ("authorization", value)));
        let announced = announcement();
        with_announcement(&mut headers, &announced);
        let timeout = Duration::from_nanos(crate::remote::overrides::CALL_TIMEOUT);
        hostcalls::dispatch_http_call(&service.cluster, headers, None, vec![], timeout).ok()
    }
}

/// What the service answered a pull of the overrides: a body past the filter's bound is not
/// read.
fn overrides_answer(filter: &Filter, headers: usize, body: usize) -> Answer {
    match call_status::<u32>(headers) {
        Some(200) if body > filter.overrides_body_limit() => Answer::TooLarge(body),
        Some(200) => {
            let listing = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body);
            Answer::Listing(listing.ok().flatten().unwrap_or_default())
        }
        Some(304) => Answer::Unchanged,
        other => Answer::Failed(other),
    }
}

impl Environment for Envoy {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }

    fn random(&self) -> Option<[u8; 16]> {
        let mut bytes = [0; 16];
        getrandom::fill(&mut bytes).ok()?;
        Some(bytes)
    }
}

impl Metrics for Envoy {
    fn define_counter(&self, name: &str) -> Option<u32> {
        hostcalls::define_metric(MetricType::Counter, name).ok()
    }

    fn increment(&self, id: u32, by: u64) {
        let _ = hostcalls::increment_metric(id, i64::try_from(by).unwrap_or(i64::MAX));
    }

    fn define_gauge(&self, name: &str) -> Option<u32> {
        hostcalls::define_metric(MetricType::Gauge, name).ok()
    }

    fn adjust(&self, id: u32, by: i64) {
        let _ = hostcalls::increment_metric(id, by);
    }

    fn set(&self, id: u32, value: u64) {
        let _ = hostcalls::record_metric(id, value);
    }
}

/// Whether Envoy holds a request's headers while the filter reads its body. It does when the
/// plugin sets `allow_on_headers_stop_iteration` (Envoy 1.35 and later): then no request reaches
/// the upstream before every policy decided. Without it, pausing at the headers stops the body
/// too and no body callback comes; the filter finds out from the first such request (its bytes
/// received grow while no body reaches it), says so in Envoy's log, and lets headers go ahead of
/// the decision from then on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum HeadersHold {
    #[default]
    Unknown,
    Works,
    Blocked,
}

/// What a plugin knows of `HeadersHold`, and the requests paused at their headers while it does
/// not know: each with the bytes Envoy had received of it then.
#[derive(Debug, Default)]
struct BodyWait {
    hold: HeadersHold,
    probes: Vec<(u32, u64)>,
}

impl BodyWait {
    /// A body callback came to a request paused at its headers: Envoy holds headers.
    fn body_came(&mut self) {
        if self.hold == HeadersHold::Unknown {
            self.hold = HeadersHold::Works;
            self.probes.clear();
        }
    }

    /// Looks at the requests paused at their headers while `hold` is unknown: if Envoy received
    /// more of one without a body callback, it cannot hold headers; the paused requests go on.
    fn probe(&mut self) {
        if self.hold != HeadersHold::Unknown || self.probes.is_empty() {
            return;
        }
        let grew = self.probes.iter().any(|&(context, size)| {
            hostcalls::set_effective_context(context).is_ok() && received() > size
        });
        if !grew {
            return;
        }
        self.hold = HeadersHold::Blocked;
        log::error!(
            "requests whose body a policy reads go upstream before their decision: set \
             allow_on_headers_stop_iteration: true in the wasm filter's config (Envoy 1.35+)"
        );
        for (context, _) in self.probes.drain(..) {
            if hostcalls::set_effective_context(context).is_ok() {
                let _ = hostcalls::resume_http_request();
            }
        }
    }
}

/// The bytes Envoy received of the current request so far, headers included.
fn received() -> u64 {
    let size = Envoy
        .property(&["request", "total_size"])
        .unwrap_or_default();
    let bytes: [u8; 8] = size
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .unwrap_or_default();
    u64::from_le_bytes(bytes)
}

#[derive(Default)]
struct Root {
    filter: Option<Rc<Filter>>,
    held: Rc<RefCell<HoldQueue>>,
    body_wait: Rc<RefCell<BodyWait>>,
    /// When the once-a-second chores last ran: renewals and the counters' flush.
    last_second: u64,
    /// When refused settlements were last logged (`log_refused_settlements`).
    last_rejection_log: u64,
    /// The pull of the overrides under way (`Filter::overrides_tick`), by its call's token.
    overrides_call: Option<u32>,
}

impl Context for Root {
    /// A batch of settlements answered (`flush_outbox`): delivered on a 2xx (but those its body
    /// says the service refused), refused on a 4xx, else failed (`Delivery::of`). A full batch
    /// waiting behind it goes at once, so a worker's releases keep up with any rate the service
    /// answers.
    fn on_http_call_response(&mut self, token: u32, headers: usize, body: usize, _: usize) {
        if self.overrides_call == Some(token) {
            self.overrides_call = None;
            if let Some(filter) = &self.filter {
                filter.overrides_answered(&Envoy, overrides_answer(filter, headers, body));
            }
            return;
        }
        let status = call_status::<u32>(headers);
        let delivered = status.is_some_and(|s| (200..300).contains(&s));
        let rejected = match status {
            Some(200..=299) if body > 0 => {
                let answer = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body);
                outbox::rejected_in(&answer.ok().flatten().unwrap_or_default())
            }
            _ => 0,
        };
        let delivery = Delivery::of(status, rejected);
        if delivery != (Delivery::Delivered { rejected: 0 }) && delivery != Delivery::Failed {
            self.log_refused_settlements(status, rejected);
        }
        let now = Envoy.now();
        let backlog = OUTBOX.with(|outbox| {
            let Ok(mut outbox) = outbox.try_borrow_mut() else {
                return false;
            };
            outbox.answered(token, delivery, now);
            outbox.has_full_batch()
        });
        if delivered && backlog {
            flush_outbox(self.filter.as_deref());
        }
    }
}

impl Root {
    /// Settlements the service refused: logged once a minute at most (the counter
    /// `sluice.settlements_rejected` counts each).
    fn log_refused_settlements(&mut self, status: Option<u32>, rejected: u64) {
        let now = Envoy.now();
        if self.last_rejection_log != 0 && now < self.last_rejection_log.saturating_add(MINUTE) {
            return;
        }
        self.last_rejection_log = now;
        match status {
            Some(200..=299) => log::warn!(
                "sluice-service refused {rejected} settlements of a batch and applied the others; they are dropped (its log names why: settlements rejected)"
            ),
            Some(status) => log::warn!(
                "sluice-service refused a batch of settlements with status {status}; it is dropped, never sent again (its log names why)"
            ),
            None => {}
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        if let Ok(level) = hostcalls::get_log_level() {
            proxy_wasm::set_log_level(level);
        }
        let json = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
            .ok()
            .flatten()
            .unwrap_or_default();
        ANNOUNCER.with(|a| {
            if let Ok(mut announcer) = a.try_borrow_mut() {
                announcer.get_or_insert_with(|| {
                    // Envoy's attribute `xds.node` (in Envoy 1.40 a bare `node` answers nothing).
                    let node_id = Envoy.property(&["xds", "node", "id"]).unwrap_or_default();
                    let worker = std::collections::hash_map::RandomState::new();
                    Announcer::new(&node_id, std::hash::BuildHasher::hash_one(&worker, 0u8))
                });
            }
        });
        let plugin = Envoy
            .property(&["plugin_name"])
            .and_then(|name| String::from_utf8(name).ok())
            .unwrap_or_else(|| "sluice".into());
        match Filter::configure(&json, &plugin, &Envoy, &Envoy, &Envoy) {
            Ok(filter) => {
                log::info!(
                    "plugin {plugin} configured, version {}, {} policies",
                    filter.plan().version,
                    filter.plan().policies.len()
                );
                let tick = if filter.shapes_traffic() {
                    HOLD_TICK
                } else if filter.settles() {
                    SETTLE_TICK
                } else {
                    COUNTER_FLUSH_PERIOD
                };
                if let Some(old) = &self.filter {
                    filter.succeed(old);
                }
                if let Some(old) = self.filter.replace(Rc::new(filter)) {
                    old.forget_debts();
                    old.flush_counters(&Envoy);
                }
                let _ = hostcalls::set_tick_period(tick);
                true
            }
            Err(error) => {
                log::error!("invalid configuration: {error}");
                count_config_error(&Envoy);
                false
            }
        }
    }

    fn on_tick(&mut self) {
        let now = Envoy.now();
        let flush_period = COUNTER_FLUSH_PERIOD.as_nanos() as u64;
        // Once a second, however fast the timer: renewals are due every half lease (2 s at
        // least), and looking for them or for debts paid back costs a hostcall per request or key.
        // A tick a little early counts: Envoy's 1 s timer fires about 998 ms apart by this
        // clock, which made these chores run every other second.
        let early = flush_period / 10;
        let second = now.saturating_add(early) >= self.last_second.saturating_add(flush_period);
        if second {
            renew_live();
            with_announcer(|announcer| announcer.tick(now));
        }
        flush_outbox(self.filter.as_deref());
        if let Ok(mut wait) = self.body_wait.try_borrow_mut() {
            wait.probe();
        }
        for context in self.held.borrow_mut().due(now) {
            if hostcalls::set_effective_context(context).is_ok() {
                let _ = hostcalls::resume_http_request();
            }
        }
        if second {
            if let Some(filter) = self.filter.clone() {
                filter.review_debts(&Envoy);
                if let Some(call) = filter.overrides_tick(&Envoy, &Envoy) {
                    match Envoy::pull_overrides(&call) {
                        Some(token) => self.overrides_call = Some(token),
                        None => filter.overrides_not_sent(&Envoy),
                    }
                }
                filter.publish_top(&Envoy);
                filter.flush_counters(&Envoy);
            }
            self.last_second = now;
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Exchange {
            id: context_id,
            filter: self.filter.clone(),
            held: self.held.clone(),
            body_wait: self.body_wait.clone(),
            reported: None,
            pending: None,
            completed: false,
            live: false,
            awaiting_body: None,
            awaiting_admin: false,
            headers_held: false,
            stream_path: false,
            chunked: false,
            body: None,
            denied: false,
            headers_sent: false,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Sends what this VM's outbox holds, and counts what it delivered and dropped on `filter`'s
/// counters (the configuration of the root context whose timer this is).
fn flush_outbox(filter: Option<&Filter>) {
    OUTBOX.with(|outbox| {
        let Ok(mut outbox) = outbox.try_borrow_mut() else {
            return;
        };
        if !outbox.is_idle() {
            outbox.flush(Envoy.now(), |batch| Envoy::settle(&batch));
        }
        let counts = outbox.take_counts();
        with_announcer(|announcer| announcer.dropped(counts.dropped));
        if let Some(filter) = filter {
            filter.counters().settlements(counts);
        }
    });
}

/// Renews the slots of this VM's live requests (`Response::renew`: only those behind).
fn renew_live() {
    LIVE.with(|live| {
        let Ok(mut live) = live.try_borrow_mut() else {
            return;
        };
        for (filter, response) in live.values_mut().filter(|(_, r)| r.holds_slots()) {
            response.renew(filter.as_ref(), &Envoy);
        }
    });
}

/// One HTTP request and its response.
struct Exchange {
    id: u32,
    filter: Option<Rc<Filter>>,
    held: Rc<RefCell<HoldQueue>>,
    reported: Option<Reported>,
    /// Set while the request waits for the rate-limit service.
    pending: Option<Pending>,
    /// The response reached its end of stream: the request completed.
    completed: bool,
    /// Whether it has a live response in `LIVE` (most requests have none: no lookup then).
    live: bool,
    body_wait: Rc<RefCell<BodyWait>>,
    /// The request is decided once its body has come (`Filter::reads_body`), from this
    /// snapshot of its headers.
    awaiting_body: Option<Snapshot>,
    /// Its headers wait for the decision with its body (`HeadersHold`): they can still change.
    headers_held: bool,
    /// Its path is one where `ask_stream_usage` applies (`usage::request::asks_stream_usage_on`).
    stream_path: bool,
    /// Its headers went ahead without a `content-length`, so that its body may change.
    chunked: bool,
    /// Its body, kept while the decision waits for the service when it may be rewritten.
    body: Option<Vec<u8>>,
    /// A local reply refused it.
    denied: bool,
    /// Its headers went on before its decision (to wait for its body): they cannot change then.
    headers_sent: bool,
    /// A call to the admin path, waiting for its body.
    awaiting_admin: bool,
}

impl Exchange {
    /// Maps a verdict to Envoy's action; `held` says whether the request is paused already.
    fn act(&mut self, verdict: Verdict, held: bool) -> Action {
        match verdict {
            Verdict::Continue(admitted) => {
                self.admit(admitted);
                if held {
                    let _ = hostcalls::resume_http_request();
                }
                Action::Continue
            }
            Verdict::Denied => {
                self.denied = true;
                Action::Pause
            }
            Verdict::Waiting(pending) => {
                self.pending = Some(pending);
                Action::Pause
            }
            Verdict::Hold { delay, admitted } => {
                self.admit(admitted);
                let release_at = Envoy.now().saturating_add(delay);
                self.held.borrow_mut().hold(release_at, self.id);
                Action::Pause
            }
        }
    }
}

impl Exchange {
    /// Keeps what an admitted request takes with it until its response and its end.
    fn admit(&mut self, admitted: Admitted) {
        self.ask_stream_usage(&admitted);
        self.reported = admitted.reported;
        let metered = |filter: &Filter| filter.meters_body(admitted.tab.as_ref());
        if !self.headers_sent && self.filter.as_deref().is_some_and(metered) {
            narrow_accept_encoding();
        }
        if let (Some(filter), Some(tab)) = (&self.filter, admitted.tab) {
            let response = Response::new(tab, admitted.record);
            if let Some(record) = response.record_if_reset(filter.as_ref()) {
                Envoy.record(&record);
            }
            let live = (filter.clone(), response);
            LIVE.with(|l| l.borrow_mut().insert(self.id, live));
            self.live = true;
        }
    }

    /// Runs `f` on this request's live response, if it has one.
    fn with_response<T>(&self, f: impl FnOnce(&Filter, &mut Response) -> T) -> Option<T> {
        if !self.live {
            return None;
        }
        LIVE.with(|live| {
            let mut live = live.try_borrow_mut().ok()?;
            let (filter, response) = live.get_mut(&self.id)?;
            Some(f(filter, response))
        })
    }

    /// The request ended: what it owed is settled, once.
    fn end(&mut self) {
        if !std::mem::take(&mut self.live) {
            return;
        }
        let ended = LIVE.with(|live| live.try_borrow_mut().ok()?.remove(&self.id));
        if let Some((filter, response)) = ended {
            let ending = if self.completed {
                Ending::Completed
            } else {
                Ending::Reset
            };
            response.end(filter.as_ref(), &Envoy, ending);
        }
    }

    /// The response reached its end of stream.
    fn complete(&mut self) {
        self.completed = true;
        self.end();
    }

    /// Whether the request stays stopped where the filter stopped it: refused, waiting for the
    /// service, or held for its turn. Envoy (holding headers) still passes its body and
    /// trailers as they come; they must wait too.
    fn stopped(&self) -> bool {
        self.denied || self.pending.is_some() || self.held.borrow().holds(self.id)
    }

    /// Answers an admin call with its body (buffered by Envoy; one past the bound is refused).
    fn answer_admin(&mut self) -> Action {
        self.awaiting_admin = false;
        let Some(filter) = self.filter.clone() else {
            return Action::Pause;
        };
        let body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, admin::MAX_BODY_BYTES + 1)
            .ok()
            .flatten()
            .unwrap_or_default();
        let verdict = filter.answer_admin(&Envoy, &body);
        self.act(verdict, false)
    }

    /// Decides a request whose decision waited for its whole body (buffered by Envoy).
    fn decide_with_body(&mut self, filter: &Filter) -> Action {
        let snapshot = self.awaiting_body.take().unwrap_or_default();
        let body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, BODY_BYTES + 1)
            .ok()
            .flatten()
            .unwrap_or_default();
        if body.len() > BODY_BYTES {
            filter.refuse_body(&Envoy, 413, reply::BODY_TOO_LARGE, "request_body_too_large");
            return Action::Pause;
        }
        let verdict = filter.on_request_body(&Envoy, snapshot, &body);
        if self.stream_path {
            self.body = Some(body);
        }
        self.act(verdict, false)
    }

    /// Rewrites the body of an admitted request that a policy asks a stream for its usage of
    /// (`Filter::stream_usage_body`): the body is Envoy's buffered one, whenever the decision
    /// came (at once, or after a call to the service).
    fn ask_stream_usage(&mut self, admitted: &Admitted) {
        let (Some(filter), Some(body)) = (&self.filter, self.body.take()) else {
            return;
        };
        let Some(new) = filter.stream_usage_body(admitted.tab.as_ref(), &body) else {
            return;
        };
        let _ = hostcalls::set_buffer(BufferType::HttpRequestBody, 0, body.len(), &new);
        if self.headers_held {
            let length = new.len().to_string();
            let _ = hostcalls::set_map_value(
                MapType::HttpRequestHeaders,
                "content-length",
                Some(length.as_str()),
            );
        }
    }
}

impl Context for Exchange {
    fn on_done(&mut self) -> bool {
        self.held.borrow_mut().drop_context(self.id);
        // Ended while its check was under way (a reset, a worker stopping): the service may take
        // the slots it named, now or when the check comes; they are given back.
        if let (Some(filter), Some(pending)) = (&self.filter, self.pending.take()) {
            filter.abandon(&Envoy, pending);
        }
        if let Ok(mut wait) = self.body_wait.try_borrow_mut() {
            wait.probes.retain(|&(context, _)| context != self.id);
        }
        self.end();
        true
    }

    fn on_grpc_call_response(&mut self, _token: u32, status: u32, size: usize) {
        let (Some(filter), Some(pending)) = (self.filter.clone(), self.pending.take()) else {
            return;
        };
        let body = hostcalls::get_buffer(BufferType::GrpcReceiveBuffer, 0, size)
            .ok()
            .flatten()
            .unwrap_or_default();
        let verdict = filter.on_service_response(&Envoy, pending, Some((status, body)));
        self.act(verdict, true);
    }

    fn on_http_call_response(&mut self, _token: u32, headers: usize, body_size: usize, _: usize) {
        let (Some(filter), Some(pending)) = (self.filter.clone(), self.pending.take()) else {
            return;
        };
        let status = call_status(headers);
        let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size)
            .ok()
            .flatten()
            .unwrap_or_default();
        let verdict = filter.on_service_response(&Envoy, pending, status.map(|s| (s, body)));
        self.act(verdict, true);
    }
}

impl HttpContext for Exchange {
    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        let Some(filter) = self.filter.clone() else {
            // Unreachable while Envoy honours a refused configuration; fail closed regardless.
            let body = r#"{"error":"rate_limiter_not_configured"}"#.into();
            let mut reply =
                LocalReply::new(503, reply::NOT_CONFIGURED, GrpcStatus::Unavailable, body);
            reply.add_header("content-type", "application/json");
            Envoy.send_response(&reply);
            return Action::Pause;
        };
        let route = filter.route(&Envoy);
        // An admin call is answered once its whole body has come (Envoy holds its headers).
        if route == Route::Admin {
            if end_of_stream || !filter.admin_authorized(&Envoy) {
                return self.act(filter.answer_admin(&Envoy, &[]), false);
            }
            self.awaiting_admin = true;
            return Action::Pause;
        }
        // The status path is answered from the headers, whatever body comes with it.
        if let (true, false, Route::Ordinary(path)) = (filter.reads_body(), end_of_stream, &route) {
            // The path the routing read, if it did, rather than a second read.
            self.stream_path = filter.rewrites_body()
                && match path {
                    Some(path) => asks_stream_usage_on(path),
                    None => Envoy
                        .header(":path")
                        .is_some_and(|path| asks_stream_usage_on(&path)),
                };
            self.awaiting_body = Some(filter.snapshot_routed(&Envoy, path.clone()));
            let Ok(mut wait) = self.body_wait.try_borrow_mut() else {
                return Action::Continue;
            };
            match wait.hold {
                HeadersHold::Blocked => {
                    // The headers go ahead; the body is held until the decision. A body that
                    // may grow goes chunked; the answer may be metered, so it comes in a coding
                    // sluice decodes.
                    self.headers_sent = true;
                    if filter.meters_bodies() {
                        narrow_accept_encoding();
                    }
                    if self.stream_path {
                        let _ = hostcalls::set_map_value(
                            MapType::HttpRequestHeaders,
                            "content-length",
                            None,
                        );
                        self.chunked = true;
                    }
                    return Action::Continue;
                }
                HeadersHold::Unknown => wait.probes.push((self.id, received())),
                HeadersHold::Works => {}
            }
            self.headers_held = true;
            return Action::Pause;
        }
        let verdict = filter.on_routed_headers(&Envoy, route);
        self.act(verdict, false)
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.stopped() {
            return Action::Pause;
        }
        if self.awaiting_admin {
            if !end_of_stream && body_size <= admin::MAX_BODY_BYTES {
                return Action::Pause;
            }
            return self.answer_admin();
        }
        let Some(filter) = self.filter.clone().filter(|_| self.awaiting_body.is_some()) else {
            return Action::Continue;
        };
        if let Ok(mut wait) = self.body_wait.try_borrow_mut() {
            // Headers let go when Envoy could not hold them can no longer change.
            self.headers_held &= wait.hold != HeadersHold::Blocked;
            self.headers_sent |= !self.headers_held;
            if self.headers_held {
                wait.body_came();
            }
        }
        // Headers let go with the body's length (found out too late) keep the body as sent.
        self.stream_path &= self.headers_held || self.chunked;
        if body_size > BODY_BYTES {
            filter.refuse_body(&Envoy, 413, reply::BODY_TOO_LARGE, "request_body_too_large");
            self.awaiting_body = None;
            return Action::Pause;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        self.decide_with_body(&filter)
    }

    fn on_http_request_trailers(&mut self, _trailers: usize) -> Action {
        if self.stopped() {
            return Action::Pause;
        }
        if self.awaiting_admin {
            return self.answer_admin();
        }
        match self.filter.clone().filter(|_| self.awaiting_body.is_some()) {
            Some(filter) => self.decide_with_body(&filter),
            None => Action::Continue,
        }
    }

    fn on_http_response_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        if let (Some(filter), Some(reported)) = (&self.filter, self.reported.take()) {
            filter.each_response_header(&reported, |name, value| {
                let _ = hostcalls::add_map_value(MapType::HttpResponseHeaders, name, value);
            });
        }
        self.with_response(|filter, response| response.on_headers(filter, &Envoy));
        if end_of_stream {
            self.complete();
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.with_response(|_, response| {
            if response.reads_body() && body_size > 0 {
                let chunk = hostcalls::get_buffer(BufferType::HttpResponseBody, 0, body_size);
                response.on_body(&chunk.ok().flatten().unwrap_or_default());
            }
        });
        if end_of_stream {
            self.complete();
        }
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, _trailers: usize) -> Action {
        self.with_response(|filter, response| response.on_trailers(filter, &Envoy));
        self.complete();
        Action::Continue
    }
}
