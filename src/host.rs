//! The seam between sluice and the proxy: what the request's logic needs from Envoy (`Host`)
//! and what the configuration reads from it once (`Environment`). `wasm` implements both over
//! proxy-wasm's hostcalls; `testing` fakes them, so the filter runs natively in tests.

use crate::config::GlobalService;
use crate::core::request::RequestSource;
use crate::output::reply::LocalReply;
use crate::state::store::Store;
use crate::wire::protocol::Settlement;

/// What the filter needs from the proxy.
pub trait Host: RequestSource + Store {
    /// Wall-clock time, Unix nanoseconds.
    fn now(&self) -> u64;
    /// Sends a local reply instead of forwarding the request.
    fn send_response(&self, reply: &LocalReply);
    /// Puts the request's record where the access log reads it (`access_log::PROPERTY`).
    fn record(&self, record: &str);
    /// Starts a call to the rate-limit service, as its protocol says (an HTTP POST of the body,
    /// or a gRPC `ShouldRateLimit` carrying it); false if it could not be started. The answer
    /// comes back through `Filter::on_service_response`.
    fn dispatch(&self, service: &GlobalService, body: &[u8]) -> bool;
    /// Hands what a request owes a global policy after its admission to the worker's outbox
    /// (`outbox`), which sends it to the service later, off every request's path.
    fn report(&self, service: &GlobalService, settlement: Settlement);
    /// A header of the response, as it passes through (`response`).
    fn response_header(&self, name: &str) -> Option<Vec<u8>>;
    /// A trailer of the response.
    fn response_trailer(&self, name: &str) -> Option<Vec<u8>>;
    /// Sets filter state other filters and the access log read (`wasm.<name>`).
    fn publish(&self, name: &str, value: &str);
}

/// What the filter reads from the proxy once, when it is configured.
pub trait Environment {
    /// A variable of the VM's environment (Envoy: `vm_config.environment_variables`).
    fn var(&self, name: &str) -> Option<String>;
    /// Random bytes from the host: for a hash secret of this Envoy's own.
    fn random(&self) -> Option<[u8; 16]>;
}
