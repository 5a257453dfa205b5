//! sluice-service decides sluice's global limits, kept in Redis: token bucket, fixed window,
//! sliding window, sliding log and leaky bucket, with the filter's local semantics, and
//! concurrency (slots that are leases).
//!
//! A request flows one way: `http` (routes, the bearer token of `auth`, the body limit) →
//! `check` (strict parsing and validation into `store::Check`s) → a `store::Store`
//! (`redis_store`: one atomic Lua call per check, one script per algorithm; or `memory_store`,
//! the filter's own algorithms in this process, `memory_slots` for concurrency and
//! `settled_ids` for the settlements it applied) →
//! `check::CheckResponse`. What requests owe after admission takes the same way through
//! `settle` (its validation is `check`'s) to `Store::settle`. Around it: `connections` caps, times out and sheds the connections of
//! both servers, `health` probes Redis for readiness, `metrics` holds every series in one
//! registry, `logging` writes JSON lines, `slot_watch` counts the
//! slots nobody renews, `signals` and `cli` are the process's inputs. `rls`
//! serves Envoy's Rate Limit Service protocol (gRPC) over the same store; `admin` the operators'
//! API (`/admin/v1/...`) on the HTTP listener; `top` the heaviest keys of each policy it reads.

pub mod admin;
pub mod auth;
pub mod check;
pub mod cli;
pub mod connections;
pub mod health;
pub mod http;
pub mod logging;
pub mod memory_slots;
pub mod memory_store;
pub mod metrics;
pub mod redis_store;
pub mod rlqs;
pub mod rls;
pub mod settle;
pub mod settled_ids;
pub mod signals;
pub mod slot_watch;
pub mod store;
pub mod top;
