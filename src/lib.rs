//! sluice: a rate limiter for Envoy, as a proxy-wasm HTTP filter.
//!
//! The request flows one way: `config` (the JSON `input`, `compile`d once into a `plan`) →
//! `limiter` (which policies apply through `matcher` and the selected `route`'s say, whose bucket
//! through `key`, the decision by
//! an `algorithm` on a `table` slot in a `store`, or by the service over `protocol`; the clock is
//! passed in) → `headers` and `reply` (what the client sees: rate-limit headers, the denial in
//! the client's protocol), `access_log` and `metrics` (what the operator sees). On the way back,
//! `usage` reads what an LLM call used from the response as it streams through (and what its
//! request asked for). `filter` drives that for one HTTP request through the `Host` seam; `wasm`
//! is the only code that talks to proxy-wasm, and `testing` fakes what it provides.

pub mod access_log;
pub mod algorithm;
pub mod breaker;
pub mod config;
pub mod duration;
pub mod exact;
pub mod filter;
pub mod headers;
pub mod hold;
pub mod key;
pub mod ledger;
pub mod limiter;
pub mod matcher;
pub mod metrics;
pub mod outbox;
pub mod protocol;
pub mod reply;
pub mod request;
pub mod response;
pub mod rls;
pub mod route;
pub mod store;
pub mod tab;
pub mod table;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod text;
pub mod time;
pub mod top_keys;
pub mod usage;

// The glue is left out of test builds so the core's tests run on wasm32 without a proxy.
#[cfg(all(target_arch = "wasm32", not(test)))]
mod wasm;
