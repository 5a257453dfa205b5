//! The plugin configuration. `input` is the JSON format as users write it, read strictly;
//! `compile` validates it once, at configuration time, into the `plan` that every request
//! reads. Any error names the field and the reason; nothing half-valid gets through.

pub mod admin;
mod answer;
mod calendar;
mod compile;
mod input;
mod plan;
#[cfg(test)]
mod tests;

pub use answer::{Api, Denial, GrpcStatus, HeaderStyle};
pub use compile::{
    DEFAULT_MAX_OVERRIDES, MAX_GLOBAL_SLOTS, MAX_MAX_KEYS, MAX_MAX_OVERRIDES, MAX_SLIDING_LOG,
};
pub use input::DEFAULT_MAX_KEYS;
pub use plan::{
    key_check, Bypass, GlobalService, Metered, OnFailure, OnUnknown, OverridesSync, Plan, Policy,
    Protocol, Reserve, Rollout, Scope, Secret, Tier, Tiers, TokenSide, UsageSource, GLOBAL_COLUMNS,
};

use std::fmt;

/// How the configuration reads the environment variables it names (secrets are never inline).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Parses and validates the plugin configuration, reading the process's (the wasm VM's)
/// environment.
pub fn parse(json: &[u8]) -> Result<Plan, ConfigError> {
    parse_with_env(json, &|name| std::env::var(name).ok())
}

/// `parse` with another environment.
pub fn parse_with_env(json: &[u8], env: Env) -> Result<Plan, ConfigError> {
    compile::compile(input::read(json)?, env)
}

/// A refused configuration: which field, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

fn error(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        reason: reason.into(),
    }
}
