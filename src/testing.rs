//! Fakes of what the filter needs from Envoy, with Envoy's semantics: a request, and a whole host
//! (over `store::MemoryStore`). For the unit tests and, through the `testing` feature, the
//! micro-benchmarks and the other crates' tests. Test support: it panics on misuse.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use crate::config::GlobalService;
use crate::core::request::RequestSource;
use crate::core::route::envoy_map;
use crate::host::{Environment, Host};
use crate::output::metrics::Metrics;
use crate::output::reply::LocalReply;
use crate::state::store::{MemoryStore, Store, StoreError};
use crate::wire::protocol::Settlement;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;

/// A request, counting how often the host is asked. Properties are keyed by their path joined
/// with dots (`source.address`).
#[derive(Default)]
pub struct FakeRequest {
    pub headers: HashMap<String, Vec<u8>>,
    pub properties: HashMap<String, Vec<u8>>,
    pub reads: Cell<usize>,
}

impl FakeRequest {
    pub fn new(headers: &[(&str, &str)]) -> Self {
        let mut request = FakeRequest::default();
        for (name, value) in headers {
            request
                .headers
                .insert(name.to_string(), value.as_bytes().to_vec());
        }
        request
    }

    pub fn with_property(mut self, path: &str, value: &str) -> Self {
        self.properties
            .insert(path.into(), value.as_bytes().to_vec());
        self
    }

    /// The selected route's `filter_metadata.sluice`, these entries serialized as Envoy does.
    pub fn with_route_metadata(mut self, entries: &[(&str, &[u8])]) -> Self {
        let entries: Vec<(&[u8], &[u8])> =
            entries.iter().map(|(k, v)| (k.as_bytes(), *v)).collect();
        let path = "xds.route_metadata.filter_metadata.sluice";
        self.properties.insert(path.into(), envoy_map(&entries));
        self
    }
}

impl RequestSource for FakeRequest {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        self.reads.set(self.reads.get() + 1);
        self.headers.get(name).cloned()
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        self.reads.set(self.reads.get() + 1);
        self.properties.get(&path.join(".")).cloned()
    }
}

/// One Envoy worker: its current request, clock, counters and replies; the store may be shared
/// with other workers.
pub struct FakeHost {
    pub store: Arc<MemoryStore>,
    pub request: RefCell<FakeRequest>,
    pub now: Cell<u64>,
    /// The last local reply, and how many were sent.
    pub reply: RefCell<Option<LocalReply>>,
    pub replies: Cell<usize>,
    /// The access-log records set, one per request that had one.
    pub records: RefCell<Vec<String>>,
    pub counters: RefCell<Vec<(String, u64)>>,
    /// The last body sent to the rate-limit service, and how many were.
    pub call: RefCell<Option<Vec<u8>>>,
    /// What was handed to the worker's outbox for the service, in order.
    pub reports: RefCell<Vec<Settlement>>,
    /// The response's headers and trailers, as a test sets them.
    pub response: RefCell<FakeRequest>,
    pub trailers: RefCell<FakeRequest>,
    /// The filter state published, by name.
    pub published: RefCell<HashMap<String, String>>,
    pub calls: Cell<usize>,
    pub service_reachable: Cell<bool>,
    /// Shared-data reads and writes.
    pub store_calls: Cell<u32>,
    /// The VM's environment variables.
    pub env: RefCell<HashMap<String, String>>,
    /// Random bytes handed out so far.
    randoms: Cell<u64>,
}

impl FakeHost {
    pub fn new(store: Arc<MemoryStore>, now: u64) -> Self {
        FakeHost {
            store,
            request: RefCell::default(),
            now: Cell::new(now),
            reply: RefCell::default(),
            replies: Cell::new(0),
            records: RefCell::default(),
            counters: RefCell::default(),
            call: RefCell::default(),
            reports: RefCell::default(),
            response: RefCell::default(),
            trailers: RefCell::default(),
            published: RefCell::default(),
            calls: Cell::new(0),
            service_reachable: Cell::new(true),
            store_calls: Cell::new(0),
            env: RefCell::default(),
            randoms: Cell::new(0),
        }
    }

