//! sluice-service decides sluice's global limits: token buckets kept in Redis.
//!
//! A request flows one way: `http` (routes, body limit) → `check` (strict parsing and
//! validation into `store::Bucket`s) → a `store::Store` (`redis_store`: one atomic Lua call per
//! bucket) → `check::CheckResponse`. `cli` reads the command line; `metrics` counts.

pub mod check;
pub mod cli;
pub mod http;
pub mod metrics;
pub mod redis_store;
pub mod store;
