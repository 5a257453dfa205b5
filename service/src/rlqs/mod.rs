//! The Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3`, issue 36), in progress:
//! `fair` divides a bucket's budget max-min fairly among the Envoys that report it, `ledger`
//! keeps their recent demand by the service's clock. The stream, the Redis state and the
//! `--rlqs` flag are not built yet (docs/rlqs.md).

pub mod action;
pub mod budget;
pub mod fair;
pub mod ledger;
pub mod service;
