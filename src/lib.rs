//! sluice: a rate limiter for Envoy.
