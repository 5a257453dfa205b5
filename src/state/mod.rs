//! Where limits keep their state: the key-value store shared by an Envoy's workers (`store`,
//! proxy-wasm shared data), the bounded tables of key states in it (`table`), one worker's
//! loans from shared buckets (`ledger`), the requests a leaky bucket holds for their turn
//! (`hold`), the overrides pulled from the service (`overrides`), the admin path's writes
//! applied once (`applied`), and each worker's top keys of local policies (`top`).

pub mod applied;
pub mod hold;
pub mod ledger;
pub mod overrides;
pub mod store;
pub mod table;
pub mod top;
