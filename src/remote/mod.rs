//! Talking to the rate-limit service off the request's path: the settlements queued per worker
//! and sent in batches (`outbox`), the breaker that stops asking a failing service
//! (`breaker`), the pulls of the service's overrides (`overrides`), and who calls
//! (`announce`).

pub mod announce;
pub mod breaker;
pub mod outbox;
pub mod overrides;
