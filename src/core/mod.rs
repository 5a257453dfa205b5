//! The pure core: the rate-limit algorithms, on time handed in; durations and timestamps as
//! users write them; the request attributes policies read; keys and their hashes; which
//! requests a policy matches and what the selected route says; numbers as text; what an LLM
//! call used, read from its request and its response (`usage`). No hostcall, no state:
//! everything here is a function of its inputs.

pub mod algorithm;
pub mod calendar;
pub mod duration;
pub mod key;
pub mod matcher;
pub mod request;
pub mod route;
pub mod text;
pub mod time;
pub mod top_keys;
pub mod usage;
