//! What a decision shows: to the client, the local reply to a refused request (`reply`) and the
//! rate-limit headers (`headers`), a client's own quota at the status path (`status`); to the operator, the access-log record (`access_log`) and
//! the metrics in Envoy's stats (`metrics`).

pub mod access_log;
pub mod headers;
pub mod metrics;
pub mod reply;
pub mod status;
