//! sluice: a rate limiter for Envoy, as a proxy-wasm HTTP filter.
//!
//! The modules, from the bottom up (each uses only those before it):
//! - `core`: the pure core. Algorithms on a clock handed in, keys, request attributes,
//!   matching, durations and time, and what an LLM call used (`usage`), read from its request
//!   and its response as they stream.
//! - `wire`: the messages to a rate-limit service (sluice-service's, Envoy's RLS).
//! - `state`: where limits keep their state. Shared data, its tables, a worker's loans.
//! - `config`: the JSON configuration, `compile`d once into the `Plan` the hot path reads.
//! - `remote`: settlements and the breaker, off the request's path.
//! - `limiter`: one decision for one request, in the shared state, or by the service.
//! - `output`: what a decision shows. The client sees the reply and headers, the operator the
//!   access log and metrics.
//! - `host`: the seam, what the request's logic needs from the proxy.
//! - `response`: the response half of an admitted request, settled when it ends.
//! - `filter`: one HTTP request through all of it, written against the `host` seam.
//! - `wasm`: the only code that talks to proxy-wasm. `testing` fakes what it provides.

pub mod config;
pub mod core;
pub mod filter;
pub mod host;
pub mod limiter;
pub mod output;
pub mod remote;
pub mod response;
pub mod state;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod wire;

// The glue is left out of test builds so the core's tests run on wasm32 without a proxy.
#[cfg(all(target_arch = "wasm32", not(test)))]
mod wasm;
