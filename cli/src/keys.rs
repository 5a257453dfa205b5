//! `sluice keys show|reset|credit`: one key of a global policy (`/admin/v1/keys/...`).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use crate::table::{self, cell, ms};
use crate::Service;

#[derive(Subcommand, Debug)]
pub enum Keys {
    /// The key's state now: its limit and where it comes from, what is left, when it is whole
    Show(Show),
    /// A full bucket, an empty window, every slot free
    Reset(Reset),
    /// Give N tokens back (forgiving debt first), applied once per --id
    Credit(Credit),
}

/// A key of a policy, by its hash or by its value.
#[derive(Args, Debug)]
pub struct KeyName {
    /// The policy's name
    #[arg(long)]
    pub policy: String,
    /// The key's hash, 16 hex digits, as the access log shows it
    #[arg(long, conflicts_with = "key", required_unless_present = "key")]
    pub key_hash: Option<String>,
    /// The key's value, one --key per key part in the policy's order (`--key acme`), hashed as
    /// the filter hashes it
    #[arg(long)]
    pub key: Vec<String>,
    /// The environment variable holding the configuration's hash secret (its
    /// `hash_secret_env`), if it has one
    #[arg(long, value_name = "NAME")]
    pub hash_secret_env: Option<String>,
}

impl KeyName {
    /// `<policy>/<key hash>`, as the filter's checks name it.
    pub fn check_key(&self) -> Result<String, String> {
        let hash = match &self.key_hash {
            Some(hash) => hash.clone(),
            None => {
                let secret = match &self.hash_secret_env {
                    Some(name) => {
                        let text = std::env::var(name)
                            .map_err(|_| format!("--hash-secret-env: ${name} is not set"))?;
                        sluice::core::key::HashSecret::from_text(text.as_bytes())
                    }
                    None => sluice::core::key::HashSecret::PUBLIC,
                };
                format!(
                    "{:016x}",
                    sluice::core::key::hash_values(&self.key, &secret)
                )
            }
        };
        Ok(format!("{}/{hash}", self.policy))
    }
}

/// A key and its policy's limit, as the filter's checks name them.
#[derive(Args, Debug)]
pub struct Key {
    #[command(flatten)]
    pub name: KeyName,
    /// The policy's algorithm
    #[arg(long, default_value = "token_bucket")]
    pub algorithm: String,
    /// The policy's requests per --per
    #[arg(long)]
    pub requests: u64,
    /// The policy's period (ms, s, m, h, d)
    #[arg(long, value_parser = per_ms)]
    pub per: u64,
    /// The policy's burst [default: --requests]
    #[arg(long)]
    pub burst: Option<u64>,
    /// `http` (the filter's global policies) or `rls`
    #[arg(long, default_value = "http")]
    pub namespace: String,
}

impl Key {
    pub fn body(&self) -> Result<Value, String> {
        Ok(json!({
            "namespace": self.namespace,
            "key": self.name.check_key()?,
            "algorithm": self.algorithm,
            "requests": self.requests,
            "per_ms": self.per,
            "burst": self.burst.unwrap_or(self.requests),
        }))
    }
}

/// A duration as the configuration writes one, in milliseconds.
pub fn per_ms(text: &str) -> Result<u64, String> {
    let nanos = sluice::core::duration::parse_nanos(text)?;
    if nanos % 1_000_000 != 0 || nanos == 0 {
        return Err("must be whole milliseconds".to_string());
    }
    Ok(nanos / 1_000_000)
}

#[derive(Args, Debug)]
pub struct Show {
    #[command(flatten)]
    key: Key,
    #[command(flatten)]
    service: Service,
}

#[derive(Args, Debug)]
pub struct Reset {
    #[command(flatten)]
    key: Key,
    /// Why, for the audit log
    #[arg(long)]
    reason: String,
    #[command(flatten)]
    service: Service,
}

#[derive(Args, Debug)]
pub struct Credit {
    #[command(flatten)]
    key: Key,
    /// Tokens to give back
    #[arg(long)]
    tokens: u64,
    /// The credit's name, 16 hex digits: the same id sent again is applied once [default: a
    /// new one, printed]
    #[arg(long)]
    id: Option<String>,
    /// Why, for the audit log
    #[arg(long)]
    reason: String,
    #[command(flatten)]
    service: Service,
}

pub fn run(command: Keys) -> Result<ExitCode, String> {
    match command {
        Keys::Show(show) => {
            let state = show
                .service
                .client()?
                .post("/admin/v1/keys/show", &show.key.body()?)?;
            table::show(show.service.json, &state, |s| {
                let row = vec![
                    cell(&s["key"]),
                    cell(&s["algorithm"]),
                    cell(&s["capacity"]),
                    cell(&s["source"]),
                    cell(&s["remaining"]),
                    ms(&s["reset_ms"]),
                ];
                let headers = ["key", "algorithm", "limit", "from", "remaining", "whole in"];
                table::print(&headers, &[row]);
            });
        }
        Keys::Reset(reset) => {
            let mut body = reset.key.body()?;
            body["reason"] = reset.reason.into();
            let done = reset
                .service
                .client()?
                .post("/admin/v1/keys/reset", &body)?;
            written(reset.service.json, &done);
        }
        Keys::Credit(credit) => {
            let id = match credit.id {
                Some(id) => id,
                None => new_id()?,
            };
            let mut body = credit.key.body()?;
            body["reason"] = credit.reason.into();
            body["tokens"] = credit.tokens.into();
            body["id"] = id.clone().into();
            let done = credit
                .service
                .client()?
                .post("/admin/v1/keys/credit", &body)?;
            if !credit.service.json {
                println!("credit {id} (send it again with --id {id}: applied once)");
            }
            written(credit.service.json, &done);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn written(json: bool, done: &Value) {
    table::show(json, done, |d| {
        let row = vec![cell(&d["key"]), cell(&d["outcome"])];
        table::print(&["key", "outcome"], &[row]);
    });
}

/// 16 hex digits from the system's random source.
fn new_id() -> Result<String, String> {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    (std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)))
        .map_err(|e| format!("no random id: {e}; give --id"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
