//! The Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3`, issue 36), served on the
//! RLS's port from the RLS's limits files: `budget` finds a bucket's budget, `ledger` keeps each
//! Envoy's recent demand by the service's clock, `fair` divides the budget max-min fairly,
//! `action` turns a share into what Envoy 1.40 accepts, `service` is the stream (served on
//! the gRPC port, `grpc`). The shares are per replica, in memory (docs/rlqs.md).

pub mod action;
pub mod budget;
pub mod fair;
pub mod ledger;
pub mod service;
