//! sluice: a rate limiter for Envoy, as a proxy-wasm HTTP filter.
//!
//! The request flows one way: `config` (parsed once) → `matcher` (which policies apply) →
//! `key` (whose bucket) → `limiter` with `gcra` and `table` over a `store` (the decision, with
//! an injected clock) → `headers` (what the client sees). `filter` drives that for one HTTP
//! request through the `Host` seam; `wasm` is the only code that talks to proxy-wasm.

pub mod config;
pub mod duration;
pub mod filter;
pub mod gcra;
pub mod headers;
pub mod key;
pub mod limiter;
pub mod matcher;
pub mod request;
pub mod store;
pub mod table;

#[cfg(target_arch = "wasm32")]
mod wasm;
