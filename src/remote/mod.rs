//! Talking to the rate-limit service off the request's path: the settlements queued per worker
//! and sent in batches (`outbox`), and the breaker that stops asking a failing service
//! (`breaker`).

pub mod breaker;
pub mod outbox;
