//! `sluice keys show|reset|credit`: one key of a global policy (the service's
//! `/admin/v1/keys/...`) or, with `--envoy`, of a local policy in each Envoy given (the filter's
//! admin path, `<envoy-path>/keys/...`), or both.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{json, Value};
use sluice::core::algorithm::Kind;

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

/// Where an answer came from, and the answer or why there is none.
pub type Asked = (String, Result<Value, String>);

/// The Envoys whose filter answers for local policies (its `admin` path), and the tier to ask
/// a key at.
#[derive(Args, Debug)]
pub struct Envoys {
    #[command(flatten)]
    pub at: EnvoyAddrs,
    /// The tier the key runs at in a local policy, by its value
    #[arg(long)]
    pub tier: Option<String>,
}

/// Where the Envoys' admin paths are and how to reach them: `keys` and `top` alike.
#[derive(Args, Debug)]
pub struct EnvoyAddrs {
    /// Envoys to ask about a local policy, by the address of their admin listener
    /// (host:port or http://host:port), comma-separated or one --envoy each
    #[arg(
        long,
        env = "SLUICE_ENVOYS",
        value_delimiter = ',',
        value_name = "ADDR"
    )]
    pub envoy: Vec<String>,
    /// The filter's admin path (its `admin.path`)
    #[arg(long, default_value = "/sluice/admin/v1", value_name = "PATH")]
    pub envoy_path: String,
    /// A file holding the Envoys' token (a line of their token_env); else the service's
    #[arg(long, env = "SLUICE_ENVOY_TOKEN_FILE", value_name = "PATH")]
    pub envoy_token_file: Option<std::path::PathBuf>,
}

impl Envoys {
    /// The body of the filter's call: the key by its values or its hash.
    fn body(&self, name: &KeyName) -> Value {
        let mut body = json!({"policy": name.policy});
        match &name.key_hash {
            Some(hash) => body["key_hash"] = hash.clone().into(),
            None => body["key"] = json!(name.key),
        }
        if let Some(tier) = &self.tier {
            body["tier"] = tier.clone().into();
        }
        body
    }
}

impl EnvoyAddrs {
    /// POSTs `body` to `<envoy-path>/<endpoint>` of every Envoy: each one's address and its
    /// answer or error, in the order given.
    pub fn ask(
        &self,
        service: &Service,
        endpoint: &str,
        body: &Value,
    ) -> Result<Vec<Asked>, String> {
        let token = match &self.envoy_token_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| format!("--envoy-token-file {}: {e}", path.display()))?,
            ),
            None => None,
        };
        let path = format!("{}/{endpoint}", self.envoy_path.trim_end_matches('/'));
        let mut answers = Vec::new();
        for envoy in self
            .envoy
            .iter()
            .map(|e| e.trim())
            .filter(|e| !e.is_empty())
        {
            let address = if envoy.starts_with("http://") {
                envoy.to_string()
            } else {
                format!("http://{envoy}")
            };
            let client = match &token {
                Some(token) => {
                    let token = token.split_whitespace().last().unwrap_or_default();
                    crate::client::Client::new(&address, token.to_string())
                }
                None => service.client_of(&address),
            };
            let answer = client.and_then(|c| c.post(&path, body));
            answers.push((envoy.to_string(), answer));
        }
        Ok(answers)
    }
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
    /// The policy's requests per --per (a global policy's: needed to ask the service)
    #[arg(long, requires = "per")]
    pub requests: Option<u64>,
    /// The policy's period (ms, s, m, h, d)
    #[arg(long, value_parser = per_ms, requires = "requests")]
    pub per: Option<u64>,
    /// The policy's burst [default: --requests]
    #[arg(long)]
    pub burst: Option<u64>,
    /// `http` (the filter's global policies) or `rls`
    #[arg(long, default_value = "http")]
    pub namespace: String,
    /// Instead of the policy's numbers, the limits the service saw its checks use in the last
    /// hour (`GET /admin/v1/top`'s `limits`): show asks by the latest, reset and credit by each
    #[arg(long, conflicts_with_all = ["requests", "per", "burst", "algorithm"])]
    pub seen: bool,
}

