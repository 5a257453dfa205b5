//! sluice: a rate limiter for Envoy, as a proxy-wasm HTTP filter.
//!
//! The request flows one way: `config` (parsed once) → `matcher` (which policies apply) →
//! `key` (whose bucket) → `limiter` with an `algorithm` and `table` over a `store` (the decision,
//! with an injected clock) → `headers` (what the client sees). `filter` drives that for one HTTP
//! request through the `Host` seam; `wasm` is the only code that talks to proxy-wasm.

pub mod algorithm;
pub mod breaker;
pub mod config;
pub mod duration;
pub mod filter;
pub mod headers;
pub mod hold;
pub mod key;
pub mod ledger;
pub mod limiter;
pub mod matcher;
pub mod metrics;
pub mod protocol;
pub mod request;
pub mod store;
pub mod table;
pub mod text;
pub mod time;

// The glue is left out of test builds so the core's tests run on wasm32 without a proxy.
#[cfg(all(target_arch = "wasm32", not(test)))]
mod wasm;
