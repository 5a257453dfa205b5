//! `sluice top`: the heaviest keys of a policy (`GET /admin/v1/top`), or without `--policy`
//! every policy the service records, with its counts over the last minute and hour. With
//! `--envoy`, a local policy's heaviest keys in each Envoy given (the filter's admin path,
//! `POST <envoy-path>/top`, which answers in the service's shape), one table per Envoy, and
//! the Envoys' answers merged into one as the service merges its own (`Part::merge`).

use std::process::ExitCode;

use clap::Args;
use serde_json::{json, Value};
use sluice::core::top_keys::Part;

use crate::keys::EnvoyAddrs;
use crate::table::{self, cell};
use crate::Service;

#[derive(Args, Debug)]
pub struct Top {
    /// The policy (`<domain>/<policy>` for the RLS); without it, every policy recorded
    #[arg(long)]
    policy: Option<String>,
    /// Rank by `refused` (requests refused) or `consumed` (tokens granted)
    #[arg(long, default_value = "refused", value_parser = ["refused", "consumed"])]
    by: String,
    /// Over the last `1m` or `1h`
    #[arg(long, default_value = "1m", value_parser = ["1m", "1h"])]
    window: String,
    /// How many keys (1 to 64)
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=64))]
    limit: u64,
    /// `http` (the filter's global policies) or `rls`
    #[arg(long, default_value = "http", value_parser = ["http", "rls"])]
    namespace: String,
    #[command(flatten)]
    envoys: EnvoyAddrs,
    #[command(flatten)]
    service: Service,
}

pub fn run(top: Top) -> Result<ExitCode, String> {
    if !top.envoys.envoy.is_empty() {
        return from_envoys(&top);
    }
    let client = top.service.client()?;
    let Some(policy) = &top.policy else {
        let answer = client.get("/admin/v1/top")?;
        table::show(top.service.json, &answer, policies);
        return Ok(ExitCode::SUCCESS);
    };
    let path = format!(
        "/admin/v1/top?namespace={}&policy={}&by={}&window={}&limit={}",
        top.namespace,
        encode(policy),
        top.by,
        top.window,
        top.limit
    );
    let answer = client.get(&path)?;
    table::show(top.service.json, &answer, keys);
    Ok(ExitCode::SUCCESS)
}

