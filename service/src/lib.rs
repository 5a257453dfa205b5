//! sluice-service decides sluice's global limits, kept in Redis: token bucket, fixed window,
//! sliding window, sliding log and leaky bucket, with the filter's local semantics, and
//! concurrency (slots that are leases).
//!
//! One decision core under several fronts. The fronts, each a folder with its wire parsing
//! and metrics: `http` (the filter's `/v1/check` and `/v1/settle`, with the bearer token of
//! `auth` and the plumbing of `web`), `admin` (the operators' API, `/admin/v1/...`, and its
//! console, on the HTTP listener), and on the gRPC port (`grpc`) `rls` (Envoy's Rate Limit
//! Service) and `rlqs` (its Rate Limit Quota Service), both by the limits files of `rules`. Under
//! them `decision` validates and bounds checks and settlements, `stores` keeps the counters
//! behind one trait: Redis (one atomic Lua call per check) or this process's memory, `top`
//! the heaviest keys of each policy the fronts see, and `fleet` the Envoys whose filters call.
//!
//! Around it: `connections` caps, times out and sheds the connections of both listeners,
//! `health` probes the store for readiness, `metrics` holds every series in one registry,
//! `logging` writes JSON lines, `signals` and `cli` are the process's inputs.

pub mod admin;
pub mod auth;
pub mod cli;
pub mod connections;
pub mod decision;
pub mod fleet;
pub mod grpc;
pub mod health;
pub mod http;
pub mod logging;
pub mod metrics;
pub mod rlqs;
pub mod rls;
pub mod rules;
pub mod signals;
pub mod stores;
pub mod top;
pub mod web;
