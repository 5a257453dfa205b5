//! What goes between the filter and a rate-limit service: sluice-service's check and settle
//! messages (`protocol`), Envoy's Rate Limit Service descriptors (`rls`), and the service's
//! decisions computed here without it (`exact`), for tests and the replay.

pub mod exact;
pub mod protocol;
pub mod rls;