impl Key {
    /// The service's bodies (a global policy's key): by the policy's numbers given, or with
    /// `--seen` by each limit the service saw for `action` (none: a local policy's).
    pub fn bodies(&self, service: &Service, action: &str) -> Result<Vec<Value>, String> {
        let key = json!({"namespace": self.namespace, "key": self.name.check_key()?});
        let with = |limit: &Value| {
            let mut body = key.clone();
            for (field, value) in limit.as_object().into_iter().flatten() {
                body[field] = value.clone();
            }
            body
        };
        if self.seen {
            let mut limits = self.seen_limits(service)?;
            match action {
                "show" => limits.truncate(1),
                "credit" => limits.retain(metered),
                _ => {}
            }
            return Ok(limits.iter().map(with).collect());
        }
        let (Some(requests), Some(per)) = (self.requests, self.per) else {
            return Ok(Vec::new());
        };
        let limit = json!({"algorithm": self.algorithm, "requests": requests, "per_ms": per,
                           "burst": self.burst.unwrap_or(requests)});
        Ok(vec![with(&limit)])
    }

    /// The policy's `limits` in the service's top listing, the latest first.
    fn seen_limits(&self, service: &Service) -> Result<Vec<Value>, String> {
        let listing = service.client()?.get("/admin/v1/top")?;
        let policy = (listing["policies"].as_array().into_iter().flatten())
            .find(|p| p["namespace"] == *self.namespace && p["policy"] == *self.name.policy);
        let limits = policy.and_then(|p| p["limits"].as_array()).cloned();
        match limits {
            Some(limits) if !limits.is_empty() => Ok(limits),
            _ => Err(format!(
                "--seen: the service saw no check of {} policy {:?} in the last hour; \
                 give --requests and --per",
                self.namespace, self.name.policy
            )),
        }
    }
}

/// Whether a listed limit's algorithm can be credited (`Kind::meters`).
fn metered(limit: &Value) -> bool {
    let kind = serde_json::from_value::<Kind>(limit["algorithm"].clone());
    kind.is_ok_and(Kind::meters)
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
    envoys: Envoys,
    #[command(flatten)]
    service: Service,
}

#[derive(Args, Debug)]
pub struct Reset {
    #[command(flatten)]
    key: Key,
    #[command(flatten)]
    envoys: Envoys,
    #[command(flatten)]
    once: Once,
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
    #[command(flatten)]
    envoys: Envoys,
    /// Tokens to give back
    #[arg(long)]
    tokens: u64,
    #[command(flatten)]
    once: Once,
    /// Why, for the audit log
    #[arg(long)]
    reason: String,
    #[command(flatten)]
    service: Service,
}

/// A write's name, so that a retry of it is applied once.
#[derive(Args, Debug)]
pub struct Once {
    /// The write's name, 16 hex digits: the same id sent again is applied once (by the service
    /// for a credit, by every Envoy for a reset and a credit) [default: a new one, printed]
    #[arg(long)]
    id: Option<String>,
}

impl Once {
    /// The id given, else a new one; printed (unless `quiet`) so that a retry can name it.
    fn id(self, action: &str, quiet: bool) -> Result<String, String> {
        let id = match self.id {
            Some(id) => id,
            None => new_id()?,
        };
        if !quiet {
            println!("{action} {id} (send it again with --id {id}: applied once)");
        }
        Ok(id)
    }
}