/// A local policy's heaviest keys in each Envoy: one table each (an Envoy that failed, its
/// error), then the answers merged; or with `--json` `{"envoys": [{"envoy", "answer" |
/// "error"}], "merged"}`.
fn from_envoys(top: &Top) -> Result<ExitCode, String> {
    let Some(policy) = &top.policy else {
        return Err("--envoy asks for a local policy's keys: give --policy".to_string());
    };
    let body = serde_json::json!({
        "policy": policy, "by": top.by, "window": top.window, "limit": top.limit
    });
    let answers = top.envoys.ask(&top.service, "top", &body)?;
    let failed = answers.iter().any(|(_, a)| a.is_err());
    let answered: Vec<&Value> = answers
        .iter()
        .filter_map(|(_, a)| a.as_ref().ok())
        .collect();
    let merged = merge(&answered, top.limit);
    if top.service.json {
        let envoys: Vec<Value> = (answers.iter())
            .map(|(envoy, answer)| match answer {
                Ok(answer) => json!({"envoy": envoy, "answer": answer}),
                Err(error) => json!({"envoy": envoy, "error": error}),
            })
            .collect();
        println!("{}", json!({ "envoys": envoys, "merged": merged }));
    } else {
        for (envoy, answer) in &answers {
            match answer {
                Ok(answer) => {
                    println!("envoy {envoy} ({} workers):", cell(&answer["workers"]));
                    keys(answer);
                }
                Err(error) => println!("envoy {envoy}: error: {error}"),
            }
            println!();
        }
        println!(
            "all {} Envoys answering ({} workers):",
            cell(&merged["envoys"]),
            cell(&merged["workers"])
        );
        keys(&merged);
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// The Envoys' answers as one, in their shape (`envoys`: how many were merged): each answer is
/// a part (`Part::merge`) whose floor bounds the count of a key it does not list, its
/// `error_bound`, or, when it lists `limit` keys, its last key's count if that is more.
fn merge(answers: &[&Value], limit: u64) -> Value {
    let count = |v: &Value| v.as_u64().unwrap_or(0);
    let key_of = |v: &Value| u64::from_str_radix(v["key"].as_str().unwrap_or(""), 16).ok();
    let parts: Vec<Part> = (answers.iter())
        .map(|answer| {
            let listed = answer["keys"].as_array().map(Vec::as_slice).unwrap_or(&[]);
            let top: Vec<(u64, u64, u64)> = (listed.iter())
                .filter_map(|k| Some((key_of(k)?, count(&k["count"]), count(&k["error"]))))
                .collect();
            let full = top.len() as u64 >= limit;
            let last = top.last().map_or(0, |&(_, c, _)| c);
            let floor = count(&answer["error_bound"]).max(if full { last } else { 0 });
            Part { floor, top }
        })
        .collect();
    let shown = |key: &str| {
        let listed = answers
            .iter()
            .flat_map(|a| a["keys"].as_array().into_iter().flatten());
        listed
            .filter(|k| k["key"] == key)
            .find_map(|k| k.get("shown").cloned())
    };
    let keys: Vec<Value> = (Part::merge(&parts, usize::try_from(limit).unwrap_or(64)).iter())
        .map(|c| {
            let key = format!("{:016x}", c.key);
            let mut merged = json!({"key": key, "count": c.count, "error": c.error});
            if let Some(text) = shown(&key) {
                merged["shown"] = text;
            }
            merged
        })
        .collect();
    let sum = |field: &dyn Fn(&Value) -> &Value| -> u64 {
        answers
            .iter()
            .map(|a| count(field(a)))
            .fold(0, u64::saturating_add)
    };
    let first = answers.first().copied().unwrap_or(&Value::Null);
    json!({
        "namespace": first["namespace"], "policy": first["policy"], "by": first["by"],
        "window": first["window"],
        "totals": {
            "allowed": sum(&|a| &a["totals"]["allowed"]),
            "refused": sum(&|a| &a["totals"]["refused"]),
            "consumed": sum(&|a| &a["totals"]["consumed"]),
        },
        "error_bound": parts.iter().map(|p| p.floor).fold(0, u64::saturating_add),
        "keys": keys,
        "workers": sum(&|a| &a["workers"]),
        "envoys": answers.len(),
    })
}

/// A query value percent-encoded: every byte but `A-Z a-z 0-9 - . _ ~`.
fn encode(text: &str) -> String {
    let mut encoded = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

fn keys(answer: &Value) {
    let by = answer["by"].as_str().unwrap_or("count");
    let totals = &answer["totals"];
    println!(
        "{} {} over {}: {} allowed, {} refused, {} consumed; counts at most {} over",
        cell(&answer["namespace"]),
        cell(&answer["policy"]),
        cell(&answer["window"]),
        cell(&totals["allowed"]),
        cell(&totals["refused"]),
        cell(&totals["consumed"]),
        cell(&answer["error_bound"]),
    );
    let rows: Vec<Vec<String>> = (answer["keys"].as_array().into_iter().flatten())
        .enumerate()
        .map(|(i, key)| {
            vec![
                (i + 1).to_string(),
                cell(&key["key"]),
                cell(&key["count"]),
                format!("±{}", cell(&key["error"])),
                cell(&key["shown"]),
            ]
        })
        .collect();
    table::print(&["#", "key hash", by, "error", "shown"], &rows);
}

fn policies(answer: &Value) {
    let rows: Vec<Vec<String>> = (answer["policies"].as_array().into_iter().flatten())
        .map(|p| {
            vec![
                cell(&p["namespace"]),
                cell(&p["policy"]),
                cell(&p["1m"]["allowed"]),
                cell(&p["1m"]["refused"]),
                cell(&p["1h"]["allowed"]),
                cell(&p["1h"]["refused"]),
                cell(&p["1h"]["consumed"]),
            ]
        })
        .collect();
    let headers = [
        "namespace",
        "policy",
        "allowed 1m",
        "refused 1m",
        "allowed 1h",
        "refused 1h",
        "consumed 1h",
    ];
    table::print(&headers, &rows);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_is_percent_encoded_for_the_query() {
        assert_eq!(encode("edge/per_ip"), "edge%2Fper_ip");
        assert_eq!(encode("a b&c"), "a%20b%26c");
    }
}
