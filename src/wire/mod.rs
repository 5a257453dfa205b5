//! What goes between the filter and a rate-limit service: sluice-service's check and settle
//! messages (`protocol`), Envoy's Rate Limit Service descriptors (`rls`), the service's
//! decisions computed here without it (`exact`), for tests and the replay, and the overrides'
//! listing the filter pulls (`overrides`), and the filter's own admin path's bodies (`admin`).

pub mod admin;
pub mod exact;
pub mod overrides;
pub mod protocol;
pub mod rls;
