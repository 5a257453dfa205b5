//! Envoy's Rate Limit Service protocol (`--rls`): `sluice-service` as a drop-in for
//! envoyproxy/ratelimit, behind Envoy's native `envoy.filters.http.ratelimit` filter.
//!
//! `answer` plans the store checks of a request's descriptors, as the limits files (`rules`)
//! say, and builds the response (pure, clock injected); `service` is the gRPC method over the
//! same `Store` (Lua scripts, Redis `TIME`) as `/v1/check`; `metrics` counts per domain and
//! descriptor. The port it is served on is `grpc`'s.

pub mod answer;
pub mod metrics;
pub mod service;
