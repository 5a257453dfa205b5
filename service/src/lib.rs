//! sluice-service decides sluice's global limits, kept in Redis: token bucket, fixed window,
//! sliding window, sliding log and leaky bucket, with the filter's local semantics.
//!
//! A request flows one way: `http` (routes, body limit) → `check` (strict parsing and
//! validation into `store::Check`s) → a `store::Store` (`redis_store`: one atomic Lua call per
//! check, one script per algorithm) → `check::CheckResponse`. `cli` reads the command line; `metrics` counts.
//! `rls` serves Envoy's Rate Limit Service protocol (gRPC) over the same store.

pub mod check;
pub mod cli;
pub mod http;
pub mod metrics;
pub mod redis_store;
pub mod rls;
pub mod store;
