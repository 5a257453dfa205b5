//! The Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3`, issue 36), served on a
//! gRPC port of its own (`--rlqs`, `grpc`) from the RLS's limits files: `budget` finds a
//! bucket's budget, the store keeps each Envoy's recent demand and the share it holds by its own
//! clock (`stores::quota`, Redis shared by every replica), `ledger` takes one Envoy's share of
//! it (from budget the others do not hold, held steady), `fair` divides the budget max-min
//! fairly, `action` turns a share into what Envoy 1.40 accepts, `service` is the stream,
//! `metrics` its series, `replicas` tells the live replicas from the crashed.

pub mod action;
pub mod budget;
pub mod fair;
pub mod ledger;
pub mod metrics;
pub mod replicas;
pub mod service;
