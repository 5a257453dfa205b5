//! sluice-replay: what a sluice configuration would have done to the traffic of an access log,
//! decided offline by the filter's own code, with the log's timestamps as the clock.
//!
//! The flow: `config_file` (the configuration, from JSON or Envoy/Istio YAML, and through
//! `routes_off` the routes an Envoy file switches the filter off on) → `log` (each line
//! parsed into a `Record`, the request as the filter saw it; its start time through `times`) →
//! `order` (back in start order within a window) → `engine` (decided as one Envoy worker would:
//! the filter's `Limiter`, its slots in memory, global policies by one exact store) → `report`
//! (per policy and tier, through `sluice::core::top_keys` and `timeline`), `check` (against Envoy's own answers),
//! `compare` (against another configuration) → `text`, `json`, `svg`. `run` drives that over a
//! log; `log_format` prints the Envoy access log that writes what `log` reads.

pub mod check;
pub mod compare;
pub mod config_file;
pub mod engine;
pub mod flights;
pub mod json;
pub mod log;
pub mod log_format;
pub mod order;
pub mod report;
pub mod routes_off;
pub mod run;
pub mod scan;
pub mod svg;
pub mod text;
pub mod timeline;
pub mod times;