    /// With the environment variable `name` set to `value`.
    pub fn with_env(self, name: &str, value: &str) -> Self {
        self.env.borrow_mut().insert(name.into(), value.into());
        self
    }

    /// The gauge's value as flushed so far (0 when not defined).
    pub fn gauge(&self, name: &str) -> i64 {
        self.counter(name) as i64
    }

    /// The counter's value as flushed so far (0 when not defined).
    pub fn counter(&self, name: &str) -> u64 {
        self.counters
            .borrow()
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, v)| *v)
    }
}

impl RequestSource for FakeHost {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        self.request.borrow().header(name)
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        self.request.borrow().property(path)
    }
}

impl Store for FakeHost {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        self.store_calls.set(self.store_calls.get() + 1);
        self.store.get(key)
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        self.store_calls.set(self.store_calls.get() + 1);
        self.store.set(key, value, cas)
    }
}

impl Host for FakeHost {
    fn now(&self) -> u64 {
        self.now.get()
    }

    fn send_response(&self, reply: &LocalReply) {
        *self.reply.borrow_mut() = Some(reply.clone());
        self.replies.set(self.replies.get() + 1);
    }

    fn record(&self, record: &str) {
        self.records.borrow_mut().push(record.to_string());
    }

    fn dispatch(&self, _service: &GlobalService, body: &[u8]) -> bool {
        *self.call.borrow_mut() = Some(body.to_vec());
        self.calls.set(self.calls.get() + 1);
        self.service_reachable.get()
    }

    fn report(&self, _service: &GlobalService, settlement: Settlement) {
        self.reports.borrow_mut().push(settlement);
    }

    fn response_headers(&self) -> Vec<(String, Vec<u8>)> {
        let response = self.response.borrow();
        response.reads.set(response.reads.get() + 1);
        let pairs = response.headers.iter();
        pairs
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect()
    }

    fn response_trailer(&self, name: &str) -> Option<Vec<u8>> {
        self.trailers.borrow().header(name)
    }

    fn publish(&self, name: &str, value: &str) {
        self.published
            .borrow_mut()
            .insert(name.to_string(), value.to_string());
    }
}

impl Environment for FakeHost {
    fn var(&self, name: &str) -> Option<String> {
        self.env.borrow().get(name).cloned()
    }

    /// Different bytes every time (not random: the tests stay reproducible).
    fn random(&self) -> Option<[u8; 16]> {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        let n = self.randoms.get() + 1;
        self.randoms.set(n);
        let word = |salt: u64| BuildHasherDefault::<DefaultHasher>::default().hash_one((n, salt));
        let mut bytes = [0; 16];
        bytes[..8].copy_from_slice(&word(1).to_le_bytes());
        bytes[8..].copy_from_slice(&word(2).to_le_bytes());
        Some(bytes)
    }
}

impl Metrics for FakeHost {
    fn define_counter(&self, name: &str) -> Option<u32> {
        let mut counters = self.counters.borrow_mut();
        counters.push((name.to_string(), 0));
        u32::try_from(counters.len() - 1).ok()
    }

    fn increment(&self, id: u32, by: u64) {
        self.counters.borrow_mut()[id as usize].1 += by;
    }

    /// Gauges live beside the counters, their value in two's complement (`gauge`).
    fn define_gauge(&self, name: &str) -> Option<u32> {
        self.define_counter(name)
    }

    fn adjust(&self, id: u32, by: i64) {
        let value = &mut self.counters.borrow_mut()[id as usize].1;
        *value = value.wrapping_add_signed(by);
    }

    fn set(&self, id: u32, value: u64) {
        self.counters.borrow_mut()[id as usize].1 = value;
    }
}
