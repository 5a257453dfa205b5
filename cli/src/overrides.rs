//! `sluice overrides set|list|delete`: one key's own limit (`/admin/v1/overrides`).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use crate::keys::{per_ms, KeyName};
use crate::table::{self, cell};
use crate::Service;

#[derive(Subcommand, Debug)]
pub enum Overrides {
    /// Give one key its own limit (replacing its override, if it has one)
    Set(Set),
    /// Every live override
    List(List),
    /// Take a key's override away
    Delete(Delete),
}

#[derive(Args, Debug)]
pub struct Set {
    #[command(flatten)]
    name: KeyName,
    /// The algorithm of the policy it overrides
    #[arg(long, default_value = "token_bucket")]
    algorithm: String,
    #[arg(long)]
    requests: u64,
    /// The period (ms, s, m, h, d)
    #[arg(long, value_parser = per_ms)]
    per: u64,
    /// [default: --requests]
    #[arg(long)]
    burst: Option<u64>,
    /// Who asked for it
    #[arg(long)]
    owner: String,
    /// Why, for the audit log
    #[arg(long)]
    reason: String,
    /// How long from now it applies (ms, s, m, h, d) [default: until deleted]
    #[arg(long, value_parser = per_ms)]
    expires: Option<u64>,
    #[arg(long, default_value = "http")]
    namespace: String,
    #[command(flatten)]
    service: Service,
}

#[derive(Args, Debug)]
pub struct List {
    #[command(flatten)]
    service: Service,
}

#[derive(Args, Debug)]
pub struct Delete {
    #[command(flatten)]
    name: KeyName,
    #[arg(long)]
    reason: String,
    #[arg(long, default_value = "http")]
    namespace: String,
    #[command(flatten)]
    service: Service,
}

pub fn run(command: Overrides) -> Result<ExitCode, String> {
    match command {
        Overrides::Set(set) => {
            let mut body = json!({
                "namespace": set.namespace,
                "key": set.name.check_key()?,
                "algorithm": set.algorithm,
                "requests": set.requests,
                "per_ms": set.per,
                "burst": set.burst.unwrap_or(set.requests),
                "owner": set.owner,
                "reason": set.reason,
            });
            if let Some(expires) = set.expires {
                body["expires_in_ms"] = expires.into();
            }
            let done = set.service.client()?.post("/admin/v1/overrides", &body)?;
            written(set.service.json, &done);
        }
        Overrides::List(list) => {
            let listed = list.service.client()?.get("/admin/v1/overrides")?;
            table::show(list.service.json, &listed, |l| {
                let empty = Vec::new();
                let rows: Vec<Vec<String>> = (l["overrides"].as_array().unwrap_or(&empty))
                    .iter()
                    .map(|o| {
                        vec![
                            cell(&o["key"]),
                            cell(&o["algorithm"]),
                            format!("{}/{}ms", cell(&o["requests"]), cell(&o["per_ms"])),
                            cell(&o["burst"]),
                            cell(&o["owner"]),
                            cell(&o["set_by"]),
                            expiry(&o["expires_at_ms"]),
                            cell(&o["reason"]),
                        ]
                    })
                    .collect();
                let headers = [
                    "key",
                    "algorithm",
                    "rate",
                    "burst",
                    "owner",
                    "set by",
                    "expires",
                    "reason",
                ];
                table::print(&headers, &rows);
                println!("{} of at most {}", rows.len(), cell(&l["max"]));
            });
        }
        Overrides::Delete(delete) => {
            let body = json!({
                "namespace": delete.namespace,
                "key": delete.name.check_key()?,
                "reason": delete.reason,
            });
            let done = delete
                .service
                .client()?
                .post("/admin/v1/overrides/delete", &body)?;
            written(delete.service.json, &done);
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

/// When it expires, from now.
fn expiry(at_ms: &Value) -> String {
    let Some(at) = at_ms.as_u64() else {
        return "never".to_string();
    };
    let now = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH))
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    format!("in {}", table::ms(&Value::from(at.saturating_sub(now))))
}
