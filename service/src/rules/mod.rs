//! The limits files of the gRPC port, envoyproxy/ratelimit's YAML with sluice's extensions:
//! `config` reads them into a tree per domain, `matching` finds the limits of a request's
//! descriptor, `watch` keeps them current while the service runs. The RLS answers by them; the
//! RLQS shares their budgets among Envoys.

pub mod config;
pub mod matching;
pub mod watch;