pub fn run(command: Keys) -> Result<ExitCode, String> {
    let (action, key, envoys, service, extra) = match command {
        Keys::Show(show) => ("show", show.key, show.envoys, show.service, json!({})),
        Keys::Reset(reset) => {
            // The Envoys take an id for a reset too: sent again, it is applied once. The
            // service forgets the state whatever is sent, so a reset of it alone prints none.
            let quiet = reset.service.json || reset.envoys.at.envoy.is_empty();
            let id = reset.once.id("reset", quiet)?;
            let extra = json!({"reason": reset.reason, "id": id});
            ("reset", reset.key, reset.envoys, reset.service, extra)
        }
        Keys::Credit(credit) => {
            let id = credit.once.id("credit", credit.service.json)?;
            let extra = json!({"reason": credit.reason, "tokens": credit.tokens, "id": id});
            ("credit", credit.key, credit.envoys, credit.service, extra)
        }
    };
    let service_bodies = key.bodies(&service, action)?;
    if service_bodies.is_empty() && !key.seen && envoys.at.envoy.is_empty() {
        return Err(
            "give --requests and --per (a global policy's key, asked of the service), \
                    --seen (by the limits the service saw), or --envoy (a local policy's, asked \
                    of each Envoy)"
                .to_string(),
        );
    }
    let with = |mut body: Value, service: bool| {
        for (field, value) in extra.as_object().into_iter().flatten() {
            // The service takes no id for a reset (it forgets the state whatever was sent).
            if !(service && action == "reset" && field == "id") {
                body[field] = value.clone();
            }
        }
        body
    };
    let path = format!("/admin/v1/keys/{action}");
    let from_service = (service_bodies.into_iter())
        .map(|body| service.client()?.post(&path, &with(body, true)))
        .collect::<Result<Vec<Value>, String>>()?;
    let body = with(envoys.body(&key.name), false);
    let from_envoys = envoys.at.ask(&service, &format!("keys/{action}"), &body)?;
    if from_envoys.is_empty() {
        if let [answer] = from_service.as_slice() {
            table::show(service.json, answer, |a| {
                print_rows(action, &[(None, Ok(a.clone()))])
            });
            return Ok(ExitCode::SUCCESS);
        }
    }
    let failed = from_envoys.iter().any(|(_, a)| a.is_err());
    if service.json {
        let envoys: Vec<Value> = (from_envoys.iter())
            .map(|(envoy, answer)| match answer {
                Ok(answer) => json!({"envoy": envoy, "answer": answer}),
                Err(error) => json!({"envoy": envoy, "error": error}),
            })
            .collect();
        // None for a local key, one answer, or one per limit seen.
        let from_service = match from_service.as_slice() {
            [] => Value::Null,
            [answer] => answer.clone(),
            answers => Value::from(answers.to_vec()),
        };
        println!("{}", json!({"service": from_service, "envoys": envoys}));
    } else {
        let mut rows: Vec<(Option<String>, Result<Value, String>)> = Vec::new();
        let service_rows = from_service
            .into_iter()
            .map(|a| (Some("service".into()), Ok(a)));
        rows.extend(service_rows);
        rows.extend(from_envoys.into_iter().map(|(e, a)| (Some(e), a)));
        print_rows(action, &rows);
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// One row per answer (`from`: where it came from, when several were asked).
fn print_rows(action: &str, answers: &[(Option<String>, Result<Value, String>)]) {
    let several = answers.iter().any(|(from, _)| from.is_some());
    let mut rows = Vec::new();
    for (from, answer) in answers {
        let mut row: Vec<String> = Vec::new();
        if several {
            row.push(from.clone().unwrap_or_default());
        }
        match (action, answer) {
            (_, Err(error)) => row.push(format!("error: {error}")),
            ("show", Ok(s)) => {
                row.extend([
                    cell(&s["key"]),
                    cell(&s["algorithm"]),
                    cell(&s["capacity"]),
                    cell(&s["source"]),
                    cell(&s["remaining"]),
                    ms(&s["reset_ms"]),
                ]);
                row.push(s.get("debt").map_or("-".to_string(), cell));
                row.push(s.get("slots_in_use").map_or("-".to_string(), cell));
            }
            (_, Ok(d)) => row.extend([cell(&d["key"]), cell(&d["outcome"])]),
        }
        rows.push(row);
    }
    let mut headers: Vec<&str> = Vec::new();
    if several {
        headers.push("asked");
    }
    match action {
        "show" => headers.extend([
            "key",
            "algorithm",
            "limit",
            "from",
            "remaining",
            "whole in",
            "debt",
            "slots",
        ]),
        _ => headers.extend(["key", "outcome"]),
    }
    table::print(&headers, &rows);
}

/// 16 hex digits from the system's random source.
fn new_id() -> Result<String, String> {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    (std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)))
        .map_err(|e| format!("no random id: {e}; give --id"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
